// CPU Linear and the Deja Vu gather variants: picks the weight-streaming kernel for decode-sized
// M and, for prefill-sized M, OpenBLAS sgemm or the streaming kernel, whichever is faster on this
// CPU and BLAS (UseStreamingKernel), and splits either over the thread pool by output
// columns (so no two threads write the same element). The gathers widen the selected rows into
// an f32 panel for sgemm.
//
// OpenBLAS threading: MakeCpuBackend sets OpenBLAS to one thread and every pool thread calls
// sgemm on its own slice of N. The weights must be widened to f32 tile by tile anyway (sgemm
// only reads f32), and doing it inside the pool keeps that parallel; letting OpenBLAS start its
// own threads as well would put two busy threads on each core (our workers spin between jobs).
#include <cblas.h>
#include <strings.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/thread_pool.h"
#include "kernels/backend.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/amx.h"
#include "kernels/cpu/i8_vnni.h"
#include "kernels/cpu/simd.h"

namespace deja::kernels::cpu {
namespace {

// Rows of w widened per sgemm call: about 1 MiB of f32, so the tile stays in L2 while sgemm
// packs it, and x is repacked once per tile (a cost of 1 / tile_rows relative to the FLOPs).
int64_t BlasTileRows(int64_t k_dim) {
  int64_t rows = (int64_t{1} << 18) / k_dim;
  return std::clamp<int64_t>(rows / 16 * 16, 16, 512);
}

void ApplyEpilogue(const float* tmp, int64_t ld_tmp, int64_t m_rows, int64_t n0, int64_t cols,
                   const LinearEpilogue& e, float* out, int64_t ldo) {
  for (int64_t m = 0; m < m_rows; ++m) {
    const float* t = tmp + m * ld_tmp;
    float* o = out + m * ldo + n0;
    for (int64_t j = 0; j < cols; ++j) {
      float v = (e.scale != nullptr ? t[j] * e.scale[n0 + j] : t[j]) +
                (e.bias != nullptr ? e.bias[n0 + j] : 0.f);
      if (e.relu) v = std::max(v, 0.f);
      o[j] = e.accumulate ? o[j] + v : v;
    }
  }
}

// Columns [n_begin, n_end) of the output by sgemm, widening w tile by tile when it is not f32.
// Output column n reads weight row rows[n] (rows == nullptr: row n); those rows are always
// copied into the tile.
void BlasSlice(const float* x, int64_t m_rows, int64_t k_dim, const TensorView& w,
               const int32_t* rows, int64_t n_dim, int64_t n_begin, int64_t n_end,
               const LinearEpilogue& e, float* out) {
  // Per-thread scratch, reused across calls (pool threads are persistent).
  thread_local std::vector<float> w_tile;
  thread_local std::vector<float> c_tile;
  const bool is_f32 = w.dtype == DType::kF32 && rows == nullptr;
  // sgemm can accumulate into out (beta = 1) only when neither the activation nor the int8 scale
  // sits between the product and the accumulation.
  const bool via_tmp = e.accumulate && (e.relu || e.scale != nullptr);
  const int64_t tile = is_f32 ? n_end - n_begin : BlasTileRows(k_dim);
  for (int64_t n0 = n_begin; n0 < n_end; n0 += tile) {
    const int64_t cols = std::min(tile, n_end - n0);
    const float* wt;
    if (is_f32) {
      wt = w.as<float>() + n0 * k_dim;
    } else {
      w_tile.resize(static_cast<size_t>(cols * k_dim));
      const size_t esize = DTypeSize(w.dtype);
      const char* w0 = static_cast<const char*>(w.data);
      if (rows == nullptr) {
        ConvertToF32(w0 + n0 * k_dim * esize, w.dtype, cols * k_dim, w_tile.data(), false);
      } else {
        for (int64_t i = 0; i < cols; ++i) {
          ConvertToF32(w0 + rows[n0 + i] * k_dim * esize, w.dtype, k_dim, w_tile.data() + i * k_dim,
                       false);
        }
      }
      wt = w_tile.data();
    }
    float* c = out + n0;
    int64_t ldc = n_dim;
    if (via_tmp) {
      c_tile.resize(static_cast<size_t>(m_rows * cols));
      c = c_tile.data();
      ldc = cols;
    }
    const float beta = (e.accumulate && !via_tmp) ? 1.f : 0.f;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m_rows),
                static_cast<int>(cols), static_cast<int>(k_dim), 1.f, x, static_cast<int>(k_dim),
                wt, static_cast<int>(k_dim), beta, c, static_cast<int>(ldc));
    if (via_tmp) {
      ApplyEpilogue(c, ldc, m_rows, n0, cols, e, out, n_dim);
    } else if (e.bias != nullptr || e.relu || e.scale != nullptr) {
      // In place: out already holds the product (plus the old out when accumulating).
      LinearEpilogue in_place{e.bias, e.relu, false, e.scale};
      ApplyEpilogue(out + n0, n_dim, m_rows, n0, cols, in_place, out, n_dim);
    }
  }
}

