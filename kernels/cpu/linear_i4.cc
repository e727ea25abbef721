// Linear over int4 weights (common/int4.h) on the CPU. Each row of x is quantized to int8,
// symmetric (scale max |x| / 127, q = x * (127 / max |x|) rounded to nearest even, no zero point),
// with the sum of its q over each group of the weights. On CPUs with AVX512-VNNI the kernel loads
// one 64-byte line of a tile (two K quads of 16 rows), splits it into its low and high nibbles
// (the weights + 8, unsigned: VPDPBUSD's unsigned operand) and multiplies each with the
// broadcast quad of x (signed). The + 8 comes out as 8 * (the group's sum of q), subtracted from
// each group's exact int32 sum before it is converted and multiplied by the group's 16 scales
// into f32 accumulators. Elsewhere the portable loop does the same arithmetic: the same exact
// integer sums, then the f32 steps in the same order.
//
// Micro-kernel: NB tiles x MB rows of x, an int32 and an f32 accumulator each (4 x 2 or 2 x 4),
// the tiles' nibbles unpacked once per line for all MB rows; blocks of 4 rows of x over each
// group of tiles, which stays in L2 between the blocks (the next group fetched meanwhile).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/int4.h"
#include "common/thread_pool.h"
#include "kernels/cpu/amx.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/i8_vnni.h"
#include "kernels/cpu/linear_tiled.h"

