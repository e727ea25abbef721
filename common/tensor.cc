#include "common/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include <glog/logging.h>

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

TensorView TensorView::RowSlice(int64_t begin, int64_t end) const {
  CHECK(begin >= 0 && begin <= end && end <= rows());
  TensorView v = *this;
  v.data = static_cast<char*>(data) + begin * cols() * DTypeSize(dtype);
  v.shape = Shape{end - begin, cols()};
  return v;
}

void Tensor::Free::operator()(void* p) const { std::free(p); }

Tensor Tensor::Empty(DType dtype, Shape shape) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  size_t bytes = t.bytes();
  size_t rounded = (bytes + 63) / 64 * 64;
  if (rounded == 0) rounded = 64;
  void* p = std::aligned_alloc(64, rounded);
  if (p == nullptr) throw std::bad_alloc();
  t.data_.reset(p);
  return t;
}

Tensor Tensor::Zeros(DType dtype, Shape shape) {
  Tensor t = Empty(dtype, shape);
  std::memset(t.data(), 0, t.bytes());
  return t;
}

}  // namespace deja
