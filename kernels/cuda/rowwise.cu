// Row-wise CUDA kernels, one thread block per row with f32 block reductions: LayerNorm (two-pass
// mean and variance; the row held in registers up to 12,288 columns), LogSoftmax (max-shifted) and TopK (bitonic chunk sorts; k rounds of block
// arg-max for large k).
#include <cmath>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"

namespace deja::kernels::cuda {
namespace {

constexpr int kThreads = 256;
// TopK by sorting: chunks of 2048 pairs (16 KiB of shared memory, 1024 threads) for k up to 512,
// so each round keeps at most a quarter of its input.
constexpr int kSortChunk = 2048;
constexpr int32_t kSortMaxK = kSortChunk / 4;

// x and out may alias (in-place ops): each element is read, then written, by the same thread
// after every reduction over the row has finished.
__global__ void LayerNormKernel(const float* x, const void* gamma, const void* beta, DType dtype,
                                int64_t dim, float eps, float* out) {
  __shared__ float scratch[kWarp];
  const float* xr = x + blockIdx.x * dim;
  float* orow = out + blockIdx.x * dim;
  float s = 0.f;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) s += xr[c];
  const float mean = BlockSum(s, scratch) / static_cast<float>(dim);
  // Two passes: E[(x - mean)^2] keeps its precision when |mean| >> stddev.
  float v = 0.f;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
    const float d = xr[c] - mean;
    v += d * d;
  }
  const float var = BlockSum(v, scratch) / static_cast<float>(dim);
  const float inv = 1.f / sqrtf(var + eps);
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
    orow[c] = (xr[c] - mean) * inv * LoadF(gamma, dtype, c) + LoadF(beta, dtype, c);
  }
}

// LayerNorm with the row held in registers (one global read of x): kPer elements a thread,
// element c in thread c % blockDim.x, so the sums run in the order of LayerNormKernel.
constexpr int kLnPer = 12;
__global__ void LayerNormRegKernel(const float* x, const void* gamma, const void* beta,
                                   DType dtype, int64_t dim, float eps, float* out) {
  __shared__ float scratch[kWarp];
  const float* xr = x + blockIdx.x * dim;
  float* orow = out + blockIdx.x * dim;
  float v[kLnPer];
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < kLnPer; ++i) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    v[i] = c < dim ? xr[c] : 0.f;
    s += v[i];
  }
  const float mean = BlockSum(s, scratch) / static_cast<float>(dim);
  float q = 0.f;
#pragma unroll
  for (int i = 0; i < kLnPer; ++i) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    if (c < dim) {
      const float d = v[i] - mean;
      q += d * d;
    }
  }
  const float var = BlockSum(q, scratch) / static_cast<float>(dim);
  const float inv = 1.f / sqrtf(var + eps);
#pragma unroll
  for (int i = 0; i < kLnPer; ++i) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    if (c < dim) orow[c] = (v[i] - mean) * inv * LoadF(gamma, dtype, c) + LoadF(beta, dtype, c);
  }
}

__global__ void LogSoftmaxKernel(const float* x, int64_t cols, float* out) {
  __shared__ float scratch[kWarp];
  const float* xr = x + blockIdx.x * cols;
  float* orow = out + blockIdx.x * cols;
  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
  m = BlockMax(m, scratch);
  float s = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += expf(xr[c] - m);
  // (x - m) - log(sum), never x - (m + log(sum)): near large logits m + log(sum) rounds to
  // the ulp of m (6e-5 at 1000), which the shifted form does not.
  const float log_sum = logf(BlockSum(s, scratch));
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) orow[c] = (xr[c] - m) - log_sum;
}

// The TopK order: larger values first, every number before NaN, ties (and NaNs) to the lower
// index. Index -1 is "no candidate" and loses to everything.
__device__ __forceinline__ bool Better(float av, int32_t ai, float bv, int32_t bi) {
  if (bi < 0) return ai >= 0;
  if (ai < 0) return false;
  const bool a_nan = isnan(av), b_nan = isnan(bv);
  if (a_nan != b_nan) return b_nan;
  if (!a_nan && av != bv) return av > bv;
  return ai < bi;
}

