// int4 Linear on CUDA over common/int4.h's tiled layout, the arithmetic of ref::Linear for int4:
// each row of x quantized to int8 (symmetric, max |x| / 127, rounded half to even), each group's
// integer products summed exactly (the weights' nibbles are value + 8: the nibbles' products
// less 8 times the group's sum of x), times the group's scale into an f32 sum in group order,
// times x's scale, then bias, ReLU and accumulation. One block per (16-row tile, row of x): a
// weight-streaming kernel for decode-sized x; prefill re-reads the tile per row of x (a tensor-
// core path that dequantizes into shared memory is not written).
#include <cuda_runtime.h>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"

namespace deja::kernels::cuda {
namespace {

constexpr int kQuantThreads = 256;
constexpr int kTileRows = 16;
constexpr int kSlots = 8;  // threads per weight row; a warp holds 4 rows x 8 slots
constexpr int kI4Threads = kTileRows * kSlots;

__global__ void QuantizeRowsS8Kernel(const float* x, int64_t k_dim, int8_t* q, float* x_scale) {
  __shared__ float scratch[32];
  const int64_t m = blockIdx.x;
  const float* row = x + m * k_dim;
  float amax = 0.f;
  for (int64_t k = threadIdx.x; k < k_dim; k += blockDim.x) amax = fmaxf(amax, fabsf(row[k]));
  amax = BlockMax(amax, scratch);
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  for (int64_t k = threadIdx.x; k < k_dim; k += blockDim.x) {
    q[m * k_dim + k] = static_cast<int8_t>(__float2int_rn(row[k] * inv));
  }
  if (threadIdx.x == 0) x_scale[m] = amax / 127.f;
}

__global__ void __launch_bounds__(kI4Threads)
    LinearI4Kernel(const int8_t* q, const float* x_scale, int64_t k_dim, const uint8_t* w,
                   const float* scale, int32_t group, int64_t n_dim, const void* bias,
                   DType bias_dtype, bool relu, bool accumulate, float* out) {
  const int64_t tile = blockIdx.x, m = blockIdx.y;
  const int r = threadIdx.x / kSlots, slot = threadIdx.x % kSlots;
  const int64_t groups = k_dim / group, lines = group / 8;
  const uint8_t* tw = w + tile * (kTileRows * k_dim / 2);
  const float* ts = scale + tile * groups * kTileRows;
  const int8_t* qm = q + m * k_dim;
  float f = 0.f;
  for (int64_t g = 0; g < groups; ++g) {
    int dot = 0, sum = 0;
    for (int64_t j = g * lines + slot; j < (g + 1) * lines; j += kSlots) {
      // Line j: 16 rows x 4 bytes; byte b of row r holds K j*8 + b (low) and j*8 + 4 + b (high).
      const unsigned word = __ldg(reinterpret_cast<const unsigned*>(tw + j * 64 + r * 4));
      const int q_lo = __ldg(reinterpret_cast<const int*>(qm + j * 8));
      const int q_hi = __ldg(reinterpret_cast<const int*>(qm + j * 8 + 4));
      dot = __dp4a(static_cast<int>(word & 0x0f0f0f0fu), q_lo, dot);
      dot = __dp4a(static_cast<int>((word >> 4) & 0x0f0f0f0fu), q_hi, dot);
      sum = __dp4a(0x01010101, q_lo, sum);
      sum = __dp4a(0x01010101, q_hi, sum);
    }
    // The row's 8 slots are lanes 8r'..8r'+7 of one warp.
    for (int off = kSlots / 2; off > 0; off /= 2) {
      dot += __shfl_xor_sync(0xffffffffu, dot, off);
      sum += __shfl_xor_sync(0xffffffffu, sum, off);
    }
    f = fmaf(static_cast<float>(dot - 8 * sum), ts[g * kTileRows + r], f);
  }
  const int64_t n = tile * kTileRows + r;
  if (slot != 0 || n >= n_dim) return;
  float v = f * x_scale[m];
  if (bias != nullptr) v += LoadF(bias, bias_dtype, n);
  if (relu) v = fmaxf(v, 0.f);
  float* o = out + m * n_dim + n;
  *o = accumulate ? *o + v : v;
}

}  // namespace

size_t LinearI4ScratchBytes(int64_t m_rows, int64_t k_dim) {
  return static_cast<size_t>((m_rows * k_dim + 15) / 16 * 16 + m_rows * 4);
}

cudaError_t LaunchLinearI4(const float* x, int64_t m_rows, int64_t k_dim, const void* w,
                           const float* scale, int32_t group, int64_t n_dim, const void* bias,
                           DType bias_dtype, bool relu, bool accumulate, void* scratch,
                           float* out, cudaStream_t stream) {
  if (m_rows == 0 || n_dim == 0) return cudaSuccess;
  auto* q = static_cast<int8_t*>(scratch);
  auto* x_scale = reinterpret_cast<float*>(q + (m_rows * k_dim + 15) / 16 * 16);
  QuantizeRowsS8Kernel<<<static_cast<unsigned>(m_rows), kQuantThreads, 0, stream>>>(
      x, k_dim, q, x_scale);
  // grid.y is at most 65,535: rows of x in chunks of that many.
  constexpr int64_t kMaxGridY = 65535;
  for (int64_t m0 = 0; m0 < m_rows; m0 += kMaxGridY) {
    const int64_t rows = m_rows - m0 < kMaxGridY ? m_rows - m0 : kMaxGridY;
    const dim3 grid(static_cast<unsigned>((n_dim + kTileRows - 1) / kTileRows),
                    static_cast<unsigned>(rows));
    LinearI4Kernel<<<grid, kI4Threads, 0, stream>>>(
        q + m0 * k_dim, x_scale + m0, k_dim, static_cast<const uint8_t*>(w), scale, group, n_dim,
        bias, bias_dtype, relu, accumulate, out + m0 * n_dim);
  }
  return cudaGetLastError();
}

}  // namespace deja::kernels::cuda
