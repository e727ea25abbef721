// The decode-time Linear kernel for bf16 weights on CPUs with AVX512-BF16: x is rounded to bf16
// once per call and VDPBF16PS multiplies 32 bf16 pairs per instruction into 16 f32 lanes, twice
// the products of an f32 FMA (measured on the dev box, Zen 5, one core: 433 vs 230 GFLOP/s in a
// register-only loop). bf16 x bf16 products are exact in f32, so only the additions round, as
// with cuBLAS's bf16 GEMM that the CUDA backend uses for the same weights.
//
// The blocking of kernels/cpu/linear_small_m.cc: R weight rows against up to C rows of x,
// R * C accumulators in registers (4 x 6, or 6 x 4 from kWideFromM rows of x on), each weight
// block streamed from memory once and walked again (from cache) for further rows of x, each walk
// prefetching its share of the next block. A step covers 32 weights = one cache line per row. Tails
// along K use masked loads, so no scalar loop and no read past a row.
//
// Highway 1.0.3 (Debian 12) has no AVX512-BF16 target, so this file uses the intrinsics under a
// function-level target attribute and is called only after a run-time CPU check.
// GCC 12 reports the intrinsics headers' own _mm512_undefined_* temporaries as uninitialized
// wherever _mm512_reduce_add_ps is inlined; the state applies to the header's lines.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "common/tensor.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/linear_tiled.h"

namespace deja::kernels::cpu {
namespace {

// From this many rows of x on, blocks of 6 weight rows x 4 rows of x; below, 4 x 6. Measured
// (bf16, 8192 x 2048 and 2048 x 8192, two threads, both blockings alternating in one process, best
// of 15 x 12 calls): M = 8 982 / 943 us against 1015 / 1125 for 4 x 6, M = 12 1130 / 1020 against
// 1257 / 1197, M = 16 1179 / 1197 against 1310 / 1318, M = 32 2400 / 2253 against 2823 / 2392;
// M = 1 636 / 677 against 555 / 616 and M = 4 mixed. 8 x 3 was between the two at M = 16, 2 x 8
// 40% slower.
constexpr int64_t kWideFromM = 8;
constexpr int64_t kStep = 32;  // bf16 per 512-bit register

float Finish(float dot, int64_t n, const LinearEpilogue& e, const float* prev) {
  float v = (e.scale != nullptr ? dot * e.scale[n] : dot) + (e.bias != nullptr ? e.bias[n] : 0.f);
  if (e.relu) v = v > 0.f ? v : 0.f;
  return e.accumulate ? v + *prev : v;
}

template <int R, int C>
DEJA_BF16_TARGET void Tile(const uint16_t* const* w, const uint16_t* x, int64_t k_dim, int64_t n,
                           const LinearEpilogue& e, float* out, int64_t ldo,
                           const uint16_t* const* prefetch, bool contiguous, int64_t pf_phase,
                           int64_t pf_walks) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  // The modulo compiles to an integer division per step (perf annotate: ~9% of the M = 16
  // kernel's samples right after it), yet replacing it with a counter (as the f16 kernel does)
  // made the 1.3B batch-16 step slower: 120.2 / 121.1 ms against 108.3 / 106.6 (binaries
  // alternating), while the kernel alone measured the same either way (8192 x 2048, M = 16, in
  // one process: best 1002 against 1003 us). Not understood; kept as measured.
  int64_t k = 0, step = 0;
  for (; k + kStep <= k_dim; k += kStep, ++step) {
    if (prefetch != nullptr && step % pf_walks == pf_phase) {
      if (contiguous) {
        // The next block is R * k_dim consecutive weights: one sequential stream, R lines per
        // step (this walk's share of the steps).
        const char* pf = reinterpret_cast<const char*>(prefetch[0]) + k * R * 2;
        for (int line = 0; line < R; ++line) _mm_prefetch(pf + line * 64, _MM_HINT_T0);
      } else {
        for (int r = 0; r < R; ++r) {
          _mm_prefetch(reinterpret_cast<const char*>(prefetch[r] + k), _MM_HINT_T0);
        }
      }
    }
    __m512bh wv[R];
    for (int r = 0; r < R; ++r) wv[r] = (__m512bh)_mm512_loadu_si512(w[r] + k);
    for (int c = 0; c < C; ++c) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + c * k_dim + k);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], wv[r], xv);
    }
  }
  if (k < k_dim) {
    const __mmask32 mask = static_cast<__mmask32>((uint64_t{1} << (k_dim - k)) - 1);
    __m512bh wv[R];
    for (int r = 0; r < R; ++r) wv[r] = (__m512bh)_mm512_maskz_loadu_epi16(mask, w[r] + k);
    for (int c = 0; c < C; ++c) {
      const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + c * k_dim + k);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], wv[r], xv);
    }
  }
  for (int c = 0; c < C; ++c) {
    for (int r = 0; r < R; ++r) {
      float* o = out + c * ldo + n + r;
      *o = Finish(_mm512_reduce_add_ps(acc[r][c]), n + r, e, o);
    }
  }
}