// OpenBLAS runs AVX-512 sgemm kernels (its core is SkylakeX, Cooperlake or SapphireRapids), or
// the CPU lacks AVX-512 (the streaming kernels then have 8 lanes too).
bool BlasOutrunsStreaming() {
  static const bool yes = [] {
    const std::string core = openblas_get_corename();
    for (const char* avx512 : {"skylakex", "cooperlake", "sapphirerapids"}) {
      if (strcasecmp(core.c_str(), avx512) == 0) return true;
    }
    return std::string(SimdTargetName()).find("AVX3") == std::string::npos;
  }();
  return yes;
}

// The weight-streaming kernels rather than sgemm: decode-sized M; any M for bf16 weights on a
// CPU with AVX512-BF16; and any M for f16/bf16 weights when OpenBLAS runs AVX2 kernels on an
// AVX-512 CPU (this environment sets OPENBLAS_CORETYPE=Haswell, older OpenBLAS builds having
// miscomputed on it). Measured with `deja bench decode --model <1.3B> --prefill-tokens 512`,
// alternating: bf16 69.4 / 73.8 tokens/s through sgemm (weights widened to f32) against 169.3 /
// 166.6 through the bf16 kernel; f16 70.4 against 98.2 through the f16 kernel (2048-token
// prefill: 47.0 against 47.3, attention-bound). Unforced, OpenBLAS picks its Cooperlake kernels
// here and f16 sgemm prefill reached 112-115 tokens/s, so AVX-512 sgemm keeps f16 prefill.
//
// Row-major int8 always streams: its sums then run in the same order at every M, so a token's
// output does not depend on the rows beside it (an int8 model's activations are quantized
// downstream, where a last-bit difference can move a quantization step).
bool UseStreamingKernel(int64_t m_rows, DType w_dtype) {
  if (m_rows <= kLinearSmallMMax || w_dtype == DType::kI8) return true;
  if (w_dtype == DType::kBF16 && Bf16DotEnabled()) return true;
  return w_dtype != DType::kF32 && !BlasOutrunsStreaming();
}

// What the kernels read for the n activations x against weights of w_dtype: x itself, or for
// bf16 and int8 weights x as they see it (kernels/cpu/bf16_dot.h), rounded once per call on the
// calling thread: bf16 bits for LinearBf16Dot (small-M kernels on a CPU with AVX512-BF16), else
// widened back to f32 for the other kernels. Valid until this thread's next call.
struct KernelInput {
  const uint16_t* bits = nullptr;  // set: LinearBf16Dot reads these
  const float* f32 = nullptr;      // otherwise
};
KernelInput InputFor(DType w_dtype, const float* x, int64_t n, bool small_m) {
  if (w_dtype != DType::kBF16 && w_dtype != DType::kI8) return {nullptr, x};
  thread_local std::vector<uint16_t> b;
  thread_local std::vector<float> f;
  b.resize(static_cast<size_t>(n));
  RoundToBF16(x, n, b.data());
  // LinearBf16Dot reads bf16 weights only: int8 rows take the widened x below.
  if (small_m && Bf16DotEnabled() && w_dtype == DType::kBF16) return {b.data(), nullptr};
  f.resize(static_cast<size_t>(n));
  ConvertToF32(b.data(), DType::kBF16, n, f.data(), false);
  return {nullptr, f.data()};
}

