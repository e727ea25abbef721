// Causal attention over a slot-mapped KV cache: one thread block per (token, head). Logits and
// probabilities of the head's used slots stay in dynamic shared memory; softmax is in f32 with
// the max shift; H2O scores are added with atomicAdd because every token of a launch adds into
// the same per-head score row. Head-sparse launches (head_ids) index q/out by the selected head
// and the cache by the cache head it names.
#include <cmath>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"

namespace deja::kernels::cuda {
namespace {

constexpr int kThreads = 128;

__global__ void AttentionKernel(AttentionLaunch a) {
  extern __shared__ float smem[];
  __shared__ float scratch[kWarp];
  __shared__ float partial[kThreads];
  const int32_t h = blockIdx.x % a.heads;
  const int64_t t = blockIdx.x / a.heads;
  const int32_t d = a.head_dim;
  const int64_t width = static_cast<int64_t>(a.heads) * d;
  const int64_t base = static_cast<int64_t>(a.head_ids != nullptr ? a.head_ids[h] : h) * a.capacity;
  const float* q = a.q + t * width + static_cast<int64_t>(h) * d;
  float* out = a.out + t * width + static_cast<int64_t>(h) * d;
  float* sq = smem;      // [head_dim]
  float* sp = smem + d;  // [used]: logits, then unnormalised probabilities
  const int32_t q_pos = a.q_pos[t];
  for (int i = threadIdx.x; i < d; i += blockDim.x) sq[i] = q[i];
  __syncthreads();

  // Logits, one warp per slot; -inf marks a slot this token must not see (empty, or later).
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  for (int32_t s = warp; s < a.used; s += blockDim.x / kWarp) {
    const int32_t pos = a.slot_pos[base + s];
    float logit = -INFINITY;
    if (pos >= 0 && pos <= q_pos) {
      const float* k = a.k + (base + s) * d;
      float dot = 0.f;
      for (int i = lane; i < d; i += kWarp) dot += sq[i] * k[i];
      logit = a.scale * WarpSum(dot);
    }
    if (lane == 0) sp[s] = logit;
  }
  __syncthreads();

  float m = -INFINITY;
  for (int32_t s = threadIdx.x; s < a.used; s += blockDim.x) m = fmaxf(m, sp[s]);
  m = BlockMax(m, scratch);
  if (m == -INFINITY) {  // sees no slot (block-uniform): a zero row, no scores
    for (int i = threadIdx.x; i < d; i += blockDim.x) out[i] = 0.f;
    return;
  }
  float sum = 0.f;
  for (int32_t s = threadIdx.x; s < a.used; s += blockDim.x) {
    const float e = sp[s] == -INFINITY ? 0.f : expf(sp[s] - m);
    sp[s] = e;
    sum += e;
  }
  const float inv = 1.f / BlockSum(sum, scratch);  // its barriers publish sp to every thread

  if (a.score != nullptr) {
    for (int32_t s = threadIdx.x; s < a.used; s += blockDim.x) {
      if (sp[s] > 0.f) atomicAdd(a.score + base + s, sp[s] * inv);
    }
  }

  // out = sum_s p[s] v[s]. When head_dim < blockDim the block splits the slots into `groups`
  // interleaved sets, each summed by head_dim threads, then adds the group partials.
  const int groups = d < kThreads ? kThreads / d : 1;
  const int g = threadIdx.x / (d < kThreads ? d : kThreads);
  for (int i0 = 0; i0 < d; i0 += kThreads) {
    const int i = i0 + threadIdx.x % (d < kThreads ? d : kThreads);
    float acc = 0.f;
    if (g < groups && i < d) {
      for (int32_t s = g; s < a.used; s += groups) acc += sp[s] * a.v[(base + s) * d + i];
    }
    if (groups > 1) {
      partial[threadIdx.x] = acc;
      __syncthreads();
      if (g == 0) {
        for (int j = 1; j < groups; ++j) acc += partial[j * d + i];
      }
    }
    if (g == 0 && i < d) out[i] = acc * inv;
  }
}

}  // namespace

size_t AttentionSharedBytes(int32_t head_dim, int32_t used) {
  return sizeof(float) * (static_cast<size_t>(head_dim) + static_cast<size_t>(used));
}

cudaError_t ConfigureAttention(size_t optin_bytes, size_t* max_dynamic_bytes) {
  cudaFuncAttributes attr{};
  cudaError_t e = cudaFuncGetAttributes(&attr, AttentionKernel);
  if (e != cudaSuccess) return e;
  *max_dynamic_bytes = optin_bytes > attr.sharedSizeBytes ? optin_bytes - attr.sharedSizeBytes : 0;
  return cudaFuncSetAttribute(AttentionKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(*max_dynamic_bytes));
}

cudaError_t LaunchAttention(const AttentionLaunch& a, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>(static_cast<int64_t>(a.tokens) * a.heads);
  AttentionKernel<<<blocks, kThreads, AttentionSharedBytes(a.head_dim, a.used), stream>>>(a);
  return cudaGetLastError();
}

}  // namespace deja::kernels::cuda
