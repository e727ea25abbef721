// bf16 weights meet bf16 activations (kernels/cpu/bf16_dot.h): the vectorised rounding against
// FloatToBF16 bit for bit; the CPU's portable path (x rounded, widened back, f32 kernels) and its
// AVX512-BF16 path against the reference, which rounds x the same way; and a check that the
// rounding is really there (the f32-x product is outside the tolerance).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace deja::kernels {
namespace {

using testing::BaseSeed;
using testing::Close;
using testing::CopyOf;
using testing::CpuBackends;
using testing::RandomRows;
using testing::RandomTensor;

// Restores the CPU's choice of kernel when a test leaves.
class Bf16DotTest : public ::testing::Test {
 protected:
  void TearDown() override { cpu::SetBf16DotEnabled(cpu::Bf16DotAvailable()); }
};

TEST_F(Bf16DotTest, RoundingMatchesScalarBitForBit) {
  std::mt19937 rng(BaseSeed("deja_bf16_dot_test"));
  std::vector<float> x;
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 100000; ++i) {
    uint32_t u = bits(rng);
    float f;
    std::memcpy(&f, &u, 4);
    x.push_back(f);  // every class: normals, subnormals, inf, NaN payloads
  }
  for (uint32_t u : {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x00008000u, 0x80018000u, 0x7f7fffffu,
                     0x7f800000u, 0xff800001u, 0x7fc00000u, 0x80000000u}) {
    float f;
    std::memcpy(&f, &u, 4);
    x.push_back(f);  // ties to even both ways, a subnormal tie, overflow to inf, NaNs, -0
  }
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{17},
                    static_cast<int64_t>(x.size())}) {
    std::vector<uint16_t> got(static_cast<size_t>(n) + 1, 0xabcd);
    cpu::RoundToBF16(x.data(), n, got.data());
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(got[i], FloatToBF16(x[i])) << "n=" << n << " i=" << i;
    }
    EXPECT_EQ(got[n], 0xabcd) << "wrote past n=" << n;
  }
}

struct Case {
  int64_t m, n, k;
};

