// SelectTopKUnits (the Deja Vu runtime's radix select) against a plain sort by (score descending,
// unit ascending) on fresh random scores: wide and narrow value ranges, heavy ties, signed zeros,
// infinities, every k from 0 to units on small sizes.
#include "worker/dejavu/top_k.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

namespace deja::worker {
namespace {

std::vector<int32_t> Reference(const std::vector<float>& scores, int32_t k) {
  std::vector<int32_t> idx(scores.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
    if (scores[a] != scores[b]) return scores[a] > scores[b];
    return a < b;
  });
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

std::vector<int32_t> Fast(const std::vector<float>& scores, int32_t k) {
  std::vector<int32_t> out(k, -1);
  dejavu::SelectTopKUnits(scores.data(), static_cast<int64_t>(scores.size()), k, out.data());
  return out;
}

uint32_t Seed() { return std::random_device{}(); }

TEST(TopKTest, MatchesSortOnRandomScores) {
  const uint32_t seed = Seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int64_t units : {1, 2, 7, 32, 1000, 8192}) {
    for (double spread : {1e-6, 1.0, 1e6}) {
      std::normal_distribution<float> dist(0.5f, static_cast<float>(spread));
      std::vector<float> s(units);
      for (float& v : s) v = dist(rng);
      for (int32_t k : {int32_t{1}, static_cast<int32_t>(units * 3 / 10),
                        static_cast<int32_t>(units)}) {
        if (k < 1) continue;
        EXPECT_EQ(Fast(s, k), Reference(s, k)) << "units " << units << " spread " << spread
                                               << " k " << k;
      }
    }
  }
}

TEST(TopKTest, TiesAreBrokenByUnitEveryK) {
  const uint32_t seed = Seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> values = {0.f, -0.f, 1.f, -1.f, 0.25f, inf, -inf, 1e-30f, -1e-30f};
  std::uniform_int_distribution<size_t> pick(0, values.size() - 1);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<float> s(37);
    for (float& v : s) v = values[pick(rng)];
    for (int32_t k = 0; k <= 37; ++k) {
      EXPECT_EQ(Fast(s, k), Reference(s, k)) << "trial " << trial << " k " << k;
    }
  }
  // All equal: the first k units.
  std::vector<float> same(100, 3.f);
  std::vector<int32_t> first(40);
  std::iota(first.begin(), first.end(), 0);
  EXPECT_EQ(Fast(same, 40), first);
}

}  // namespace
}  // namespace deja::worker
