// The Deja Vu sparse kernels of every backend under test against the reference: gather-GEMV,
// gather-transposed-GEMV and head-sparse attention, on fresh random inputs (the seed comes from
// std::random_device and is printed; DEJA_TEST_SEED=<n> replays it). Also the identities that tie
// them to the dense ops, on every backend and the reference: a gather over all rows in order is
// Linear, the transposed gather over all rows is Linear with the transposed weight, and attention
// over a subset of heads equals the dense attention's output for those heads and updates only
// their scores.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "hwy/targets.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace deja::kernels {
namespace {

using testing::AbsCopy;
using testing::AllBackends;
using testing::AttentionOn;
using testing::AttentionTensors;
using testing::BackendTest;
using testing::Close;
using testing::ComparedBackends;
using testing::CopyOf;
using testing::CpuBackends;
using testing::RandomTensor;
using testing::Runs;
using testing::WeightDTypes;

// Tolerance: f32 accumulation in every backend, weights widened exactly, so only summation order
// differs from the reference's double sums: the shared f32 bound (kernel_test_util.h), relative to
// the magnitude of each output's terms (a single product plus a bias can cancel to near zero).
constexpr double kTol = testing::kRelTol;

uint32_t BaseSeed() { return testing::BaseSeed("compare_gather_test"); }
using testing::RandomRows;

struct GatherCase {
  int64_t m, r, k, n_rows;  // x [m, k], w [r, k], n_rows selected rows
  DType dtype;
  bool bias, relu, accumulate;
  std::string Label() const {
    return "M=" + std::to_string(m) + " R=" + std::to_string(r) + " K=" + std::to_string(k) +
           " n_rows=" + std::to_string(n_rows) + " " + DTypeName(dtype) + (bias ? " bias" : "") +
           (relu ? " relu" : "") + (accumulate ? " accumulate" : "");
  }
};

void CheckGatherLinear(Backend& b, const GatherCase& c, uint32_t seed) {
  SCOPED_TRACE(c.Label() + " seed=" + std::to_string(seed));
  std::mt19937 rng(seed);
  Tensor x = RandomTensor(rng, DType::kF32, {c.m, c.k});
  Tensor w = RandomTensor(rng, c.dtype, {c.r, c.k});
  Tensor bias = RandomTensor(rng, c.dtype, {c.r});
  Tensor init = RandomTensor(rng, DType::kF32, {c.m, c.n_rows});
  std::vector<int32_t> rows = RandomRows(rng, c.r, c.n_rows);  // a host array on every backend
  const Activation act = c.relu ? Activation::kRelu : Activation::kNone;
  if (!Runs(b, OpId::kGatherLinear, c.dtype)) return;

  auto ref = MakeReferenceBackend();
  Tensor want = CopyOf(init);
  ASSERT_TRUE(GatherLinear(*ref, x.view(), w.view(), c.bias ? bias.view() : TensorView{},
                           rows.data(), c.n_rows, act, c.accumulate, want.view())
                  .ok());
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_x, b.ToBackend(x));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_w, b.ToBackend(w));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_bias, b.ToBackend(bias));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_out, b.ToBackend(init));
  DEJA_ASSERT_OK(GatherLinear(b, d_x.view(), d_w.view(), c.bias ? d_bias.view() : TensorView{},
                              rows.data(), c.n_rows, act, c.accumulate, d_out.view()));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor got, b.ToHost(d_out.view()));
  Tensor magnitude = AbsCopy(init);
  ASSERT_TRUE(GatherLinear(*ref, AbsCopy(x).view(), AbsCopy(w).view(),
                           c.bias ? AbsCopy(bias).view() : TensorView{}, rows.data(), c.n_rows,
                           Activation::kNone, c.accumulate, magnitude.view())
                  .ok());
  EXPECT_TRUE(Close(got.as<float>(), want.as<float>(), got.numel(), kTol, magnitude.as<float>()));
}

struct GatherTCase {
  int64_t m, r, n, n_rows;  // x [m, n_rows], wt [r, n]
  DType dtype;
  bool accumulate;
  std::string Label() const {
    return "M=" + std::to_string(m) + " R=" + std::to_string(r) + " N=" + std::to_string(n) +
           " n_rows=" + std::to_string(n_rows) + " " + DTypeName(dtype) +
           (accumulate ? " accumulate" : "");
  }
};

