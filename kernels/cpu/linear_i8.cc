// The Linear kernels for kTiled16 int8 weights (weight-only int8, common/quantize.h) on CPUs with
// AVX512-BF16: the int8 tiles widened to bf16, in registers or into a scratch, for the bf16
// micro-kernel's arithmetic (kernels/cpu/linear_bf16.cc).
// GCC 12 reports the intrinsics headers' own _mm512_undefined_* temporaries as uninitialized
// wherever some intrinsics are inlined; the state applies to the header's lines.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/tensor.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/linear_tiled.h"

namespace deja::kernels::cpu {
namespace {

// ---- Tiled int8 weights ----
//
// The same tiles with one byte per weight: a K pair of 16 rows is 32 bytes. Each is widened in
// registers to the 32 bf16 values the bf16 kernel would load (int8 values are exact in bf16:
// sign-extend, convert to f32, pack two f32 registers to bf16), so VDPBF16PS and the blocking
// stay the bf16 kernel's and only the bytes streamed halve. The widening costs 5 instructions
// per tile line against the MB VDPBF16PS that use it, so decode (M <= 16) widens in the loop;
// longer x widens each group of tiles once into a bf16 scratch that the bf16 micro-kernel then
// reads for every block of x (the scale multiplies in the shared epilogue).
DEJA_BF16_TARGET inline __m512bh WidenI8Line(const int8_t* p) {
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(b)));
  const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(b, 1)));
  return _mm512_cvtne2ps_pbh(hi, lo);  // lo's 16 values, then hi's
}

template <int NB, int MB>
DEJA_BF16_TARGET void TiledTileI8(const int8_t* tiles, int64_t tile_stride, const uint32_t* x,
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
    for (int b = 0; b < NB; ++b) w[b] = WidenI8Line(tiles + b * tile_stride + p * 2 * kTileRows);
    for (int m = 0; m < MB; ++m) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[p * MB + m]));
      for (int b = 0; b < NB; ++b) acc[b][m] = _mm512_dpbf16_ps(acc[b][m], w[b], xv);
    }
  }
  StoreTiles<NB, MB>(acc, n0, n_dim, e, out, ldo);
}

// With AVX512-VBMI (Zen 4/5, Sapphire Rapids; not Cooper Lake) the widening is a table lookup:
// bf16(q) is sign(q) | bf16(|q|), and the 128 values bf16(0..127) split into a low-byte and a
// high-byte table that VPERMT2B indexes with |q|; two more VPERMT2B interleave the bytes into the
// words of two tile lines. 6 instructions per 64 weights against 5 per 32 above: the M = 1 kernel
// was bound by the widening (one thread: 17.9 GB/s of int8 against 26.5 GB/s of bf16 streamed by
// the bf16 kernel). |q| <= 127: the loader refuses -128 (common/quantize.h never makes it).
#define DEJA_VBMI_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16,avx512vbmi")))

constexpr uint16_t Bf16OfSmall(int m) {  // bf16 bits of the integer m in [0, 127], exact
  int e = 0;
  while ((2 << e) <= m) ++e;
  return m == 0 ? 0 : static_cast<uint16_t>((127 + e) << 7 | ((m << (7 - e)) & 0x7f));
}

struct alignas(64) I8Tables {
  uint8_t lo[128], hi[128];   // bytes of bf16(m), m in [0, 127]
  uint8_t even[64], odd[64];  // word j of line 0 / 1 = (lo[j], hi[j]) of the 64 weights
};
constexpr I8Tables MakeI8Tables() {
  I8Tables t{};
  for (int m = 0; m < 128; ++m) {
    t.lo[m] = static_cast<uint8_t>(Bf16OfSmall(m) & 0xff);
    t.hi[m] = static_cast<uint8_t>(Bf16OfSmall(m) >> 8);
  }
  for (int j = 0; j < 32; ++j) {
    t.even[2 * j] = static_cast<uint8_t>(j);
    t.even[2 * j + 1] = static_cast<uint8_t>(64 + j);
    t.odd[2 * j] = static_cast<uint8_t>(32 + j);
    t.odd[2 * j + 1] = static_cast<uint8_t>(96 + j);
  }
  return t;
}
constexpr I8Tables kI8Tables = MakeI8Tables();

