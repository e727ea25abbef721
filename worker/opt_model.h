// The OPT decoder (pre-LN, and the post-LN OPT-350m variant) as one tensor-parallel rank runs
// it: a batch of sequences, each with some new tokens (a prefill chunk or one decode token), in
// one forward pass. The two all-reduces per layer are explicit in Layer().
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/opt_config.h"
#include "common/safetensors.h"
#include "common/status.h"
#include "common/tensor.h"
#include "kernels/backend.h"
#include "worker/communicator.h"
#include "worker/kv_cache.h"
#include "worker/opt_weights.h"

namespace deja::worker {

struct SequenceStep {
  SequenceKv* kv = nullptr;       // the sequence's cache; its length() is the first position
  const int32_t* tokens = nullptr;
  int32_t n = 0;                  // new tokens (>= 1)
  bool all_logits = false;        // logits for every new token, else only for the last one
};

struct StepResult {
  Tensor logits;                  // f32 [rows, vocab] (rank 0 after the vocab gather)
  std::vector<int32_t> row_seq;   // batch index of each logits row
};

class OptModel {
 public:
  // Loads this rank's shard. `comm` may be null for a single process (world 1).
  static StatusOr<std::unique_ptr<OptModel>> Load(const std::string& dir,
                                                   kernels::Backend* backend,
                                                   std::unique_ptr<Communicator> comm = nullptr);

  const OptConfig& config() const { return config_; }
  KvGeometry kv_geometry() const;
  int64_t weight_bytes() const { return weight_bytes_; }
  Communicator& comm() { return *comm_; }

  // Creates an empty cache for a sequence of at most `max_tokens` tokens (full policy).
  StatusOr<std::unique_ptr<SequenceKv>> NewSequence(int32_t max_tokens) const;
  // The same under a cache policy whose ratios resolve against `prompt_tokens`; bounded policies
  // get budget + `max_chunk` slots per head (the largest number of tokens one step appends).
  StatusOr<std::unique_ptr<SequenceKv>> NewSequence(int32_t max_tokens,
                                                    const CachePolicyConfig& policy,
                                                    int32_t prompt_tokens,
                                                    int32_t max_chunk) const;

  // Runs one step. Appends every step's tokens to its cache. Fails (leaving the caches of the
  // batch unspecified) on bad token ids or when a sequence would pass the position limit.
  Status Forward(const std::vector<SequenceStep>& batch, StepResult* result);

 private:
  OptModel() = default;
  Status Layer(int32_t l, const std::vector<SequenceStep>& batch, int64_t rows);
  Status Logits(const std::vector<SequenceStep>& batch, int64_t rows, StepResult* result);
  void EnsureWorkspace(int64_t rows);

  OptConfig config_;
  std::unique_ptr<Checkpoint> ckpt_;
  OptWeights w_;
  kernels::Backend* backend_ = nullptr;
  std::unique_ptr<Communicator> comm_;
  int64_t weight_bytes_ = 0;

  // Workspace, grown to the largest step seen and reused (no per-step allocation).
  int64_t ws_rows_ = 0;
  Tensor h_, a_, q_, k_, v_, ctx_, o_, u_, emb_;
  std::vector<int32_t> ids_, tok_pos_, pos_rows_;
  std::vector<float> gather_;
};

}  // namespace deja::worker
