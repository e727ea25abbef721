// Embedding, LayerNorm, Add, LogSoftmax and TopK of every backend under test against the
// reference, on fresh seeded random inputs over a grid of shapes including tiny and odd ones
// (kernel_test_util.h: inputs go to the backend's device, results come back); and known answers
// that need no reference, on the reference too.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace deja::kernels {
namespace {

using testing::AllBackends;
using testing::BackendTest;
using testing::Close;
using testing::ComparedBackends;
using testing::CopyOf;
using testing::RandomTensor;
using testing::Runs;
using testing::Unsupported;
using testing::WeightDTypes;

std::string Dims(int64_t a, int64_t b) { return std::to_string(a) + "x" + std::to_string(b); }

class CompareEmbedding : public BackendTest {};

TEST_P(CompareEmbedding, ShapeGrid) {
  Backend& b = backend();
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
          std::vector<int32_t> ids(n);  // a host array on every backend
          for (auto& id : ids) id = std::uniform_int_distribution<int32_t>(0, vocab - 1)(rng);
          if (!Runs(b, OpId::kEmbedding, dt)) continue;
          Tensor want = CopyOf(init);
          ASSERT_TRUE(Embedding(*ref, table.view(), ids.data(), n, acc, want.view()).ok());
          DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_table, b.ToBackend(table));
          DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_out, b.ToBackend(init));
          DEJA_ASSERT_OK(Embedding(b, d_table.view(), ids.data(), n, acc, d_out.view()));
          DEJA_ASSERT_OK_AND_ASSIGN(Tensor got, b.ToHost(d_out.view()));
          // A gather widens exactly: demand identical bits.
          EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.bytes()));
          // The same with the ids in the backend's memory (EmbeddingDeviceIds).
          DEJA_ASSERT_OK_AND_ASSIGN(
              Tensor d_ids, b.ToBackend(TensorView{ids.data(), DType::kI32, Shape{n}}));
          DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_out2, b.ToBackend(init));
          DEJA_ASSERT_OK(EmbeddingDeviceIds(b, d_table.view(), d_ids.view(), acc, d_out2.view()));
          DEJA_ASSERT_OK_AND_ASSIGN(Tensor got2, b.ToHost(d_out2.view()));
          EXPECT_EQ(0, std::memcmp(got2.data(), want.data(), got2.bytes())) << "device ids";
        }
      }
    }
  }
}

// A bf16 table in Layout::kTiled16 (the tied lm head's) gives the rows of the row-major one
// exactly; a backend that does not read the layout refuses it by name, and the case is skipped.
TEST_P(CompareEmbedding, TiledBf16Table) {
  Backend& b = backend();
  std::mt19937 rng(6000);
  Tensor table = RandomTensor(rng, DType::kBF16, {75, 33});
  TensorView tiled;
  Tensor tiles = Tile16(table.view(), &tiled);
  const int32_t ids[5] = {0, 74, 16, 15, 33};
  Tensor init = RandomTensor(rng, DType::kF32, {5, 33});
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_tiles, b.ToBackend(tiles));
  TensorView d_tiled = tiled;
  d_tiled.data = d_tiles.data();
  d_tiled.device = d_tiles.device();
  const std::string why = Unsupported(b, OpId::kEmbedding, DType::kBF16, Layout::kTiled16);
  if (!why.empty()) {
    DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_out, b.ToBackend(init));
    Status s = Embedding(b, d_tiled, ids, 5, false, d_out.view());
    EXPECT_NE(s.message().find("'table' is tiled"), std::string::npos) << s.ToString();
    GTEST_SKIP() << why;
  }
  auto ref = MakeReferenceBackend();
  for (bool acc : {false, true}) {
    Tensor want = CopyOf(init);
    ASSERT_TRUE(Embedding(*ref, table.view(), ids, 5, acc, want.view()).ok());
    DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_out, b.ToBackend(init));
    DEJA_ASSERT_OK(Embedding(b, d_tiled, ids, 5, acc, d_out.view()));
    DEJA_ASSERT_OK_AND_ASSIGN(Tensor got, b.ToHost(d_out.view()));
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.bytes()), 0) << "accumulate " << acc;
  }
}

DEJA_INSTANTIATE_BACKEND_TEST(CompareEmbedding, ComparedBackends());

class CompareLayerNorm : public BackendTest {};