// All rows of x against R weight rows; the walks share the prefetch of the next block.
template <int R, int CC>
DEJA_BF16_TARGET void RowBlock(const uint16_t* const* w, const uint16_t* x, int64_t m_rows,
                               int64_t k_dim, int64_t n, const LinearEpilogue& e, float* out,
                               int64_t ldo, const uint16_t* const* next, bool contiguous) {
  const int64_t walks = (m_rows + CC - 1) / CC;
  int64_t m = 0, walk = 0;
  for (; m + CC <= m_rows; m += CC, ++walk) {
    Tile<R, CC>(w, x + m * k_dim, k_dim, n, e, out + m * ldo, ldo, next, contiguous, walk, walks);
  }
  const uint16_t* xm = x + m * k_dim;
  float* om = out + m * ldo;
  switch (m_rows - m) {
    case 5:
      return Tile<R, 5>(w, xm, k_dim, n, e, om, ldo, next, contiguous, walk, walks);
    case 4:
      return Tile<R, 4>(w, xm, k_dim, n, e, om, ldo, next, contiguous, walk, walks);
    case 3:
      return Tile<R, 3>(w, xm, k_dim, n, e, om, ldo, next, contiguous, walk, walks);
    case 2:
      return Tile<R, 2>(w, xm, k_dim, n, e, om, ldo, next, contiguous, walk, walks);
    case 1:
      return Tile<R, 1>(w, xm, k_dim, n, e, om, ldo, next, contiguous, walk, walks);
    default:
      return;
  }
}

// ---- Tiled weights (Layout::kTiled16) ----
//
// The GEMM micro-kernel shape: a register holds one K pair of 16 weight rows (a 64-byte line of
// a tile), a 32-bit broadcast holds the same K pair of one row of x, and VDPBF16PS adds the pair's
// two products into 16 output columns at once. NB tiles x MB rows of x = NB * MB accumulators,
// no horizontal sums, and each tile is one sequential stream. x comes packed in blocks of
// kTiledXBlock (16) rows, [K/2][rows][2] within a block, so the MB broadcasts of one step read
// one line. Measured against the row-major kernel above (bf16, two threads, 256 MiB of weights
// cycled so they stream from DRAM; standalone harness, best of 5): M = 1 8192 x 2048 578 against
// 686 us, M = 4 645 against 732; from L2 (384 x 1024, M = 16) 926 against 590 GFLOP/s.
// M = 16 (batch 16's decode steps): 3 tiles x 8 rows in two passes over each group of tiles
// (blocks of 8 rows, the second pass from L2) stayed near 35 GB/s and 550 GFLOP/s from DRAM, the
// sum of its memory and compute times: DRAM sat idle during the second pass. One tile x 16 rows
// in one pass, prefetching 16 KiB ahead in the tile, overlaps the two (standalone, variants
// alternating in one process, best of 9, 8192 x 2048): 662-693 us against 898-944 for 3 x 8 and
// 662 us for an M = 1 pass, i.e. at the memory's speed; in a slower state of this host's
// memory 1711-1762 against 2177-2230 us. Without the far prefetch 1 x 16 was slower than 3 x 8
// (1066-1200 us): the hardware prefetcher alone keeps too few of the stream's lines in flight.
// Also tried without gain: 4 x 4 and 2 x 8 blockings, the group's tiles interleaved into one
// stream, K-chunked passes over both blocks of x (accumulators spilled), prefetching the next
// group.

