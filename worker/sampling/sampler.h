// Token selection from one row of logits: greedy (the default), or sampling with temperature,
// top-k and top-p (nucleus), with optional repetition, presence and frequency penalties and a
// logit bias, from a seeded per-sequence
// RNG. Reports the chosen token's log-probability and the top-n alternatives under the model's
// own distribution (log_softmax of the raw logits), as vLLM and TGI do.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "common/status.h"

namespace deja::worker::sampling {

struct SamplingParams {
  bool do_sample = false;
  float temperature = 1.0f;         // > 0 when sampling
  int32_t top_k = 0;                // 0 = off
  float top_p = 1.0f;               // (0, 1]; 1 = off
  float repetition_penalty = 1.0f;  // > 0; 1 = off (CTRL-style, over prompt and output)
  uint64_t seed = 0;
  int32_t top_n = 0;  // alternatives to report, 0..20
  // OpenAI-style, over the generated tokens: history from output_start on. 0 = off.
  float presence_penalty = 0.f;
  float frequency_penalty = 0.f;
  size_t output_start = 0;
  std::vector<std::pair<int32_t, float>> logit_bias;  // (id, bias) added to the logits

  // Whether the logits are changed before the choice (a penalty or a bias).
  bool AdjustsLogits() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.f || frequency_penalty != 0.f ||
           !logit_bias.empty();
  }

  // InvalidArgument naming the field.
  Status Validate() const;
};

struct TokenChoice {
  int32_t id = 0;
  float logprob = 0.f;
  std::vector<std::pair<int32_t, float>> top;  // (id, logprob), best first
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

  // `logits` has `vocab` entries; `history` holds the prompt and generated ids (for the
  // penalties). Uses scratch buffers owned by the sampler (no per-call allocation
  // after the first).
  //
  // Edge cases, all defined: a temperature so small that (logit - max) / T underflows samples
  // among the row's maxima (greedy, ties shared); a huge one samples near uniformly; top_p
  // near 0 keeps the single most likely token; top_k at or beyond the vocabulary is no limit;
  // -inf entries (masked tokens) are never chosen while any finite entry remains. A row with
  // no finite maximum or a NaN (every entry masked, +inf, NaN: the model's numerics failed) is
  // INTERNAL, naming the value, and no token is chosen.
  StatusOr<TokenChoice> Choose(const float* logits, int32_t vocab,
                               const std::vector<int32_t>& history);

  // Whether the `k` most likely tokens of a row decide this sampler's choice and report: greedy
  // or top-k sampling with top_k <= k, no penalty or bias, top_n <= k.
  bool CanChooseFromTop(int32_t k) const;
  // The same choice as Choose from a row's k best (log-prob, id) pairs under log_softmax of the
  // row, best first, ties to the lower id (a device's top candidates, model::StepResult); the
  // same RNG draws. INTERNAL when the best log-prob is not finite (the row held a NaN or no
  // finite logit).
  StatusOr<TokenChoice> ChooseFromTop(const float* logprobs, const int32_t* ids, int32_t k);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<float> work_;
  std::vector<double> probs_;
  std::vector<int32_t> order_;
  std::vector<int32_t> seen_;  // the generated ids, sorted (presence and frequency penalties)
};

}  // namespace deja::worker::sampling
