// Linear and attention of every backend under test against the reference, on fresh seeded
// random inputs over a grid of shapes (tiny, odd and model-sized; both Linear code paths).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "hwy/targets.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace deja::kernels {
namespace {

using testing::BackendsUnderTest;
using testing::Close;
using testing::CopyOf;
using testing::RandomTensor;
using testing::WeightDTypes;

struct LinearCase {
  int64_t m, n, k;
  DType dtype;
  bool bias, relu, accumulate;
  std::string Label() const {
    return "M=" + std::to_string(m) + " N=" + std::to_string(n) + " K=" + std::to_string(k) + " " +
           DTypeName(dtype) + (bias ? " bias" : "") + (relu ? " relu" : "") +
           (accumulate ? " accumulate" : "");
  }
};

void CheckLinear(const LinearCase& c, uint32_t seed) {
  SCOPED_TRACE(c.Label());
  std::mt19937 rng(seed);
  Tensor x = RandomTensor(rng, DType::kF32, {c.m, c.k});
  Tensor w = RandomTensor(rng, c.dtype, {c.n, c.k});
  Tensor bias = RandomTensor(rng, c.dtype, {c.n});
  Tensor init = RandomTensor(rng, DType::kF32, {c.m, c.n});
  TensorView bias_view = c.bias ? bias.view() : TensorView{};
  Activation act = c.relu ? Activation::kRelu : Activation::kNone;

  auto ref = MakeReferenceBackend();
  Tensor want = CopyOf(init);
  ASSERT_TRUE(Linear(*ref, x.view(), w.view(), bias_view, act, c.accumulate, want.view()).ok());
  for (auto& bc : BackendsUnderTest()) {
    if (!bc.backend->Supports(OpId::kLinear, c.dtype)) continue;
    SCOPED_TRACE(bc.label);
    Tensor got = CopyOf(init);
    Status s = Linear(*bc.backend, x.view(), w.view(), bias_view, act, c.accumulate, got.view());
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(Close(got.as<float>(), want.as<float>(), got.numel()));
  }
}

TEST(CompareLinear, ShapeGrid) {
  const int64_t ms[] = {1, 2, 5, 16, 33, 70};
  const std::pair<int64_t, int64_t> nks[] = {{1, 1},      {3, 17},     {17, 3},   {255, 1000},
                                             {1000, 255}, {130, 2049}, {64, 4099}};
  uint32_t seed = 1;
  for (int64_t m : ms) {
    for (auto [n, k] : nks) {
      for (DType dt : WeightDTypes()) {
        // Rotate through the epilogue variants; CompareLinear.Epilogues covers all of them.
        int v = static_cast<int>(seed % 8);
        CheckLinear({m, n, k, dt, (v & 1) != 0, (v & 2) != 0, (v & 4) != 0}, seed);
        ++seed;
      }
    }
  }
}

TEST(CompareLinear, Epilogues) {
  // Both sides of the small-M / BLAS switch, every (bias, relu, accumulate) combination.
  const int64_t ms[] = {3, cpu::kLinearSmallMMax, cpu::kLinearSmallMMax + 1, 40};
  uint32_t seed = 1000;
  for (int64_t m : ms)
    for (DType dt : WeightDTypes())
      for (int v = 0; v < 8; ++v)
        CheckLinear({m, 37, 70, dt, (v & 1) != 0, (v & 2) != 0, (v & 4) != 0}, seed++);
}

TEST(CompareLinear, ModelSized) {
  // An OPT-1.3B fc1-like matrix at decode and small-batch sizes.
  uint32_t seed = 2000;
  for (int64_t m : {1, 4, 16})
    for (DType dt : WeightDTypes()) CheckLinear({m, 1024, 2048, dt, true, true, false}, seed++);
}

TEST(CompareLinear, DecodeBatchSizes) {
  // Batched decode (M = 8 .. 32): every register-tile remainder of the x rows, with odd K (a
  // vector tail) and odd N (a weight-row remainder).
  uint32_t seed = 2200;
  for (int64_t m : {8, 12, 16, 24, 32})
    for (auto [n, k] : {std::pair<int64_t, int64_t>{131, 517}, {37, 2053}})
      for (DType dt : WeightDTypes()) {
        int v = static_cast<int>(seed % 8);
        CheckLinear({m, n, k, dt, (v & 1) != 0, (v & 2) != 0, (v & 4) != 0}, seed++);
      }
}

TEST(CompareLinear, EverySimdTarget) {
  // The dispatcher picks the best target of this CPU; force each compiled one that the CPU can
  // run, so the narrower register tiles (AVX2, SSE4) are checked as well.
  uint32_t seed = 2500;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    for (int64_t m : {1, 3, 7, 13})
      for (DType dt : WeightDTypes()) CheckLinear({m, 37, 71, dt, true, true, true}, seed++);
  }
  hwy::SetSupportedTargetsForTest(0);
}

struct AttentionCase {
  int32_t heads, head_dim, capacity, used, tokens;
  bool score;
  std::string Label() const {
    return "heads=" + std::to_string(heads) + " head_dim=" + std::to_string(head_dim) +
           " capacity=" + std::to_string(capacity) + " used=" + std::to_string(used) +
           " tokens=" + std::to_string(tokens) + (score ? " score" : "");
  }
};