// Output columns of tiles [t_begin, t_end) of kTiled16 weights without AVX512-BF16 (tests turn it
// off after load; a model only tiles when it is on): the same arithmetic in plain loops over the
// widened x and tile pairs.
float TiledValue(uint16_t v) { return BF16ToFloat(v); }
float TiledValue(int8_t v) { return static_cast<float>(v); }

template <typename T>
void LinearTiledPortable(const float* x, int64_t m_rows, int64_t k_dim, const T* w, int64_t n_dim,
                         int64_t t_begin, int64_t t_end, const LinearEpilogue& e, float* out) {
  const int64_t kp = TiledCols(k_dim);
  for (int64_t t = t_begin; t < t_end; ++t) {
    const T* tile = w + t * kp * kTileRows;
    for (int64_t m = 0; m < m_rows; ++m) {
      float acc[kTileRows] = {};
      const float* xm = x + m * k_dim;
      for (int64_t k = 0; k < k_dim; ++k) {
        const T* pair = tile + (k / 2) * 2 * kTileRows + (k & 1);
        for (int64_t r = 0; r < kTileRows; ++r) acc[r] += xm[k] * TiledValue(pair[r * 2]);
      }
      for (int64_t r = 0; r < kTileRows && t * kTileRows + r < n_dim; ++r) {
        const int64_t n = t * kTileRows + r;
        float v = (e.scale != nullptr ? acc[r] * e.scale[n] : acc[r]) +
                  (e.bias != nullptr ? e.bias[n] : 0.f);
        if (e.relu) v = std::max(v, 0.f);
        float* o = out + m * n_dim + n;
        *o = e.accumulate ? *o + v : v;
      }
    }
  }
}

// Linear over kTiled16 int8 weights on a CPU with AVX512-VNNI: x quantized
// per row (rows split among the threads), then the tiles split in whole groups.
Status VnniLinear(ThreadPool* pool, const TensorView& x, const TensorView& w,
                  const LinearEpilogue& e, float* o) {
  const int64_t m_rows = x.rows(), k_dim = x.cols(), n_dim = w.rows();
  // Bit-identical results either way (amx.h): the tiles from more rows than the direct path's.
  const bool amx = AmxEnabled() && m_rows > kVnniDirectMaxM;
  thread_local std::vector<uint8_t> packed_storage;  // this thread's: the pool gets pointers
  thread_local std::vector<float> scale_storage;
  thread_local std::vector<int32_t> zero_storage;
  packed_storage.resize(static_cast<size_t>(amx ? AmxPackedBytes(m_rows, k_dim)
                                                : VnniPackedBytes(m_rows, k_dim)));
  scale_storage.resize(static_cast<size_t>(m_rows));
  zero_storage.resize(static_cast<size_t>(m_rows));
  uint8_t* packed = packed_storage.data();
  float* scales = scale_storage.data();
  int32_t* zeros = zero_storage.data();
  pool->ParallelFor(m_rows, [&](int64_t m0, int64_t m1) {
    if (amx) return QuantizeRowsX(x.as<float>(), k_dim, m0, m1, packed, scales, zeros);
    QuantizePackX(x.as<float>(), m_rows, k_dim, m0, m1, packed, scales, zeros);
  });
  const int64_t tiles = (n_dim + kTileRows - 1) / kTileRows;
  const int64_t groups = (tiles + kVnniTileGroup - 1) / kVnniTileGroup;
  pool->ParallelFor(groups, [&](int64_t g0, int64_t g1) {
    const int64_t t0 = g0 * kVnniTileGroup, t1 = std::min(tiles, g1 * kVnniTileGroup);
    if (amx) return LinearI8Amx(packed, scales, zeros, m_rows, k_dim, w.as<int8_t>(), n_dim, t0, t1, e, o, n_dim);
    LinearI8Vnni(packed, scales, zeros, m_rows, k_dim, w.as<int8_t>(), n_dim, t0, t1, e, o, n_dim);
  });
  return Status::Ok();
}

