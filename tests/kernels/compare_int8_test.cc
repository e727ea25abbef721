// Weight-only int8 (common/quantize.h) on every backend against the reference, on fresh seeded
// random inputs: Linear over row-major and kTiled16 int8 weights (decode sizes widened in
// registers, longer x through the bf16 scratch, odd K and partial tiles), the Deja Vu gathers
// (row scales for GatherLinear, column scales for GatherLinearT), the embedding lookup, the CPU's
// portable path (AVX512-BF16 off) and each SIMD target. The CPU's path over tiled int8 (x
// quantized per row at every M, AVX512-VNNI; kernels/cpu/i8_vnni.h) against the reference that quantizes
// x alike (ref::LinearI8QuantizedX), and its error against the product with x unquantized within
// the quantization's bound; the bf16-x path at the same sizes with it switched off. Also the
// quantizer itself: the error bound per element, scales, zero rows, and refusal of non-finite
// weights; and the ops' refusal of int8 without scales.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/quantize.h"
#include "hwy/targets.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/amx.h"
#include "kernels/cpu/i8_vnni.h"
#include "kernels/ops.h"
#include "kernels/reference/reference_ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace deja::kernels {
namespace {

using testing::AbsCopy;
using testing::BackendTest;
using testing::Close;
using testing::ComparedBackends;
using testing::CopyOf;
using testing::CpuBackends;
using testing::RandomRows;
using testing::RandomTensor;
using testing::Runs;

// The reference and the backends see the same int8 values and scales and round x to bf16 alike
// (kernels/op_table.h): only summation order and the f32 scale product differ.
constexpr double kTol = testing::kRelTol;

uint32_t BaseSeed() { return testing::BaseSeed("compare_int8_test"); }

// A random f32 matrix quantized per row, on the host and copied to a backend (values and scales;
// tiled on request).
struct Int8Matrix {
  QuantizedMatrix host;
  Tensor tiles;  // host kTiled16 copy when tiled
  Tensor d_q, d_scale;
  TensorView host_view, device_view;
};

Int8Matrix MakeInt8(std::mt19937& rng, Backend& b, int64_t rows, int64_t cols, bool tiled) {
  Int8Matrix m;
  // Rows of different magnitudes, so the scales differ.
  Tensor w = RandomTensor(rng, DType::kF32, {rows, cols});
  std::uniform_real_distribution<float> mag(0.05f, 3.f);
  for (int64_t r = 0; r < rows; ++r) {
    const float s = mag(rng);
    for (int64_t c = 0; c < cols; ++c) w.as<float>()[r * cols + c] *= s;
  }
  StatusOr<QuantizedMatrix> q = QuantizeRowsInt8(w.view(), "w");
  CHECK(q.ok()) << q.status().ToString();
  m.host = std::move(q).value();
  m.host_view = m.host.view();
  TensorView src = m.host_view;
  if (tiled) m.tiles = Tile16(m.host_view, &src);
  StatusOr<Tensor> dq = b.ToBackend(tiled ? m.tiles : m.host.q);
  StatusOr<Tensor> ds = b.ToBackend(m.host.scale);
  CHECK(dq.ok() && ds.ok());
  m.d_q = std::move(dq).value();
  m.d_scale = std::move(ds).value();
  m.device_view = src;
  m.device_view.data = m.d_q.data();
  m.device_view.device = m.d_q.device();
  m.device_view.scale = m.d_scale.as<float>();
  return m;
}

struct LinearCase {
  int64_t m, n, k;
  bool tiled, bias, relu, accumulate;
  bool x_nonnegative = false;  // x as after a ReLU (fc2's input)
  std::string Label() const {
    return "M=" + std::to_string(m) + " N=" + std::to_string(n) + " K=" + std::to_string(k) +
           (tiled ? " tiled" : "") + (bias ? " bias" : "") + (relu ? " relu" : "") +
           (accumulate ? " accumulate" : "") + (x_nonnegative ? " x>=0" : "");
  }
};

// Whether `b` quantizes x in this case: the CPU's prefill path over tiled int8 weights.
bool QuantizesX(const Backend& b, const LinearCase& c) {
  return b.kind() == BackendKind::kCpu && c.tiled && cpu::Bf16DotEnabled() && cpu::QuantizesX();
}

// Each element of the quantized-x product within the bound of x's quantization of the product
// with x as given: |x - q * scale| <= scale / 2 per element (scale = max |x_row| / 127, or / 255
// for a row without negative values), so
// |got - want| <= scale / 2 * sum_k |w[n, k]| (int8 value times its scale), plus a relative
// 1e-5 for the f32 arithmetic. Also the norm-wise error, against the bf16 rounding of x that the
// other path makes (2^-9 relative per element).
::testing::AssertionResult WithinQuantizationBound(const float* got, const Tensor& x,
                                                   const Int8Matrix& w, const Tensor& bias,
                                                   const LinearCase& c, const float* init) {
  const int64_t m_rows = c.m, k_dim = c.k, n_rows = c.n;
  const int8_t* q = w.host.q.as<int8_t>();
  const float* sw = w.host.scale.as<float>();
  double diff2 = 0, ref2 = 0;
  for (int64_t m = 0; m < m_rows; ++m) {
    const float* xm = x.as<float>() + m * k_dim;
    double amax = 0, lo = 0;
    for (int64_t k = 0; k < k_dim; ++k) {
      amax = std::max(amax, std::fabs(static_cast<double>(xm[k])));
      lo = std::min(lo, static_cast<double>(xm[k]));
    }
    const double scale = amax / (lo >= 0 ? 255 : 127);
    for (int64_t n = 0; n < n_rows; ++n) {
      double dot = 0, abs_w = 0;
      for (int64_t k = 0; k < k_dim; ++k) {
        const double wk = static_cast<double>(q[n * k_dim + k]) * sw[n];
        dot += xm[k] * wk;
        abs_w += std::fabs(wk);
      }
      double want = dot + (c.bias ? bias.as<float>()[n] : 0.f);
      if (c.relu) want = std::max(want, 0.0);  // ReLU is 1-Lipschitz: the bound carries over
      if (c.accumulate) want += init[m * n_rows + n];
      const double g = got[m * n_rows + n];
      const double bound = scale / 2 * abs_w * (1 + 1e-6) + 1e-5 * (std::fabs(want) + 1e-6);
      if (!(std::fabs(g - want) <= bound)) {
        return ::testing::AssertionFailure() << "row " << m << " col " << n << ": got " << g
                                             << ", want " << want << ", bound " << bound;
      }
      diff2 += (g - want) * (g - want);
      ref2 += want * want;
    }
  }
  return ::testing::AssertionSuccess() << "relative error " << std::sqrt(diff2 / ref2);
}

void CheckLinear(Backend& b, const LinearCase& c, uint32_t seed) {
  SCOPED_TRACE(c.Label() + " seed=" + std::to_string(seed));
  if (!Runs(b, OpId::kLinear, DType::kI8, c.tiled ? Layout::kTiled16 : Layout::kRowMajor)) return;
  std::mt19937 rng(seed);
  Tensor x = RandomTensor(rng, DType::kF32, {c.m, c.k}, c.x_nonnegative ? 0.f : -1.f);
  Int8Matrix w = MakeInt8(rng, b, c.n, c.k, c.tiled);
  Tensor bias = RandomTensor(rng, DType::kF32, {c.n});
  Tensor init = RandomTensor(rng, DType::kF32, {c.m, c.n});
  if (!c.accumulate) {
    std::fill(init.as<float>(), init.as<float>() + init.numel(),
              std::numeric_limits<float>::quiet_NaN());
  }
  const Activation act = c.relu ? Activation::kRelu : Activation::kNone;
  auto ref = MakeReferenceBackend();
  Tensor want = CopyOf(init);
  const bool quantized_x = QuantizesX(b, c);
  if (quantized_x) {
    DEJA_ASSERT_OK(ref::LinearI8QuantizedX(x.view(), w.host_view,
                                           c.bias ? bias.view() : TensorView{}, act, c.accumulate,
                                           want.view()));
  } else {
    DEJA_ASSERT_OK(Linear(*ref, x.view(), w.host_view, c.bias ? bias.view() : TensorView{}, act,
                          c.accumulate, want.view()));
  }
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_x, b.ToBackend(x));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_bias, b.ToBackend(bias));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_out, b.ToBackend(init));
  DEJA_ASSERT_OK(Linear(b, d_x.view(), w.device_view, c.bias ? d_bias.view() : TensorView{}, act,
                        c.accumulate, d_out.view()));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor got, b.ToHost(d_out.view()));
  EXPECT_TRUE(Close(got.as<float>(), want.as<float>(), got.numel(), kTol));
  if (quantized_x) {
    EXPECT_TRUE(WithinQuantizationBound(got.as<float>(), x, w, bias, c, init.as<float>()));
  }
}

