// Causal attention over a slot-mapped KV cache (f32 or f16; contiguous or paged), in the manner of
// flash-decoding: one block per (token, head, split of the slots) streams its slots once with an
// online softmax in f32, so shared memory does not grow with the cache; when (token, head) pairs
// alone would leave the device idle (decode), the slots are split and a combine kernel merges
// the splits' (max, sum, accumulator) partials. H2O scores need the final max and sum, so a third
// kernel recomputes each visible slot's logit and adds its probability.
//
// Lane groups: a slot's key and value rows are read by a group of `lanes` lanes (a power of two
// dividing the warp) in 16-byte loads where the row size and the pointers allow (4 f32 or 8 f16
// elements per load, else one element), so a warp reads 32 / lanes rows per step. Each lane keeps
// its share of q and of the accumulator in registers: kPerLane loads of kVec elements.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/launch.h"

namespace deja::kernels::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarp;
// Split heuristics: aim for this many blocks per SM (4 warps each), but give no split fewer than
// kMinSplitSlots slots (merging costs a partial of head_dim + 2 floats per split).
constexpr int64_t kBlocksPerSm = 8;
constexpr int64_t kMinSplitSlots = 256;
constexpr int64_t kMaxSplits = 1024;  // also bounds the combine kernel's shared memory

struct Scratch {
  float2* stats = nullptr;       // [tokens * heads] final (max, sum) for the score kernel
  float2* part_stats = nullptr;  // [tokens * heads * splits] (max, sum) of each split
  float* part_acc = nullptr;     // [tokens * heads * splits, head_dim] unnormalised outputs
};

// The lanes reading one slot together; groups never straddle a warp.
struct LaneGroup {
  int lanes;   // per group: a power of two <= 32
  int lane;    // this thread's lane within its group
  int group;   // this thread's group within the block
  int groups;  // groups per block
};

__device__ __forceinline__ LaneGroup MakeLaneGroup(int lanes) {
  return {lanes, static_cast<int>(threadIdx.x) % lanes, static_cast<int>(threadIdx.x) / lanes,
          static_cast<int>(blockDim.x) / lanes};
}

// Sum over one lane group, returned to all its lanes; every lane of the warp must call it.
__device__ __forceinline__ float GroupSum(float v, int lanes) {
  for (int o = lanes / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// exp(m - max), 0 for a part that saw no slot (m = -inf, possibly max too).
__device__ __forceinline__ float Rescale(float m, float max) {
  return m == -INFINITY ? 0.f : expf(m - max);
}

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }

// Load v (of head_dim / kVec) of a row, widened: 16 bytes when kVec > 1.
template <typename T, int kVec>
__device__ __forceinline__ void LoadVec(const T* row, int32_t v, float (&x)[kVec]) {
  if constexpr (kVec == 1) {
    x[0] = ToFloat(row[v]);
  } else if constexpr (std::is_same_v<T, float>) {
    static_assert(kVec == 4, "f32 rows load as float4");
    const float4 f = reinterpret_cast<const float4*>(row)[v];
    x[0] = f.x;
    x[1] = f.y;
    x[2] = f.z;
    x[3] = f.w;
  } else {
    static_assert(kVec == 8, "f16 rows load as 8 halves");
    const uint4 u = reinterpret_cast<const uint4*>(row)[v];
    const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(h[i]);
      x[2 * i] = f.x;
      x[2 * i + 1] = f.y;
    }
  }
}

// This lane's share of a row: loads lane, lane + lanes, ... (zeros past the row or when !read).
template <typename T, int kVec, int kPerLane>
__device__ __forceinline__ void LoadShare(const T* row, bool read, const LaneGroup& g,
                                          int32_t n_vec, float (&x)[kPerLane][kVec]) {
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int32_t v = g.lane + j * g.lanes;
    if (read && v < n_vec) {
      LoadVec<T, kVec>(row, v, x[j]);
    } else {
#pragma unroll
      for (int e = 0; e < kVec; ++e) x[j][e] = 0.f;
    }
  }
}

// The lane's partial q . k, in a fixed order: the split and score kernels get the same bits.
template <int kVec, int kPerLane>
__device__ __forceinline__ float PartialDot(const float (&q)[kPerLane][kVec],
                                            const float (&k)[kPerLane][kVec]) {
  float dot = 0.f;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j)
#pragma unroll
    for (int e = 0; e < kVec; ++e) dot = fmaf(q[j][e], k[j][e], dot);
  return dot;
}

