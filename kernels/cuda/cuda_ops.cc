// The CUDA op table entries other than Linear: argument plumbing from validated views to the
// kernel launchers, staging of host index arrays and the few CUDA-specific limits (grid sizes,
// attention shared memory), reported as Status.
#include <algorithm>
#include <climits>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/launch.h"

namespace deja::kernels::cuda {
namespace {

// Makes the backend's device current for this thread (a no-op when it already is).
Status Enter(CudaContext& ctx) { return CudaStatus(cudaSetDevice(ctx.device), "cudaSetDevice"); }

// Row-wise kernels launch one block per row.
Status CheckRows(const char* op, int64_t rows) {
  if (rows > INT_MAX) {
    return Unimplemented(std::string(op) + ": " + std::to_string(rows) +
                         " rows exceed the CUDA grid limit");
  }
  return Status::Ok();
}

}  // namespace

StatusOr<int32_t*> StageIndices(CudaContext& ctx, const int32_t* host, int64_t n) {
  const size_t bytes = static_cast<size_t>(n) * sizeof(int32_t);
  DEJA_ASSIGN_OR_RETURN(void* dst, ctx.indices.Get(bytes, ctx.stream.get()));
  // From pageable memory the runtime copies `host` out before returning, so the caller may reuse
  // it at once.
  DEJA_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, ctx.stream.get()),
      "staging indices");
  return static_cast<int32_t*>(dst);
}

Status CudaEmbedding(Backend& b, TensorView table, const int32_t* ids, int64_t n, bool accumulate,
                     TensorView out) {
  CudaContext& ctx = ContextOf(b);
  DEJA_RETURN_IF_ERROR(Enter(ctx));
  DEJA_ASSIGN_OR_RETURN(int32_t * dev_ids, StageIndices(ctx, ids, n));
  return CudaStatus(LaunchEmbedding(table.data, table.dtype, dev_ids, n, table.cols(), accumulate,
                                    out.as<float>(), ctx.stream.get()),
                    "embedding kernel");
}

Status CudaLayerNorm(Backend& b, TensorView x, TensorView gamma, TensorView beta, float eps,
                     TensorView out) {
  CudaContext& ctx = ContextOf(b);
  DEJA_RETURN_IF_ERROR(Enter(ctx));
  DEJA_RETURN_IF_ERROR(CheckRows("layer_norm", x.rows()));
  return CudaStatus(LaunchLayerNorm(x.as<float>(), gamma.data, beta.data, gamma.dtype, x.rows(),
                                    x.cols(), eps, out.as<float>(), ctx.stream.get()),
                    "layer_norm kernel");
}

Status CudaAttention(Backend& b, const AttentionArgs& args) {
  CudaContext& ctx = ContextOf(b);
  DEJA_RETURN_IF_ERROR(Enter(ctx));
  const int64_t tokens = args.q.rows();
  if (tokens * args.heads > INT_MAX) {
    return Unimplemented("attention: tokens * heads = " + std::to_string(tokens * args.heads) +
                         " exceeds the CUDA grid limit");
  }
  const size_t shared = AttentionSharedBytes(args.head_dim, args.kv.used);
  if (shared > ctx.attention_shared_limit) {
    return ResourceExhausted("attention: head_dim " + std::to_string(args.head_dim) + " and " +
                             std::to_string(args.kv.used) + " used slots need " +
                             std::to_string(shared) + " bytes of shared memory per block; " +
                             "this device allows " + std::to_string(ctx.attention_shared_limit));
  }
  // q_pos and head_ids share one staging copy (the indices workspace holds one array at a time).
  const int64_t n_heads_ids = args.head_ids != nullptr ? args.heads : 0;
  std::vector<int32_t> host_ids(static_cast<size_t>(tokens + n_heads_ids));
  std::copy_n(args.q_pos, tokens, host_ids.begin());
  if (n_heads_ids > 0) std::copy_n(args.head_ids, n_heads_ids, host_ids.begin() + tokens);
  DEJA_ASSIGN_OR_RETURN(int32_t * dev_ids,
                        StageIndices(ctx, host_ids.data(), static_cast<int64_t>(host_ids.size())));
  AttentionLaunch a;
  a.q = args.q.as<float>();
  a.q_pos = dev_ids;
  a.head_ids = n_heads_ids > 0 ? dev_ids + tokens : nullptr;
  a.k = static_cast<float*>(args.kv.k);  // f32: CudaBackend::Supports
  a.v = static_cast<float*>(args.kv.v);
  a.slot_pos = args.kv.slot_pos;
  a.score = args.kv.score;
  a.out = args.out.as<float>();
  a.scale = args.scale;
  a.tokens = static_cast<int32_t>(tokens);
  a.heads = args.heads;
  a.head_dim = args.head_dim;
  a.capacity = args.kv.capacity;
  a.used = args.kv.used;
  return CudaStatus(LaunchAttention(a, ctx.stream.get()), "attention kernel");
}

