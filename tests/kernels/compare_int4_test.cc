// int4 weights in groups (common/int4.h) on every backend against the reference, on fresh seeded
// random inputs: Linear at decode and prefill sizes (partial row blocks, partial tiles and tile
// groups, one to many groups per row, group sizes 8 to 256), every epilogue, x >= 0 and x = 0
// rows; the CPU's AVX512-VNNI kernel and its portable loop against each other. The product
// against the float weights stays within the bound that the two quantizations give. The
// quantizer itself: layout, the error bound per element, zero groups and padding, refusal of
// bad groups and non-finite weights; the op's refusal of malformed int4 views. CUDA runs the
// Linear cases on the device (inputs, packed values and scales copied there).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/int4.h"
#include "common/quantize.h"
#include "kernels/cpu/amx.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/i8_vnni.h"
#include "kernels/ops.h"
#include "kernels/reference/reference_ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace deja::kernels {
namespace {

using testing::BackendTest;
using testing::Close;
using testing::ComparedBackends;
using testing::CpuBackends;
using testing::RandomTensor;
using testing::Runs;

// The backends and the reference sum the same integers exactly; only the f32 steps differ.
constexpr double kTol = testing::kRelTol;

uint32_t BaseSeed() { return testing::BaseSeed("compare_int4_test"); }

// A random f32 matrix with rows (and groups) of different magnitudes, quantized to int4.
struct Int4Case {
  Tensor w;
  Int4Matrix q;
};

Int4Case MakeInt4(std::mt19937& rng, int64_t rows, int64_t cols, int32_t group) {
  Int4Case c;
  c.w = RandomTensor(rng, DType::kF32, {rows, cols});
  std::uniform_real_distribution<float> mag(0.05f, 3.f);
  for (int64_t r = 0; r < rows; ++r) {
    const float s = mag(rng);
    for (int64_t k = 0; k < cols; ++k) c.w.as<float>()[r * cols + k] *= s * (1 + (k / group) % 3);
  }
  StatusOr<Int4Matrix> q = QuantizeInt4(c.w.view(), group, "w");
  CHECK(q.ok()) << q.status().ToString();
  c.q = std::move(q).value();
  return c;
}

struct LinearCase {
  int64_t m, n, k;
  int32_t group;
  bool bias, relu, accumulate;
  bool x_nonnegative = false;
  std::string Label() const {
    return "M=" + std::to_string(m) + " N=" + std::to_string(n) + " K=" + std::to_string(k) +
           " group=" + std::to_string(group) + (bias ? " bias" : "") + (relu ? " relu" : "") +
           (accumulate ? " accumulate" : "") + (x_nonnegative ? " x>=0" : "");
  }
};

// |got - x . w| within the two quantizations' bound: x's error is at most scale_x / 2 per
// element and w's at most |scale_g| (common/int4.h), so per output
// |err| <= sum_k (|x_k| |dw_k| + |dx_k| |w_k| + |dx_k| |dw_k|) with those bounds.
::testing::AssertionResult WithinQuantizationBound(const float* got, const Tensor& x,
                                                   const Int4Case& w, const Tensor& bias,
                                                   const LinearCase& c, const float* init) {
  const int64_t groups = c.k / c.group;
  for (int64_t m = 0; m < c.m; ++m) {
    const float* xm = x.as<float>() + m * c.k;
    float amax = 0.f;
    for (int64_t k = 0; k < c.k; ++k) amax = std::max(amax, std::fabs(xm[k]));
    const double dx = amax / 127.0 / 2;
    for (int64_t n = 0; n < c.n; ++n) {
      double want = 0, bound = 0;
      for (int64_t k = 0; k < c.k; ++k) {
        const double wk = w.w.as<float>()[n * c.k + k];
        const double dw = std::fabs(w.q.scale.as<float>()[Int4ScaleIndex(n, k / c.group, groups)]);
        want += xm[k] * wk;
        bound += std::fabs(xm[k]) * dw + dx * std::fabs(wk) + dx * dw;
      }
      want += c.bias ? bias.as<float>()[n] : 0.f;
      if (c.relu) want = std::max(want, 0.0);
      if (c.accumulate) want += init[m * c.n + n];
      const double g = got[m * c.n + n];
      if (!(std::fabs(g - want) <= bound * (1 + 1e-6) + 1e-5 * (std::fabs(want) + 1e-6))) {
        return ::testing::AssertionFailure() << "row " << m << " col " << n << ": got " << g
                                             << ", want " << want << ", bound " << bound;
      }
    }
  }
  return ::testing::AssertionSuccess();
}

void CheckLinear(Backend& b, const LinearCase& c, uint32_t seed) {
  SCOPED_TRACE(c.Label() + " seed=" + std::to_string(seed));
  if (!Runs(b, OpId::kLinear, DType::kI4)) return;  // int4 is tiled by definition
  std::mt19937 rng(seed);
  Tensor x = RandomTensor(rng, DType::kF32, {c.m, c.k}, c.x_nonnegative ? 0.f : -1.f);
  if (c.m > 2) {  // a row of zeros (scale 0)
    for (int64_t k = 0; k < c.k; ++k) x.as<float>()[2 * c.k + k] = 0.f;
  }
  Int4Case w = MakeInt4(rng, c.n, c.k, c.group);
  Tensor bias = RandomTensor(rng, DType::kF32, {c.n});
  Tensor init = RandomTensor(rng, DType::kF32, {c.m, c.n});
  if (!c.accumulate) {
    std::fill(init.as<float>(), init.as<float>() + init.numel(),
              std::numeric_limits<float>::quiet_NaN());
  }
  const Activation act = c.relu ? Activation::kRelu : Activation::kNone;
  auto ref = MakeReferenceBackend();
  Tensor want = testing::CopyOf(init);
  DEJA_ASSERT_OK(Linear(*ref, x.view(), w.q.view(), c.bias ? bias.view() : TensorView{}, act,
                        c.accumulate, want.view()));
  // On the backend's device (a copy on the CPU): x, the packed values, the scales, bias, out.
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_x, b.ToBackend(x));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_packed, b.ToBackend(w.q.packed));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_scale, b.ToBackend(w.q.scale));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_bias, b.ToBackend(bias));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_out, b.ToBackend(init));
  TensorView d_w = w.q.view();
  d_w.data = d_packed.data();
  d_w.device = d_packed.device();
  d_w.scale = d_scale.as<float>();
  DEJA_ASSERT_OK(Linear(b, d_x.view(), d_w, c.bias ? d_bias.view() : TensorView{}, act,
                        c.accumulate, d_out.view()));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor got, b.ToHost(d_out.view()));
  EXPECT_TRUE(Close(got.as<float>(), want.as<float>(), got.numel(), kTol));
  EXPECT_TRUE(WithinQuantizationBound(got.as<float>(), x, w, bias, c, init.as<float>()));
}