class CompareInt8 : public BackendTest {};

TEST_P(CompareInt8, LinearGrid) {
  // M: decode sizes (row-major: widened in registers on AVX512-BF16 CPUs), 16 (one full block of
  // x), 17 and 40 (the bf16 scratch path), past the small-M switch; tiled weights with
  // AVX512-VNNI quantize x at every M (CpuInt8.QuantizedXSwitchedOff covers the bf16-x path);
  // N: partial tiles; K: odd (a padded pair).
  const int64_t ms[] = {1, 2, 5, 9, 16, 17, cpu::kLinearSmallMMax + 1, 40};
  const std::pair<int64_t, int64_t> nks[] = {{1, 1}, {17, 3}, {130, 257}, {64, 1000}, {33, 2049}};
  uint32_t seed = BaseSeed();
  int i = 0;
  for (int64_t m : ms) {
    for (auto [n, k] : nks) {
      for (bool tiled : {false, true}) {
        const int v = i++ % 8;
        CheckLinear(backend(), {m, n, k, tiled, (v & 1) != 0, (v & 2) != 0, (v & 4) != 0}, seed++);
      }
    }
  }
}

TEST_P(CompareInt8, LinearEpilogues) {
  uint32_t seed = BaseSeed() + 1000;
  for (int64_t m : {1, 12, 40})
    for (bool tiled : {false, true})
      for (int v = 0; v < 8; ++v)
        CheckLinear(backend(), {m, 48, 70, tiled, (v & 1) != 0, (v & 2) != 0, (v & 4) != 0},
                    seed++);
}

