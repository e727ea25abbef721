// The KV-cache writes on the device: KvWrite (new tokens' keys and values into their slots) and
// KvEvict (each head's lowest-ranked old slots freed), on contiguous and paged caches alike
// (slots addressed as KvSlotIndex in kernels/op_table.h).
#include <cstdint>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"

namespace deja::kernels::cuda {
namespace {

constexpr int kWriteThreads = 256;
// KvEvict: one block per head; candidates are compared a tile of this many at a time.
constexpr int kEvictThreads = 256;

// Grid-stride over (head, token, dim): consecutive threads write consecutive elements of a row.
// The dim-0 thread of each (head, token) also sets the slot's position and clears its score.
__global__ void KvWriteKernel(KvWriteLaunch a) {
  const int64_t d = a.head_dim, n = a.n;
  const int64_t total = static_cast<int64_t>(a.heads) * n * d;
  const int64_t width = static_cast<int64_t>(a.heads) * d;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = e % d, r = e / d;
    const int64_t i = r % n, h = r / n;
    const int64_t at = SlotIndex(a.slots, h, a.dst_slots[h * n + i]);
    const int64_t src = i * width + h * d + c;
    StoreF(a.k, a.dtype, at * d + c, a.src_k[src]);
    StoreF(a.v, a.dtype, at * d + c, a.src_v[src]);
    if (c == 0) {
      a.slot_pos[at] = a.positions[i];
      if (a.score != nullptr)
        a.score[at] = a.src_score != nullptr ? a.src_score[i * a.heads + h] : 0.f;
    }
  }
}

// A decode step's writes (DecodeAttention): grid-stride over (sequence, head, dim); sequence i's
// slots are addressed through its row of the block table, its new row is src_stride floats
// after the previous sequence's.
__global__ void DecodeKvWriteKernel(DecodeKvWriteLaunch a) {
  const int64_t d = a.head_dim, heads = a.heads;
  const int64_t total = static_cast<int64_t>(a.seqs) * heads * d;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = e % d, r = e / d;
    const int64_t h = r % heads, i = r / heads;
    KvSlots slots = a.slots;
    slots.blocks = a.blocks + i * a.blocks_stride;
    const int64_t at = SlotIndex(slots, h, a.dst_slots[i * heads + h]);
    const int64_t src = i * a.src_stride + h * d + c;
    StoreF(a.k, a.dtype, at * d + c, a.src_k[src]);
    StoreF(a.v, a.dtype, at * d + c, a.src_v[src]);
    if (c == 0) {
      a.slot_pos[at] = a.positions[i];
      if (a.score != nullptr && (a.flags[i] & kDecodeKeepsScoreFlag) != 0) a.score[at] = 0.f;
    }
  }
}

// One block per (token, head): the [q, k, v] row in shared memory, one thread per hidden unit at a
// time (a strided loop), ReLU times w2 summed by a block reduction.
constexpr int kRetainThreads = 128;
__global__ void __launch_bounds__(kRetainThreads) RetainKernel(RetainLaunch a) {
  extern __shared__ float smem[];
  const int32_t hd = a.head_dim, in = 3 * hd;
  const int64_t i = blockIdx.x / a.heads;
  const int32_t h = static_cast<int32_t>(blockIdx.x % a.heads);
  float* x = smem;  // [in]
  __shared__ float partial[kRetainThreads];
  const int64_t at = i * a.row_stride + static_cast<int64_t>(h) * hd;
  for (int c = threadIdx.x; c < hd; c += blockDim.x) {
    x[c] = a.q[at + c];
    x[hd + c] = a.k[at + c];
    x[2 * hd + c] = a.v[at + c];
  }
  __syncthreads();
  float acc = 0.f;
  for (int j = threadIdx.x; j < a.hidden; j += blockDim.x) {
    const int64_t unit = static_cast<int64_t>(h) * a.hidden + j;
    const float* w = a.w1 + unit * in;
    float u = a.b1[unit];
    for (int c = 0; c < in; ++c) u += w[c] * x[c];
    acc += fmaxf(u, 0.f) * a.w2[unit];
  }
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int stride = kRetainThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) a.out[i * a.heads + h] = partial[0] + a.b2[h];
}

// A candidate's rank key: lower goes first, ties by the lower position (positions are distinct
// within a head, so the order is total). kMeanScore divides in f32, as the host policy does.
__device__ __forceinline__ float RankKey(const KvEvictLaunch& a, int64_t at, int32_t pos) {
  switch (a.rank) {
    case EvictRank::kScore:
      return a.score[at];
    case EvictRank::kMeanScore:
      return a.score[at] / static_cast<float>(a.length - pos);
    default:
      return 0.f;  // kPosition: the tie-break alone
  }
}

// Slot s of head h as a candidate: its position (-1 when it is none: empty, recent or past
// `used`) and its rank key.
__device__ __forceinline__ void LoadCandidate(const KvEvictLaunch& a, int32_t h, int32_t s,
                                              int32_t* pos, float* key) {
  *pos = -1;
  *key = 0.f;
  if (s >= a.used) return;
  const int64_t at = SlotIndex(a.slots, h, s);
  const int32_t p = a.slot_pos[at];
  if (p < 0 || p >= a.oldest_recent) return;
  *pos = p;
  *key = RankKey(a, at, p);
}

__device__ __forceinline__ bool Lower(float key, int32_t pos, float other_key, int32_t other_pos) {
  return key < other_key || (key == other_key && pos < other_pos);
}

