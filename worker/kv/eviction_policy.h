// KV-cache eviction policies (docs/architecture.md#kv-cache). A policy only plans: given one head's
// slot table (slot -> position, accumulated attention score) it names the slots to evict;
// SequenceKv applies the plan. Policies: `full` (never evicts), `window` (keeps the most recent
// tokens), `h2o` (keeps the most recent tokens plus the highest-scoring "heavy hitters"),
// `locret` (keeps the most recent tokens, the stabilisers, plus the tokens its trained retaining
// heads scored highest when they were written). Their names, proto values and factories are in
// one table, policy_table.h.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace deja::worker::kv {

// One row per kind in policy_table.cc.
enum class CachePolicyKind { kFull, kWindow, kH2O, kLocret };

// How a request asks for its cache policy. Budgets are per head and fixed when the sequence
// starts: absolute token counts when given (>= 0), otherwise ratios of the prompt length.
struct CachePolicyConfig {
  CachePolicyKind kind = CachePolicyKind::kFull;
  float heavy_ratio = 0.1f;
  float recent_ratio = 0.1f;
  int32_t heavy_tokens = -1;
  int32_t recent_tokens = -1;
  // h2o only, an alternative measured apart from the reference
  // (docs/architecture.md#eviction-policies): rank heavy hitters by accumulated score divided by
  // the number of queries that have seen the token (its mean attention) instead of by the sum,
  // which favours early tokens. Off in serving.
  bool h2o_mean_score = false;
  // h2o only: each step multiplies every accumulated score by this factor before the step's
  // probabilities add (1: the reference's plain sum), so a token ranks by its recent attention
  // (served: CachePolicy.score_decay, --h2o-decay); and, an alternative of `deja-lab ppl` on the CPU
  // only, the first `sink_tokens` positions are never evicted (attention sinks).
  float h2o_decay = 1.0f;
  int32_t sink_tokens = 0;

  // InvalidArgument naming the field.
  Status Validate() const;
};

// One head's cache as the policy sees it.
struct HeadSlots {
  std::span<const int32_t> slot_pos;  // -1 = free
  std::span<const float> score;       // accumulated attention (h2o); may be empty
  int32_t occupied = 0;               // slots with slot_pos >= 0
  int32_t length = 0;                 // tokens the sequence has seen (next position)
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual CachePolicyKind kind() const = 0;
  // Slots a head keeps between steps; 0 = unbounded (full).
  virtual int32_t budget() const = 0;
  // Whether the cache keeps a score per slot for this policy.
  virtual bool needs_scores() const = 0;
  // Whether attention adds its probabilities into those scores (h2o); locret's scores are set
  // once, when the token is written, by the retaining heads.
  virtual bool accumulates_scores() const { return needs_scores(); }
  // The most recent tokens a head always keeps (the window; 0 for full).
  virtual int32_t recent() const { return 0; }
  // h2o's mean-score ranking (CachePolicyConfig::h2o_mean_score).
  virtual bool mean_score() const { return false; }
  // CachePolicyConfig::h2o_decay and sink_tokens.
  virtual float score_decay() const { return 1.0f; }
  virtual int32_t sinks() const { return 0; }
  // Appends to `evict` the slots to free so that at most budget() remain.
  virtual void Plan(const HeadSlots& head, std::vector<int32_t>* evict) const = 0;
};

// Resolves ratios against `prompt_tokens` (each part at least 1 token when its ratio is > 0)
// and builds the policy through its row of the table.
StatusOr<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(const CachePolicyConfig& config,
                                                             int32_t prompt_tokens);

std::unique_ptr<EvictionPolicy> MakeFullPolicy();
std::unique_ptr<EvictionPolicy> MakeWindowPolicy(int32_t recent);
// mean_score: rank by score / (length - position), see CachePolicyConfig::h2o_mean_score.
std::unique_ptr<EvictionPolicy> MakeH2OPolicy(int32_t heavy, int32_t recent,
                                              bool mean_score = false, float decay = 1.0f,
                                              int32_t sinks = 0);
// Locret: keeps the `stabilisers` most recent tokens and the `scored` others with the highest
// retaining-head scores (docs/architecture.md#locret).
std::unique_ptr<EvictionPolicy> MakeLocretPolicy(int32_t scored, int32_t stabilisers);

}  // namespace deja::worker::kv
