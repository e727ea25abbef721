// Scheduler: admission and continuous batching, as a plain single-threaded class (the engine
// serialises calls). Each step it plans:
//   1. ends requests that were cancelled or passed their deadline or time limit, and releases
//      their KV on the workers (release_seq_ids of the same step);
//   2. one decode token for every running sequence whose prompt is done;
//   3. prefill chunks, at most max_prefill_tokens prompt tokens in all, for sequences still in
//      their prompt (oldest first), then for waiting requests while the batch has room.
// So long prompts are spread over several steps and never stall running streams.
//
// KV memory is reserved against what the workers report. When they page it (KvCapacity::
// block_tokens > 0, a block pool on every rank), a full-policy sequence reserves the blocks its
// positions reach: its prompt at admission, then one more block each time decoding crosses a
// block boundary. When a block is wanted and none is free, the newest full-policy sequence is
// preempted: its KV is released and it waits at the head of the queue to recompute its prompt
// and the tokens it generated (the client sees the stream continue). New requests are admitted
// only while one block per reserved sequence stays free, so that running ones can grow.
// Without paging, and for bounded policies always, a request reserves its worst case (prompt +
// max_new_tokens positions, or a bounded policy's budget plus its prompt, as every worker
// reserves at a sequence's first step and frees at its release); a bounded policy's reservation
// shrinks to budget + 1 positions once its prompt is in, as the workers' caches do.
// Admission refuses at once (RESOURCE_EXHAUSTED) when the queue is full, when the request could
// never fit, and when the memory is taken, unless wait_for_kv queues it until it is free.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/status.h"
#include "coordinator/prefix_index.h"
#include "coordinator/request.h"
#include "deja/v1/worker.pb.h"

namespace deja::coordinator {

struct SchedulerOptions {
  // Sequences in the batch (prefilling or decoding).
  int32_t max_batch_sequences = 32;
  // Prompt tokens per step over all prefill chunks.
  int32_t max_prefill_tokens = 512;
  // Admitted requests waiting for a place in the batch.
  int32_t max_waiting = 64;
  // A request that fits the workers' KV memory but finds it reserved: false refuses it at once
  // with RESOURCE_EXHAUSTED (the client retries or goes elsewhere); true queues it (within
  // max_waiting) until enough is free, first come first served, as vLLM and TGI do.
  // `deja serve --wait-for-kv`.
  bool wait_for_kv = false;
  // Prefix cache (docs/architecture.md#prefix-cache), used when every worker keeps one
  // (KvCapacity::prefix_cache): per-rank budgets of its tiers in bytes, whole blocks of
  // block_tokens positions. The memory tier holds at most prefix_memory_bytes of the KV memory
  // that running sequences leave free: its blocks move down a tier when a sequence needs room.
  // The disk tier needs workers with one (KvCapacity::prefix_disk). 0 turns a tier off.
  uint64_t prefix_memory_bytes = 0;
  uint64_t prefix_host_bytes = 0;
  uint64_t prefix_disk_bytes = 0;
  // Important-token loading (IMPRESS): a FULL-cache request whose cached prefix is partly on
  // host or disk reads it during its first step, each layer only the tokens the workers' probe
  // heads choose (SequenceConfig.prefix_important), instead of loading every block into the
  // memory tier first. Approximate; off: exact reuse.
  bool prefix_important = false;
  // Sequence ids for preempted sequences (each continues under a new id, as its old one is
  // released on the workers); unset: the scheduler counts from 2^62.
  std::function<uint64_t()> next_seq_id;
};

// KV memory of the worker group: the smallest rank budget and the largest per-position cost.
// bytes_per_token == 0 means unknown, and admission then checks only the queue.
struct KvCapacity {
  uint64_t total_bytes = 0;
  uint64_t bytes_per_token = 0;
  // The workers page their KV in blocks of this many positions (0: a sequence reserves its
  // maximum when it starts).
  uint32_t block_tokens = 0;
  // Every worker keeps a prefix cache, and with a disk tier.
  bool prefix_cache = false;
  bool prefix_disk = false;
};

// What the prefix cache did, for the metrics (counts since the scheduler started).
struct PrefixCacheStats {
  // Requests that started from cached blocks, by the slowest tier one of them came from
  // (memory, host, disk), and those that looked and found none.
  uint64_t hits[3] = {0, 0, 0};
  uint64_t misses = 0;
  uint64_t hit_tokens = 0;
  // Bytes the workers read into memory, summed over ranks: from host, from disk.
  uint64_t host_bytes = 0;
  uint64_t disk_bytes = 0;
  // Blocks a worker could not produce (missing or corrupt disk copy): recomputed.
  uint64_t lost_blocks = 0;
  // Blocks per tier now (memory, host, disk only).
  int64_t blocks[3] = {0, 0, 0};
  // Important-token loading, summed over ranks: requests that read their prefix so, layers
  // that read a chosen subset, layers whose probe heads disagreed (read whole), and requests
  // recomputed because a block could not be read.
  uint64_t important_requests = 0;
  uint64_t important_layers = 0;
  uint64_t fallback_layers = 0;
  uint64_t important_restarts = 0;
  // Block files rewritten in importance order, summed over ranks.
  uint64_t reordered_files = 0;
};

struct PlannedWork {
  std::shared_ptr<Request> request;
  // Prompt tokens in this step's chunk (0 for a decode token).
  int32_t prompt_tokens = 0;
  bool sample = false;
};

struct StepPlan {
  // step_id is left for the engine client to number.
  v1::StepRequest step;
  // Parallel to step.sequences.
  std::vector<PlannedWork> work;
  Clock::time_point start;
  int64_t tokens = 0;
  bool empty() const {
    return work.empty() && step.release_seq_ids().empty() && step.prefix_ops().empty();
  }
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerOptions& options) : options_(options) {}

