// Helpers of the CUDA comparison tests: the backend under test (or the reason there is none, for
// GTEST_SKIP), host <-> device copies and the CUDA tolerances. Random inputs and the closeness
// check come from the CPU harness (tests/kernels/kernel_test_util.h).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>

#include "common/tensor.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "tests/kernels/kernel_test_util.h"

namespace deja::kernels::testing {

struct CudaUnderTest {
  std::unique_ptr<Backend> backend;
  std::string reason;  // why there is no backend
};

// Made once per test binary.
inline CudaUnderTest& Cuda() {
  static CudaUnderTest* under_test = [] {
    auto* c = new CudaUnderTest;
    auto made = MakeCudaBackend(0);
    if (made.ok()) {
      c->backend = std::move(made).value();
    } else {
      c->reason = made.status().ToString();
    }
    return c;
  }();
  return *under_test;
}

inline cuda::CudaBackend& Device() { return *cuda::AsCuda(*Cuda().backend); }

// Every test starts with this: on a machine without a usable device it skips, printing why.
#define DEJA_REQUIRE_CUDA()                                                          \
  do {                                                                               \
    if (::deja::kernels::testing::Cuda().backend == nullptr) {                       \
      GTEST_SKIP() << "no CUDA device: " << ::deja::kernels::testing::Cuda().reason; \
    }                                                                                \
  } while (0)

// lhs = value of a StatusOr expression, or a fatal test failure naming the status.
#define DEJA_ASSERT_OK_AND_ASSIGN(lhs, expr)                       \
  auto DEJA_CONCAT(deja_test_or_, __LINE__) = (expr);              \
  ASSERT_TRUE(DEJA_CONCAT(deja_test_or_, __LINE__).ok())           \
      << DEJA_CONCAT(deja_test_or_, __LINE__).status().ToString(); \
  lhs = std::move(DEJA_CONCAT(deja_test_or_, __LINE__)).value()

#define DEJA_ASSERT_OK(expr)                                   \
  do {                                                         \
    ::deja::Status deja_test_s_ = (expr);                      \
    ASSERT_TRUE(deja_test_s_.ok()) << deja_test_s_.ToString(); \
  } while (0)

// Linear tolerances (norm-wise, see Close). f16/bf16 weights: the activations are rounded to the
// weight dtype before the GEMM (kernels/cuda/linear.cc), a relative error up to the unit roundoff
// (f16 4.9e-4, bf16 3.9e-3; a host simulation of this grid measured at most 4.8e-4 and 3.5e-3);
// the bounds leave a factor of about 4. f32 weights: f32 GEMM without TF32, the CPU bound.
inline double LinearTolerance(DType weight_dtype) {
  switch (weight_dtype) {
    case DType::kF16:
      return 2e-3;
    case DType::kBF16:
      return 1.6e-2;
    default:
      return kRelTol;
  }
}

}  // namespace deja::kernels::testing