__device__ __forceinline__ void WarpBest(float& v, int32_t& i) {
  for (int o = kWarp / 2; o > 0; o /= 2) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (Better(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
}

// Round j picks the best element strictly worse than pick j - 1; the order is total (indices
// are unique), so the k picks are exactly the first k of the sorted row.
__global__ void TopKKernel(const float* x, int64_t cols, int32_t k, float* values,
                           int32_t* indices) {
  __shared__ float warp_v[kWarp];
  __shared__ int32_t warp_i[kWarp];
  __shared__ float prev_v;
  __shared__ int32_t prev_i;
  const float* xr = x + blockIdx.x * cols;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  if (threadIdx.x == 0) prev_i = -1;
  __syncthreads();
  for (int32_t j = 0; j < k; ++j) {
    const float pv = prev_v;
    const int32_t pi = prev_i;
    float best_v = 0.f;
    int32_t best_i = -1;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float v = xr[c];
      const int32_t ci = static_cast<int32_t>(c);
      if ((pi < 0 || Better(pv, pi, v, ci)) && Better(v, ci, best_v, best_i)) {
        best_v = v;
        best_i = ci;
      }
    }
    WarpBest(best_v, best_i);
    if (lane == 0) {
      warp_v[warp] = best_v;
      warp_i[warp] = best_i;
    }
    __syncthreads();  // also: every thread has read prev_* before thread 0 rewrites them
    if (warp == 0) {
      best_v = lane < warps ? warp_v[lane] : 0.f;
      best_i = lane < warps ? warp_i[lane] : -1;
      WarpBest(best_v, best_i);
      if (lane == 0) {
        values[blockIdx.x * static_cast<int64_t>(k) + j] = best_v;
        indices[blockIdx.x * static_cast<int64_t>(k) + j] = best_i;
        prev_v = best_v;
        prev_i = best_i;
      }
    }
    __syncthreads();
  }
}

// One block sorts kSortChunk (value, index) pairs of a row in shared memory (a bitonic network in
// the TopK order; pads are index -1 and lose to everything) and writes the first `keep`.
// blockIdx.x is the chunk, blockIdx.y the row. `ids` null: the index is the column. The order is
// total, so the best `keep` of each chunk hold the row's best `keep`, and a few rounds of this
// kernel (chunks' winners, then their winners) give exactly the reference's first k.
__global__ void __launch_bounds__(kSortChunk / 2)
    TopKSortKernel(const float* vals, const int32_t* ids, int64_t n, int64_t row_stride,
                   int32_t keep, float* out_v, int32_t* out_i, int64_t out_stride) {
  __shared__ float sv[kSortChunk];
  __shared__ int32_t si[kSortChunk];
  const int64_t row = blockIdx.y, base = static_cast<int64_t>(blockIdx.x) * kSortChunk;
  const float* vr = vals + row * row_stride;
  const int32_t* ir = ids ? ids + row * row_stride : nullptr;
  for (int t = threadIdx.x; t < kSortChunk; t += blockDim.x) {
    const int64_t c = base + t;
    sv[t] = c < n ? vr[c] : 0.f;
    si[t] = c < n ? (ir ? ir[c] : static_cast<int32_t>(c)) : -1;
  }
  __syncthreads();
  for (int size = 2; size <= kSortChunk; size <<= 1) {
    for (int stride = size / 2; stride > 0; stride >>= 1) {
      for (int t = threadIdx.x; t < kSortChunk / 2; t += blockDim.x) {
        const int lo = 2 * t - (t & (stride - 1)), hi = lo + stride;
        // Blocks of `size` alternate direction; the last merge (size == kSortChunk) puts the
        // best first.
        const bool best_first = (lo & size) == 0;
        const bool swap = best_first ? Better(sv[hi], si[hi], sv[lo], si[lo])
                                     : Better(sv[lo], si[lo], sv[hi], si[hi]);
        if (swap) {
          const float v = sv[lo];
          sv[lo] = sv[hi];
          sv[hi] = v;
          const int32_t i = si[lo];
          si[lo] = si[hi];
          si[hi] = i;
        }
      }
      __syncthreads();
    }
  }
  float* ov = out_v + row * out_stride + static_cast<int64_t>(blockIdx.x) * keep;
  int32_t* oi = out_i + row * out_stride + static_cast<int64_t>(blockIdx.x) * keep;
  for (int t = threadIdx.x; t < keep; t += blockDim.x) {
    ov[t] = sv[t];
    oi[t] = si[t];
  }
}

}  // namespace

