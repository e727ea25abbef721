#include "worker/kv/eviction_policy.h"

#include <cmath>

namespace deja::worker::kv {

const char* CachePolicyConfig::KindName(CachePolicyKind kind) {
  switch (kind) {
    case CachePolicyKind::kFull: return "full";
    case CachePolicyKind::kWindow: return "window";
    case CachePolicyKind::kH2O: return "h2o";
  }
  return "?";
}

StatusOr<CachePolicyKind> CachePolicyConfig::ParseKind(const std::string& name) {
  if (name == "full") return CachePolicyKind::kFull;
  if (name == "window") return CachePolicyKind::kWindow;
  if (name == "h2o") return CachePolicyKind::kH2O;
  return InvalidArgument("cache policy must be one of full, window, h2o; got '" + name + "'");
}

Status CachePolicyConfig::Validate() const {
  if (!(heavy_ratio >= 0.f && heavy_ratio <= 1.f)) {
    return InvalidArgument("heavy_ratio must be in [0, 1]");
  }
  if (!(recent_ratio >= 0.f && recent_ratio <= 1.f)) {
    return InvalidArgument("recent_ratio must be in [0, 1]");
  }
  if (kind == CachePolicyKind::kFull) return Status::Ok();
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
  if (c.kind == CachePolicyKind::kFull) return MakeFullPolicy();
  int32_t heavy = c.heavy_tokens, recent = c.recent_tokens;
  if (heavy < 0) {
    auto part = [&](float ratio) {
      return ratio > 0.f ? std::max<int32_t>(1, static_cast<int32_t>(
                                                    std::ceil(ratio * prompt_tokens)))
                         : 0;
    };
    heavy = part(c.heavy_ratio);
    recent = part(c.recent_ratio);
  }
  // The window baseline gets the same total budget, all of it recent.
  if (c.kind == CachePolicyKind::kWindow) return MakeWindowPolicy(heavy + recent);
  if (recent == 0) recent = 1;  // the token being decoded always stays
  return MakeH2OPolicy(heavy, recent, c.h2o_mean_score);
}

}  // namespace deja::worker::kv
