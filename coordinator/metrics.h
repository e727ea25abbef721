// Every Prometheus family the coordinator process exports (docs/architecture.md#metrics),
// declared in one place. Names are deja_<subsystem>_<name>_<unit>: `coordinator` for
// requests, scheduling and steps, `worker` for what the coordinator observes of each rank
// (heartbeats, step timings and KV usage the ranks report), `sparsity` for Deja Vu. Children that
// hot paths touch are created up front and kept as references.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "deja/v1/text_generation.pb.h"
#include "metrics/registry.h"

namespace deja::coordinator {

// Static labels of deja_build_info / deja_model_info.
struct ModelInfoLabels {
  std::string model;
  std::string dtype;
  int tensor_parallel_size = 1;
};

class CoordinatorMetrics {
 public:
  // Per-rank series, labelled rank="<r>".
  struct Rank {
    metrics::Gauge* up;
    metrics::Histogram* step_seconds;
    metrics::Histogram* compute_seconds;
    metrics::Histogram* allreduce_seconds;
    metrics::Counter* failures;
    metrics::Gauge* last_heartbeat;
    metrics::Gauge* kv_total_bytes;
    metrics::Gauge* kv_free_bytes;
    metrics::Gauge* kv_cached_tokens;
    metrics::Gauge* kv_sequences;
    metrics::Counter* kv_evicted_tokens;
    metrics::Histogram* predictor_seconds;  // steps with a sparse sequence only
  };

  CoordinatorMetrics(metrics::Registry* registry, const ModelInfoLabels& info);

  // Request outcomes: `code` is the gRPC code name ("OK", "CANCELLED", ...); `protocol` the API
  // the request came through ("grpc", "openai", "kserve").
  void RequestFinished(const std::string& code, v1::FinishReason reason,
                       const std::string& protocol);
  // Requests turned away before queueing: invalid_argument, queue_full, kv_full, draining,
  // not_ready, already_exists, failed_precondition, unauthenticated (any call of either API).
  void Rejected(const std::string& reason, const std::string& protocol);
  // The per-step histogram of one phase: schedule, workers, apply, total, overhead.
  metrics::Histogram& StepPhase(const std::string& phase);
  // The series of rank r < tensor_parallel_size (created by the constructor).
  Rank& rank(int r);
  int world_size() const { return static_cast<int>(ranks_.size()); }

  metrics::Histogram& request_seconds;
  metrics::Histogram& queue_seconds;
  metrics::Histogram& time_to_first_token_seconds;
  metrics::Histogram& inter_token_seconds;
  metrics::Counter& prompt_tokens;
  metrics::Counter& generated_tokens;
  metrics::Counter& preemptions;
  metrics::Gauge& running;
  metrics::Gauge& waiting;
  metrics::Histogram& batch_sequences;
  metrics::Histogram& batch_tokens;
  metrics::Counter& steps;
  metrics::Counter& step_failures;
  // Rank 0's forward passes run as CUDA graphs: captured (then replayed) and replayed.
  metrics::Counter& graph_captures;
  metrics::Counter& graph_replays;
  metrics::Gauge& kv_usage_ratio;
  metrics::Gauge& kv_reserved_bytes;
  metrics::Gauge& ready;
  metrics::Gauge& draining;
  metrics::Gauge& group_epoch;
  metrics::Counter& group_losses;
  // Deja Vu, observed once per step that ran at least one sparse sequence: the fraction of the
  // heads / MLP neurons computed, averaged over layers and ranks (1 when the batch fell back
  // to dense).
  metrics::Histogram& sparsity_active_heads;
  metrics::Histogram& sparsity_active_neurons;
  // Sequence-steps (one sequence in one step) that ran with sparsity on, and dense.
  metrics::Counter* sparse_sequence_steps;
  metrics::Counter* dense_sequence_steps;
  // Prefix cache (docs/architecture.md#prefix-cache). Tiers in PrefixTier order: memory, host,
  // disk.
  struct Prefix {
    metrics::Counter* hits[3];  // requests that started from cached blocks, by slowest tier
    metrics::Counter* misses;
    metrics::Counter* hit_tokens;
    metrics::Counter* read_bytes[3];  // into memory, summed over ranks (memory: always 0)
    metrics::Counter* lost_blocks;
    metrics::Gauge* blocks[3];
    metrics::Histogram* load_seconds;  // steps that loaded blocks: the slowest rank's time
    // Important-token loading: requests, layers by result (chosen subset, fallback to whole),
    // requests recomputed after a block could not be read.
    metrics::Counter* important_requests;
    metrics::Counter* important_layers[2];
    metrics::Counter* important_restarts;
    metrics::Counter* reordered_files;
  } prefix;

 private:
  metrics::Registry* registry_;
  metrics::Family<metrics::Counter>& requests_;
  metrics::Family<metrics::Counter>& rejections_;
  metrics::Family<metrics::Histogram>& step_phase_;
  metrics::Family<metrics::Gauge>& rank_up_;
  metrics::Family<metrics::Histogram>& rank_step_;
  metrics::Family<metrics::Histogram>& rank_compute_;
  metrics::Family<metrics::Histogram>& rank_allreduce_;
  metrics::Family<metrics::Counter>& rank_failures_;
  metrics::Family<metrics::Gauge>& rank_heartbeat_;
  metrics::Family<metrics::Gauge>& rank_kv_total_;
  metrics::Family<metrics::Gauge>& rank_kv_free_;
  metrics::Family<metrics::Gauge>& rank_kv_cached_;
  metrics::Family<metrics::Gauge>& rank_kv_sequences_;
  metrics::Family<metrics::Counter>& rank_kv_evicted_;
  metrics::Family<metrics::Counter>& sequence_steps_;
  metrics::Family<metrics::Histogram>& rank_predictor_;
  std::vector<std::unique_ptr<Rank>> ranks_;
};

// "length", "eos", ... ("" for unspecified).
std::string FinishReasonLabel(v1::FinishReason reason);

}  // namespace deja::coordinator
