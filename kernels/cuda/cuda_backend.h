// The CUDA backend's public face: device memory owners and the CudaBackend interface. Free of
// CUDA types, so callers need no CUDA headers; built only when DEJA_HAVE_CUDA is on.
//
// Memory model. The CUDA backend owns device memory; every pointer an op receives from a
// CudaBackend is a device pointer on that backend's device (tensors, weights, KvView k/v/slot_pos/
// score, TopK values/indices), with one exception: the index arrays the validating ops
// (kernels/ops.cc) read on the host, Embedding `ids`, Attention `q_pos` and `head_ids` and the
// gathers' `rows`, are host pointers; the backend copies them to the device on its stream before
// the kernel that reads them, and the caller may reuse them as soon as the op returns.
//
// Ordering. Ops enqueue work on the backend's single stream and return without waiting; an Ok
// return means the work was enqueued. Results are visible to the host after Synchronize() or a
// CopyToHost; an error of an asynchronous kernel surfaces there.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "common/status.h"
#include "common/tensor.h"
#include "kernels/backend.h"

namespace deja::kernels::cuda {

// Move-only owner of one cudaMalloc allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Allocates on the current device; bytes == 0 gives an empty buffer.
  static StatusOr<DeviceBuffer> Allocate(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void Release();
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// A contiguous row-major tensor in device memory; view() is what ops take.
class DeviceTensor {
 public:
  DeviceTensor() = default;
  DeviceTensor(DeviceBuffer buffer, DType dtype, Shape shape)
      : buffer_(std::move(buffer)), dtype_(dtype), shape_(shape) {}

  TensorView view() const { return {buffer_.data(), dtype_, shape_}; }
  void* data() const { return buffer_.data(); }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t numel() const { return shape_.numel(); }
  size_t bytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype_); }

 private:
  DeviceBuffer buffer_;
  DType dtype_ = DType::kF32;
  Shape shape_;
};

class CudaBackend : public Backend {
 public:
  virtual int device() const = 0;
  // Uninitialised device memory for a tensor on this backend's device.
  virtual StatusOr<DeviceTensor> Allocate(DType dtype, Shape shape) = 0;
  // Copies ordered after the work already enqueued on the backend's stream; both return once the
  // copy is complete.
  virtual Status CopyToDevice(const void* host, size_t bytes, void* device_dst) = 0;
  virtual Status CopyToHost(const void* device_src, size_t bytes, void* host) = 0;
  // Waits for all enqueued work; reports the first asynchronous error.
  virtual Status Synchronize() = 0;
  // Device milliseconds between events recorded before and after the work `enqueue` adds to the
  // stream (for benchmarks; synchronises).
  virtual StatusOr<float> TimeMs(const std::function<Status()>& enqueue) = 0;
};

// The backend as a CudaBackend, or nullptr when it is of another kind.
CudaBackend* AsCuda(Backend& backend);

// A device copy of a host tensor, and a host copy of a device tensor.
StatusOr<DeviceTensor> ToDevice(CudaBackend& backend, const Tensor& host);
StatusOr<Tensor> ToHost(CudaBackend& backend, const DeviceTensor& device);

}  // namespace deja::kernels::cuda
