// Linear and attention of the CUDA backend against the reference, on the shape grid of
// tests/kernels: every epilogue (bias, ReLU, accumulate) and weight dtype with its tolerance, and
// slot-mapped caches with holes, unread slots beyond `used` and H2O score accumulation. Skips
// with the reason when there is no CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "tests/kernels_cuda/cuda_test_util.h"

namespace deja::kernels {
namespace {

using cuda::DeviceTensor;
using cuda::ToDevice;
using cuda::ToHost;
using testing::Close;
using testing::CopyOf;
using testing::Device;
using testing::LinearTolerance;
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
  Activation act = c.relu ? Activation::kRelu : Activation::kNone;

  auto ref = MakeReferenceBackend();
  Tensor want = CopyOf(init);
  ASSERT_TRUE(Linear(*ref, x.view(), w.view(), c.bias ? bias.view() : TensorView{}, act,
                     c.accumulate, want.view())
                  .ok());
  DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_x, ToDevice(Device(), x));
  DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_w, ToDevice(Device(), w));
  DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_bias, ToDevice(Device(), bias));
  DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_out, ToDevice(Device(), init));
  DEJA_ASSERT_OK(Linear(Device(), d_x.view(), d_w.view(), c.bias ? d_bias.view() : TensorView{},
                        act, c.accumulate, d_out.view()));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor got, ToHost(Device(), d_out));
  EXPECT_TRUE(Close(got.as<float>(), want.as<float>(), got.numel(), LinearTolerance(c.dtype)));
}

TEST(CudaCompareLinear, ShapeGrid) {
  DEJA_REQUIRE_CUDA();
  const int64_t ms[] = {1, 2, 5, 16, 33, 70};
  const std::pair<int64_t, int64_t> nks[] = {{1, 1},      {3, 17},     {17, 3},   {255, 1000},
                                             {1000, 255}, {130, 2049}, {64, 4099}};
  uint32_t seed = 1;
  for (int64_t m : ms) {
    for (auto [n, k] : nks) {
      for (DType dt : WeightDTypes()) {
        // Rotate through the epilogue variants; CudaCompareLinear.Epilogues covers all of them.
        int v = static_cast<int>(seed % 8);
        CheckLinear({m, n, k, dt, (v & 1) != 0, (v & 2) != 0, (v & 4) != 0}, seed);
        ++seed;
      }
    }
  }
}

TEST(CudaCompareLinear, Epilogues) {
  // Every (bias, relu, accumulate) combination: the GEMM-accumulates (beta = 1), the scratch
  // (ReLU before accumulation) and the in-place epilogue paths.
  DEJA_REQUIRE_CUDA();
  uint32_t seed = 1000;
  for (int64_t m : {1, 3, 40})
    for (DType dt : WeightDTypes())
      for (int v = 0; v < 8; ++v)
        CheckLinear({m, 37, 70, dt, (v & 1) != 0, (v & 2) != 0, (v & 4) != 0}, seed++);
}

