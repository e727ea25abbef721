#include "worker/rules/request_rules.h"

#include <cmath>
#include <cstdio>

namespace deja::rules {

namespace kv = worker::kv;

namespace {

constexpr auto& Invalid = InvalidField;
constexpr auto& Num = FormatNumber;

// The kind as the API spells it (KIND_H2O), as CachePolicyKindsWith lists kinds.
std::string KindName(const kv::CachePolicyRow& row) { return v1::CachePolicy::Kind_Name(row.api); }

}  // namespace

Status InvalidField(const std::string& field, const std::string& what) {
  return InvalidArgument(field + " " + what);
}

std::string FormatNumber(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

Status CheckTemperature(float temperature, const std::string& field) {
  if (temperature >= 0.f && std::isfinite(temperature)) return Status::Ok();
  return Invalid(field, "must be a finite number >= 0, got " + Num(temperature));
}

Status CheckTopK(int32_t top_k, const std::string& field) {
  if (top_k >= 0) return Status::Ok();
  return Invalid(field, "must be >= 0, got " + std::to_string(top_k));
}

Status CheckTopP(float top_p, const std::string& field) {
  if (top_p > 0.f && top_p <= 1.f) return Status::Ok();
  return Invalid(field, "must be in (0, 1], got " + Num(top_p));
}

Status CheckRepetitionPenalty(float penalty, const std::string& field) {
  if (penalty > 0.f && std::isfinite(penalty)) return Status::Ok();
  return Invalid(field, "must be a finite number > 0, got " + Num(penalty));
}

Status CheckTokenPenalty(float penalty, const std::string& field) {
  if (std::isfinite(penalty) && penalty >= -2.f && penalty <= 2.f) return Status::Ok();
  return Invalid(field, "must be in [-2, 2], got " + Num(penalty));
}

Status CheckLogitBias(int32_t id, float bias, int32_t vocab, const std::string& field) {
  if (id < 0 || id >= vocab) {
    return Invalid(field, "has token id " + std::to_string(id) + ", outside [0, " +
                              std::to_string(vocab) + ")");
  }
  if (std::isfinite(bias) && bias >= -100.f && bias <= 100.f) return Status::Ok();
  return Invalid(field, "for token id " + std::to_string(id) + " must be in [-100, 100], got " +
                            Num(bias));
}

Status CheckLogitBiasCount(size_t count, const std::string& field) {
  if (count <= static_cast<size_t>(kMaxLogitBias)) return Status::Ok();
  return Invalid(field, "has " + std::to_string(count) + " entries, at most " +
                            std::to_string(kMaxLogitBias) + " are allowed");
}

Status CheckTopN(int64_t top_n, const std::string& field) {
  if (top_n >= 0 && top_n <= kMaxTopNTokens) return Status::Ok();
  return Invalid(field, "must be in [0, " + std::to_string(kMaxTopNTokens) + "], got " +
                            std::to_string(top_n));
}

Status CheckScoreDecayRange(float decay, const std::string& field) {
  if (decay > 0.f && decay <= 1.f) return Status::Ok();
  return Invalid(field, "must be in (0, 1], got " + Num(decay));
}

Status CheckScoreDecayKind(const kv::CachePolicyRow& asked, const std::string& field) {
  if (asked.decays) return Status::Ok();
  return Invalid(field, "applies to " + kv::CachePolicyKindsWith(&kv::CachePolicyRow::decays) +
                            " only, not " + KindName(asked));
}

Status CheckRetainingHeads(const kv::CachePolicyRow& row, bool available,
                           const std::string& field) {
  if (!row.retaining_heads || available) return Status::Ok();
  return FailedPrecondition(field + ": " + KindName(row) +
                            " needs retaining heads and this server's workers have none (start "
                            "it with --retaining-heads)");
}

Status CheckPrefixRead(const kv::CachePolicyRow& row, const std::string& field) {
  if (row.reads_prefix_cache) return Status::Ok();
  return Invalid(field, "cannot be read by a " + KindName(row) + " cache: only " +
                            kv::CachePolicyKindsWith(&kv::CachePolicyRow::reads_prefix_cache) +
                            " caches start from cached blocks (H2O's scores need every prompt "
                            "query, LOCRET never holds a whole prompt)");
}

Status CheckPrefixImportant(const kv::CachePolicyRow& row, const std::string& field) {
  if (!row.bounded) return Status::Ok();
  return Invalid(field, "is for an unbounded cache; " + KindName(row) +
                            " evicts, so only KIND_FULL reads a prefix's important tokens");
}

Status CheckPositions(int64_t prompt_tokens, int64_t max_new_tokens, int64_t max_positions,
                      const std::string& field) {
  const int64_t total = prompt_tokens + max_new_tokens;
  if (total <= max_positions) return Status::Ok();
  return OutOfRange(field + ": prompt_tokens + max_new_tokens = " + std::to_string(total) +
                    " exceeds the model's position limit of " + std::to_string(max_positions));
}

}  // namespace deja::rules
