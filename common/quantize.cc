#include "common/quantize.h"

#include <atomic>
#include <cmath>
#include <string>
#include <vector>

#include "common/thread_pool.h"
#include "common/vec_math.h"

namespace deja {

TensorView QuantizedMatrix::view() const {
  TensorView v = q.view();
  v.scale = scale.as<float>();
  return v;
}

StatusOr<QuantizedMatrix> QuantizeRowsInt8(const TensorView& w, const char* what,
                                           ThreadPool* pool) {
  if (w.shape.rank != 2 || w.layout != Layout::kRowMajor || !w.device.is_host()) {
    return InvalidArgument(std::string(what) +
                           ": int8 quantization takes a 2-D row-major host "
                           "matrix");
  }
  if (w.dtype != DType::kF32 && w.dtype != DType::kF16 && w.dtype != DType::kBF16) {
    return InvalidArgument(std::string(what) + ": cannot quantize " + DTypeName(w.dtype) +
                           " to int8");
  }
  const int64_t rows = w.rows(), cols = w.cols();
  QuantizedMatrix out{Tensor::Empty(DType::kI8, {rows, cols}), Tensor::Empty(DType::kF32, {rows})};
  std::atomic<int64_t> bad_row{-1};
  auto run = [&](int64_t r0, int64_t r1) {
    std::vector<float> row(static_cast<size_t>(cols));
    const size_t row_bytes = static_cast<size_t>(cols) * DTypeSize(w.dtype);
    for (int64_t r = r0; r < r1; ++r) {
      ConvertToF32(static_cast<const char*>(w.data) + r * row_bytes, w.dtype, cols, row.data(),
                   false);
      float amax = 0.f;
      bool finite = true;
      for (float v : row) {
        finite = finite && std::isfinite(v);
        amax = std::max(amax, std::fabs(v));
      }
      if (!finite) {
        bad_row.store(r);
        continue;
      }
      const float scale = amax / 127.f;
      out.scale.as<float>()[r] = scale;
      int8_t* q = out.q.as<int8_t>() + r * cols;
      if (scale == 0.f) {
        std::fill(q, q + cols, int8_t{0});
        continue;
      }
      const float inv = 1.f / scale;
      for (int64_t k = 0; k < cols; ++k) {
        // |row[k] * inv| <= 127 up to rounding of inv; the clamp keeps -128 out.
        const float v = std::round(row[k] * inv);
        q[k] = static_cast<int8_t>(std::fmax(-127.f, std::fmin(127.f, v)));
      }
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
  return out;
}

}  // namespace deja