void CheckGatherLinearT(Backend& b, const GatherTCase& c, uint32_t seed) {
  SCOPED_TRACE(c.Label() + " seed=" + std::to_string(seed));
  std::mt19937 rng(seed);
  Tensor x = RandomTensor(rng, DType::kF32, {c.m, c.n_rows});
  Tensor wt = RandomTensor(rng, c.dtype, {c.r, c.n});
  Tensor init = RandomTensor(rng, DType::kF32, {c.m, c.n});
  std::vector<int32_t> rows = RandomRows(rng, c.r, c.n_rows);
  if (!Runs(b, OpId::kGatherLinearT, c.dtype)) return;

  auto ref = MakeReferenceBackend();
  Tensor want = CopyOf(init);
  ASSERT_TRUE(
      GatherLinearT(*ref, x.view(), wt.view(), rows.data(), c.n_rows, c.accumulate, want.view())
          .ok());
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_x, b.ToBackend(x));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_wt, b.ToBackend(wt));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_out, b.ToBackend(init));
  DEJA_ASSERT_OK(
      GatherLinearT(b, d_x.view(), d_wt.view(), rows.data(), c.n_rows, c.accumulate, d_out.view()));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor got, b.ToHost(d_out.view()));
  Tensor magnitude = AbsCopy(init);
  ASSERT_TRUE(GatherLinearT(*ref, AbsCopy(x).view(), AbsCopy(wt).view(), rows.data(), c.n_rows,
                            c.accumulate, magnitude.view())
                  .ok());
  EXPECT_TRUE(Close(got.as<float>(), want.as<float>(), got.numel(), kTol, magnitude.as<float>()));
}

// Decode sizes, the largest small-M size, both sides of the BLAS switch and a prefill size.
const int64_t kMs[] = {1, 3, 16, cpu::kLinearSmallMMax, cpu::kLinearSmallMMax + 1, 40};

// Host backends serve with Backend::batch_invariant on (the model sets it at load); the batch
// tests below turn it on for their duration.
class BatchInvariant {
 public:
  explicit BatchInvariant(Backend& b) : b_(b), was_(b.batch_invariant()) {
    if (b.device().is_host()) b.set_batch_invariant(true);
  }
  ~BatchInvariant() { b_.set_batch_invariant(was_); }

 private:
  Backend& b_;
  bool was_;
};

class CompareGatherLinear : public BackendTest {};

TEST_P(CompareGatherLinear, ShapeGrid) {
  // (R, K, n_rows): tiny, odd K (vector tails), n_rows not a multiple of the 4-row block, more
  // selected rows than R (repeats), and an fc1-like 1024 x 2048 at 30% kept.
  const int64_t rkn[][3] = {{1, 1, 1},       {5, 3, 7},       {17, 3, 6},    {37, 70, 37},
                            {255, 1000, 77}, {130, 2049, 65}, {64, 4099, 9}, {1024, 2048, 307}};
  uint32_t seed = BaseSeed();
  int i = 0;
  for (int64_t m : kMs) {
    for (const auto& s : rkn) {
      for (DType dt : WeightDTypes()) {
        const int v = i++ % 8;
        CheckGatherLinear(
            backend(), {m, s[0], s[1], s[2], dt, (v & 1) != 0, (v & 2) != 0, (v & 4) != 0}, seed++);
      }
    }
  }
}

TEST_P(CompareGatherLinear, Epilogues) {
  // Every (bias, relu, accumulate) combination on both kernel paths.
  uint32_t seed = BaseSeed() + 10000;
  for (int64_t m : {1, 3, 40})
    for (DType dt : WeightDTypes())
      for (int v = 0; v < 8; ++v)
        CheckGatherLinear(backend(), {m, 50, 71, 23, dt, (v & 1) != 0, (v & 2) != 0, (v & 4) != 0},
                          seed++);
}

