// Embedding, LayerNorm, Add, LogSoftmax and TopK of every backend under test against the
// reference, on fresh seeded random inputs over a grid of shapes including tiny and odd ones.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace deja::kernels {
namespace {

using testing::BackendsUnderTest;
using testing::Close;
using testing::CopyOf;
using testing::RandomTensor;
using testing::WeightDTypes;

std::string Dims(int64_t a, int64_t b) { return std::to_string(a) + "x" + std::to_string(b); }

TEST(CompareEmbedding, ShapeGrid) {
  const std::pair<int64_t, int64_t> tables[] = {{1, 1}, {5, 3}, {50, 17}, {1000, 255}, {300, 1030}};
  uint32_t seed = 1;
  auto ref = MakeReferenceBackend();
  for (auto [vocab, dim] : tables) {
    for (int64_t n : {1, 3, 17}) {
      for (DType dt : WeightDTypes()) {
        for (bool acc : {false, true}) {
          SCOPED_TRACE(Dims(vocab, dim) + " n=" + std::to_string(n) + " " + DTypeName(dt) +
                       (acc ? " accumulate" : ""));
          std::mt19937 rng(seed++);
          Tensor table = RandomTensor(rng, dt, {vocab, dim});
          Tensor init = RandomTensor(rng, DType::kF32, {n, dim});
          std::vector<int32_t> ids(n);
          for (auto& id : ids) id = std::uniform_int_distribution<int32_t>(0, vocab - 1)(rng);
          Tensor want = CopyOf(init);
          ASSERT_TRUE(Embedding(*ref, table.view(), ids.data(), n, acc, want.view()).ok());
          for (auto& bc : BackendsUnderTest()) {
            SCOPED_TRACE(bc.label);
            Tensor got = CopyOf(init);
            ASSERT_TRUE(Embedding(*bc.backend, table.view(), ids.data(), n, acc, got.view()).ok());
            // A gather widens exactly: demand identical bits.
            EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.bytes()));
          }
        }
      }
    }
  }
}

TEST(CompareLayerNorm, ShapeGrid) {
  uint32_t seed = 100;
  auto ref = MakeReferenceBackend();
  for (int64_t rows : {1, 3, 17}) {
    for (int64_t dim : {1, 3, 17, 255, 1000, 2049}) {
      for (DType dt : WeightDTypes()) {
        for (bool in_place : {false, true}) {
          SCOPED_TRACE(Dims(rows, dim) + " " + DTypeName(dt) + (in_place ? " in place" : ""));
          std::mt19937 rng(seed++);
          // An offset mean checks that the variance is not taken as E[x^2] - E[x]^2.
          Tensor x = RandomTensor(rng, DType::kF32, {rows, dim}, 2.f, 6.f);
          Tensor gamma = RandomTensor(rng, dt, {dim}, 0.5f, 1.5f);
          Tensor beta = RandomTensor(rng, dt, {dim});
          Tensor want = Tensor::Empty(DType::kF32, {rows, dim});
          ASSERT_TRUE(
              LayerNorm(*ref, x.view(), gamma.view(), beta.view(), 1e-5f, want.view()).ok());
          for (auto& bc : BackendsUnderTest()) {
            SCOPED_TRACE(bc.label);
            Tensor in = CopyOf(x);
            Tensor got = in_place ? Tensor() : Tensor::Empty(DType::kF32, {rows, dim});
            TensorView out = in_place ? in.view() : got.view();
            ASSERT_TRUE(
                LayerNorm(*bc.backend, in.view(), gamma.view(), beta.view(), 1e-5f, out).ok());
            EXPECT_TRUE(Close(out.as<float>(), want.as<float>(), want.numel()));
          }
        }
      }
    }
  }
}

TEST(CompareAdd, ShapeGrid) {
  uint32_t seed = 200;
  auto ref = MakeReferenceBackend();
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {3, 17}, {1, 2048}, {255, 1000}};
  for (auto [rows, cols] : shapes) {
    for (int bias_kind = 0; bias_kind < 4; ++bias_kind) {  // none, f32, f16, bf16
      SCOPED_TRACE(Dims(rows, cols) + " bias kind " + std::to_string(bias_kind));
      std::mt19937 rng(seed++);
      Tensor x = RandomTensor(rng, DType::kF32, {rows, cols});
      Tensor init = RandomTensor(rng, DType::kF32, {rows, cols});
      Tensor bias =
          bias_kind == 0 ? Tensor() : RandomTensor(rng, WeightDTypes()[bias_kind - 1], {cols});
      TensorView bias_view = bias_kind == 0 ? TensorView{} : bias.view();
      Tensor want = CopyOf(init);
      ASSERT_TRUE(Add(*ref, x.view(), bias_view, want.view()).ok());
      for (auto& bc : BackendsUnderTest()) {
        SCOPED_TRACE(bc.label);
        Tensor got = CopyOf(init);
        ASSERT_TRUE(Add(*bc.backend, x.view(), bias_view, got.view()).ok());
        EXPECT_TRUE(Close(got.as<float>(), want.as<float>(), got.numel()));
      }
    }
  }
}