TEST_P(CompareInt8, LinearModelSized) {
  // An OPT-1.3B fc1-like matrix at decode, batch and prefill sizes.
  uint32_t seed = BaseSeed() + 2000;
  for (int64_t m : {1, 16, 64})
    for (bool tiled : {false, true})
      CheckLinear(backend(), {m, 1024, 2048, tiled, true, true, false}, seed++);
}

TEST_P(CompareInt8, LinearQuantizedX) {
  // Decode and prefill sizes over tiled weights, where the CPU quantizes x (with AVX512-VNNI;
  // elsewhere the same cases check the bf16-x path): one row, partial and whole blocks of rows
  // (kVnniRowBlock), partial groups of tiles and partial tiles, K not a multiple of 4 (odd: a
  // padded pair; 2 mod 4: half a quad); a third of the cases with x >= 0 (255 steps).
  const int64_t ms[] = {1, 2, 5, 6, 7, 16, 17, 37, 64, 131};
  const std::pair<int64_t, int64_t> nks[] = {{1, 1},     {17, 3},    {50, 6},    {130, 257},
                                             {64, 1000}, {33, 2049}, {96, 2050}, {200, 64}};
  uint32_t seed = BaseSeed() + 1500;
  int i = 0;
  for (int64_t m : ms) {
    for (auto [n, k] : nks) {
      const int v = i++ % 8;
      CheckLinear(backend(), {m, n, k, true, (v & 1) != 0, (v & 2) != 0, (v & 4) != 0, i % 3 == 0},
                  seed++);
    }
  }
}