Status CudaGatherLinear(Backend& b, TensorView x, TensorView w, TensorView bias,
                        const int32_t* rows, int64_t n_rows, Activation act, bool accumulate,
                        TensorView out) {
  CudaContext& ctx = ContextOf(b);
  DEJA_RETURN_IF_ERROR(Enter(ctx));
  DEJA_ASSIGN_OR_RETURN(int32_t * dev_rows, StageIndices(ctx, rows, n_rows));
  return CudaStatus(
      LaunchGatherLinear(x.as<float>(), x.rows(), x.cols(), w.data, w.dtype, bias.data, bias.dtype,
                         dev_rows, n_rows, act == Activation::kRelu, accumulate, out.as<float>(),
                         ctx.stream.get()),
      "gather_linear kernel");
}

Status CudaGatherLinearT(Backend& b, TensorView x, TensorView wt, const int32_t* rows,
                         int64_t n_rows, bool accumulate, TensorView out) {
  CudaContext& ctx = ContextOf(b);
  DEJA_RETURN_IF_ERROR(Enter(ctx));
  DEJA_ASSIGN_OR_RETURN(int32_t * dev_rows, StageIndices(ctx, rows, n_rows));
  return CudaStatus(
      LaunchGatherLinearT(x.as<float>(), x.rows(), wt.data, wt.dtype, wt.cols(), dev_rows, n_rows,
                          accumulate, out.as<float>(), ctx.stream.get()),
      "gather_linear_t kernel");
}

Status CudaAdd(Backend& b, TensorView x, TensorView bias, TensorView out) {
  CudaContext& ctx = ContextOf(b);
  DEJA_RETURN_IF_ERROR(Enter(ctx));
  return CudaStatus(LaunchAdd(x.as<float>(), bias.data, bias.dtype, x.rows(), x.cols(),
                              out.as<float>(), ctx.stream.get()),
                    "add kernel");
}

Status CudaLogSoftmax(Backend& b, TensorView x, TensorView out) {
  CudaContext& ctx = ContextOf(b);
  DEJA_RETURN_IF_ERROR(Enter(ctx));
  DEJA_RETURN_IF_ERROR(CheckRows("log_softmax", x.rows()));
  return CudaStatus(
      LaunchLogSoftmax(x.as<float>(), x.rows(), x.cols(), out.as<float>(), ctx.stream.get()),
      "log_softmax kernel");
}

Status CudaTopK(Backend& b, TensorView x, int32_t k, float* values, int32_t* indices) {
  CudaContext& ctx = ContextOf(b);
  DEJA_RETURN_IF_ERROR(Enter(ctx));
  DEJA_RETURN_IF_ERROR(CheckRows("top_k", x.rows()));
  if (x.cols() > INT_MAX) {
    return Unimplemented("top_k: " + std::to_string(x.cols()) + " columns exceed int32 indices");
  }
  return CudaStatus(
      LaunchTopK(x.as<float>(), x.rows(), x.cols(), k, values, indices, ctx.stream.get()),
      "top_k kernel");
}

}  // namespace deja::kernels::cuda
