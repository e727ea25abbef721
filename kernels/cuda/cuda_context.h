// The per-device state the CUDA op table entries share (stream, cuBLAS and cuBLASLt handles,
// cached cuBLASLt matmul plans, scratch) and the entries themselves. Internal to kernels/cuda/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>

#include "common/status.h"
#include "common/tensor.h"
#include "kernels/cuda/cuda_handles.h"
#include "kernels/op_table.h"

namespace deja::kernels::cuda {

// What one cuBLASLt Linear GEMM is (linear.cc): the shape, the weight dtype (f16 or bf16), the
// fused epilogue, whether it accumulates (beta = 1, C = D), and the alignments in bytes (a power
// of two up to 256) of the weight, activation, output and bias pointers, which the heuristic's
// choice depends on.
struct LtMatmulKey {
  int64_t m = 0, n = 0, k = 0;
  DType dtype = DType::kF16;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  bool accumulate = false;
  uint32_t align_w = 0, align_x = 0, align_out = 0, align_bias = 0;

  bool operator<(const LtMatmulKey& o) const {
    return std::tie(m, n, k, dtype, epilogue, accumulate, align_w, align_x, align_out, align_bias) <
           std::tie(o.m, o.n, o.k, o.dtype, o.epilogue, o.accumulate, o.align_w, o.align_x,
                    o.align_out, o.align_bias);
  }
};

// The descriptors and the heuristic's algorithm for one LtMatmulKey, made on first use and reused,
// so a repeated shape does no descriptor work (and CUDA-graph capture creates nothing).
// `found` false: the heuristic offered no algorithm (cached too, so it is not asked again).
struct LtMatmulPlan {
  bool found = false;
  LtMatmulDesc desc;
  LtMatrixLayout w_layout, x_layout, out_layout;  // out_layout serves as both C and D
  cublasLtMatmulAlgo_t algo{};
  size_t workspace_bytes = 0;
};

// Declaration order is destruction order reversed: the cached cuBLASLt plans and the cuBLAS /
// cuBLASLt handles go before the workspace they use, and everything before the stream.
struct CudaContext {
  int device = 0;
  Stream stream;
  DeviceBuffer cublas_workspace;
  CublasHandle cublas;
  CublasLtHandle cublas_lt;  // uses cublas_workspace too (passed per cublasLtMatmul)
  // Linear's cuBLASLt plans; bounded by linear.cc (cleared when it reaches its cap).
  std::map<LtMatmulKey, LtMatmulPlan> lt_plans;
  Workspace indices;     // host index arrays (Embedding ids, Attention q_pos and head_ids,
                         // gather rows, KvWrite slots and positions) staged on device
  Workspace narrow_x;    // Linear activations rounded to the f16/bf16 weight dtype
  Workspace linear_out;  // the Linear GEMM result when ReLU must precede the accumulation
  Workspace attention;   // attention's split partials and softmax statistics
  Workspace top_k;       // TopK's chunk winners (two rounds' worth)
  Workspace gather_t;    // gather_linear_t's per-split partial sums
  int sm_count = 1;      // multiprocessors, for attention's split heuristic
};

// The context of a backend made by MakeCudaBackend; only ever called from its own op table.
CudaContext& ContextOf(Backend& backend);

// Copies n host int32 values into the `indices` workspace on the stream.
StatusOr<int32_t*> StageIndices(CudaContext& ctx, const int32_t* host, int64_t n);

// Op table entries (cuda_ops.cc, linear.cc); arguments are validated by kernels/ops.cc.
Status CudaEmbedding(Backend& b, TensorView table, const int32_t* ids, bool ids_on_device,
                     int64_t n, bool accumulate, TensorView out);
Status CudaLayerNorm(Backend& b, TensorView x, TensorView gamma, TensorView beta, float eps,
                     TensorView out);
Status CudaLinear(Backend& b, TensorView x, TensorView w, TensorView bias, Activation act,
                  bool accumulate, TensorView out);
Status CudaAttention(Backend& b, const AttentionArgs& args);
Status CudaAdd(Backend& b, TensorView x, TensorView bias, TensorView out);
Status CudaLogSoftmax(Backend& b, TensorView x, TensorView out);
Status CudaTopK(Backend& b, TensorView x, int32_t k, float* values, int32_t* indices);
Status CudaGatherLinear(Backend& b, TensorView x, TensorView w, TensorView bias,
                        const int32_t* rows, int64_t n_rows, Activation act, bool accumulate,
                        TensorView out);
Status CudaGatherLinearT(Backend& b, TensorView x, TensorView wt, const int32_t* rows,
                         int64_t n_rows, bool accumulate, TensorView out);
Status CudaKvWrite(Backend& b, const KvView& kv, int32_t heads, int32_t head_dim,
                   const int32_t* slots, const int32_t* positions, int32_t n, TensorView k,
                   TensorView v, const float* scores);
Status CudaRetainScores(Backend& b, const RetainArgs& args);
Status CudaDecodeAttention(Backend& b, const DecodeAttentionArgs& args);
Status CudaDecodeEvict(Backend& b, const DecodeEvictArgs& args);
Status CudaKvEvict(Backend& b, const KvView& kv, int32_t heads, const KvEvictArgs& args,
                   int32_t* victims);
Status CudaConvert(Backend& b, TensorView src, TensorView dst);
Status CudaMaskUnits(Backend& b, TensorView x, const uint8_t* keep, int32_t unit_width);

}  // namespace deja::kernels::cuda