TEST_P(CompareGatherLinear, RowsDoNotDependOnTheBatch) {
  // Each row of x is summed in one order at any batch size (the CUDA kernel's lanes own fixed
  // runs of K and rows of x only share the weights they read; the CPU's streaming kernels when
  // batch-invariant): a row alone equals, bit for bit, the same row in a batch of 40, for bf16
  // and f16 fc1-like weights (int8 takes the same kernel; its weights need scales,
  // compare_int8_test.cc compares it).
  Backend& b = backend();
  BatchInvariant invariant(b);
  std::mt19937 rng(BaseSeed() + 15000);
  const int64_t m = 40, r = 8192, k = 2048, n_rows = 819;
  for (DType dt : {DType::kBF16, DType::kF16}) {
    if (!Runs(b, OpId::kGatherLinear, dt)) continue;
    SCOPED_TRACE(DTypeName(dt));
    Tensor x = RandomTensor(rng, DType::kF32, {m, k});
    Tensor w = RandomTensor(rng, dt, {r, k});
    Tensor bias = RandomTensor(rng, dt, {r});
    std::vector<int32_t> rows = RandomRows(rng, r, n_rows);
    DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_w, b.ToBackend(w));
    DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_bias, b.ToBackend(bias));
    DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_x, b.ToBackend(x));
    DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_all, b.Allocate(DType::kF32, Shape{m, n_rows}));
    DEJA_ASSERT_OK(GatherLinear(b, d_x.view(), d_w.view(), d_bias.view(), rows.data(), n_rows,
                                Activation::kRelu, false, d_all.view()));
    DEJA_ASSERT_OK_AND_ASSIGN(Tensor all, b.ToHost(d_all.view()));
    for (int64_t i : {int64_t{0}, int64_t{17}, m - 1}) {
      Tensor one = Tensor::Empty(DType::kF32, Shape{1, k});
      std::memcpy(one.data(), x.as<float>() + i * k, k * sizeof(float));
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_one, b.ToBackend(one));
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_out, b.Allocate(DType::kF32, Shape{1, n_rows}));
      DEJA_ASSERT_OK(GatherLinear(b, d_one.view(), d_w.view(), d_bias.view(), rows.data(), n_rows,
                                  Activation::kRelu, false, d_out.view()));
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor got, b.ToHost(d_out.view()));
      EXPECT_EQ(0, std::memcmp(got.data(), all.as<float>() + i * n_rows, n_rows * sizeof(float)))
          << "row " << i;
    }
  }
}

DEJA_INSTANTIATE_BACKEND_TEST(CompareGatherLinear, ComparedBackends());

class CompareGatherLinearT : public BackendTest {};

TEST_P(CompareGatherLinearT, ShapeGrid) {
  // (R, N, n_rows): tiny, N not a multiple of the vector width or the 64-column thread block,
  // repeats (n_rows > R) and an out-projection-like pick of 64 of 200 rows.
  const int64_t rnn[][3] = {{1, 1, 1},      {5, 17, 9},       {70, 37, 21}, {1000, 255, 131},
                            {300, 1031, 8}, {2049, 130, 600}, {64, 200, 64}};
  uint32_t seed = BaseSeed() + 20000;
  int i = 0;
  for (int64_t m : kMs) {
    for (const auto& s : rnn) {
      for (DType dt : WeightDTypes()) {
        CheckGatherLinearT(backend(), {m, s[0], s[1], s[2], dt, (i++ % 2) != 0}, seed++);
      }
    }
  }
}

TEST_P(CompareGatherLinearT, ModelSized) {
  // An OPT-1.3B fc2-like W2ᵀ [8192, 2048] with 10% of the rows kept, accumulating or not.
  uint32_t seed = BaseSeed() + 25000;
  int i = 0;
  for (int64_t m : {1, 3, 16, 40})
    for (DType dt : WeightDTypes())
      CheckGatherLinearT(backend(), {m, 8192, 2048, 819, dt, (i++ % 2) != 0}, seed++);
}

TEST_P(CompareGatherLinearT, Accumulate) {
  uint32_t seed = BaseSeed() + 30000;
  for (int64_t m : {1, 7, 16, 40})
    for (DType dt : WeightDTypes())
      for (bool acc : {false, true})
        CheckGatherLinearT(backend(), {m, 90, 333, 45, dt, acc}, seed++);
}

