#include "coordinator/validation.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

#include "common/enum_table.h"
#include "common/utf8.h"
#include "coordinator/sparsity_mode.h"
#include "worker/kv/policy_table.h"
#include "worker/rules/request_rules.h"

namespace deja::coordinator {

namespace kv = worker::kv;

namespace {

constexpr auto& Num = rules::FormatNumber;
constexpr auto& Invalid = rules::InvalidField;

Status ResolveSampling(const v1::SamplingParams& s, uint64_t random_seed, int32_t vocab,
                       v1::WorkerSampling* out) {
  const float temperature = s.has_temperature() ? s.temperature() : 1.0f;
  DEJA_RETURN_IF_ERROR(rules::CheckTemperature(temperature, "sampling.temperature"));
  const int32_t top_k = s.has_top_k() ? s.top_k() : 0;
  DEJA_RETURN_IF_ERROR(rules::CheckTopK(top_k, "sampling.top_k"));
  const float top_p = s.has_top_p() ? s.top_p() : 1.0f;
  DEJA_RETURN_IF_ERROR(rules::CheckTopP(top_p, "sampling.top_p"));
  const float penalty = s.has_repetition_penalty() ? s.repetition_penalty() : 1.0f;
  DEJA_RETURN_IF_ERROR(rules::CheckRepetitionPenalty(penalty, "sampling.repetition_penalty"));
  // Temperature 0 means greedy even when sampling was asked for (proto contract).
  out->set_do_sample(s.do_sample() && temperature > 0.f);
  out->set_temperature(temperature);
  out->set_top_k(top_k);
  out->set_top_p(top_p);
  out->set_repetition_penalty(penalty);
  out->set_seed(s.has_seed() ? s.seed() : random_seed);
  if (s.has_presence_penalty()) {
    DEJA_RETURN_IF_ERROR(
        rules::CheckTokenPenalty(s.presence_penalty(), "sampling.presence_penalty"));
    out->set_presence_penalty(s.presence_penalty());
  }
  if (s.has_frequency_penalty()) {
    DEJA_RETURN_IF_ERROR(
        rules::CheckTokenPenalty(s.frequency_penalty(), "sampling.frequency_penalty"));
    out->set_frequency_penalty(s.frequency_penalty());
  }
  DEJA_RETURN_IF_ERROR(rules::CheckLogitBiasCount(s.logit_bias_size(), "sampling.logit_bias"));
  for (const auto& [id, bias] : s.logit_bias()) {
    DEJA_RETURN_IF_ERROR(rules::CheckLogitBias(id, bias, vocab, "sampling.logit_bias"));
    if (bias != 0.f) (*out->mutable_logit_bias())[id] = bias;
  }
  return Status::Ok();
}

uint32_t RatioTokens(float ratio, size_t prompt_tokens) {
  // The epsilon keeps 0.1f * 40 (4.0000001 in float) at 4.
  return static_cast<uint32_t>(std::ceil(static_cast<double>(ratio) * prompt_tokens - 1e-4));
}

// A heavy-hitter budget in `f` for a bounded kind without heavy hitters (window) is refused;
// full ignores every budget.
Status CheckHeavyBudget(const v1::CachePolicy& f, const kv::CachePolicyRow& row,
                        const std::string& prefix) {
  if (!row.bounded || row.heavy_hitters || !(f.has_heavy_ratio() || f.has_heavy_tokens())) {
    return Status::Ok();
  }
  return Invalid(prefix + (f.has_heavy_ratio() ? "heavy_ratio" : "heavy_tokens"),
                 "is not allowed with " + v1::CachePolicy::Kind_Name(row.api));
}

// Decayed scores need scores that attention accumulates: refused for any other kind.
Status CheckScoreDecay(const v1::CachePolicy& f, const kv::CachePolicyRow& row,
                       const std::string& prefix) {
  if (!f.has_score_decay()) return Status::Ok();
  return rules::CheckScoreDecayKind(row, prefix + "score_decay");
}

// Range and exclusivity rules of a policy's budget fields; `prefix` names where they came from.
Status CheckCacheFields(const v1::CachePolicy& f, const std::string& prefix) {
  if (f.has_heavy_ratio() && f.has_heavy_tokens()) {
    return Invalid(prefix + "heavy_tokens", "and " + prefix + "heavy_ratio are mutually exclusive");
  }
  if (f.has_recent_ratio() && f.has_recent_tokens()) {
    return Invalid(prefix + "recent_tokens",
                   "and " + prefix + "recent_ratio are mutually exclusive");
  }
  if (f.has_heavy_ratio() && !(f.heavy_ratio() >= 0.f && f.heavy_ratio() <= 1.f)) {
    return Invalid(prefix + "heavy_ratio", "must be in [0, 1], got " + Num(f.heavy_ratio()));
  }
  if (f.has_recent_ratio() && !(f.recent_ratio() > 0.f && f.recent_ratio() <= 1.f)) {
    return Invalid(prefix + "recent_ratio", "must be in (0, 1], got " + Num(f.recent_ratio()));
  }
  if (f.has_recent_tokens() && f.recent_tokens() < 1) {
    return Invalid(prefix + "recent_tokens", "must be >= 1, got 0");
  }
  if (f.has_score_decay()) {
    DEJA_RETURN_IF_ERROR(rules::CheckScoreDecayRange(f.score_decay(), prefix + "score_decay"));
  }
  if (const kv::CachePolicyRow* row =
          FindRow(kv::CachePolicyTable(), &kv::CachePolicyRow::api, f.kind())) {
    DEJA_RETURN_IF_ERROR(CheckHeavyBudget(f, *row, prefix));
    DEJA_RETURN_IF_ERROR(CheckScoreDecay(f, *row, prefix));
  }
  return Status::Ok();
}

// The heavy (or recent) budget `c` sets, in tokens (a ratio resolved against the prompt), if any.
std::optional<uint32_t> BudgetOf(const v1::CachePolicy& c, bool heavy, size_t prompt_tokens) {
  if (heavy ? c.has_heavy_tokens() : c.has_recent_tokens()) {
    return heavy ? c.heavy_tokens() : c.recent_tokens();
  }
  if (heavy ? c.has_heavy_ratio() : c.has_recent_ratio()) {
    return RatioTokens(heavy ? c.heavy_ratio() : c.recent_ratio(), prompt_tokens);
  }
  return std::nullopt;
}

// `max_tokens`: the sequence's length at most (prompt + max_new_tokens).
Status ResolveCache(const v1::CachePolicy& requested, const ModelLimits& limits,
                    size_t prompt_tokens, size_t max_tokens, v1::WorkerCachePolicy* out) {
  const v1::CachePolicy& server_default = limits.default_cache;
  DEJA_RETURN_IF_ERROR(CheckCacheFields(requested, "cache."));
  // KIND_UNSPECIFIED takes the server default's kind; a server without one serves full.
  const bool unspecified = requested.kind() == v1::CachePolicy::KIND_UNSPECIFIED;
  const v1::CachePolicy::Kind api = unspecified ? server_default.kind() : requested.kind();
  DEJA_ASSIGN_OR_RETURN(
      const kv::CachePolicyKind kind,
      kv::FromProto(api == v1::CachePolicy::KIND_UNSPECIFIED ? v1::CachePolicy::KIND_FULL : api,
                    "cache.kind"));
  const kv::CachePolicyRow& row = kv::CachePolicyOf(kind);
  DEJA_RETURN_IF_ERROR(rules::CheckRetainingHeads(row, limits.locret_available, "cache.kind"));
  DEJA_RETURN_IF_ERROR(CheckHeavyBudget(requested, row, "cache."));
  DEJA_RETURN_IF_ERROR(CheckScoreDecay(requested, row, "cache."));
  // Each budget: the request's own field, else the server default's when the request asks for
  // the default's kind (or leaves the kind to it), else 10% of the prompt.
  const bool default_budgets = api == server_default.kind();
  auto budget = [&](bool heavy) -> uint32_t {
    if (std::optional<uint32_t> b = BudgetOf(requested, heavy, prompt_tokens)) return *b;
    if (default_budgets) {
      if (std::optional<uint32_t> b = BudgetOf(server_default, heavy, prompt_tokens)) return *b;
    }
    return RatioTokens(0.1f, prompt_tokens);
  };
  out->set_kind(row.wire);
  if (!row.bounded) return Status::Ok();
  const uint32_t heavy = row.heavy_hitters ? budget(/*heavy=*/true) : 0;
  const uint32_t recent = std::max<uint32_t>(budget(/*heavy=*/false), 1);
  // Budgets that reach the sequence's length evict nothing: the full cache, exactly.
  if (static_cast<uint64_t>(heavy) + recent >= max_tokens) {
    out->Clear();
    out->set_kind(kv::CachePolicyOf(kv::CachePolicyKind::kFull).wire);
    return Status::Ok();
  }
  if (row.heavy_hitters) out->set_heavy_tokens(heavy);
  out->set_recent_tokens(recent);
  if (row.decays) {
    float decay = 1.f;
    if (requested.has_score_decay()) {
      decay = requested.score_decay();
    } else if (default_budgets && server_default.has_score_decay()) {
      decay = server_default.score_decay();
    }
    if (decay != 1.f) out->set_score_decay(decay);
  }
  if (row.retaining_heads) {
    out->set_chunk_tokens(static_cast<uint32_t>(std::max(1, limits.locret_chunk)));
  }
  return Status::Ok();
}

}  // namespace

Status ValidateDefaultCachePolicy(const v1::CachePolicy& policy) {
  if (policy.kind() != v1::CachePolicy::KIND_UNSPECIFIED) {
    DEJA_RETURN_IF_ERROR(kv::FromProto(policy.kind(), "default cache policy kind").status());
  }
  return CheckCacheFields(policy, "default cache policy ");
}

namespace {

Status ResolveSparsity(const v1::Sparsity& s, const ModelLimits& limits,
                       v1::SequenceConfig* config) {
  DEJA_ASSIGN_OR_RETURN(const std::optional<bool> mode,
                        SparsityFromProto(s.mode(), "sparsity.mode"));
  if (s.has_schedule()) {
    if (mode.has_value() && !*mode) {
      return Invalid("sparsity.schedule",
                     "cannot be set with " + v1::Sparsity::Mode_Name(s.mode()));
    }
    bool known = false;
    for (const std::string& name : limits.sparsity_schedules) known |= name == s.schedule();
    if (!known) {
      return Invalid("sparsity.schedule", "'" + s.schedule() + "' is not a schedule this " +
                                              "server loaded (see ModelInfo.sparsity_schedules)");
    }
  }
  // Unspecified: a schedule asks for sparsity, else the server's default decides.
  const bool on =
      mode.value_or(s.has_schedule() || (limits.sparsity_available && limits.sparsity_default));
  if (on && !limits.sparsity_available) {
    return FailedPrecondition("sparsity.mode: MODE_ON needs predictors, and this server has none");
  }
  config->set_sparse(on);
  if (on) config->set_sparsity_schedule(s.has_schedule() ? s.schedule() : "");
  return Status::Ok();
}

Status ResolvePrompt(const v1::GenerateRequest& request, const ModelLimits& limits,
                     const Tokenizer& tokenizer, ResolvedRequest* out) {
  switch (request.input_case()) {
    case v1::GenerateRequest::kText: {
      if (request.text().empty()) return Invalid("input", "is empty: set a non-empty text");
      if (size_t bad = FindInvalidUtf8(request.text()); bad != kUtf8Valid) {
        return Invalid("text",
                       "is not valid UTF-8 (bad byte at offset " + std::to_string(bad) + ")");
      }
      StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(request.text(), /*add_bos=*/true);
      if (!ids.ok()) return Invalid("text", ids.status().message());
      out->prompt = std::move(*ids);
      out->text_prompt = true;
      break;
    }
    case v1::GenerateRequest::kTokenIds: {
      const auto& ids = request.token_ids().ids();
      if (ids.empty()) return Invalid("input", "is empty: token_ids.ids has no ids");
      for (int i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || ids[i] >= limits.vocab_size) {
          return Invalid("token_ids.ids[" + std::to_string(i) + "]",
                         "must be in [0, " + std::to_string(limits.vocab_size) + "), got " +
                             std::to_string(ids[i]));
        }
      }
      out->prompt.assign(ids.begin(), ids.end());
      break;
    }
    default:
      return Invalid("input", "is not set: set text or token_ids");
  }
  if (static_cast<int64_t>(out->prompt.size()) >= limits.max_positions) {
    return Invalid("input", "has " + std::to_string(out->prompt.size()) +
                                " tokens; the model's limit is " +
                                std::to_string(limits.max_positions) +
                                " positions for prompt plus new tokens");
  }
  return Status::Ok();
}

Status ResolveStopping(const v1::StoppingCriteria& s, const ModelLimits& limits,
                       ResolvedRequest* out) {
  const int64_t room = limits.max_positions - static_cast<int64_t>(out->prompt.size());
  if (s.has_max_new_tokens()) {
    if (s.max_new_tokens() < 1 || s.max_new_tokens() > room) {
      return Invalid("stopping.max_new_tokens",
                     "must be in [1, " + std::to_string(room) + "] for a " +
                         std::to_string(out->prompt.size()) + "-token prompt (model limit " +
                         std::to_string(limits.max_positions) + "), got " +
                         std::to_string(s.max_new_tokens()));
    }
    out->max_new_tokens = s.max_new_tokens();
  } else {
    out->max_new_tokens =
        static_cast<int32_t>(std::min<int64_t>(std::max(limits.default_max_new_tokens, 1), room));
  }
  if (s.stop_sequences_size() > kMaxStopSequences) {
    return Invalid("stopping.stop_sequences", "has " + std::to_string(s.stop_sequences_size()) +
                                                  " entries; at most " +
                                                  std::to_string(kMaxStopSequences));
  }
  for (int i = 0; i < s.stop_sequences_size(); ++i) {
    const std::string& stop = s.stop_sequences(i);
    const std::string field = "stopping.stop_sequences[" + std::to_string(i) + "]";
    if (stop.empty()) return Invalid(field, "is empty");
    if (stop.size() > kMaxStopSequenceBytes) {
      return Invalid(field, "is " + std::to_string(stop.size()) + " bytes; at most " +
                                std::to_string(kMaxStopSequenceBytes));
    }
    if (FindInvalidUtf8(stop) != kUtf8Valid) return Invalid(field, "is not valid UTF-8");
    out->stop_sequences.push_back(stop);
  }
  if (s.stop_token_ids_size() > kMaxStopTokenIds) {
    return Invalid("stopping.stop_token_ids", "has " + std::to_string(s.stop_token_ids_size()) +
                                                  " ids; at most " +
                                                  std::to_string(kMaxStopTokenIds));
  }
  for (int i = 0; i < s.stop_token_ids_size(); ++i) {
    const int32_t id = s.stop_token_ids(i);
    if (id < 0 || id >= limits.vocab_size) {
      return Invalid(
          "stopping.stop_token_ids[" + std::to_string(i) + "]",
          "must be in [0, " + std::to_string(limits.vocab_size) + "), got " + std::to_string(id));
    }
    out->stop_token_ids.push_back(id);
  }
  out->ignore_eos = s.ignore_eos();
  out->time_limit_ms = s.has_time_limit_ms() ? s.time_limit_ms() : 0;
  return Status::Ok();
}

}  // namespace