  // A new worker group: its KV memory, and a fresh prefix cache index when it keeps one (the
  // workers' blocks went with the previous group).
  void SetKvCapacity(const KvCapacity& capacity);
  const KvCapacity& kv_capacity() const { return capacity_; }

  // RESOURCE_EXHAUSTED when the waiting queue is full, or the request needs more KV memory than
  // the workers have in all, or (without wait_for_kv) more than is free (*reject_reason is then
  // "queue_full" or "kv_full"); ALREADY_EXISTS when a request with the same id is active.
  Status Admit(std::shared_ptr<Request> request, std::string* reject_reason);
  // Marks the active request `id` cancelled; false when there is none.
  bool Cancel(const std::string& id, CancelKind kind);

  // The next step; empty when there is nothing to run or release.
  StepPlan Plan(Clock::time_point now);
  // Applies a step's responses (rank 0's first). A sequence that any rank refused (its
  // SequenceResult carries an error) fails alone with that error and is released; the others
  // take rank 0's results.
  void Complete(const StepPlan& plan, const std::vector<v1::StepResponse>& responses,
                Clock::time_point now);
  // The step failed for its own sequences (a rank reported an error): they fail with `status`
  // and are released, as are the step's releases again (a failed step applies none of them).
  void FailStep(const StepPlan& plan, const Status& status, Clock::time_point now);
  // The worker group is gone, and every sequence's KV with it: every request fails.
  void FailAll(const Status& status, Clock::time_point now);
  // Ends cancelled and expired requests without planning a step.
  void Sweep(Clock::time_point now);

  size_t running() const { return running_.size(); }
  size_t waiting() const { return waiting_.size(); }
  bool idle() const {
    return running_.empty() && waiting_.empty() && pending_release_.empty() &&
           pending_prefix_ops_.empty();
  }
  bool has_requests() const { return !running_.empty() || !waiting_.empty(); }
  // KV bytes reserved by admitted requests (not by those queued for KV).
  uint64_t reserved_bytes() const { return reserved_bytes_; }
  uint64_t preemptions() const { return preemptions_; }
  const PrefixCacheStats& prefix_stats() const { return prefix_stats_; }
  // Null when the workers keep no prefix cache or every tier is off.
  const PrefixIndex* prefix_index() const { return prefix_.get(); }
  size_t pending_releases() const { return pending_release_.size(); }

