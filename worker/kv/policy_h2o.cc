// `h2o` (Heavy-Hitter Oracle), and `locret` with the same plan over other scores: keeps the
// `recent` most recent tokens plus the `heavy` tokens with the largest accumulated attention among
// the others. Scores are not normalised by age, as in the reference (early tokens are favoured).
// Ties go to the older token's eviction, so the plan is deterministic. Cost: O(slots) per head per
// step: one pass when one slot goes (decode), a selection over the candidates otherwise. With
// mean_score (an alternative, not the reference) a token ranks by its score divided by the number
// of queries that have attended to it so far (length - position), its mean attention. Decayed
// scores (SequenceKv, or KvEvict on a paged cache, multiplies them by score_decay() each step;
// served) and sinks (the first positions, within the heavy budget, never go; deja-lab ppl only).
#include <algorithm>
#include <cstdint>

#include "common/vec_math.h"
#include "worker/kv/eviction_policy.h"

namespace deja::worker::kv {
namespace {

class H2OPolicy final : public EvictionPolicy {
 public:
  H2OPolicy(int32_t heavy, int32_t recent, bool mean_score, float decay, int32_t sinks,
            CachePolicyKind kind = CachePolicyKind::kH2O)
      : kind_(kind),
        heavy_(heavy),
        recent_(recent),
        mean_score_(mean_score),
        decay_(decay),
        sinks_(std::min(sinks, heavy)) {}
  CachePolicyKind kind() const override { return kind_; }
  int32_t budget() const override { return heavy_ + recent_; }
  bool needs_scores() const override { return true; }
  // Locret ranks by the retaining heads' scores, which attention leaves as they are.
  bool accumulates_scores() const override { return kind_ == CachePolicyKind::kH2O; }
  int32_t recent() const override { return recent_; }
  bool mean_score() const override { return mean_score_; }
  float score_decay() const override { return decay_; }
  int32_t sinks() const override { return sinks_; }

  void Plan(const HeadSlots& head, std::vector<int32_t>* evict) const override {
    if (head.occupied <= budget()) return;
    const int32_t oldest_recent = head.length - recent_;
    const int32_t excess = head.occupied - budget();
    if (excess == 1 && sinks_ == 0) {
      // A decode step: one slot goes, the lowest-ranked candidate. One pass, no candidate
      // list (the general path below took 27% of a 299-sequence opt-mini decode step).
      const int32_t victim =
          mean_score_ ? LowestCandidate<true>(head, oldest_recent)
                      : LowestScoreSlot(head.slot_pos.data(), head.score.data(),
                                        static_cast<int64_t>(head.slot_pos.size()), oldest_recent);
      if (victim >= 0) evict->push_back(victim);
      return;
    }
    // Candidates: occupied slots outside the recent window.
    thread_local std::vector<int32_t> cand;
    cand.clear();
    for (size_t s = 0; s < head.slot_pos.size(); ++s) {
      int32_t pos = head.slot_pos[s];
      if (pos >= sinks_ && pos < oldest_recent) cand.push_back(static_cast<int32_t>(s));
    }
    if (excess >= static_cast<int32_t>(cand.size())) {
      evict->insert(evict->end(), cand.begin(), cand.end());
      return;
    }
    // The `excess` lowest-scoring candidates go; lower position breaks ties (evicted first).
    auto rank = [&](int32_t s) {
      return mean_score_ ? head.score[s] / static_cast<float>(head.length - head.slot_pos[s])
                         : head.score[s];
    };
    auto lower = [&](int32_t a, int32_t b) {
      float sa = rank(a), sb = rank(b);
      return sa < sb || (sa == sb && head.slot_pos[a] < head.slot_pos[b]);
    };
    std::nth_element(cand.begin(), cand.begin() + excess, cand.end(), lower);
    evict->insert(evict->end(), cand.begin(), cand.begin() + excess);
  }

 private:
  // The occupied slot outside the recent window with the lowest (rank, position), or -1 when
  // there is none: exactly the first element nth_element picks below with excess 1.
  template <bool kMean>
  static int32_t LowestCandidate(const HeadSlots& head, int32_t oldest_recent) {
    const int32_t* pos = head.slot_pos.data();
    const float* score = head.score.data();
    const int32_t n = static_cast<int32_t>(head.slot_pos.size());
    int32_t best = -1, best_pos = 0;
    float best_rank = 0.f;
    for (int32_t s = 0; s < n; ++s) {
      const int32_t p = pos[s];
      if (p < 0 || p >= oldest_recent) continue;
      const float r = kMean ? score[s] / static_cast<float>(head.length - p) : score[s];
      if (best < 0 || r < best_rank || (r == best_rank && p < best_pos)) {
        best = s;
        best_rank = r;
        best_pos = p;
      }
    }
    return best;
  }

  CachePolicyKind kind_;
  int32_t heavy_, recent_;
  bool mean_score_;
  float decay_;
  int32_t sinks_;
};

}  // namespace

// The same plan as h2o's: the recent tokens (Locret's stabilisers, the paper's +inf scores) stay,
// the lowest-scored others go.
std::unique_ptr<EvictionPolicy> MakeLocretPolicy(int32_t scored, int32_t stabilisers) {
  return std::make_unique<H2OPolicy>(scored, stabilisers, false, 1.0f, 0, CachePolicyKind::kLocret);
}

std::unique_ptr<EvictionPolicy> MakeH2OPolicy(int32_t heavy, int32_t recent, bool mean_score,
                                              float decay, int32_t sinks) {
  return std::make_unique<H2OPolicy>(heavy, recent, mean_score, decay, sinks);
}

}  // namespace deja::worker::kv