TEST_P(CompareInt8, GatherLinear) {
  Backend& b = backend();
  if (!Runs(b, OpId::kGatherLinear, DType::kI8)) return;
  uint32_t seed = BaseSeed() + 3000;
  const int64_t rkn[][3] = {{5, 3, 7}, {37, 70, 37}, {255, 1000, 77}, {1024, 2048, 307}};
  for (int64_t m : {int64_t{1}, int64_t{3}, int64_t{16}, cpu::kLinearSmallMMax + 1}) {
    for (const auto& s : rkn) {
      SCOPED_TRACE("M=" + std::to_string(m) + " R=" + std::to_string(s[0]) +
                   " K=" + std::to_string(s[1]) + " seed=" + std::to_string(seed));
      std::mt19937 rng(seed++);
      Tensor x = RandomTensor(rng, DType::kF32, {m, s[1]});
      Int8Matrix w = MakeInt8(rng, b, s[0], s[1], false);
      Tensor bias = RandomTensor(rng, DType::kF32, {s[0]});
      Tensor init = RandomTensor(rng, DType::kF32, {m, s[2]});
      std::vector<int32_t> rows = RandomRows(rng, s[0], s[2]);
      const bool acc = (seed & 1) != 0;
      auto ref = MakeReferenceBackend();
      Tensor want = CopyOf(init);
      DEJA_ASSERT_OK(GatherLinear(*ref, x.view(), w.host_view, bias.view(), rows.data(), s[2],
                                  Activation::kRelu, acc, want.view()));
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_x, b.ToBackend(x));
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_bias, b.ToBackend(bias));
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_out, b.ToBackend(init));
      DEJA_ASSERT_OK(GatherLinear(b, d_x.view(), w.device_view, d_bias.view(), rows.data(), s[2],
                                  Activation::kRelu, acc, d_out.view()));
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor got, b.ToHost(d_out.view()));
      // Relative to the magnitude of each output's terms: with K = 3 a row's few products and
      // its bias can cancel to near zero (seen: 1.7e-4 out of terms near 1).
      Tensor magnitude = AbsCopy(init);
      Tensor abs_q = AbsCopy(w.host.q);
      TensorView abs_w = w.host_view;
      abs_w.data = abs_q.data();
      DEJA_ASSERT_OK(GatherLinear(*ref, AbsCopy(x).view(), abs_w, AbsCopy(bias).view(), rows.data(),
                                  s[2], Activation::kNone, acc, magnitude.view()));
      EXPECT_TRUE(Close(got.as<float>(), want.as<float>(), got.numel(), kTol, magnitude.as<float>()));
    }
  }
}

