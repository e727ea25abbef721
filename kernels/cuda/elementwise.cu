// Element-wise CUDA kernels: embedding gather, residual add with bias, the Linear bias/ReLU/
// accumulate epilogue, the f32 -> f16/bf16 activation conversion and the Convert op. Grid-stride
// loops over the flattened [rows, cols] index space.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"

namespace deja::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ int64_t GlobalIndex() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t GridStride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

__global__ void EmbeddingKernel(const void* table, DType dtype, const float* scale,
                                const int32_t* ids, int64_t n, int64_t dim, bool accumulate,
                                float* out) {
  for (int64_t e = GlobalIndex(); e < n * dim; e += GridStride()) {
    const int64_t i = e / dim, c = e - i * dim;
    float v = LoadF(table, dtype, static_cast<int64_t>(ids[i]) * dim + c);
    if (scale != nullptr) v *= scale[ids[i]];
    out[e] = accumulate ? out[e] + v : v;
  }
}

__global__ void AddKernel(const float* x, const void* bias, DType bias_dtype, int64_t rows,
                          int64_t cols, float* out) {
  for (int64_t e = GlobalIndex(); e < rows * cols; e += GridStride()) {
    const float b = bias != nullptr ? LoadF(bias, bias_dtype, e % cols) : 0.f;
    out[e] = out[e] + (x[e] + b);
  }
}

__global__ void BiasActKernel(const float* src, const void* bias, DType bias_dtype, int64_t rows,
                              int64_t cols, bool relu, bool accumulate, float* out) {
  for (int64_t e = GlobalIndex(); e < rows * cols; e += GridStride()) {
    float v = src[e];
    if (bias != nullptr) v += LoadF(bias, bias_dtype, e % cols);
    if (relu && v < 0.f) v = 0.f;  // NaN passes through, as in the reference
    out[e] = accumulate ? out[e] + v : v;
  }
}

__global__ void ToHalfKernel(const float* x, int64_t n, __half* out) {
  for (int64_t e = GlobalIndex(); e < n; e += GridStride()) out[e] = __float2half_rn(x[e]);
}

__global__ void ToBF16Kernel(const float* x, int64_t n, __nv_bfloat16* out) {
  for (int64_t e = GlobalIndex(); e < n; e += GridStride()) out[e] = __float2bfloat16_rn(x[e]);
}

// Widening is exact and the narrowing rounds as the host does (device_util.cuh StoreF).
__global__ void ConvertKernel(const void* src, DType src_dtype, void* dst, DType dst_dtype,
                              int64_t n) {
  for (int64_t e = GlobalIndex(); e < n; e += GridStride()) {
    StoreF(dst, dst_dtype, e, LoadF(src, src_dtype, e));
  }
}

}  // namespace

cudaError_t LaunchEmbedding(const void* table, DType dtype, const float* scale, const int32_t* ids,
                            int64_t n, int64_t dim, bool accumulate, float* out,
                            cudaStream_t stream) {
  EmbeddingKernel<<<GridFor(n * dim, kThreads), kThreads, 0, stream>>>(table, dtype, scale, ids, n,
                                                                       dim, accumulate, out);
  return cudaGetLastError();
}

cudaError_t LaunchAdd(const float* x, const void* bias, DType bias_dtype, int64_t rows,
                      int64_t cols, float* out, cudaStream_t stream) {
  AddKernel<<<GridFor(rows * cols, kThreads), kThreads, 0, stream>>>(x, bias, bias_dtype, rows,
                                                                     cols, out);
  return cudaGetLastError();
}

cudaError_t LaunchBiasAct(const float* src, const void* bias, DType bias_dtype, int64_t rows,
                          int64_t cols, bool relu, bool accumulate, float* out,
                          cudaStream_t stream) {
  BiasActKernel<<<GridFor(rows * cols, kThreads), kThreads, 0, stream>>>(
      src, bias, bias_dtype, rows, cols, relu, accumulate, out);
  return cudaGetLastError();
}

cudaError_t LaunchConvertF32(const float* x, int64_t n, DType dtype, void* out,
                             cudaStream_t stream) {
  if (dtype == DType::kBF16) {
    ToBF16Kernel<<<GridFor(n, kThreads), kThreads, 0, stream>>>(x, n,
                                                                static_cast<__nv_bfloat16*>(out));
  } else {
    ToHalfKernel<<<GridFor(n, kThreads), kThreads, 0, stream>>>(x, n, static_cast<__half*>(out));
  }
  return cudaGetLastError();
}

__global__ void MaskUnitsKernel(float* x, int64_t n, int64_t cols, const uint8_t* keep,
                                int32_t unit_width) {
  const int64_t units = cols / unit_width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    if (keep[r * units + c / unit_width] == 0) x[i] = 0.0f;
  }
}

cudaError_t LaunchMaskUnits(float* x, int64_t rows, int64_t cols, const uint8_t* keep,
                            int32_t unit_width, cudaStream_t stream) {
  const int64_t n = rows * cols;
  MaskUnitsKernel<<<GridFor(n, kThreads), kThreads, 0, stream>>>(x, n, cols, keep, unit_width);
  return cudaGetLastError();
}

cudaError_t LaunchConvert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n,
                          cudaStream_t stream) {
  ConvertKernel<<<GridFor(n, kThreads), kThreads, 0, stream>>>(src, src_dtype, dst, dst_dtype, n);
  return cudaGetLastError();
}

}  // namespace deja::kernels::cuda
