// The host row helpers against plain scalar loops on fresh random rows whose sizes hit every
// vector tail: MaxOf (NaN anywhere makes it NaN; -inf for an empty row) and SumExpShift.
#include "common/vec_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace deja {
namespace {

constexpr int64_t kSizes[] = {0, 1, 3, 4, 7, 8, 15, 16, 17, 31, 33, 64, 1000, 50272};

TEST(VecMathTest, MaxOfMatchesAScalarLoopAndPropagatesNaN) {
  std::mt19937 rng(20261123);
  std::normal_distribution<float> normal(0.f, 5.f);
  for (int64_t n : kSizes) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = normal(rng);
    float want = -std::numeric_limits<float>::infinity();
    for (float v : x) want = std::max(want, v);
    EXPECT_EQ(MaxOf(x.data(), n), want) << "n " << n;
    if (n == 0) continue;
    // A NaN at the start, in the middle and in the tail, one at a time.
    for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
      std::vector<float> y = x;
      y[static_cast<size_t>(at)] = std::numeric_limits<float>::quiet_NaN();
      EXPECT_TRUE(std::isnan(MaxOf(y.data(), n))) << "n " << n << " NaN at " << at;
    }
  }
}

TEST(VecMathTest, SumExpShiftMatchesAScalarLoop) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 3.f);
  for (int64_t n : kSizes) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = normal(rng);
    const float shift = n > 0 ? MaxOf(x.data(), n) : 0.f;
    double want = 0;
    for (float v : x) want += std::exp(static_cast<double>(v) - shift);
    EXPECT_NEAR(SumExpShift(x.data(), n, shift), want, 1e-5 * std::max(1.0, want)) << "n " << n;
  }
}

}  // namespace
}  // namespace deja
