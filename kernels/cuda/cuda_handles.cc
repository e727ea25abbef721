// The RAII handles of cuda_handles.h and the CUDA/cuBLAS/cuBLASLt error translation.
#include "kernels/cuda/cuda_handles.h"

#include <algorithm>
#include <atomic>
#include <string>
#include <utility>

namespace deja::kernels::cuda {

Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return Status::Ok();
  std::string m =
      std::string(what) + ": " + cudaGetErrorName(error) + ": " + cudaGetErrorString(error);
  switch (error) {
    case cudaErrorMemoryAllocation:
      return ResourceExhausted(std::move(m));
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorStubLibrary:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      return Unavailable(std::move(m));
    default:
      return Internal(std::move(m));
  }
}

Status CublasStatus(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  std::string m =
      std::string(what) + ": " + cublasGetStatusName(status) + ": " + cublasGetStatusString(status);
  if (status == CUBLAS_STATUS_ALLOC_FAILED) return ResourceExhausted(std::move(m));
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return Unimplemented(std::move(m));
  return Internal(std::move(m));
}

Status CublasLtStatus(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  std::string m = std::string(what) + ": " + cublasLtGetStatusName(status) + ": " +
                  cublasLtGetStatusString(status);
  if (status == CUBLAS_STATUS_ALLOC_FAILED) return ResourceExhausted(std::move(m));
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) return Unimplemented(std::move(m));
  return Internal(std::move(m));
}

StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  DeviceBuffer b;
  if (bytes == 0) return b;
  DEJA_CUDA_RETURN_IF_ERROR(cudaMalloc(&b.data_, bytes),
                            ("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str());
  b.bytes_ = bytes;
  return b;
}

DeviceBuffer::~DeviceBuffer() { Release(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::Release() {
  // A failing free (a dead context) leaves nothing to recover; the memory goes with the context.
  if (data_ != nullptr) cudaFree(data_);
  data_ = nullptr;
  bytes_ = 0;
}

StatusOr<Stream> Stream::Create() {
  Stream s;
  DEJA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s.stream_, cudaStreamNonBlocking),
                            "cudaStreamCreateWithFlags");
  return s;
}

Stream::~Stream() {
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

Stream::Stream(Stream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

StatusOr<Event> Event::Create() {
  Event e;
  DEJA_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e.event_), "cudaEventCreate");
  return e;
}

Event::~Event() {
  if (event_ != nullptr) cudaEventDestroy(event_);
}

Event::Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (event_ != nullptr) cudaEventDestroy(event_);
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

Status Event::Record(cudaStream_t stream) {
  return CudaStatus(cudaEventRecord(event_, stream), "cudaEventRecord");
}

Status Event::Synchronize() {
  return CudaStatus(cudaEventSynchronize(event_), "cudaEventSynchronize");
}

StatusOr<float> Event::MillisecondsSince(const Event& start) const {
  float ms = 0;
  DEJA_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start.event_, event_),
                            "cudaEventElapsedTime");
  return ms;
}

StatusOr<CublasHandle> CublasHandle::Create(cudaStream_t stream, const DeviceBuffer& workspace) {
  CublasHandle h;
  DEJA_CUBLAS_RETURN_IF_ERROR(cublasCreate(&h.handle_), "cublasCreate");
  DEJA_CUBLAS_RETURN_IF_ERROR(cublasSetStream(h.handle_, stream), "cublasSetStream");
  DEJA_CUBLAS_RETURN_IF_ERROR(cublasSetWorkspace(h.handle_, workspace.data(), workspace.bytes()),
                              "cublasSetWorkspace");
  return h;
}

CublasHandle::~CublasHandle() {
  if (handle_ != nullptr) cublasDestroy(handle_);
}

CublasHandle::CublasHandle(CublasHandle&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)) {}

CublasHandle& CublasHandle::operator=(CublasHandle&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) cublasDestroy(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

StatusOr<CublasLtHandle> CublasLtHandle::Create() {
  CublasLtHandle h;
  DEJA_CUBLASLT_RETURN_IF_ERROR(cublasLtCreate(&h.handle_), "cublasLtCreate");
  return h;
}

CublasLtHandle::~CublasLtHandle() {
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

CublasLtHandle::CublasLtHandle(CublasLtHandle&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)) {}

CublasLtHandle& CublasLtHandle::operator=(CublasLtHandle&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) cublasLtDestroy(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

namespace {
std::atomic<uint64_t> workspace_reallocations{0};
}  // namespace

uint64_t Workspace::Reallocations() { return workspace_reallocations.load(); }

StatusOr<void*> Workspace::Get(size_t bytes, cudaStream_t stream) {
  if (bytes <= buffer_.bytes()) return buffer_.data();
  workspace_reallocations.fetch_add(1);
  DEJA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "cudaStreamSynchronize (workspace)");
  buffer_ = DeviceBuffer();
  // Round up so a slowly growing shape does not reallocate on every call.
  size_t rounded = std::max<size_t>(bytes + bytes / 4, 1 << 16);
  DEJA_ASSIGN_OR_RETURN(buffer_, DeviceBuffer::Allocate(rounded));
  return buffer_.data();
}

}  // namespace deja::kernels::cuda
