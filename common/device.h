// Where a tensor's memory is: the host's, or one CUDA device's. Views and tensors carry it so an op
// can refuse memory its backend cannot reach (kernels/ops.cc) instead of dereferencing it.
#pragma once

#include <cstdint>
#include <string>

namespace deja {

// kSim: the tests' simulated device (tests/common/sim_device.h), host memory that only its
// backend's ops and copies may touch.
enum class DeviceKind : uint8_t { kHost, kCuda, kSim };

struct Device {
  DeviceKind kind = DeviceKind::kHost;
  int32_t index = 0;  // which device of its kind (0 for the host)

  static constexpr Device Host() { return {}; }
  static constexpr Device Cuda(int32_t index) { return {DeviceKind::kCuda, index}; }
  bool is_host() const { return kind == DeviceKind::kHost; }
  bool operator==(const Device&) const = default;
  // "host", "cuda:<index>" or "sim:<index>".
  std::string ToString() const {
    if (kind == DeviceKind::kHost) return "host";
    return (kind == DeviceKind::kCuda ? "cuda:" : "sim:") + std::to_string(index);
  }
};

}  // namespace deja