 private:
  // Bytes of `positions` cache positions, in whole blocks when the workers page.
  uint64_t Bytes(int64_t positions) const;
  // Whether r's reservation follows its length (paged workers, full policy).
  bool Grows(const Request& r) const;
  // What r reserves when it enters the batch: its prefill tokens when it grows, else its worst
  // case.
  uint64_t NeedBytes(const Request& r) const;
  // The most r can ever hold (prompt + max_new_tokens, or a bounded policy's worst case).
  uint64_t MaxBytes(const Request& r) const;
  // Memory a new request must leave free: one block per reserved sequence that grows.
  uint64_t Headroom() const;
  // Paged: reserves the block each decoding sequence's next position reaches, preempting the
  // newest growing sequences while none is free.
  void GrowReservations();
  // Requeues a running request to recompute from the start; its sequence is released in the
  // next step when the workers hold it (force_release: whenever they may, as after a step that
  // created it).
  void Preempt(const std::shared_ptr<Request>& r, bool force_release = false);
  // RESOURCE_EXHAUSTED for a request needing more KV memory than the workers have in all.
  Status NeverFits(const Request& r, uint64_t need) const;
  void AddPrefill(const std::shared_ptr<Request>& r, int32_t* budget, StepPlan* plan);
  // Once a bounded-policy sequence's prompt is in, its reservation drops to what the workers
  // keep (ResolvedRequest::PositionsAfterPrefill), making room for the queue.
  void ShrinkReservation(const Request& r);
  // Forgets a finished request; its KV is released in the next step when the workers hold it.
  void Remove(const std::shared_ptr<Request>& r, bool force_release);
  // Prefix cache. Whether r may read and fill it.
  bool UsesPrefix(const Request& r) const;
  // Before r's first chunk: looks up its cached prefix and has the workers load the blocks that
  // are not in memory (this step's prefix_ops). false while such loads are in flight: r starts
  // the step after, from the blocks that landed.
  bool PreparePrefix(const std::shared_ptr<Request>& r);
  // After r's prompt is in: its blocks the cache lacks join it (INSERT ops of the next step).
  void CachePrompt(const Request& r);
  // Lost blocks (a rank could not load them), reported in the step's responses.
  void ApplyPrefixFailures(const std::vector<v1::StepResponse>& responses);
  void AppendOps(const std::vector<PrefixOp>& ops);
  void ReleasePrefix(Request& r);
  void UpdatePrefixBlocks();
  // KV bytes the memory tier's blocks take.
  uint64_t PrefixBytes() const;
  // Sets the memory tier's budget to what is free after `more` bytes for sequences (at most
  // its configured size), moving its lowest blocks down when that shrinks.
  void FitPrefixMemory(uint64_t more);

  SchedulerOptions options_;
  KvCapacity capacity_;
  std::vector<std::shared_ptr<Request>> running_;
  std::deque<std::shared_ptr<Request>> waiting_;
  std::unordered_map<std::string, std::shared_ptr<Request>> by_id_;
  std::unordered_map<uint64_t, uint64_t> reserved_;  // seq_id -> bytes
  uint64_t reserved_bytes_ = 0;
  std::vector<uint64_t> pending_release_;
  uint64_t preemptions_ = 0;
  uint64_t own_seq_ids_ = uint64_t{1} << 62;
  std::unique_ptr<PrefixIndex> prefix_;
  int64_t prefix_memory_blocks_ = 0;              // the memory tier's configured size
  std::vector<v1::PrefixOp> pending_prefix_ops_;  // for the next step, before anything else
  // Sequences that read their prefix's important tokens from a block a rank lost this step:
  // recomputed (Complete preempts them).
  std::unordered_set<uint64_t> prefix_restart_;
  PrefixCacheStats prefix_stats_;
};

}  // namespace deja::coordinator