struct I8Luts {
  __m512i lo0, lo1, hi0, hi1, even, odd, sign;
};

DEJA_VBMI_TARGET inline I8Luts LoadI8Luts() {
  return {_mm512_load_si512(kI8Tables.lo),          _mm512_load_si512(kI8Tables.lo + 64),
          _mm512_load_si512(kI8Tables.hi),          _mm512_load_si512(kI8Tables.hi + 64),
          _mm512_load_si512(kI8Tables.even),        _mm512_load_si512(kI8Tables.odd),
          _mm512_set1_epi8(static_cast<char>(0x80))};
}

// Two consecutive tile lines (64 int8 weights) as the bf16 registers the bf16 kernel loads.
DEJA_VBMI_TARGET inline void WidenI8Pair(const int8_t* p, const I8Luts& t, __m512bh* line0,
                                         __m512bh* line1) {
  const __m512i q = _mm512_loadu_si512(p);
  const __m512i a = _mm512_abs_epi8(q);
  const __m512i lo = _mm512_permutex2var_epi8(t.lo0, a, t.lo1);
  __m512i hi = _mm512_permutex2var_epi8(t.hi0, a, t.hi1);
  hi = _mm512_ternarylogic_epi32(hi, q, t.sign, 0xF8);  // hi | (q & 0x80)
  *line0 = (__m512bh)_mm512_permutex2var_epi8(lo, t.even, hi);
  *line1 = (__m512bh)_mm512_permutex2var_epi8(lo, t.odd, hi);
}

DEJA_VBMI_TARGET inline __m512bh WidenI8LineVbmi(const int8_t* p, const I8Luts& t) {
  const __m512i q = _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  const __m512i a = _mm512_abs_epi8(q);
  const __m512i lo = _mm512_permutex2var_epi8(t.lo0, a, t.lo1);
  __m512i hi = _mm512_permutex2var_epi8(t.hi0, a, t.hi1);
  hi = _mm512_ternarylogic_epi32(hi, q, t.sign, 0xF8);
  return (__m512bh)_mm512_permutex2var_epi8(lo, t.even, hi);
}

// TiledTileI8 two K pairs at a time, widening with the tables.
template <int NB, int MB>
DEJA_VBMI_TARGET void TiledTileI8Vbmi(const int8_t* tiles, int64_t tile_stride, const uint32_t* x,
                                      int64_t pairs, int64_t n0, int64_t n_dim,
                                      const LinearEpilogue& e, float* out, int64_t ldo,
                                      int64_t prefetch) {
  const I8Luts t = LoadI8Luts();
  __m512 acc[NB][MB];
  for (int b = 0; b < NB; ++b)
    for (int m = 0; m < MB; ++m) acc[b][m] = _mm512_setzero_ps();
  int64_t p = 0;
  for (; p + 2 <= pairs; p += 2) {
    if (prefetch != 0) {
      for (int b = 0; b < NB; ++b) {
        _mm_prefetch(
            reinterpret_cast<const char*>(tiles + b * tile_stride + p * 2 * kTileRows + prefetch),
            _MM_HINT_T0);
      }
    }
    __m512bh w0[NB], w1[NB];
    for (int b = 0; b < NB; ++b) {
      WidenI8Pair(tiles + b * tile_stride + p * 2 * kTileRows, t, &w0[b], &w1[b]);
    }
    for (int m = 0; m < MB; ++m) {
      const __m512bh x0 = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[p * MB + m]));
      const __m512bh x1 = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[(p + 1) * MB + m]));
      for (int b = 0; b < NB; ++b) {
        acc[b][m] = _mm512_dpbf16_ps(acc[b][m], w0[b], x0);
        acc[b][m] = _mm512_dpbf16_ps(acc[b][m], w1[b], x1);
      }
    }
  }
  if (p < pairs) {
    __m512bh w[NB];
    for (int b = 0; b < NB; ++b) {
      w[b] = WidenI8LineVbmi(tiles + b * tile_stride + p * 2 * kTileRows, t);
    }
    for (int m = 0; m < MB; ++m) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[p * MB + m]));
      for (int b = 0; b < NB; ++b) acc[b][m] = _mm512_dpbf16_ps(acc[b][m], w[b], xv);
    }
  }
  StoreTiles<NB, MB>(acc, n0, n_dim, e, out, ldo);
}

