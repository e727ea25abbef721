// The kernel comparison harness (after llama.cpp's test-backend-ops): each op case is written
// once as a check against the reference backend on the host, and runs on every backend under
// test (a gtest parameter: the CPU backend with one thread per core, one thread and three, and
// CUDA device 0). A check copies its inputs to the backend's device with Backend::ToBackend, runs
// the op there and copies the result back with Backend::ToHost; on host backends the copies are
// memcpys. A backend that cannot be made (no CUDA device, or a build without CUDA) skips every
// case, printing why; an (op, dtype, layout) a backend does not support is skipped with a note.
// Also seeded random tensors and the norm-wise closeness check.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/kv_row.h"
#include "common/tensor.h"
#include "kernels/backend.h"

namespace deja::kernels::testing {

// ---- Backends under test ----

// A backend by its parameter name, or why there is none.
struct BackendUnderTest {
  std::unique_ptr<Backend> backend;
  std::string reason;
};

// Made once per test binary, on first use (so listing the tests makes none): "reference", "cpu"
// (one thread per core), "cpu_1thread", "cpu_3threads" (three threads on a two-core box exercise
// uneven chunking and the sleep/wake path) and "cuda" (device 0).
inline BackendUnderTest& BackendNamed(const std::string& name) {
  static auto* made = new std::map<std::string, BackendUnderTest>;
  auto it = made->find(name);
  if (it != made->end()) return it->second;
  BackendUnderTest b;
  if (name == "reference") {
    b.backend = MakeReferenceBackend();
  } else if (name == "cpu") {
    b.backend = MakeCpuBackend(0);
  } else if (name == "cpu_1thread") {
    b.backend = MakeCpuBackend(1);
  } else if (name == "cpu_3threads") {
    b.backend = MakeCpuBackend(3);
  } else if (name == "cuda") {
    auto cuda = MakeCudaBackend(0);
    if (cuda.ok()) {
      b.backend = std::move(cuda).value();
    } else {
      b.reason = cuda.status().ToString();
    }
  } else {
    b.reason = "no backend is called '" + name + "'";
  }
  return (*made)[name] = std::move(b);
}

// The backends compared against the reference.
inline std::vector<std::string> ComparedBackends() {
  return {"cpu", "cpu_1thread", "cpu_3threads", "cuda"};
}
// Those and the reference itself, for checks that do not take the reference as ground truth
// (known answers, identities between ops).
inline std::vector<std::string> AllBackends() {
  std::vector<std::string> names = {"reference"};
  for (const std::string& n : ComparedBackends()) names.push_back(n);
  return names;
}

// The CPU backends, for the tests of CPU-only machinery (SIMD targets, the bf16 dot path).
struct NamedBackend {
  std::string label;
  Backend* backend;
};
inline const std::vector<NamedBackend>& CpuBackends() {
  static const auto* cpus =
      new std::vector<NamedBackend>{{"cpu", BackendNamed("cpu").backend.get()},
                                    {"cpu_1thread", BackendNamed("cpu_1thread").backend.get()},
                                    {"cpu_3threads", BackendNamed("cpu_3threads").backend.get()}};
  return *cpus;
}

// A test run once per backend name; skips, printing why, where that backend cannot be made.
class BackendTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    BackendUnderTest& b = BackendNamed(GetParam());
    if (b.backend == nullptr) GTEST_SKIP() << "no " << GetParam() << " backend: " << b.reason;
    backend_ = b.backend.get();
  }
  Backend& backend() const { return *backend_; }

 private:
  Backend* backend_ = nullptr;
};

// Test names end in the backend's name (Backends/CompareLinear.ShapeGrid/cuda): the CMake file
// labels the cuda ones gpu by that suffix.
#define DEJA_INSTANTIATE_BACKEND_TEST(suite, names) \
  INSTANTIATE_TEST_SUITE_P(                         \
      Backends, suite, ::testing::ValuesIn(names),  \
      [](const ::testing::TestParamInfo<std::string>& info) { return info.param; })

// Why `b` does not run `op` over `dtype` (weights, or the KV cache for attention) in `layout`, or
// "" when it does.
inline std::string Unsupported(const Backend& b, OpId op, DType dtype,
                               Layout layout = Layout::kRowMajor) {
  if (!b.Supports(op, dtype)) {
    return b.name() + " does not run " + OpName(op) + " over " + DTypeName(dtype);
  }
  if (layout == Layout::kTiled16 && !b.SupportsTiled(op)) {
    return b.name() + " does not read kTiled16 weights in " + OpName(op);
  }
  return "";
}

// Whether `b` runs the combination; where not, the case is skipped rather than failed, with a
// note printed once per test (not gtest's skip marker: the test's other cases did run).
inline bool Runs(const Backend& b, OpId op, DType dtype, Layout layout = Layout::kRowMajor) {
  const std::string why = Unsupported(b, op, dtype, layout);
  if (why.empty()) return true;
  static auto* noted = new std::set<std::string>;
  const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string key =
      test != nullptr ? std::string(test->test_suite_name()) + "." + test->name() + why : why;
  if (noted->insert(key).second) {
    std::printf("[   note   ] cases skipped: %s\n", why.c_str());
  }
  return false;
}