namespace deja::kernels::cpu {
namespace {

#define DEJA_I4_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx512vnni")))

constexpr int64_t kRowBlock = 4;

// acc + the 4 products of u8 a and s8 b per lane (written out, as in linear_i8_vnni.cc, so GCC
// keeps the accumulators in registers).
DEJA_I4_TARGET inline __m512i Dpbusd(__m512i acc, __m512i a, __m512i b) {
  __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}

struct I4Args {
  const uint8_t* w;     // the first tile of the call
  int64_t tile_bytes;   // 16 * K / 2
  const float* scales;  // the first tile's scales, [groups][16] per tile
  int64_t groups;
  int64_t lines;    // per group: group / 8
  const int8_t* x;  // the first row of the block, K apart
  int64_t k_dim;
  const float* sx;      // the block's x scales
  const int32_t* sums;  // the block's group sums of q, `groups` apart
  int64_t n0, n_dim;
  LinearEpilogue e;  // scale unset: the group scales are applied here
  float* out;        // the block's first row
  int64_t ldo;
  // Ask for the line this many bytes on from each line read (0: none): kDecodePrefetchBytes for
  // the first block of rows over a group of tiles, the next group's line for the second.
  int64_t prefetch_ahead;
  // Ask for the next tiles' scales (the first block of rows).
  bool prefetch_scales;
};

template <int NB, int MB>
DEJA_I4_TARGET void I4Tiles(const I4Args& a) {
  const __m512i low = _mm512_set1_epi8(0x0f);
  __m512 f[NB][MB];
  for (int b = 0; b < NB; ++b)
    for (int m = 0; m < MB; ++m) f[b][m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < a.groups; ++g) {
    __m512i acc[NB][MB];
    for (int b = 0; b < NB; ++b)
      for (int m = 0; m < MB; ++m) acc[b][m] = _mm512_setzero_si512();
    for (int64_t j = g * a.lines; j < (g + 1) * a.lines; ++j) {
      __m512i lo[NB], hi[NB];
      for (int b = 0; b < NB; ++b) {
        const uint8_t* line = a.w + b * a.tile_bytes + j * 64;
        if (a.prefetch_ahead != 0) {
          _mm_prefetch(reinterpret_cast<const char*>(line) + a.prefetch_ahead, _MM_HINT_T0);
        }
        const __m512i v = _mm512_loadu_si512(line);
        lo[b] = _mm512_and_si512(v, low);
        hi[b] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      }
      for (int m = 0; m < MB; ++m) {
        int32_t q0, q1;
        std::memcpy(&q0, a.x + m * a.k_dim + j * 8, 4);
        std::memcpy(&q1, a.x + m * a.k_dim + j * 8 + 4, 4);
        const __m512i x0 = _mm512_set1_epi32(q0), x1 = _mm512_set1_epi32(q1);
        for (int b = 0; b < NB; ++b) {
          acc[b][m] = Dpbusd(acc[b][m], lo[b], x0);
          acc[b][m] = Dpbusd(acc[b][m], hi[b], x1);
        }
      }
    }
    for (int b = 0; b < NB; ++b) {
      // The next block's scales, a block ahead: their own stream, which the hardware misses.
      if (a.prefetch_scales) {
        _mm_prefetch(
            reinterpret_cast<const char*>(a.scales + ((b + NB) * a.groups + g) * kTileRows),
            _MM_HINT_T0);
      }
      const __m512 s = _mm512_loadu_ps(a.scales + (b * a.groups + g) * kTileRows);
      for (int m = 0; m < MB; ++m) {
        const __m512i dot =
            _mm512_sub_epi32(acc[b][m], _mm512_set1_epi32(8 * a.sums[m * a.groups + g]));
        f[b][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), s, f[b][m]);
      }
    }
  }
  for (int m = 0; m < MB; ++m) {
    const __m512 s = _mm512_set1_ps(a.sx[m]);
    for (int b = 0; b < NB; ++b) f[b][m] = _mm512_mul_ps(f[b][m], s);
  }
  StoreTiles<NB, MB>(f, a.n0, a.n_dim, a.e, a.out, a.ldo);
}

// Tiles [t_begin, t_end) against rows [0, M) of quantized x, on AVX512-VNNI, in groups of
// tiles of about kI4GroupBytes: each block of rows over the group in turn, so the group comes from
// memory once and from L2 for the rest, while each block's rows of x stay in L1. The second block
// asks for the next group, so the memory works while the blocks compute; every first block still
// asks ahead of itself (the first group's must, one row block has no second, and a line already
// in L2 costs the ask little). Each output's sums run in the same order whatever the
// blocks, so the results do not depend on M.
constexpr int64_t kI4GroupBytes = 256 << 10;
DEJA_I4_TARGET void I4TilesAvx512(const I4Args& a, int64_t m_rows, int64_t t_begin,
                                  int64_t t_end) {
  const int64_t group = std::max<int64_t>(2, kI4GroupBytes / a.tile_bytes / 2 * 2);
  for (int64_t g0 = t_begin; g0 < t_end; g0 += group) {
    const int64_t g1 = std::min(t_end, g0 + group);
    for (int64_t m0 = 0; m0 < m_rows; m0 += kRowBlock) {
      const int64_t mb = std::min(kRowBlock, m_rows - m0);
      I4Args b = a;
      b.x = a.x + m0 * a.k_dim;
      b.sx = a.sx + m0;
      b.sums = a.sums + m0 * a.groups;
      b.out = a.out + m0 * a.ldo;
      // The first block reads the group from memory, asking ahead of itself; the second, from L2,
      // asks for the next group, so the next first block finds it in L2 too.
      b.prefetch_ahead = m0 == 0                          ? kDecodePrefetchBytes
                         : m0 == kRowBlock && g1 < t_end ? group * a.tile_bytes
                                                          : 0;
      b.prefetch_scales = m0 == 0;
      auto run = [&](auto nb_const, int64_t t) {
        constexpr int NB = decltype(nb_const)::value;
        I4Args c = b;
        c.w = a.w + (g0 + t) * a.tile_bytes;
        c.scales = a.scales + (g0 + t) * a.groups * kTileRows;
        c.n0 = (g0 + t) * kTileRows;
        switch (mb) {
          case 1:
            return I4Tiles<NB, 1>(c);
          case 2:
            return I4Tiles<NB, 2>(c);
          case 3:
            return I4Tiles<(NB > 2 ? 2 : NB), 3>(c);
          default:
            return I4Tiles<(NB > 2 ? 2 : NB), 4>(c);
        }
      };
      // Rows 3 and 4 of a block hold 2 tiles at a time (registers), so they take pairs.
      if (mb <= 2) {
        ForTileBlocks<4>(g1 - g0, run);
      } else {
        ForTileBlocks<2>(g1 - g0, run);
      }
    }
  }
}

// The same arithmetic without AVX512-VNNI, element by element.
void I4TilesPortable(const I4Args& a, int64_t m_rows, int64_t t_begin, int64_t t_end) {
  const int64_t group = a.lines * 8;
  for (int64_t n = t_begin * kTileRows; n < std::min(a.n_dim, t_end * kTileRows); ++n) {
    const int64_t t = n / kTileRows - t_begin, r = n % kTileRows;
    const uint8_t* tile = a.w + (t_begin + t) * a.tile_bytes;
    for (int64_t m = 0; m < m_rows; ++m) {
      const int8_t* xm = a.x + m * a.k_dim;
      float f = 0.f;
      for (int64_t g = 0; g < a.groups; ++g) {
        int32_t dot = 0;
        for (int64_t k = g * group; k < (g + 1) * group; ++k) {
          dot += Int4Value(tile, r, k, a.k_dim) * xm[k];
        }
        f = std::fma(static_cast<float>(dot), a.scales[Int4ScaleIndex(n, g, a.groups)], f);
      }
      float v = f * a.sx[m] + (a.e.bias != nullptr ? a.e.bias[n] : 0.f);
      if (a.e.relu) v = std::max(v, 0.f);
      float* o = a.out + m * a.ldo + n;
      if (a.e.accumulate) v += *o;
      *o = v;
    }
  }
}

// QuantizeRowS8 below with AVX-512, bit for bit: the same max (a NaN skipped, as std::max
// skips it), the same product rounded to nearest even, the same integer sums.
DEJA_I4_TARGET float QuantizeRowS8Avx512(const float* x, int64_t k_dim, int64_t group, int8_t* q,
                                         int32_t* sums) {
  __m512 amax = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= k_dim; i += 16)
    amax = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + i)), amax);
  const __mmask16 tail = static_cast<__mmask16>((1u << (k_dim - i)) - 1);
  amax = _mm512_max_ps(_mm512_abs_ps(_mm512_maskz_loadu_ps(tail, x + i)), amax);
  const float a = _mm512_reduce_max_ps(amax);
  const __m512 inv = _mm512_set1_ps(a > 0.f ? 127.f / a : 0.f);
  for (int64_t g = 0; g < k_dim / group; ++g) {
    __m512i s = _mm512_setzero_si512();
    for (int64_t k = g * group; k < (g + 1) * group; k += 16) {
      const int64_t n = std::min<int64_t>(16, (g + 1) * group - k);
      const __mmask16 m = static_cast<__mmask16>((1u << n) - 1);
      const __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + k), inv));
      _mm_mask_storeu_epi8(q + k, m, _mm512_cvtepi32_epi8(r));
      s = _mm512_add_epi32(s, _mm512_maskz_mov_epi32(m, r));
    }
    sums[g] = _mm512_reduce_add_epi32(s);
  }
  return a / 127.f;
}

}  // namespace