TEST_P(CompareInt8, GatherLinearT) {
  // wt [R, N] is the transpose of a matrix quantized per output channel: its scales follow the
  // columns, so the test quantizes W [N, R] and transposes the int8 values.
  Backend& b = backend();
  if (!Runs(b, OpId::kGatherLinearT, DType::kI8)) return;
  uint32_t seed = BaseSeed() + 4000;
  const int64_t rnn[][3] = {{5, 17, 9}, {70, 37, 21}, {1000, 255, 131}, {2048, 512, 300}};
  for (int64_t m : {int64_t{1}, int64_t{3}, int64_t{16}, cpu::kLinearSmallMMax + 1}) {
    for (const auto& s : rnn) {
      const int64_t r = s[0], n = s[1], n_rows = s[2];
      SCOPED_TRACE("M=" + std::to_string(m) + " R=" + std::to_string(r) +
                   " N=" + std::to_string(n) + " seed=" + std::to_string(seed));
      std::mt19937 rng(seed++);
      Tensor x = RandomTensor(rng, DType::kF32, {m, n_rows});
      Int8Matrix w = MakeInt8(rng, *MakeReferenceBackend(), n, r, false);  // W [N, R]
      Tensor qt = Tensor::Empty(DType::kI8, {r, n});
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < r; ++j)
          qt.as<int8_t>()[j * n + i] = w.host.q.as<int8_t>()[i * r + j];
      TensorView host_wt = qt.view();
      host_wt.scale = w.host.scale.as<float>();
      Tensor init = RandomTensor(rng, DType::kF32, {m, n});
      std::vector<int32_t> rows = RandomRows(rng, r, n_rows);
      const bool acc = (seed & 1) != 0;
      auto ref = MakeReferenceBackend();
      Tensor want = CopyOf(init);
      DEJA_ASSERT_OK(GatherLinearT(*ref, x.view(), host_wt, rows.data(), n_rows, acc, want.view()));
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_x, b.ToBackend(x));
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_qt, b.ToBackend(qt));
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_scale, b.ToBackend(w.host.scale));
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_out, b.ToBackend(init));
      TensorView d_wt = d_qt.view();
      d_wt.scale = d_scale.as<float>();
      DEJA_ASSERT_OK(GatherLinearT(b, d_x.view(), d_wt, rows.data(), n_rows, acc, d_out.view()));
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor got, b.ToHost(d_out.view()));
      EXPECT_TRUE(Close(got.as<float>(), want.as<float>(), got.numel(), kTol));
    }
  }
}

TEST_P(CompareInt8, Embedding) {
  Backend& b = backend();
  if (!Runs(b, OpId::kEmbedding, DType::kI8)) return;
  uint32_t seed = BaseSeed() + 5000;
  for (bool tiled : {false, true}) {
    if (tiled && !Runs(b, OpId::kEmbedding, DType::kI8, Layout::kTiled16)) continue;
    for (bool acc : {false, true}) {
      SCOPED_TRACE(std::string(tiled ? "tiled" : "row-major") + (acc ? " accumulate" : ""));
      std::mt19937 rng(seed++);
      Int8Matrix table = MakeInt8(rng, b, 75, 33, tiled);
      const int32_t ids[] = {0, 74, 3, 3, 40, 17};
      Tensor init = RandomTensor(rng, DType::kF32, {6, 33});
      auto ref = MakeReferenceBackend();
      Tensor want = CopyOf(init);
      DEJA_ASSERT_OK(Embedding(*ref, table.host_view, ids, 6, acc, want.view()));
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor d_out, b.ToBackend(init));
      DEJA_ASSERT_OK(Embedding(b, table.device_view, ids, 6, acc, d_out.view()));
      DEJA_ASSERT_OK_AND_ASSIGN(Tensor got, b.ToHost(d_out.view()));
      EXPECT_TRUE(Close(got.as<float>(), want.as<float>(), got.numel(), kTol));
    }
  }
}

TEST_P(CompareInt8, RefusesInt8WithoutScales) {
  Backend& b = backend();
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor q, b.Allocate(DType::kI8, Shape{4, 8}));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor x, b.Allocate(DType::kF32, Shape{2, 8}));
  DEJA_ASSERT_OK_AND_ASSIGN(Tensor out, b.Allocate(DType::kF32, Shape{2, 4}));
  Status s = Linear(b, x.view(), q.view(), TensorView{}, Activation::kNone, false, out.view());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'w' is int8 without its scales"), std::string::npos) << s.ToString();
}

DEJA_INSTANTIATE_BACKEND_TEST(CompareInt8, ComparedBackends());