// Slots in flight per lane group and step: about 16 floats of K and of V per lane.
template <int kVec, int kPerLane>
__host__ __device__ constexpr int Unroll() {
  const int u = 16 / (kVec * kPerLane);
  return u < 1 ? 1 : (u > 4 ? 4 : u);
}

// Token t's cache: its slot count and block table (its own in a decode step over many caches).
__device__ __forceinline__ int32_t UsedOf(const AttentionLaunch& a, int64_t t) {
  return a.seq_used != nullptr ? a.seq_used[t] : a.used;
}
__device__ __forceinline__ KvSlots SlotsOf(const AttentionLaunch& a, int64_t t) {
  KvSlots slots = a.slots;
  if (a.seq_used != nullptr) slots.blocks = a.seq_blocks + t * a.seq_blocks_stride;
  return slots;
}
__device__ __forceinline__ const float* QRow(const AttentionLaunch& a, int64_t t, int32_t h) {
  const int64_t stride = a.q_stride != 0 ? a.q_stride : static_cast<int64_t>(a.heads) * a.head_dim;
  return a.q + t * stride + static_cast<int64_t>(h) * a.head_dim;
}

// One block per (token, head) = blockIdx.x and split = blockIdx.y: slots
// [split * split_slots, +split_slots) of [0, used). Each lane group runs an online softmax over
// its slots (kUnroll at a time, so several rows are in flight); the warp's groups merge by
// shuffles and the warps through shared memory ([kWarps, head_dim] accumulators, then kWarps
// maxima and sums). Unsplit launches write the normalised output, split ones their partial.
template <typename T, int kVec, int kPerLane>
__global__ void __launch_bounds__(kThreads)
    AttentionSplitKernel(AttentionLaunch a, AttentionPlan plan, int lanes, Scratch scratch) {
  extern __shared__ float smem[];
  constexpr int kUnroll = Unroll<kVec, kPerLane>();
  const int64_t th = blockIdx.x;  // t * heads + h: also the row of q and out
  const int32_t h = static_cast<int32_t>(th % a.heads);
  const int64_t t = th / a.heads;
  const int32_t cache_head = a.head_ids != nullptr ? a.head_ids[h] : h;
  const int32_t q_pos = a.q_pos[t];
  const int32_t d = a.head_dim, n_vec = d / kVec;
  const LaneGroup g = MakeLaneGroup(lanes);
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);
  const int32_t used = UsedOf(a, t);
  const KvSlots slots = SlotsOf(a, t);
  const float* q_row = QRow(a, t, h);

  float q[kPerLane][kVec], acc[kPerLane][kVec];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int32_t c = (g.lane + j * g.lanes) * kVec;
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      q[j][e] = c < d ? q_row[c + e] : 0.f;
      acc[j][e] = 0.f;
    }
  }
  float m = -INFINITY, l = 0.f;

  const int32_t begin = static_cast<int32_t>(blockIdx.y) * plan.split_slots;
  const int32_t end = static_cast<int32_t>(
      min(static_cast<int64_t>(used), static_cast<int64_t>(begin) + plan.split_slots));
  for (int32_t base = begin; base < end; base += g.groups * kUnroll) {  // block-uniform
    int64_t row[kUnroll];
    bool seen[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int32_t s = base + u * g.groups + g.group;  // adjacent groups, adjacent slots
      seen[u] = false;
      row[u] = 0;
      if (s < end) {
        row[u] = SlotIndex(slots, cache_head, s);
        const int32_t pos = a.slot_pos[row[u]];
        seen[u] = pos >= 0 && pos <= q_pos;
      }
    }
    float kx[kUnroll][kPerLane][kVec], vx[kUnroll][kPerLane][kVec];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      LoadShare<T, kVec, kPerLane>(k + row[u] * d, seen[u], g, n_vec, kx[u]);
      LoadShare<T, kVec, kPerLane>(v + row[u] * d, seen[u], g, n_vec, vx[u]);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const float dot = GroupSum(PartialDot<kVec, kPerLane>(q, kx[u]), g.lanes);
      if (!seen[u]) continue;  // uniform within the group
      const float x = a.scale * dot;
      if (x > m) {
        const float c = expf(m - x);  // 0 for the first slot (m = -inf)
        l *= c;
#pragma unroll
        for (int j = 0; j < kPerLane; ++j)
#pragma unroll
          for (int e = 0; e < kVec; ++e) acc[j][e] *= c;
        m = x;
      }
      const float p = expf(x - m);
      l += p;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j)
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[j][e] = fmaf(p, vx[u][j][e], acc[j][e]);
    }
  }

  // Merge the warp's groups (lanes holding the same dimensions are `lanes` apart).
  for (int o = g.lanes; o < kWarp; o *= 2) {
    const float m_o = __shfl_xor_sync(0xffffffffu, m, o);
    const float l_o = __shfl_xor_sync(0xffffffffu, l, o);
    const float mx = fmaxf(m, m_o);
    const float c = Rescale(m, mx), c_o = Rescale(m_o, mx);
    l = l * c + l_o * c_o;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        acc[j][e] = acc[j][e] * c + __shfl_xor_sync(0xffffffffu, acc[j][e], o) * c_o;
      }
    m = mx;
  }

  // Merge the warps: group 0 of each publishes its accumulator, maximum and sum.
  float* s_acc = smem;             // [kWarps, d]
  float* s_m = smem + kWarps * d;  // [kWarps]
  float* s_l = s_m + kWarps;       // [kWarps]
  const int warp = static_cast<int>(threadIdx.x) / kWarp;
  if (static_cast<int>(threadIdx.x) % kWarp < g.lanes) {
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int32_t c = (g.lane + j * g.lanes) * kVec;
      if (c < d) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) s_acc[warp * d + c + e] = acc[j][e];
      }
    }
    if (g.lane == 0) {
      s_m[warp] = m;
      s_l[warp] = l;
    }
  }
  __syncthreads();
  float mx = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, s_m[w]);
  float c[kWarps], sum = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    c[w] = Rescale(s_m[w], mx);
    sum += s_l[w] * c[w];
  }
  if (plan.splits == 1) {
    // sum > 0 exactly when the token sees a slot (the maximum's term is 1); else a zero row.
    float* out = a.out + th * d;
    for (int32_t i = threadIdx.x; i < d; i += blockDim.x) {
      float x = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) x += s_acc[w * d + i] * c[w];
      out[i] = sum > 0.f ? x / sum : 0.f;
    }
    if (threadIdx.x == 0 && scratch.stats != nullptr) scratch.stats[th] = make_float2(mx, sum);
  } else {
    const int64_t part = th * plan.splits + blockIdx.y;
    for (int32_t i = threadIdx.x; i < d; i += blockDim.x) {
      float x = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) x += s_acc[w * d + i] * c[w];
      scratch.part_acc[part * d + i] = x;
    }
    if (threadIdx.x == 0) scratch.part_stats[part] = make_float2(mx, sum);
  }
}

