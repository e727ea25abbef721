// The Deja Vu gather kernels, which also run Linear over int8 weights (rows = identity).
// gather_linear: one warp per selected weight row, lanes striding
// along K (coalesced reads of the row; 16-byte loads of 8 weights where the row allows), the
// weights reused from registers for 4 rows of x at a time, bias, ReLU and accumulation fused. gather_linear_t: threads along the output columns (each step reads a
// coalesced run of one selected row of wtᵀ), the selected rows split across blocks where the
// columns alone would leave multiprocessors idle (decode), the splits summed in a fixed order. Both accumulate in
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

// 8 elements of a 16-bit or int8 weight row, widened exactly to f32.
constexpr int kVec = 8;
__device__ __forceinline__ void Load8(const void* w, DType dtype, int64_t i, float out[kVec]) {
  if (dtype == DType::kI8) {
    const uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const int8_t*>(w) + i);
    const int8_t* b = reinterpret_cast<const int8_t*>(&raw);
#pragma unroll
    for (int t = 0; t < kVec; ++t) out[t] = static_cast<float>(b[t]);
    return;
  }
  const uint4 raw = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(w) + i);
  const uint16_t* h = reinterpret_cast<const uint16_t*>(&raw);
  if (dtype == DType::kBF16) {
#pragma unroll
    for (int t = 0; t < kVec; ++t) out[t] = __uint_as_float(static_cast<uint32_t>(h[t]) << 16);
  } else {
#pragma unroll
    for (int t = 0; t < kVec; ++t) out[t] = __half2float(__ushort_as_half(h[t]));
  }
}

// GatherLinearKernel for 16-bit and int8 weights with rows of a multiple of 8 elements: each
// lane reads 8 consecutive weights at once (one 16- or 8-byte load) and uses them for up to
// kMBlock rows of x. Lane l sums elements [8 (l + 32 t), +8) in t order and the warp adds the
// lanes in a fixed tree, so a row of x gets the same sum whatever the batch holds.
constexpr int kMBlock = 4;
__global__ void GatherLinearVecKernel(const float* x, int64_t m_rows, int64_t k_dim,
                                      const void* w, DType w_dtype, const float* scale,
                                      const void* bias, DType bias_dtype, const int32_t* rows,
                                      int64_t n_rows, bool relu, bool accumulate, float* out) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  const bool round_x = w_dtype == DType::kBF16 || w_dtype == DType::kI8;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
       j < n_rows; j += warps) {
    const int64_t row = rows != nullptr ? rows[j] : j;
    const float s = scale != nullptr ? scale[row] : 1.f;
    const int64_t w0 = row * k_dim;
    const float b = bias != nullptr ? LoadF(bias, bias_dtype, row) : 0.f;
    for (int64_t m0 = 0; m0 < m_rows; m0 += kMBlock) {
      const int mb = m_rows - m0 < kMBlock ? static_cast<int>(m_rows - m0) : kMBlock;
      float dot[kMBlock] = {0.f, 0.f, 0.f, 0.f};
      for (int64_t k = static_cast<int64_t>(lane) * kVec; k < k_dim; k += kWarp * kVec) {
        float wv[kVec];
        Load8(w, w_dtype, w0 + k, wv);
#pragma unroll
        for (int mi = 0; mi < kMBlock; ++mi) {
          if (mi < mb) {
            const float4* xp = reinterpret_cast<const float4*>(x + (m0 + mi) * k_dim + k);
            const float4 a = xp[0], c = xp[1];
            const float xv[kVec] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
#pragma unroll
            for (int t = 0; t < kVec; ++t) {
              const float xt = round_x ? __bfloat162float(__float2bfloat16_rn(xv[t])) : xv[t];
              dot[mi] += xt * wv[t];
            }
          }
        }
      }
#pragma unroll
      for (int mi = 0; mi < kMBlock; ++mi) {
        if (mi < mb) {
          const float d = WarpSum(dot[mi]);
          if (lane == 0) {
            float v = d * s + b;
            if (relu) v = fmaxf(v, 0.f);
            float* o = out + (m0 + mi) * n_rows + j;
            *o = accumulate ? *o + v : v;
          }
        }
      }
    }
  }
}

