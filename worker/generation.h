// Single-process generation and perplexity on one OptModel: what `deja generate` and
// `deja ppl` run, and what tests compare with the HF goldens. The service's scheduler drives
// the same model through OptModel::Forward with many sequences per step.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/opt_model.h"
#include "worker/sampler.h"

namespace deja::worker {

struct GenerationOptions {
  SamplingParams sampling;
  int32_t max_new_tokens = 32;
  bool stop_at_eos = true;
  int32_t prefill_chunk = 512;  // prompt tokens per forward step
};

struct GenerationResult {
  std::vector<TokenChoice> tokens;
  std::string finish_reason;  // "length" or "eos"
  double prefill_seconds = 0, decode_seconds = 0;
};

// Runs prompt (which already holds the BOS) then up to max_new_tokens decode steps. `on_token`
// (optional) sees each token as it is chosen.
StatusOr<GenerationResult> Generate(OptModel& model, const std::vector<int32_t>& prompt,
                                    const GenerationOptions& options,
                                    const std::function<void(const TokenChoice&)>& on_token = {});

struct PerplexityResult {
  double perplexity = 0;
  double total_nll = 0;
  int64_t tokens = 0;   // scored tokens
  int64_t windows = 0;
};

// The fixture's procedure: `tokens` (no BOS) split into consecutive chunks of context - 1
// tokens; each window is [bos] + chunk; every token after the BOS is scored; the last partial
// chunk counts. perplexity = exp(total NLL / scored tokens).
StatusOr<PerplexityResult> Perplexity(OptModel& model, const std::vector<int32_t>& tokens,
                                      int32_t context);

}  // namespace deja::worker