class CompareInt4 : public BackendTest {};

TEST_P(CompareInt4, LinearGrid) {
  // M: one row, partial and whole blocks of 4, decode batches, prefill sizes; N: partial tiles
  // and groups of tiles; K and the group: one group of 8, many small groups, one large.
  const int64_t ms[] = {1, 2, 3, 4, 5, 16, 17, 37};
  struct NKG {
    int64_t n, k;
    int32_t group;
  };
  const NKG nkgs[] = {{1, 8, 8},      {17, 16, 8},     {50, 64, 32},    {130, 256, 128},
                      {64, 1024, 64}, {33, 2048, 128}, {96, 512, 256}, {200, 384, 128}};
  uint32_t seed = BaseSeed();
  int i = 0;
  for (int64_t m : ms) {
    for (const NKG& s : nkgs) {
      const int v = i++ % 8;
      CheckLinear(backend(), {m, s.n, s.k, s.group, (v & 1) != 0, (v & 2) != 0, (v & 4) != 0,
                              i % 3 == 0},
                  seed++);
    }
  }
}

TEST_P(CompareInt4, LinearModelSized) {
  // An OPT-1.3B fc1-like matrix at decode, batch and prefill sizes.
  uint32_t seed = BaseSeed() + 2000;
  for (int64_t m : {1, 16, 64})
    CheckLinear(backend(), {m, 1024, 2048, 128, true, true, false}, seed++);
}

