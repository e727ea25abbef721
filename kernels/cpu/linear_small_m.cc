// The decode-time Linear kernel (M = 1 .. a few dozen rows of x): out = x · wᵀ with w [N, K] in
// its checkpoint dtype. Decode is memory-bound, so each weight row is read from memory once and
// reused, widened in registers, for every row of x: a block of kRows weight rows walks along K
// with up to kCols rows of x, keeping kRows * kCols f32 accumulators in registers (loads per FMA
// = (R + C) / (R * C)). When M > kCols the same block is walked again for the next rows of x; it
// is then in L1/L2, not DRAM.
//
// Measured on the dev box (Zen 5, AVX-512, one thread, hot caches, K = 2048 f16): 4x4 tiles
// reach ~215 GFLOP/s at M = 4; widening the block once into an f32 scratch for the later passes
// was slower (~150 vs ~200 GFLOP/s at M = 8..32) because f32 doubles the bytes loaded per FMA
// while the f16 -> f32 conversion is nearly free; 4x6 tiles add ~10% at M >= 8. Software
// prefetch of the next row block during the current block's first walk raised one thread's
// cold-weight streaming rate at M = 1 from ~20 to ~26-29 GB/s (M = 16: 4.3 -> 3.7 ms for an
// 8192 x 2048 f16 matrix); prefetching two blocks ahead measured the same. For M > kCols the
// block is walked ceil(M / kCols) times and each walk prefetches its share of the next block:
// when the first walk alone prefetched the whole next block, DRAM had to deliver it in a third
// of the block's time at M = 16 and the next block's first walk stalled. Spreading it measured
// (one thread, best of 10, alternating in one process) 143.9 vs 127.9 GFLOP/s on 8192 x 2048,
// 178 vs 160 on 2048 x 8192, and no change at M = 1.
// Other register blocks, measured in one process alternating with 4 x 6 (one thread, best of 10,
// f16): 6 x 4 reached 176 vs 182 GFLOP/s at M = 16 with hot weights and 133 vs 152 streaming an
// 8192 x 2048 matrix from DRAM; 5 x 5 159 vs 177 hot, 128 vs 147 streaming. In a standalone
// intrinsics loop without prefetch or epilogue 6 x 4 measured ~200 hot against ~165 for 4 x 6;
// why that does not carry over here is not understood yet.
// The same kernel serves the gather-GEMV (Deja Vu fc1 over selected neurons): a block is R row
// pointers, consecutive rows for Linear, rows[n] of the index list for the gather; the prefetch
// likewise follows the next block's R row pointers.
// Compiled per x86 target by Highway's foreach_target and dispatched at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/linear_small_m.cc"
// foreach_target must precede highway.h and the -inl headers.
// clang-format off
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/cache_control.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/simd_load-inl.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace deja::kernels::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

constexpr int kRows = 4;  // weight rows per register block
// x rows per register block: AVX-512 has 32 vector registers (4 x 6 accumulators + 5 operands);
// narrower targets have 16, so they take 2.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr int kCols = 6;
#else
constexpr int kCols = 2;
#endif

HWY_INLINE float Finish(float dot, int64_t n, const LinearEpilogue& e, const float* prev) {
  float v = (e.scale != nullptr ? dot * e.scale[n] : dot) + (e.bias != nullptr ? e.bias[n] : 0.f);
  if (e.relu) v = v > 0.f ? v : 0.f;
  return e.accumulate ? v + *prev : v;
}

