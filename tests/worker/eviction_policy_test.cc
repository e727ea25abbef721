// Eviction policies on scripted score traces, and SequenceKv applying them: the budget is never
// exceeded, the kept set is the recent window plus the top scorers (checked against a brute-force
// oracle), evicted tokens never return, and memory stays bounded however long a sequence runs.
#include "worker/kv/eviction_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "worker/kv/kv_cache.h"

namespace deja::worker {
namespace {

kv::HeadSlots Head(const std::vector<int32_t>& pos, const std::vector<float>& score,
                   int32_t length) {
  kv::HeadSlots h;
  h.slot_pos = pos;
  h.score = score;
  h.occupied =
      static_cast<int32_t>(std::count_if(pos.begin(), pos.end(), [](int p) { return p >= 0; }));
  h.length = length;
  return h;
}

TEST(EvictionPolicyTest, WindowEvictsEverythingOlderThanTheWindow) {
  auto p = kv::MakeWindowPolicy(3);
  std::vector<int32_t> pos = {0, 1, 2, 3, 4, -1};
  std::vector<int32_t> evict;
  p->Plan(Head(pos, {}, 5), &evict);
  EXPECT_EQ(std::set<int32_t>(evict.begin(), evict.end()), (std::set<int32_t>{0, 1}));
}

TEST(EvictionPolicyTest, H2OKeepsRecentAndHeavyHitters) {
  auto p = kv::MakeH2OPolicy(/*heavy=*/2, /*recent=*/2);
  // Slots hold positions 0..6 (slot 7 free); positions 5 and 6 are recent.
  std::vector<int32_t> pos = {0, 1, 2, 3, 4, 5, 6, -1};
  std::vector<float> score = {5.0f, 0.1f, 3.0f, 0.2f, 0.3f, 0.0f, 0.0f, 0.0f};
  std::vector<int32_t> evict;
  p->Plan(Head(pos, score, 7), &evict);
  // Keep 0 and 2 (heavy) + 5, 6 (recent); evict 1, 3, 4.
  EXPECT_EQ(std::set<int32_t>(evict.begin(), evict.end()), (std::set<int32_t>{1, 3, 4}));
}

TEST(EvictionPolicyTest, H2OMeanScoreRanksByAttentionPerQuery) {
  // Length 10, recent window = position 9. Position 0 has the largest sum (4.5 over 10 queries:
  // 0.45 each), position 7 a smaller sum over only 3 queries (1.5: 0.5 each), position 4 2.0 over
  // 6 queries (0.33 each).
  std::vector<int32_t> pos = {0, 4, 7, 9};
  std::vector<float> score = {4.5f, 2.0f, 1.5f, 0.0f};
  std::vector<int32_t> evict;
  // Sum (the reference): keep 0 and 4, evict 7.
  kv::MakeH2OPolicy(/*heavy=*/2, /*recent=*/1)->Plan(Head(pos, score, 10), &evict);
  EXPECT_EQ(evict, (std::vector<int32_t>{2}));
  // Mean: keep 7 and 0, evict 4.
  evict.clear();
  kv::MakeH2OPolicy(2, 1, /*mean_score=*/true)->Plan(Head(pos, score, 10), &evict);
  EXPECT_EQ(evict, (std::vector<int32_t>{1}));
  // Through the config: only h2o reads the flag.
  kv::CachePolicyConfig c;
  c.kind = kv::CachePolicyKind::kH2O;
  c.heavy_tokens = 2;
  c.recent_tokens = 1;
  c.h2o_mean_score = true;
  auto p = kv::MakeEvictionPolicy(c, 10);
  ASSERT_TRUE(p.ok());
  evict.clear();
  (*p)->Plan(Head(pos, score, 10), &evict);
  EXPECT_EQ(evict, (std::vector<int32_t>{1}));
}

// Sinks: the first positions stay whatever their scores, in the decode path (one victim) and
// the prefill path (several).
TEST(EvictionPolicyTest, H2OSinksAreNeverEvicted) {
  std::vector<int32_t> pos = {0, 1, 2, 3, 4};
  std::vector<float> score = {0.0f, 0.1f, 5.0f, 4.0f, 0.0f};
  std::vector<int32_t> evict;
  kv::MakeH2OPolicy(/*heavy=*/3, /*recent=*/1)->Plan(Head(pos, score, 5), &evict);
  EXPECT_EQ(evict, (std::vector<int32_t>{0}));
  evict.clear();
  kv::MakeH2OPolicy(3, 1, false, 1.0f, /*sinks=*/1)->Plan(Head(pos, score, 5), &evict);
  EXPECT_EQ(evict, (std::vector<int32_t>{1}));
  evict.clear();
  // Sinks count within the heavy budget: heavy 2 with 2 sinks keeps positions 0, 1 and 4.
  kv::MakeH2OPolicy(2, 1, false, 1.0f, /*sinks=*/2)->Plan(Head(pos, score, 5), &evict);
  EXPECT_EQ(std::set<int32_t>(evict.begin(), evict.end()), (std::set<int32_t>{2, 3}));
  // More sinks than heavy slots: only `heavy` of them stay sinks.
  evict.clear();
  kv::MakeH2OPolicy(1, 1, false, 1.0f, /*sinks=*/3)->Plan(Head(pos, score, 5), &evict);
  EXPECT_EQ(std::set<int32_t>(evict.begin(), evict.end()), (std::set<int32_t>{1, 2, 3}));
}

// Decayed scores through SequenceKv: a token that drew all the attention long ago loses its
// place to one attended recently, where the plain sum keeps the old one.
TEST(SequenceKvTest, H2ODecayFavoursRecentAttention) {
  for (float decay : {1.0f, 0.5f}) {
    kv::KvGeometry g{1, 1, 4, DType::kF32};
    auto kv = kv::SequenceKv::Create(g, 8, kv::MakeH2OPolicy(1, 1, false, decay));
    ASSERT_TRUE(kv.ok());
    std::vector<float> k(4, 0.f), v(4, 0.f);
    // Position 0 gets 1.0 at the first step, position 1 gets 0.3 at each of the next steps.
    for (int step = 0; step < 4; ++step) {
      ASSERT_TRUE((*kv)->AppendPositions(1).ok());
      ASSERT_TRUE((*kv)->WriteLayer(0, 1, k.data(), v.data()).ok());
      kernels::KvView view = (*kv)->View(0);
      if (step == 0) view.score[0] += 1.0f;
      if (step >= 1) view.score[1] += 0.3f;
      ASSERT_TRUE((*kv)->EvictLayer(0).ok());
    }
    // Budget 2: the recent token (position 3) and one heavy hitter of positions 0 and 1.
    const kernels::KvView view = (*kv)->View(0);
    std::set<int32_t> kept;
    for (int32_t s = 0; s < view.used; ++s) {
      if (view.slot_pos[s] >= 0) kept.insert(view.slot_pos[s]);
    }
    // Sum: 1.0 against 0.9. Decayed by 0.5 per step: 0.125 against about 0.26.
    EXPECT_EQ(kept, (decay == 1.0f ? std::set<int32_t>{0, 3} : std::set<int32_t>{1, 3}))
        << "decay " << decay;
  }
}

TEST(EvictionPolicyTest, H2OTiesEvictTheOlderToken) {
  auto p = kv::MakeH2OPolicy(1, 1);
  std::vector<int32_t> pos = {3, 1, 2};  // slot order differs from position order
  std::vector<float> score = {1.0f, 1.0f, 9.0f};
  std::vector<int32_t> evict;
  p->Plan(Head(pos, score, 4), &evict);  // recent: position 3 (slot 0)
  // Candidates slots 1 (pos 1) and 2 (pos 2); one must go: the lower score (slot 1).
  EXPECT_EQ(evict, (std::vector<int32_t>{1}));
  score = {1.0f, 2.0f, 2.0f};
  evict.clear();
  p->Plan(Head(pos, score, 4), &evict);
  EXPECT_EQ(evict, (std::vector<int32_t>{1}));  // tie: position 1 is older than 2
}

// Plan against a plain sort on random slot tables: one slot over budget (the decode step's
// single-pass path) and several (after a prefill chunk), scores drawn from a few values so that
// ties are common, for the summed and the mean score.
TEST(EvictionPolicyTest, H2OPlanMatchesASortOnRandomTables) {
  std::mt19937 rng(5);
  for (bool mean : {false, true}) {
    for (int trial = 0; trial < 2000; ++trial) {
      const int32_t heavy = 1 + static_cast<int32_t>(rng() % 12);
      const int32_t recent = 1 + static_cast<int32_t>(rng() % 12);
      const int32_t excess = trial % 2 == 0 ? 1 : 1 + static_cast<int32_t>(rng() % 6);
      const int32_t occupied = heavy + recent + excess;
      const int32_t slots = occupied + static_cast<int32_t>(rng() % 5);
      const int32_t length = occupied + static_cast<int32_t>(rng() % 40);
      // `occupied` distinct positions below `length`, in random slots; the rest free.
      std::vector<int32_t> positions(length);
      for (int32_t i = 0; i < length; ++i) positions[i] = i;
      std::shuffle(positions.begin(), positions.end(), rng);
      std::vector<int32_t> pos(slots, -1);
      std::vector<float> score(slots, 0.f);
      for (int32_t i = 0; i < occupied; ++i) pos[i] = positions[i];
      // Make the latest position always present, as in a real cache.
      if (std::find(pos.begin(), pos.end(), length - 1) == pos.end()) pos[0] = length - 1;
      std::shuffle(pos.begin(), pos.end(), rng);
      for (float& x : score) x = static_cast<float>(rng() % 4) * 0.5f;
      kv::HeadSlots head = Head(pos, score, length);
      auto rank = [&](int32_t s) {
        return mean ? score[s] / static_cast<float>(length - pos[s]) : score[s];
      };
      std::vector<int32_t> cand;
      for (int32_t s = 0; s < slots; ++s) {
        if (pos[s] >= 0 && pos[s] < length - recent) cand.push_back(s);
      }
      std::sort(cand.begin(), cand.end(), [&](int32_t a, int32_t b) {
        return rank(a) < rank(b) || (rank(a) == rank(b) && pos[a] < pos[b]);
      });
      const size_t go = std::min<size_t>(cand.size(), head.occupied - (heavy + recent));
      std::set<int32_t> want(cand.begin(), cand.begin() + go);
      std::vector<int32_t> evict;
      kv::MakeH2OPolicy(heavy, recent, mean)->Plan(head, &evict);
      ASSERT_EQ(evict.size(), want.size()) << "trial " << trial;
      ASSERT_EQ(std::set<int32_t>(evict.begin(), evict.end()), want) << "trial " << trial;
    }
  }
}

TEST(EvictionPolicyTest, RatiosResolveAgainstThePrompt) {
  kv::CachePolicyConfig c;
  c.kind = kv::CachePolicyKind::kH2O;
  auto p = kv::MakeEvictionPolicy(c, 100);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)->budget(), 20);
  c.kind = kv::CachePolicyKind::kWindow;
  EXPECT_EQ((*kv::MakeEvictionPolicy(c, 100))->budget(), 20);
  c.kind = kv::CachePolicyKind::kH2O;
  c.heavy_tokens = 7;
  c.recent_tokens = 5;
  EXPECT_EQ((*kv::MakeEvictionPolicy(c, 100))->budget(), 12);
  c.recent_tokens = -1;
  EXPECT_EQ(kv::MakeEvictionPolicy(c, 100).status().code(), StatusCode::kInvalidArgument);
  c = kv::CachePolicyConfig{};
  c.kind = kv::CachePolicyKind::kH2O;
  c.heavy_ratio = 1.5f;
  Status s = kv::MakeEvictionPolicy(c, 10).status();
  EXPECT_NE(s.message().find("heavy_ratio"), std::string::npos);
  EXPECT_EQ((*kv::MakeEvictionPolicy(kv::CachePolicyConfig{}, 10))->budget(), 0);  // full
}

