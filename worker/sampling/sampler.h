// Token selection from one row of logits: greedy (the default), or sampling with temperature,
// top-k and top-p (nucleus), with an optional repetition penalty, from a seeded per-sequence
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
  // repetition penalty). Uses scratch buffers owned by the sampler (no per-call allocation
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
  // or top-k sampling with top_k <= k, no repetition penalty, top_n <= k.
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
};

}  // namespace deja::worker::sampling
