// Linear over kTiled16 int8 weights against x quantized to int8 per row, on CPUs with
// AVX512-VNNI (kernels/cpu/i8_vnni.h): the prefill path of weight-only int8.
//
// VPDPBUSD multiplies 4 consecutive u8 x s8 pairs per 32-bit lane and adds them into the lane, so
// a register of weights must hold 4 consecutive K of each of 16 weight rows; the tiles hold K
// pairs (16 rows x 2, one 32-byte half line each). Each group of kVnniTileGroup tiles is repacked
// into this thread's scratch as K quads, [K/4][tile][16 rows x 4] (one VPERMW per 64 bytes, the
// group's tiles interleaved so the micro-kernel reads one sequential stream), once per call and
// used for every row of x: at prefill sizes the repack is a small fraction of the products.
// x is VPDPBUSD's unsigned operand: a row with negative values goes in as q + 128 (zero point 128,
// q in [-127, 127]); a row without (ReLU's output, fc2's input) as q in [0, 255] with zero point 0,
// twice the resolution. Each accumulator starts at -zero * (sum of its weight row), the sums
// counted while repacking with one more VPDPBUSD against ones. |w| <= 127 and x <= 255, so the
// int32 sums are exact for K < 66,000.
//
// The micro-kernel: NB tiles x MB rows of x in registers (4 x 6 = 24 int32 accumulators), x
// packed in blocks of kVnniRowBlock rows as [K/4][rows][4 bytes], so the MB broadcasts of one
// step read 24 consecutive bytes. The epilogue converts to f32 times the row's x scale, then the
// shared tiled epilogue (weight scale, bias, ReLU, accumulation).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "common/tensor.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/i8_vnni.h"
#include "kernels/cpu/linear_tiled.h"

namespace deja::kernels::cpu {
namespace {

#define DEJA_VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx512vnni")))

// acc + the 4 products of u8 a and s8 b per 32-bit lane. GCC 12 compiles _mm512_dpbusd_epi32 in
// an unrolled block with a register copy per instruction and spills the accumulators (perf: the
// 4 x 6 kernel spent most of its samples on those moves); written out, the accumulators stay put.
DEJA_VNNI_TARGET inline __m512i Dpbusd(__m512i acc, __m512i a, __m512i b) {
  __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}

constexpr int64_t Quads(int64_t k_dim) { return (k_dim + 3) / 4; }

// Word i of a quad line from the two pair lines of 16 rows (words 0-15 and 16-31): row r's K
// pairs side by side.
struct alignas(64) QuadIndex {
  uint16_t w[32];
};
constexpr QuadIndex MakeQuadIndex() {
  QuadIndex q{};
  for (int r = 0; r < 16; ++r) {
    q.w[2 * r] = static_cast<uint16_t>(r);
    q.w[2 * r + 1] = static_cast<uint16_t>(16 + r);
  }
  return q;
}
constexpr QuadIndex kQuadIndex = MakeQuadIndex();

// `count` tiles (tile_stride bytes apart, `pairs` K pairs each) as K quads into dst
// ([quads][count][64 bytes], 64-byte aligned), and sums[16 b + r] = the sum of row r of tile b.
DEJA_VNNI_TARGET void RepackGroup(const int8_t* tiles, int64_t tile_stride, int count,
                                  int64_t pairs, int8_t* dst, int32_t* sums) {
  const __m512i idx = _mm512_load_si512(kQuadIndex.w);
  const __m512i ones = _mm512_set1_epi8(1);
  const int64_t full = pairs / 2;
  for (int b = 0; b < count; ++b) {
    const int8_t* t = tiles + b * tile_stride;
    __m512i sum = _mm512_setzero_si512();
    for (int64_t q = 0; q < full; ++q) {
      const __m512i v = _mm512_permutexvar_epi16(idx, _mm512_loadu_si512(t + q * 64));
      _mm512_store_si512(dst + (q * count + b) * 64, v);
      sum = _mm512_dpbusd_epi32(sum, ones, v);
    }
    if (full * 2 < pairs) {  // an odd number of pairs: the last quad's second pair is zeros
      const __m512i v =
          _mm512_permutexvar_epi16(idx, _mm512_maskz_loadu_epi8(0xffffffffull, t + full * 64));
      _mm512_store_si512(dst + (full * count + b) * 64, v);
      sum = _mm512_dpbusd_epi32(sum, ones, v);
    }
    _mm512_storeu_si512(sums + 16 * b, sum);
  }
}

template <int NB, int MB>
DEJA_VNNI_TARGET void VnniTile(const int8_t* w, const int32_t* sums, const uint8_t* x,
                               const float* sx, const int32_t* zx, int64_t quads, int64_t n0,
                               int64_t n_dim, const LinearEpilogue& e, float* out, int64_t ldo) {
  __m512i acc[NB][MB];
  for (int b = 0; b < NB; ++b) {
    const __m512i sum = _mm512_loadu_si512(sums + 16 * b);
    for (int m = 0; m < MB; ++m) acc[b][m] = _mm512_mullo_epi32(sum, _mm512_set1_epi32(-zx[m]));
  }
  for (int64_t q = 0; q < quads; ++q) {
    __m512i wv[NB];
    for (int b = 0; b < NB; ++b) wv[b] = _mm512_load_si512(w + (q * NB + b) * 64);
    for (int m = 0; m < MB; ++m) {
      int32_t xq;
      std::memcpy(&xq, x + (q * MB + m) * 4, 4);
      const __m512i xv = _mm512_set1_epi32(xq);
      for (int b = 0; b < NB; ++b) acc[b][m] = Dpbusd(acc[b][m], xv, wv[b]);
    }
  }
  __m512 f[NB][MB];
  for (int m = 0; m < MB; ++m) {
    const __m512 s = _mm512_set1_ps(sx[m]);
    for (int b = 0; b < NB; ++b) f[b][m] = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[b][m]), s);
  }
  StoreTiles<NB, MB>(f, n0, n_dim, e, out, ldo);
}