template <int MB>
DEJA_VBMI_TARGET void TiledRunI8Vbmi(const int8_t* tiles, int64_t tile_stride, int64_t count,
                                     const uint32_t* x, int64_t pairs, int64_t n0, int64_t n_dim,
                                     const LinearEpilogue& e, float* out, int64_t ldo,
                                     int64_t prefetch) {
  ForTileBlocks<NbFor(MB)>(count, [&](auto nb, int64_t t) {
    constexpr int kB = decltype(nb)::value;
    TiledTileI8Vbmi<kB, MB>(tiles + t * tile_stride, tile_stride, x, pairs, n0 + t * kTileRows,
                            n_dim, e, out, ldo, prefetch);
  });
}

DEJA_VBMI_TARGET void WidenI8LinesVbmi(const int8_t* src, int64_t n, uint16_t* dst) {
  const I8Luts t = LoadI8Luts();
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m512bh a, b;
    WidenI8Pair(src + i, t, &a, &b);
    _mm512_storeu_si512(dst + i, (__m512i)a);
    _mm512_storeu_si512(dst + i + 32, (__m512i)b);
  }
  if (i < n) _mm512_storeu_si512(dst + i, (__m512i)WidenI8LineVbmi(src + i, t));
}

bool VbmiAvailable() {
  static const bool yes = [] {
    const char* env = std::getenv("DEJA_CPU_VBMI");
    if (env != nullptr && std::strcmp(env, "0") == 0) return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vbmi") != 0;
  }();
  return yes;
}

template <int MB>
DEJA_BF16_TARGET void TiledRunI8(const int8_t* tiles, int64_t tile_stride, int64_t count,
                                 const uint32_t* x, int64_t pairs, int64_t n0, int64_t n_dim,
                                 const LinearEpilogue& e, float* out, int64_t ldo,
                                 int64_t prefetch) {
  ForTileBlocks<NbFor(MB)>(count, [&](auto nb, int64_t t) {
    constexpr int kB = decltype(nb)::value;
    TiledTileI8<kB, MB>(tiles + t * tile_stride, tile_stride, x, pairs, n0 + t * kTileRows, n_dim,
                        e, out, ldo, prefetch);
  });
}

// n int8 values (a multiple of 32: whole tile lines) widened to bf16 bits.
DEJA_BF16_TARGET void WidenI8Lines(const int8_t* src, int64_t n, uint16_t* dst) {
  for (int64_t i = 0; i < n; i += 32) {
    _mm512_storeu_si512(dst + i, (__m512i)WidenI8Line(src + i));
  }
}

using TiledRunI8Fn = void (*)(const int8_t*, int64_t, int64_t, const uint32_t*, int64_t, int64_t,
                              int64_t, const LinearEpilogue&, float*, int64_t, int64_t);
