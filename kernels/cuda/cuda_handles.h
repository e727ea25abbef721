// RAII owners of the CUDA runtime, cuBLAS and cuBLASLt handles the backend uses (device buffer,
// stream, event, cuBLAS handle, cuBLASLt handle and descriptors, a grow-only device workspace) and
// the translation of CUDA/cuBLAS/cuBLASLt error codes into Status. Internal to kernels/cuda/: this
// header exposes CUDA types.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "common/status.h"

namespace deja::kernels::cuda {

// Ok for cudaSuccess; otherwise ResourceExhausted (out of memory), Unavailable (no device or
// driver) or Internal, with `what` and CUDA's name and description of the error.
Status CudaStatus(cudaError_t error, const char* what);
Status CublasStatus(cublasStatus_t status, const char* what);
// The same for cuBLASLt calls (named with cuBLASLt's own status strings, so the cuBLASLt code
// needs nothing from libcublas).
Status CublasLtStatus(cublasStatus_t status, const char* what);

#define DEJA_CUDA_RETURN_IF_ERROR(expr, what) \
  DEJA_RETURN_IF_ERROR(::deja::kernels::cuda::CudaStatus((expr), (what)))
#define DEJA_CUBLAS_RETURN_IF_ERROR(expr, what) \
  DEJA_RETURN_IF_ERROR(::deja::kernels::cuda::CublasStatus((expr), (what)))
#define DEJA_CUBLASLT_RETURN_IF_ERROR(expr, what) \
  DEJA_RETURN_IF_ERROR(::deja::kernels::cuda::CublasLtStatus((expr), (what)))

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

// A cuBLASLt handle. cuBLASLt takes the stream and the workspace per call (cublasLtMatmul), so
// the handle binds neither.
class CublasLtHandle {
 public:
  CublasLtHandle() = default;
  static StatusOr<CublasLtHandle> Create();
  ~CublasLtHandle();
  CublasLtHandle(CublasLtHandle&& other) noexcept;
  CublasLtHandle& operator=(CublasLtHandle&& other) noexcept;
  CublasLtHandle(const CublasLtHandle&) = delete;
  CublasLtHandle& operator=(const CublasLtHandle&) = delete;

  cublasLtHandle_t get() const { return handle_; }

 private:
  cublasLtHandle_t handle_ = nullptr;
};

// Move-only owner of one cuBLASLt descriptor (host memory only; no handle or device involved):
// `T` the opaque pointer type, `Destroy` its destroy function. Created by the caller through
// `out()`, e.g. cublasLtMatmulDescCreate(desc.out(), ...).
template <typename T, cublasStatus_t (*Destroy)(T)>
class LtDescriptor {
 public:
  LtDescriptor() = default;
  ~LtDescriptor() { Reset(); }
  LtDescriptor(LtDescriptor&& other) noexcept : p_(std::exchange(other.p_, nullptr)) {}
  LtDescriptor& operator=(LtDescriptor&& other) noexcept {
    if (this != &other) {
      Reset();
      p_ = std::exchange(other.p_, nullptr);
    }
    return *this;
  }
  LtDescriptor(const LtDescriptor&) = delete;
  LtDescriptor& operator=(const LtDescriptor&) = delete;

  T get() const { return p_; }
  // Releases any held descriptor and returns where a create function writes the new one.
  T* out() {
    Reset();
    return &p_;
  }

 private:
  void Reset() {
    if (p_ != nullptr) Destroy(p_);
    p_ = nullptr;
  }
  T p_ = nullptr;
};

using LtMatmulDesc = LtDescriptor<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using LtMatrixLayout = LtDescriptor<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using LtMatmulPreference =
    LtDescriptor<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

// Scratch device memory that grows to the largest request and is reused across ops on one
// stream. Growing waits for the stream first, so no enqueued kernel still reads the old block;
// run each shape once before capturing a CUDA graph so capture never allocates.
class Workspace {
 public:
  StatusOr<void*> Get(size_t bytes, cudaStream_t stream);
  // How many times any workspace of the process has been reallocated (graphs captured before a
  // reallocation may point at the freed buffer: Backend::graph_epoch).
  static uint64_t Reallocations();

 private:
  DeviceBuffer buffer_;
};

}  // namespace deja::kernels::cuda