template <int NB, int MB>
DEJA_BF16_TARGET void TiledTile(const uint16_t* tiles, int64_t tile_stride, const uint32_t* x,
                                int64_t pairs, int64_t n0, int64_t n_dim, const LinearEpilogue& e,
                                float* out, int64_t ldo, int64_t prefetch) {
  __m512 acc[NB][MB];
  for (int b = 0; b < NB; ++b)
    for (int m = 0; m < MB; ++m) acc[b][m] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    if (prefetch != 0) {
      for (int b = 0; b < NB; ++b) {
        _mm_prefetch(
            reinterpret_cast<const char*>(tiles + b * tile_stride + p * 2 * kTileRows + prefetch),
            _MM_HINT_T0);
      }
    }
    __m512bh w[NB];
    for (int b = 0; b < NB; ++b) {
      w[b] = (__m512bh)_mm512_load_si512(tiles + b * tile_stride + p * 2 * kTileRows);
    }
    for (int m = 0; m < MB; ++m) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[p * MB + m]));
      for (int b = 0; b < NB; ++b) acc[b][m] = _mm512_dpbf16_ps(acc[b][m], w[b], xv);
    }
  }
  StoreTiles<NB, MB>(acc, n0, n_dim, e, out, ldo);
}

// `count` tiles from `tiles` against one block of MB rows of x: groups of NbFor(MB), then the
// rest in blocks of 4, 2 and 1 (a 1-tile block has a third of the 3 x 8 block's accumulators to
// hide VDPBF16PS latency with: `perf` put 1% of a batch-16 step in the singles).
template <int MB>
DEJA_BF16_TARGET void TiledRun(const uint16_t* tiles, int64_t tile_stride, int64_t count,
                               const uint32_t* x, int64_t pairs, int64_t n0, int64_t n_dim,
                               const LinearEpilogue& e, float* out, int64_t ldo, int64_t prefetch) {
  ForTileBlocks<NbFor(MB)>(count, [&](auto nb, int64_t t) {
    constexpr int kB = decltype(nb)::value;
    TiledTile<kB, MB>(tiles + t * tile_stride, tile_stride, x, pairs, n0 + t * kTileRows, n_dim, e,
                      out, ldo, prefetch);
  });
}

// 16 floats rounded to bf16 (nearest even, NaNs kept quiet), as FloatToBF16; VCVTNEPS2BF16
// would flush subnormals.
DEJA_BF16_TARGET inline __m256i Round16(const float* x) {
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  const __m512i inf = _mm512_set1_epi32(0x7f800000);
  const __m512i bias = _mm512_set1_epi32(0x7fff);
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i quiet = _mm512_set1_epi32(0x40);
  const __m512i u = _mm512_loadu_si512(x);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(bias, lsb)), 16);
  r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), quiet);
  return _mm512_cvtepi32_epi16(r);
}

DEJA_BF16_TARGET void RoundAvx512(const float* x, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), Round16(x + i));
  }
  for (; i < n; ++i) out[i] = FloatToBF16(x[i]);
}

// RoundPackBf16Pairs for 8 rows of a block: 8 K pairs of each row rounded into one register (a
// pair is one 32-bit word), then an 8 x 8 transpose of words so each pair's 8 rows are 32
// contiguous bytes, at block + pair * stride. Returns the pairs done (the caller packs the rest).
DEJA_BF16_TARGET int64_t RoundPackRows8(const float* x, int64_t k_dim, int64_t stride,
                                        uint32_t* block) {
  const int64_t pairs = k_dim / 2;
  int64_t p0 = 0;
  for (; p0 + 8 <= pairs; p0 += 8) {
    __m256i r[8];
    for (int i = 0; i < 8; ++i) r[i] = Round16(x + i * k_dim + 2 * p0);
    __m256i t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
      t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
      t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
      u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
      u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
      u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
      u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int j = 0; j < 4; ++j) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(block + (p0 + j) * stride),
                          _mm256_permute2x128_si256(u[j], u[j + 4], 0x20));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(block + (p0 + j + 4) * stride),
                          _mm256_permute2x128_si256(u[j], u[j + 4], 0x31));
    }
  }
  return p0;
}

DEJA_BF16_TARGET double Bf16DotLoopImpl(int64_t iters, float seed) {
  constexpr int kChains = 16;  // latency x pipes of current cores, with room to spare
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(seed + i);
  __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80);        // 1.0
  const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3380);  // 2^-24: the sums stay finite
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
    __asm__ volatile("" : "+v"(a));  // keeps the loop from being folded
  }
  __m512 s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s) * 0.0 + 4.0 * 16.0 * kChains * static_cast<double>(iters);
}

bool Detect() {
  const char* env = std::getenv("DEJA_CPU_BF16_DOT");
  if (env != nullptr && std::strcmp(env, "0") == 0) return false;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512bf16");
}