// Linear over kTiled16 bf16 or int8 weights: x rounded to bf16 and packed in pairs, the tiles
// split among the threads in whole groups of the kernel's blocking.
Status TiledLinear(ThreadPool* pool, const TensorView& x, const TensorView& w,
                   const LinearEpilogue& e, float* o) {
  const int64_t m_rows = x.rows(), k_dim = x.cols(), n_dim = w.rows();
  const int64_t tiles = (n_dim + kTileRows - 1) / kTileRows;
  const bool int8 = w.dtype == DType::kI8;
  if (!Bf16DotEnabled()) {
    const KernelInput xb = InputFor(w.dtype, x.as<float>(), m_rows * k_dim, false);
    pool->ParallelFor(tiles, [&](int64_t t0, int64_t t1) {
      if (int8)
        return LinearTiledPortable(xb.f32, m_rows, k_dim, w.as<int8_t>(), n_dim, t0, t1, e, o);
      LinearTiledPortable(xb.f32, m_rows, k_dim, w.as<uint16_t>(), n_dim, t0, t1, e, o);
    });
    return Status::Ok();
  }
  if (int8 && QuantizesX()) return VnniLinear(pool, x, w, e, o);
  thread_local std::vector<uint16_t> packed_storage;  // this thread's: the pool reads xp
  packed_storage.resize(static_cast<size_t>(m_rows * TiledCols(k_dim)));
  const uint16_t* xp = packed_storage.data();
  RoundPackBf16Pairs(x.as<float>(), m_rows, k_dim, packed_storage.data());
  const int64_t group = TiledGroup(m_rows);
  const int64_t groups = (tiles + group - 1) / group;
  // At least ~64K MACs per chunk, as CpuLinear's row-major path.
  const int64_t min_chunk =
      std::max<int64_t>(1, (int64_t{1} << 16) / (group * kTileRows * k_dim * m_rows));
  pool->ParallelFor(
      groups,
      [&](int64_t g0, int64_t g1) {
        const int64_t t0 = g0 * group, t1 = std::min(tiles, g1 * group);
        if (int8)
          return LinearI8Tiled(xp, m_rows, k_dim, w.as<int8_t>(), n_dim, t0, t1, e, o, n_dim);
        LinearBf16Tiled(xp, m_rows, k_dim, w.as<uint16_t>(), n_dim, t0, t1, e, o, n_dim);
      },
      min_chunk);
  return Status::Ok();
}

}  // namespace

Status CpuLinear(Backend& backend, TensorView x, TensorView w, TensorView bias, Activation act,
                 bool accumulate, TensorView out) {
  ThreadPool* pool = backend.pool();
  const int64_t m_rows = x.rows(), k_dim = x.cols(), n_dim = w.rows();
  std::vector<float> bias_f32;
  if (bias.data != nullptr) {
    bias_f32.resize(static_cast<size_t>(n_dim));
    ConvertToF32(bias.data, bias.dtype, n_dim, bias_f32.data(), false);
  }
  LinearEpilogue e{bias_f32.empty() ? nullptr : bias_f32.data(), act == Activation::kRelu,
                   accumulate, w.dtype == DType::kI8 ? w.scale : nullptr};
  float* o = out.as<float>();
  if (w.dtype == DType::kI4) return LinearI4(pool, x, w, e, o);
  if (w.layout == Layout::kTiled16) return TiledLinear(pool, x, w, e, o);
  const bool small = backend.batch_invariant() || UseStreamingKernel(m_rows, w.dtype);
  const KernelInput xb = InputFor(w.dtype, x.as<float>(), m_rows * k_dim, small);
  const float* xs = xb.f32;

  if (small) {
    // Split N in blocks of 4 rows (the kernel's register block); keep at least ~64K MACs per
    // chunk so small layers do not pay a thread hand-off that costs more than the work.
    const int64_t blocks = (n_dim + 3) / 4;
    const int64_t min_chunk = std::max<int64_t>(1, (int64_t{1} << 16) / (4 * k_dim * m_rows));
    pool->ParallelFor(
        blocks,
        [&](int64_t b0, int64_t b1) {
          if (xb.bits != nullptr) {
            LinearBf16Dot(xb.bits, m_rows, k_dim, w.as<uint16_t>(), nullptr, b0 * 4,
                          std::min(n_dim, b1 * 4), e, o, n_dim);
            return;
          }
          LinearSmallM(xs, m_rows, k_dim, w.data, w.dtype, b0 * 4, std::min(n_dim, b1 * 4), e, o,
                       n_dim);
        },
        min_chunk);
    return Status::Ok();
  }
  pool->ParallelFor(
      n_dim,
      [&](int64_t n0, int64_t n1) {
        BlasSlice(xs, m_rows, k_dim, w, nullptr, n_dim, n0, n1, e, o);
      },
      64);
  return Status::Ok();
}