TEST_P(CompareGatherLinearT, RowsDoNotDependOnTheBatch) {
  // Each row of x is summed in one order at any batch size (the CUDA kernel splits the selected
  // rows by shape, never by M; the CPU's streaming kernel when batch-invariant, else sgemm
  // above small M): a row alone equals, bit for bit, the same row in a batch of 40.
  Backend& b = backend();
  BatchInvariant invariant(b);
  if (!Runs(b, OpId::kGatherLinearT, DType::kBF16)) GTEST_SKIP() << "no bf16 gather_linear_t";
  std::mt19937 rng(BaseSeed() + 35000);
  const int64_t m = 40, r = 8192, n = 2048, n_rows = 819;
  Tensor x = RandomTensor(rng, DType::kF32, {m, n_rows});
  Tensor wt = RandomTensor(rng, DType::kBF16, {r, n});
  std::vector<int32_t> rows = RandomRows(rng, r, n_rows);
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_wt, b.ToBackend(wt));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_x, b.ToBackend(x));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_all, b.Allocate(DType::kF32, Shape{m, n}));
  DEJA_ASSERT_OK(
      GatherLinearT(b, d_x.view(), d_wt.view(), rows.data(), n_rows, false, d_all.view()));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor all, b.ToHost(d_all.view()));
  for (int64_t i : {int64_t{0}, int64_t{17}, m - 1}) {
    Tensor one = Tensor::Empty(DType::kF32, Shape{1, n_rows});
    std::memcpy(one.data(), x.as<float>() + i * n_rows, n_rows * sizeof(float));
    DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_one, b.ToBackend(one));
    DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_out, b.Allocate(DType::kF32, Shape{1, n}));
    DEJA_ASSERT_OK(
        GatherLinearT(b, d_one.view(), d_wt.view(), rows.data(), n_rows, false, d_out.view()));
    DEJA_ASSERT_OK_AND_ASSIGN(Tensor got, b.ToHost(d_out.view()));
    EXPECT_EQ(0, std::memcmp(got.data(), all.as<float>() + i * n, n * sizeof(float)))
        << "row " << i;
  }
}

