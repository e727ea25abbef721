// Linear and attention of every backend under test against the reference, on fresh seeded random
// inputs over a grid of shapes (tiny, odd and model-sized; every epilogue; both CPU Linear code
// paths; slot-mapped caches with holes, unread slots beyond `used` and H2O score accumulation,
// in f32, f16 and int8). Also the CPU's SIMD targets one by one. Paged caches and long contexts:
// compare_paged_attention_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "hwy/targets.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace deja::kernels {
namespace {

using testing::AllBackends;
using testing::AttentionOn;
using testing::AttentionTensors;
using testing::BackendTest;
using testing::Close;
using testing::ComparedBackends;
using testing::CopyOf;
using testing::CpuBackends;
using testing::LinearTolerance;
using testing::KvDTypes;
using testing::RandomKvRows;
using testing::RandomTensor;
using testing::Runs;
using testing::Unsupported;
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

// tiled: the weights go to the backend in Layout::kTiled16 (bf16 only). bias_dtype: the bias's
// dtype when not the weights' (the CUDA backend fuses only an f32 bias into cuBLASLt). Without
// accumulation the output starts as NaN, so a backend that reads it (a GEMM with beta != 0, an
// epilogue adding into it) fails.
void CheckLinear(Backend& b, const LinearCase& c, uint32_t seed, bool tiled = false,
                 std::optional<DType> bias_dtype = std::nullopt) {
  const DType bias_dt = bias_dtype.value_or(c.dtype);
  SCOPED_TRACE(c.Label() + (tiled ? " tiled" : "") +
               (bias_dt != c.dtype ? std::string(" bias ") + DTypeName(bias_dt) : ""));
  std::mt19937 rng(seed);
  Tensor x = RandomTensor(rng, DType::kF32, {c.m, c.k});
  Tensor w = RandomTensor(rng, c.dtype, {c.n, c.k});
  Tensor bias = RandomTensor(rng, bias_dt, {c.n});
  Tensor init = RandomTensor(rng, DType::kF32, {c.m, c.n});
  if (!c.accumulate) {
    std::fill(init.as<float>(), init.as<float>() + init.numel(),
              std::numeric_limits<float>::quiet_NaN());
  }
  const Activation act = c.relu ? Activation::kRelu : Activation::kNone;
  if (!Runs(b, OpId::kLinear, c.dtype, tiled ? Layout::kTiled16 : Layout::kRowMajor)) return;

  auto ref = MakeReferenceBackend();
  Tensor want = CopyOf(init);
  ASSERT_TRUE(Linear(*ref, x.view(), w.view(), c.bias ? bias.view() : TensorView{}, act,
                     c.accumulate, want.view())
                  .ok());
  TensorView w_view;
  Tensor tiles = tiled ? Tile16(w.view(), &w_view) : Tensor();
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_x, b.ToBackend(x));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_w, b.ToBackend(tiled ? tiles : w));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_bias, b.ToBackend(bias));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_out, b.ToBackend(init));
  if (tiled) {
    w_view.data = d_w.data();
    w_view.device = d_w.device();
  } else {
    w_view = d_w.view();
  }
  DEJA_ASSERT_OK(Linear(b, d_x.view(), w_view, c.bias ? d_bias.view() : TensorView{}, act,
                        c.accumulate, d_out.view()));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor got, b.ToHost(d_out.view()));
  EXPECT_TRUE(Close(got.as<float>(), want.as<float>(), got.numel(), LinearTolerance(b, c.dtype)));
}

class CompareLinear : public BackendTest {};

TEST_P(CompareLinear, ShapeGrid) {
  const int64_t ms[] = {1, 2, 5, 16, 33, 70};
  const std::pair<int64_t, int64_t> nks[] = {{1, 1},      {3, 17},     {17, 3},   {255, 1000},
                                             {1000, 255}, {130, 2049}, {64, 4099}};
  uint32_t seed = 1;
  for (int64_t m : ms) {
    for (auto [n, k] : nks) {
      for (DType dt : WeightDTypes()) {
        // Rotate through the epilogue variants; CompareLinear.Epilogues covers all of them.
        int v = static_cast<int>(seed % 8);
        CheckLinear(backend(), {m, n, k, dt, (v & 1) != 0, (v & 2) != 0, (v & 4) != 0}, seed);
        ++seed;
      }
    }
  }
}

