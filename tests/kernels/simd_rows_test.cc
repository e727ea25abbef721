// The attention inner loops of the CPU backend (kernels/cpu/simd.h): DotRows and WeightedSumRows
// against a plain double-precision reference (relative error <= 1e-5) and bit for bit against the
// per-row Dot / Axpy loops they replace, on fresh seeded random inputs over head sizes that hit
// every vector-chunk and tail case and over row counts including 0 and 1; f16 and int8 rows; and
// the H2O eviction's lowest-score search against a plain loop.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "common/kv_row.h"
#include "kernels/cpu/simd.h"

namespace deja::kernels::cpu {
namespace {

struct Rows {
  std::vector<float> q, k, v, p;
  std::vector<int32_t> rows;
};

// `pool` rows of d floats; `count` of them picked in a random order (distinct, not sorted).
Rows MakeRows(int64_t d, int64_t pool, int64_t count, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  Rows r;
  r.q.resize(d);
  r.k.resize(pool * d);
  r.v.resize(pool * d);
  r.p.resize(count);
  for (float& x : r.q) x = normal(rng);
  for (float& x : r.k) x = normal(rng);
  for (float& x : r.v) x = normal(rng);
  for (float& x : r.p) x = unit(rng);
  std::vector<int32_t> all(pool);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  r.rows.assign(all.begin(), all.begin() + count);
  return r;
}

TEST(SimdRows, MatchReferenceAndPerRowLoops) {
  std::mt19937 rng(20261122);
  const float scale = 0.125f;
  for (int64_t d : {1, 7, 15, 16, 17, 31, 32, 64, 80, 96, 128, 130, 200, 259}) {
    for (int64_t count : {0, 1, 2, 5, 37, 100}) {
      SCOPED_TRACE("d " + std::to_string(d) + " count " + std::to_string(count));
      const Rows r = MakeRows(d, std::max<int64_t>(count, 1) + 3, count, rng);
      std::vector<float> scores(count + 1, -1.f);
      DotRows(r.q.data(), r.k.data(), DType::kF32, r.rows.data(), count, d, scale, scores.data());
      std::vector<float> out(d + 1, 7.f);  // garbage in, one guard element
      WeightedSumRows(r.p.data(), r.v.data(), DType::kF32, r.rows.data(), count, d, out.data());
      EXPECT_EQ(scores[count], -1.f) << "wrote past count";
      EXPECT_EQ(out[d], 7.f) << "wrote past d";
      for (int64_t j = 0; j < count; ++j) {
        const float* kr = r.k.data() + r.rows[j] * d;
        double ref = 0;
        for (int64_t e = 0; e < d; ++e) ref += double(r.q[e]) * kr[e];
        ref *= scale;
        EXPECT_NEAR(scores[j], ref, 1e-5 * std::max(1.0, std::fabs(ref))) << "row " << j;
        EXPECT_EQ(scores[j], scale * Dot(r.q.data(), kr, d)) << "row " << j;
      }
      std::vector<float> axpy(d, 0.f);
      for (int64_t j = 0; j < count; ++j) {
        Axpy(r.p[j], r.v.data() + r.rows[j] * d, axpy.data(), d);
      }
      for (int64_t e = 0; e < d; ++e) {
        double ref = 0, mag = 0;
        for (int64_t j = 0; j < count; ++j) {
          ref += double(r.p[j]) * r.v[r.rows[j] * d + e];
          mag += std::fabs(double(r.p[j]) * r.v[r.rows[j] * d + e]);
        }
        EXPECT_NEAR(out[e], ref, 1e-5 * std::max(1.0, mag)) << "element " << e;
        EXPECT_EQ(out[e], axpy[e]) << "element " << e;
      }
    }
  }
}

// f16 rows (the f16 KV cache): the same calls on rows rounded to f16 match the f32 calls on the
// widened rows (to 1e-6: the scalar tail may contract differently into an FMA), and
// ConvertFromF32 rounds exactly as FloatToHalf.
TEST(SimdRows, F16RowsMatchWidenedF32Rows) {
  std::mt19937 rng(11);
  for (int64_t d : {1, 15, 16, 64, 130}) {
    Rows r = MakeRows(d, 40, 23, rng);
    std::vector<uint16_t> k16(r.k.size()), v16(r.v.size());
    ConvertFromF32(r.k.data(), static_cast<int64_t>(r.k.size()), DType::kF16, k16.data());
    ConvertFromF32(r.v.data(), static_cast<int64_t>(r.v.size()), DType::kF16, v16.data());
    std::vector<float> kw(r.k.size()), vw(r.v.size());
    for (size_t i = 0; i < k16.size(); ++i) {
      ASSERT_EQ(k16[i], FloatToHalf(r.k[i])) << i;
      kw[i] = HalfToFloat(k16[i]);
      vw[i] = HalfToFloat(v16[i]);
    }
    const int64_t count = static_cast<int64_t>(r.rows.size());
    std::vector<float> s16(count), s32(count), o16(d), o32(d);
    DotRows(r.q.data(), k16.data(), DType::kF16, r.rows.data(), count, d, 0.5f, s16.data());
    DotRows(r.q.data(), kw.data(), DType::kF32, r.rows.data(), count, d, 0.5f, s32.data());
    WeightedSumRows(r.p.data(), v16.data(), DType::kF16, r.rows.data(), count, d, o16.data());
    WeightedSumRows(r.p.data(), vw.data(), DType::kF32, r.rows.data(), count, d, o32.data());
    for (int64_t j = 0; j < count; ++j) {
      EXPECT_NEAR(s16[j], s32[j], 1e-6 * std::max(1.f, std::fabs(s32[j]))) << "d=" << d;
    }
    for (int64_t e = 0; e < d; ++e) {
      EXPECT_NEAR(o16[e], o32[e], 1e-6 * std::max(1.f, std::fabs(o32[e]))) << "d=" << d;
    }
  }
}

// int8 rows (the int8 KV cache, common/kv_row.h: head_dim values, then the row's scale; rows
// d + 4 bytes apart) against a double-precision loop over the dequantized rows (K's scores with
// the query rounded as the kernels round it), over head sizes that hit every chunk and tail and
// row counts past the prefetch distance.
TEST(SimdRows, Int8RowsMatchTheirDequantizedValues) {
  std::mt19937 rng(12);
  for (int64_t d : {1, 15, 16, 17, 31, 32, 33, 64, 80, 128, 130, 256, 259, 600}) {
    for (int64_t count : {0, 1, 15, 16, 17, 23, 300}) {
      SCOPED_TRACE("d " + std::to_string(d) + " count " + std::to_string(count));
      Rows r = MakeRows(d, count + 5, count, rng);
      const int64_t pool = count + 5;
      const size_t row = KvRowBytes(DType::kI8, d);
      std::vector<char> k8(pool * row), v8(pool * row);
      std::vector<float> kd(pool * d), vd(pool * d);
      for (int64_t i = 0; i < pool; ++i) {
        // Rows of different magnitudes, so each scale matters.
        for (int64_t e = 0; e < d; ++e) r.v[i * d + e] *= 1.f + static_cast<float>(i % 7);
        KvRowFromF32(r.k.data() + i * d, d, DType::kI8, k8.data() + i * row);
        KvRowFromF32(r.v.data() + i * d, d, DType::kI8, v8.data() + i * row);
        KvRowToF32(k8.data() + i * row, DType::kI8, d, kd.data() + i * d);
        KvRowToF32(v8.data() + i * row, DType::kI8, d, vd.data() + i * d);
      }
      std::vector<float> scores(count + 1, -1.f), out(d + 1, 7.f);
      DotRows(r.q.data(), k8.data(), DType::kI8, r.rows.data(), count, d, 0.5f, scores.data());
      WeightedSumRows(r.p.data(), v8.data(), DType::kI8, r.rows.data(), count, d, out.data());
      EXPECT_EQ(scores[count], -1.f) << "wrote past count";
      EXPECT_EQ(out[d], 7.f) << "wrote past d";
      // Scores: against the query rounded to int16 (common/kv_row.h) to f32 rounding; against
      // the unrounded query within what the rounding can move them (half a step per value).
      std::vector<int16_t> q16(d);
      const double q_scale = KvQueryToI16(r.q.data(), d, q16.data());
      for (int64_t j = 0; j < count; ++j) {
        double ref = 0, mag = 0, exact = 0, k_abs = 0;
        for (int64_t e = 0; e < d; ++e) {
          const double k = kd[r.rows[j] * d + e];
          ref += q_scale * q16[e] * k;
          mag += std::fabs(q_scale * q16[e] * k);
          exact += double(r.q[e]) * k;
          k_abs += std::fabs(k);
        }
        EXPECT_NEAR(scores[j], 0.5 * ref, 1e-6 * std::max(1.0, mag)) << "row " << j;
        EXPECT_NEAR(scores[j], 0.5 * exact, 0.5 * (0.5 * q_scale * k_abs) + 1e-6 * mag)
            << "row " << j;
      }
      for (int64_t e = 0; e < d; ++e) {
        double ref = 0, mag = 0;
        for (int64_t j = 0; j < count; ++j) {
          ref += double(r.p[j]) * vd[r.rows[j] * d + e];
          mag += std::fabs(double(r.p[j]) * vd[r.rows[j] * d + e]);
        }
        EXPECT_NEAR(out[e], ref, 1e-5 * std::max(1.0, mag)) << "element " << e;
      }
    }
  }
}

// LowestScoreSlot (the H2O decode eviction's choice) against a plain loop, over lengths that hit
// every vector tail, with free slots (-1), positions at and past the limit, and scores drawn
// from a few values so that ties (broken by the lower position) are common.
TEST(SimdRows, LowestScoreSlotMatchesAPlainLoop) {
  std::mt19937 rng(20261123);
  int checked_ties = 0;
  for (int64_t n : {0, 1, 2, 7, 15, 16, 17, 31, 32, 33, 100, 205, 206, 513}) {
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<int32_t> pos(n);
      std::iota(pos.begin(), pos.end(), 0);
      std::shuffle(pos.begin(), pos.end(), rng);
      std::vector<float> score(n);
      for (int64_t s = 0; s < n; ++s) {
        if (rng() % 4 == 0) pos[s] = -1;
        score[s] = trial % 2 ? static_cast<float>(rng() % 3) : std::ldexp(float(rng() % 1000), -7);
      }
      const int32_t limit = n == 0 ? 0 : static_cast<int32_t>(rng() % (n + 2));
      int32_t want = -1;
      for (int64_t s = 0; s < n; ++s) {
        if (pos[s] < 0 || pos[s] >= limit) continue;
        if (want < 0 || score[s] < score[want] ||
            (score[s] == score[want] && pos[s] < pos[want])) {
          if (want >= 0 && score[s] == score[want]) ++checked_ties;
          want = static_cast<int32_t>(s);
        }
      }
      ASSERT_EQ(LowestScoreSlot(pos.data(), score.data(), n, limit), want)
          << "n " << n << " trial " << trial << " limit " << limit;
    }
  }
  EXPECT_GT(checked_ties, 100);  // the tie-break was exercised
}

}  // namespace
}  // namespace deja::kernels::cpu