TEST_P(CompareLayerNorm, ShapeGrid) {
  Backend& b = backend();
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
          if (!Runs(b, OpId::kLayerNorm, dt)) continue;
          Tensor want = Tensor::Empty(DType::kF32, {rows, dim});
          ASSERT_TRUE(
              LayerNorm(*ref, x.view(), gamma.view(), beta.view(), 1e-5f, want.view()).ok());
          DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_x, b.ToBackend(x));
          DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_gamma, b.ToBackend(gamma));
          DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_beta, b.ToBackend(beta));
          DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_out, b.Allocate(DType::kF32, Shape{rows, dim}));
          const Tensor& result = in_place ? d_x : d_out;
          DEJA_ASSERT_OK(
              LayerNorm(b, d_x.view(), d_gamma.view(), d_beta.view(), 1e-5f, result.view()));
          DEJA_ASSERT_OK_AND_ASSIGN(Tensor got, b.ToHost(result.view()));
          EXPECT_TRUE(Close(got.as<float>(), want.as<float>(), want.numel()));
        }
      }
    }
  }
}

DEJA_INSTANTIATE_BACKEND_TEST(CompareLayerNorm, ComparedBackends());

class CompareAdd : public BackendTest {};

TEST_P(CompareAdd, ShapeGrid) {
  Backend& b = backend();
  uint32_t seed = 200;
  auto ref = MakeReferenceBackend();
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1}, {3, 17}, {1, 2048}, {255, 1000}};
  for (auto [rows, cols] : shapes) {
    for (int bias_kind = 0; bias_kind < 4; ++bias_kind) {  // none, f32, f16, bf16
      SCOPED_TRACE(Dims(rows, cols) + " bias kind " + std::to_string(bias_kind));
      std::mt19937 rng(seed++);
      Tensor x = RandomTensor(rng, DType::kF32, {rows, cols});
      Tensor init = RandomTensor(rng, DType::kF32, {rows, cols});
      const DType dt = bias_kind == 0 ? DType::kF32 : WeightDTypes()[bias_kind - 1];
      Tensor bias = bias_kind == 0 ? Tensor() : RandomTensor(rng, dt, {cols});
      if (!Runs(b, OpId::kAdd, dt)) continue;
      Tensor want = CopyOf(init);
      ASSERT_TRUE(
          Add(*ref, x.view(), bias_kind == 0 ? TensorView{} : bias.view(), want.view()).ok());
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_x, b.ToBackend(x));
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_out, b.ToBackend(init));
      Tensor d_bias;
      if (bias_kind != 0) {
        DEJA_ASSERT_OK_AND_ASSIGN(d_bias, b.ToBackend(bias));
      }
      DEJA_ASSERT_OK(
          Add(b, d_x.view(), bias_kind == 0 ? TensorView{} : d_bias.view(), d_out.view()));
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor got, b.ToHost(d_out.view()));
      EXPECT_TRUE(Close(got.as<float>(), want.as<float>(), got.numel()));
    }
  }
}

DEJA_INSTANTIATE_BACKEND_TEST(CompareAdd, ComparedBackends());

class CompareLogSoftmax : public BackendTest {};

TEST_P(CompareLogSoftmax, ShapeGrid) {
  Backend& b = backend();
  DEJA_SKIP_UNLESS_SUPPORTED(b, OpId::kLogSoftmax, DType::kF32);
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
        DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_x, b.ToBackend(x));
        DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_out, b.Allocate(DType::kF32, Shape{rows, cols}));
        const Tensor& result = in_place ? d_x : d_out;
        DEJA_ASSERT_OK(LogSoftmax(b, d_x.view(), result.view()));
        DEJA_ASSERT_OK_AND_ASSIGN(Tensor got, b.ToHost(result.view()));
        EXPECT_TRUE(Close(got.as<float>(), want.as<float>(), want.numel()));
      }
    }
  }
}

DEJA_INSTANTIATE_BACKEND_TEST(CompareLogSoftmax, ComparedBackends());

class CompareTopK : public BackendTest {};

void CheckTopK(Backend& b, const Tensor& x, int32_t k) {
  const int64_t rows = x.shape()[0];
  auto ref = MakeReferenceBackend();
  std::vector<float> want_v(rows * k);
  std::vector<int32_t> want_i(rows * k);
  ASSERT_TRUE(TopK(*ref, x.view(), k, want_v.data(), want_i.data()).ok());
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_x, b.ToBackend(x));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_v, b.Allocate(DType::kF32, Shape{rows, k}));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_i, b.Allocate(DType::kI32, Shape{rows, k}));
  DEJA_ASSERT_OK(TopK(b, d_x.view(), k, d_v.as<float>(), d_i.as<int32_t>()));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor got_v, b.ToHost(d_v.view()));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor got_i, b.ToHost(d_i.view()));
  EXPECT_EQ(std::vector<int32_t>(got_i.as<int32_t>(), got_i.as<int32_t>() + rows * k), want_i);
  EXPECT_EQ(0, std::memcmp(got_v.data(), want_v.data(), want_v.size() * sizeof(float)));
}