TEST_P(CompareGatherLinearT, ZeroWeightedRowsAddNothingOnTheHost) {
  // A masked Deja Vu plan reduces a sparse row over every unit, its skipped units' x zero, and a
  // gather plan over the union of the batch's units (OptModel::MaskedReduce): on the CPU each
  // output is one fused multiply-add chain over the rows in list order, so both equal, bit for
  // bit, the reduction over the row's own units alone. (The CUDA kernel splits the rows by
  // count, so there the three differ by rounding.)
  Backend& b = backend();
  if (!b.device().is_host()) GTEST_SKIP() << b.name() << ": a device splits the rows by count";
  BatchInvariant invariant(b);
  std::mt19937 rng(BaseSeed() + 36000);
  const int64_t m = 3, r = 2048, n = 768;
  for (DType dt : WeightDTypes()) {
    if (!Runs(b, OpId::kGatherLinearT, dt)) continue;
    if (dt == DType::kI8) continue;  // int8 rows carry scales (applied after the same chains)
    SCOPED_TRACE(DTypeName(dt));
    Tensor wt = RandomTensor(rng, dt, {r, n});
    std::vector<int32_t> all(r), own, some;
    std::iota(all.begin(), all.end(), 0);
    std::bernoulli_distribution pick_own(0.1), pick_union(0.5);
    for (int32_t u : all) {
      const bool is_own = pick_own(rng);
      if (is_own) own.push_back(u);
      if (is_own || pick_union(rng)) some.push_back(u);  // a union holding the own units
    }
    Tensor x = RandomTensor(rng, DType::kF32, {m, static_cast<int64_t>(own.size())});
    // x over a row list: the own units' values, zero elsewhere.
    auto spread = [&](const std::vector<int32_t>& list) {
      Tensor t = Tensor::Zeros(DType::kF32, {m, static_cast<int64_t>(list.size())});
      for (int64_t i = 0; i < m; ++i) {
        for (size_t j = 0, o = 0; j < list.size(); ++j) {
          if (o < own.size() && own[o] == list[j]) {
            t.as<float>()[i * list.size() + j] = x.as<float>()[i * own.size() + o++];
          }
        }
      }
      return t;
    };
    auto reduce = [&](const std::vector<int32_t>& list) {
      Tensor in = spread(list);
      Tensor out = Tensor::Zeros(DType::kF32, {m, n});
      EXPECT_TRUE(GatherLinearT(b, in.view(), wt.view(), list.data(),
                                static_cast<int64_t>(list.size()), false, out.view())
                      .ok());
      return out;
    };
    const Tensor want = reduce(own), over_union = reduce(some), over_all = reduce(all);
    EXPECT_EQ(0, std::memcmp(over_union.data(), want.data(), m * n * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(over_all.data(), want.data(), m * n * sizeof(float)));
  }
}

DEJA_INSTANTIATE_BACKEND_TEST(CompareGatherLinearT, ComparedBackends());

TEST(CpuSimdTargets, Gathers) {
  // Force each compiled target this CPU can run, so the narrower register blocks (AVX2, SSE4)
  // of both kernels are checked as well.
  uint32_t seed = BaseSeed() + 35000;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    for (const auto& cpu : CpuBackends()) {
      SCOPED_TRACE(cpu.label);
      for (int64_t m : {1, 3, 7, 13}) {
        for (DType dt : WeightDTypes()) {
          CheckGatherLinear(*cpu.backend, {m, 41, 71, 19, dt, true, true, true}, seed++);
          CheckGatherLinearT(*cpu.backend, {m, 41, 203, 19, dt, (m & 1) != 0}, seed++);
        }
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

// Identities between ops on one backend, the reference included.
class GatherIdentities : public BackendTest {};

// A gather over every row in order is the dense Linear (same backend).
TEST_P(GatherIdentities, AllRowsInOrderIsLinear) {
  Backend& b = backend();
  uint32_t seed = BaseSeed() + 40000;
  for (int64_t m : {1, 5, 40}) {
    for (DType dt : WeightDTypes()) {
      SCOPED_TRACE("M=" + std::to_string(m) + " " + DTypeName(dt) +
                   " seed=" + std::to_string(seed));
      std::mt19937 rng(seed++);
      const int64_t n = 131, k = 517;
      Tensor x = RandomTensor(rng, DType::kF32, {m, k});
      Tensor w = RandomTensor(rng, dt, {n, k});
      Tensor bias = RandomTensor(rng, dt, {n});
      std::vector<int32_t> rows(n);
      std::iota(rows.begin(), rows.end(), 0);
      if (!Runs(b, OpId::kLinear, dt) || !Runs(b, OpId::kGatherLinear, dt)) continue;
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_x, b.ToBackend(x));
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_w, b.ToBackend(w));
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_bias, b.ToBackend(bias));
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_dense, b.Allocate(DType::kF32, Shape{m, n}));
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_gathered, b.Allocate(DType::kF32, Shape{m, n}));
      DEJA_ASSERT_OK(Linear(b, d_x.view(), d_w.view(), d_bias.view(), Activation::kRelu, false,
                            d_dense.view()));
      DEJA_ASSERT_OK(GatherLinear(b, d_x.view(), d_w.view(), d_bias.view(), rows.data(), n,
                                  Activation::kRelu, false, d_gathered.view()));
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor dense, b.ToHost(d_dense.view()));
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor gathered, b.ToHost(d_gathered.view()));
      // A backend may round x for the GEMM where its gather does not (CUDA's f16/bf16 Linear).
      EXPECT_TRUE(Close(gathered.as<float>(), dense.as<float>(), dense.numel(),
                        testing::LinearTolerance(b, dt)));
    }
  }
}

// The transposed gather over every row in order is Linear with w = wtᵀ.
TEST_P(GatherIdentities, TransposedAllRowsIsLinearOfTranspose) {
  Backend& b = backend();
  uint32_t seed = BaseSeed() + 50000;
  for (int64_t m : {1, 5, 40}) {
    for (DType dt : WeightDTypes()) {
      SCOPED_TRACE("M=" + std::to_string(m) + " " + DTypeName(dt) +
                   " seed=" + std::to_string(seed));
      std::mt19937 rng(seed++);
      const int64_t r = 300, n = 77;
      Tensor x = RandomTensor(rng, DType::kF32, {m, r});
      Tensor wt = RandomTensor(rng, dt, {r, n});
      Tensor w = Tensor::Empty(dt, {n, r});
      for (int64_t j = 0; j < r; ++j)
        for (int64_t c = 0; c < n; ++c)
          StoreFromFloat(w.data(), dt, c * r + j, LoadAsFloat(wt.data(), dt, j * n + c));
      std::vector<int32_t> rows(r);
      std::iota(rows.begin(), rows.end(), 0);
      if (!Runs(b, OpId::kLinear, dt) || !Runs(b, OpId::kGatherLinearT, dt)) continue;
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_x, b.ToBackend(x));
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_w, b.ToBackend(w));
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_wt, b.ToBackend(wt));
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_dense, b.Allocate(DType::kF32, Shape{m, n}));
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_gathered, b.Allocate(DType::kF32, Shape{m, n}));
      DEJA_ASSERT_OK(Linear(b, d_x.view(), d_w.view(), TensorView{}, Activation::kNone, false,
                            d_dense.view()));
      DEJA_ASSERT_OK(
          GatherLinearT(b, d_x.view(), d_wt.view(), rows.data(), r, false, d_gathered.view()));
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor dense, b.ToHost(d_dense.view()));
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor gathered, b.ToHost(d_gathered.view()));
      EXPECT_TRUE(Close(gathered.as<float>(), dense.as<float>(), dense.numel(),
                        testing::LinearTolerance(b, dt)));
    }
  }
}