TEST_P(CompareLinear, Epilogues) {
  // Every (bias, relu, accumulate) combination on both sides of the CPU's small-M / BLAS switch
  // and CUDA's GEMM-accumulates (beta = 1), scratch (ReLU before accumulation) and in-place paths.
  const int64_t ms[] = {1, 3, cpu::kLinearSmallMMax, cpu::kLinearSmallMMax + 1, 40};
  uint32_t seed = 1000;
  for (int64_t m : ms)
    for (DType dt : WeightDTypes())
      for (int v = 0; v < 8; ++v)
        CheckLinear(backend(), {m, 37, 70, dt, (v & 1) != 0, (v & 2) != 0, (v & 4) != 0}, seed++);
}

TEST_P(CompareLinear, BiasDTypes) {
  // A bias whose dtype differs from the weights' (kernels/ops.h allows any float dtype): every
  // (weight, bias) dtype pair with and without ReLU and accumulation. On CUDA an f32 bias on
  // f16/bf16 weights is cuBLASLt's fused BIAS / RELU_BIAS epilogue (with beta = 1 when
  // accumulating without ReLU); an f16/bf16 bias goes to the epilogue kernel.
  const int64_t ms[] = {1, 5, cpu::kLinearSmallMMax + 1, 40};
  const std::pair<int64_t, int64_t> nks[] = {{37, 70}, {64, 256}};
  uint32_t seed = 2100;
  for (int64_t m : ms)
    for (auto [n, k] : nks)
      for (DType dt : WeightDTypes())
        for (DType bias_dt : WeightDTypes())
          for (int v = 0; v < 4; ++v)
            CheckLinear(backend(), {m, n, k, dt, true, (v & 1) != 0, (v & 2) != 0}, seed++,
                        /*tiled=*/false, bias_dt);
}

TEST_P(CompareLinear, RepeatedShapes) {
  // The same shapes again, with fresh inputs, in an order that alternates epilogues: the CUDA
  // backend reuses its cached cuBLASLt plans, whose bias pointer must follow each call's.
  uint32_t seed = 2150;
  for (int round = 0; round < 2; ++round)
    for (DType dt : {DType::kF16, DType::kBF16})
      for (int v = 0; v < 8; ++v)
        CheckLinear(backend(), {4, 64, 128, dt, (v & 1) != 0, (v & 2) != 0, (v & 4) != 0}, seed++,
                    /*tiled=*/false, DType::kF32);
}

TEST_P(CompareLinear, ModelSized) {
  // An OPT-1.3B fc1-like matrix at decode and small-batch sizes.
  uint32_t seed = 2000;
  for (int64_t m : {1, 4, 16})
    for (DType dt : WeightDTypes())
      CheckLinear(backend(), {m, 1024, 2048, dt, true, true, false}, seed++);
}

TEST_P(CompareLinear, DecodeBatchSizes) {
  // Batched decode (M = 8 .. 32): every register-tile remainder of the x rows, with odd K (a
  // vector tail) and odd N (a weight-row remainder).
  uint32_t seed = 2200;
  for (int64_t m : {8, 12, 16, 24, 32})
    for (auto [n, k] : {std::pair<int64_t, int64_t>{131, 517}, {37, 2053}})
      for (DType dt : WeightDTypes()) {
        int v = static_cast<int>(seed % 8);
        CheckLinear(backend(), {m, n, k, dt, (v & 1) != 0, (v & 2) != 0, (v & 4) != 0}, seed++);
      }
}

TEST_P(CompareLinear, TiledBf16) {
  // bf16 weights in Layout::kTiled16: odd K pads a pair, N not a multiple of 16 a partial tile, M
  // past 16 several blocks of x. A backend that does not read the layout refuses it by name.
  Backend& b = backend();
  const std::string why = Unsupported(b, OpId::kLinear, DType::kBF16, Layout::kTiled16);
  if (!why.empty()) {
    Tensor w = Tensor::Zeros(DType::kBF16, {32, 8});
    TensorView tiled;
    Tensor tiles = Tile16(w.view(), &tiled);
    DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_tiles, b.ToBackend(tiles));
    DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_x, b.Allocate(DType::kF32, Shape{2, 8}));
    DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_out, b.Allocate(DType::kF32, Shape{2, 32}));
    tiled.data = d_tiles.data();
    tiled.device = d_tiles.device();
    Status s = Linear(b, d_x.view(), tiled, TensorView{}, Activation::kNone, false, d_out.view());
    EXPECT_NE(s.message().find("'w' is tiled"), std::string::npos) << s.ToString();
    GTEST_SKIP() << why;
  }
  const int64_t mnk[][3] = {{1, 1, 1}, {3, 17, 33}, {16, 64, 257}, {33, 130, 129}, {40, 9, 70}};
  uint32_t seed = 2400;
  for (const auto& s : mnk) {
    for (int v = 0; v < 8; v += 3) {
      CheckLinear(b, {s[0], s[1], s[2], DType::kBF16, (v & 1) != 0, (v & 2) != 0, (v & 4) != 0},
                  seed++, /*tiled=*/true);
    }
  }
}

