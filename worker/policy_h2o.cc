// `h2o` (Heavy-Hitter Oracle): keeps the `recent` most recent tokens plus the `heavy` tokens
// with the largest accumulated attention among the others. Scores are not normalised by age, as
// in the reference (early tokens are favoured). Ties go to the older token's eviction, so the
// plan is deterministic. Cost: O(slots) per head per step (one selection pass).
#include <algorithm>

#include "worker/eviction_policy.h"

namespace deja::worker {
namespace {

class H2OPolicy final : public EvictionPolicy {
 public:
  H2OPolicy(int32_t heavy, int32_t recent) : heavy_(heavy), recent_(recent) {}
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
    auto lower = [&](int32_t a, int32_t b) {
      float sa = head.score[a], sb = head.score[b];
      return sa < sb || (sa == sb && head.slot_pos[a] < head.slot_pos[b]);
    };
    std::nth_element(cand.begin(), cand.begin() + excess, cand.end(), lower);
    evict->insert(evict->end(), cand.begin(), cand.begin() + excess);
  }

 private:
  int32_t heavy_, recent_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeH2OPolicy(int32_t heavy, int32_t recent) {
  return std::make_unique<H2OPolicy>(heavy, recent);
}

}  // namespace deja::worker
