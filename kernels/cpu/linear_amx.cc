// The int8 and int4 Linears on AMX tiles (kernels/cpu/amx.h).
//
// Eight tile registers, one configuration for both: C0-C3 int32 accumulators (2 blocks of 16 rows
// of x x 2 tiles of 16 output columns), A4-A5 the two row blocks of x (16 rows x 64 K), B6-B7 the
// two weight tiles (16 K quads x 16 columns x 4 K, VPDPBUSD's layout). Each C is stored to L1 and
// finished with AVX512, the VNNI kernel's epilogue element by element.
//
// int8: each group of kVnniTileGroup tiles is repacked as the VNNI kernel does (RepackI8Group,
// [quads][tile][64 bytes], zero quads up to a whole K step) and read with a stride of the group's
// width; x is u8 (QuantizeRowU8) against s8 weights: TDPBUSD. The accumulator plus -zero x (the
// weight row's sum) is the VNNI kernel's sum, whose accumulator starts there.
// int4: the nibbles (q + 8, unsigned) are unpacked into K quads, line j of a tile (K 8j..8j+7 of
// its 16 rows: low nibbles K 8j..8j+3, high ones 8j+4..8j+7) into quads 2j and 2j+1; x is s8:
// TDPBSUD. Each group's C is stored, 8 x (the group's sum of q) subtracted and multiplied by the
// group's scales into f32 sums kept in L1, in the order of the VNNI kernel. One row block (decode
// batches up to 16) pipelines the groups of each tile pair (I4PairOneBlock); two row blocks
// unpack the tiles one group at a time into L1; beyond, each pair of tiles once per call into an
// L2 scratch that every row block reads. The weights and their scales are prefetched ahead of
// the unpacking: BM_Linear int4 [8192, 2048] at M = 16 went from 604-626 us to 336 us (M = 1,
// the VNNI kernel, 191 us in the same run; 2-core Xeon).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/tensor.h"
#include "kernels/cpu/amx.h"
#include "kernels/cpu/i8_vnni.h"
#include "kernels/cpu/linear_tiled.h"