cudaError_t LaunchLayerNorm(const float* x, const void* gamma, const void* beta, DType dtype,
                            int64_t rows, int64_t dim, float eps, float* out, cudaStream_t stream) {
  const unsigned grid = static_cast<unsigned>(rows);
  if (dim <= kThreads * kLnPer) {
    LayerNormRegKernel<<<grid, kThreads, 0, stream>>>(x, gamma, beta, dtype, dim, eps, out);
  } else if (dim <= 1024 * kLnPer) {
    LayerNormRegKernel<<<grid, 1024, 0, stream>>>(x, gamma, beta, dtype, dim, eps, out);
  } else {
    LayerNormKernel<<<grid, kThreads, 0, stream>>>(x, gamma, beta, dtype, dim, eps, out);
  }
  return cudaGetLastError();
}

cudaError_t LaunchLogSoftmax(const float* x, int64_t rows, int64_t cols, float* out,
                             cudaStream_t stream) {
  LogSoftmaxKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, cols, out);
  return cudaGetLastError();
}

namespace {
// The sort path's grid holds the rows in y (at most 65535).
bool SortTopK(int64_t rows, int32_t k) { return k <= kSortMaxK && rows <= 65535; }
}  // namespace

size_t TopKScratchBytes(int64_t rows, int64_t cols, int32_t k) {
  if (!SortTopK(rows, k) || cols <= kSortChunk) return 0;
  const int64_t first = (cols + kSortChunk - 1) / kSortChunk * k;  // the first round's winners
  return 2 * static_cast<size_t>(rows * first) * (sizeof(float) + sizeof(int32_t));
}

cudaError_t LaunchTopK(const float* x, int64_t rows, int64_t cols, int32_t k, float* values,
                       int32_t* indices, void* scratch, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (!SortTopK(rows, k)) {
    TopKKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, cols, k, values, indices);
    return cudaGetLastError();
  }
  // Rounds of chunk sorts, each keeping k per chunk, until one chunk is left; ping-pong buffers.
  const int64_t first = (cols + kSortChunk - 1) / kSortChunk * k;
  float* buf_v[2] = {static_cast<float*>(scratch), nullptr};
  int32_t* buf_i[2] = {nullptr, nullptr};
  if (scratch != nullptr) {
    buf_i[0] = reinterpret_cast<int32_t*>(buf_v[0] + rows * first);
    buf_v[1] = reinterpret_cast<float*>(buf_i[0] + rows * first);
    buf_i[1] = reinterpret_cast<int32_t*>(buf_v[1] + rows * first);
  }
  const float* src_v = x;
  const int32_t* src_i = nullptr;
  int64_t n = cols, stride = cols;
  for (int b = 0; n > kSortChunk; b ^= 1) {
    const int64_t chunks = (n + kSortChunk - 1) / kSortChunk;
    TopKSortKernel<<<dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(rows)),
                     kSortChunk / 2, 0, stream>>>(src_v, src_i, n, stride, k, buf_v[b], buf_i[b],
                                                  first);
    src_v = buf_v[b];
    src_i = buf_i[b];
    n = chunks * k;
    stride = first;
  }
  TopKSortKernel<<<dim3(1, static_cast<unsigned>(rows)), kSortChunk / 2, 0, stream>>>(
      src_v, src_i, n, stride, k, values, indices, k);
  return cudaGetLastError();
}

}  // namespace deja::kernels::cuda
