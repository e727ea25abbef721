// RetainScores (Locret retaining heads) of every backend against the reference, on fresh seeded
// random inputs: strided rows (the stacked projection's layout) and contiguous ones, decode-sized
// and prefill-sized n, hidden widths that are and are not multiples of a vector. The reference
// sums in double; backends in f32: relative error <= 1e-5 (kRelTol's bound, norm-wise and
// max-abs), and every output element is compared.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "tests/kernels/kernel_test_util.h"

namespace deja::kernels {
namespace {

using testing::BackendTest;
using testing::Close;
using testing::ComparedBackends;
using testing::RandomTensor;
using testing::Runs;

struct RetainCase {
  int32_t n, heads, head_dim, hidden;
  int64_t extra_stride;  // floats past heads * head_dim between rows
  std::string Label() const {
    return "n=" + std::to_string(n) + " heads=" + std::to_string(heads) +
           " head_dim=" + std::to_string(head_dim) + " hidden=" + std::to_string(hidden) +
           " extra_stride=" + std::to_string(extra_stride);
  }
};

const RetainCase kCases[] = {
    {1, 1, 1, 1, 0},    {1, 8, 32, 64, 512}, {3, 2, 5, 7, 3},       {17, 4, 16, 33, 0},
    {64, 8, 32, 64, 0}, {130, 3, 64, 64, 0}, {1, 32, 64, 64, 4096}, {257, 2, 8, 128, 16},
};

class CompareRetainScores : public BackendTest {};

TEST_P(CompareRetainScores, RandomInputs) {
  if (!Runs(backend(), OpId::kRetainScores, DType::kF32)) return;
  uint32_t seed = testing::BaseSeed("compare_retain_test");
  for (const RetainCase& c : kCases) {
    SCOPED_TRACE(c.Label());
    std::mt19937 rng(seed++);
    const int64_t width = static_cast<int64_t>(c.heads) * c.head_dim;
    const int64_t stride = width + c.extra_stride;
    const int64_t in = 3 * static_cast<int64_t>(c.head_dim);
    // q, k and v of one row are `stride` apart too, as in the stacked layout [q | k | v].
    Tensor rows =
        RandomTensor(rng, DType::kF32, {std::max<int64_t>(c.n, 1) * stride + 2 * width}, -2.f, 2.f);
    Tensor w1 = RandomTensor(rng, DType::kF32, {c.heads * c.hidden * in}, -0.3f, 0.3f);
    Tensor b1 = RandomTensor(rng, DType::kF32, {c.heads * c.hidden}, -0.5f, 0.5f);
    Tensor w2 = RandomTensor(rng, DType::kF32, {c.heads * c.hidden}, -1.f, 1.f);
    Tensor b2 = RandomTensor(rng, DType::kF32, {c.heads}, -1.f, 1.f);
    auto args = [&](const Tensor& r, const Tensor& a1, const Tensor& c1, const Tensor& a2,
                    const Tensor& c2, Tensor& out, Device dev) {
      RetainArgs a;
      a.q = r.as<float>();
      a.k = r.as<float>() + width;
      a.v = r.as<float>() + 2 * width;
      a.row_stride = stride;
      a.n = c.n;
      a.heads = c.heads;
      a.head_dim = c.head_dim;
      a.hidden = c.hidden;
      a.w1 = a1.as<float>();
      a.b1 = c1.as<float>();
      a.w2 = a2.as<float>();
      a.b2 = c2.as<float>();
      a.out = out.as<float>();
      a.device = dev;
      return a;
    };
    auto ref = MakeReferenceBackend();
    Tensor want = Tensor::Empty(DType::kF32, {c.n, c.heads});
    ASSERT_TRUE(RetainScores(*ref, args(rows, w1, b1, w2, b2, want, Device::Host())).ok());

    Backend& b = backend();
    auto d_rows = b.ToBackend(rows);
    auto d_w1 = b.ToBackend(w1);
    auto d_b1 = b.ToBackend(b1);
    auto d_w2 = b.ToBackend(w2);
    auto d_b2 = b.ToBackend(b2);
    auto d_out = b.Allocate(DType::kF32, {c.n, c.heads});
    ASSERT_TRUE(d_rows.ok() && d_w1.ok() && d_b1.ok() && d_w2.ok() && d_b2.ok() && d_out.ok());
    Status s = RetainScores(b, args(*d_rows, *d_w1, *d_b1, *d_w2, *d_b2, *d_out, b.device()));
    ASSERT_TRUE(s.ok()) << s.ToString();
    auto got = b.ToHost(d_out->view());
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_TRUE(Close(got->as<float>(), want.as<float>(), want.numel(), 1e-5));
  }
}

DEJA_INSTANTIATE_BACKEND_TEST(CompareRetainScores, ComparedBackends());

// A hand computation on the reference: one head, head_dim 1, hidden 2.
// x = [q, k, v] = [1, 2, -1]; W1 rows [1, 0, 1] and [0.5, 1, 0], b1 = [-1, 0.5]:
// u = [1 - 1 - 1, 0.5 + 2 + 0.5] = [-1, 3], relu -> [0, 3]; w2 = [4, 2], b2 = 0.25:
// s = 0 * 4 + 3 * 2 + 0.25 = 6.25.
TEST(RetainScoresReference, HandComputation) {
  const float qkv[3] = {1.f, 2.f, -1.f};
  const float w1[6] = {1.f, 0.f, 1.f, 0.5f, 1.f, 0.f};
  const float b1[2] = {-1.f, 0.5f};
  const float w2[2] = {4.f, 2.f};
  const float b2[1] = {0.25f};
  float out = 0.f;
  RetainArgs a;
  a.q = qkv;
  a.k = qkv + 1;
  a.v = qkv + 2;
  a.row_stride = 3;
  a.n = 1;
  a.heads = 1;
  a.head_dim = 1;
  a.hidden = 2;
  a.w1 = w1;
  a.b1 = b1;
  a.w2 = w2;
  a.b2 = b2;
  a.out = &out;
  auto ref = MakeReferenceBackend();
  ASSERT_TRUE(RetainScores(*ref, a).ok());
  EXPECT_FLOAT_EQ(out, 6.25f);
  auto cpu = MakeCpuBackend(1);
  out = 0.f;
  ASSERT_TRUE(RetainScores(*cpu, a).ok());
  EXPECT_FLOAT_EQ(out, 6.25f);
  a.row_stride = 2;  // < heads * head_dim is fine (1); hidden 0 is not
  a.hidden = 0;
  Status s = RetainScores(*ref, a);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'hidden'"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace deja::kernels