TEST_P(CompareInt4, OtherOpsRefuseInt4) {
  // Only Linear reads int4: the gathers refuse it, naming the argument.
  if (!backend().device().is_host()) {
    GTEST_SKIP() << "the inputs are host tensors, which a device backend refuses before the dtype";
  }
  std::mt19937 rng(BaseSeed() + 3000);
  Int4Case w = MakeInt4(rng, 32, 64, 32);
  Tensor x = RandomTensor(rng, DType::kF32, {2, 64});
  Tensor out = Tensor::Zeros(DType::kF32, {2, 4});
  const int32_t rows[] = {0, 1, 2, 3};
  Status s = GatherLinear(backend(), x.view(), w.q.view(), TensorView{}, rows, 4,
                          Activation::kNone, false, out.view());
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.ToString().find("'w'"), std::string::npos) << s.ToString();
}

DEJA_INSTANTIATE_BACKEND_TEST(CompareInt4, ComparedBackends());

TEST(CpuInt4, VnniKernelAndPortableLoopAgree) {
  // The portable loop (VNNI switched off) against the reference, then against the VNNI kernel.
  uint32_t seed = BaseSeed() + 4000;
  for (const auto& cpu : CpuBackends()) {
    SCOPED_TRACE(cpu.label);
    std::mt19937 rng(seed++);
    const int64_t m = 7, n = 70, k = 256;
    Tensor x = RandomTensor(rng, DType::kF32, {m, k});
    Int4Case w = MakeInt4(rng, n, k, 64);
    Tensor simd = Tensor::Empty(DType::kF32, {m, n}), plain = Tensor::Empty(DType::kF32, {m, n});
    DEJA_ASSERT_OK(Linear(*cpu.backend, x.view(), w.q.view(), TensorView{}, Activation::kNone,
                          false, simd.view()));
    cpu::SetVnniEnabled(false);
    DEJA_ASSERT_OK(Linear(*cpu.backend, x.view(), w.q.view(), TensorView{}, Activation::kNone,
                          false, plain.view()));
    cpu::SetVnniEnabled(cpu::VnniAvailable());
    auto ref = MakeReferenceBackend();
    Tensor want = Tensor::Empty(DType::kF32, {m, n});
    DEJA_ASSERT_OK(Linear(*ref, x.view(), w.q.view(), TensorView{}, Activation::kNone, false,
                          want.view()));
    EXPECT_TRUE(Close(plain.as<float>(), want.as<float>(), plain.numel(), kTol));
    EXPECT_TRUE(Close(simd.as<float>(), plain.as<float>(), simd.numel(), kTol));
  }
}

TEST(CpuInt4, QuantizedRowsAreTheSameBitsWithAndWithoutAvx512) {
  // int4's activation quantizer: the AVX-512 form against the element-by-element one, over row
  // lengths with and without a 16-lane tail, groups of 8 to 256, a zero row, a row with one
  // huge value and rows whose products sit on rounding ties.
  if (!cpu::VnniAvailable()) GTEST_SKIP() << "no AVX512-VNNI on this CPU";
  std::mt19937 rng(BaseSeed() + 4500);
  std::normal_distribution<float> normal(0.f, 3.f);
  for (int64_t group : {8, 16, 24, 64, 128, 256}) {
    for (int64_t k : {group, 2 * group, 5 * group, int64_t{2048}}) {
      if (k % group != 0) continue;
      for (int kind = 0; kind < 4; ++kind) {
        SCOPED_TRACE("group " + std::to_string(group) + " k " + std::to_string(k) + " kind " +
                     std::to_string(kind));
        std::vector<float> x(static_cast<size_t>(k));
        for (float& v : x) v = kind == 1 ? 0.f : normal(rng);
        if (kind == 2) x[rng() % k] = 1e30f;
        if (kind == 3) {  // max 127: every integer and half-integer product is exact
          for (float& v : x) v = static_cast<float>(static_cast<int>(rng() % 255) - 127) * 0.5f;
          x[0] = 127.f;
        }
        std::vector<int8_t> q_simd(k), q_plain(k);
        std::vector<int32_t> s_simd(k / group), s_plain(k / group);
        const float a = cpu::QuantizeRowS8(x.data(), k, group, q_simd.data(), s_simd.data());
        cpu::SetVnniEnabled(false);
        const float b = cpu::QuantizeRowS8(x.data(), k, group, q_plain.data(), s_plain.data());
        cpu::SetVnniEnabled(true);
        EXPECT_EQ(std::memcmp(&a, &b, sizeof(a)), 0) << a << " vs " << b;
        EXPECT_EQ(q_simd, q_plain);
        EXPECT_EQ(s_simd, s_plain);
      }
    }
  }
}