DEJA_INSTANTIATE_BACKEND_TEST(CompareLinear, ComparedBackends());

TEST(CpuSimdTargets, Linear) {
  // The dispatcher picks the best target of this CPU; force each compiled one that the CPU can
  // run, so the narrower register tiles (AVX2, SSE4) are checked as well.
  uint32_t seed = 2500;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    for (const auto& cpu : CpuBackends()) {
      SCOPED_TRACE(cpu.label);
      for (int64_t m : {1, 3, 7, 13})
        for (DType dt : WeightDTypes())
          CheckLinear(*cpu.backend, {m, 37, 71, dt, true, true, true}, seed++);
    }
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
void CheckAttention(Backend& b, const AttentionCase& c, uint32_t seed, DType kv) {
  SCOPED_TRACE(c.Label() + " kv " + DTypeName(kv));
  std::mt19937 rng(seed);
  const int64_t width = static_cast<int64_t>(c.heads) * c.head_dim;
  const int64_t cache = static_cast<int64_t>(c.heads) * c.capacity;
  Tensor q = RandomTensor(rng, DType::kF32, {c.tokens, width}, -2.f, 2.f);
  Tensor k = RandomKvRows(rng, kv, cache, c.head_dim, -2.f, 2.f);
  Tensor v = RandomKvRows(rng, kv, cache, c.head_dim);
  Tensor score0 = RandomTensor(rng, DType::kF32, {cache}, 0.f, 3.f);
  // Slots hold a shuffled set of positions with holes (-1), like a cache after evictions; the
  // queries sit at increasing positions, so later tokens see more slots and the first may see
  // none.
  Tensor slot_pos = Tensor::Empty(DType::kI32, {cache});
  int32_t* sp = slot_pos.as<int32_t>();
  std::uniform_int_distribution<int> coin(0, 4);
  for (int32_t h = 0; h < c.heads; ++h) {
    std::vector<int32_t> pos(c.used);
    for (int32_t s = 0; s < c.used; ++s) pos[s] = s + 1;
    std::shuffle(pos.begin(), pos.end(), rng);
    for (int32_t s = 0; s < c.used; ++s) sp[h * c.capacity + s] = coin(rng) == 0 ? -1 : pos[s];
    // Slots beyond `used` hold positions that must not be read.
    for (int32_t s = c.used; s < c.capacity; ++s) sp[h * c.capacity + s] = 0;
  }
  std::vector<int32_t> q_pos(c.tokens);  // a host array on every backend
  for (int32_t t = 0; t < c.tokens; ++t) {
    q_pos[t] = t == 0 ? 0 : std::uniform_int_distribution<int32_t>(1, c.used + 1)(rng);
  }
  if (c.tokens > 1) q_pos[c.tokens - 1] = c.used + 1;  // sees every occupied slot
  // Garbage in out: every element must be written, including rows that see no slot.
  Tensor garbage = RandomTensor(rng, DType::kF32, {c.tokens, width}, 50.f, 60.f);

  auto args = [&](const Tensor& qt, const Tensor& kt, const Tensor& vt, const Tensor& spt,
                  const Tensor& score, const Tensor& out) {
    AttentionArgs a;
    a.q = qt.view();
    a.scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
    a.q_pos = q_pos.data();
    a.kv = {kt.data(), vt.data(), spt.as<int32_t>(), c.capacity, c.used};
    a.kv.score = c.score ? score.as<float>() : nullptr;
    a.kv.dtype = kv;
    a.kv.device = kt.device();
    a.heads = c.heads;
    a.head_dim = c.head_dim;
    a.out = out.view();
    return a;
  };
  auto ref = MakeReferenceBackend();
  Tensor want = Tensor::Zeros(DType::kF32, {c.tokens, width});
  Tensor want_score = CopyOf(score0);
  ASSERT_TRUE(Attention(*ref, args(q, k, v, slot_pos, want_score, want)).ok());
  DEJA_ASSERT_OK_AND_ASSIGN(AttentionTensors d,
                            AttentionOn(b, q, k, v, slot_pos, score0, garbage));
  DEJA_ASSERT_OK(Attention(b, args(d.q, d.k, d.v, d.slot_pos, d.score, d.out)));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor got, b.ToHost(d.out.view()));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor got_score, b.ToHost(d.score.view()));
  EXPECT_TRUE(Close(got.as<float>(), want.as<float>(), got.numel()));
  EXPECT_TRUE(Close(got_score.as<float>(), want_score.as<float>(), cache)) << "scores";
}

