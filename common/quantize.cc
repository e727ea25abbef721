#include "common/quantize.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "common/int4.h"
#include "common/thread_pool.h"
#include "common/vec_math.h"

namespace deja {

namespace {

// The shared part of the quantizers: checks that w is a 2-D row-major host float matrix, then
// calls quantize_row(r, row) with each row r converted to f32 (split over `pool` when given).
// InvalidArgument naming `what` (and `to`, the target type) for another view, or for a row with
// a NaN or an infinity, which quantize_row never sees.
template <typename Fn>
Status QuantizeRows(const TensorView& w, const char* what, const char* to, ThreadPool* pool,
                    Fn&& quantize_row) {
  if (w.shape.rank != 2 || w.layout != Layout::kRowMajor || !w.device.is_host()) {
    return InvalidArgument(std::string(what) + ": " + to +
                           " quantization takes a 2-D row-major host matrix");
  }
  if (w.dtype != DType::kF32 && w.dtype != DType::kF16 && w.dtype != DType::kBF16) {
    return InvalidArgument(std::string(what) + ": cannot quantize " + DTypeName(w.dtype) +
                           " to " + to);
  }
  const int64_t rows = w.rows(), cols = w.cols();
  std::atomic<int64_t> bad_row{-1};
  auto run = [&](int64_t r0, int64_t r1) {
    std::vector<float> row(static_cast<size_t>(cols));
    const size_t row_bytes = static_cast<size_t>(cols) * DTypeSize(w.dtype);
    for (int64_t r = r0; r < r1; ++r) {
      ConvertToF32(static_cast<const char*>(w.data) + r * row_bytes, w.dtype, cols, row.data(),
                   false);
      bool finite = true;
      for (float v : row) finite = finite && std::isfinite(v);
      if (!finite) {
        bad_row.store(r);
        continue;
      }
      quantize_row(r, row.data());
    }
  };
  if (pool != nullptr) {
    pool->ParallelFor(rows, run, 16);
  } else {
    run(0, rows);
  }
  if (bad_row.load() >= 0) {
    return InvalidArgument(std::string(what) + ": row " + std::to_string(bad_row.load()) +
                           " holds a NaN or an infinity; it cannot be quantized");
  }
  return Status::Ok();
}

// The q of v under scale's inverse inv.
inline int Int4Round(float v, float inv) {
  return static_cast<int>(std::fmax(-8.f, std::fmin(7.f, std::round(v * inv))));
}

// The scale of one group of n values whose element of largest magnitude is m: m / -8 times the
// factor in kInt4ScaleSearch with the least squared error (ties to the larger scale).
float BestInt4Scale(const float* v, int32_t n, float m) {
  float best = m / -8.f;
  if (best == 0.f) return best;
  double best_err = std::numeric_limits<double>::infinity();
  for (float factor : kInt4ScaleSearch) {
    const float scale = m / -8.f * factor, inv = 1.f / scale;
    double err = 0;
    for (int32_t i = 0; i < n; ++i) {
      const double d = static_cast<double>(Int4Round(v[i], inv)) * scale - v[i];
      err += d * d;
    }
    if (err < best_err) best_err = err, best = scale;
  }
  return best;
}

}  // namespace

TensorView QuantizedMatrix::view() const {
  TensorView v = q.view();
  v.scale = scale.as<float>();
  return v;
}

StatusOr<QuantizedMatrix> QuantizeRowsInt8(const TensorView& w, const char* what,
                                           ThreadPool* pool) {
  const int64_t rows = w.rows(), cols = w.cols();
  QuantizedMatrix out{Tensor::Empty(DType::kI8, {rows, cols}), Tensor::Empty(DType::kF32, {rows})};
  DEJA_RETURN_IF_ERROR(QuantizeRows(w, what, "int8", pool, [&](int64_t r, const float* row) {
    float amax = 0.f;
    for (int64_t k = 0; k < cols; ++k) amax = std::max(amax, std::fabs(row[k]));
    const float scale = amax / 127.f;
    out.scale.as<float>()[r] = scale;
    int8_t* q = out.q.as<int8_t>() + r * cols;
    if (scale == 0.f) {
      std::fill(q, q + cols, int8_t{0});
      return;
    }
    const float inv = 1.f / scale;
    for (int64_t k = 0; k < cols; ++k) {
      // |row[k] * inv| <= 127 up to rounding of inv; the clamp keeps -128 out.
      const float v = std::round(row[k] * inv);
      q[k] = static_cast<int8_t>(std::fmax(-127.f, std::fmin(127.f, v)));
    }
  }));
  return out;
}

namespace {

// A [rows, cols] int4 matrix in groups of `group` whose padding rows (those of the last tile
// past `rows`) read as value 0 (nibble 8) with scale 0, as every element does until set.
Int4Matrix EmptyInt4(int64_t rows, int64_t cols, int32_t group) {
  Int4Matrix m{Tensor::Empty(DType::kI8, {Int4Bytes(rows, cols)}),
               Tensor::Zeros(DType::kF32, {Int4Scales(rows, cols, group)}), Shape{rows, cols},
               group, 0.0};
  std::fill(m.packed.as<uint8_t>(), m.packed.as<uint8_t>() + m.packed.numel(), uint8_t{0x88});
  return m;
}

// Element (n, k) of a tiled int4 matrix of `cols` columns set to `nibble` (value + 8).
void SetInt4Nibble(uint8_t* packed, int64_t n, int64_t k, int64_t cols, int nibble) {
  uint8_t& byte = packed[Int4Byte(n, k, cols)];
  const int shift = Int4Shift(k);
  byte = static_cast<uint8_t>((byte & ~(15 << shift)) | nibble << shift);
}

}  // namespace

TensorView Int4Matrix::view() const {
  TensorView v{packed.data(), DType::kI4, shape, Layout::kTiled16};
  v.scale = scale.as<float>();
  v.scale_group = group;
  return v;
}

StatusOr<Int4Matrix> QuantizeInt4(const TensorView& w, int32_t group, const char* what,
                                  ThreadPool* pool) {
  const int64_t rows = w.rows(), cols = w.cols();
  if (group <= 0 || group % 8 != 0 || cols % group != 0) {
    return InvalidArgument(std::string(what) + ": int4 group " + std::to_string(group) +
                           " must be a positive multiple of 8 that divides the " +
                           std::to_string(cols) + " columns");
  }
  const int64_t groups = cols / group;
  Int4Matrix out = EmptyInt4(rows, cols, group);
  auto* packed = out.packed.as<uint8_t>();
  float* scales = out.scale.as<float>();
  std::vector<double> err2(static_cast<size_t>(rows)), norm2(static_cast<size_t>(rows));
  DEJA_RETURN_IF_ERROR(QuantizeRows(w, what, "int4", pool, [&](int64_t r, const float* row) {
    double e2 = 0, n2 = 0;
    for (int64_t g = 0; g < groups; ++g) {
      const float* v = row + g * group;
      float m = 0.f;
      for (int32_t i = 0; i < group; ++i) {
        if (std::fabs(v[i]) > std::fabs(m)) m = v[i];
      }
      const float scale = BestInt4Scale(v, group, m);
      scales[Int4ScaleIndex(r, g, groups)] = scale;
      const float inv = scale != 0.f ? 1.f / scale : 0.f;
      for (int32_t i = 0; i < group; ++i) {
        const int64_t k = g * group + i;
        const int q = Int4Round(v[i], inv);
        SetInt4Nibble(packed, r, k, cols, q + 8);
        const double d = static_cast<double>(q) * scale - v[i];
        e2 += d * d;
        n2 += static_cast<double>(v[i]) * v[i];
      }
    }
    err2[r] = e2;
    norm2[r] = n2;
  }));
  double e2 = 0, n2 = 0;
  for (int64_t r = 0; r < rows; ++r) e2 += err2[r], n2 += norm2[r];
  out.relative_error = n2 > 0 ? std::sqrt(e2 / n2) : 0.0;
  return out;
}

Int4Rows Int4ToRows(const Int4Matrix& m) {
  const int64_t rows = m.shape[0], cols = m.shape[1], groups = cols / m.group;
  Int4Rows out{Tensor::Empty(DType::kU8, {rows, cols / 2}), Tensor::Empty(DType::kF32, {rows, groups})};
  const auto* tiled = m.packed.as<uint8_t>();
  auto* packed = out.packed.as<uint8_t>();
  for (int64_t n = 0; n < rows; ++n) {
    for (int64_t k = 0; k < cols; k += 2) {
      const int lo = Int4Value(tiled, n, k, cols) + 8, hi = Int4Value(tiled, n, k + 1, cols) + 8;
      packed[n * (cols / 2) + k / 2] = static_cast<uint8_t>(lo | hi << 4);
    }
    for (int64_t g = 0; g < groups; ++g) {
      out.scale.as<float>()[n * groups + g] = m.scale.as<float>()[Int4ScaleIndex(n, g, groups)];
    }
  }
  return out;
}

Int4Matrix TileInt4Rows(const uint8_t* packed, const float* scale, Shape shape, int32_t group,
                        int64_t begin, int64_t end) {
  const int64_t rows = shape[0], cols = shape[1], width = end - begin;
  const int64_t groups = cols / group, out_groups = width / group, g0 = begin / group;
  Int4Matrix out = EmptyInt4(rows, width, group);
  auto* tiled = out.packed.as<uint8_t>();
  for (int64_t n = 0; n < rows; ++n) {
    const uint8_t* row = packed + n * (cols / 2);
    for (int64_t k = 0; k < width; ++k) {
      const int64_t src = begin + k;
      SetInt4Nibble(tiled, n, k, width, (row[src / 2] >> (src % 2 * 4)) & 15);
    }
    for (int64_t g = 0; g < out_groups; ++g) {
      out.scale.as<float>()[Int4ScaleIndex(n, g, out_groups)] = scale[n * groups + g0 + g];
    }
  }
  return out;
}

}  // namespace deja