// Decode-sized x (up to kVnniDirectMaxM rows) straight from the tiles, without the repack: each
// pair line is permuted into its K quad in a register and used for every row, its row sums
// counted on the way (one more VPDPBUSD against ones). x rows are read where QuantizePackX put
// them: row m at xrow[m], its quads xstride[m] bytes apart.
template <int NB, int MB>
DEJA_VNNI_TARGET void VnniDirect(const int8_t* tiles, int64_t tile_stride, int64_t pairs,
                                 const uint8_t* const* xrow, const int64_t* xstride,
                                 const float* sx, const int32_t* zx, int64_t n0, int64_t n_dim,
                                 const LinearEpilogue& e, float* out, int64_t ldo) {
  const __m512i idx = _mm512_load_si512(kQuadIndex.w);
  const __m512i ones = _mm512_set1_epi8(1);
  __m512i acc[NB][MB], sum[NB];
  for (int b = 0; b < NB; ++b) {
    sum[b] = _mm512_setzero_si512();
    for (int m = 0; m < MB; ++m) acc[b][m] = _mm512_setzero_si512();
  }
  auto step = [&](int64_t q, const __m512i (&wv)[NB]) DEJA_VNNI_TARGET {
    for (int b = 0; b < NB; ++b) sum[b] = Dpbusd(sum[b], ones, wv[b]);
    for (int m = 0; m < MB; ++m) {
      int32_t xq;
      std::memcpy(&xq, xrow[m] + q * xstride[m], 4);
      const __m512i xv = _mm512_set1_epi32(xq);
      for (int b = 0; b < NB; ++b) acc[b][m] = Dpbusd(acc[b][m], xv, wv[b]);
    }
  };
  const int64_t full = pairs / 2;
  for (int64_t q = 0; q < full; ++q) {
    __m512i wv[NB];
    for (int b = 0; b < NB; ++b) {
      const int8_t* line = tiles + b * tile_stride + q * 64;
      if (MB <= 2) {
        _mm_prefetch(reinterpret_cast<const char*>(line) + kDecodePrefetchBytes, _MM_HINT_T0);
      }
      wv[b] = _mm512_permutexvar_epi16(idx, _mm512_loadu_si512(line));
    }
    step(q, wv);
  }
  if (full * 2 < pairs) {  // an odd number of pairs: the last quad's second pair is zeros
    __m512i wv[NB];
    for (int b = 0; b < NB; ++b) {
      wv[b] = _mm512_permutexvar_epi16(
          idx, _mm512_maskz_loadu_epi8(0xffffffffull, tiles + b * tile_stride + full * 64));
    }
    step(full, wv);
  }
  __m512 f[NB][MB];
  for (int m = 0; m < MB; ++m) {
    const __m512 s = _mm512_set1_ps(sx[m]);
    const __m512i z = _mm512_set1_epi32(-zx[m]);
    for (int b = 0; b < NB; ++b) {
      const __m512i v = _mm512_add_epi32(acc[b][m], _mm512_mullo_epi32(sum[b], z));
      f[b][m] = _mm512_mul_ps(_mm512_cvtepi32_ps(v), s);
    }
  }
  StoreTiles<NB, MB>(f, n0, n_dim, e, out, ldo);
}

using VnniTileFn = void (*)(const int8_t*, const int32_t*, const uint8_t*, const float*,
                            const int32_t*, int64_t, int64_t, int64_t, const LinearEpilogue&,
                            float*, int64_t);
