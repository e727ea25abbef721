// StepEngine: one rank's side of a Worker.Step message, without gRPC. Holds the live sequences
// (KV cache, token history, rank 0's sampler) keyed by seq_id, checks a step completely before
// touching any state, runs the batch through Model::Forward in lockstep with the other ranks, and
// on rank 0 samples and fills the per-sequence results. Also accounts KV memory against a fixed
// budget: a sequence reserves its cache when it starts (prompt + max_new_tokens positions under
// the full policy; budget + prompt under a bounded one, shrinking to budget + 1 after its
// prefill) and gives it back when released.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/status.h"
#include "deja/v1/worker.pb.h"
#include "worker/kv/eviction_policy.h"
#include "worker/kv/kv_cache.h"
#include "worker/model/model.h"
#include "worker/prefix/prefix_store.h"
#include "worker/sampling/sampler.h"

namespace deja::worker::service {

class StepEngine {
 public:
  // `model` outlives the engine. `kv_budget_bytes` is this rank's KV memory budget. `prefix`:
  // the rank's prefix cache (its blocks live in the model's KV pool); null: none, and steps
  // with prefix operations or prefix blocks are refused by name.
  static StatusOr<std::unique_ptr<StepEngine>> Create(
      model::Model* model, uint64_t kv_budget_bytes,
      std::unique_ptr<prefix::PrefixStore> prefix = nullptr);

  // Runs one dummy forward step (every rank must call it, as it runs collectives).
  Status WarmUp();

  // Answers `req` in `resp` (step id, rank, results on rank 0, timings, KV usage, and the
  // step's sparsity after a forward pass). A sequence with config.sparse runs Deja Vu on every
  // step; it needs OptModel::EnableSparsity (FAILED_PRECONDITION otherwise). A bad sequence
  // (unknown, wrong position, token out of range, capacity or budget exceeded, unsupported
  // setting, repeated in the step) is refused alone: its SequenceResult carries the error, it is
  // left unchanged, and the step's other sequences run as if it were absent (every rank refuses
  // the same ones, since each checks the same request against the same state).
  // Returns non-OK only when the rank's state is lost (a collective failed); resp then carries
  // the error with `fatal` set and the caller must exit.
  Status Run(const deja::v1::StepRequest& req, deja::v1::StepResponse* resp);

  // Drops every sequence (the Step stream closed).
  void ReleaseAll();

  // Safe to call from any thread.
  deja::v1::KvUsage Usage() const;
  uint64_t kv_bytes_per_token() const { return bytes_per_token_; }
  // The prefix cache (null without one); the step thread's, like Run.
  prefix::PrefixStore* prefix_store() { return prefix_.get(); }

 private:
  StepEngine(model::Model* model, uint64_t kv_budget_bytes, uint64_t bytes_per_token,
             std::unique_ptr<prefix::PrefixStore> prefix);

  struct Sequence {
    std::unique_ptr<kv::SequenceKv> kv;
    std::unique_ptr<sampling::Sampler> sampler;  // rank 0
    std::vector<int32_t> history;              // every token fed so far
    uint32_t top_n = 0;
    bool sparse = false;                       // Deja Vu on every step of the sequence
    int32_t prompt_tokens = 0;
    int32_t max_tokens = 0;                    // prompt_tokens + max_new_tokens
  };
  // A checked SequenceWork: the existing sequence, or the settings of a new one; or why the
  // sequence is refused (`refused` not OK, `seq` null).
  struct Planned {
    const deja::v1::SequenceWork* work = nullptr;
    Status refused;
    Sequence* seq = nullptr;
    std::unique_ptr<Sequence> fresh;  // new sequence, committed after a successful forward
    int32_t capacity = 0;
    kv::CachePolicyConfig cache;
  };

  // One entry per SequenceWork, in request order.
  std::vector<Planned> Plan(const deja::v1::StepRequest& req);
  Status PlanOne(const deja::v1::SequenceWork& w, const std::unordered_set<uint64_t>& earlier,
                 Planned* p, uint64_t* new_bytes);
  // A bounded-policy sequence whose prompt is complete keeps only budget + 1 slots per head.
  void ShrinkAfterPrefill(Sequence* seq);
  Status PlanNew(const deja::v1::SequenceWork& w, Planned* p, uint64_t* new_bytes);
  // Paged: RESOURCE_EXHAUSTED unless the pool, less *new_bytes taken by earlier sequences of
  // the step, has the blocks n more tokens of `seq` reach; adds them to *new_bytes.
  Status CheckPoolRoom(uint64_t id, int32_t n, Sequence* seq, uint64_t* new_bytes);
  // Fills results[i] for every sequence planned to run; `run` holds their indices in `plan`, in
  // the order of the forward batch.
  void Sample(const std::vector<Planned>& plan, const std::vector<size_t>& run,
              std::vector<deja::v1::SequenceResult>* results);
  void Release(uint64_t seq_id);
  void PublishUsage();
  // Runs one prefix operation; a failure forgets the block and lists it in prefix_failed.
  void RunPrefixOp(const deja::v1::PrefixOp& op, prefix::PrefixIo* io,
                   deja::v1::StepResponse* resp);
  Status PrefixOp(const deja::v1::PrefixOp& op, prefix::PrefixIo* io);
  // Starts a new sequence's cache from its config.prefix_blocks.
  Status SeedPrefix(const deja::v1::SequenceWork& w, Sequence* seq);
  // Adds what the step's important-token loads read (and lost) to resp's prefix_io.
  void ReportLazyLoads(deja::v1::StepResponse* resp);
  model::Model* model_;
  const uint64_t budget_;
  const uint64_t bytes_per_token_;
  // The caches draw from the model's KV block pool: no reservation for a sequence's maximum,
  // each step checks the pool has the blocks its tokens reach.
  const bool paged_;
  int32_t vocab_ = 0;
  int rank_ = 0;
  std::unordered_map<uint64_t, std::unique_ptr<Sequence>> seqs_;
  uint64_t reserved_bytes_ = 0;
  uint64_t evicted_released_ = 0;  // evictions of sequences already released
  model::StepResult step_;
  std::vector<float> logprob_row_;

  mutable std::mutex usage_mu_;
  deja::v1::KvUsage usage_;

  std::unique_ptr<prefix::PrefixStore> prefix_;
  int64_t reordered_reported_ = 0;  // prefix_->reordered_files() at the last report
};

}  // namespace deja::worker::service