// Attention over a subset of heads (unsorted) equals the reference's dense attention's output
// for those heads and adds scores only into their rows; the other heads' scores stay exactly as
// they were.
void CheckHeadSubset(Backend& b, int32_t cache_heads, const std::vector<int32_t>& head_ids,
                     int32_t head_dim, int32_t capacity, int32_t used, int32_t tokens,
                     uint32_t seed) {
  SCOPED_TRACE("cache_heads=" + std::to_string(cache_heads) +
               " selected=" + std::to_string(head_ids.size()) +
               " head_dim=" + std::to_string(head_dim) + " used=" + std::to_string(used) +
               " tokens=" + std::to_string(tokens) + " seed=" + std::to_string(seed));
  std::mt19937 rng(seed);
  const int64_t d = head_dim, width = cache_heads * d;
  const int64_t cache = static_cast<int64_t>(cache_heads) * capacity;
  const int32_t heads = static_cast<int32_t>(head_ids.size());
  Tensor q = RandomTensor(rng, DType::kF32, {tokens, width}, -2.f, 2.f);
  Tensor k = RandomTensor(rng, DType::kF32, {cache, d}, -2.f, 2.f);
  Tensor v = RandomTensor(rng, DType::kF32, {cache, d});
  Tensor score0 = RandomTensor(rng, DType::kF32, {cache}, 0.f, 3.f);
  Tensor slot_pos = Tensor::Empty(DType::kI32, {cache});
  std::uniform_int_distribution<int> coin(0, 4);
  for (int64_t i = 0; i < cache; ++i) {
    const int32_t s = static_cast<int32_t>(i % capacity);
    slot_pos.as<int32_t>()[i] = s >= used ? 0 : (coin(rng) == 0 ? -1 : s + 1);
  }
  std::vector<int32_t> q_pos(tokens);  // host arrays on every backend, as head_ids
  for (int32_t t = 0; t < tokens; ++t) q_pos[t] = used - tokens + 1 + t;
  // The selected heads' columns of q, compact.
  Tensor q_sel = Tensor::Empty(DType::kF32, {tokens, heads * d});
  for (int32_t t = 0; t < tokens; ++t)
    for (int32_t i = 0; i < heads; ++i)
      std::copy_n(q.as<float>() + t * width + head_ids[i] * d, d,
                  q_sel.as<float>() + (t * heads + i) * d);
  Tensor garbage = RandomTensor(rng, DType::kF32, {tokens, heads * d}, 50.f, 60.f);

  auto args = [&](const Tensor& qt, const Tensor& kt, const Tensor& vt, const Tensor& spt,
                  const Tensor& score, const Tensor& out) {
    AttentionArgs a;
    a.q = qt.view();
    a.scale = 1.f / std::sqrt(static_cast<float>(d));
    a.q_pos = q_pos.data();
    a.kv = {kt.data(), vt.data(), spt.as<int32_t>(), capacity, used, score.as<float>()};
    a.kv.device = kt.device();
    a.head_dim = head_dim;
    a.out = out.view();
    return a;
  };
  auto ref = MakeReferenceBackend();
  Tensor dense_out = Tensor::Zeros(DType::kF32, {tokens, width});
  Tensor dense_score = CopyOf(score0);
  AttentionArgs dense = args(q, k, v, slot_pos, dense_score, dense_out);
  dense.heads = cache_heads;
  ASSERT_TRUE(Attention(*ref, dense).ok());
  // What the sparse call must produce: the selected heads' outputs, those heads' dense scores and
  // the untouched scores elsewhere.
  std::vector<float> want_out(static_cast<size_t>(tokens * heads * d));
  for (int32_t t = 0; t < tokens; ++t)
    for (int32_t i = 0; i < heads; ++i)
      std::copy_n(dense_out.as<float>() + t * width + head_ids[i] * d, d,
                  want_out.data() + (t * heads + i) * d);
  Tensor want_score = CopyOf(score0);
  for (int32_t h : head_ids)
    std::copy_n(dense_score.as<float>() + h * capacity, capacity,
                want_score.as<float>() + h * capacity);

  DEJA_ASSERT_OK_AND_ASSIGN(AttentionTensors on_b,
                            AttentionOn(b, q_sel, k, v, slot_pos, score0, garbage));
  AttentionArgs sparse = args(on_b.q, on_b.k, on_b.v, on_b.slot_pos, on_b.score, on_b.out);
  sparse.heads = heads;
  sparse.head_ids = head_ids.data();
  sparse.cache_heads = cache_heads;
  DEJA_ASSERT_OK(Attention(b, sparse));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor got, b.ToHost(on_b.out.view()));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor got_score, b.ToHost(on_b.score.view()));
  EXPECT_TRUE(Close(got.as<float>(), want_out.data(), got.numel(), kTol));
  EXPECT_TRUE(Close(got_score.as<float>(), want_score.as<float>(), cache, kTol)) << "scores";
  for (int32_t h = 0; h < cache_heads; ++h) {
    if (std::find(head_ids.begin(), head_ids.end(), h) != head_ids.end()) continue;
    for (int32_t s = 0; s < capacity; ++s) {
      ASSERT_EQ(got_score.as<float>()[h * capacity + s], score0.as<float>()[h * capacity + s])
          << "score of unselected head " << h << " slot " << s << " changed";
    }
  }
}