// kv: the cache's dtype (f16 values are drawn rounded, so every backend reads the same cache).
void CheckAttention(const AttentionCase& c, uint32_t seed, DType kv = DType::kF32) {
  SCOPED_TRACE(c.Label() + " kv " + DTypeName(kv));
  std::mt19937 rng(seed);
  const int64_t width = static_cast<int64_t>(c.heads) * c.head_dim;
  const int64_t cache = static_cast<int64_t>(c.heads) * c.capacity;
  Tensor q = RandomTensor(rng, DType::kF32, {c.tokens, width}, -2.f, 2.f);
  Tensor k = RandomTensor(rng, kv, {cache, c.head_dim}, -2.f, 2.f);
  Tensor v = RandomTensor(rng, kv, {cache, c.head_dim});
  Tensor score0 = RandomTensor(rng, DType::kF32, {cache}, 0.f, 3.f);
  // Slots hold a shuffled set of positions with holes (-1), like a cache after evictions; the
  // queries sit at increasing positions, so later tokens see more slots and the first may see
  // none.
  std::vector<int32_t> slot_pos(cache, -1);
  std::uniform_int_distribution<int> coin(0, 4);
  for (int32_t h = 0; h < c.heads; ++h) {
    std::vector<int32_t> pos(c.used);
    for (int32_t s = 0; s < c.used; ++s) pos[s] = s + 1;
    std::shuffle(pos.begin(), pos.end(), rng);
    for (int32_t s = 0; s < c.used; ++s)
      slot_pos[h * c.capacity + s] = coin(rng) == 0 ? -1 : pos[s];
    // Slots beyond `used` hold positions that must not be read.
    for (int32_t s = c.used; s < c.capacity; ++s) slot_pos[h * c.capacity + s] = 0;
  }
  std::vector<int32_t> q_pos(c.tokens);
  for (int32_t t = 0; t < c.tokens; ++t) {
    q_pos[t] = t == 0 ? 0 : std::uniform_int_distribution<int32_t>(1, c.used + 1)(rng);
  }
  if (c.tokens > 1) q_pos[c.tokens - 1] = c.used + 1;  // sees every occupied slot

  auto run = [&](Backend& b, Tensor& out, Tensor& score) {
    AttentionArgs a;
    a.q = q.view();
    a.scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
    a.q_pos = q_pos.data();
    a.kv = {k.data(), v.data(), slot_pos.data(),
            c.capacity, c.used, c.score ? score.as<float>() : nullptr, kv};
    a.heads = c.heads;
    a.head_dim = c.head_dim;
    a.out = out.view();
    return Attention(b, a);
  };
  auto ref = MakeReferenceBackend();
  Tensor want = Tensor::Zeros(DType::kF32, {c.tokens, width});
  Tensor want_score = CopyOf(score0);
  ASSERT_TRUE(run(*ref, want, want_score).ok());
  for (auto& bc : BackendsUnderTest()) {
    SCOPED_TRACE(bc.label);
    // Garbage in out: every element must be written, including rows that see no slot.
    Tensor got = RandomTensor(rng, DType::kF32, {c.tokens, width}, 50.f, 60.f);
    Tensor got_score = CopyOf(score0);
    Status s = run(*bc.backend, got, got_score);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(Close(got.as<float>(), want.as<float>(), got.numel()));
    EXPECT_TRUE(Close(got_score.as<float>(), want_score.as<float>(), cache)) << "scores";
  }
}

TEST(CompareAttention, ShapeGrid) {
  const AttentionCase cases[] = {
      {1, 1, 1, 1, 1, false},      {1, 1, 1, 1, 1, true},         {2, 3, 5, 5, 1, true},
      {4, 64, 40, 33, 1, true},    {3, 17, 20, 13, 5, true},      {3, 17, 20, 13, 5, false},
      {2, 128, 300, 300, 7, true}, {8, 64, 256, 200, 16, false},  {5, 80, 1100, 1030, 3, true},
      {32, 64, 64, 0, 2, true},    {16, 64, 2048, 1500, 1, true},
      // Prefill-sized calls (the CPU backend's GEMM path from 8 tokens): a block and a half of
      // queries, an odd head size, more queries than slots, none occupied.
      {3, 64, 300, 260, 96, true}, {2, 17, 100, 90, 70, false},  {4, 33, 40, 30, 8, true},
      {2, 64, 64, 0, 9, false},
  };
  uint32_t seed = 3000;
  for (DType kv : {DType::kF32, DType::kF16}) {
    for (const auto& c : cases) CheckAttention(c, seed++, kv);
  }
}

TEST(CompareAttention, ScoresAreAccumulatedProbabilities) {
  // Independent of the reference: with one query seeing every slot the added scores sum to 1
  // per head.
  auto cpu = MakeCpuBackend(0);
  const int32_t heads = 3, d = 8, cap = 10;
  std::mt19937 rng(7);
  Tensor q = RandomTensor(rng, DType::kF32, {1, heads * d});
  Tensor k = RandomTensor(rng, DType::kF32, {heads * cap, d});
  Tensor v = RandomTensor(rng, DType::kF32, {heads * cap, d});
  Tensor out = Tensor::Zeros(DType::kF32, {1, heads * d});
  std::vector<int32_t> slot_pos(heads * cap);
  for (int i = 0; i < heads * cap; ++i) slot_pos[i] = i % cap;
  std::vector<float> score(heads * cap, 0.f);
  int32_t q_pos = cap;
  AttentionArgs a;
  a.q = q.view();
  a.scale = 0.7f;
  a.q_pos = &q_pos;
  a.kv = {k.as<float>(), v.as<float>(), slot_pos.data(), cap, cap, score.data()};
  a.heads = heads;
  a.head_dim = d;
  a.out = out.view();
  ASSERT_TRUE(Attention(*cpu, a).ok());
  for (int h = 0; h < heads; ++h) {
    float sum = 0;
    for (int s = 0; s < cap; ++s) sum += score[h * cap + s];
    EXPECT_NEAR(sum, 1.f, 1e-5) << "head " << h;
  }
}

}  // namespace
}  // namespace deja::kernels
