// `full`: every token stays; the cache grows to the sequence's length.
#include "worker/kv/eviction_policy.h"

namespace deja::worker::kv {
namespace {

class FullPolicy final : public EvictionPolicy {
 public:
  CachePolicyKind kind() const override { return CachePolicyKind::kFull; }
  int32_t budget() const override { return 0; }
  bool needs_scores() const override { return false; }
  void Plan(const HeadSlots&, std::vector<int32_t>*) const override {}
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeFullPolicy() { return std::make_unique<FullPolicy>(); }

}  // namespace deja::worker::kv