TEST(CpuInt4, AmxKernelMatchesVnniBitForBit) {
  // The tile kernel and the VNNI kernel sum each group's integers exactly and take the f32 steps
  // in the same order, so every output is the same float (amx.h). Rows from the tiles' minimum
  // through one and two row blocks (unpacked per group) to several (unpacked per tile pair);
  // odd tile counts, partial tiles, one to many groups of 64 to 256.
  if (!cpu::AmxAvailable()) {
    GTEST_SKIP() << "this CPU has no AMX-INT8 (or the kernel refused the tile state, or "
                    "DEJA_CPU_AMX=0): nothing to compare";
  }
  uint32_t seed = BaseSeed() + 6000;
  struct NKG {
    int64_t n, k;
    int32_t group;
  };
  const NKG nkgs[] = {{16, 64, 64}, {17, 128, 64}, {70, 256, 128}, {300, 1024, 128},
                      {48, 512, 256}, {33, 2048, 128}};
  int i = 0;
  for (const auto& cpu : CpuBackends()) {
    SCOPED_TRACE(cpu.label);
    for (int64_t m : {cpu::kAmxI4MinRows, int64_t{5}, int64_t{15}, int64_t{16}, int64_t{17},
                      int64_t{32}, int64_t{33}, int64_t{70}}) {
      for (const NKG& s : nkgs) {
        SCOPED_TRACE("M=" + std::to_string(m) + " N=" + std::to_string(s.n) + " K=" +
                     std::to_string(s.k) + " group=" + std::to_string(s.group));
        std::mt19937 rng(seed++);
        Tensor x = RandomTensor(rng, DType::kF32, {m, s.k}, ++i % 3 == 0 ? 0.f : -1.f);
        Int4Case w = MakeInt4(rng, s.n, s.k, s.group);
        Tensor bias = RandomTensor(rng, DType::kF32, {s.n});
        Tensor init = RandomTensor(rng, DType::kF32, {m, s.n});
        const bool relu = i % 2 == 0, accumulate = i % 4 == 1;
        Tensor got[2] = {testing::CopyOf(init), testing::CopyOf(init)};
        for (int amx = 0; amx < 2; ++amx) {
          cpu::SetAmxEnabled(amx == 1);
          DEJA_ASSERT_OK(Linear(*cpu.backend, x.view(), w.q.view(),
                                i % 3 == 1 ? bias.view() : TensorView{},
                                relu ? Activation::kRelu : Activation::kNone, accumulate,
                                got[amx].view()));
        }
        cpu::SetAmxEnabled(true);
        EXPECT_EQ(std::memcmp(got[0].data(), got[1].data(), got[0].numel() * sizeof(float)), 0);
      }
    }
  }
}