// Drives SequenceKv with random score traces and checks every step against an oracle that
// keeps, per head, its own list of (position, score) entries.
TEST(SequenceKvTest, H2OMatchesOracleOnRandomScoreTraces) {
  const int32_t heavy = 5, recent = 4, budget = heavy + recent;
  kv::KvGeometry g{2, 3, 4};
  auto kv_or = kv::SequenceKv::Create(g, budget + 8, kv::MakeH2OPolicy(heavy, recent));
  ASSERT_TRUE(kv_or.ok());
  kv::SequenceKv& kv = **kv_or;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  struct Entry {
    int32_t pos;
    float score;
  };
  std::vector<std::vector<Entry>> oracle(g.layers * g.heads);
  std::vector<float> k(8 * g.heads * g.head_dim, 0.f);
  std::set<int32_t> ever_evicted_h0;
  for (int step = 0; step < 200; ++step) {
    const int32_t n = step == 0 ? 8 : 1;  // a prefill chunk, then decode
    ASSERT_TRUE(kv.AppendPositions(n).ok());
    for (int32_t l = 0; l < g.layers; ++l) {
      ASSERT_TRUE(kv.WriteLayer(l, n, k.data(), k.data()).ok());
      kernels::KvView view = kv.View(l);
      ASSERT_NE(view.score, nullptr);
      for (int32_t h = 0; h < g.heads; ++h) {
        auto& o = oracle[l * g.heads + h];
        for (int32_t i = 0; i < n; ++i) o.push_back({kv.length() - n + i, 0.f});
        // Attention "adds probabilities": a scripted random increment per cached token.
        for (int32_t s = 0; s < view.used; ++s) {
          int32_t p = view.slot_pos[h * view.capacity + s];
          if (p < 0) continue;
          float inc = u(rng);
          view.score[h * view.capacity + s] += inc;
          for (Entry& e : o)
            if (e.pos == p) e.score += inc;
        }
        // Oracle eviction: keep recent + top-heavy (ties: the older goes first).
        while (static_cast<int32_t>(o.size()) > budget) {
          auto victim = o.end();
          for (auto it = o.begin(); it != o.end(); ++it) {
            if (it->pos >= kv.length() - recent) continue;
            if (victim == o.end() || it->score < victim->score ||
                (it->score == victim->score && it->pos < victim->pos)) {
              victim = it;
            }
          }
          if (l == 0 && h == 0) ever_evicted_h0.insert(victim->pos);
          o.erase(victim);
        }
      }
      ASSERT_TRUE(kv.EvictLayer(l).ok());
      view = kv.View(l);
      for (int32_t h = 0; h < g.heads; ++h) {
        std::set<int32_t> got, want;
        for (int32_t s = 0; s < view.used; ++s) {
          int32_t p = view.slot_pos[h * view.capacity + s];
          if (p >= 0) got.insert(p);
        }
        for (const Entry& e : oracle[l * g.heads + h]) want.insert(e.pos);
        ASSERT_EQ(got, want) << "step " << step << " layer " << l << " head " << h;
        ASSERT_LE(static_cast<int32_t>(got.size()), budget);
      }
    }
  }
  EXPECT_EQ(kv.cached_slots(), int64_t{budget} * g.layers * g.heads);
  EXPECT_GT(kv.evictions(), 0);
  EXPECT_FALSE(ever_evicted_h0.empty());
  // Memory is fixed at creation however long the sequence runs.
  EXPECT_EQ(kv.bytes(), g.SlotBytes() * (budget + 8));
}