TEST(CompareLogSoftmax, ShapeGrid) {
  uint32_t seed = 300;
  auto ref = MakeReferenceBackend();
  for (int64_t rows : {1, 2, 5}) {
    for (int64_t cols : {1, 3, 17, 255, 1000, 50272}) {
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(Dims(rows, cols) + (in_place ? " in place" : ""));
        std::mt19937 rng(seed++);
        Tensor x = RandomTensor(rng, DType::kF32, {rows, cols}, -20.f, 20.f);
        Tensor want = Tensor::Empty(DType::kF32, {rows, cols});
        ASSERT_TRUE(LogSoftmax(*ref, x.view(), want.view()).ok());
        for (auto& bc : BackendsUnderTest()) {
          SCOPED_TRACE(bc.label);
          Tensor in = CopyOf(x);
          Tensor got = in_place ? Tensor() : Tensor::Empty(DType::kF32, {rows, cols});
          TensorView out = in_place ? in.view() : got.view();
          ASSERT_TRUE(LogSoftmax(*bc.backend, in.view(), out).ok());
          EXPECT_TRUE(Close(out.as<float>(), want.as<float>(), want.numel()));
        }
      }
    }
  }
}

TEST(CompareLogSoftmax, LargeLogitsStayFinite) {
  // exp(1000) overflows f32: only a max-shifted implementation returns finite values.
  auto cpu = MakeCpuBackend(0);
  std::vector<float> x = {1000.f, 999.f, -1000.f};
  std::vector<float> out(3);
  TensorView xv{x.data(), DType::kF32, Shape{1, 3}}, ov{out.data(), DType::kF32, Shape{1, 3}};
  ASSERT_TRUE(LogSoftmax(*cpu, xv, ov).ok());
  const double lse = 1000.0 + std::log1p(std::exp(-1.0));
  EXPECT_NEAR(out[0], 1000.0 - lse, 1e-5);
  EXPECT_NEAR(out[1], 999.0 - lse, 1e-5);
  EXPECT_NEAR(out[2], -1000.0 - lse, 1e-2);
}

void CheckTopK(const Tensor& x, int32_t k) {
  const int64_t rows = x.shape()[0];
  auto ref = MakeReferenceBackend();
  std::vector<float> want_v(rows * k);
  std::vector<int32_t> want_i(rows * k);
  ASSERT_TRUE(TopK(*ref, x.view(), k, want_v.data(), want_i.data()).ok());
  for (auto& bc : BackendsUnderTest()) {
    SCOPED_TRACE(bc.label);
    std::vector<float> got_v(rows * k, -7.f);
    std::vector<int32_t> got_i(rows * k, -7);
    ASSERT_TRUE(TopK(*bc.backend, x.view(), k, got_v.data(), got_i.data()).ok());
    EXPECT_EQ(got_i, want_i);
    EXPECT_EQ(0, std::memcmp(got_v.data(), want_v.data(), got_v.size() * sizeof(float)));
  }
}

TEST(CompareTopK, ShapeGrid) {
  uint32_t seed = 400;
  for (int64_t rows : {1, 3, 7}) {
    for (int64_t cols : {1, 3, 17, 1000, 50272}) {
      for (int64_t k : {int64_t{1}, int64_t{3}, std::min<int64_t>(cols, 50)}) {
        if (k > cols) continue;
        for (bool ties : {false, true}) {
          SCOPED_TRACE(Dims(rows, cols) + " k=" + std::to_string(k) + (ties ? " ties" : ""));
          std::mt19937 rng(seed++);
          Tensor x = RandomTensor(rng, DType::kF32, {rows, cols}, -10.f, 10.f);
          if (ties) {  // few distinct values, a NaN and an infinity
            for (int64_t i = 0; i < x.numel(); ++i) x.as<float>()[i] = std::round(x.as<float>()[i]);
            x.as<float>()[0] = std::numeric_limits<float>::quiet_NaN();
            x.as<float>()[x.numel() / 2] = std::numeric_limits<float>::infinity();
          }
          CheckTopK(x, static_cast<int32_t>(k));
        }
      }
    }
  }
}

TEST(CompareTopK, KnownAnswer) {
  // Independent of the reference: descending, ties to the lower index, NaN last.
  float data[] = {1.f, 3.f, std::numeric_limits<float>::quiet_NaN(), 3.f, -2.f};
  TensorView x{data, DType::kF32, Shape{1, 5}};
  auto cpu = MakeCpuBackend(0);
  float v[5];
  int32_t idx[5];
  ASSERT_TRUE(TopK(*cpu, x, 5, v, idx).ok());
  EXPECT_EQ(std::vector<int32_t>(idx, idx + 5), (std::vector<int32_t>{1, 3, 0, 4, 2}));
  EXPECT_EQ(v[0], 3.f);
  EXPECT_EQ(v[3], -2.f);
  EXPECT_TRUE(std::isnan(v[4]));
}

}  // namespace
}  // namespace deja::kernels