namespace deja::kernels::cpu {

namespace {

#define DEJA_AMX_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx512vnni,amx-tile,amx-int8")))

constexpr int64_t kQuadsPerStep = 16;  // K quads per tile (64 bytes of K)

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Loads the configuration for the calling thread and releases the tile state when done (the
// kernel then does not save 8 KiB of tiles at each context switch).
class TileScope {
 public:
  DEJA_AMX_TARGET TileScope() {
    TileConfig c;
    for (int t = 0; t < 8; ++t) {
      c.rows[t] = kAmxRows;
      c.colsb[t] = 64;
    }
    _tile_loadconfig(&c);
  }
  DEJA_AMX_TARGET ~TileScope() { _tile_release(); }
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

int64_t Quads(int64_t k_dim) { return (k_dim + 3) / 4; }
int64_t StepQuads(int64_t k_dim) {
  return (Quads(k_dim) + kQuadsPerStep - 1) / kQuadsPerStep * kQuadsPerStep;
}

struct alignas(64) CBlock {
  int32_t c[4][kAmxRows][kTileRows];
};

// The accumulators in use: C0 always, C1 with a second tile, C2 with a second row block, C3
// with both.
template <bool kTwoM, bool kTwoB>
DEJA_AMX_TARGET inline void ZeroC() {
  _tile_zero(0);
  if (kTwoB) _tile_zero(1);
  if (kTwoM) _tile_zero(2);
  if (kTwoM && kTwoB) _tile_zero(3);
}
template <bool kTwoM, bool kTwoB>
DEJA_AMX_TARGET inline void StoreC(CBlock* cb) {
  _tile_stored(0, cb->c[0], 64);
  if (kTwoB) _tile_stored(1, cb->c[1], 64);
  if (kTwoM) _tile_stored(2, cb->c[2], 64);
  if (kTwoM && kTwoB) _tile_stored(3, cb->c[3], 64);
}

// int8: rows [m0, m0 + 16 or 32) x tiles [b0, b0 + 1 or 2) of a repacked group of `count`.
template <bool kTwoM, bool kTwoB>
DEJA_AMX_TARGET void I8Block(const int8_t* scratch, int count, int b0, int64_t steps,
                             const uint8_t* x, int64_t xs, CBlock* cb) {
  ZeroC<kTwoM, kTwoB>();
  const int64_t bs = count * 64;
  for (int64_t s = 0; s < steps; ++s) {
    const int8_t* b = scratch + (s * kQuadsPerStep * count + b0) * 64;
    _tile_loadd(4, x + s * 64, xs);
    _tile_loadd(6, b, bs);
    if (kTwoB) _tile_loadd(7, b + 64, bs);
    if (kTwoM) _tile_loadd(5, x + kAmxRows * xs + s * 64, xs);
    _tile_dpbusd(0, 4, 6);
    if (kTwoB) _tile_dpbusd(1, 4, 7);
    if (kTwoM) _tile_dpbusd(2, 5, 6);
    if (kTwoM && kTwoB) _tile_dpbusd(3, 5, 7);
  }
  StoreC<kTwoM, kTwoB>(cb);
}

// int4 weights are read this far ahead of the line being unpacked: the loop's tile work leaves
// the out-of-order window too few misses in flight. BM_Linear int4, M = 4 / 16, [8192, 2048]:
// 539 / 626 us without; 1,024 / 2,048 / 4,096 / 8,192 bytes ahead: 396 / 620, 391 / 563,
// 371 / 514, 442 / 583 us (2-core Xeon, before the one-block pipeline and the scale prefetch).
constexpr int64_t kI4PrefetchBytes = 4096;

// int4: lines [j0, j1) of a tile into K quads (dst [2 (j1 - j0)][64 bytes], 64-byte aligned).
DEJA_AMX_TARGET void UnpackI4(const uint8_t* tile, int64_t j0, int64_t j1, uint8_t* dst) {
  const __m512i low = _mm512_set1_epi8(0x0f);
  for (int64_t j = j0; j < j1; ++j) {
    _mm_prefetch(reinterpret_cast<const char*>(tile + j * 64) + kI4PrefetchBytes, _MM_HINT_T0);
    const __m512i v = _mm512_loadu_si512(tile + j * 64);
    uint8_t* d = dst + 2 * (j - j0) * 64;
    _mm512_store_si512(d, _mm512_and_si512(v, low));
    _mm512_store_si512(d + 64, _mm512_and_si512(_mm512_srli_epi16(v, 4), low));
  }
}

// int4: one group's `steps` K steps, rows [m0, m0 + 16 or 32) (x at the group's first K, rows
// xs apart) x 1 or 2 tiles (unpacked quads at b, the second b_stride bytes on).
template <bool kTwoM, bool kTwoB>
DEJA_AMX_TARGET void I4Block(const uint8_t* b, int64_t b_stride, int64_t steps, const int8_t* x,
                             int64_t xs, CBlock* cb) {
  ZeroC<kTwoM, kTwoB>();
  for (int64_t s = 0; s < steps; ++s) {
    const uint8_t* bs = b + s * kQuadsPerStep * 64;
    _tile_loadd(4, x + s * 64, xs);
    _tile_loadd(6, bs, 64);
    if (kTwoB) _tile_loadd(7, bs + b_stride, 64);
    if (kTwoM) _tile_loadd(5, x + kAmxRows * xs + s * 64, xs);
    _tile_dpbsud(0, 4, 6);
    if (kTwoB) _tile_dpbsud(1, 4, 7);
    if (kTwoM) _tile_dpbsud(2, 5, 6);
    if (kTwoM && kTwoB) _tile_dpbsud(3, 5, 7);
  }
  StoreC<kTwoM, kTwoB>(cb);
}

// int4, one row block (M <= 16, decode batches): the groups of one or two tiles pipelined.
// Group g accumulates in C(2 kSet) (and C(2 kSet + 1)) from x in A(4 + kSet), kSet = g % 2, so
// its tile products run while the AVX512 unit unpacks group g + 1 and finishes group g - 1
// from its stored C; in the order of I4Block and the per-group epilogue, bit for bit.
// The tile numbers are literals in the intrinsics' assembly: one function per set.
#define DEJA_I4_GROUP_TILES(name, kC0, kC1, kA)                                       \
  template <bool kTwoB>                                                               \
  DEJA_AMX_TARGET inline void name(const uint8_t* b, int64_t b_stride, int64_t steps, \
                                   const int8_t* x, int64_t xs,                       \
                                   int32_t(*c)[kAmxRows][kTileRows]) {                \
    _tile_zero(kC0);                                                                  \
    if (kTwoB) _tile_zero(kC1);                                                       \
    for (int64_t s = 0; s < steps; ++s) {                                             \
      const uint8_t* bs = b + s * kQuadsPerStep * 64;                                 \
      _tile_loadd(kA, x + s * 64, xs);                                                \
      _tile_loadd(6, bs, 64);                                                         \
      if (kTwoB) _tile_loadd(7, bs + b_stride, 64);                                   \
      _tile_dpbsud(kC0, kA, 6);                                                       \
      if (kTwoB) _tile_dpbsud(kC1, kA, 7);                                            \
    }                                                                                 \
    _tile_stored(kC0, c[0], 64);                                                      \
    if (kTwoB) _tile_stored(kC1, c[1], 64);                                           \
  }
DEJA_I4_GROUP_TILES(I4GroupTiles0, 0, 1, 4)
DEJA_I4_GROUP_TILES(I4GroupTiles1, 2, 3, 5)
#undef DEJA_I4_GROUP_TILES

struct I4OneBlock {
  const int8_t* q;
  const int32_t* sums;
  const float* scales;
  int64_t m_rows, k_dim, groups, group;
};

template <bool kTwoB>
DEJA_AMX_TARGET void I4PairOneBlock(const I4OneBlock& a, const uint8_t* tile, int64_t tile_bytes,
                                    int64_t t, uint8_t* scratch, __m512 (*f)[kAmxRows]) {
  const int64_t lines = a.group / 8, steps = a.group / 64, b_stride = a.group / 4 * 64;
  alignas(64) int32_t c[2][2][kAmxRows][kTileRows];
  auto unpack = [&](int64_t g) DEJA_AMX_TARGET {
    uint8_t* buf = scratch + (g % 2) * 2 * b_stride;
    UnpackI4(tile, g * lines, (g + 1) * lines, buf);
    if (kTwoB) UnpackI4(tile + tile_bytes, g * lines, (g + 1) * lines, buf + b_stride);
  };
  auto finish = [&](int64_t g) DEJA_AMX_TARGET {
    for (int i = 0; i < (kTwoB ? 2 : 1); ++i) {
      // The next pair's scales, a pair ahead (their own stream, which the hardware missed).
      _mm_prefetch(
          reinterpret_cast<const char*>(a.scales + ((t + 2 + i) * a.groups + g) * kTileRows),
          _MM_HINT_T0);
      const __m512 s = _mm512_loadu_ps(a.scales + ((t + i) * a.groups + g) * kTileRows);
      for (int64_t r = 0; r < a.m_rows; ++r) {
        const __m512i dot = _mm512_sub_epi32(_mm512_load_si512(c[g % 2][i][r]),
                                             _mm512_set1_epi32(8 * a.sums[r * a.groups + g]));
        f[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), s, f[i][r]);
      }
    }
  };
  for (int i = 0; i < 2; ++i)
    for (int64_t r = 0; r < a.m_rows; ++r) f[i][r] = _mm512_setzero_ps();
  unpack(0);
  for (int64_t g = 0; g < a.groups; ++g) {
    const uint8_t* b = scratch + (g % 2) * 2 * b_stride;
    const int8_t* x = a.q + g * a.group;
    if (g % 2 == 0) I4GroupTiles0<kTwoB>(b, b_stride, steps, x, a.k_dim, c[0]);
    if (g % 2 == 1) I4GroupTiles1<kTwoB>(b, b_stride, steps, x, a.k_dim, c[1]);
    if (g + 1 < a.groups) unpack(g + 1);
    if (g > 0) finish(g - 1);
  }
  finish(a.groups - 1);
}

DEJA_AMX_TARGET double AmxDotLoopImpl(int64_t iters) {
  alignas(64) uint8_t ones[kAmxRows * 64];
  std::memset(ones, 1, sizeof ones);
  TileScope tiles;
  _tile_loadd(4, ones, 64);
  _tile_loadd(6, ones, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t it = 0; it < iters; ++it) {
    _tile_dpbusd(0, 4, 6);
    _tile_dpbusd(1, 4, 6);
    _tile_dpbusd(2, 4, 6);
    _tile_dpbusd(3, 4, 6);
  }
  alignas(64) int32_t c[kAmxRows * kTileRows];
  _tile_stored(0, c, 64);
  return c[0] * 0.0 + 2.0 * 4 * kAmxRows * kTileRows * 64 * static_cast<double>(iters);
}

bool Detect() {
  const char* env = std::getenv("DEJA_CPU_AMX");
  if (env != nullptr && std::strcmp(env, "0") == 0) return false;
  if (!VnniAvailable()) return false;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
  if ((d & (1u << 24)) == 0 || (d & (1u << 25)) == 0) return false;  // AMX-TILE, AMX-INT8
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
}

bool& Enabled() {
  static bool enabled = AmxAvailable();
  return enabled;
}

}  // namespace

int64_t AmxXStride(int64_t k_dim) { return StepQuads(k_dim) * 4; }

int64_t AmxPackedBytes(int64_t m_rows, int64_t k_dim) {
  return AmxPaddedRows(m_rows) * AmxXStride(k_dim);
}

void QuantizeRowsX(const float* x, int64_t k_dim, int64_t m_begin, int64_t m_end, uint8_t* packed,
                   float* scales, int32_t* zeros) {
  const int64_t stride = AmxXStride(k_dim);
  for (int64_t m = m_begin; m < m_end; ++m) {
    uint8_t* row = packed + m * stride;
    scales[m] = QuantizeRowU8(x + m * k_dim, k_dim, row, &zeros[m]);
    // K padded to whole steps with the zero point (the padded weights are 0 anyway).
    std::memset(row + k_dim, zeros[m], static_cast<size_t>(stride - k_dim));
  }
}

DEJA_AMX_TARGET void LinearI8Amx(const uint8_t* packed, const float* x_scales,
                                 const int32_t* x_zeros, int64_t m_rows, int64_t k_dim,
                                 const int8_t* w, int64_t n_dim, int64_t t_begin, int64_t t_end,
                                 const LinearEpilogue& e, float* out, int64_t ldo) {
  const int64_t kp = TiledCols(k_dim), pairs = kp / 2, tile_stride = kp * kTileRows;
  const int64_t quads = Quads(k_dim), step_quads = StepQuads(k_dim);
  const int64_t steps = step_quads / kQuadsPerStep, xs = AmxXStride(k_dim);
  thread_local std::vector<int8_t> storage;
  storage.resize(static_cast<size_t>(kVnniTileGroup * step_quads * 64 + 64));
  int8_t* scratch = storage.data() + (64 - reinterpret_cast<uintptr_t>(storage.data()) % 64) % 64;
  alignas(64) int32_t sums[kVnniTileGroup * kTileRows];
  alignas(64) CBlock cb;
  TileScope tiles;
  for (int64_t t = t_begin; t < t_end; t += kVnniTileGroup) {
    const int count = static_cast<int>(std::min(kVnniTileGroup, t_end - t));
    RepackI8Group(w + t * tile_stride, tile_stride, count, pairs, scratch, sums);
    std::memset(scratch + quads * count * 64, 0,
                static_cast<size_t>((step_quads - quads) * count * 64));
    for (int64_t m0 = 0; m0 < m_rows; m0 += 2 * kAmxRows) {
      const bool two_m = m0 + kAmxRows < m_rows;
      const uint8_t* x = packed + m0 * xs;
      for (int b0 = 0; b0 < count; b0 += 2) {
        const bool two_b = b0 + 1 < count;
        if (two_m && two_b) I8Block<true, true>(scratch, count, b0, steps, x, xs, &cb);
        if (two_m && !two_b) I8Block<true, false>(scratch, count, b0, steps, x, xs, &cb);
        if (!two_m && two_b) I8Block<false, true>(scratch, count, b0, steps, x, xs, &cb);
        if (!two_m && !two_b) I8Block<false, false>(scratch, count, b0, steps, x, xs, &cb);
        for (int i = 0; i < 4; ++i) {
          const int mi = i / 2, bi = i % 2;
          if ((mi == 1 && !two_m) || (bi == 1 && !two_b)) continue;
          const __m512i sum = _mm512_load_si512(sums + 16 * (b0 + bi));
          const int64_t n0 = (t + b0 + bi) * kTileRows;
          for (int64_t r = 0; r < kAmxRows && m0 + mi * kAmxRows + r < m_rows; ++r) {
            const int64_t m = m0 + mi * kAmxRows + r;
            const __m512i acc =
                _mm512_add_epi32(_mm512_mullo_epi32(sum, _mm512_set1_epi32(-x_zeros[m])),
                                 _mm512_load_si512(cb.c[i][r]));
            __m512 f[1][1] = {
                {_mm512_mul_ps(_mm512_cvtepi32_ps(acc), _mm512_set1_ps(x_scales[m]))}};
            StoreTiles<1, 1>(f, n0, n_dim, e, out + m * ldo, ldo);
          }
        }
      }
    }
  }
}

DEJA_AMX_TARGET void LinearI4Amx(const int8_t* q, const float* sx, const int32_t* sums,
                                 int64_t m_rows, int64_t k_dim, const uint8_t* w,
                                 const float* scales, int64_t group, int64_t n_dim, int64_t t_begin,
                                 int64_t t_end, const LinearEpilogue& e, float* out, int64_t ldo) {
  const int64_t tile_bytes = kTileRows * k_dim / 2, groups = k_dim / group;
  const int64_t lines = group / 8, group_quads = group / 4, steps = group / 64;
  const int64_t quads = k_dim / 4;
  const bool per_group = m_rows <= 2 * kAmxRows;  // one pass over the rows: unpack into L1
  const int64_t tile_quads = per_group ? group_quads : quads;
  // Two tiles' quads; one row block double-buffers them (I4PairOneBlock).
  const int64_t buffers = m_rows <= kAmxRows ? 2 : 1;
  thread_local std::vector<uint8_t> storage;
  storage.resize(static_cast<size_t>(buffers * 2 * tile_quads * 64 + 64));
  uint8_t* scratch = storage.data() + (64 - reinterpret_cast<uintptr_t>(storage.data()) % 64) % 64;
  const int64_t b_stride = tile_quads * 64;
  alignas(64) CBlock cb;
  alignas(64) __m512 f[4][kAmxRows];
  TileScope tiles;
  if (m_rows <= kAmxRows) {
    const I4OneBlock one{q, sums, scales, m_rows, k_dim, groups, group};
    for (int64_t t = t_begin; t < t_end; t += 2) {
      const bool two_b = t + 1 < t_end;
      if (two_b) I4PairOneBlock<true>(one, w + t * tile_bytes, tile_bytes, t, scratch, f);
      if (!two_b) I4PairOneBlock<false>(one, w + t * tile_bytes, tile_bytes, t, scratch, f);
      for (int i = 0; i < (two_b ? 2 : 1); ++i) {
        for (int64_t m = 0; m < m_rows; ++m) {
          __m512 v[1][1] = {{_mm512_mul_ps(f[i][m], _mm512_set1_ps(sx[m]))}};
          StoreTiles<1, 1>(v, (t + i) * kTileRows, n_dim, e, out + m * ldo, ldo);
        }
      }
    }
    return;
  }
  for (int64_t t = t_begin; t < t_end; t += 2) {
    const bool two_b = t + 1 < t_end;
    const uint8_t* tile = w + t * tile_bytes;
    if (!per_group) {
      UnpackI4(tile, 0, k_dim / 8, scratch);
      if (two_b) UnpackI4(tile + tile_bytes, 0, k_dim / 8, scratch + b_stride);
    }
    for (int64_t m0 = 0; m0 < m_rows; m0 += 2 * kAmxRows) {
      const bool two_m = m0 + kAmxRows < m_rows;
      for (auto& fi : f)
        for (auto& fr : fi) fr = _mm512_setzero_ps();
      for (int64_t g = 0; g < groups; ++g) {
        const uint8_t* b = scratch + (per_group ? 0 : g * group_quads * 64);
        if (per_group) {
          UnpackI4(tile, g * lines, (g + 1) * lines, scratch);
          if (two_b) UnpackI4(tile + tile_bytes, g * lines, (g + 1) * lines, scratch + b_stride);
        }
        const int8_t* x = q + m0 * k_dim + g * group;
        if (two_m && two_b) I4Block<true, true>(b, b_stride, steps, x, k_dim, &cb);
        if (two_m && !two_b) I4Block<true, false>(b, b_stride, steps, x, k_dim, &cb);
        if (!two_m && two_b) I4Block<false, true>(b, b_stride, steps, x, k_dim, &cb);
        if (!two_m && !two_b) I4Block<false, false>(b, b_stride, steps, x, k_dim, &cb);
        for (int i = 0; i < 4; ++i) {
          const int mi = i / 2, bi = i % 2;
          if ((mi == 1 && !two_m) || (bi == 1 && !two_b)) continue;
          const __m512 s = _mm512_loadu_ps(scales + ((t + bi) * groups + g) * kTileRows);
          for (int64_t r = 0; r < kAmxRows && m0 + mi * kAmxRows + r < m_rows; ++r) {
            const int64_t m = m0 + mi * kAmxRows + r;
            const __m512i dot = _mm512_sub_epi32(_mm512_load_si512(cb.c[i][r]),
                                                 _mm512_set1_epi32(8 * sums[m * groups + g]));
            f[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), s, f[i][r]);
          }
        }
      }
      for (int i = 0; i < 4; ++i) {
        const int mi = i / 2, bi = i % 2;
        if ((mi == 1 && !two_m) || (bi == 1 && !two_b)) continue;
        for (int64_t r = 0; r < kAmxRows && m0 + mi * kAmxRows + r < m_rows; ++r) {
          const int64_t m = m0 + mi * kAmxRows + r;
          __m512 v[1][1] = {{_mm512_mul_ps(f[i][r], _mm512_set1_ps(sx[m]))}};
          StoreTiles<1, 1>(v, (t + bi) * kTileRows, n_dim, e, out + m * ldo, ldo);
        }
      }
    }
  }
}

bool AmxAvailable() {
  static const bool supported = Detect();
  return supported;
}

bool AmxEnabled() { return Enabled(); }

void SetAmxEnabled(bool on) { Enabled() = on && AmxAvailable(); }

double AmxDotLoop(int64_t iters) { return AmxDotLoopImpl(iters); }

}  // namespace deja::kernels::cpu