// For both cache dtypes (the test's values 0..59 are exact in f16 too).
TEST(SequenceKvTest, ResizeKeepsContentsAndShrinksMemory) {
  for (DType dt : {DType::kF32, DType::kF16}) {
    SCOPED_TRACE(DTypeName(dt));
    kv::KvGeometry g{1, 2, 3, dt};
    auto kv = std::move(*kv::SequenceKv::Create(g, 12, kv::MakeWindowPolicy(4)));
    ASSERT_TRUE(kv->AppendPositions(10).ok());
    std::vector<float> k(10 * 2 * 3), v(10 * 2 * 3);
    for (size_t i = 0; i < k.size(); ++i) {
      k[i] = static_cast<float>(i);
      v[i] = -static_cast<float>(i);
    }
    ASSERT_TRUE(kv->WriteLayer(0, 10, k.data(), v.data()).ok());
    ASSERT_TRUE(kv->EvictLayer(0).ok());
    EXPECT_EQ(kv->cached_slots(), 8);
    ASSERT_TRUE(kv->Resize(5).ok());
    EXPECT_EQ(kv->bytes(), g.SlotBytes() * 5);
    kernels::KvView view = kv->View(0);
    EXPECT_EQ(view.dtype, dt);
    for (int32_t h = 0; h < 2; ++h) {
      std::set<int32_t> positions;
      for (int32_t s = 0; s < view.used; ++s) {
        int32_t p = view.slot_pos[h * view.capacity + s];
        if (p < 0) continue;
        positions.insert(p);
        for (int32_t d = 0; d < 3; ++d) {
          const size_t at = static_cast<size_t>((h * view.capacity + s) * 3 + d);
          EXPECT_EQ(LoadAsFloat(view.k, dt, at), k[p * 6 + h * 3 + d]);
          EXPECT_EQ(LoadAsFloat(view.v, dt, at), v[p * 6 + h * 3 + d]);
        }
      }
      EXPECT_EQ(positions, (std::set<int32_t>{6, 7, 8, 9}));
    }
    EXPECT_EQ(kv->Resize(3).code(), StatusCode::kOutOfRange);
    ASSERT_TRUE(kv->AppendPositions(1).ok());  // one free slot after the resize
    EXPECT_EQ(kv->AppendPositions(1).code(), StatusCode::kOutOfRange);
  }
}

