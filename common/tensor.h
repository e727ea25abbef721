// Tensors: an owning, 64-byte-aligned, contiguous row-major buffer (Tensor) and a non-owning
// view of one (TensorView) that ops take. At most 4 dimensions.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "common/dtype.h"

namespace deja {

struct Shape {
  std::array<int64_t, 4> dims{};
  int rank = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> d);
  int64_t operator[](int i) const { return dims[i]; }
  int64_t numel() const;
  bool operator==(const Shape& o) const;
  std::string ToString() const;
};

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Shape shape;

  int64_t numel() const { return shape.numel(); }
  size_t bytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype); }
  // Size of the last dimension and the product of the others (a 2-D reading of the view).
  int64_t cols() const { return shape.rank == 0 ? 1 : shape[shape.rank - 1]; }
  int64_t rows() const { return shape.rank == 0 ? 1 : numel() / cols(); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  // Rows [begin, end) of the 2-D reading, as a view of shape {end - begin, cols}.
  TensorView RowSlice(int64_t begin, int64_t end) const;
};

class Tensor {
 public:
  Tensor() = default;
  static Tensor Empty(DType dtype, Shape shape);
  static Tensor Zeros(DType dtype, Shape shape);

  TensorView view() const { return {data_.get(), dtype_, shape_}; }
  void* data() const { return data_.get(); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_.get());
  }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t numel() const { return shape_.numel(); }
  size_t bytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype_); }
  bool empty() const { return data_ == nullptr; }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> data_;
  DType dtype_ = DType::kF32;
  Shape shape_;
};

}  // namespace deja
