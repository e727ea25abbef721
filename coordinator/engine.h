// Engine: the coordinator's core behind the gRPC handlers. Submit() validates, tokenizes and
// admits a request; one thread runs the continuous-batching loop: plan a step (Scheduler),
// send it to every rank (EngineClient), apply rank 0's tokens, which stream out through each
// request's RequestSink. Also drain (refuse new work, let running requests finish) and the
// reaction to a lost worker group (every request fails with UNAVAILABLE at once).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/tokenizer.h"
#include "coordinator/delivery.h"
#include "coordinator/engine_client.h"
#include "coordinator/metrics.h"
#include "coordinator/request.h"
#include "coordinator/scheduler.h"
#include "coordinator/validation.h"

namespace deja::coordinator {

// The name of the one sparsity schedule a worker group has (the predictors' own top-k).
inline constexpr const char* kSparsitySchedule = "default";

struct EngineOptions {
  SchedulerOptions scheduler;
  ModelLimits limits;
};

class Engine {
 public:
  // Every pointer outlives the engine. Starts the loop thread.
  Engine(const EngineOptions& options, const Tokenizer* tokenizer, EngineClient* client,
         CoordinatorMetrics* metrics);
  // Fails what is left with UNAVAILABLE and joins the loop.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and admits `request`; its output goes to `sink`. INVALID_ARGUMENT (naming the
  // field), FAILED_PRECONDITION, ALREADY_EXISTS, RESOURCE_EXHAUSTED (queue or KV full) or
  // UNAVAILABLE (draining, or no ready worker group) come back at once and `sink` is unused.
  // `protocol` labels the request's metrics.
  StatusOr<std::shared_ptr<Request>> Submit(const v1::GenerateRequest& request,
                                            std::optional<Clock::time_point> deadline,
                                            std::shared_ptr<RequestSink> sink,
                                            Protocol protocol = Protocol::kGrpc);
  // Counts a call refused before it reached Submit (it could not be parsed, or it carried no
  // accepted bearer token).
  void RejectInvalid(const Status& status, Protocol protocol = Protocol::kGrpc);
  // The Cancel RPC: true when a queued or running request has `request_id`.
  bool Cancel(const std::string& request_id);
  // The client of `request` went away; it leaves the batch at the next step.
  void ClientGone(const std::shared_ptr<Request>& request);

  // Ready for traffic: the group is ready and the engine is not draining.
  bool Ready() const;
  GroupState group() const { return client_->State(); }
  // Refuses new requests from now on (UNAVAILABLE); admitted ones continue.
  void StartDrain();
  bool draining() const { return draining_.load(); }
  // Waits until no request is queued or running and their output has reached the RPC layer;
  // false on timeout.
  bool WaitIdle(std::chrono::milliseconds timeout);
  // Fails every queued and running request with `status` (end of a drain that timed out); the
  // errors have reached the RPC layer when it returns.
  void FailAll(const Status& status);

  const ModelLimits& limits() const { return options_.limits; }
  // The limits with the sparsity the worker group reports (available, its default, schedules).
  ModelLimits LimitsFor(const GroupState& group) const;
  const Tokenizer& tokenizer() const { return *tokenizer_; }

 private:
  void Loop();
  // Reacts to the group's state: a lost or replaced group fails every request. Under mu_.
  void TrackGroup(const GroupState& state, Clock::time_point now);
  void RunStep(StepPlan plan);
  void UpdateGauges();
  // The prefix cache's counts since the last call, into the metrics.
  void ObservePrefix();
  // Deja Vu metrics of a successful step, from every rank's StepSparsity.
  void ObserveSparsity(const std::vector<v1::StepResponse>& responses);
  std::string NewRequestId();

  const EngineOptions options_;
  const Tokenizer* tokenizer_;
  EngineClient* client_;
  CoordinatorMetrics* metrics_;

  mutable std::mutex mu_;
  std::condition_variable cv_;       // wakes the loop
  std::condition_variable idle_cv_;  // wakes WaitIdle
  Scheduler scheduler_;
  PrefixCacheStats prefix_seen_;  // what ObservePrefix last exported
  uint64_t served_epoch_ = 0;
  bool stop_ = false;
  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> next_seq_id_{1};
  std::mt19937_64 rng_;  // seeds and request ids, under mu_
  // Requests' output goes to their sinks through it, off the loop thread (destroyed after the
  // destructor's FailAll, delivering that too).
  DeliveryQueue delivery_;
  std::thread loop_;
};

}  // namespace deja::coordinator