TEST(CudaCompareLinear, ModelSized) {
  // An OPT-1.3B fc1-like matrix at decode and small-batch sizes.
  DEJA_REQUIRE_CUDA();
  uint32_t seed = 2000;
  for (int64_t m : {1, 4, 16})
    for (DType dt : WeightDTypes()) CheckLinear({m, 1024, 2048, dt, true, true, false}, seed++);
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

void CheckAttention(const AttentionCase& c, uint32_t seed) {
  SCOPED_TRACE(c.Label());
  std::mt19937 rng(seed);
  const int64_t width = static_cast<int64_t>(c.heads) * c.head_dim;
  const int64_t cache = static_cast<int64_t>(c.heads) * c.capacity;
  Tensor q = RandomTensor(rng, DType::kF32, {c.tokens, width}, -2.f, 2.f);
  Tensor k = RandomTensor(rng, DType::kF32, {cache, c.head_dim}, -2.f, 2.f);
  Tensor v = RandomTensor(rng, DType::kF32, {cache, c.head_dim});
  Tensor score0 = RandomTensor(rng, DType::kF32, {cache}, 0.f, 3.f);
  // Shuffled positions with holes (-1), like a cache after evictions; slots beyond `used` hold
  // positions that must not be read; the first query may see no slot, the last sees them all.
  Tensor slot_pos = Tensor::Empty(DType::kI32, {cache});
  int32_t* sp = slot_pos.as<int32_t>();
  std::uniform_int_distribution<int> coin(0, 4);
  for (int32_t h = 0; h < c.heads; ++h) {
    std::vector<int32_t> pos(c.used);
    for (int32_t s = 0; s < c.used; ++s) pos[s] = s + 1;
    std::shuffle(pos.begin(), pos.end(), rng);
    for (int32_t s = 0; s < c.used; ++s) sp[h * c.capacity + s] = coin(rng) == 0 ? -1 : pos[s];
    for (int32_t s = c.used; s < c.capacity; ++s) sp[h * c.capacity + s] = 0;
  }
  std::vector<int32_t> q_pos(c.tokens);  // a host array: the backend stages it
  for (int32_t t = 0; t < c.tokens; ++t) {
    q_pos[t] = t == 0 ? 0 : std::uniform_int_distribution<int32_t>(1, c.used + 1)(rng);
  }
  if (c.tokens > 1) q_pos[c.tokens - 1] = c.used + 1;

  auto args = [&](const TensorView& qv, float* kp, float* vp, const int32_t* spp, float* score,
                  const TensorView& out) {
    AttentionArgs a;
    a.q = qv;
    a.scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
    a.q_pos = q_pos.data();
    a.kv = {kp, vp, spp, c.capacity, c.used, c.score ? score : nullptr};
    a.heads = c.heads;
    a.head_dim = c.head_dim;
    a.out = out;
    return a;
  };
  auto ref = MakeReferenceBackend();
  Tensor want = Tensor::Zeros(DType::kF32, {c.tokens, width});
  Tensor want_score = CopyOf(score0);
  ASSERT_TRUE(Attention(*ref, args(q.view(), k.as<float>(), v.as<float>(), sp,
                                   want_score.as<float>(), want.view()))
                  .ok());
  // Garbage in out: every element must be written, including rows that see no slot.
  Tensor garbage = RandomTensor(rng, DType::kF32, {c.tokens, width}, 50.f, 60.f);
  DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_q, ToDevice(Device(), q));
  DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_k, ToDevice(Device(), k));
  DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_v, ToDevice(Device(), v));
  DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_slot_pos, ToDevice(Device(), slot_pos));
  DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_score, ToDevice(Device(), score0));
  DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_out, ToDevice(Device(), garbage));
  DEJA_ASSERT_OK(Attention(
      Device(), args(d_q.view(), d_k.view().as<float>(), d_v.view().as<float>(),
                     d_slot_pos.view().as<int32_t>(), d_score.view().as<float>(), d_out.view())));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor got, ToHost(Device(), d_out));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor got_score, ToHost(Device(), d_score));
  EXPECT_TRUE(Close(got.as<float>(), want.as<float>(), got.numel()));
  EXPECT_TRUE(Close(got_score.as<float>(), want_score.as<float>(), cache)) << "scores";
}

TEST(CudaCompareAttention, ShapeGrid) {
  DEJA_REQUIRE_CUDA();
  // head_dim 1, 3, 17, 64, 80, 128 and 256 cover the slot-group split of the output sum (head_dim
  // below the block size), the single group and the strided wide case.
  const AttentionCase cases[] = {
      {1, 1, 1, 1, 1, false},      {1, 1, 1, 1, 1, true},         {2, 3, 5, 5, 1, true},
      {4, 64, 40, 33, 1, true},    {3, 17, 20, 13, 5, true},      {3, 17, 20, 13, 5, false},
      {2, 128, 300, 300, 7, true}, {8, 64, 256, 200, 16, false},  {5, 80, 1100, 1030, 3, true},
      {32, 64, 64, 0, 2, true},    {16, 64, 2048, 1500, 1, true}, {2, 256, 70, 65, 4, true},
  };
  uint32_t seed = 3000;
  for (const auto& c : cases) CheckAttention(c, seed++);
}

TEST(CudaCompareAttention, TooManySlotsForSharedMemoryIsAnError) {
  // The kernel keeps one probability per used slot in shared memory; a cache beyond the
  // device's limit must be refused with a Status, not launched.
  DEJA_REQUIRE_CUDA();
  const int32_t heads = 1, d = 64, cap = 1 << 18;
  DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor q, Device().Allocate(DType::kF32, Shape{1, d}));
  DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor out, Device().Allocate(DType::kF32, Shape{1, d}));
  DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor kv, Device().Allocate(DType::kF32, Shape{cap, d}));
  DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor slots, Device().Allocate(DType::kI32, Shape{cap}));
  int32_t q_pos = 0;
  AttentionArgs a;
  a.q = q.view();
  a.q_pos = &q_pos;
  a.kv = {
      kv.view().as<float>(), kv.view().as<float>(), slots.view().as<int32_t>(), cap, cap, nullptr};
  a.heads = heads;
  a.head_dim = d;
  a.out = out.view();
  Status s = Attention(Device(), a);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
}

}  // namespace
}  // namespace deja::kernels
