// A plain, slow reference of the whole H2O decode loop for OPT, and of Locret's: dense parts
// through the reference backend's ops, attention, score accumulation (h2o) or retaining-head
// scores (locret, predictors::RetainingScore when a token is cached) and eviction as obvious
// loops over a per-head list of cached entries. The fast path (OptModel + SequenceKv + CPU
// kernels) must give the same tokens and log-probs.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/opt_config.h"
#include "common/safetensors.h"
#include "kernels/backend.h"
#include "predictors/retaining_heads.h"
#include "worker/model/opt_weights.h"

namespace deja::worker {

// A seeded prompt of n ids: the BOS (2), then uniform random ids in [4, 8191] (opt-mini's
// vocabulary without its special tokens).
std::vector<int32_t> RandomPrompt(int n, uint32_t seed);

class ReferenceH2O {
 public:
  // heavy/recent per head; heavy = recent = -1 disables eviction (full cache).
  // With `retain` (every head), Locret: heavy = the tokens kept by score, recent = the
  // stabilisers, scores from the retaining heads instead of accumulated attention.
  static StatusOr<std::unique_ptr<ReferenceH2O>> Load(
      const std::string& dir, int32_t heavy, int32_t recent,
      const predictors::RetainingHeads* retain = nullptr);
  // h2o's decayed scores: after each step's attention, every cached score is multiplied by it.
  void set_decay(double decay) { decay_ = decay; }
  // Runs the prompt as one prefill (in steps of `chunk` tokens when > 0), then `steps` greedy
  // decode steps; returns the greedy ids and, for each, its log-probability. `max_held`, when
  // given, gets the most entries any head held during the run (before each step's eviction).
  Status Greedy(const std::vector<int32_t>& prompt, int32_t steps, std::vector<int32_t>* ids,
                std::vector<float>* logprobs, int32_t chunk = 0, int32_t* max_held = nullptr);

 private:
  struct Entry {
    int32_t pos;
    std::vector<float> k, v;
    double score = 0;
  };
  ReferenceH2O() = default;
  // Runs tokens at positions [start, start + n) and returns the last row's logits.
  Status Step(const std::vector<int32_t>& tokens, int32_t start, std::vector<float>* logits);
  void Evict(std::vector<Entry>& head, int32_t length);

  OptConfig config_;
  std::unique_ptr<Checkpoint> ckpt_;
  model::OptWeights w_;
  std::unique_ptr<kernels::Backend> backend_;
  int32_t heavy_ = -1, recent_ = -1;
  double decay_ = 1.0;
  const predictors::RetainingHeads* retain_ = nullptr;
  int32_t max_held_ = 0;
  std::vector<std::vector<Entry>> cache_;  // [layer * heads + head]
};

}  // namespace deja::worker
