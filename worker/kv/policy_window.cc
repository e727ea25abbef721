// `window`: only the `recent` most recent tokens stay (the baseline H2O is measured against).
#include "worker/kv/eviction_policy.h"

namespace deja::worker::kv {
namespace {

class WindowPolicy final : public EvictionPolicy {
 public:
  explicit WindowPolicy(int32_t recent) : recent_(recent) {}
  CachePolicyKind kind() const override { return CachePolicyKind::kWindow; }
  int32_t budget() const override { return recent_; }
  bool needs_scores() const override { return false; }
  int32_t recent() const override { return recent_; }
  void Plan(const HeadSlots& head, std::vector<int32_t>* evict) const override {
    if (head.occupied <= recent_) return;
    const int32_t oldest_kept = head.length - recent_;
    for (size_t s = 0; s < head.slot_pos.size(); ++s) {
      int32_t pos = head.slot_pos[s];
      if (pos >= 0 && pos < oldest_kept) evict->push_back(static_cast<int32_t>(s));
    }
  }

 private:
  int32_t recent_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeWindowPolicy(int32_t recent) {
  return std::make_unique<WindowPolicy>(recent);
}

}  // namespace deja::worker::kv
