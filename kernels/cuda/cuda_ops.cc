// The CUDA op table entries other than Linear: argument plumbing from validated views to the
// kernel launchers, staging of host index arrays, attention's scratch and the few CUDA-specific
// limits (grid sizes, attention's head size), reported as Status.
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

// A view's slot layout for the kernels (blocks stays a device pointer).
KvSlots SlotsOf(const KvView& kv) {
  KvSlots s;
  s.blocks = kv.blocks;
  s.capacity = kv.capacity;
  s.block_slots = kv.block_slots;
  s.block_stride = kv.block_stride;
  return s;
}

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

Status CudaEmbedding(Backend& b, TensorView table, const int32_t* ids, bool ids_on_device,
                     int64_t n, bool accumulate, TensorView out) {
  CudaContext& ctx = ContextOf(b);
  DEJA_RETURN_IF_ERROR(Enter(ctx));
  const int32_t* dev_ids = ids;
  if (!ids_on_device) {
    DEJA_ASSIGN_OR_RETURN(dev_ids, StageIndices(ctx, ids, n));
  }
  return CudaStatus(LaunchEmbedding(table.data, table.dtype, table.scale, dev_ids, n, table.cols(),
                                    accumulate, out.as<float>(), ctx.stream.get()),
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
  if (tokens * args.heads > INT_MAX || args.heads > 65535) {
    return Unimplemented("attention: tokens * heads = " + std::to_string(tokens * args.heads) +
                         " (heads " + std::to_string(args.heads) + ") exceeds the CUDA grid limit");
  }
  if (args.head_dim > kAttentionMaxHeadDim) {
    return Unimplemented("attention: head_dim " + std::to_string(args.head_dim) +
                         " exceeds the CUDA kernel's " + std::to_string(kAttentionMaxHeadDim));
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
  a.k = args.kv.k;
  a.v = args.kv.v;
  a.kv_dtype = args.kv.dtype;  // f32 or f16: CudaBackend::Supports
  a.slot_pos = args.kv.slot_pos;
  a.score = args.kv.score;
  a.slots = SlotsOf(args.kv);
  a.out = args.out.as<float>();
  a.scale = args.scale;
  a.tokens = static_cast<int32_t>(tokens);
  a.heads = args.heads;
  a.head_dim = args.head_dim;
  a.used = args.kv.used;
  const AttentionPlan plan = PlanAttention(a, ctx.sm_count);
  DEJA_ASSIGN_OR_RETURN(void* scratch,
                        ctx.attention.Get(AttentionScratchBytes(a, plan), ctx.stream.get()));
  DEJA_RETURN_IF_ERROR(
      CudaStatus(LaunchAttention(a, plan, scratch, ctx.stream.get()), "attention kernels"));
  // The skipped (token, head) pairs were attended too: zero them (AttentionArgs::keep).
  if (args.keep != nullptr) return CudaMaskUnits(b, args.out, args.keep, args.head_dim);
  return Status::Ok();
}

// No staging: every index array is already on the device, so the launches' arguments are the
// same from step to step but for seqs and max_used.
Status CudaDecodeAttention(Backend& b, const DecodeAttentionArgs& args) {
  CudaContext& ctx = ContextOf(b);
  DEJA_RETURN_IF_ERROR(Enter(ctx));
  if (static_cast<int64_t>(args.seqs) * args.heads > INT_MAX || args.heads > 65535 ||
      args.seqs > 65535) {
    return Unimplemented("decode_attention: " + std::to_string(args.seqs) + " sequences x " +
                         std::to_string(args.heads) + " heads exceed the CUDA grid limit");
  }
  if (args.head_dim > kAttentionMaxHeadDim) {
    return Unimplemented("decode_attention: head_dim " + std::to_string(args.head_dim) +
                         " exceeds the CUDA kernel's " + std::to_string(kAttentionMaxHeadDim));
  }
  KvSlots slots = SlotsOf(args.kv);
  slots.blocks = nullptr;
  slots.capacity = args.max_blocks * args.kv.block_slots;
  DecodeKvWriteLaunch w;
  w.slots = slots;
  w.k = args.kv.k;
  w.v = args.kv.v;
  w.dtype = args.kv.dtype;
  w.slot_pos = const_cast<int32_t*>(args.kv.slot_pos);
  w.score = args.kv.score;
  w.src_k = args.k;
  w.src_v = args.v;
  w.src_stride = args.kv_stride;
  w.dst_slots = args.slots;
  w.positions = args.q_pos;
  w.flags = args.flags;
  w.blocks = args.blocks;
  w.blocks_stride = args.max_blocks;
  w.seqs = args.seqs;
  w.heads = args.heads;
  w.head_dim = args.head_dim;
  DEJA_RETURN_IF_ERROR(
      CudaStatus(LaunchDecodeKvWrite(w, ctx.stream.get()), "decode_attention kv write kernel"));
  AttentionLaunch a;
  a.q = args.q;
  a.q_stride = args.q_stride;
  a.q_pos = args.q_pos;
  a.k = args.kv.k;
  a.v = args.kv.v;
  a.kv_dtype = args.kv.dtype;
  a.slot_pos = args.kv.slot_pos;
  a.score = args.kv.score;
  a.slots = slots;
  a.out = args.out;
  a.scale = args.scale;
  a.tokens = args.seqs;
  a.heads = args.heads;
  a.head_dim = args.head_dim;
  a.used = args.max_used;
  a.seq_used = args.used;
  a.seq_blocks = args.blocks;
  a.seq_blocks_stride = args.max_blocks;
  a.seq_flags = args.flags;
  const AttentionPlan plan = PlanAttention(a, ctx.sm_count);
  DEJA_ASSIGN_OR_RETURN(void* scratch,
                        ctx.attention.Get(AttentionScratchBytes(a, plan), ctx.stream.get()));
  return CudaStatus(LaunchAttention(a, plan, scratch, ctx.stream.get()),
                    "decode_attention kernels");
}

Status CudaKvWrite(Backend& b, const KvView& kv, int32_t heads, int32_t head_dim,
                   const int32_t* slots, const int32_t* positions, int32_t n, TensorView k,
                   TensorView v, const float* scores) {
  CudaContext& ctx = ContextOf(b);
  DEJA_RETURN_IF_ERROR(Enter(ctx));
  // slots [heads, n] then positions [n], in one staging copy.
  const int64_t n_slots = static_cast<int64_t>(heads) * n;
  std::vector<int32_t> host_ids(static_cast<size_t>(n_slots + n));
  std::copy_n(slots, n_slots, host_ids.begin());
  std::copy_n(positions, n, host_ids.begin() + n_slots);
  DEJA_ASSIGN_OR_RETURN(int32_t * dev_ids,
                        StageIndices(ctx, host_ids.data(), static_cast<int64_t>(host_ids.size())));
  KvWriteLaunch a;
  a.slots = SlotsOf(kv);
  a.k = kv.k;
  a.v = kv.v;
  a.dtype = kv.dtype;
  a.slot_pos = const_cast<int32_t*>(kv.slot_pos);  // const in KvView for attention's sake
  a.score = kv.score;
  a.src_score = scores;
  a.dst_slots = dev_ids;
  a.positions = dev_ids + n_slots;
  a.src_k = k.as<float>();
  a.src_v = v.as<float>();
  a.heads = heads;
  a.head_dim = head_dim;
  a.n = n;
  return CudaStatus(LaunchKvWrite(a, ctx.stream.get()), "kv_write kernel");
}

Status CudaRetainScores(Backend& b, const RetainArgs& args) {
  CudaContext& ctx = ContextOf(b);
  DEJA_RETURN_IF_ERROR(Enter(ctx));
  RetainLaunch a;
  a.q = args.q;
  a.k = args.k;
  a.v = args.v;
  a.row_stride = args.row_stride;
  a.n = args.n;
  a.heads = args.heads;
  a.head_dim = args.head_dim;
  a.hidden = args.hidden;
  a.w1 = args.w1;
  a.b1 = args.b1;
  a.w2 = args.w2;
  a.b2 = args.b2;
  a.out = args.out;
  return CudaStatus(LaunchRetainScores(a, ctx.stream.get()), "retain_scores kernel");
}

Status CudaDecodeEvict(Backend& b, const DecodeEvictArgs& args) {
  CudaContext& ctx = ContextOf(b);
  DEJA_RETURN_IF_ERROR(Enter(ctx));
  // Sequences are the grid's y dimension.
  if (args.seqs > 65535) {
    return Unimplemented("decode_evict: " + std::to_string(args.seqs) +
                         " sequences exceed the CUDA grid's 65,535");
  }
  static_assert(kDecodeEvictParams == 7, "DecodeEvictKernel reads 7 params per sequence");
  static_assert(static_cast<int>(KvRank::kScore) == static_cast<int>(EvictRank::kScore) &&
                    static_cast<int>(KvRank::kMeanScore) == static_cast<int>(EvictRank::kMeanScore) &&
                    static_cast<int>(KvRank::kPosition) == static_cast<int>(EvictRank::kPosition),
                "params carry KvRank values, which the kernel reads as EvictRank");
  DecodeEvictLaunch a;
  a.slots = SlotsOf(args.kv);
  a.slot_pos = const_cast<int32_t*>(args.kv.slot_pos);
  a.score = args.kv.score;
  a.seqs = args.seqs;
  a.heads = args.heads;
  a.used = args.used;
  a.blocks = args.blocks;
  a.max_blocks = args.max_blocks;
  a.params = args.params;
  return CudaStatus(LaunchDecodeEvict(a, ctx.stream.get()), "decode_evict kernel");
}

Status CudaKvEvict(Backend& b, const KvView& kv, int32_t heads, const KvEvictArgs& args,
                   int32_t* victims) {
  CudaContext& ctx = ContextOf(b);
  DEJA_RETURN_IF_ERROR(Enter(ctx));
  KvEvictLaunch a;
  a.slots = SlotsOf(kv);
  a.slot_pos = const_cast<int32_t*>(kv.slot_pos);
  a.score = kv.score;
  a.heads = heads;
  a.used = kv.used;
  switch (args.rank) {
    case KvRank::kScore:
      a.rank = EvictRank::kScore;
      break;
    case KvRank::kMeanScore:
      a.rank = EvictRank::kMeanScore;
      break;
    case KvRank::kPosition:
      a.rank = EvictRank::kPosition;
      break;
  }
  a.excess = args.excess;
  a.oldest_recent = args.oldest_recent;
  a.length = args.length;
  a.decay = args.decay;
  a.victims = victims;
  return CudaStatus(LaunchKvEvict(a, ctx.stream.get()), "kv_evict kernel");
}

Status CudaMaskUnits(Backend& b, TensorView x, const uint8_t* keep, int32_t unit_width) {
  CudaContext& ctx = ContextOf(b);
  DEJA_RETURN_IF_ERROR(Enter(ctx));
  const int64_t units = x.cols() / unit_width, n = x.rows() * units;
  DEJA_ASSIGN_OR_RETURN(void* dev_keep, ctx.indices.Get(static_cast<size_t>(n), ctx.stream.get()));
  DEJA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev_keep, keep, static_cast<size_t>(n),
                                            cudaMemcpyHostToDevice, ctx.stream.get()),
                            "staging the mask");
  return CudaStatus(
      LaunchMaskUnits(x.as<float>(), x.rows(), x.cols(), static_cast<const uint8_t*>(dev_keep),
                      unit_width, ctx.stream.get()),
      "mask_units kernel");
}

