// Single-process generation and perplexity on one OptModel: what `deja generate` and
// `deja-lab ppl` run, and what tests compare with the HF goldens. The service's scheduler drives
// the same model through OptModel::Forward with many sequences per step.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/model/model.h"
#include "worker/sampling/sampler.h"

namespace deja::worker::model {

struct GenerationOptions {
  sampling::SamplingParams sampling;
  int32_t max_new_tokens = 32;
  bool stop_at_eos = true;
  int32_t prefill_chunk = 512;  // prompt tokens per forward step
  kv::CachePolicyConfig cache;  // KV eviction policy (ratios resolve against the prompt)
  bool sparse = false;          // Deja Vu sparsity (the model must have it enabled)
};

struct GenerationResult {
  std::vector<sampling::TokenChoice> tokens;
  std::string finish_reason;  // "length" or "eos"
  double prefill_seconds = 0, decode_seconds = 0;
  size_t kv_bytes = 0;  // the sequence's KV allocation while decoding
  int64_t evictions = 0;
};

// Runs prompt (which already holds the BOS) then up to max_new_tokens decode steps. `on_token`
// (optional) sees each token as it is chosen.
StatusOr<GenerationResult> Generate(
    Model& model, const std::vector<int32_t>& prompt, const GenerationOptions& options,
    const std::function<void(const sampling::TokenChoice&)>& on_token = {});

struct PerplexityResult {
  double perplexity = 0;
  double total_nll = 0;
  int64_t tokens = 0;  // scored tokens
  int64_t windows = 0;
};

// The fixture's procedure: `tokens` (no BOS) split into consecutive chunks of context - 1
// tokens; each window is [bos] + chunk; every token after the BOS is scored; the last partial
// chunk counts. perplexity = exp(total NLL / scored tokens).
// sparse: every token of the window computed under Deja Vu sparsity (each token with its own
// predicted heads and neurons, exactly as a batch-1 decode of it would).
StatusOr<PerplexityResult> Perplexity(Model& model, const std::vector<int32_t>& tokens,
                                      int32_t context, bool sparse = false);

// Each window evaluated the way serving runs it: the first `prompt_tokens` tokens of the window
// (BOS included) as the prefill, then the rest token by token under the cache policy, scoring
// each next token. Only the tokens predicted after the prompt count (the prompt's predictions
// do not depend on the policy). Windows shorter than prompt_tokens + 1 are skipped.
// The prefill is one step, except under locret, which prefills in chunks of `locret_chunk`
// tokens and evicts after each, so its cache never holds more than budget + chunk tokens.
struct PolicyPerplexityResult {
  PerplexityResult result;
  size_t kv_bytes_per_sequence = 0;  // steady-state allocation while decoding
  // The most tokens one head held during the prefill (before each step's eviction), and their
  // bytes across layers and heads (KvGeometry::SlotBytes per token).
  int32_t peak_prompt_tokens = 0;
  size_t peak_prompt_kv_bytes = 0;
  int64_t evictions = 0;
};
// before_window, when set, runs before each window with the window's tokens (`deja-lab ppl
// --locret-oracle` scores them there).
StatusOr<PolicyPerplexityResult> PolicyPerplexity(
    Model& model, const std::vector<int32_t>& tokens, int32_t context, int32_t prompt_tokens,
    const kv::CachePolicyConfig& cache, bool sparse = false, int32_t locret_chunk = 64,
    const std::function<Status(const std::vector<int32_t>&)>& before_window = nullptr);

}  // namespace deja::worker::model