// gather_linear_t, split over the selected rows: block (x: 128 columns, y: a split of the
// selected rows, z: rows of x); its 256 threads are 128 columns x 2 interleaved halves of the
// split, summed in a fixed order. With `partial` the block writes its split's sum to
// partial[split][m][n] (GatherLinearTReduceKernel adds the splits in order); without, the final
// value (scale, accumulate) to out. Deterministic: no atomics.
constexpr int kTColumns = 128;
__global__ void __launch_bounds__(2 * kTColumns)
    GatherLinearTKernel(const float* x, int64_t m_rows, const void* wt, DType w_dtype,
                        const float* scale, int64_t n_dim, const int32_t* rows, int64_t n_rows,
                        int64_t rows_per_split, bool accumulate, float* partial, float* out) {
  __shared__ float half_sum[kTColumns];
  const int col = threadIdx.x % kTColumns, half = threadIdx.x / kTColumns;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kTColumns + col;
  const int64_t j0 = static_cast<int64_t>(blockIdx.y) * rows_per_split;
  const int64_t j1 = j0 + rows_per_split < n_rows ? j0 + rows_per_split : n_rows;
  for (int64_t m = blockIdx.z; m < m_rows; m += gridDim.z) {
    const float* xm = x + m * n_rows;
    float acc = 0.f;
    if (n < n_dim) {
      for (int64_t j = j0 + half; j < j1; j += 2) {
        const int64_t r = rows != nullptr ? rows[j] : j;
        acc += XFor(xm[j], w_dtype) * LoadF(wt, w_dtype, r * n_dim + n);
      }
    }
    if (half == 1) half_sum[col] = acc;
    __syncthreads();
    if (half == 0 && n < n_dim) {
      acc += half_sum[col];
      if (partial != nullptr) {
        partial[(static_cast<int64_t>(blockIdx.y) * m_rows + m) * n_dim + n] = acc;
      } else {
        if (scale != nullptr) acc *= scale[n];
        float* o = out + m * n_dim + n;
        *o = accumulate ? *o + acc : acc;
      }
    }
    __syncthreads();  // half_sum is rewritten for the next m
  }
}

__global__ void GatherLinearTReduceKernel(const float* partial, int64_t splits, int64_t m_rows,
                                          int64_t n_dim, const float* scale, bool accumulate,
                                          float* out) {
  const int64_t total = m_rows * n_dim;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float acc = 0.f;
    for (int64_t s = 0; s < splits; ++s) acc += partial[s * total + i];
    if (scale != nullptr) acc *= scale[i % n_dim];
    out[i] = accumulate ? out[i] + acc : acc;
  }
}

}  // namespace

cudaError_t LaunchGatherLinear(const float* x, int64_t m_rows, int64_t k_dim, const void* w,
                               DType w_dtype, const float* scale, const void* bias,
                               DType bias_dtype, const int32_t* rows, int64_t n_rows, bool relu,
                               bool accumulate, float* out, cudaStream_t stream) {
  const unsigned blocks = GridFor(n_rows, kWarpsPerBlock, 65535);
  // The vector path reads 8 weights (16 or 8 bytes) and 8 activations per lane and step; it
  // needs rows of a multiple of 8 elements on 16-byte boundaries.
  const bool vec = k_dim % kVec == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(w) % 16 == 0;
  if (vec && (w_dtype == DType::kBF16 || w_dtype == DType::kF16 || w_dtype == DType::kI8)) {
    GatherLinearVecKernel<<<blocks, kThreads, 0, stream>>>(
        x, m_rows, k_dim, w, w_dtype, scale, bias, bias_dtype, rows, n_rows, relu, accumulate,
        out);
  } else {
    GatherLinearKernel<<<blocks, kThreads, 0, stream>>>(
        x, m_rows, k_dim, w, w_dtype, scale, bias, bias_dtype, rows, n_rows, relu, accumulate,
        out);
  }
  return cudaGetLastError();
}