bool& Enabled() {
  static bool enabled = Detect();
  return enabled;
}

}  // namespace

bool Bf16DotAvailable() {
  static const bool supported = Detect();
  return supported;
}

bool Bf16DotEnabled() { return Enabled(); }

void SetBf16DotEnabled(bool on) { Enabled() = on && Bf16DotAvailable(); }

double Bf16DotLoop(int64_t iters, float seed) { return Bf16DotLoopImpl(iters, seed); }

void RoundToBF16(const float* x, int64_t n, uint16_t* out) {
  if (Bf16DotAvailable()) return RoundAvx512(x, n, out);
  for (int64_t i = 0; i < n; ++i) out[i] = FloatToBF16(x[i]);
}

// KR weight rows per block against KC rows of x per walk. Remainder rows of the range go in
// blocks of 4, then 3, 2 or 1.
template <int KR, int KC>
void LinearBf16DotT(const uint16_t* x, int64_t m_rows, int64_t k_dim, const uint16_t* w,
                    const int32_t* rows, int64_t n_begin, int64_t n_end, const LinearEpilogue& e,
                    float* out, int64_t ldo) {
  auto row = [&](int64_t n) { return w + (rows != nullptr ? rows[n] : n) * k_dim; };
  const uint16_t* wn[KR];
  const uint16_t* next[KR];
  int64_t n = n_begin;
  for (; n + KR <= n_end; n += KR) {
    const bool has_next = n + 2 * KR <= n_end;
    for (int r = 0; r < KR; ++r) {
      wn[r] = row(n + r);
      if (has_next) next[r] = row(n + KR + r);
    }
    RowBlock<KR, KC>(wn, x, m_rows, k_dim, n, e, out, ldo, has_next ? next : nullptr,
                     rows == nullptr);
  }
  while (n < n_end) {
    const int64_t left = n_end - n;
    for (int64_t r = 0; r < std::min<int64_t>(left, 4); ++r) wn[r] = row(n + r);
    const bool contiguous = rows == nullptr;
    if (left >= 4) {
      RowBlock<4, KC>(wn, x, m_rows, k_dim, n, e, out, ldo, nullptr, contiguous);
      n += 4;
      continue;
    }
    if (left == 3) RowBlock<3, KC>(wn, x, m_rows, k_dim, n, e, out, ldo, nullptr, contiguous);
    if (left == 2) RowBlock<2, KC>(wn, x, m_rows, k_dim, n, e, out, ldo, nullptr, contiguous);
    if (left == 1) RowBlock<1, KC>(wn, x, m_rows, k_dim, n, e, out, ldo, nullptr, contiguous);
    n = n_end;
  }
}

void LinearBf16Dot(const uint16_t* x, int64_t m_rows, int64_t k_dim, const uint16_t* w,
                   const int32_t* rows, int64_t n_begin, int64_t n_end, const LinearEpilogue& e,
                   float* out, int64_t ldo) {
  // Both blockings give bit-identical outputs (each accumulator sums its K steps in order).
  if (m_rows >= kWideFromM) {
    return LinearBf16DotT<6, 4>(x, m_rows, k_dim, w, rows, n_begin, n_end, e, out, ldo);
  }
  LinearBf16DotT<4, 6>(x, m_rows, k_dim, w, rows, n_begin, n_end, e, out, ldo);
}

namespace {

using TiledRunFn = void (*)(const uint16_t*, int64_t, int64_t, const uint32_t*, int64_t, int64_t,
                            int64_t, const LinearEpilogue&, float*, int64_t, int64_t);
constexpr TiledRunFn kTiledRuns[kTiledXBlock + 1] = {
    nullptr,      TiledRun<1>,  TiledRun<2>,  TiledRun<3>,  TiledRun<4>,  TiledRun<5>,
    TiledRun<6>,  TiledRun<7>,  TiledRun<8>,  TiledRun<9>,  TiledRun<10>, TiledRun<11>,
    TiledRun<12>, TiledRun<13>, TiledRun<14>, TiledRun<15>, TiledRun<16>};

}  // namespace

void RunTiledBf16(int64_t mb, const uint16_t* tiles, int64_t tile_stride, int64_t count,
                  const uint32_t* x, int64_t pairs, int64_t n0, int64_t n_dim,
                  const LinearEpilogue& e, float* out, int64_t ldo, int64_t prefetch) {
  kTiledRuns[mb](tiles, tile_stride, count, x, pairs, n0, n_dim, e, out, ldo, prefetch);
}

