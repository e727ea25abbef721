// Request validation: every field of a deja.v1.GenerateRequest checked against the served
// model's limits, the prompt tokenized, and every server default resolved, so the scheduler and
// the workers only ever see complete, valid settings. Errors are INVALID_ARGUMENT (or
// FAILED_PRECONDITION for sparsity without predictors) and name the field by its path, e.g.
// "sampling.top_p must be in (0, 1], got 1.5".
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/tokenizer.h"
#include "deja/v1/text_generation.pb.h"
#include "deja/v1/worker.pb.h"
#include "worker/rules/request_rules.h"

namespace deja::coordinator {

inline constexpr int kMaxStopSequences = 4;
inline constexpr size_t kMaxStopSequenceBytes = 256;
inline constexpr int kMaxStopTokenIds = 16;
inline constexpr uint32_t kMaxTopNTokens = rules::kMaxTopNTokens;
inline constexpr size_t kMaxRequestIdBytes = 128;

// What the served model and the server's configuration allow.
struct ModelLimits {
  int32_t vocab_size = 0;
  // Prompt plus generated tokens.
  int32_t max_positions = 0;
  int32_t bos_id = 2;
  int32_t eos_id = 2;
  int32_t default_max_new_tokens = 256;
  bool sparsity_available = false;
  // What Sparsity.MODE_UNSPECIFIED means when sparsity is available (the server default).
  bool sparsity_default = false;
  std::vector<std::string> sparsity_schedules;  // the first is the default
  // Every rank holds Locret retaining heads (CachePolicy.KIND_LOCRET is served), and the most
  // prompt tokens one step carries for a locret sequence (its cache holds budget + this).
  bool locret_available = false;
  int32_t locret_chunk = 64;
  // What PrefixCache.MODE_UNSPECIFIED means (`deja serve --prefix-cache`); whether the workers
  // keep a prefix cache, in blocks of how many tokens (ModelInfo).
  bool prefix_cache_default = true;
  bool prefix_cache_available = false;
  uint32_t prefix_cache_block_tokens = 0;
  // `deja serve --prefix-cache-salt-required`: a request that uses the prefix cache without a
  // cache_salt is INVALID_ARGUMENT.
  bool prefix_cache_salt_required = false;
  // What CachePolicy.KIND_UNSPECIFIED means (UNSPECIFIED here: full). Its budget fields also
  // fill in those a request of the same kind leaves unset.
  v1::CachePolicy default_cache;
};

// A request with every default resolved.
// The API a request arrived through (the metrics' `protocol` label).
enum class Protocol { kGrpc, kOpenAi, kKServe };
inline const char* ProtocolLabel(Protocol p) {
  return p == Protocol::kGrpc ? "grpc" : p == Protocol::kOpenAi ? "openai" : "kserve";
}

struct ResolvedRequest {
  // The client's id; empty when the server is to assign one.
  std::string request_id;
  Protocol protocol = Protocol::kGrpc;
  // Prompt ids, BOS included for text prompts.
  std::vector<int32_t> prompt;
  bool text_prompt = false;
  // Sampling, cache policy, sparsity, top-n, prompt length and max_new_tokens for the workers.
  v1::SequenceConfig config;
  int32_t max_new_tokens = 0;
  std::vector<std::string> stop_sequences;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  // 0: no limit.
  uint32_t time_limit_ms = 0;
  bool logprobs = false;
  bool return_tokens = false;
  uint32_t top_n = 0;
  // Read and fill the prefix cache (PrefixCache.mode resolved against the server default).
  bool prefix_cache = false;
  // The prefix cache's tree for this request: how its prompt's keys and values are computed
  // (dense, or sparse with which schedule) and its cache_salt. Blocks are shared only within
  // one key (PrefixIndex).
  std::string prefix_key;

  // Cache positions each worker reserves for the sequence when it starts, the unit of KV
  // admission: prompt + max_new_tokens under the full policy; a bounded policy (window, H2O)
  // holds its budget plus the prompt while prefilling (then shrinks to budget + 1), locret its
  // budget plus one chunk from the first token; never more than the full cache.
  int64_t ReservedPositions() const {
    const int64_t full = static_cast<int64_t>(prompt.size()) + max_new_tokens;
    if (!BoundedCache()) return full;
    const int64_t budget =
        static_cast<int64_t>(config.cache().heavy_tokens()) + config.cache().recent_tokens();
    const int64_t chunk =
        config.cache().chunk_tokens() > 0
            ? std::min<int64_t>(config.cache().chunk_tokens(), static_cast<int64_t>(prompt.size()))
            : static_cast<int64_t>(prompt.size());
    return std::min(full, budget + std::max<int64_t>(1, chunk));
  }
  // What the workers keep once the prompt is in: a bounded policy's cache shrinks to budget + 1
  // slots per head (worker/service/step_engine.cc ShrinkAfterPrefill); full keeps its reservation.
  int64_t PositionsAfterPrefill() const {
    const int64_t reserved = ReservedPositions();
    if (!BoundedCache()) return reserved;
    const int64_t budget =
        static_cast<int64_t>(config.cache().heavy_tokens()) + config.cache().recent_tokens();
    return std::min(reserved, budget + 1);
  }
  // Whether the cache policy evicts (its row in worker/kv/policy_table.h is bounded).
  bool BoundedCache() const;
};

// The server's default cache policy (`deja serve --kv-policy ...`): a known kind and budget
// fields that make sense for it; INVALID_ARGUMENT naming the field otherwise.
Status ValidateDefaultCachePolicy(const v1::CachePolicy& policy);

// INVALID_ARGUMENT unless `id` is 1 to 128 bytes of [A-Za-z0-9._:-].
Status ValidateRequestId(const std::string& id);

// Validates `request`, tokenizes a text prompt (BOS prepended) and resolves defaults.
// `random_seed` is used when sampling.seed is unset.
// ResolvedRequest::prefix_key of a request with this (resolved) config and cache_salt.
std::string PrefixCacheKey(const v1::SequenceConfig& config,
                           const std::optional<std::string>& salt);

StatusOr<ResolvedRequest> ResolveRequest(const v1::GenerateRequest& request,
                                         const ModelLimits& limits, const Tokenizer& tokenizer,
                                         uint64_t random_seed);

}  // namespace deja::coordinator
