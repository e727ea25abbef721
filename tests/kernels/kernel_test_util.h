// Helpers of the kernel comparison harness: seeded random tensors, the backends under test and a
// norm-wise closeness check against the reference.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/tensor.h"
#include "kernels/backend.h"

namespace deja::kernels::testing {

// Backends compared against the reference: the CPU backend with all cores and with one thread
// (the threaded split must not change results), and CUDA when this build and machine have it.
struct BackendCase {
  std::string label;
  std::unique_ptr<Backend> backend;
};

// Built once per test binary (each CPU backend owns a thread pool).
inline std::vector<BackendCase>& BackendsUnderTest() {
  static std::vector<BackendCase>* cases = [] {
    auto* out = new std::vector<BackendCase>;
    out->push_back({"cpu", MakeCpuBackend(0)});
    out->push_back({"cpu_1thread", MakeCpuBackend(1)});
    // Three threads on a two-core box exercise uneven chunking and the sleep/wake path.
    out->push_back({"cpu_3threads", MakeCpuBackend(3)});
    // The CUDA backend takes device pointers: tests/kernels_cuda compares it on device memory.
    return out;
  }();
  return *cases;
}

inline const std::vector<DType>& WeightDTypes() {
  static const std::vector<DType> kTypes = {DType::kF32, DType::kF16, DType::kBF16};
  return kTypes;
}

// Uniform values in [lo, hi) stored in `dtype` (rounded there, so every backend reads exactly the
// same weights).
inline Tensor RandomTensor(std::mt19937& rng, DType dtype, Shape shape, float lo = -1.f,
                           float hi = 1.f) {
  Tensor t = Tensor::Empty(dtype, shape);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) StoreFromFloat(t.data(), dtype, i, dist(rng));
  return t;
}

inline Tensor CopyOf(const Tensor& t) {
  Tensor c = Tensor::Empty(t.dtype(), t.shape());
  std::memcpy(c.data(), t.data(), t.bytes());
  return c;
}

// Per-dtype tolerances (STYLE.md rule 3). f16/bf16 weights are widened exactly and bf16 weights
// see x rounded to bf16 in the reference as in the backends (kernels/op_table.h), so all weight
// dtypes share the f32 bound: only summation order differs.
constexpr double kRelTol = 1e-5;

// ||got - want|| / ||want|| <= rel_tol and max |got - want| <= 10 * rel_tol * max |want|:
// the norm-wise bound for the bulk, the max-abs bound so no single element may be far off.
inline ::testing::AssertionResult Close(const float* got, const float* want, int64_t n,
                                        double rel_tol = kRelTol) {
  double diff2 = 0, ref2 = 0, max_diff = 0, max_ref = 0;
  int64_t worst = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(got[i]) != std::isnan(want[i])) {
      return ::testing::AssertionFailure()
             << "NaN mismatch at " << i << ": got " << got[i] << ", want " << want[i];
    }
    if (std::isnan(want[i])) continue;
    double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    diff2 += d * d;
    ref2 += static_cast<double>(want[i]) * want[i];
    if (d > max_diff || worst < 0) {
      max_diff = d;
      worst = i;
    }
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(want[i])));
  }
  double rel = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  double max_bound = 10 * rel_tol * std::max(max_ref, 1e-30);
  if (rel <= rel_tol && max_diff <= max_bound) return ::testing::AssertionSuccess();
  auto f = ::testing::AssertionFailure();
  f << "relative error " << rel << " (tol " << rel_tol << "), max abs error " << max_diff
    << " (bound " << max_bound << ")";
  if (worst >= 0) f << " at " << worst << ": got " << got[worst] << ", want " << want[worst];
  return f;
}

// The base seed of a comparison test binary: DEJA_TEST_SEED when set (to replay a failure), else
// a fresh random one; printed once with the binary's name.
inline uint32_t BaseSeed(const char* binary) {
  static const uint32_t seed = [binary] {
    const char* env = std::getenv("DEJA_TEST_SEED");
    uint32_t s = env != nullptr ? static_cast<uint32_t>(std::strtoul(env, nullptr, 10))
                                : std::random_device{}();
    std::printf("%s seed: %u (replay with DEJA_TEST_SEED=%u)\n", binary, s, s);
    return s;
  }();
  return seed;
}

// n_rows indices into [0, r): unsorted, with repeats whenever n_rows > r / 2 allows them.
inline std::vector<int32_t> RandomRows(std::mt19937& rng, int64_t r, int64_t n_rows) {
  std::vector<int32_t> rows(static_cast<size_t>(n_rows));
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(r - 1));
  for (auto& v : rows) v = pick(rng);
  return rows;
}

}  // namespace deja::kernels::testing