bool ResolvedRequest::BoundedCache() const {
  const kv::CachePolicyRow* row =
      FindRow(kv::CachePolicyTable(), &kv::CachePolicyRow::wire, config.cache().kind());
  return row != nullptr && row->bounded;
}

Status ValidateRequestId(const std::string& id) {
  if (id.empty() || id.size() > kMaxRequestIdBytes) {
    return Invalid("request_id", "must be 1 to " + std::to_string(kMaxRequestIdBytes) +
                                     " bytes, got " + std::to_string(id.size()));
  }
  for (size_t i = 0; i < id.size(); ++i) {
    const char c = id[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == ':' || c == '-';
    if (!ok) {
      return Invalid("request_id",
                     "may only hold [A-Za-z0-9._:-]; bad byte at offset " + std::to_string(i));
    }
  }
  return Status::Ok();
}

std::string PrefixCacheKey(const v1::SequenceConfig& config,
                           const std::optional<std::string>& salt) {
  // Length-prefixed parts: no two (schedule, salt) pairs give one key.
  std::string key;
  auto part = [&key](const std::string& s) {
    key += std::to_string(s.size());
    key += ':';
    key += s;
  };
  if (config.sparse()) {
    part("sparse");
    part(config.sparsity_schedule().empty() ? "default" : config.sparsity_schedule());
  } else {
    part("dense");
  }
  if (salt.has_value()) {
    part("salt");
    part(*salt);
  }
  return key;
}

StatusOr<ResolvedRequest> ResolveRequest(const v1::GenerateRequest& request,
                                         const ModelLimits& limits, const Tokenizer& tokenizer,
                                         uint64_t random_seed) {
  ResolvedRequest out;
  if (request.has_request_id()) {
    DEJA_RETURN_IF_ERROR(ValidateRequestId(request.request_id()));
    out.request_id = request.request_id();
  }
  DEJA_RETURN_IF_ERROR(
      ResolveSampling(request.sampling(), random_seed, limits.vocab_size,
                      out.config.mutable_sampling()));
  DEJA_RETURN_IF_ERROR(ResolvePrompt(request, limits, tokenizer, &out));
  out.config.mutable_sampling()->set_output_start(static_cast<uint32_t>(out.prompt.size()));
  DEJA_RETURN_IF_ERROR(ResolveStopping(request.stopping(), limits, &out));
  const v1::ResponseOptions& r = request.response();
  DEJA_RETURN_IF_ERROR(rules::CheckTopN(r.top_n_tokens(), "response.top_n_tokens"));
  out.top_n = r.top_n_tokens();
  out.logprobs = r.logprobs() || out.top_n > 0;
  out.return_tokens = r.return_tokens() || out.logprobs;
  DEJA_RETURN_IF_ERROR(ResolveCache(request.cache(), limits, out.prompt.size(),
                                    out.prompt.size() + out.max_new_tokens,
                                    out.config.mutable_cache()));
  DEJA_RETURN_IF_ERROR(ResolveSparsity(request.sparsity(), limits, &out.config));
  switch (request.prefix_cache().mode()) {
    case v1::PrefixCache::MODE_UNSPECIFIED:
      out.prefix_cache = limits.prefix_cache_default;
      break;
    case v1::PrefixCache::MODE_ON:
      out.prefix_cache = true;
      break;
    case v1::PrefixCache::MODE_OFF:
      out.prefix_cache = false;
      break;
    default:
      return Invalid("prefix_cache.mode",
                     "unknown mode " + std::to_string(request.prefix_cache().mode()));
  }
  constexpr size_t kMaxSaltBytes = 256;
  if (request.has_cache_salt() && request.cache_salt().size() > kMaxSaltBytes) {
    return Invalid("cache_salt", "must be at most " + std::to_string(kMaxSaltBytes) +
                                     " bytes, got " +
                                     std::to_string(request.cache_salt().size()));
  }
  if (out.prefix_cache && limits.prefix_cache_salt_required && !request.has_cache_salt()) {
    return Invalid("cache_salt",
                   "this server requires one for requests that use the prefix cache (or "
                   "prefix_cache.mode MODE_OFF)");
  }
  out.prefix_key = PrefixCacheKey(out.config, request.has_cache_salt()
                                                  ? std::optional<std::string>(request.cache_salt())
                                                  : std::nullopt);
  out.config.set_top_n(out.top_n);
  out.config.set_prompt_tokens(static_cast<uint32_t>(out.prompt.size()));
  out.config.set_max_new_tokens(static_cast<uint32_t>(out.max_new_tokens));
  return out;
}

}  // namespace deja::coordinator
