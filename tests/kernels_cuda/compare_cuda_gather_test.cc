// The Deja Vu sparse ops of the CUDA backend against the reference: gather-GEMV,
// gather-transposed-GEMV and head-sparse attention, on fresh random inputs (seed from
// std::random_device, printed; DEJA_TEST_SEED=<n> replays it). The gathers read f32 activations
// and widen the weights exactly, accumulating in f32, so they share the CPU bound (kRelTol).
// Skips with the reason when there is no CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
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
using testing::RandomTensor;
using testing::WeightDTypes;

uint32_t BaseSeed() { return testing::BaseSeed("compare_cuda_gather_test"); }
using testing::RandomRows;

void CheckGatherLinear(int64_t m, int64_t r, int64_t k, int64_t n_rows, DType dt, bool has_bias,
                       bool relu, bool accumulate, uint32_t seed) {
  SCOPED_TRACE("M=" + std::to_string(m) + " R=" + std::to_string(r) + " K=" + std::to_string(k) +
               " n_rows=" + std::to_string(n_rows) + " " + DTypeName(dt) +
               (has_bias ? " bias" : "") + (relu ? " relu" : "") +
               (accumulate ? " accumulate" : "") + " seed=" + std::to_string(seed));
  std::mt19937 rng(seed);
  Tensor x = RandomTensor(rng, DType::kF32, {m, k});
  Tensor w = RandomTensor(rng, dt, {r, k});
  Tensor bias = RandomTensor(rng, dt, {r});
  Tensor init = RandomTensor(rng, DType::kF32, {m, n_rows});
  std::vector<int32_t> rows = RandomRows(rng, r, n_rows);  // host: the backend stages it
  const Activation act = relu ? Activation::kRelu : Activation::kNone;
  auto ref = MakeReferenceBackend();
  Tensor want = CopyOf(init);
  ASSERT_TRUE(GatherLinear(*ref, x.view(), w.view(), has_bias ? bias.view() : TensorView{},
                           rows.data(), n_rows, act, accumulate, want.view())
                  .ok());
  DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_x, ToDevice(Device(), x));
  DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_w, ToDevice(Device(), w));
  DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_bias, ToDevice(Device(), bias));
  DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_out, ToDevice(Device(), init));
  DEJA_ASSERT_OK(GatherLinear(Device(), d_x.view(), d_w.view(),
                              has_bias ? d_bias.view() : TensorView{}, rows.data(), n_rows, act,
                              accumulate, d_out.view()));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor got, ToHost(Device(), d_out));
  EXPECT_TRUE(Close(got.as<float>(), want.as<float>(), got.numel()));
}

void CheckGatherLinearT(int64_t m, int64_t r, int64_t n, int64_t n_rows, DType dt, bool accumulate,
                        uint32_t seed) {
  SCOPED_TRACE("M=" + std::to_string(m) + " R=" + std::to_string(r) + " N=" + std::to_string(n) +
               " n_rows=" + std::to_string(n_rows) + " " + DTypeName(dt) +
               (accumulate ? " accumulate" : "") + " seed=" + std::to_string(seed));
  std::mt19937 rng(seed);
  Tensor x = RandomTensor(rng, DType::kF32, {m, n_rows});
  Tensor wt = RandomTensor(rng, dt, {r, n});
  Tensor init = RandomTensor(rng, DType::kF32, {m, n});
  std::vector<int32_t> rows = RandomRows(rng, r, n_rows);
  auto ref = MakeReferenceBackend();
  Tensor want = CopyOf(init);
  ASSERT_TRUE(
      GatherLinearT(*ref, x.view(), wt.view(), rows.data(), n_rows, accumulate, want.view()).ok());
  DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_x, ToDevice(Device(), x));
  DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_wt, ToDevice(Device(), wt));
  DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_out, ToDevice(Device(), init));
  DEJA_ASSERT_OK(GatherLinearT(Device(), d_x.view(), d_wt.view(), rows.data(), n_rows, accumulate,
                               d_out.view()));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor got, ToHost(Device(), d_out));
  EXPECT_TRUE(Close(got.as<float>(), want.as<float>(), got.numel()));
}

TEST(CudaCompareGatherLinear, ShapeGrid) {
  DEJA_REQUIRE_CUDA();
  const int64_t rkn[][3] = {{1, 1, 1},       {5, 3, 7},       {37, 70, 37},
                            {255, 1000, 77}, {130, 2049, 65}, {1024, 2048, 307}};
  uint32_t seed = BaseSeed();
  int i = 0;
  for (int64_t m : {1, 3, 16, 40})
    for (const auto& s : rkn)
      for (DType dt : WeightDTypes()) {
        const int v = i++ % 8;
        CheckGatherLinear(m, s[0], s[1], s[2], dt, (v & 1) != 0, (v & 2) != 0, (v & 4) != 0,
                          seed++);
      }
}

