// Where a tensor's memory is: the host's, or one CUDA device's. Views and tensors carry it so an op
// can refuse memory its backend cannot reach (kernels/ops.cc) instead of dereferencing it.
#pragma once

#include <cstdint>
#include <string>

namespace deja {

enum class DeviceKind : uint8_t { kHost, kCuda };

struct Device {
  DeviceKind kind = DeviceKind::kHost;
  int32_t index = 0;  // which device of its kind (0 for the host)

  static constexpr Device Host() { return {}; }
  static constexpr Device Cuda(int32_t index) { return {DeviceKind::kCuda, index}; }
  bool is_host() const { return kind == DeviceKind::kHost; }
  bool operator==(const Device&) const = default;
  // "host" or "cuda:<index>".
  std::string ToString() const {
    return kind == DeviceKind::kHost ? "host" : "cuda:" + std::to_string(index);
  }
};

}  // namespace deja