// One block per head. A candidate's rank is the number of candidates below it; those with rank
// < excess are the victims, written to victims[h * excess + rank]. Each thread owns one slot of a
// chunk of blockDim slots and counts the candidates below it, a tile of blockDim slots at a time
// through shared memory (O(used^2 / blockDim) comparisons, O(used^2 / blockDim) reads, all from
// L2 after the first chunk); a thread stops counting at `excess`, and a tile loop ends when no
// thread of the block still counts, so small excesses (decode's 1) cost about one pass per chunk.
// Slots are freed only after all counting, since freeing changes the candidate set.
__device__ __forceinline__ void EvictHead(const KvEvictLaunch& a, int32_t h) {
  __shared__ float tile_key[kEvictThreads];
  __shared__ int32_t tile_pos[kEvictThreads];  // -1: not a candidate
  int32_t* victims = a.victims + static_cast<int64_t>(h) * a.excess;
  for (int32_t j = threadIdx.x; j < a.excess; j += blockDim.x) victims[j] = -1;
  if (a.decay != 1.f) {
    for (int32_t s = threadIdx.x; s < a.used; s += blockDim.x) {
      const int64_t at = SlotIndex(a.slots, h, s);
      if (a.slot_pos[at] >= 0) a.score[at] *= a.decay;
    }
  }
  __syncthreads();  // the -1s and the decayed scores land before any candidate is ranked
  if (a.excess == 0) return;

  for (int32_t chunk = 0; chunk < a.used; chunk += blockDim.x) {
    const int32_t s = chunk + static_cast<int32_t>(threadIdx.x);
    int32_t pos;
    float key;
    LoadCandidate(a, h, s, &pos, &key);
    int32_t below = 0;
    for (int32_t base = 0; base < a.used; base += blockDim.x) {
      if (!__syncthreads_or(pos >= 0 && below < a.excess)) break;  // also guards the tile reuse
      const int32_t o = base + static_cast<int32_t>(threadIdx.x);
      int32_t o_pos;
      float o_key;
      LoadCandidate(a, h, o, &o_pos, &o_key);
      tile_key[threadIdx.x] = o_key;
      tile_pos[threadIdx.x] = o_pos;
      __syncthreads();
      if (pos >= 0 && below < a.excess) {
        const int32_t n = min(static_cast<int32_t>(blockDim.x), a.used - base);
        for (int32_t j = 0; j < n; ++j) {
          if (tile_pos[j] >= 0 && Lower(tile_key[j], tile_pos[j], key, pos)) ++below;
        }
      }
    }
    if (pos >= 0 && below < a.excess) victims[below] = s;
  }
  __syncthreads();  // every victim is chosen (and written) before any slot is freed
  for (int32_t j = threadIdx.x; j < a.excess; j += blockDim.x) {
    const int32_t s = victims[j];
    if (s < 0) continue;
    const int64_t at = SlotIndex(a.slots, h, s);
    a.slot_pos[at] = -1;
    if (a.score != nullptr) a.score[at] = 0.f;
  }
}

__global__ void __launch_bounds__(kEvictThreads) KvEvictKernel(KvEvictLaunch a) {
  EvictHead(a, static_cast<int32_t>(blockIdx.x));
}

// Block (head, sequence): the sequence's arguments from its params row (block-uniform).
__global__ void __launch_bounds__(kEvictThreads) DecodeEvictKernel(DecodeEvictLaunch d) {
  const int32_t i = static_cast<int32_t>(blockIdx.y);
  const int32_t* p = d.params + static_cast<int64_t>(i) * 7;
  KvEvictLaunch a;
  a.excess = p[1];
  a.decay = __int_as_float(p[4]);
  if (a.excess == 0 && a.decay == 1.f) return;
  a.slots = d.slots;
  a.slots.blocks = d.blocks + static_cast<int64_t>(i) * d.max_blocks;
  a.slot_pos = d.slot_pos;
  a.score = d.score;
  a.heads = d.heads;
  a.used = d.used[i];
  a.rank = static_cast<EvictRank>(p[0]);
  a.oldest_recent = p[2];
  a.length = p[3];
  const uint64_t address = static_cast<uint64_t>(static_cast<uint32_t>(p[5])) |
                           (static_cast<uint64_t>(static_cast<uint32_t>(p[6])) << 32);
  a.victims = reinterpret_cast<int32_t*>(address);
  EvictHead(a, static_cast<int32_t>(blockIdx.x));
}

}  // namespace

cudaError_t LaunchKvWrite(const KvWriteLaunch& a, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(a.heads) * a.n * a.head_dim;
  KvWriteKernel<<<GridFor(total, kWriteThreads), kWriteThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t LaunchDecodeKvWrite(const DecodeKvWriteLaunch& a, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(a.seqs) * a.heads * a.head_dim;
  if (total == 0) return cudaSuccess;
  DecodeKvWriteKernel<<<GridFor(total, kWriteThreads), kWriteThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t LaunchRetainScores(const RetainLaunch& a, cudaStream_t stream) {
  const int64_t blocks = static_cast<int64_t>(a.n) * a.heads;
  if (blocks == 0) return cudaSuccess;
  const size_t shared = static_cast<size_t>(3 * a.head_dim) * sizeof(float);
  RetainKernel<<<static_cast<unsigned>(blocks), kRetainThreads, shared, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t LaunchKvEvict(const KvEvictLaunch& a, cudaStream_t stream) {
  KvEvictKernel<<<static_cast<unsigned>(a.heads), kEvictThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t LaunchDecodeEvict(const DecodeEvictLaunch& a, cudaStream_t stream) {
  if (a.seqs == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(a.heads), static_cast<unsigned>(a.seqs));
  DecodeEvictKernel<<<grid, kEvictThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace deja::kernels::cuda
