// RAII owners of the CUDA runtime and cuBLAS handles the backend uses (device buffer, stream,
// event, cuBLAS handle, a grow-only device workspace) and the translation of CUDA/cuBLAS error
// codes into Status. Internal to kernels/cuda/: this header exposes CUDA types.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>

#include "common/status.h"

namespace deja::kernels::cuda {

// Ok for cudaSuccess; otherwise ResourceExhausted (out of memory), Unavailable (no device or
// driver) or Internal, with `what` and CUDA's name and description of the error.
Status CudaStatus(cudaError_t error, const char* what);
Status CublasStatus(cublasStatus_t status, const char* what);

#define DEJA_CUDA_RETURN_IF_ERROR(expr, what) \
  DEJA_RETURN_IF_ERROR(::deja::kernels::cuda::CudaStatus((expr), (what)))
#define DEJA_CUBLAS_RETURN_IF_ERROR(expr, what) \
  DEJA_RETURN_IF_ERROR(::deja::kernels::cuda::CublasStatus((expr), (what)))

// Move-only owner of one cudaMalloc allocation (the backend's own buffers; tensors it hands out
// own their memory through Tensor::Adopt).
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

class Stream {
 public:
  Stream() = default;
  // A non-blocking stream: it does not synchronise with the legacy default stream.
  static StatusOr<Stream> Create();
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

class Event {
 public:
  Event() = default;
  // A timing event (cudaEventDefault).
  static StatusOr<Event> Create();
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  cudaEvent_t get() const { return event_; }
  Status Record(cudaStream_t stream);
  Status Synchronize();
  // Milliseconds from `start` to this event; both must have completed.
  StatusOr<float> MillisecondsSince(const Event& start) const;

 private:
  cudaEvent_t event_ = nullptr;
};

class CublasHandle {
 public:
  CublasHandle() = default;
  // A handle bound to `stream`, using `workspace` (which must outlive it) instead of allocating
  // its own, so GEMMs can be captured in CUDA graphs.
  static StatusOr<CublasHandle> Create(cudaStream_t stream, const DeviceBuffer& workspace);
  ~CublasHandle();
  CublasHandle(CublasHandle&& other) noexcept;
  CublasHandle& operator=(CublasHandle&& other) noexcept;
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;

  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

// Scratch device memory that grows to the largest request and is reused across ops on one
// stream. Growing waits for the stream first, so no enqueued kernel still reads the old block;
// run each shape once before capturing a CUDA graph so capture never allocates.
class Workspace {
 public:
  StatusOr<void*> Get(size_t bytes, cudaStream_t stream);

 private:
  DeviceBuffer buffer_;
};

}  // namespace deja::kernels::cuda