TEST(QuantizeInt4, LayoutErrorBoundZeroGroupsAndPadding) {
  std::mt19937 rng(BaseSeed() + 5000);
  const int64_t rows = 21, cols = 96;
  const int32_t group = 32;
  Tensor w = RandomTensor(rng, DType::kF32, {rows, cols});
  for (int64_t k = 32; k < 64; ++k) w.as<float>()[5 * cols + k] = 0.f;  // row 5, group 1: zeros
  w.as<float>()[7 * cols + 3] = -4.f;                                   // an extreme < 0
  w.as<float>()[8 * cols + 70] = 4.f;                                   // an extreme > 0
  StatusOr<Int4Matrix> q = QuantizeInt4(w.view(), group, "w");
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  const auto* packed = q->packed.as<uint8_t>();
  const float* scale = q->scale.as<float>();
  EXPECT_EQ(q->packed.numel(), Int4Bytes(rows, cols));
  EXPECT_EQ(q->view().bytes(), static_cast<size_t>(Int4Bytes(rows, cols)));
  const int64_t groups = cols / group;
  double e2 = 0, n2 = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < cols; ++k) {
      const float s = scale[Int4ScaleIndex(r, k / group, groups)];
      const int v = Int4Value(packed, r, k, cols);
      ASSERT_GE(v, -8);
      ASSERT_LE(v, 7);
      const double wk = w.as<float>()[r * cols + k];
      double m = 0;  // the group's largest magnitude
      for (int64_t i = k / group * group; i < (k / group + 1) * group; ++i) {
        m = std::max(m, std::fabs(static_cast<double>(w.as<float>()[r * cols + i])));
      }
      const double bound = std::max(std::fabs(s) / 2.0, m - 7.0 * std::fabs(s));
      EXPECT_LE(std::fabs(v * s - wk), bound * (1 + 1e-5) + 1e-7) << r << " " << k;
      e2 += (v * s - wk) * (v * s - wk);
      n2 += wk * wk;
    }
  }
  EXPECT_NEAR(q->relative_error, std::sqrt(e2 / n2), 1e-6);
  EXPECT_GT(q->relative_error, 0.0);
  EXPECT_LT(q->relative_error, 0.2);
  EXPECT_EQ(scale[Int4ScaleIndex(5, 1, groups)], 0.f);
  EXPECT_EQ(Int4Value(packed, 5, 40, cols), 0);
  // A scale is m / -8 times a searched factor, and the extreme m is -8 steps (clamped there).
  auto searched = [](float scale, float m) {
    for (float f : kInt4ScaleSearch)
      if (scale == m / -8.f * f) return true;
    return false;
  };
  EXPECT_TRUE(searched(scale[Int4ScaleIndex(7, 0, groups)], -4.f));
  EXPECT_EQ(Int4Value(packed, 7, 3, cols), -8);
  EXPECT_TRUE(searched(scale[Int4ScaleIndex(8, 2, groups)], 4.f));
  EXPECT_EQ(Int4Value(packed, 8, 70, cols), -8);
  for (int64_t r = rows; r < TiledRows(rows); ++r) {  // the last tile's padding reads 0
    for (int64_t k = 0; k < cols; ++k) EXPECT_EQ(Int4Value(packed, r, k, cols), 0);
    for (int64_t g = 0; g < groups; ++g) EXPECT_EQ(scale[Int4ScaleIndex(r, g, groups)], 0.f);
  }
  // A row slice at a tile boundary reads the same elements.
  TensorView slice = q->view().RowSlice(16, rows);
  EXPECT_EQ(Int4Value(static_cast<const uint8_t*>(slice.data), 2, 50, cols),
            Int4Value(packed, 18, 50, cols));
  EXPECT_EQ(slice.scale[Int4ScaleIndex(2, 1, groups)], scale[Int4ScaleIndex(18, 1, groups)]);
}