// Linear, GatherLinear and GatherLinearT on bf16 weights against the reference at the f32
// tolerance, over shapes that hit the K tail (masked loads), every register-block remainder and
// both the small-M kernels and the sgemm path; Linear also over the weights tiled (odd K pads a
// pair, N not a multiple of 16 a partial tile, M = 9-15 the 2- and 1-tile passes, M past 16
// several blocks of x with a remainder).
void CheckAllOps(uint32_t seed) {
  const Case cases[] = {{1, 1, 1},     {1, 5, 31},     {3, 4, 32},    {6, 7, 33},
                        {7, 9, 64},    {13, 3, 95},    {16, 64, 257}, {32, 17, 1000},
                        {33, 9, 70},   {40, 130, 129}, {1, 200, 64},  {2, 97, 48},
                        {4, 160, 20},  {16, 150, 66},  {24, 49, 300}, {520, 35, 17},
                        {10, 50, 130}, {12, 33, 64},   {15, 40, 41}};
  auto ref = MakeReferenceBackend();
  for (const Case& c : cases) {
    SCOPED_TRACE("M=" + std::to_string(c.m) + " N=" + std::to_string(c.n) +
                 " K=" + std::to_string(c.k));
    std::mt19937 rng(seed++);
    Tensor x = RandomTensor(rng, DType::kF32, {c.m, c.k});
    Tensor w = RandomTensor(rng, DType::kBF16, {c.n, c.k});
    Tensor bias = RandomTensor(rng, DType::kBF16, {c.n});
    Tensor init = RandomTensor(rng, DType::kF32, {c.m, c.n});
    std::vector<int32_t> rows = RandomRows(rng, c.n, c.n + 2);
    const int64_t nr = static_cast<int64_t>(rows.size());
    Tensor init_g = RandomTensor(rng, DType::kF32, {c.m, nr});
    Tensor xt = RandomTensor(rng, DType::kF32, {c.m, nr});
    Tensor wt = RandomTensor(rng, DType::kBF16, {c.n, c.k});
    Tensor init_t = RandomTensor(rng, DType::kF32, {c.m, c.k});

    TensorView w_tiled;
    Tensor tiles = Tile16(w.view(), &w_tiled);  // the same weights in Layout::kTiled16

    Tensor want = CopyOf(init), want_g = CopyOf(init_g), want_t = CopyOf(init_t);
    ASSERT_TRUE(Linear(*ref, x.view(), w.view(), bias.view(), Activation::kRelu, true,
                       want.view()).ok());
    Tensor want_tiled = CopyOf(init);
    ASSERT_TRUE(Linear(*ref, x.view(), w_tiled, bias.view(), Activation::kRelu, true,
                       want_tiled.view()).ok());
    // The reference reads the tiled layout as the same matrix (identical sums, in order).
    ASSERT_EQ(std::memcmp(want_tiled.data(), want.data(), want.bytes()), 0);
    ASSERT_TRUE(GatherLinear(*ref, x.view(), w.view(), bias.view(), rows.data(), nr,
                             Activation::kNone, false, want_g.view()).ok());
    ASSERT_TRUE(GatherLinearT(*ref, xt.view(), wt.view(), rows.data(), nr, true,
                              want_t.view()).ok());
    for (auto& bc : CpuBackends()) {
      SCOPED_TRACE(bc.label);
      Tensor got = CopyOf(init), got_g = CopyOf(init_g), got_t = CopyOf(init_t);
      ASSERT_TRUE(Linear(*bc.backend, x.view(), w.view(), bias.view(), Activation::kRelu, true,
                         got.view()).ok());
      ASSERT_TRUE(GatherLinear(*bc.backend, x.view(), w.view(), bias.view(), rows.data(), nr,
                               Activation::kNone, false, got_g.view()).ok());
      ASSERT_TRUE(GatherLinearT(*bc.backend, xt.view(), wt.view(), rows.data(), nr, true,
                                got_t.view()).ok());
      EXPECT_TRUE(Close(got.as<float>(), want.as<float>(), got.numel())) << "Linear";
      if (bc.backend->SupportsTiled(OpId::kLinear)) {
        Tensor got_tiled = CopyOf(init);
        ASSERT_TRUE(Linear(*bc.backend, x.view(), w_tiled, bias.view(), Activation::kRelu, true,
                           got_tiled.view()).ok());
        EXPECT_TRUE(Close(got_tiled.as<float>(), want.as<float>(), got.numel())) << "tiled";
        Tensor got_plain = CopyOf(init);  // no bias, no ReLU, no accumulation
        Tensor want_plain = CopyOf(init);
        ASSERT_TRUE(Linear(*ref, x.view(), w.view(), TensorView{}, Activation::kNone, false,
                           want_plain.view()).ok());
        ASSERT_TRUE(Linear(*bc.backend, x.view(), w_tiled, TensorView{}, Activation::kNone, false,
                           got_plain.view()).ok());
        EXPECT_TRUE(Close(got_plain.as<float>(), want_plain.as<float>(), got.numel())) << "tiled";
      }
      EXPECT_TRUE(Close(got_g.as<float>(), want_g.as<float>(), got_g.numel())) << "GatherLinear";
      EXPECT_TRUE(Close(got_t.as<float>(), want_t.as<float>(), got_t.numel())) << "GatherLinearT";
    }
  }
}

TEST_F(Bf16DotTest, PortablePathMatchesReference) {
  cpu::SetBf16DotEnabled(false);
  ASSERT_FALSE(cpu::Bf16DotEnabled());
  CheckAllOps(BaseSeed("deja_bf16_dot_test") + 1000);
}

TEST_F(Bf16DotTest, Avx512Bf16PathMatchesReference) {
  if (!cpu::Bf16DotAvailable()) {
    GTEST_SKIP() << "this CPU has no AVX512-BF16 (or DEJA_CPU_BF16_DOT=0): dot path not run";
  }
  cpu::SetBf16DotEnabled(true);
  CheckAllOps(BaseSeed("deja_bf16_dot_test") + 2000);
}