TEST(CpuInt8, PortablePathAndSimdTargets) {
  // Without AVX512-BF16 (or with it switched off) tiled int8 runs the plain loops and row-major
  // int8 the Highway kernels; every compiled target this CPU runs is forced in turn.
  uint32_t seed = BaseSeed() + 6000;
  for (bool dot : {false, true}) {
    cpu::SetBf16DotEnabled(dot && cpu::Bf16DotAvailable());
    for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
      hwy::SetSupportedTargetsForTest(target);
      SCOPED_TRACE(std::string(hwy::TargetName(target)) + (dot ? " bf16 dot" : " portable"));
      for (const auto& cpu : CpuBackends()) {
        SCOPED_TRACE(cpu.label);
        for (int64_t m : {1, 7, 20})
          for (bool tiled : {false, true})
            CheckLinear(*cpu.backend, {m, 37, 71, tiled, true, true, true}, seed++);
      }
    }
    hwy::SetSupportedTargetsForTest(0);
  }
  cpu::SetBf16DotEnabled(cpu::Bf16DotAvailable());
}

TEST(CpuInt8, QuantizedXSwitchedOff) {
  // With the VNNI path off (as DEJA_CPU_VNNI=0 does) every size keeps x in bf16: the plain
  // reference. Then on again: rows of x that are all zero (scale 0), rows with one outlier,
  // rows without negative values.
  uint32_t seed = BaseSeed() + 6500;
  cpu::SetVnniEnabled(false);
  for (const auto& cpu : CpuBackends()) {
    SCOPED_TRACE(cpu.label);
    for (int64_t m : {int64_t{1}, int64_t{17}, cpu::kLinearSmallMMax + 1, int64_t{70}})
      CheckLinear(*cpu.backend, {m, 45, 301, true, true, true, true}, seed++);
  }
  cpu::SetVnniEnabled(cpu::VnniAvailable());
  if (!cpu::VnniAvailable()) return;
  for (const auto& cpu : CpuBackends()) {
    SCOPED_TRACE(cpu.label);
    std::mt19937 rng(seed++);
    const int64_t m_rows = 40, n = 70, k = 203;
    Tensor x = RandomTensor(rng, DType::kF32, {m_rows, k});
    for (int64_t c = 0; c < k; ++c) x.as<float>()[3 * k + c] = 0.f;  // row 3: zeros
    x.as<float>()[7 * k + 11] = 300.f;                               // row 7: an outlier
    for (int64_t r : {9, 20, 39})  // rows without negative values (ReLU's output): 255 steps
      for (int64_t c = 0; c < k; ++c)
        x.as<float>()[r * k + c] = std::max(0.f, x.as<float>()[r * k + c]);
    Int8Matrix w = MakeInt8(rng, *cpu.backend, n, k, true);
    Tensor want = Tensor::Empty(DType::kF32, {m_rows, n});
    DEJA_ASSERT_OK(ref::LinearI8QuantizedX(x.view(), w.host_view, TensorView{}, Activation::kNone,
                                           false, want.view()));
    Tensor got = Tensor::Empty(DType::kF32, {m_rows, n});
    DEJA_ASSERT_OK(Linear(*cpu.backend, x.view(), w.device_view, TensorView{}, Activation::kNone,
                          false, got.view()));
    EXPECT_TRUE(Close(got.as<float>(), want.as<float>(), got.numel(), kTol));
    for (int64_t c = 0; c < n; ++c) EXPECT_EQ(got.as<float>()[3 * n + c], 0.f) << c;
  }
}

