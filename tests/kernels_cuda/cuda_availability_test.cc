// MakeCudaBackend answers with a Status on every machine and build: a working backend where a
// device exists, Unavailable with the reason where none does (or CUDA is not built), and never a
// crash. Runs in every configuration (label unit).
#include <gtest/gtest.h>

#include <cstdio>

#include "kernels/backend.h"

namespace deja::kernels {
namespace {

TEST(CudaAvailability, BackendOrUnavailableWithReason) {
  auto made = MakeCudaBackend(0);
  if (made.ok()) {
    Backend& b = **made;
    EXPECT_EQ(b.kind(), BackendKind::kCuda);
    EXPECT_FALSE(b.name().empty());
    EXPECT_TRUE(b.Supports(OpId::kLinear, DType::kBF16));
    EXPECT_TRUE(b.Supports(OpId::kAttention, DType::kF32));
    EXPECT_FALSE(b.Supports(OpId::kAttention, DType::kF16));
    return;
  }
  EXPECT_EQ(made.status().code(), StatusCode::kUnavailable) << made.status().ToString();
  EXPECT_FALSE(made.status().message().empty());
  std::printf("[ note ] MakeCudaBackend(0): %s\n", made.status().ToString().c_str());
}

TEST(CudaAvailability, BadDeviceIsAnErrorNotACrash) {
  for (int device : {-1, 1 << 20}) {
    auto made = MakeCudaBackend(device);
    ASSERT_FALSE(made.ok()) << "device " << device;
    EXPECT_TRUE(made.status().code() == StatusCode::kUnavailable ||
                made.status().code() == StatusCode::kInvalidArgument)
        << made.status().ToString();
  }
}

TEST(CudaAvailability, RepeatedCallsAgree) {
  // The runtime's first-call initialisation must not make a later answer differ.
  auto first = MakeCudaBackend(0);
  auto second = MakeCudaBackend(0);
  EXPECT_EQ(first.ok(), second.ok());
  if (!first.ok()) {
    EXPECT_EQ(first.status().code(), second.status().code());
  }
}

}  // namespace
}  // namespace deja::kernels