// The checkpoint's row-major form (deja quantize --bits 4) and back: the whole matrix tiles to
// QuantizeInt4's bytes and scales exactly, and a column range at group boundaries tiles to what
// quantizing those columns alone gives (a row-parallel shard), over odd row counts.
TEST(QuantizeInt4, CheckpointFormRoundTripsAndSlicesColumns) {
  std::mt19937 rng(BaseSeed() + 5000);
  for (auto [rows, cols, group] : {std::tuple<int64_t, int64_t, int32_t>{37, 256, 64},
                                   {16, 96, 32},
                                   {5, 384, 128},
                                   {50, 64, 8}}) {
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols) + "/" + std::to_string(group));
    Int4Case c = MakeInt4(rng, rows, cols, group);
    const Int4Rows r = Int4ToRows(c.q);
    ASSERT_EQ(r.packed.shape(), (Shape{rows, cols / 2}));
    ASSERT_EQ(r.scale.shape(), (Shape{rows, cols / group}));
    for (int64_t n = 0; n < rows; ++n) {
      for (int64_t k = 0; k < cols; ++k) {
        const int nibble = (r.packed.as<uint8_t>()[n * cols / 2 + k / 2] >> (k % 2 * 4)) & 15;
        ASSERT_EQ(nibble - 8, Int4Value(c.q.packed.as<uint8_t>(), n, k, cols)) << n << "," << k;
      }
    }
    const Int4Matrix back = TileInt4Rows(r.packed.as<uint8_t>(), r.scale.as<float>(),
                                         Shape{rows, cols}, group, 0, cols);
    ASSERT_EQ(back.packed.numel(), c.q.packed.numel());
    EXPECT_EQ(std::memcmp(back.packed.data(), c.q.packed.data(), back.packed.numel()), 0);
    EXPECT_EQ(std::memcmp(back.scale.data(), c.q.scale.data(), back.scale.numel() * 4), 0);
    EXPECT_EQ(back.group, group);
    EXPECT_EQ(back.shape, c.q.shape);
    // Columns [group, cols - group) alone.
    const int64_t begin = group, end = cols - group;
    if (end <= begin) continue;
    Tensor part = Tensor::Empty(DType::kF32, {rows, end - begin});
    for (int64_t n = 0; n < rows; ++n) {
      std::memcpy(part.as<float>() + n * (end - begin), c.w.as<float>() + n * cols + begin,
                  (end - begin) * sizeof(float));
    }
    StatusOr<Int4Matrix> want = QuantizeInt4(part.view(), group, "part");
    ASSERT_TRUE(want.ok());
    const Int4Matrix got = TileInt4Rows(r.packed.as<uint8_t>(), r.scale.as<float>(),
                                        Shape{rows, cols}, group, begin, end);
    ASSERT_EQ(got.packed.numel(), want->packed.numel());
    EXPECT_EQ(std::memcmp(got.packed.data(), want->packed.data(), got.packed.numel()), 0);
    EXPECT_EQ(std::memcmp(got.scale.data(), want->scale.data(), got.scale.numel() * 4), 0);
  }
}

TEST(QuantizeInt4, RefusesBadGroupsAndNonFiniteWeightsByName) {
  Tensor w = Tensor::Zeros(DType::kF32, {4, 48});
  for (int32_t group : {0, -8, 12, 32, 96}) {
    auto q = QuantizeInt4(w.view(), group, "layers.0.fc1");
    EXPECT_FALSE(q.ok()) << group;
    EXPECT_NE(q.status().ToString().find("layers.0.fc1"), std::string::npos);
    EXPECT_NE(q.status().ToString().find("group"), std::string::npos);
  }
  w.as<float>()[2 * 48 + 5] = std::numeric_limits<float>::infinity();
  auto q = QuantizeInt4(w.view(), 16, "layers.0.fc1");
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.status().ToString().find("row 2"), std::string::npos) << q.status().ToString();
}

TEST(QuantizeInt4, LinearRefusesMalformedViewsByField) {
  std::mt19937 rng(BaseSeed() + 6000);
  Int4Case w = MakeInt4(rng, 16, 64, 32);
  Tensor x = RandomTensor(rng, DType::kF32, {1, 64});
  Tensor out = Tensor::Zeros(DType::kF32, {1, 16});
  auto cpu = MakeCpuBackend(1);
  auto expect_bad = [&](TensorView v, const char* what) {
    Status s = Linear(*cpu, x.view(), v, TensorView{}, Activation::kNone, false, out.view());
    EXPECT_FALSE(s.ok()) << what;
    EXPECT_NE(s.ToString().find("'w'"), std::string::npos) << s.ToString();
    EXPECT_NE(s.ToString().find(what), std::string::npos) << s.ToString();
  };
  TensorView v = w.q.view();
  v.scale = nullptr;
  expect_bad(v, "scales");
  v = w.q.view();
  v.scale_group = 24;
  expect_bad(v, "group");
  v = w.q.view();
  v.layout = Layout::kRowMajor;
  expect_bad(v, "tiled");
}

}  // namespace
}  // namespace deja::kernels