// R weight rows (w[r] points at row r, k_dim weights) against C rows of x (row stride k_dim);
// stores epilogue'd results to out[c * ldo + n + r].
// When prefetch is non-null, also pulls the next block's R rows (prefetch[r]) into cache: this
// walk's share of them (walk pf_phase of pf_walks takes every pf_walks-th step's lines), so the
// next block streams from DRAM evenly while all walks of this block run.
template <int R, int C, typename WT>
HWY_INLINE void Tile(const WT* const* w, const float* HWY_RESTRICT x, int64_t k_dim, int64_t n,
                     const LinearEpilogue& e, float* HWY_RESTRICT out, int64_t ldo,
                     const WT* const* prefetch, bool contiguous, int64_t pf_phase = 0,
                     int64_t pf_walks = 1) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  using V = hn::Vec<DF>;
  V acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = hn::Zero(df);
  int64_t k = 0;
  const WT* wr[R];
  for (int r = 0; r < R; ++r) wr[r] = w[r];
  int64_t step = 0, pf_step = pf_phase;
  for (; k + lanes <= k_dim; k += lanes, ++step) {
    if (prefetch != nullptr) {
      if (contiguous) {
        // Dense Linear: the next block is R * k_dim consecutive weights; walk it as one
        // sequential stream, R * lanes weights per step of its share (interleaving R row
        // streams instead measured ~15-30% slower at M = 1).
        if (step == pf_step) {
          pf_step += pf_walks;
          const char* pf = reinterpret_cast<const char*>(prefetch[0]) + k * R * sizeof(WT);
          for (int line = 0; line < static_cast<int>(R * lanes * sizeof(WT)); line += 64) {
            hwy::Prefetch(pf + line);
          }
        }
      } else if (const int64_t byte = k * static_cast<int64_t>(sizeof(WT));
                 (byte & 63) == 0 && (byte >> 6) % pf_walks == pf_phase) {
        // Gather: one prefetch per cache line of each next row, the walk's share of the lines.
        for (int r = 0; r < R; ++r) hwy::Prefetch(prefetch[r] + k);
      }
    }
    V wv[R];
    for (int r = 0; r < R; ++r) wv[r] = LoadWidened(df, wr[r] + k);
    for (int c = 0; c < C; ++c) {
      const V xv = hn::LoadU(df, x + c * k_dim + k);
      for (int r = 0; r < R; ++r) acc[r][c] = hn::MulAdd(wv[r], xv, acc[r][c]);
    }
  }
  float sums[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) sums[r][c] = hn::GetLane(hn::SumOfLanes(df, acc[r][c]));
  for (; k < k_dim; ++k) {
    for (int r = 0; r < R; ++r) {
      const float wk = ScalarToFloat(wr[r][k]);
      for (int c = 0; c < C; ++c) sums[r][c] += wk * x[c * k_dim + k];
    }
  }
  for (int c = 0; c < C; ++c) {
    for (int r = 0; r < R; ++r) {
      float* o = out + c * ldo + n + r;
      *o = Finish(sums[r][c], n + r, e, o);
    }
  }
}

// All rows of x against R weight rows; the walks share the prefetch of the next block.
template <int R, typename WT>
HWY_INLINE void RowBlock(const WT* const* w, const float* x, int64_t m_rows, int64_t k_dim,
                         int64_t n, const LinearEpilogue& e, float* out, int64_t ldo,
                         const WT* const* next, bool contiguous) {
  const int64_t walks = (m_rows + kCols - 1) / kCols;
  int64_t m = 0, walk = 0;
  for (; m + kCols <= m_rows; m += kCols, ++walk) {
    Tile<R, kCols>(w, x + m * k_dim, k_dim, n, e, out + m * ldo, ldo,
                   walk < walks ? next : nullptr, contiguous, walk, walks);
  }
  const float* xm = x + m * k_dim;
  float* om = out + m * ldo;
  const WT* const* pf = walk < walks ? next : nullptr;
  switch (m_rows - m) {
    case 5:
      Tile<R, 5>(w, xm, k_dim, n, e, om, ldo, pf, contiguous, walk, walks);
      break;
    case 4:
      Tile<R, 4>(w, xm, k_dim, n, e, om, ldo, pf, contiguous, walk, walks);
      break;
    case 3:
      Tile<R, 3>(w, xm, k_dim, n, e, om, ldo, pf, contiguous, walk, walks);
      break;
    case 2:
      Tile<R, 2>(w, xm, k_dim, n, e, om, ldo, pf, contiguous, walk, walks);
      break;
    case 1:
      Tile<R, 1>(w, xm, k_dim, n, e, om, ldo, pf, contiguous, walk, walks);
      break;
    default:
      break;
  }
}