// Skips the whole test, with the reason, where `b` does not run (op, dtype[, layout]).
#define DEJA_SKIP_UNLESS_SUPPORTED(b, ...)                                                 \
  do {                                                                                     \
    const std::string deja_why_ = ::deja::kernels::testing::Unsupported((b), __VA_ARGS__); \
    if (!deja_why_.empty()) GTEST_SKIP() << deja_why_;                                     \
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

// ---- Inputs ----

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

// A KV cache of `rows` rows of head_dim (common/kv_row.h) holding uniform values in [lo, hi)
// rounded to `dtype`: [rows, head_dim] for f32 and f16, int8 rows with their scales
// [rows, head_dim + 4] for int8.
inline Tensor RandomKvRows(std::mt19937& rng, DType dtype, int64_t rows, int64_t head_dim,
                           float lo = -1.f, float hi = 1.f) {
  if (dtype != DType::kI8) return RandomTensor(rng, dtype, {rows, head_dim}, lo, hi);
  Tensor x = RandomTensor(rng, DType::kF32, {rows, head_dim}, lo, hi);
  Tensor t = Tensor::Empty(DType::kI8, {rows, KvRowElems(DType::kI8, head_dim)});
  for (int64_t r = 0; r < rows; ++r) {
    KvRowFromF32(x.as<float>() + r * head_dim, head_dim, DType::kI8,
                 t.as<int8_t>() + r * KvRowElems(DType::kI8, head_dim));
  }
  return t;
}

// The KV cache dtypes the comparison tests cover.
inline const std::vector<DType>& KvDTypes() {
  static const std::vector<DType> kTypes = {DType::kF32, DType::kF16, DType::kI8};
  return kTypes;
}

inline Tensor CopyOf(const Tensor& t) {
  Tensor c = Tensor::Empty(t.dtype(), t.shape());
  std::memcpy(c.data(), t.data(), t.bytes());
  return c;
}

// |t| element-wise, in t's dtype (exact: only the sign changes).
inline Tensor AbsCopy(const Tensor& t) {
  Tensor c = Tensor::Empty(t.dtype(), t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) {
    StoreFromFloat(c.data(), t.dtype(), static_cast<size_t>(i),
                   std::fabs(LoadAsFloat(t.data(), t.dtype(), static_cast<size_t>(i))));
  }
  return c;
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

// ---- Tolerances ----

// Per-dtype tolerances (STYLE.md rule 3). f16/bf16 weights are widened exactly and bf16 weights
// see x rounded to bf16 in the reference as in the host backends (kernels/op_table.h), so all
// weight dtypes share the f32 bound: only summation order differs.
constexpr double kRelTol = 1e-5;

// Linear's bound on `b`. CUDA with f16/bf16 weights rounds the activations to the weight dtype
// before the GEMM (kernels/cuda/linear.cc), a relative error up to the unit roundoff (f16 4.9e-4,
// bf16 3.9e-3; a host simulation of the grid measured at most 4.8e-4 and 3.5e-3); the bounds leave
// a factor of about 4. f32 weights there: f32 GEMM without TF32, the shared bound.
inline double LinearTolerance(const Backend& b, DType weight_dtype) {
  if (b.kind() != BackendKind::kCuda) return kRelTol;
  switch (weight_dtype) {
    case DType::kF16:
      return 2e-3;
    case DType::kBF16:
      return 1.6e-2;
    default:
      return kRelTol;
  }
}

// ||got - want|| / ||want|| <= rel_tol and max |got - want| <= 10 * rel_tol * max |want|:
// the norm-wise bound for the bulk, the max-abs bound so no single element may be far off.
// `magnitude`, when given, is per element the sum of the magnitudes of the terms that make it
// (the same op on |inputs|): an element whose terms cancel to near zero is then held to the
// accuracy of its terms, the most f32 arithmetic can give, rather than to its own size.
inline ::testing::AssertionResult Close(const float* got, const float* want, int64_t n,
                                        double rel_tol = kRelTol,
                                        const float* magnitude = nullptr) {
  double diff2 = 0, ref2 = 0, max_diff = 0, max_ref = 0;
  int64_t worst = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(got[i]) != std::isnan(want[i])) {
      return ::testing::AssertionFailure()
             << "NaN mismatch at " << i << ": got " << got[i] << ", want " << want[i];
    }
    if (std::isnan(want[i])) continue;
    double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double size = std::max(std::fabs(static_cast<double>(want[i])),
                                 magnitude != nullptr ? std::fabs(magnitude[i]) : 0.0);
    diff2 += d * d;
    ref2 += size * size;
    if (d > max_diff || worst < 0) {
      max_diff = d;
      worst = i;
    }
    max_ref = std::max(max_ref, size);
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

// The tensors of one attention call copied to a backend (the harness writes each case once).
struct AttentionTensors {
  Tensor q, k, v, slot_pos, score, out;
};
inline StatusOr<AttentionTensors> AttentionOn(Backend& b, const Tensor& q, const Tensor& k,
                                              const Tensor& v, const Tensor& slot_pos,
                                              const Tensor& score, const Tensor& out) {
  AttentionTensors t;
  for (auto [dst, src] : {std::pair{&t.q, &q}, {&t.k, &k}, {&t.v, &v}, {&t.slot_pos, &slot_pos},
                          {&t.score, &score}, {&t.out, &out}}) {
    DEJA_ASSIGN_OR_RETURN(*dst, b.ToBackend(*src));
  }
  return t;
}

}  // namespace deja::kernels::testing
