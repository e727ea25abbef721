// The rules a sequence's request obeys, written once: the coordinator checks them on the public
// request (coordinator/validation.cc) and the worker again on the sequence it is sent
// (worker/service/step_engine.cc, worker/sampling/), so a worker refuses a bad sequence alone,
// with the same words. Each check returns INVALID_ARGUMENT (FAILED_PRECONDITION where the server
// lacks what the request needs) whose message starts with the field it names: `field` is the
// field's path as the caller's wire spells it ("sampling.top_p", "config.sampling.top_p").
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "worker/kv/policy_table.h"

namespace deja::rules {

// "<field> <what>" as INVALID_ARGUMENT, and a number as the messages print it (%g).
Status InvalidField(const std::string& field, const std::string& what);
std::string FormatNumber(double v);

// The most top tokens a response may ask for per position.
inline constexpr uint32_t kMaxTopNTokens = 5;

// Sampling. Temperature 0 is greedy; top_k 0 keeps every token.
Status CheckTemperature(float temperature, const std::string& field);
Status CheckTopK(int32_t top_k, const std::string& field);
Status CheckTopP(float top_p, const std::string& field);
Status CheckRepetitionPenalty(float penalty, const std::string& field);
Status CheckTopN(int64_t top_n, const std::string& field);
// OpenAI's presence and frequency penalties: finite, in [-2, 2].
Status CheckTokenPenalty(float penalty, const std::string& field);
// Logit bias: at most kMaxLogitBias ids, each in [0, vocab), each bias finite in [-100, 100].
inline constexpr int kMaxLogitBias = 1024;
Status CheckLogitBias(int32_t id, float bias, int32_t vocab, const std::string& field);
Status CheckLogitBiasCount(size_t count, const std::string& field);

// A score decay is in (0, 1], and set for a kind whose scores decay (H2O) only. `asked`: the
// kind the request named (a budget that reaches the length later runs it as FULL, which is no
// reason to refuse the decay).
Status CheckScoreDecayRange(float decay, const std::string& field);
Status CheckScoreDecayKind(const worker::kv::CachePolicyRow& asked, const std::string& field);

// A kind that needs retaining heads (LOCRET) on a server that has them.
Status CheckRetainingHeads(const worker::kv::CachePolicyRow& row, bool available,
                           const std::string& field);

// Reading cached prefix blocks: a kind that can start from them, and a prefix's important tokens
// for an unbounded (FULL) cache only.
Status CheckPrefixRead(const worker::kv::CachePolicyRow& row, const std::string& field);
Status CheckPrefixImportant(const worker::kv::CachePolicyRow& row, const std::string& field);

// Prompt plus new tokens within the model's positions.
Status CheckPositions(int64_t prompt_tokens, int64_t max_new_tokens, int64_t max_positions,
                      const std::string& field);

}  // namespace deja::rules
