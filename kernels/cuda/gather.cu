// The Deja Vu gather kernels, which also run Linear over int8 weights (rows = identity).
// gather_linear: one warp per selected weight row, lanes striding
// along K (coalesced reads of the row), the row reused from cache for every row of x, bias, ReLU
// and accumulation fused. gather_linear_t: one thread per output column, walking the selected
// rows in order (each step reads a coalesced run of one selected row of wtᵀ). Both accumulate in
// f32 with the weights widened exactly. Straightforward kernels: correct for every shape, tuned
// for decode-sized M; a tensor-core path for prefill is left for later.
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"

namespace deja::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / kWarp;

__global__ void GatherLinearKernel(const float* x, int64_t m_rows, int64_t k_dim, const void* w,
                                   DType w_dtype, const float* scale, const void* bias,
                                   DType bias_dtype, const int32_t* rows, int64_t n_rows, bool relu,
                                   bool accumulate, float* out) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
       j < n_rows; j += warps) {
    const int64_t row = rows != nullptr ? rows[j] : j;
    const float s = scale != nullptr ? scale[row] : 1.f;
    const int64_t w0 = row * k_dim;
    const float b = bias != nullptr ? LoadF(bias, bias_dtype, row) : 0.f;
    for (int64_t m = 0; m < m_rows; ++m) {
      const float* xm = x + m * k_dim;
      float dot = 0.f;
      for (int64_t k = lane; k < k_dim; k += kWarp) {
        dot += XFor(xm[k], w_dtype) * LoadF(w, w_dtype, w0 + k);
      }
      dot = WarpSum(dot);
      if (lane == 0) {
        float v = dot * s + b;
        if (relu) v = fmaxf(v, 0.f);
        float* o = out + m * n_rows + j;
        *o = accumulate ? *o + v : v;
      }
    }
  }
}

__global__ void GatherLinearTKernel(const float* x, int64_t m_rows, const void* wt, DType w_dtype,
                                    const float* scale, int64_t n_dim, const int32_t* rows,
                                    int64_t n_rows, bool accumulate, float* out) {
  for (int64_t m = blockIdx.y; m < m_rows; m += gridDim.y) {
    const float* xm = x + m * n_rows;
    for (int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; n < n_dim;
         n += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      float acc = 0.f;
      for (int64_t j = 0; j < n_rows; ++j) {
        acc += XFor(xm[j], w_dtype) * LoadF(wt, w_dtype, static_cast<int64_t>(rows[j]) * n_dim + n);
      }
      if (scale != nullptr) acc *= scale[n];
      float* o = out + m * n_dim + n;
      *o = accumulate ? *o + acc : acc;
    }
  }
}

}  // namespace

cudaError_t LaunchGatherLinear(const float* x, int64_t m_rows, int64_t k_dim, const void* w,
                               DType w_dtype, const float* scale, const void* bias,
                               DType bias_dtype, const int32_t* rows, int64_t n_rows, bool relu,
                               bool accumulate, float* out, cudaStream_t stream) {
  const unsigned blocks = GridFor(n_rows, kWarpsPerBlock, 65535);
  GatherLinearKernel<<<blocks, kThreads, 0, stream>>>(
      x, m_rows, k_dim, w, w_dtype, scale, bias, bias_dtype, rows, n_rows, relu, accumulate, out);
  return cudaGetLastError();
}

cudaError_t LaunchGatherLinearT(const float* x, int64_t m_rows, const void* wt, DType w_dtype,
                                const float* scale, int64_t n_dim, const int32_t* rows,
                                int64_t n_rows, bool accumulate, float* out, cudaStream_t stream) {
  const dim3 grid(GridFor(n_dim, kThreads, 4096),
                  static_cast<unsigned>(m_rows < 65535 ? m_rows : 65535));
  GatherLinearTKernel<<<grid, kThreads, 0, stream>>>(x, m_rows, wt, w_dtype, scale, n_dim, rows,
                                                     n_rows, accumulate, out);
  return cudaGetLastError();
}

}  // namespace deja::kernels::cuda