Status CudaConvert(Backend& b, TensorView src, TensorView dst) {
  CudaContext& ctx = ContextOf(b);
  DEJA_RETURN_IF_ERROR(Enter(ctx));
  return CudaStatus(
      LaunchConvert(src.data, src.dtype, dst.data, dst.dtype, src.numel(), ctx.stream.get()),
      "convert kernel");
}

Status CudaGatherLinear(Backend& b, TensorView x, TensorView w, TensorView bias,
                        const int32_t* rows, int64_t n_rows, Activation act, bool accumulate,
                        TensorView out) {
  CudaContext& ctx = ContextOf(b);
  DEJA_RETURN_IF_ERROR(Enter(ctx));
  DEJA_ASSIGN_OR_RETURN(int32_t * dev_rows, StageIndices(ctx, rows, n_rows));
  return CudaStatus(
      LaunchGatherLinear(x.as<float>(), x.rows(), x.cols(), w.data, w.dtype, w.scale, bias.data,
                         bias.dtype, dev_rows, n_rows, act == Activation::kRelu, accumulate,
                         out.as<float>(), ctx.stream.get()),
      "gather_linear kernel");
}

Status CudaGatherLinearT(Backend& b, TensorView x, TensorView wt, const int32_t* rows,
                         int64_t n_rows, bool accumulate, TensorView out) {
  CudaContext& ctx = ContextOf(b);
  DEJA_RETURN_IF_ERROR(Enter(ctx));
  DEJA_ASSIGN_OR_RETURN(int32_t * dev_rows, StageIndices(ctx, rows, n_rows));
  const GatherTSplit plan = PlanGatherLinearT(x.rows(), wt.cols(), n_rows, ctx.sm_count);
  void* scratch = nullptr;
  if (plan.scratch_bytes > 0) {
    DEJA_ASSIGN_OR_RETURN(scratch, ctx.gather_t.Get(plan.scratch_bytes, ctx.stream.get()));
  }
  return CudaStatus(
      LaunchGatherLinearT(x.as<float>(), x.rows(), wt.data, wt.dtype, wt.scale, wt.cols(), dev_rows,
                          n_rows, accumulate, out.as<float>(), plan, scratch, ctx.stream.get()),
      "gather_linear_t kernels");
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
  void* scratch = nullptr;
  if (const size_t bytes = TopKScratchBytes(x.rows(), x.cols(), k); bytes > 0) {
    DEJA_ASSIGN_OR_RETURN(scratch, ctx.top_k.Get(bytes, ctx.stream.get()));
  }
  return CudaStatus(LaunchTopK(x.as<float>(), x.rows(), x.cols(), k, values, indices, scratch,
                               ctx.stream.get()),
                    "top_k kernels");
}

}  // namespace deja::kernels::cuda