GatherTSplit PlanGatherLinearT(int64_t m_rows, int64_t n_dim, int64_t n_rows, int sm_count) {
  // The split depends on the columns, the selected rows and the device, never on m_rows: a row
  // of x is summed in the same order whatever else is in the batch (one request never changes
  // another's answer). Enough blocks for 4 per multiprocessor at one row of x, no split shorter
  // than 32 selected rows; rows of x go through in chunks whose partial sums fit 64 MiB.
  GatherTSplit p;
  const int64_t base = (n_dim + kTColumns - 1) / kTColumns;
  const int64_t want = (4 * static_cast<int64_t>(sm_count) + base - 1) / base;
  const int64_t most = (n_rows + 31) / 32;
  int64_t splits = want < most ? want : most;
  if (splits > 65535) splits = 65535;
  if (splits <= 1 || n_dim <= 0) return p;
  p.rows_per_split = (n_rows + splits - 1) / splits;
  p.splits = (n_rows + p.rows_per_split - 1) / p.rows_per_split;
  if (p.splits <= 1) return GatherTSplit{};
  const int64_t per_row = p.splits * n_dim * 4;
  int64_t chunk = (int64_t{64} << 20) / per_row;
  if (chunk < 1) chunk = 1;
  if (chunk > 65535) chunk = 65535;
  p.m_chunk = m_rows < chunk ? (m_rows > 0 ? m_rows : 1) : chunk;
  p.scratch_bytes = static_cast<size_t>(p.m_chunk * per_row);
  return p;
}

cudaError_t LaunchGatherLinearT(const float* x, int64_t m_rows, const void* wt, DType w_dtype,
                                const float* scale, int64_t n_dim, const int32_t* rows,
                                int64_t n_rows, bool accumulate, float* out,
                                const GatherTSplit& plan, void* scratch, cudaStream_t stream) {
  if (m_rows == 0 || n_dim == 0) return cudaSuccess;
  const unsigned col_blocks = static_cast<unsigned>((n_dim + kTColumns - 1) / kTColumns);
  if (plan.splits <= 1 || scratch == nullptr) {
    const dim3 grid(col_blocks, 1, static_cast<unsigned>(m_rows < 65535 ? m_rows : 65535));
    GatherLinearTKernel<<<grid, 2 * kTColumns, 0, stream>>>(
        x, m_rows, wt, w_dtype, scale, n_dim, rows, n_rows, n_rows > 0 ? n_rows : 1, accumulate,
        nullptr, out);
    return cudaGetLastError();
  }
  float* partial = static_cast<float*>(scratch);
  for (int64_t m0 = 0; m0 < m_rows; m0 += plan.m_chunk) {
    const int64_t m = m_rows - m0 < plan.m_chunk ? m_rows - m0 : plan.m_chunk;
    const dim3 grid(col_blocks, static_cast<unsigned>(plan.splits), static_cast<unsigned>(m));
    GatherLinearTKernel<<<grid, 2 * kTColumns, 0, stream>>>(
        x + m0 * n_rows, m, wt, w_dtype, scale, n_dim, rows, n_rows, plan.rows_per_split,
        accumulate, partial, out + m0 * n_dim);
    GatherLinearTReduceKernel<<<GridFor(m * n_dim, kThreads, 4096), kThreads, 0, stream>>>(
        partial, plan.splits, m, n_dim, scale, accumulate, out + m0 * n_dim);
  }
  return cudaGetLastError();
}

}  // namespace deja::kernels::cuda