// The same bf16 weights widened to f32 multiply x unrounded: for K in the hundreds the two
// differ far beyond the f32 tolerance, so the comparisons above would catch a path that forgot
// to round x.
TEST_F(Bf16DotTest, RoundingIsVisibleAboveTolerance) {
  std::mt19937 rng(BaseSeed("deja_bf16_dot_test") + 3000);
  const int64_t m = 4, n = 64, k = 512;
  Tensor x = RandomTensor(rng, DType::kF32, {m, k});
  Tensor w = RandomTensor(rng, DType::kBF16, {n, k});
  Tensor w32 = Tensor::Empty(DType::kF32, {n, k});
  for (int64_t i = 0; i < w.numel(); ++i) {
    w32.as<float>()[i] = LoadAsFloat(w.data(), DType::kBF16, static_cast<size_t>(i));
  }
  auto& cpu_backend = *CpuBackends().front().backend;
  Tensor bf = Tensor::Empty(DType::kF32, {m, n}), f32 = Tensor::Empty(DType::kF32, {m, n});
  ASSERT_TRUE(Linear(cpu_backend, x.view(), w.view(), TensorView{}, Activation::kNone, false,
                     bf.view()).ok());
  ASSERT_TRUE(Linear(cpu_backend, x.view(), w32.view(), TensorView{}, Activation::kNone, false,
                     f32.view()).ok());
  EXPECT_FALSE(Close(bf.as<float>(), f32.as<float>(), bf.numel()));
  EXPECT_TRUE(Close(bf.as<float>(), f32.as<float>(), bf.numel(), 2e-2));  // bf16's roundoff
}

// Only Linear and Embedding read tiled weights; the gathers say so, naming the argument.
TEST(TiledWeightsTest, OtherOpsRejectThemByName) {
  std::mt19937 rng(BaseSeed("deja_bf16_dot_test") + 4000);
  Tensor w = RandomTensor(rng, DType::kBF16, {32, 8});
  TensorView tiled;
  Tensor tiles = Tile16(w.view(), &tiled);
  Tensor x = RandomTensor(rng, DType::kF32, {2, 8});
  Tensor xt = RandomTensor(rng, DType::kF32, {2, 3});
  Tensor out = Tensor::Empty(DType::kF32, {2, 3}), out8 = Tensor::Empty(DType::kF32, {2, 8});
  const int32_t rows[3] = {0, 5, 17};
  for (auto& bc : CpuBackends()) {
    SCOPED_TRACE(bc.label);
    Status s = GatherLinear(*bc.backend, x.view(), tiled, TensorView{}, rows, 3,
                            Activation::kNone, false, out.view());
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("'w' is tiled"), std::string::npos) << s.message();
    s = GatherLinearT(*bc.backend, xt.view(), tiled, rows, 3, false, out8.view());
    EXPECT_NE(s.message().find("'wt' is tiled"), std::string::npos) << s.message();
  }
  // A tiled f16 matrix is not a layout anything reads.
  Tensor w16 = RandomTensor(rng, DType::kF16, {32, 8});
  TensorView tiled16;
  Tensor tiles16 = Tile16(w16.view(), &tiled16);
  Tensor out32 = Tensor::Empty(DType::kF32, {2, 32});
  auto ref = MakeReferenceBackend();
  Status s = Linear(*ref, x.view(), tiled16, TensorView{}, Activation::kNone, false, out32.view());
  EXPECT_NE(s.message().find("needs a 2-D bf16, int8 or int4 matrix"), std::string::npos) << s.message();
}