void PackBf16Pairs(const uint16_t* x, int64_t m_rows, int64_t k_dim, uint16_t* out) {
  // A K pair of one row is one 32-bit word: the packing is a transpose of words per block.
  const int64_t kp = TiledCols(k_dim), full = k_dim / 2;
  for (int64_t m0 = 0; m0 < m_rows; m0 += kTiledXBlock) {
    const int64_t mb = std::min(kTiledXBlock, m_rows - m0);
    uint16_t* block = out + m0 * kp;
    for (int64_t m = 0; m < mb; ++m) {
      const uint16_t* row = x + (m0 + m) * k_dim;
      for (int64_t p = 0; p < full; ++p) std::memcpy(block + (p * mb + m) * 2, row + 2 * p, 4);
      if (kp != k_dim) {  // odd K: the last pair is (x, 0)
        block[(full * mb + m) * 2] = row[k_dim - 1];
        block[(full * mb + m) * 2 + 1] = 0;
      }
    }
  }
}

void RoundPackBf16Pairs(const float* x, int64_t m_rows, int64_t k_dim, uint16_t* out) {
  const int64_t kp = TiledCols(k_dim), pairs = kp / 2;
  for (int64_t m0 = 0; m0 < m_rows; m0 += kTiledXBlock) {
    const int64_t mb = std::min(kTiledXBlock, m_rows - m0);
    const float* xb = x + m0 * k_dim;
    uint32_t* block = reinterpret_cast<uint32_t*>(out + m0 * kp);
    int64_t done = 0;
    if (mb % 8 == 0 && Bf16DotAvailable()) {
      for (int64_t r = 0; r < mb; r += 8)
        done = RoundPackRows8(xb + r * k_dim, k_dim, mb, block + r);
    }
    for (int64_t p = done; p < pairs; ++p) {
      for (int64_t m = 0; m < mb; ++m) {
        const float* row = xb + m * k_dim;
        const uint32_t lo = FloatToBF16(row[2 * p]);
        const uint32_t hi = 2 * p + 1 < k_dim ? FloatToBF16(row[2 * p + 1]) : 0;
        block[p * mb + m] = lo | (hi << 16);
      }
    }
  }
}

int64_t TiledGroup(int64_t m_rows) {
  return NbFor(static_cast<int>(std::min(m_rows, kTiledXBlock)));
}

void LinearBf16Tiled(const uint16_t* xp, int64_t m_rows, int64_t k_dim, const uint16_t* w,
                     int64_t n_dim, int64_t t_begin, int64_t t_end, const LinearEpilogue& e,
                     float* out, int64_t ldo) {
  const int64_t kp = TiledCols(k_dim), pairs = kp / 2, tile_stride = kp * kTileRows;
  const int64_t group = TiledGroup(m_rows);
  // Per group of tiles every block of x, so the group's tiles serve the later blocks from L2;
  // the first block's pass streams them from DRAM and prefetches ahead in each tile: its
  // VDPBF16PS work fills the out-of-order window before enough lines are in flight. A pass with
  // one tile (13-16 rows) runs 16 KiB ahead, one with two tiles (9-12 rows) 48 K pairs, a pass
  // with up to 8 rows none (at M = 1 any prefetch was 10-20% slower).
  constexpr int64_t kFarPrefetch = 8192;                 // elements: 16 KiB of a tile ahead
  constexpr int64_t kNearPrefetch = 48 * 2 * kTileRows;  // 48 K pairs of a tile ahead
  const int64_t first = std::min(kTiledXBlock, m_rows);
  const int64_t prefetch = first <= 8                            ? 0
                           : NbFor(static_cast<int>(first)) == 1 ? kFarPrefetch
                                                                 : kNearPrefetch;
  for (int64_t t = t_begin; t < t_end; t += group) {
    const int64_t count = std::min(group, t_end - t);
    for (int64_t m0 = 0; m0 < m_rows; m0 += kTiledXBlock) {
      const int64_t mb = std::min(kTiledXBlock, m_rows - m0);
      kTiledRuns[mb](w + t * tile_stride, tile_stride, count,
                     reinterpret_cast<const uint32_t*>(xp + m0 * kp), pairs, t * kTileRows, n_dim,
                     e, out + m0 * ldo, ldo, m0 == 0 ? prefetch : 0);
    }
  }
}

}  // namespace deja::kernels::cpu