// A freed sequence's tensors go to the next sequence of the same shape (same memory, already
// mapped) as an empty cache: no position in any slot, zero H2O scores; the pool keeps at most
// its limit.
TEST(SequenceKvTest, FreedCachesAreReusedEmptyAndBounded) {
  kv::SetKvTensorPoolLimit(size_t{1} << 30);
  const kv::KvGeometry g{2, 3, 4, DType::kF16};
  auto first = std::move(*kv::SequenceKv::Create(g, 10, kv::MakeH2OPolicy(2, 2)));
  ASSERT_TRUE(first->AppendPositions(6).ok());
  std::vector<float> k(6 * 3 * 4, 1.5f), v(6 * 3 * 4, -2.f);
  for (int32_t l = 0; l < 2; ++l) {
    ASSERT_TRUE(first->WriteLayer(l, 6, k.data(), v.data()).ok());
    kernels::KvView view = first->View(l);
    for (int32_t i = 0; i < 3 * 10; ++i) view.score[i] = 0.25f;  // as attention would
  }
  const void* k0 = first->View(0).k;
  first.reset();
  EXPECT_GE(kv::KvTensorPoolBytes(), 2 * (2 * 3 * 10 * 4 * 2 + 3 * 10 * 4));

  auto second = std::move(*kv::SequenceKv::Create(g, 10, kv::MakeH2OPolicy(2, 2)));
  const std::set<const void*> reused = {second->View(0).k, second->View(0).v, second->View(1).k,
                                        second->View(1).v};
  EXPECT_EQ(reused.count(k0), 1u) << "the freed K tensor was not reused";
  EXPECT_EQ(second->length(), 0);
  EXPECT_EQ(second->cached_slots(), 0);
  for (int32_t l = 0; l < 2; ++l) {
    kernels::KvView view = second->View(l);
    EXPECT_EQ(view.used, 0);
    for (int32_t i = 0; i < 3 * 10; ++i) {
      ASSERT_EQ(view.slot_pos[i], -1);
      ASSERT_EQ(view.score[i], 0.f);
    }
  }
  // A shape the pool does not hold: allocating it releases pooled tensors first.
  second.reset();
  const size_t pooled = kv::KvTensorPoolBytes();
  auto other = std::move(*kv::SequenceKv::Create(g, 20, kv::MakeH2OPolicy(2, 2)));
  const size_t fresh = 2 * (2 * 3 * 20 * 4 * 2 + 3 * 20 * 4);  // K, V (f16), scores: 20 slots
  EXPECT_LE(kv::KvTensorPoolBytes() + std::min(pooled, fresh), pooled);
  other.reset();
  kv::SetKvTensorPoolLimit(0);
  EXPECT_EQ(kv::KvTensorPoolBytes(), 0u);
  auto third = std::move(*kv::SequenceKv::Create(g, 10));
  third.reset();
  EXPECT_EQ(kv::KvTensorPoolBytes(), 0u);
  kv::SetKvTensorPoolLimit(size_t{1} << 30);
}