// Embedding over a tiled table (the tied lm head's table) gives the rows of the row-major one
// exactly (bf16 widened), accumulating or not; and a tile-aligned row slice reads as the slice.
TEST(TiledWeightsTest, EmbeddingAndRowSlice) {
  std::mt19937 rng(BaseSeed("deja_bf16_dot_test") + 6000);
  Tensor table = RandomTensor(rng, DType::kBF16, {75, 33});
  TensorView tiled;
  Tensor tiles = Tile16(table.view(), &tiled);
  const int32_t ids[5] = {0, 74, 16, 15, 33};
  Tensor init = RandomTensor(rng, DType::kF32, {5, 33});
  auto ref = MakeReferenceBackend();
  for (bool acc : {false, true}) {
    Tensor want = CopyOf(init);
    ASSERT_TRUE(Embedding(*ref, table.view(), ids, 5, acc, want.view()).ok());
    std::vector<Backend*> all = {ref.get()};
    for (auto& bc : CpuBackends()) all.push_back(bc.backend);
    for (Backend* b : all) {
      SCOPED_TRACE(b->name());
      Tensor got = CopyOf(init);
      Status s = Embedding(*b, tiled, ids, 5, acc, got.view());
      if (!b->SupportsTiled(OpId::kEmbedding)) {
        EXPECT_NE(s.message().find("'table' is tiled"), std::string::npos) << s.message();
        continue;
      }
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.bytes()), 0);
    }
  }
  // Rows [16, 75) of the tiled table against rows [16, 75) of the row-major one, through Linear.
  Tensor x = RandomTensor(rng, DType::kF32, {3, 33});
  Tensor want = Tensor::Empty(DType::kF32, {3, 59}), got = Tensor::Empty(DType::kF32, {3, 59});
  ASSERT_TRUE(Linear(*ref, x.view(), table.view().RowSlice(16, 75), TensorView{},
                     Activation::kNone, false, want.view()).ok());
  ASSERT_TRUE(Linear(*ref, x.view(), tiled.RowSlice(16, 75), TensorView{}, Activation::kNone,
                     false, got.view()).ok());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.bytes()), 0);
}

// The tiled Linear's x packing from f32 in one pass (8-row blocks vectorised with a word
// transpose) gives the bits of rounding then packing, for every block shape, K tails and NaNs.
TEST(TiledWeightsTest, RoundPackEqualsRoundThenPack) {
  std::mt19937 rng(BaseSeed("deja_bf16_dot_test") + 7000);
  std::normal_distribution<float> normal(0.f, 3.f);
  for (int64_t m : {1, 3, 8, 9, 15, 16, 21, 24, 32}) {
    for (int64_t k : {1, 2, 15, 16, 17, 31, 48, 64, 100, 2048}) {
      SCOPED_TRACE("M=" + std::to_string(m) + " K=" + std::to_string(k));
      std::vector<float> x(static_cast<size_t>(m * k));
      for (float& v : x) v = normal(rng);
      x[0] = std::numeric_limits<float>::quiet_NaN();
      if (x.size() > 5) x[5] = -std::numeric_limits<float>::infinity();
      std::vector<uint16_t> bits(x.size());
      cpu::RoundToBF16(x.data(), m * k, bits.data());
      const size_t packed = static_cast<size_t>(m * TiledCols(k));
      std::vector<uint16_t> want(packed, 0xabcd), got(packed, 0x1234);
      cpu::PackBf16Pairs(bits.data(), m, k, want.data());
      cpu::RoundPackBf16Pairs(x.data(), m, k, got.data());
      ASSERT_EQ(got, want);
    }
  }
}

TEST(TiledWeightsTest, TileAndUntileRoundTrip) {
  std::mt19937 rng(BaseSeed("deja_bf16_dot_test") + 5000);
  for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 1}, {17, 3}, {32, 64}, {45, 129}}) {
    Tensor w = RandomTensor(rng, DType::kBF16, {n, k});
    TensorView tiled;
    Tensor tiles = Tile16(w.view(), &tiled);
    EXPECT_EQ(tiled.layout, Layout::kTiled16);
    EXPECT_EQ(tiled.bytes(), static_cast<size_t>(TiledRows(n) * TiledCols(k)) * 2);
    const auto* t = tiles.as<uint16_t>();
    for (int64_t r = 0; r < TiledRows(n); ++r) {
      for (int64_t c = 0; c < TiledCols(k); ++c) {
        const uint16_t want = r < n && c < k ? w.as<uint16_t>()[r * k + c] : 0;  // zero padding
        ASSERT_EQ(t[TiledIndex(r, c, k)], want) << r << "," << c;
      }
    }
    Tensor back = Untile16(tiled);
    ASSERT_EQ(std::memcmp(back.data(), w.data(), w.bytes()), 0);
  }
}

}  // namespace
}  // namespace deja::kernels