// kTiles[nb][mb]: the micro-kernel for nb tiles (1..kVnniTileGroup) x mb rows (1..kVnniRowBlock).
template <int NB, size_t... M>
constexpr std::array<VnniTileFn, sizeof...(M) + 1> RowsFor(std::index_sequence<M...>) {
  return {nullptr, VnniTile<NB, static_cast<int>(M) + 1>...};
}
template <size_t... B>
constexpr std::array<std::array<VnniTileFn, kVnniRowBlock + 1>, sizeof...(B) + 1> MakeTiles(
    std::index_sequence<B...>) {
  return {std::array<VnniTileFn, kVnniRowBlock + 1>{},
          RowsFor<static_cast<int>(B) + 1>(std::make_index_sequence<kVnniRowBlock>())...};
}
constexpr auto kTiles = MakeTiles(std::make_index_sequence<kVnniTileGroup>());

DEJA_VNNI_TARGET float QuantizeRowAvx512(const float* x, int64_t k, uint8_t* q, int32_t* zero) {
  __m512 amax = _mm512_setzero_ps(), lo = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    amax = _mm512_max_ps(amax, _mm512_abs_ps(v));
    lo = _mm512_min_ps(lo, v);
  }
  const __mmask16 tail = static_cast<__mmask16>((1u << (k - i)) - 1);
  const __m512 v = _mm512_maskz_loadu_ps(tail, x + i);
  amax = _mm512_max_ps(amax, _mm512_abs_ps(v));
  lo = _mm512_min_ps(lo, v);
  const float a = _mm512_reduce_max_ps(amax);
  const bool unsigned_row = _mm512_reduce_min_ps(lo) >= 0.f;
  const float levels = unsigned_row ? 255.f : 127.f;
  *zero = unsigned_row ? 0 : 128;
  if (a == 0.f) {
    std::memset(q, *zero, static_cast<size_t>(k));
    return 0.f;
  }
  const __m512 inv = _mm512_set1_ps(levels / a);
  const __m512i z = _mm512_set1_epi32(*zero);
  for (i = 0; i + 16 <= k; i += 16) {
    const __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + i), inv));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i),
                     _mm512_cvtusepi32_epi8(_mm512_add_epi32(r, z)));
  }
  const __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(tail, x + i), inv));
  _mm_mask_storeu_epi8(q + i, tail, _mm512_cvtusepi32_epi8(_mm512_add_epi32(r, z)));
  return a / levels;
}

DEJA_VNNI_TARGET double VnniDotLoopImpl(int64_t iters, float seed) {
  constexpr int kChains = 16;
  __m512i acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_epi32(static_cast<int>(seed) + i);
  __m512i a = _mm512_set1_epi8(1);
  const __m512i b = _mm512_set1_epi8(1);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
    __asm__ volatile("" : "+v"(a));  // keeps the loop from being folded
  }
  __m512i s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm512_add_epi32(s, acc[i]);
  return _mm512_reduce_add_epi32(s) * 0.0 + 2.0 * 64.0 * kChains * static_cast<double>(iters);
}

bool Detect() {
  const char* env = std::getenv("DEJA_CPU_VNNI");
  if (env != nullptr && std::strcmp(env, "0") == 0) return false;
  __builtin_cpu_init();
  return Bf16DotAvailable() && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512vnni");
}

bool& Enabled() {
  static bool enabled = Detect();
  return enabled;
}

}  // namespace

bool VnniAvailable() {
  static const bool supported = Detect();
  return supported;
}

bool VnniEnabled() { return Enabled(); }

void SetVnniEnabled(bool on) { Enabled() = on && VnniAvailable(); }

float QuantizeRowU8(const float* x, int64_t k, uint8_t* q, int32_t* zero) {
  if (VnniAvailable()) return QuantizeRowAvx512(x, k, q, zero);
  float amax = 0.f, lo = 0.f;
  for (int64_t i = 0; i < k; ++i) {
    amax = std::max(amax, std::fabs(x[i]));
    lo = std::min(lo, x[i]);
  }
  const float levels = lo >= 0.f ? 255.f : 127.f;
  *zero = lo >= 0.f ? 0 : 128;
  const float inv = amax > 0.f ? levels / amax : 0.f;
  for (int64_t i = 0; i < k; ++i) {
    q[i] = static_cast<uint8_t>(static_cast<int>(std::nearbyint(x[i] * inv)) + *zero);
  }
  return amax / levels;
}

int64_t VnniPackedBytes(int64_t m_rows, int64_t k_dim) { return m_rows * Quads(k_dim) * 4; }