// head_dim 1, 3, 17, 33, 64, 80, 128 and 256 cover CUDA's lane groups of every width, with one
// element or 16 bytes per load (kernels/cuda/attention.cu); from 8 tokens the CPU backend takes
// its GEMM path (a block and a half of queries, an odd head size, more queries than slots, none
// occupied).
const AttentionCase kAttentionCases[] = {
    {1, 1, 1, 1, 1, false},      {1, 1, 1, 1, 1, true},         {2, 3, 5, 5, 1, true},
    {4, 64, 40, 33, 1, true},    {3, 17, 20, 13, 5, true},      {3, 17, 20, 13, 5, false},
    {2, 128, 300, 300, 7, true}, {8, 64, 256, 200, 16, false},  {5, 80, 1100, 1030, 3, true},
    {32, 64, 64, 0, 2, true},    {16, 64, 2048, 1500, 1, true}, {2, 256, 70, 65, 4, true},
    {3, 64, 300, 260, 96, true}, {2, 17, 100, 90, 70, false},   {4, 33, 40, 30, 8, true},
    {2, 64, 64, 0, 9, false},
};

class CompareAttention : public BackendTest {};

TEST_P(CompareAttention, ShapeGrid) {
  DEJA_SKIP_UNLESS_SUPPORTED(backend(), OpId::kAttention, DType::kF32);
  uint32_t seed = 3000;
  for (const auto& c : kAttentionCases) CheckAttention(backend(), c, seed++, DType::kF32);
}

TEST_P(CompareAttention, F16Cache) {
  DEJA_SKIP_UNLESS_SUPPORTED(backend(), OpId::kAttention, DType::kF16);
  uint32_t seed = 3100;
  for (const auto& c : kAttentionCases) CheckAttention(backend(), c, seed++, DType::kF16);
}

TEST_P(CompareAttention, I8Cache) {
  DEJA_SKIP_UNLESS_SUPPORTED(backend(), OpId::kAttention, DType::kI8);
  uint32_t seed = 3200;
  for (const auto& c : kAttentionCases) CheckAttention(backend(), c, seed++, DType::kI8);
}

DEJA_INSTANTIATE_BACKEND_TEST(CompareAttention, ComparedBackends());

class AttentionScores : public BackendTest {};

TEST_P(AttentionScores, AreAccumulatedProbabilities) {
  // Independent of the reference: with one query seeing every slot the added scores sum to 1
  // per head.
  Backend& b = backend();
  const int32_t heads = 3, d = 8, cap = 10;
  std::mt19937 rng(7);
  Tensor q = RandomTensor(rng, DType::kF32, {1, heads * d});
  Tensor k = RandomTensor(rng, DType::kF32, {heads * cap, d});
  Tensor v = RandomTensor(rng, DType::kF32, {heads * cap, d});
  Tensor slot_pos = Tensor::Empty(DType::kI32, {heads * cap});
  for (int i = 0; i < heads * cap; ++i) slot_pos.as<int32_t>()[i] = i % cap;
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_q, b.ToBackend(q));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_k, b.ToBackend(k));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_v, b.ToBackend(v));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_slot_pos, b.ToBackend(slot_pos));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_score, b.ToBackend(Tensor::Zeros(DType::kF32, {heads * cap})));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_out, b.Allocate(DType::kF32, Shape{1, heads * d}));
  int32_t q_pos = cap;
  AttentionArgs a;
  a.q = d_q.view();
  a.scale = 0.7f;
  a.q_pos = &q_pos;
  a.kv = {d_k.data(), d_v.data(), d_slot_pos.as<int32_t>(), cap, cap, d_score.as<float>()};
  a.kv.device = b.device();
  a.heads = heads;
  a.head_dim = d;
  a.out = d_out.view();
  DEJA_ASSERT_OK(Attention(b, a));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor score, b.ToHost(d_score.view()));
  for (int h = 0; h < heads; ++h) {
    float sum = 0;
    for (int s = 0; s < cap; ++s) sum += score.as<float>()[h * cap + s];
    EXPECT_NEAR(sum, 1.f, 1e-5) << "head " << h;
  }
}

DEJA_INSTANTIATE_BACKEND_TEST(AttentionScores, AllBackends());

}  // namespace
}  // namespace deja::kernels