TEST_P(CompareTopK, ShapeGrid) {
  Backend& b = backend();
  DEJA_SKIP_UNLESS_SUPPORTED(b, OpId::kTopK, DType::kF32);
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
          CheckTopK(b, x, static_cast<int32_t>(k));
        }
      }
    }
  }
}

TEST_P(CompareTopK, EveryElementOfARow) {
  // k = cols: the full order, NaNs last, every index exactly once.
  Backend& b = backend();
  DEJA_SKIP_UNLESS_SUPPORTED(b, OpId::kTopK, DType::kF32);
  std::mt19937 rng(450);
  Tensor x = RandomTensor(rng, DType::kF32, {2, 300}, -3.f, 3.f);
  for (int64_t i = 0; i < x.numel(); i += 7) x.as<float>()[i] = std::round(x.as<float>()[i]);
  x.as<float>()[5] = std::numeric_limits<float>::quiet_NaN();
  CheckTopK(b, x, 300);
}

TEST_P(CompareTopK, ManyRoundsAndLargeK) {
  // Devices may select in rounds over chunks of the row (the CUDA backend: chunks of 2048, k up
  // to 512) and fall back to another method for larger k: both against the reference, with ties.
  Backend& b = backend();
  DEJA_SKIP_UNLESS_SUPPORTED(b, OpId::kTopK, DType::kF32);
  std::mt19937 rng(460);
  for (auto [rows, cols, k] : {std::tuple<int64_t, int64_t, int32_t>{2, 100000, 512},
                               {3, 4097, 64}, {1, 2049, 512}, {2, 5000, 600}}) {
    SCOPED_TRACE(Dims(rows, cols) + " k=" + std::to_string(k));
    Tensor x = RandomTensor(rng, DType::kF32, {rows, cols}, -4.f, 4.f);
    for (int64_t i = 0; i < x.numel(); i += 3) x.as<float>()[i] = std::round(x.as<float>()[i]);
    CheckTopK(b, x, k);
  }
}

DEJA_INSTANTIATE_BACKEND_TEST(CompareTopK, ComparedBackends());

// Answers known without the reference, so the reference is checked too.
class KnownAnswers : public BackendTest {};

TEST_P(KnownAnswers, LogSoftmaxOfLargeLogitsStaysFinite) {
  // exp(1000) overflows f32: only a max-shifted implementation returns finite values.
  Backend& b = backend();
  Tensor x = Tensor::Empty(DType::kF32, {1, 3});
  x.as<float>()[0] = 1000.f;
  x.as<float>()[1] = 999.f;
  x.as<float>()[2] = -1000.f;
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_x, b.ToBackend(x));
  DEJA_ASSERT_OK(LogSoftmax(b, d_x.view(), d_x.view()));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor out, b.ToHost(d_x.view()));
  const double lse = 1000.0 + std::log1p(std::exp(-1.0));
  EXPECT_NEAR(out.as<float>()[0], 1000.0 - lse, 1e-5);
  EXPECT_NEAR(out.as<float>()[1], 999.0 - lse, 1e-5);
  EXPECT_NEAR(out.as<float>()[2], -1000.0 - lse, 1e-2);
}

TEST_P(KnownAnswers, TopKOrder) {
  // Descending, ties to the lower index, NaN last.
  Backend& b = backend();
  Tensor x = Tensor::Empty(DType::kF32, {1, 5});
  const float data[] = {1.f, 3.f, std::numeric_limits<float>::quiet_NaN(), 3.f, -2.f};
  std::memcpy(x.data(), data, sizeof(data));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_x, b.ToBackend(x));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_v, b.Allocate(DType::kF32, Shape{1, 5}));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_i, b.Allocate(DType::kI32, Shape{1, 5}));
  DEJA_ASSERT_OK(TopK(b, d_x.view(), 5, d_v.as<float>(), d_i.as<int32_t>()));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor v, b.ToHost(d_v.view()));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor idx, b.ToHost(d_i.view()));
  EXPECT_EQ(std::vector<int32_t>(idx.as<int32_t>(), idx.as<int32_t>() + 5),
            (std::vector<int32_t>{1, 3, 0, 4, 2}));
  EXPECT_EQ(v.as<float>()[0], 3.f);
  EXPECT_EQ(v.as<float>()[3], -2.f);
  EXPECT_TRUE(std::isnan(v.as<float>()[4]));
}

DEJA_INSTANTIATE_BACKEND_TEST(KnownAnswers, AllBackends());

}  // namespace
}  // namespace deja::kernels