Status CpuGatherLinear(Backend& backend, TensorView x, TensorView w, TensorView bias,
                       const int32_t* rows, int64_t n_rows, Activation act, bool accumulate,
                       TensorView out) {
  ThreadPool* pool = backend.pool();
  const int64_t m_rows = x.rows(), k_dim = x.cols();
  // The bias of the selected rows, compact: the kernels index it by output column.
  std::vector<float> bias_f32;
  if (bias.data != nullptr) {
    bias_f32.resize(static_cast<size_t>(n_rows));
    const size_t esize = DTypeSize(bias.dtype);
    for (int64_t j = 0; j < n_rows; ++j) {
      ConvertToF32(static_cast<const char*>(bias.data) + rows[j] * esize, bias.dtype, 1,
                   bias_f32.data() + j, false);
    }
  }
  // Likewise the int8 scales of the selected rows.
  std::vector<float> scale;
  if (w.dtype == DType::kI8) {
    scale.resize(static_cast<size_t>(n_rows));
    for (int64_t j = 0; j < n_rows; ++j) scale[j] = w.scale[rows[j]];
  }
  LinearEpilogue e{bias_f32.empty() ? nullptr : bias_f32.data(), act == Activation::kRelu,
                   accumulate, scale.empty() ? nullptr : scale.data()};
  float* o = out.as<float>();
  const bool small = backend.batch_invariant() || UseStreamingKernel(m_rows, w.dtype);
  const KernelInput xb = InputFor(w.dtype, x.as<float>(), m_rows * k_dim, small);
  const float* xs = xb.f32;
  if (small) {
    // As CpuLinear: blocks of 4 selected rows, at least ~64K MACs per chunk.
    const int64_t blocks = (n_rows + 3) / 4;
    const int64_t min_chunk = std::max<int64_t>(1, (int64_t{1} << 16) / (4 * k_dim * m_rows));
    pool->ParallelFor(
        blocks,
        [&](int64_t b0, int64_t b1) {
          if (xb.bits != nullptr) {
            LinearBf16Dot(xb.bits, m_rows, k_dim, w.as<uint16_t>(), rows, b0 * 4,
                          std::min(n_rows, b1 * 4), e, o, n_rows);
            return;
          }
          GatherLinearSmallM(xs, m_rows, k_dim, w.data, w.dtype, rows, b0 * 4,
                             std::min(n_rows, b1 * 4), e, o, n_rows);
        },
        min_chunk);
    return Status::Ok();
  }
  pool->ParallelFor(
      n_rows,
      [&](int64_t n0, int64_t n1) { BlasSlice(xs, m_rows, k_dim, w, rows, n_rows, n0, n1, e, o); },
      64);
  return Status::Ok();
}

namespace {

// Columns [n_begin, n_end) of out [M, N] += x [M, n_rows] · wt[rows][:, n_begin:n_end) by sgemm
// over panels of the selected rows widened to f32 (beta = 0 on the first panel unless
// accumulating).
void BlasSliceT(const float* x, int64_t m_rows, const TensorView& wt, const int32_t* rows,
                int64_t n_rows, int64_t n_begin, int64_t n_end, bool accumulate, float* out) {
  thread_local std::vector<float> panel;
  const int64_t n_dim = wt.cols(), cols = n_end - n_begin;
  const size_t esize = DTypeSize(wt.dtype);
  // About 1 MiB of f32 per panel, as BlasTileRows.
  const int64_t tile = std::clamp<int64_t>((int64_t{1} << 18) / cols, 16, 512);
  panel.resize(static_cast<size_t>(std::min(tile, n_rows) * cols));
  for (int64_t j0 = 0; j0 < n_rows; j0 += tile) {
    const int64_t jn = std::min(tile, n_rows - j0);
    for (int64_t j = 0; j < jn; ++j) {
      ConvertToF32(static_cast<const char*>(wt.data) + (rows[j0 + j] * n_dim + n_begin) * esize,
                   wt.dtype, cols, panel.data() + j * cols, false);
    }
    const float beta = (accumulate || j0 > 0) ? 1.f : 0.f;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m_rows),
                static_cast<int>(cols), static_cast<int>(jn), 1.f, x + j0, static_cast<int>(n_rows),
                panel.data(), static_cast<int>(cols), beta, out + n_begin, static_cast<int>(n_dim));
  }
}

