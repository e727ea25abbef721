#include "coordinator/metrics.h"

#include <glog/logging.h>

namespace deja::coordinator {
namespace {

using metrics::ExponentialBuckets;

std::vector<double> LatencyBuckets() { return ExponentialBuckets(0.001, 2, 17); }  // 1ms..65s
std::vector<double> StepBuckets() { return ExponentialBuckets(0.0001, 2, 17); }    // 0.1ms..6.5s
// 0.05, 0.1, ..., 1 (computed as i/20 so the bounds print as written).
std::vector<double> FractionBuckets() {
  std::vector<double> b;
  for (int i = 1; i <= 20; ++i) b.push_back(i / 20.0);
  return b;
}

}  // namespace

CoordinatorMetrics::CoordinatorMetrics(metrics::Registry* r, const ModelInfoLabels& info)
    : request_seconds(r->AddHistogram("deja_coordinator_request_duration_seconds",
                                      "Time from a request's arrival to its end.", {},
                                      LatencyBuckets())
                          .Add({})),
      queue_seconds(r->AddHistogram("deja_coordinator_queue_duration_seconds",
                                    "Time from arrival to the first step that ran the request.", {},
                                    LatencyBuckets())
                        .Add({})),
      time_to_first_token_seconds(r->AddHistogram("deja_coordinator_time_to_first_token_seconds",
                                                  "Time from arrival to the first generated token.",
                                                  {}, LatencyBuckets())
                                      .Add({})),
      inter_token_seconds(r->AddHistogram("deja_coordinator_inter_token_latency_seconds",
                                          "Time between consecutive tokens of a request.", {},
                                          StepBuckets())
                              .Add({})),
      prompt_tokens(r->AddCounter("deja_coordinator_prompt_tokens_total",
                                  "Prompt tokens of admitted requests (BOS included).")
                        .Add({})),
      generated_tokens(
          r->AddCounter("deja_coordinator_generated_tokens_total", "Tokens generated.").Add({})),
      preemptions(r->AddCounter("deja_coordinator_preemptions_total",
                                "Sequences whose KV was dropped because the paged KV memory ran "
                                "out; each recomputes its tokens later.")
                      .Add({})),
      running(r->AddGauge("deja_coordinator_running_requests",
                          "Requests in the batch (prefilling or decoding).")
                  .Add({})),
      waiting(r->AddGauge("deja_coordinator_waiting_requests",
                          "Admitted requests waiting for a place in the batch.")
                  .Add({})),
      batch_sequences(r->AddHistogram("deja_coordinator_batch_size_sequences",
                                      "Sequences per step.", {}, ExponentialBuckets(1, 2, 10))
                          .Add({})),
      batch_tokens(r->AddHistogram("deja_coordinator_batch_size_tokens",
                                   "Tokens per step (prefill chunks plus decode tokens).", {},
                                   ExponentialBuckets(1, 2, 13))
                       .Add({})),
      steps(
          r->AddCounter("deja_coordinator_steps_total", "Steps sent to the worker group.").Add({})),
      step_failures(r->AddCounter("deja_coordinator_step_failures_total",
                                  "Steps that failed (a rank's error, a timeout or a lost rank).")
                        .Add({})),
      graph_captures(r->AddCounter("deja_cuda_graph_captures_total",
                                   "Decode steps whose forward pass was captured as a CUDA graph "
                                   "(then replayed); one capture per batch size bucket and "
                                   "block-table width (--cuda-graphs).")
                         .Add({})),
      graph_replays(r->AddCounter("deja_cuda_graph_replays_total",
                                  "Decode steps that replayed an earlier capture.")
                        .Add({})),
      kv_usage_ratio(r->AddGauge("deja_coordinator_kv_cache_usage_ratio",
                                 "Reserved over total KV memory of the fullest rank, in [0, 1].")
                         .Add({})),
      kv_reserved_bytes(r->AddGauge("deja_coordinator_kv_reserved_bytes",
                                    "KV bytes per rank reserved by admitted requests.")
                            .Add({})),
      ready(r->AddGauge("deja_coordinator_ready",
                        "1 when every rank is connected and warmed up and not draining.")
                .Add({})),
      draining(r->AddGauge("deja_coordinator_draining", "1 while draining for shutdown.").Add({})),
      group_epoch(r->AddGauge("deja_coordinator_group_epoch",
                              "Rendezvous epoch of the worker group being served.")
                      .Add({})),
      group_losses(r->AddCounter("deja_coordinator_group_losses_total",
                                 "Times the worker group was declared lost.")
                       .Add({})),
      sparsity_active_heads(
          r->AddHistogram("deja_sparsity_active_head_fraction",
                          "Per step with a sparse sequence: fraction of the attention heads "
                          "computed, averaged over layers and ranks.",
                          {}, FractionBuckets())
              .Add({})),
      sparsity_active_neurons(
          r->AddHistogram("deja_sparsity_active_neuron_fraction",
                          "Per step with a sparse sequence: fraction of the MLP neurons "
                          "computed, averaged over layers and ranks.",
                          {}, FractionBuckets())
              .Add({})),

