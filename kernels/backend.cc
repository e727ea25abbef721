// The host memory defaults of Backend and the whole-tensor copies every backend shares.
#include "kernels/backend.h"

#include <cstring>
#include <string>

namespace deja::kernels {
namespace {

// The defaults serve host backends only: a device backend that forgot one must not memcpy its
// device pointers.
Status RequireHost(const Backend& b, const char* what) {
  if (b.device().is_host()) return Status::Ok();
  return Internal(std::string(what) + ": backend " + b.name() + " on " + b.device().ToString() +
                  " does not implement it");
}

Status CheckRowMajor(const char* what, const TensorView& v) {
  if (v.layout == Layout::kRowMajor) return Status::Ok();
  return InvalidArgument(std::string(what) +
                         ": copies row-major views only (copy a tiled view's storage tensor)");
}

}  // namespace

StatusOr<Tensor> Backend::Allocate(DType dtype, Shape shape) {
  DEJA_RETURN_IF_ERROR(RequireHost(*this, "Allocate"));
  return Tensor::Empty(dtype, shape);
}

Status Backend::CopyHostToDevice(void* dst, const void* host_src, size_t bytes) {
  DEJA_RETURN_IF_ERROR(RequireHost(*this, "CopyHostToDevice"));
  if (bytes > 0) std::memcpy(dst, host_src, bytes);
  return Status::Ok();
}

Status Backend::CopyDeviceToHost(void* host_dst, const void* src, size_t bytes) {
  DEJA_RETURN_IF_ERROR(RequireHost(*this, "CopyDeviceToHost"));
  if (bytes > 0) std::memcpy(host_dst, src, bytes);
  return Status::Ok();
}

Status Backend::Synchronize() { return RequireHost(*this, "Synchronize"); }

Status Backend::Memset(void* dst, int value, size_t bytes) {
  DEJA_RETURN_IF_ERROR(RequireHost(*this, "Memset"));
  if (bytes > 0) std::memset(dst, value, bytes);
  return Status::Ok();
}

StatusOr<Tensor> Backend::AllocatePinned(size_t bytes) {
  return Tensor::Empty(DType::kF32, Shape{static_cast<int64_t>((bytes + 3) / 4)});
}

Status Backend::MemoryInfo(size_t*, size_t*) {
  return Unimplemented("backend " + name() + " has no device memory to report");
}

StatusOr<Tensor> Backend::ToBackend(const TensorView& host) {
  DEJA_RETURN_IF_ERROR(CheckRowMajor("ToBackend", host));
  if (!host.device.is_host()) {
    return InvalidArgument("ToBackend: the source is in " + host.device.ToString() +
                           " memory, not the host's");
  }
  DEJA_ASSIGN_OR_RETURN(Tensor t, Allocate(host.dtype, host.shape));
  DEJA_RETURN_IF_ERROR(CopyHostToDevice(t.data(), host.data, host.bytes()));
  return t;
}

StatusOr<Tensor> Backend::ToHost(const TensorView& v) {
  DEJA_RETURN_IF_ERROR(CheckRowMajor("ToHost", v));
  Tensor t = Tensor::Empty(v.dtype, v.shape);
  if (v.device.is_host()) {
    if (v.bytes() > 0) std::memcpy(t.data(), v.data, v.bytes());
    return t;
  }
  if (!(v.device == device())) {
    return InvalidArgument("ToHost: the source is in " + v.device.ToString() +
                           " memory, but backend " + name() + " is on " + device().ToString());
  }
  DEJA_RETURN_IF_ERROR(CopyDeviceToHost(t.data(), v.data, v.bytes()));
  return t;
}

}  // namespace deja::kernels