TEST(CudaCompareGatherLinearT, ShapeGrid) {
  DEJA_REQUIRE_CUDA();
  const int64_t rnn[][3] = {{1, 1, 1},        {5, 17, 9},       {70, 37, 21},
                            {1000, 255, 131}, {2049, 130, 600}, {8192, 2048, 819}};
  uint32_t seed = BaseSeed() + 20000;
  int i = 0;
  for (int64_t m : {1, 3, 16, 40})
    for (const auto& s : rnn)
      for (DType dt : WeightDTypes()) CheckGatherLinearT(m, s[0], s[1], s[2], dt, i++ % 2, seed++);
}

// Head-sparse attention: the selected heads' outputs and scores equal the reference's dense
// attention for those heads; the other heads' scores are untouched.
TEST(CudaCompareHeadSparseAttention, SubsetEqualsDenseHeads) {
  DEJA_REQUIRE_CUDA();
  const int32_t cache_heads = 8, d = 64, cap = 64, used = 50, tokens = 3;
  const std::vector<int32_t> head_ids = {7, 1, 4, 2};  // host: the backend stages it
  const int32_t heads = static_cast<int32_t>(head_ids.size());
  const int64_t width = cache_heads * d, cache = int64_t{cache_heads} * cap;
  std::mt19937 rng(BaseSeed() + 60000);
  Tensor q = RandomTensor(rng, DType::kF32, {tokens, width}, -2.f, 2.f);
  Tensor k = RandomTensor(rng, DType::kF32, {cache, d}, -2.f, 2.f);
  Tensor v = RandomTensor(rng, DType::kF32, {cache, d});
  Tensor score0 = RandomTensor(rng, DType::kF32, {cache}, 0.f, 3.f);
  Tensor slot_pos = Tensor::Empty(DType::kI32, {cache});
  for (int64_t i = 0; i < cache; ++i) {
    const int32_t s = static_cast<int32_t>(i % cap);
    slot_pos.as<int32_t>()[i] = s >= used ? 0 : (s % 5 == 3 ? -1 : s + 1);
  }
  std::vector<int32_t> q_pos = {used - 2, used - 1, used};
  Tensor q_sel = Tensor::Empty(DType::kF32, {tokens, heads * d});
  for (int32_t t = 0; t < tokens; ++t)
    for (int32_t i = 0; i < heads; ++i)
      std::copy_n(q.as<float>() + t * width + head_ids[i] * d, d,
                  q_sel.as<float>() + (t * heads + i) * d);
  auto args = [&](TensorView qv, float* kp, float* vp, const int32_t* sp, float* score,
                  TensorView out) {
    AttentionArgs a;
    a.q = qv;
    a.scale = 0.125f;
    a.q_pos = q_pos.data();
    a.kv = {kp, vp, sp, cap, used, score};
    a.head_dim = d;
    a.out = out;
    return a;
  };
  auto ref = MakeReferenceBackend();
  Tensor dense_out = Tensor::Zeros(DType::kF32, {tokens, width});
  Tensor dense_score = CopyOf(score0);
  AttentionArgs dense = args(q.view(), k.as<float>(), v.as<float>(), slot_pos.as<int32_t>(),
                             dense_score.as<float>(), dense_out.view());
  dense.heads = cache_heads;
  ASSERT_TRUE(Attention(*ref, dense).ok());
  std::vector<float> want_out(static_cast<size_t>(tokens * heads * d));
  for (int32_t t = 0; t < tokens; ++t)
    for (int32_t i = 0; i < heads; ++i)
      std::copy_n(dense_out.as<float>() + t * width + head_ids[i] * d, d,
                  want_out.data() + (t * heads + i) * d);
  Tensor want_score = CopyOf(score0);
  for (int32_t h : head_ids)
    std::copy_n(dense_score.as<float>() + h * cap, cap, want_score.as<float>() + h * cap);

  Tensor garbage = RandomTensor(rng, DType::kF32, {tokens, heads * d}, 50.f, 60.f);
  DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_q, ToDevice(Device(), q_sel));
  DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_k, ToDevice(Device(), k));
  DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_v, ToDevice(Device(), v));
  DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_slot_pos, ToDevice(Device(), slot_pos));
  DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_score, ToDevice(Device(), score0));
  DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_out, ToDevice(Device(), garbage));
  AttentionArgs sparse =
      args(d_q.view(), d_k.view().as<float>(), d_v.view().as<float>(),
           d_slot_pos.view().as<int32_t>(), d_score.view().as<float>(), d_out.view());
  sparse.heads = heads;
  sparse.head_ids = head_ids.data();
  sparse.cache_heads = cache_heads;
  DEJA_ASSERT_OK(Attention(Device(), sparse));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor got, ToHost(Device(), d_out));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor got_score, ToHost(Device(), d_score));
  EXPECT_TRUE(Close(got.as<float>(), want_out.data(), got.numel()));
  EXPECT_TRUE(Close(got_score.as<float>(), want_score.as<float>(), cache)) << "scores";
  for (int32_t h = 0; h < cache_heads; ++h) {
    if (std::find(head_ids.begin(), head_ids.end(), h) != head_ids.end()) continue;
    for (int32_t s = 0; s < cap; ++s) {
      ASSERT_EQ(got_score.as<float>()[h * cap + s], score0.as<float>()[h * cap + s])
          << "score of unselected head " << h << " slot " << s << " changed";
    }
  }
}

}  // namespace
}  // namespace deja::kernels