void QuantizePackX(const float* x, int64_t m_rows, int64_t k_dim, int64_t m_begin, int64_t m_end,
                   uint8_t* packed, float* scales, int32_t* zeros) {
  const int64_t quads = Quads(k_dim);
  thread_local std::vector<uint8_t> row;
  row.resize(static_cast<size_t>(quads * 4));
  for (int64_t m = m_begin; m < m_end; ++m) {
    scales[m] = QuantizeRowU8(x + m * k_dim, k_dim, row.data(), &zeros[m]);
    // K padded to whole quads with x = 0 (the zero point; the padded weights are 0 anyway).
    std::fill(row.begin() + k_dim, row.end(), static_cast<uint8_t>(zeros[m]));
    const int64_t m0 = m / kVnniRowBlock * kVnniRowBlock;
    const int64_t mb = std::min(kVnniRowBlock, m_rows - m0), r = m - m0;
    uint8_t* block = packed + m0 * quads * 4;
    for (int64_t q = 0; q < quads; ++q) {
      uint32_t v;
      std::memcpy(&v, row.data() + 4 * q, 4);
      std::memcpy(block + (q * mb + r) * 4, &v, 4);
    }
  }
}

void LinearI8Vnni(const uint8_t* packed, const float* x_scales, const int32_t* x_zeros,
                  int64_t m_rows, int64_t k_dim, const int8_t* w, int64_t n_dim, int64_t t_begin,
                  int64_t t_end, const LinearEpilogue& e, float* out, int64_t ldo) {
  const int64_t kp = TiledCols(k_dim), pairs = kp / 2, tile_stride = kp * kTileRows;
  const int64_t quads = Quads(k_dim);
  if (m_rows <= kVnniDirectMaxM) {
    const uint8_t* xrow[kVnniDirectMaxM];
    int64_t xstride[kVnniDirectMaxM];
    for (int64_t m = 0; m < m_rows; ++m) {
      const int64_t m0 = m / kVnniRowBlock * kVnniRowBlock;
      const int64_t mb = std::min(kVnniRowBlock, m_rows - m0);
      xrow[m] = packed + m0 * quads * 4 + (m - m0) * 4;
      xstride[m] = mb * 4;
    }
    auto run = [&](auto nb_const, int64_t t) {
      constexpr int NB = decltype(nb_const)::value;
      const int8_t* tiles = w + (t_begin + t) * tile_stride;
      const int64_t n0 = (t_begin + t) * kTileRows;
      switch (m_rows) {
#define DEJA_VNNI_DIRECT(M)                                                                   \
  case M:                                                                                     \
    return VnniDirect<(M > 4 && NB > 2 ? 2 : NB), M>(tiles, tile_stride, pairs, xrow, xstride, \
                                                     x_scales, x_zeros, n0, n_dim, e, out, ldo);
        DEJA_VNNI_DIRECT(1)
        DEJA_VNNI_DIRECT(2)
        DEJA_VNNI_DIRECT(3)
        DEJA_VNNI_DIRECT(4)
        DEJA_VNNI_DIRECT(5)
        DEJA_VNNI_DIRECT(6)
        DEJA_VNNI_DIRECT(7)
        DEJA_VNNI_DIRECT(8)
#undef DEJA_VNNI_DIRECT
      }
    };
    if (m_rows <= 4) {
      ForTileBlocks<4>(t_end - t_begin, run);
    } else {
      ForTileBlocks<2>(t_end - t_begin, run);
    }
    return;
  }
  thread_local std::vector<int8_t> storage;
  storage.resize(static_cast<size_t>(kVnniTileGroup * quads * 64 + 64));
  int8_t* scratch = storage.data() + (64 - reinterpret_cast<uintptr_t>(storage.data()) % 64) % 64;
  alignas(64) int32_t sums[kVnniTileGroup * kTileRows];
  for (int64_t t = t_begin; t < t_end; t += kVnniTileGroup) {
    const int count = static_cast<int>(std::min(kVnniTileGroup, t_end - t));
    RepackGroup(w + t * tile_stride, tile_stride, count, pairs, scratch, sums);
    for (int64_t m0 = 0; m0 < m_rows; m0 += kVnniRowBlock) {
      const int64_t mb = std::min(kVnniRowBlock, m_rows - m0);
      kTiles[count][mb](scratch, sums, packed + m0 * quads * 4, x_scales + m0, x_zeros + m0, quads,
                        t * kTileRows, n_dim, e, out + m0 * ldo, ldo);
    }
  }
}

void RepackI8Group(const int8_t* tiles, int64_t tile_stride, int count, int64_t pairs,
                   int8_t* dst, int32_t* sums) {
  RepackGroup(tiles, tile_stride, count, pairs, dst, sums);
}

double VnniDotLoop(int64_t iters, float seed) { return VnniDotLoopImpl(iters, seed); }

}  // namespace deja::kernels::cpu