TEST(CpuInt8, AmxKernelMatchesVnniBitForBit) {
  // The tile kernel and the VNNI kernel sum the same integers and finish them alike, so every
  // output is the same float: the backend may switch by row count (amx.h). Partial and whole row
  // blocks (16) and pairs of them, partial tile groups, K not a whole step (64) nor a quad, every
  // epilogue, rows without negative values (zero point 0).
  if (!cpu::AmxAvailable()) {
    GTEST_SKIP() << "this CPU has no AMX-INT8 (or the kernel refused the tile state, or "
                    "DEJA_CPU_AMX=0): nothing to compare";
  }
  uint32_t seed = BaseSeed() + 8000;
  const int64_t ms[] = {9, 15, 16, 17, 31, 32, 33, 64, 131};
  const std::pair<int64_t, int64_t> nks[] = {{17, 3},  {50, 6},    {130, 257}, {64, 1000},
                                             {33, 2049}, {96, 2050}, {200, 64}};
  int i = 0;
  for (const auto& cpu : CpuBackends()) {
    SCOPED_TRACE(cpu.label);
    for (int64_t m : ms) {
      for (auto [n, k] : nks) {
        SCOPED_TRACE("M=" + std::to_string(m) + " N=" + std::to_string(n) + " K=" +
                     std::to_string(k));
        std::mt19937 rng(seed++);
        Tensor x = RandomTensor(rng, DType::kF32, {m, k}, ++i % 3 == 0 ? 0.f : -1.f);
        Int8Matrix w = MakeInt8(rng, *cpu.backend, n, k, true);
        Tensor bias = RandomTensor(rng, DType::kF32, {n});
        Tensor init = RandomTensor(rng, DType::kF32, {m, n});
        const bool relu = i % 2 == 0, accumulate = i % 4 == 1;
        Tensor got[2] = {CopyOf(init), CopyOf(init)};
        for (int amx = 0; amx < 2; ++amx) {
          cpu::SetAmxEnabled(amx == 1);
          DEJA_ASSERT_OK(Linear(*cpu.backend, x.view(), w.device_view,
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

TEST(QuantizeRowsInt8, ErrorBoundScalesAndZeroRows) {
  std::mt19937 rng(BaseSeed() + 7000);
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dt));
    Tensor w = RandomTensor(rng, dt, {9, 301}, -2.f, 2.f);
    for (int64_t c = 0; c < 301; ++c) StoreFromFloat(w.data(), dt, 4 * 301 + c, 0.f);  // row 4
    DEJA_ASSERT_OK_AND_ASSIGN(QuantizedMatrix q, QuantizeRowsInt8(w.view(), "w"));
    for (int64_t r = 0; r < 9; ++r) {
      float amax = 0.f;
      for (int64_t c = 0; c < 301; ++c)
        amax = std::max(amax, std::fabs(LoadAsFloat(w.data(), dt, r * 301 + c)));
      const float scale = q.scale.as<float>()[r];
      EXPECT_FLOAT_EQ(scale, amax / 127.f) << "row " << r;
      int max_q = 0;
      for (int64_t c = 0; c < 301; ++c) {
        const int v = q.q.as<int8_t>()[r * 301 + c];
        ASSERT_GE(v, -127);
        max_q = std::max(max_q, std::abs(v));
        const float back = static_cast<float>(v) * scale;
        EXPECT_LE(std::fabs(back - LoadAsFloat(w.data(), dt, r * 301 + c)), scale * 0.5f + 1e-7f)
            << "row " << r << " col " << c;
      }
      EXPECT_EQ(max_q, r == 4 ? 0 : 127) << "row " << r;
    }
  }
}

TEST(QuantizeRowsInt8, RefusesNonFiniteWeightsByName) {
  Tensor w = Tensor::Zeros(DType::kF32, {3, 4});
  w.as<float>()[6] = std::numeric_limits<float>::infinity();
  StatusOr<QuantizedMatrix> q = QuantizeRowsInt8(w.view(), "layers.0.fc1.weight");
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(q.status().message().find("layers.0.fc1.weight: row 1"), std::string::npos)
      << q.status().ToString();
  w.as<float>()[6] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(QuantizeRowsInt8(w.view(), "w").ok());
}

}  // namespace
}  // namespace deja::kernels
