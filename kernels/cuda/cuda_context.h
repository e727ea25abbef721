// The per-device state the CUDA op table entries share (stream, cuBLAS handle, scratch) and the
// entries themselves. Internal to kernels/cuda/.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"
#include "common/tensor.h"
#include "kernels/cuda/cuda_handles.h"
#include "kernels/op_table.h"

namespace deja::kernels::cuda {

// Declaration order is destruction order reversed: the cuBLAS handle goes before its workspace
// and everything before the stream.
struct CudaContext {
  int device = 0;
  Stream stream;
  DeviceBuffer cublas_workspace;
  CublasHandle cublas;
  Workspace indices;     // host index arrays (Embedding ids, Attention q_pos and head_ids,
                         // gather rows, KvWrite slots and positions) staged on device
  Workspace narrow_x;    // Linear activations rounded to the f16/bf16 weight dtype
  Workspace linear_out;  // the Linear GEMM result when ReLU must precede the accumulation
  Workspace attention;   // attention's split partials and softmax statistics
  int sm_count = 1;      // multiprocessors, for attention's split heuristic
};

// The context of a backend made by MakeCudaBackend; only ever called from its own op table.
CudaContext& ContextOf(Backend& backend);

// Copies n host int32 values into the `indices` workspace on the stream.
StatusOr<int32_t*> StageIndices(CudaContext& ctx, const int32_t* host, int64_t n);

// Op table entries (cuda_ops.cc, linear.cc); arguments are validated by kernels/ops.cc.
Status CudaEmbedding(Backend& b, TensorView table, const int32_t* ids, int64_t n, bool accumulate,
                     TensorView out);
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
                   TensorView v);
Status CudaKvEvict(Backend& b, const KvView& kv, int32_t heads, const KvEvictArgs& args,
                   int32_t* victims);
Status CudaConvert(Backend& b, TensorView src, TensorView dst);

}  // namespace deja::kernels::cuda