// Output column n reads weight row rows[n] (rows == nullptr: row n).
template <typename WT>
void LinearTyped(const float* x, int64_t m_rows, int64_t k_dim, const WT* w, const int32_t* rows,
                 int64_t n_begin, int64_t n_end, const LinearEpilogue& e, float* out, int64_t ldo) {
  auto row = [&](int64_t n) { return w + (rows != nullptr ? rows[n] : n) * k_dim; };
  const WT* wn[kRows];
  const WT* next[kRows];
  int64_t n = n_begin;
  for (; n + kRows <= n_end; n += kRows) {
    const bool has_next = n + 2 * kRows <= n_end;
    for (int r = 0; r < kRows; ++r) {
      wn[r] = row(n + r);
      if (has_next) next[r] = row(n + kRows + r);
    }
    RowBlock<kRows>(wn, x, m_rows, k_dim, n, e, out, ldo, has_next ? next : nullptr,
                    rows == nullptr);
  }
  for (int64_t r = 0; r < n_end - n; ++r) wn[r] = row(n + r);
  switch (n_end - n) {
    case 3:
      RowBlock<3, WT>(wn, x, m_rows, k_dim, n, e, out, ldo, nullptr, rows == nullptr);
      break;
    case 2:
      RowBlock<2, WT>(wn, x, m_rows, k_dim, n, e, out, ldo, nullptr, rows == nullptr);
      break;
    case 1:
      RowBlock<1, WT>(wn, x, m_rows, k_dim, n, e, out, ldo, nullptr, rows == nullptr);
      break;
    default:
      break;
  }
}

void LinearSmallMImpl(const float* x, int64_t m_rows, int64_t k_dim, const void* w, DType w_dtype,
                      const int32_t* rows, int64_t n_begin, int64_t n_end, const LinearEpilogue& e,
                      float* out, int64_t ldo) {
  switch (w_dtype) {
    case DType::kF16:
      return LinearTyped(x, m_rows, k_dim, static_cast<const hwy::float16_t*>(w), rows, n_begin,
                         n_end, e, out, ldo);
    case DType::kBF16:
      return LinearTyped(x, m_rows, k_dim, static_cast<const hwy::bfloat16_t*>(w), rows, n_begin,
                         n_end, e, out, ldo);
    case DType::kI8:
      return LinearTyped(x, m_rows, k_dim, static_cast<const int8_t*>(w), rows, n_begin, n_end, e,
                         out, ldo);
    default:
      return LinearTyped(x, m_rows, k_dim, static_cast<const float*>(w), rows, n_begin, n_end, e,
                         out, ldo);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace deja::kernels::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deja::kernels::cpu {

HWY_EXPORT(LinearSmallMImpl);

void LinearSmallM(const float* x, int64_t m_rows, int64_t k_dim, const void* w, DType w_dtype,
                  int64_t n_begin, int64_t n_end, const LinearEpilogue& epilogue, float* out,
                  int64_t ldo) {
  HWY_DYNAMIC_DISPATCH(LinearSmallMImpl)
  (x, m_rows, k_dim, w, w_dtype, nullptr, n_begin, n_end, epilogue, out, ldo);
}

void GatherLinearSmallM(const float* x, int64_t m_rows, int64_t k_dim, const void* w, DType w_dtype,
                        const int32_t* rows, int64_t n_begin, int64_t n_end,
                        const LinearEpilogue& epilogue, float* out, int64_t ldo) {
  HWY_DYNAMIC_DISPATCH(LinearSmallMImpl)
  (x, m_rows, k_dim, w, w_dtype, rows, n_begin, n_end, epilogue, out, ldo);
}

}  // namespace deja::kernels::cpu
#endif  // HWY_ONCE
