// Embedding, LayerNorm, Add, LogSoftmax and TopK of the CUDA backend against the reference, on
// the shape grid of tests/kernels (fresh seeded random inputs, tiny and odd sizes): inputs are
// copied to the device, the op runs there and its result is copied back. Skips with the reason
// when there is no CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
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
using testing::Cuda;
using testing::Device;
using testing::RandomTensor;
using testing::WeightDTypes;

std::string Dims(int64_t a, int64_t b) { return std::to_string(a) + "x" + std::to_string(b); }

TEST(CudaCompareEmbedding, ShapeGrid) {
  DEJA_REQUIRE_CUDA();
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
          std::vector<int32_t> ids(n);  // a host array: the backend stages it
          for (auto& id : ids) id = std::uniform_int_distribution<int32_t>(0, vocab - 1)(rng);
          Tensor want = CopyOf(init);
          ASSERT_TRUE(Embedding(*ref, table.view(), ids.data(), n, acc, want.view()).ok());
          DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_table, ToDevice(Device(), table));
          DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_out, ToDevice(Device(), init));
          DEJA_ASSERT_OK(Embedding(Device(), d_table.view(), ids.data(), n, acc, d_out.view()));
          DEJA_ASSERT_OK_AND_ASSIGN(Tensor got, ToHost(Device(), d_out));
          // A gather widens exactly: demand identical bits.
          EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.bytes()));
        }
      }
    }
  }
}

TEST(CudaCompareLayerNorm, ShapeGrid) {
  DEJA_REQUIRE_CUDA();
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
          DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_x, ToDevice(Device(), x));
          DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_gamma, ToDevice(Device(), gamma));
          DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_beta, ToDevice(Device(), beta));
          DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_out,
                                    Device().Allocate(DType::kF32, Shape{rows, dim}));
          const DeviceTensor& result = in_place ? d_x : d_out;
          DEJA_ASSERT_OK(
              LayerNorm(Device(), d_x.view(), d_gamma.view(), d_beta.view(), 1e-5f, result.view()));
          DEJA_ASSERT_OK_AND_ASSIGN(Tensor got, ToHost(Device(), result));
          EXPECT_TRUE(Close(got.as<float>(), want.as<float>(), want.numel()));
        }
      }
    }
  }
}

TEST(CudaCompareAdd, ShapeGrid) {
  DEJA_REQUIRE_CUDA();
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
      DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_x, ToDevice(Device(), x));
      DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_out, ToDevice(Device(), init));
      DeviceTensor d_bias;
      if (bias_kind != 0) {
        DEJA_ASSERT_OK_AND_ASSIGN(d_bias, ToDevice(Device(), bias));
      }
      TensorView d_bias_view = bias_kind == 0 ? TensorView{} : d_bias.view();
      DEJA_ASSERT_OK(Add(Device(), d_x.view(), d_bias_view, d_out.view()));
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor got, ToHost(Device(), d_out));
      EXPECT_TRUE(Close(got.as<float>(), want.as<float>(), got.numel()));
    }
  }
}

TEST(CudaCompareLogSoftmax, ShapeGrid) {
  DEJA_REQUIRE_CUDA();
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
        DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_x, ToDevice(Device(), x));
        DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_out,
                                  Device().Allocate(DType::kF32, Shape{rows, cols}));
        const DeviceTensor& result = in_place ? d_x : d_out;
        DEJA_ASSERT_OK(LogSoftmax(Device(), d_x.view(), result.view()));
        DEJA_ASSERT_OK_AND_ASSIGN(Tensor got, ToHost(Device(), result));
        EXPECT_TRUE(Close(got.as<float>(), want.as<float>(), want.numel()));
      }
    }
  }
}

TEST(CudaCompareLogSoftmax, LargeLogitsStayFinite) {
  DEJA_REQUIRE_CUDA();
  // exp(1000) overflows f32: only a max-shifted implementation returns finite values.
  Tensor x = Tensor::Empty(DType::kF32, {1, 3});
  x.as<float>()[0] = 1000.f;
  x.as<float>()[1] = 999.f;
  x.as<float>()[2] = -1000.f;
  DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_x, ToDevice(Device(), x));
  DEJA_ASSERT_OK(LogSoftmax(Device(), d_x.view(), d_x.view()));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor out, ToHost(Device(), d_x));
  const double lse = 1000.0 + std::log1p(std::exp(-1.0));
  EXPECT_NEAR(out.as<float>()[0], 1000.0 - lse, 1e-5);
  EXPECT_NEAR(out.as<float>()[1], 999.0 - lse, 1e-5);
  EXPECT_NEAR(out.as<float>()[2], -1000.0 - lse, 1e-2);
}

void CheckTopK(const Tensor& x, int32_t k) {
  const int64_t rows = x.shape()[0];
  auto ref = MakeReferenceBackend();
  std::vector<float> want_v(rows * k);
  std::vector<int32_t> want_i(rows * k);
  ASSERT_TRUE(TopK(*ref, x.view(), k, want_v.data(), want_i.data()).ok());
  DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_x, ToDevice(Device(), x));
  DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_v, Device().Allocate(DType::kF32, Shape{rows, k}));
  DEJA_ASSERT_OK_AND_ASSIGN(DeviceTensor d_i, Device().Allocate(DType::kI32, Shape{rows, k}));
  DEJA_ASSERT_OK(TopK(Device(), d_x.view(), k, d_v.view().as<float>(), d_i.view().as<int32_t>()));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor got_v, ToHost(Device(), d_v));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor got_i, ToHost(Device(), d_i));
  EXPECT_EQ(std::vector<int32_t>(got_i.as<int32_t>(), got_i.as<int32_t>() + rows * k), want_i);
  EXPECT_EQ(0, std::memcmp(got_v.data(), want_v.data(), want_v.size() * sizeof(float)));
}

TEST(CudaCompareTopK, ShapeGrid) {
  DEJA_REQUIRE_CUDA();
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

TEST(CudaCompareTopK, EveryElementOfARow) {
  DEJA_REQUIRE_CUDA();
  // k = cols: the full order, NaNs last, every index exactly once.
  std::mt19937 rng(450);
  Tensor x = RandomTensor(rng, DType::kF32, {2, 300}, -3.f, 3.f);
  for (int64_t i = 0; i < x.numel(); i += 7) x.as<float>()[i] = std::round(x.as<float>()[i]);
  x.as<float>()[5] = std::numeric_limits<float>::quiet_NaN();
  CheckTopK(x, 300);
}

}  // namespace
}  // namespace deja::kernels