// One block per (token, head): merges its splits' partials (weights in shared memory, [splits]).
__global__ void __launch_bounds__(kThreads)
    AttentionCombineKernel(AttentionLaunch a, AttentionPlan plan, Scratch scratch) {
  extern __shared__ float weight[];
  __shared__ float red[kWarp];
  const int64_t th = blockIdx.x;
  const float2* st = scratch.part_stats + th * plan.splits;
  float mx = -INFINITY;
  for (int32_t s = threadIdx.x; s < plan.splits; s += blockDim.x) mx = fmaxf(mx, st[s].x);
  mx = BlockMax(mx, red);
  float sum = 0.f;
  for (int32_t s = threadIdx.x; s < plan.splits; s += blockDim.x) {
    weight[s] = Rescale(st[s].x, mx);
    sum += st[s].y * weight[s];
  }
  sum = BlockSum(sum, red);  // its barriers also publish weight[]
  const int32_t d = a.head_dim;
  const float* part = scratch.part_acc + th * plan.splits * d;
  float* out = a.out + th * d;
  for (int32_t i = threadIdx.x; i < d; i += blockDim.x) {
    float x = 0.f;
    for (int32_t s = 0; s < plan.splits; ++s)
      x += part[static_cast<int64_t>(s) * d + i] * weight[s];
    out[i] = sum > 0.f ? x / sum : 0.f;
  }
  if (threadIdx.x == 0 && scratch.stats != nullptr) scratch.stats[th] = make_float2(mx, sum);
}