constexpr TiledRunI8Fn kTiledRunsI8Vbmi[kTiledXBlock + 1] = {nullptr,
                                                             TiledRunI8Vbmi<1>,
                                                             TiledRunI8Vbmi<2>,
                                                             TiledRunI8Vbmi<3>,
                                                             TiledRunI8Vbmi<4>,
                                                             TiledRunI8Vbmi<5>,
                                                             TiledRunI8Vbmi<6>,
                                                             TiledRunI8Vbmi<7>,
                                                             TiledRunI8Vbmi<8>,
                                                             TiledRunI8Vbmi<9>,
                                                             TiledRunI8Vbmi<10>,
                                                             TiledRunI8Vbmi<11>,
                                                             TiledRunI8Vbmi<12>,
                                                             TiledRunI8Vbmi<13>,
                                                             TiledRunI8Vbmi<14>,
                                                             TiledRunI8Vbmi<15>,
                                                             TiledRunI8Vbmi<16>};
constexpr TiledRunI8Fn kTiledRunsI8[kTiledXBlock + 1] = {
    nullptr,        TiledRunI8<1>,  TiledRunI8<2>,  TiledRunI8<3>,  TiledRunI8<4>,  TiledRunI8<5>,
    TiledRunI8<6>,  TiledRunI8<7>,  TiledRunI8<8>,  TiledRunI8<9>,  TiledRunI8<10>, TiledRunI8<11>,
    TiledRunI8<12>, TiledRunI8<13>, TiledRunI8<14>, TiledRunI8<15>, TiledRunI8<16>};

}  // namespace

void LinearI8Tiled(const uint16_t* xp, int64_t m_rows, int64_t k_dim, const int8_t* w,
                   int64_t n_dim, int64_t t_begin, int64_t t_end, const LinearEpilogue& e,
                   float* out, int64_t ldo) {
  const int64_t kp = TiledCols(k_dim), pairs = kp / 2, tile_stride = kp * kTileRows;
  const int64_t group = TiledGroup(m_rows);
  if (m_rows <= kTiledXBlock) {
    // One block of x: each tile line is widened once in registers and used for every row.
    const int64_t prefetch = m_rows <= 8 ? 0 : NbFor(static_cast<int>(m_rows)) == 1 ? 8192 : 1536;
    for (int64_t t = t_begin; t < t_end; t += group) {
      // The tables take 7 registers: from 9 rows of x on the accumulators need them, and the
      // widening is shared by enough rows anyway (M = 16, one thread: 2,561 us without the
      // tables against 3,383 with them; M = 1: 884 against 984).
      (VbmiAvailable() && m_rows <= 8 ? kTiledRunsI8Vbmi : kTiledRunsI8)[m_rows](
          w + t * tile_stride, tile_stride, std::min(group, t_end - t),
          reinterpret_cast<const uint32_t*>(xp), pairs, t * kTileRows, n_dim, e, out, ldo,
          prefetch);
    }
    return;
  }
  // Several blocks of x: the group's tiles widened once into this thread's bf16 scratch (in L2,
  // 64-byte aligned as the micro-kernel's tile loads need), then the bf16 micro-kernel for every
  // block.
  thread_local std::vector<uint16_t> storage;
  storage.resize(static_cast<size_t>(group * tile_stride + 32));
  uint16_t* scratch =
      storage.data() + ((64 - reinterpret_cast<uintptr_t>(storage.data()) % 64) % 64) / 2;
  for (int64_t t = t_begin; t < t_end; t += group) {
    const int64_t count = std::min(group, t_end - t);
    if (VbmiAvailable()) {
      WidenI8LinesVbmi(w + t * tile_stride, count * tile_stride, scratch);
    } else {
      WidenI8Lines(w + t * tile_stride, count * tile_stride, scratch);
    }
    for (int64_t m0 = 0; m0 < m_rows; m0 += kTiledXBlock) {
      const int64_t mb = std::min(kTiledXBlock, m_rows - m0);
      RunTiledBf16(mb, scratch, tile_stride, count, reinterpret_cast<const uint32_t*>(xp + m0 * kp),
                   pairs, t * kTileRows, n_dim, e, out + m0 * ldo, ldo, 0);
    }
  }
}

}  // namespace deja::kernels::cpu
