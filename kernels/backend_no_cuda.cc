// MakeCudaBackend for builds without the CUDA backend: callers get a clear Unavailable.
#include "kernels/backend.h"

namespace deja::kernels {

StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device) {
  return Unavailable("deja was built without the CUDA backend");
}

StatusOr<DevicePeaks> MeasureDevicePeaks(Backend& backend) {
  return Unimplemented("backend " + backend.name() + " has no device peaks to measure");
}

}  // namespace deja::kernels