// H2O: one lane group per (head, slot) = (blockIdx.y, blockIdx.x * groups + group) keeps the
// slot's key in registers and, for each query token in order, adds the token's probability
// exp(logit - max) / sum into a running score, which it writes back once. Each slot of each cache
// head has one owner (ops.cc refuses repeated head_ids), so no atomics: the sums are deterministic
// and in the reference's order (token by token).
template <typename T, int kVec, int kPerLane>
__global__ void __launch_bounds__(kThreads)
    AttentionScoreKernel(AttentionLaunch a, int lanes, const float2* stats) {
  const LaneGroup g = MakeLaneGroup(lanes);
  const int32_t h = static_cast<int32_t>(blockIdx.y);
  const int32_t cache_head = a.head_ids != nullptr ? a.head_ids[h] : h;
  const int32_t d = a.head_dim, n_vec = d / kVec;
  const int64_t s = static_cast<int64_t>(blockIdx.x) * g.groups + g.group;
  // A decode step over many caches: blockIdx.z is the sequence (its one token, its cache); else
  // every token over the one cache.
  const bool per_seq = a.seq_used != nullptr;
  const int32_t t_begin = per_seq ? static_cast<int32_t>(blockIdx.z) : 0;
  const int32_t t_end = per_seq ? t_begin + 1 : a.tokens;
  if (per_seq && (a.seq_flags[t_begin] & kDecodeAddsScoreFlag) == 0) return;  // block-uniform
  int64_t row = 0;
  int32_t pos = -1;
  if (s < UsedOf(a, t_begin)) {
    row = SlotIndex(SlotsOf(a, t_begin), cache_head, s);
    pos = a.slot_pos[row];
  }
  float kx[kPerLane][kVec], q[kPerLane][kVec];
  LoadShare<T, kVec, kPerLane>(static_cast<const T*>(a.k) + row * d, pos >= 0, g, n_vec, kx);
  float score = pos >= 0 ? a.score[row] : 0.f;
  for (int32_t t = t_begin; t < t_end; ++t) {
    const bool seen = pos >= 0 && pos <= a.q_pos[t];
    if (!__any_sync(0xffffffffu, seen)) continue;  // warp-uniform
    const float* q_row = QRow(a, t, h);
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int32_t c = (g.lane + j * g.lanes) * kVec;
#pragma unroll
      for (int e = 0; e < kVec; ++e) q[j][e] = c < d ? q_row[c + e] : 0.f;
    }
    const float dot = GroupSum(PartialDot<kVec, kPerLane>(q, kx), g.lanes);
    if (seen) {
      const float2 st = stats[static_cast<int64_t>(t) * a.heads + h];
      score += expf(a.scale * dot - st.x) / st.y;
    }
  }
  if (pos >= 0 && g.lane == 0) a.score[row] = score;
}

template <typename T, int kVec, int kPerLane>
cudaError_t Run(const AttentionLaunch& a, const AttentionPlan& plan, int lanes,
                const Scratch& scratch, cudaStream_t stream) {
  const int64_t pairs = static_cast<int64_t>(a.tokens) * a.heads;
  const size_t shared = sizeof(float) * (static_cast<size_t>(kWarps) * a.head_dim + 2 * kWarps);
  const dim3 grid(static_cast<unsigned>(pairs), static_cast<unsigned>(plan.splits));
  AttentionSplitKernel<T, kVec, kPerLane>
      <<<grid, kThreads, shared, stream>>>(a, plan, lanes, scratch);
  if (plan.splits > 1) {
    AttentionCombineKernel<<<static_cast<unsigned>(pairs), kThreads,
                             sizeof(float) * static_cast<size_t>(plan.splits), stream>>>(a, plan,
                                                                                         scratch);
  }
  if (a.score != nullptr && a.used > 0) {
    const int64_t groups = kThreads / lanes;
    const dim3 score_grid(static_cast<unsigned>((a.used + groups - 1) / groups),
                          static_cast<unsigned>(a.heads),
                          static_cast<unsigned>(a.seq_used != nullptr ? a.tokens : 1));
    AttentionScoreKernel<T, kVec, kPerLane>
        <<<score_grid, kThreads, 0, stream>>>(a, lanes, scratch.stats);
  }
  return cudaGetLastError();
}

