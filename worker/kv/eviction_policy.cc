#include "worker/kv/eviction_policy.h"

#include <algorithm>
#include <cmath>

#include "worker/kv/policy_table.h"

namespace deja::worker::kv {

Status CachePolicyConfig::Validate() const {
  if (!(heavy_ratio >= 0.f && heavy_ratio <= 1.f)) {
    return InvalidArgument("heavy_ratio must be in [0, 1]");
  }
  if (!(recent_ratio >= 0.f && recent_ratio <= 1.f)) {
    return InvalidArgument("recent_ratio must be in [0, 1]");
  }
  if (!CachePolicyOf(kind).bounded) return Status::Ok();
  const bool absolute = heavy_tokens >= 0 || recent_tokens >= 0;
  if (absolute && (heavy_tokens < 0 || recent_tokens < 0)) {
    return InvalidArgument("heavy_tokens and recent_tokens must be given together");
  }
  if (absolute && heavy_tokens + recent_tokens <= 0) {
    return InvalidArgument("recent_tokens + heavy_tokens must be > 0");
  }
  if (!absolute && heavy_ratio + recent_ratio <= 0.f) {
    return InvalidArgument("recent_ratio + heavy_ratio must be > 0");
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(const CachePolicyConfig& c,
                                                             int32_t prompt_tokens) {
  DEJA_RETURN_IF_ERROR(c.Validate());
  int32_t heavy = c.heavy_tokens, recent = c.recent_tokens;
  if (heavy < 0) {
    auto part = [&](float ratio) {
      return ratio > 0.f
                 ? std::max<int32_t>(1, static_cast<int32_t>(std::ceil(ratio * prompt_tokens)))
                 : 0;
    };
    heavy = part(c.heavy_ratio);
    recent = part(c.recent_ratio);
  }
  return CachePolicyOf(c.kind).make(heavy, recent, c);
}

}  // namespace deja::worker::kv