// Deja Vu at batch > 1 (AttentionArgs::keep): each row attends only the heads it keeps. The
// kept (token, head) pairs equal the call without keep; the others are zero, garbage in out
// notwithstanding. With and without head_ids, at decode and prefill sizes (the CPU's GEMM path).
void CheckKeep(Backend& b, int32_t heads, bool with_ids, int32_t head_dim, int32_t used,
               int32_t tokens, uint32_t seed) {
  SCOPED_TRACE("heads=" + std::to_string(heads) + (with_ids ? " head_ids" : "") +
               " head_dim=" + std::to_string(head_dim) + " used=" + std::to_string(used) +
               " tokens=" + std::to_string(tokens) + " seed=" + std::to_string(seed));
  std::mt19937 rng(seed);
  const int32_t cache_heads = with_ids ? heads + 3 : heads;
  const int32_t capacity = used + 2;
  const int64_t d = head_dim, width = static_cast<int64_t>(heads) * d;
  const int64_t cache = static_cast<int64_t>(cache_heads) * capacity;
  std::vector<int32_t> ids(cache_heads);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(heads);
  Tensor q = RandomTensor(rng, DType::kF32, {tokens, width}, -2.f, 2.f);
  Tensor k = RandomTensor(rng, DType::kF32, {cache, d}, -2.f, 2.f);
  Tensor v = RandomTensor(rng, DType::kF32, {cache, d});
  Tensor slot_pos = Tensor::Empty(DType::kI32, {cache});
  for (int64_t i = 0; i < cache; ++i) {
    const int32_t s = static_cast<int32_t>(i % capacity);
    slot_pos.as<int32_t>()[i] = s >= used ? 0 : s + 1;
  }
  std::vector<int32_t> q_pos(tokens);
  for (int32_t t = 0; t < tokens; ++t) q_pos[t] = used - tokens + 1 + t;
  // About half the pairs kept; the first row keeps none, the last all.
  std::vector<uint8_t> keep(static_cast<size_t>(tokens) * heads);
  for (auto& x : keep) x = static_cast<uint8_t>(rng() % 2);
  std::fill_n(keep.begin(), heads, 0);
  std::fill_n(keep.end() - heads, heads, 1);
  Tensor garbage = RandomTensor(rng, DType::kF32, {tokens, width}, 50.f, 60.f);
  Tensor none;
  auto args = [&](const AttentionTensors& t, const uint8_t* keep_rows) {
    AttentionArgs a;
    a.q = t.q.view();
    a.scale = 1.f / std::sqrt(static_cast<float>(d));
    a.q_pos = q_pos.data();
    a.kv = {t.k.data(), t.v.data(), t.slot_pos.as<int32_t>(), capacity, used, nullptr};
    a.kv.device = t.k.device();
    a.heads = heads;
    a.head_dim = head_dim;
    a.out = t.out.view();
    if (with_ids) {
      a.head_ids = ids.data();
      a.cache_heads = cache_heads;
    }
    a.keep = keep_rows;
    return a;
  };
  Tensor score0 = Tensor::Zeros(DType::kF32, {cache});
  auto ref = MakeReferenceBackend();
  DEJA_ASSERT_OK_AND_ASSIGN(AttentionTensors on_ref,
                            AttentionOn(*ref, q, k, v, slot_pos, score0, garbage));
  ASSERT_TRUE(Attention(*ref, args(on_ref, nullptr)).ok());
  std::vector<float> want(on_ref.out.as<float>(), on_ref.out.as<float>() + tokens * width);
  for (int64_t i = 0; i < tokens * heads; ++i) {
    if (keep[i] == 0) std::fill_n(want.begin() + i * d, d, 0.f);
  }
  DEJA_ASSERT_OK_AND_ASSIGN(AttentionTensors on_b,
                            AttentionOn(b, q, k, v, slot_pos, score0, garbage));
  DEJA_ASSERT_OK(Attention(b, args(on_b, keep.data())));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor got, b.ToHost(on_b.out.view()));
  EXPECT_TRUE(Close(got.as<float>(), want.data(), got.numel(), kTol));
  for (int64_t i = 0; i < tokens * heads; ++i) {
    if (keep[i] != 0) continue;
    for (int64_t e = 0; e < d; ++e) ASSERT_EQ(got.as<float>()[i * d + e], 0.f) << "pair " << i;
  }
}