float QuantizeRowS8(const float* x, int64_t k_dim, int64_t group, int8_t* q, int32_t* sums) {
  if (VnniEnabled()) return QuantizeRowS8Avx512(x, k_dim, group, q, sums);
  float amax = 0.f;
  for (int64_t k = 0; k < k_dim; ++k) amax = std::max(amax, std::fabs(x[k]));
  const float inv = amax > 0.f ? 127.f / amax : 0.f;
  for (int64_t g = 0; g < k_dim / group; ++g) {
    int32_t s = 0;
    for (int64_t k = g * group; k < (g + 1) * group; ++k) {
      q[k] = static_cast<int8_t>(std::nearbyint(x[k] * inv));
      s += q[k];
    }
    sums[g] = s;
  }
  return amax / 127.f;
}

Status LinearI4(ThreadPool* pool, const TensorView& x, const TensorView& w,
                const LinearEpilogue& epilogue, float* out) {
  const int64_t m_rows = x.rows(), k_dim = x.cols(), n_dim = w.rows();
  const int64_t group = w.scale_group, groups = k_dim / group;
  thread_local std::vector<int8_t> q_storage;  // this thread's: the pool gets pointers
  thread_local std::vector<float> scale_storage;
  thread_local std::vector<int32_t> sum_storage;
  // Bit-identical results either way (amx.h): the tiles from kAmxI4MinRows rows.
  const bool amx = AmxEnabled() && m_rows >= kAmxI4MinRows && AmxI4Group(group);
  q_storage.resize(static_cast<size_t>((amx ? AmxPaddedRows(m_rows) : m_rows) * k_dim));
  scale_storage.resize(static_cast<size_t>(m_rows));
  sum_storage.resize(static_cast<size_t>(m_rows * groups));
  int8_t* q = q_storage.data();
  float* sx = scale_storage.data();
  int32_t* sums = sum_storage.data();
  pool->ParallelFor(m_rows, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      sx[m] =
          QuantizeRowS8(x.as<float>() + m * k_dim, k_dim, group, q + m * k_dim, sums + m * groups);
    }
  });
  I4Args a{static_cast<const uint8_t*>(w.data),
           kTileRows * k_dim / 2,
           w.scale,
           groups,
           group / 8,
           q,
           k_dim,
           sx,
           sums,
           0,
           n_dim,
           epilogue,
           out,
           n_dim,
           kDecodePrefetchBytes,
           true};
  a.e.scale = nullptr;
  const int64_t tiles = (n_dim + kTileRows - 1) / kTileRows;
  // At least ~64K multiply-adds per chunk, as the other Linear paths.
  const int64_t min_chunk = std::max<int64_t>(1, (int64_t{1} << 16) / (kTileRows * k_dim * m_rows));
  if (amx) {
    const int64_t pairs = (tiles + 1) / 2;
    pool->ParallelFor(
        pairs,
        [&](int64_t p0, int64_t p1) {
          LinearI4Amx(q, sx, sums, m_rows, k_dim, a.w, w.scale, group, n_dim, 2 * p0,
                      std::min(tiles, 2 * p1), a.e, out, n_dim);
        },
        std::max<int64_t>(1, min_chunk / 2));
    return Status::Ok();
  }
  const bool simd = VnniEnabled();
  pool->ParallelFor(
      tiles,
      [&](int64_t t0, int64_t t1) {
        if (simd) return I4TilesAvx512(a, m_rows, t0, t1);
        I4TilesPortable(a, m_rows, t0, t1);
      },
      min_chunk);
  return Status::Ok();
}

}  // namespace deja::kernels::cpu
