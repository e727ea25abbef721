// SelectTopKUnits: the Deja Vu runtime's per-layer top-k over predictor scores.
#include "worker/dejavu/top_k.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <iterator>
#include <vector>

namespace deja::worker::dejavu {

namespace {

// A float's bits mapped so that unsigned order is the float order (-0 taken as +0).
inline uint32_t OrderedKey(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if (u == 0x80000000u) u = 0;
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

}  // namespace

// A radix select: histograms of the top 11 and the next 11 bits of each score's ordered key find
// the bucket holding the k-th largest score, an nth_element over that bucket's few keys finds the
// score t itself, then one pass keeps every unit above t and, in unit order, as many units equal
// to t as fill k. Measured on the OPT-1.3B shape (8192 units per layer, k = 30%): nth_element over
// the unit indices compared through the scores took ~135 us per layer, more than half of the
// predictor's time; this takes ~20 us.
void SelectTopKUnits(const float* scores, int64_t units, int32_t k, int32_t* out) {
  if (k <= 0) return;
  constexpr int kBits = 11;
  thread_local std::vector<uint32_t> keys;
  thread_local std::vector<uint32_t> bucket;
  // Four interleaved histograms: similar scores share a bucket, and back-to-back increments of
  // one counter would wait on each other.
  uint32_t hist4[4][1u << kBits] = {};
  keys.resize(static_cast<size_t>(units));
  for (int64_t u = 0; u < units; ++u) {
    keys[u] = OrderedKey(scores[u]);
    ++hist4[u & 3][keys[u] >> (32 - kBits)];
  }
  uint32_t hist[1u << kBits];
  for (uint32_t i = 0; i < (1u << kBits); ++i) {
    hist[i] = hist4[0][i] + hist4[1][i] + hist4[2][i] + hist4[3][i];
  }
  // The bucket b that holds the k-th largest key, and how many keys lie in buckets above it.
  int64_t above_bucket = 0;
  int b = (1 << kBits) - 1;
  for (; b > 0 && above_bucket + hist[b] < static_cast<uint32_t>(k); --b) above_bucket += hist[b];
  // Branch-free compaction: whether a key falls in the bucket is unpredictable.
  bucket.resize(static_cast<size_t>(units));
  size_t in_bucket = 0;
  for (int64_t u = 0; u < units; ++u) {
    bucket[in_bucket] = keys[u];
    in_bucket += (keys[u] >> (32 - kBits)) == static_cast<uint32_t>(b) ? 1 : 0;
  }
  bucket.resize(in_bucket);
  int64_t rank = k - 1 - above_bucket;  // position of the k-th largest key in the bucket
  // Scores of one magnitude share their top 11 bits (sign, exponent, 2 mantissa bits), so the
  // bucket can hold most units: narrow it once more by the next 11 bits.
  std::fill(std::begin(hist), std::end(hist), 0u);
  constexpr int kShift2 = 32 - 2 * kBits;
  constexpr uint32_t kMask = (1u << kBits) - 1;
  for (uint32_t key : bucket) ++hist[(key >> kShift2) & kMask];
  int b2 = (1 << kBits) - 1;
  for (; b2 > 0 && hist[b2] <= static_cast<uint32_t>(rank); --b2) rank -= hist[b2];
  size_t kept = 0;
  for (uint32_t key : bucket) {
    bucket[kept] = key;
    kept += ((key >> kShift2) & kMask) == static_cast<uint32_t>(b2) ? 1 : 0;
  }
  bucket.resize(kept);
  std::nth_element(bucket.begin(), bucket.begin() + rank, bucket.end(), std::greater<uint32_t>());
  const uint32_t t = bucket[rank];
  int32_t above = 0;
  for (int64_t u = 0; u < units; ++u) above += keys[u] > t ? 1 : 0;
  // Every key above t, then the first (k - above) keys equal to t; branch-free except for ties.
  int32_t ties = k - above;
  int32_t n = 0;
  for (int64_t u = 0; u < units; ++u) {
    const uint32_t key = keys[u];
    bool keep = key > t;
    if (key == t && ties > 0) keep = true, --ties;
    out[n] = static_cast<int32_t>(u);  // n < k here: the loop ends when the k-th is kept
    n += keep ? 1 : 0;
    if (n == k) break;
  }
}

}  // namespace deja::worker::dejavu