      registry_(r),
      requests_(r->AddCounter("deja_coordinator_requests_total",
                              "Finished generation requests by gRPC code, finish reason and "
                              "API (grpc, openai, kserve).",
                              {"code", "finish_reason", "protocol"})),
      rejections_(r->AddCounter("deja_coordinator_rejections_total",
                                "Requests refused before queueing, by reason and API (grpc, openai, kserve).",
                                {"reason", "protocol"})),
      step_phase_(r->AddHistogram("deja_coordinator_step_duration_seconds",
                                  "Step time by phase: schedule, workers (RPC round trip), apply, "
                                  "total, overhead (total minus the slowest rank's own time).",
                                  {"phase"}, StepBuckets())),
      rank_up_(
          r->AddGauge("deja_worker_up", "1 while the rank is connected and healthy.", {"rank"})),
      rank_step_(r->AddHistogram("deja_worker_step_duration_seconds",
                                 "A rank's own time per step, as it reports.", {"rank"},
                                 StepBuckets())),
      rank_compute_(r->AddHistogram("deja_worker_compute_duration_seconds",
                                    "A rank's forward compute per step, collectives excluded.",
                                    {"rank"}, StepBuckets())),
      rank_allreduce_(r->AddHistogram("deja_worker_allreduce_duration_seconds",
                                      "A rank's time inside collectives per step.", {"rank"},
                                      StepBuckets())),
      rank_failures_(r->AddCounter("deja_worker_failures_total",
                                   "Failures attributed to a rank (lost stream, missed "
                                   "heartbeats, step timeout, fatal step).",
                                   {"rank"})),
      rank_heartbeat_(r->AddGauge("deja_worker_last_heartbeat_timestamp_seconds",
                                  "Unix time of the rank's last successful heartbeat.", {"rank"})),
      rank_kv_total_(
          r->AddGauge("deja_worker_kv_total_bytes", "KV memory budget of the rank.", {"rank"})),
      rank_kv_free_(r->AddGauge("deja_worker_kv_free_bytes",
                                "Unreserved KV memory of the rank, as it reports.", {"rank"})),
      rank_kv_cached_(r->AddGauge("deja_worker_kv_cached_tokens",
                                  "Tokens cached over the rank's sequences, heads and layers.",
                                  {"rank"})),
      rank_kv_sequences_(r->AddGauge("deja_worker_kv_sequences",
                                     "Sequences holding KV memory on the rank.", {"rank"})),
      rank_kv_evicted_(r->AddCounter("deja_worker_kv_evicted_tokens_total",
                                     "Tokens evicted by WINDOW/H2O on the rank.", {"rank"})),
      sequence_steps_(r->AddCounter("deja_sparsity_sequence_steps_total",
                                    "Sequence-steps (one sequence in one step) by mode: sparse "
                                    "(Deja Vu on) or dense.",
                                    {"mode"})),
      rank_predictor_(r->AddHistogram("deja_worker_predictor_duration_seconds",
                                      "A rank's Deja Vu predictor time per step with a sparse "
                                      "sequence (on its own thread, overlapped with compute).",
                                      {"rank"}, StepBuckets())) {
  {
    const char* tiers[3] = {"memory", "host", "disk"};
    auto& hits = r->AddCounter("deja_prefix_cache_hits_total",
                               "Requests that started from cached prompt blocks, by the slowest "
                               "tier one of the blocks came from.",
                               {"tier"});
    auto& bytes = r->AddCounter("deja_prefix_cache_read_bytes_total",
                                "Bytes of cached blocks the workers loaded into memory, by the "
                                "tier they came from, summed over ranks.",
                                {"tier"});
    auto& blocks =
        r->AddGauge("deja_prefix_cache_blocks",
                    "Cached prompt blocks by tier (disk: those only on disk).", {"tier"});
    for (int t = 0; t < 3; ++t) {
      prefix.hits[t] = &hits.Add({{"tier", tiers[t]}});
      prefix.read_bytes[t] = &bytes.Add({{"tier", tiers[t]}});
      prefix.blocks[t] = &blocks.Add({{"tier", tiers[t]}});
    }
    prefix.misses = &r->AddCounter("deja_prefix_cache_misses_total",
                                   "Requests that looked for a cached prefix and found none.")
                         .Add({});
    prefix.hit_tokens = &r->AddCounter("deja_prefix_cache_hit_tokens_total",
                                       "Prompt tokens taken from the prefix cache.")
                             .Add({});
    prefix.lost_blocks = &r->AddCounter("deja_prefix_cache_lost_blocks_total",
                                        "Cached blocks a worker could not load (a missing or "
                                        "corrupt disk copy); their tokens were recomputed.")
                              .Add({});
    prefix.important_requests =
        &r->AddCounter("deja_prefix_cache_important_requests_total",
                       "Requests that read a cached prefix on host or disk where it is, each "
                       "layer only the tokens the probe heads chose (--prefix-load important).")
             .Add({});
    auto& layers = r->AddCounter("deja_prefix_cache_important_layers_total",
                                 "Layers of such requests, summed over ranks: result=chosen read "
                                 "a subset, result=fallback read the whole prefix (the probe "
                                 "heads disagreed). Fallback rate = fallback / (chosen + "
                                 "fallback).",
                                 {"result"});
    prefix.important_layers[0] = &layers.Add({{"result", "chosen"}});
    prefix.important_layers[1] = &layers.Add({{"result", "fallback"}});
    prefix.important_restarts =
        &r->AddCounter("deja_prefix_cache_important_restarts_total",
                       "Requests recomputed because a block they were reading could not be read.")
             .Add({});
    prefix.reordered_files =
        &r->AddCounter("deja_prefix_cache_reordered_files_total",
                       "Block files rewritten in the background with the tokens loads chose most "
                       "often first (--prefix-file-order importance), summed over ranks.")
             .Add({});
    prefix.load_seconds = &r->AddHistogram("deja_prefix_cache_load_duration_seconds",
                                           "Per step that loaded cached blocks into memory: the "
                                           "slowest rank's load time.",
                                           {}, StepBuckets())
                               .Add({});
  }
  sparse_sequence_steps = &sequence_steps_.Add({{"mode", "sparse"}});
  dense_sequence_steps = &sequence_steps_.Add({{"mode", "dense"}});
  r->AddGauge("deja_build_info", "Build of this coordinator (value is 1).", {"version"})
      .Add({{"version", DEJA_VERSION}})
      .Set(1);
  r->AddGauge("deja_model_info", "The served model (value is 1).",
              {"model", "dtype", "tensor_parallel_size"})
      .Add({{"model", info.model},
            {"dtype", info.dtype},
            {"tensor_parallel_size", std::to_string(info.tensor_parallel_size)}})
      .Set(1);
  for (const char* phase : {"schedule", "workers", "apply", "total", "overhead"}) {
    step_phase_.Add({{"phase", phase}});
  }
  // The usual outcomes exist from the start at zero, so that rates and ratios over them have a
  // series before the first request (a labelled family without a series is not exported).
  for (const char* protocol : {"grpc", "openai", "kserve"}) {
    for (v1::FinishReason reason :
         {v1::FINISH_REASON_LENGTH, v1::FINISH_REASON_EOS, v1::FINISH_REASON_STOP_SEQUENCE,
          v1::FINISH_REASON_TIME_LIMIT}) {
      requests_.Add(
          {{"code", "OK"}, {"finish_reason", FinishReasonLabel(reason)}, {"protocol", protocol}});
    }
    for (const char* reason : {"invalid_argument", "failed_precondition", "queue_full", "kv_full",
                               "draining", "not_ready", "already_exists", "unauthenticated"}) {
      rejections_.Add({{"reason", reason}, {"protocol", protocol}});
    }
  }
  for (int i = 0; i < info.tensor_parallel_size; ++i) {
    const metrics::Labels l = {{"rank", std::to_string(i)}};
    ranks_.push_back(std::make_unique<Rank>(
        Rank{&rank_up_.Add(l), &rank_step_.Add(l), &rank_compute_.Add(l), &rank_allreduce_.Add(l),
             &rank_failures_.Add(l), &rank_heartbeat_.Add(l), &rank_kv_total_.Add(l),
             &rank_kv_free_.Add(l), &rank_kv_cached_.Add(l), &rank_kv_sequences_.Add(l),
             &rank_kv_evicted_.Add(l), &rank_predictor_.Add(l)}));
  }
}

void CoordinatorMetrics::RequestFinished(const std::string& code, v1::FinishReason reason,
                                         const std::string& protocol) {
  requests_
      .Add({{"code", code}, {"finish_reason", FinishReasonLabel(reason)}, {"protocol", protocol}})
      .Increment();
}

void CoordinatorMetrics::Rejected(const std::string& reason, const std::string& protocol) {
  rejections_.Add({{"reason", reason}, {"protocol", protocol}}).Increment();
}

metrics::Histogram& CoordinatorMetrics::StepPhase(const std::string& phase) {
  return step_phase_.Add({{"phase", phase}});
}

CoordinatorMetrics::Rank& CoordinatorMetrics::rank(int r) {
  CHECK(r >= 0 && r < static_cast<int>(ranks_.size())) << "rank " << r;
  return *ranks_[r];
}

std::string FinishReasonLabel(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_EOS:
      return "eos";
    case v1::FINISH_REASON_STOP_SEQUENCE:
      return "stop_sequence";
    case v1::FINISH_REASON_CANCELLED:
      return "cancelled";
    case v1::FINISH_REASON_TIME_LIMIT:
      return "time_limit";
    default:
      return "";
  }
}

}  // namespace deja::coordinator
