// The KV cache's row formats (common/kv_row.h): int8 rows with a scale per row, checked against
// the definition (scale max |x| / 127, values round(x / scale)) on fresh random rows; f32 and
// f16 rows as the element conversions.
#include "common/kv_row.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

#include "common/vec_math.h"

namespace deja {
namespace {

TEST(KvRowTest, SizesAndKinds) {
  EXPECT_EQ(KvRowBytes(DType::kF32, 64), 256u);
  EXPECT_EQ(KvRowBytes(DType::kF16, 64), 128u);
  EXPECT_EQ(KvRowBytes(DType::kI8, 64), 68u);
  EXPECT_EQ(KvRowElems(DType::kI8, 17), 21);
  EXPECT_EQ(KvRowElems(DType::kF16, 17), 17);
  EXPECT_TRUE(IsKvDType(DType::kI8));
  EXPECT_FALSE(IsKvDType(DType::kBF16));
  EXPECT_FALSE(IsKvDType(DType::kI4));
}

TEST(KvRowTest, Int8RowsRoundEachValueToItsRowsScale) {
  std::mt19937 rng(2026);
  for (int64_t d : {1, 3, 17, 64, 80, 128}) {
    SCOPED_TRACE(d);
    for (int trial = 0; trial < 20; ++trial) {
      // Rows of very different magnitudes: each row's scale follows its own.
      const float range = std::pow(10.f, std::uniform_real_distribution<float>(-3.f, 3.f)(rng));
      std::uniform_real_distribution<float> dist(-range, range);
      std::vector<float> x(d), back(d);
      for (float& v : x) v = dist(rng);
      std::vector<char> row(KvRowBytes(DType::kI8, d));
      KvRowFromF32(x.data(), d, DType::kI8, row.data());
      float amax = 0.f;
      for (float v : x) amax = std::max(amax, std::fabs(v));
      const float scale = KvRowScale(row.data(), d);
      EXPECT_EQ(scale, amax / 127.f);
      const int8_t* q = reinterpret_cast<const int8_t*>(row.data());
      for (int64_t i = 0; i < d; ++i) {
        EXPECT_EQ(q[i], static_cast<int8_t>(std::nearbyint(x[i] * (127.f / amax)))) << i;
        EXPECT_GE(q[i], -127);
      }
      KvRowToF32(row.data(), DType::kI8, d, back.data());
      double err = 0, norm = 0;
      for (int64_t i = 0; i < d; ++i) {
        EXPECT_LE(std::fabs(back[i] - x[i]), 0.5f * scale * 1.0001f) << i;
        err += (back[i] - x[i]) * (back[i] - x[i]);
        norm += x[i] * x[i];
      }
      // Uniform values: the rms error is about scale / sqrt(12) against an rms of amax / sqrt(3).
      EXPECT_LT(std::sqrt(err / norm), 0.01);
    }
  }
}

// Values halfway between two steps round to the even one, as std::nearbyint does.
TEST(KvRowTest, Int8TiesRoundToEven) {
  const std::vector<float> x = {127.f, 2.5f, -2.5f, 3.5f, -0.5f, 0.5f, 1.5f, -126.5f, 0.25f};
  const int64_t d = static_cast<int64_t>(x.size());
  std::vector<char> row(KvRowBytes(DType::kI8, d));
  KvRowFromF32(x.data(), d, DType::kI8, row.data());
  const int8_t* q = reinterpret_cast<const int8_t*>(row.data());
  const std::vector<int> want = {127, 2, -2, 4, 0, 0, 2, -126, 0};
  for (int64_t i = 0; i < d; ++i) EXPECT_EQ(q[i], want[i]) << i;
}

// The query rounding of attention over int8 K rows: the largest |q| to 32767 (less past head
// size 516, so a row's integer sum fits int32), each value to its nearest step.
TEST(KvRowTest, QueryToI16) {
  std::mt19937 rng(7);
  for (int64_t d : {1, 5, 64, 128, 516, 517, 1000}) {
    SCOPED_TRACE(d);
    std::normal_distribution<float> normal(0.f, 3.f);
    std::vector<float> q(d);
    for (float& v : q) v = normal(rng);
    std::vector<int16_t> out(d);
    const float scale = KvQueryToI16(q.data(), d, out.data());
    float amax = 0.f;
    for (float v : q) amax = std::max(amax, std::fabs(v));
    const int64_t qmax = std::min<int64_t>(32767, 2147483647 / (128 * d));
    EXPECT_EQ(scale, amax / static_cast<float>(qmax));
    int64_t largest = 0;
    for (int64_t i = 0; i < d; ++i) {
      largest = std::max<int64_t>(largest, std::abs(out[i]));
      EXPECT_LE(std::fabs(out[i] * scale - q[i]), 0.5f * scale * 1.001f) << i;
    }
    EXPECT_EQ(largest, qmax);
    // The worst row sum stays within int32.
    EXPECT_LE(qmax * 128 * d, int64_t{2147483647});
  }
  std::vector<float> zero(8, 0.f), bad = {1.f, std::nanf(""), 2.f};
  std::vector<int16_t> out(8, 5);
  EXPECT_EQ(KvQueryToI16(zero.data(), 8, out.data()), 0.f);
  for (int16_t v : out) EXPECT_EQ(v, 0);
  EXPECT_TRUE(std::isnan(KvQueryToI16(bad.data(), 3, out.data())));
  bad[1] = INFINITY;
  EXPECT_TRUE(std::isnan(KvQueryToI16(bad.data(), 3, out.data())));
}

TEST(KvRowTest, Int8ZeroAndNonFiniteRows) {
  const int64_t d = 8;
  std::vector<char> row(KvRowBytes(DType::kI8, d), 0x55);
  std::vector<float> x(d, 0.f), back(d, 1.f);
  KvRowFromF32(x.data(), d, DType::kI8, row.data());
  EXPECT_EQ(KvRowScale(row.data(), d), 0.f);
  KvRowToF32(row.data(), DType::kI8, d, back.data());
  for (float v : back) EXPECT_EQ(v, 0.f);
  // A NaN or inf anywhere: the row reads back as NaN, not as plausible numbers.
  for (float bad : {std::nanf(""), INFINITY}) {
    x.assign(d, 1.f);
    x[3] = bad;
    KvRowFromF32(x.data(), d, DType::kI8, row.data());
    KvRowToF32(row.data(), DType::kI8, d, back.data());
    for (float v : back) EXPECT_TRUE(std::isnan(v));
  }
}

TEST(KvRowTest, FloatRowsAreTheElementConversions) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-3.f, 3.f);
  const int64_t d = 33;
  std::vector<float> x(d), back(d), want(d);
  for (float& v : x) v = dist(rng);
  for (DType t : {DType::kF32, DType::kF16}) {
    std::vector<char> row(KvRowBytes(t, d)), conv(KvRowBytes(t, d));
    KvRowFromF32(x.data(), d, t, row.data());
    ConvertFromF32(x.data(), d, t, conv.data());
    EXPECT_EQ(row, conv) << DTypeName(t);
    KvRowToF32(row.data(), t, d, back.data());
    ConvertToF32(conv.data(), t, d, want.data(), false);
    EXPECT_EQ(back, want) << DTypeName(t);
  }
}

}  // namespace
}  // namespace deja