// An f16 cache costs 2 bytes per K/V element instead of 4 (score and position unchanged), and
// WriteLayer rounds to nearest even; any other dtype is refused.
TEST(SequenceKvTest, F16CacheHalvesKvBytesAndRounds) {
  kv::KvGeometry f32{2, 4, 64, DType::kF32}, f16{2, 4, 64, DType::kF16};
  EXPECT_EQ(f32.SlotBytes(), 2u * 4 * (2 * 64 * 4 + 8));
  EXPECT_EQ(f16.SlotBytes(), 2u * 4 * (2 * 64 * 2 + 8));
  auto kv = std::move(*kv::SequenceKv::Create(kv::KvGeometry{1, 1, 20, DType::kF16}, 2));
  ASSERT_TRUE(kv->AppendPositions(1).ok());
  std::vector<float> k(20), v(20);
  for (int i = 0; i < 20; ++i) {
    k[i] = 1.0f + std::ldexp(1.0f, -11) * (i % 4);  // ties and off-ties around 1 + 2^-10 steps
    v[i] = 3.14159f * (i - 10);
  }
  ASSERT_TRUE(kv->WriteLayer(0, 1, k.data(), v.data()).ok());
  kernels::KvView view = kv->View(0);
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(LoadAsFloat(view.k, DType::kF16, i), HalfToFloat(FloatToHalf(k[i]))) << i;
    EXPECT_EQ(LoadAsFloat(view.v, DType::kF16, i), HalfToFloat(FloatToHalf(v[i]))) << i;
  }
  EXPECT_EQ(kv::SequenceKv::Create(kv::KvGeometry{1, 1, 4, DType::kBF16}, 2).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace deja::worker
