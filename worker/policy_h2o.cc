// `h2o` (Heavy-Hitter Oracle): keeps the `recent` most recent tokens plus the `heavy` tokens
// with the largest accumulated attention among the others. Scores are not normalised by age, as
// in the reference (early tokens are favoured). Ties go to the older token's eviction, so the
// plan is deterministic. Cost: O(slots) per head per step (one selection pass).
// With mean_score (an alternative, not the reference) a token ranks by its score divided by the
// number of queries that have attended to it so far (length - position), its mean attention.
#include <algorithm>

#include "worker/eviction_policy.h"

namespace deja::worker {
namespace {

class H2OPolicy final : public EvictionPolicy {
 public:
  H2OPolicy(int32_t heavy, int32_t recent, bool mean_score)
      : heavy_(heavy), recent_(recent), mean_score_(mean_score) {}
  CachePolicyKind kind() const override { return CachePolicyKind::kH2O; }
  int32_t budget() const override { return heavy_ + recent_; }
  bool needs_scores() const override { return true; }

  void Plan(const HeadSlots& head, std::vector<int32_t>* evict) const override {
    if (head.occupied <= budget()) return;
    const int32_t oldest_recent = head.length - recent_;
    // Candidates: occupied slots outside the recent window.
    thread_local std::vector<int32_t> cand;
    cand.clear();
    for (size_t s = 0; s < head.slot_pos.size(); ++s) {
      int32_t pos = head.slot_pos[s];
      if (pos >= 0 && pos < oldest_recent) cand.push_back(static_cast<int32_t>(s));
    }
    const int32_t excess = head.occupied - budget();
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
  int32_t heavy_, recent_;
  bool mean_score_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeH2OPolicy(int32_t heavy, int32_t recent, bool mean_score) {
  return std::make_unique<H2OPolicy>(heavy, recent, mean_score);
}

}  // namespace deja::worker
