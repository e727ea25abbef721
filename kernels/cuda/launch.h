// Host-side launchers of the CUDA kernels (defined in the .cu files). Each enqueues its kernel(s)
// on `stream` and returns the launch error (cudaGetLastError). All pointers are device pointers;
// arguments are already validated by kernels/ops.cc. Internal to kernels/cuda/.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace deja::kernels::cuda {

// elementwise.cu

// out[i, :] = table[ids[i], :] (+= when accumulate); table [*, dim] in `dtype`.
cudaError_t LaunchEmbedding(const void* table, DType dtype, const int32_t* ids, int64_t n,
                            int64_t dim, bool accumulate, float* out, cudaStream_t stream);
// out[r, c] += x[r, c] + bias[c]; bias in `bias_dtype` or null.
cudaError_t LaunchAdd(const float* x, const void* bias, DType bias_dtype, int64_t rows,
                      int64_t cols, float* out, cudaStream_t stream);
// The Linear epilogue: v = src[r, c] + bias[c] (bias may be null), v = max(v, 0) when relu,
// out[r, c] = v (+ out[r, c] when accumulate). src may equal out when !accumulate.
cudaError_t LaunchBiasAct(const float* src, const void* bias, DType bias_dtype, int64_t rows,
                          int64_t cols, bool relu, bool accumulate, float* out,
                          cudaStream_t stream);
// out[i] = x[i] rounded to nearest-even in `dtype` (kF16 or kBF16).
cudaError_t LaunchConvertF32(const float* x, int64_t n, DType dtype, void* out,
                             cudaStream_t stream);

// rowwise.cu: one thread block per row, f32 reductions.

// out may equal x.
cudaError_t LaunchLayerNorm(const float* x, const void* gamma, const void* beta, DType dtype,
                            int64_t rows, int64_t dim, float eps, float* out, cudaStream_t stream);
// out may equal x.
cudaError_t LaunchLogSoftmax(const float* x, int64_t rows, int64_t cols, float* out,
                             cudaStream_t stream);
// k rounds of a block-wide arg-max below the previous pick: O(k * cols) per row, meant for the
// small k of sampling.
cudaError_t LaunchTopK(const float* x, int64_t rows, int64_t cols, int32_t k, float* values,
                       int32_t* indices, cudaStream_t stream);

// gather.cu: the Deja Vu gathers (semantics of GatherLinearFn / GatherLinearTFn in
// kernels/op_table.h; rows is a device array).

cudaError_t LaunchGatherLinear(const float* x, int64_t m_rows, int64_t k_dim, const void* w,
                               DType w_dtype, const void* bias, DType bias_dtype,
                               const int32_t* rows, int64_t n_rows, bool relu, bool accumulate,
                               float* out, cudaStream_t stream);
cudaError_t LaunchGatherLinearT(const float* x, int64_t m_rows, const void* wt, DType w_dtype,
                                int64_t n_dim, const int32_t* rows, int64_t n_rows, bool accumulate,
                                float* out, cudaStream_t stream);

// attention.cu: one thread block per (token, head).

struct AttentionLaunch {
  const float* q = nullptr;        // [tokens, heads * head_dim]
  const int32_t* q_pos = nullptr;  // [tokens], device
  const float* k = nullptr;        // [cache heads, capacity, head_dim]
  const float* v = nullptr;
  const int32_t* slot_pos = nullptr;  // [cache heads, capacity]
  float* score = nullptr;             // [cache heads, capacity] or null
  float* out = nullptr;               // [tokens, heads * head_dim]
  // Head-sparse: head h of q/out reads cache head head_ids[h] (device, [heads]); null: head h.
  const int32_t* head_ids = nullptr;
  float scale = 1.f;
  int32_t tokens = 0, heads = 0, head_dim = 0, capacity = 0, used = 0;
};

// Dynamic shared memory one block needs: the query and one probability per used slot.
size_t AttentionSharedBytes(int32_t head_dim, int32_t used);
// Lets the attention kernel use all the dynamic shared memory the device allows per block
// (`optin_bytes`, cudaDevAttrMaxSharedMemoryPerBlockOptin, less the kernel's static shared
// memory) and reports that limit. Call once per device before the first launch.
cudaError_t ConfigureAttention(size_t optin_bytes, size_t* max_dynamic_bytes);
cudaError_t LaunchAttention(const AttentionLaunch& a, cudaStream_t stream);

}  // namespace deja::kernels::cuda
