#include "common/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include <glog/logging.h>

#include "common/int4.h"

namespace deja {

Shape::Shape(std::initializer_list<int64_t> d) {
  CHECK_LE(d.size(), 4u);
  for (int64_t v : d) dims[rank++] = v;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= dims[i];
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (rank != o.rank) return false;
  for (int i = 0; i < rank; ++i)
    if (dims[i] != o.dims[i]) return false;
  return true;
}

std::string Shape::ToString() const {
  std::string s = "[";
  for (int i = 0; i < rank; ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

size_t TensorView::bytes() const {
  if (dtype == DType::kI4) return static_cast<size_t>(Int4Bytes(rows(), cols()));
  if (layout == Layout::kTiled16) {
    return static_cast<size_t>(TiledRows(rows()) * TiledCols(cols())) * DTypeSize(dtype);
  }
  return static_cast<size_t>(numel()) * DTypeSize(dtype);
}

TensorView TensorView::RowSlice(int64_t begin, int64_t end) const {
  CHECK(begin >= 0 && begin <= end && end <= rows());
  TensorView v = *this;
  if (dtype == DType::kI4) {
    CHECK_EQ(begin % kTileRows, 0) << "a tiled view slices at tile boundaries";
    v.data = static_cast<char*>(data) + Int4Bytes(begin, cols());
    v.shape = Shape{end - begin, cols()};
    v.scale = scale + Int4Scales(begin, cols(), scale_group);
    return v;
  }
  if (layout == Layout::kTiled16) {
    CHECK_EQ(begin % kTileRows, 0) << "a tiled view slices at tile boundaries";
    v.data = static_cast<char*>(data) + begin * TiledCols(cols()) * DTypeSize(dtype);
  } else {
    v.data = static_cast<char*>(data) + begin * cols() * DTypeSize(dtype);
  }
  v.shape = Shape{end - begin, cols()};
  if (scale != nullptr) v.scale = scale + begin;
  return v;
}

void internal::FreeHostMemory(void* p) { std::free(p); }

Tensor Tensor::Empty(DType dtype, Shape shape) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  size_t bytes = t.bytes();
  // Not in transparent huge pages (2 MiB-aligned + MADV_HUGEPAGE for tensors from 2 MiB): on
  // the dev box that made batch-1 decode of the 1.3B shape slower, 54-55 against 42-43 ms
  // (three runs each, alternating), and batch 16 no faster.
  size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded == 0) rounded = 64;
  void* p = std::aligned_alloc(64, rounded);
  if (p == nullptr) throw std::bad_alloc();
  t.data_.reset(p);
  return t;
}

Tensor Tensor::Adopt(void* data, DType dtype, Shape shape, Device device, FreeFn release) {
  CHECK(release != nullptr);
  Tensor t;
  t.data_ = std::unique_ptr<void, internal::TensorFree>(data, internal::TensorFree{release});
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.device_ = device;
  return t;
}

Tensor Tensor::Zeros(DType dtype, Shape shape) {
  Tensor t = Empty(dtype, shape);
  std::memset(t.data(), 0, t.bytes());
  return t;
}

namespace {

// Copies element (n, k) of a rows x cols matrix of 1- or 2-byte elements from index from(n, k) to
// index to(n, k).
template <typename T, typename From, typename To>
void PermuteTyped(const void* src, void* dst, int64_t rows, int64_t cols, From from, To to) {
  const auto* s = static_cast<const T*>(src);
  auto* d = static_cast<T*>(dst);
  for (int64_t n = 0; n < rows; ++n) {
    for (int64_t k = 0; k < cols; ++k) d[to(n, k)] = s[from(n, k)];
  }
}
template <typename From, typename To>
void Permute(const void* src, void* dst, size_t esize, int64_t rows, int64_t cols, From from,
             To to) {
  if (esize == 1) return PermuteTyped<uint8_t>(src, dst, rows, cols, from, to);
  PermuteTyped<uint16_t>(src, dst, rows, cols, from, to);
}

}  // namespace

Tensor Tile16(const TensorView& v, TensorView* tiled) {
  const size_t esize = DTypeSize(v.dtype);
  CHECK(v.layout == Layout::kRowMajor && v.shape.rank == 2 && (esize == 1 || esize == 2));
  CHECK(v.device.is_host()) << "Tile16 reads host memory, not " << v.device.ToString();
  const int64_t rows = v.rows(), cols = v.cols();
  Tensor t = Tensor::Zeros(v.dtype, {TiledRows(rows), TiledCols(cols)});
  Permute(
      v.data, t.data(), esize, rows, cols, [cols](int64_t n, int64_t k) { return n * cols + k; },
      [cols](int64_t n, int64_t k) { return TiledIndex(n, k, cols); });
  const float* scale = v.scale;  // v may be *tiled
  *tiled = TensorView{t.data(), v.dtype, v.shape, Layout::kTiled16};
  tiled->scale = scale;
  return t;
}

Tensor Untile16(const TensorView& tiled) {
  const size_t esize = DTypeSize(tiled.dtype);
  CHECK(tiled.layout == Layout::kTiled16 && tiled.shape.rank == 2 && (esize == 1 || esize == 2));
  CHECK(tiled.device.is_host()) << "Untile16 reads host memory, not " << tiled.device.ToString();
  const int64_t rows = tiled.rows(), cols = tiled.cols();
  Tensor t = Tensor::Empty(tiled.dtype, tiled.shape);
  Permute(
      tiled.data, t.data(), esize, rows, cols,
      [cols](int64_t n, int64_t k) { return TiledIndex(n, k, cols); },
      [cols](int64_t n, int64_t k) { return n * cols + k; });
  return t;
}

}  // namespace deja