// out [M, N] (+)= x · wt[rows] for float wt or int8 wt read without its scales; `small`: the
// streaming kernel (else sgemm).
Status GatherLinearTRaw(ThreadPool* pool, TensorView x, TensorView wt, const int32_t* rows,
                        int64_t n_rows, TensorView out, bool small, bool accumulate = false);

}  // namespace

Status CpuGatherLinearT(Backend& backend, TensorView x, TensorView wt, const int32_t* rows,
                        int64_t n_rows, bool accumulate, TensorView out) {
  ThreadPool* pool = backend.pool();
  // The streaming kernel at every M on a batch-invariant backend (sgemm's sums would depend on M).
  const bool small = backend.batch_invariant() || x.rows() <= kLinearSmallMMax;
  if (wt.dtype == DType::kI8) {
    // The scales belong to wt's columns: the sum of the raw products first, then out (+)= sum *
    // scale per column.
    const int64_t m_rows = x.rows(), n_dim = wt.cols();
    Tensor sum = Tensor::Empty(DType::kF32, {m_rows, n_dim});
    TensorView raw = wt;
    raw.scale = nullptr;
    DEJA_RETURN_IF_ERROR(GatherLinearTRaw(pool, x, raw, rows, n_rows, sum.view(), small));
    const float* scale = wt.scale;
    pool->ParallelFor(m_rows, [&](int64_t m0, int64_t m1) {
      for (int64_t m = m0; m < m1; ++m) {
        const float* sm = sum.as<float>() + m * n_dim;
        float* om = out.as<float>() + m * n_dim;
        for (int64_t n = 0; n < n_dim; ++n) om[n] = (accumulate ? om[n] : 0.f) + sm[n] * scale[n];
      }
    });
    return Status::Ok();
  }
  return GatherLinearTRaw(pool, x, wt, rows, n_rows, out, small, accumulate);
}

namespace {

Status GatherLinearTRaw(ThreadPool* pool, TensorView x, TensorView wt, const int32_t* rows,
                        int64_t n_rows, TensorView out, bool small, bool accumulate) {
  const int64_t m_rows = x.rows(), n_dim = wt.cols();
  const float* xs = x.as<float>();
  float* o = out.as<float>();
  xs = InputFor(wt.dtype, xs, m_rows * n_rows, false).f32;
  // Threads own column ranges of out, in blocks of 64 columns (whole register blocks and cache
  // lines, so no two threads write one line).
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (n_dim + kBlock - 1) / kBlock;
  if (small) {
    // One contiguous column range per thread, not the pool's default few chunks per thread: every
    // chunk walks all the selected rows, so narrower chunks turn each row into shorter scattered
    // reads. Measured on one thread (M = 1, 8192 x 2048 f16, loaded machine): the whole row per
    // pass 1.23 / 0.72 / 0.14 ms at 100 / 50 / 10% kept, the row in 8 column chunks 1.77 / 1.02 /
    // 0.17 ms. Small problems stay on one thread (below ~64K MACs).
    const int64_t macs = n_dim * n_rows * m_rows;
    const int64_t parts =
        std::clamp<int64_t>(macs >> 16, 1, std::min<int64_t>(pool->num_threads(), blocks));
    pool->ParallelFor(parts, [&](int64_t p0, int64_t p1) {
      const int64_t n0 = blocks * p0 / parts * kBlock;
      const int64_t n1 = std::min(n_dim, blocks * p1 / parts * kBlock);
      GatherLinearTSmallM(xs, m_rows, wt.data, wt.dtype, n_dim, rows, n_rows, n0, n1, accumulate,
                          o);
    });
    return Status::Ok();
  }
  pool->ParallelFor(
      blocks,
      [&](int64_t b0, int64_t b1) {
        BlasSliceT(xs, m_rows, wt, rows, n_rows, b0 * kBlock, std::min(n_dim, b1 * kBlock),
                   accumulate, o);
      },
      1);
  return Status::Ok();
}

}  // namespace

}  // namespace deja::kernels::cpu