class CompareHeadSparseAttention : public BackendTest {};

TEST_P(CompareHeadSparseAttention, RowsAttendOnlyTheHeadsTheyKeep) {
  Backend& b = backend();
  DEJA_SKIP_UNLESS_SUPPORTED(b, OpId::kAttention, DType::kF32);
  uint32_t seed = BaseSeed() + 61000;
  CheckKeep(b, 4, false, 16, 9, 2, seed++);
  CheckKeep(b, 8, true, 64, 50, 3, seed++);
  CheckKeep(b, 5, true, 33, 30, 1, seed++);
  CheckKeep(b, 6, false, 24, 40, 12, seed++);  // the CPU's GEMM path
  CheckKeep(b, 3, true, 64, 90, 70, seed++);
}

TEST_P(CompareHeadSparseAttention, SubsetEqualsDenseHeads) {
  Backend& b = backend();
  DEJA_SKIP_UNLESS_SUPPORTED(b, OpId::kAttention, DType::kF32);
  uint32_t seed = BaseSeed() + 60000;
  CheckHeadSubset(b, 1, {0}, 8, 5, 5, 1, seed++);
  CheckHeadSubset(b, 4, {2}, 16, 9, 7, 1, seed++);
  CheckHeadSubset(b, 6, {3, 0, 5}, 17, 20, 13, 4, seed++);
  CheckHeadSubset(b, 8, {7, 1, 4, 2, 6}, 64, 64, 50, 1, seed++);
  CheckHeadSubset(b, 8, {7, 1, 4, 2}, 64, 64, 50, 3, seed++);
  CheckHeadSubset(b, 32, {31, 0, 9, 17, 12, 3, 28, 20, 5}, 64, 200, 150, 3, seed++);
  CheckHeadSubset(b, 5, {4, 3, 2, 1, 0}, 33, 30, 30, 2, seed++);  // all heads, reversed
  // Prefill-sized calls take the CPU backend's per-head GEMM path.
  CheckHeadSubset(b, 6, {5, 1, 3}, 24, 40, 36, 12, seed++);
  CheckHeadSubset(b, 8, {0, 7}, 64, 100, 90, 70, seed++);
}

DEJA_INSTANTIATE_BACKEND_TEST(GatherIdentities, AllBackends());
DEJA_INSTANTIATE_BACKEND_TEST(CompareHeadSparseAttention, AllBackends());

}  // namespace
}  // namespace deja::kernels
