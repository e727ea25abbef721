// Tensors: an owning, contiguous row-major buffer (Tensor) and a non-owning view of one
// (TensorView) that ops take. At most 4 dimensions. Both say which device's memory they are in:
// Tensor::Empty/Zeros give 64-byte-aligned host memory; a backend hands out memory on its device
// as a Tensor that frees it with the backend's function (kernels::Backend::Allocate).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "common/device.h"
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

// How a view's elements are laid out. kTiled16 is for 2-D bf16 or int8 weights [N, K] that Linear
// reads on CPUs with AVX512-BF16 (kernels/cpu/linear_bf16.cc; the model tiles its layers' matrices
// at load when the backend prefers it): rows in tiles of 16, and within a tile K in pairs, 16 rows
// x 2 values = one 64-byte line per pair, so a tile streams as one sequential run and a register
// holds a K pair of 16 rows. Element (n, k) is at TiledIndex(n, k, K); rows are padded with zeros
// to a multiple of 16 and K to a multiple of 2.
enum class Layout : uint8_t { kRowMajor, kTiled16 };

constexpr int64_t kTileRows = 16;
inline int64_t TiledCols(int64_t cols) { return (cols + 1) & ~int64_t{1}; }
inline int64_t TiledRows(int64_t rows) { return (rows + kTileRows - 1) / kTileRows * kTileRows; }
inline int64_t TiledIndex(int64_t n, int64_t k, int64_t cols) {
  return (n / kTileRows) * TiledCols(cols) * kTileRows + (k / 2) * (2 * kTileRows) +
         (n % kTileRows) * 2 + (k & 1);
}

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Shape shape;
  Layout layout = Layout::kRowMajor;
  // Last, so the aggregate initialisations {data, dtype, shape[, layout]} stay host views.
  Device device = Device::Host();
  // An int8 matrix's f32 scales, one per row of the 2-D reading (per output channel of a Linear
  // weight), in the same memory as data: element (n, k) is data[n, k] * scale[n]. RowSlice moves
  // it with the rows. An int4 matrix's group scales (common/int4.h), scale_group K values each.
  // Null for every other dtype.
  const float* scale = nullptr;
  int32_t scale_group = 0;

  int64_t numel() const { return shape.numel(); }
  // Bytes of storage (for kTiled16 with the padding).
  size_t bytes() const;
  // Size of the last dimension and the product of the others (a 2-D reading of the view).
  int64_t cols() const { return shape.rank == 0 ? 1 : shape[shape.rank - 1]; }
  int64_t rows() const { return shape.rank == 0 ? 1 : numel() / cols(); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  // Rows [begin, end) of the 2-D reading, as a view of shape {end - begin, cols}. A kTiled16 view
  // slices at a multiple of 16 (the rows after `end` in its last tile are not read).
  TensorView RowSlice(int64_t begin, int64_t end) const;
};

namespace internal {
void FreeHostMemory(void* p);
// Tensor's deleter: std::free for host memory, else the allocating backend's function. Outside
// Tensor so its default member initializer is usable in Tensor's defaulted constructor.
struct TensorFree {
  void (*fn)(void* data) = &FreeHostMemory;
  void operator()(void* p) const { fn(p); }
};
}  // namespace internal

class Tensor {
 public:
  // Releases memory a backend allocated.
  using FreeFn = void (*)(void* data);

  Tensor() = default;
  // Host memory, 64-byte aligned (uninitialised / zeroed).
  static Tensor Empty(DType dtype, Shape shape);
  static Tensor Zeros(DType dtype, Shape shape);
  // Takes ownership of `data`, memory on `device` for `dtype` x `shape` that `release` frees: how
  // a backend hands out its device's memory in the one owning type.
  static Tensor Adopt(void* data, DType dtype, Shape shape, Device device, FreeFn release);

  TensorView view() const { return {data_.get(), dtype_, shape_, Layout::kRowMajor, device_}; }
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
  const Device& device() const { return device_; }

 private:
  std::unique_ptr<void, internal::TensorFree> data_;
  DType dtype_ = DType::kF32;
  Shape shape_;
  Device device_;
};

// Tiles the 2-D row-major host view v of a 1- or 2-byte dtype (kTiled16): returns the storage and
// sets *tiled to the view of it (v's dtype and shape, layout kTiled16).
Tensor Tile16(const TensorView& v, TensorView* tiled);
// The kTiled16 view back in row-major order (a tensor of its shape).
Tensor Untile16(const TensorView& tiled);

}  // namespace deja