int PowerOfTwoAtLeast(int64_t n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

// Picks the load width (16 bytes when rows and pointers are 16-byte aligned), the lane-group size
// and the registers per lane; head_dim <= kAttentionMaxHeadDim (cuda_ops.cc checks).
template <typename T>
cudaError_t Dispatch(const AttentionLaunch& a, const AttentionPlan& plan, const Scratch& scratch,
                     cudaStream_t stream) {
  constexpr int kWide = 16 / sizeof(T);
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool wide = a.head_dim % kWide == 0 && aligned(a.k) && aligned(a.v);
  const int64_t n_vec = wide ? a.head_dim / kWide : a.head_dim;
  const int lanes = PowerOfTwoAtLeast(std::min<int64_t>(n_vec, kWarp));
  const int64_t per_lane = (n_vec + lanes - 1) / lanes;
  if (wide) {
    if constexpr (std::is_same_v<T, float>) {  // per_lane <= 1024 / 4 / 32 = 8
      if (per_lane <= 1) return Run<T, 4, 1>(a, plan, lanes, scratch, stream);
      if (per_lane <= 2) return Run<T, 4, 2>(a, plan, lanes, scratch, stream);
      return Run<T, 4, 8>(a, plan, lanes, scratch, stream);
    } else {  // per_lane <= 1024 / 8 / 32 = 4
      if (per_lane <= 1) return Run<T, 8, 1>(a, plan, lanes, scratch, stream);
      return Run<T, 8, 4>(a, plan, lanes, scratch, stream);
    }
  }
  // Odd head sizes or unaligned views: one element per load.
  if (per_lane <= 1) return Run<T, 1, 1>(a, plan, lanes, scratch, stream);
  if (per_lane <= 8) return Run<T, 1, 8>(a, plan, lanes, scratch, stream);
  return Run<T, 1, 32>(a, plan, lanes, scratch, stream);
}

// Scratch byte offsets: stats, then the split partials (each part 256-byte aligned).
struct ScratchLayout {
  size_t stats = 0, part_stats = 0, part_acc = 0, bytes = 0;
};

size_t Align256(size_t n) { return (n + 255) / 256 * 256; }

ScratchLayout LayoutOf(const AttentionLaunch& a, const AttentionPlan& plan) {
  const size_t pairs = static_cast<size_t>(a.tokens) * static_cast<size_t>(a.heads);
  const size_t parts = plan.splits > 1 ? pairs * static_cast<size_t>(plan.splits) : 0;
  ScratchLayout l;
  l.stats = 0;
  l.part_stats = Align256(a.score != nullptr ? pairs * sizeof(float2) : 0);
  l.part_acc = l.part_stats + Align256(parts * sizeof(float2));
  l.bytes = l.part_acc + parts * static_cast<size_t>(a.head_dim) * sizeof(float);
  return l;
}

}  // namespace

AttentionPlan PlanAttention(const AttentionLaunch& a, int sm_count) {
  AttentionPlan plan;
  if (a.seq_used != nullptr) {
    // A decode step over many caches: splits of a fixed kMinSplitSlots slots (more only past
    // kMaxSplits splits), so a sequence's slots fall into the same splits, summed in the same
    // order, whatever the batch, the other sequences' lengths or the max_used bucket (a padded
    // graph's). A sequence within one split gets the unsplit bits: the combine weighs its empty
    // splits zero and its own one.
    const int64_t used = std::max(a.used, 1);
    int64_t per = kMinSplitSlots;
    if ((used + per - 1) / per > kMaxSplits) {
      per = ((used + kMaxSplits - 1) / kMaxSplits + 63) / 64 * 64;
    }
    plan.split_slots = static_cast<int32_t>(per);
    plan.splits = static_cast<int32_t>((used + per - 1) / per);
    return plan;
  }
  plan.split_slots = std::max(a.used, 1);
  const int64_t pairs = static_cast<int64_t>(a.tokens) * a.heads;
  const int64_t target = static_cast<int64_t>(std::max(sm_count, 1)) * kBlocksPerSm;
  if (pairs >= target || a.used < 2 * kMinSplitSlots) return plan;
  int64_t splits = (target + pairs - 1) / pairs;
  splits = std::min({splits, (a.used + kMinSplitSlots - 1) / kMinSplitSlots, kMaxSplits});
  // Whole steps of 64 slots per split; recount, as rounding up may leave fewer splits.
  const int64_t per = ((a.used + splits - 1) / splits + 63) / 64 * 64;
  plan.split_slots = static_cast<int32_t>(per);
  plan.splits = static_cast<int32_t>((a.used + per - 1) / per);
  return plan;
}

size_t AttentionScratchBytes(const AttentionLaunch& a, const AttentionPlan& plan) {
  return LayoutOf(a, plan).bytes;
}

cudaError_t LaunchAttention(const AttentionLaunch& a, const AttentionPlan& plan, void* scratch,
                            cudaStream_t stream) {
  const ScratchLayout l = LayoutOf(a, plan);
  char* base = static_cast<char*>(scratch);
  Scratch s;
  if (a.score != nullptr) s.stats = reinterpret_cast<float2*>(base + l.stats);
  if (plan.splits > 1) {
    s.part_stats = reinterpret_cast<float2*>(base + l.part_stats);
    s.part_acc = reinterpret_cast<float*>(base + l.part_acc);
  }
  if (a.kv_dtype == DType::kF16) return Dispatch<__half>(a, plan, s, stream);
  return Dispatch<float>(a, plan, s, stream);
}

}  // namespace deja::kernels::cuda
