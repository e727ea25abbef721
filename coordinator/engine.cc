#include "coordinator/engine.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstdio>

namespace deja::coordinator {
namespace {

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// How long the idle loop sleeps between looks at the group and at queued requests' expiry.
constexpr std::chrono::milliseconds kIdlePoll(20);

std::string RejectReason(const Status& s) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
      return "invalid_argument";
    case StatusCode::kFailedPrecondition:
      return "failed_precondition";
    case StatusCode::kUnauthenticated:
      return "unauthenticated";
    default:
      return "other";
  }
}

}  // namespace

Engine::Engine(const EngineOptions& options, const Tokenizer* tokenizer, EngineClient* client,
               CoordinatorMetrics* metrics)
    : options_(options),
      tokenizer_(tokenizer),
      client_(client),
      metrics_(metrics),
      scheduler_([this, o = options.scheduler]() mutable {
        // Preempted sequences continue under fresh ids from the same counter as new ones.
        o.next_seq_id = [this] { return next_seq_id_++; };
        return o;
      }()),
      rng_(std::random_device{}()) {
  loop_ = std::thread([this] { Loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  loop_.join();
  std::lock_guard<std::mutex> lock(mu_);
  scheduler_.FailAll(Unavailable("the server is shutting down"), Clock::now());
  UpdateGauges();
}

StatusOr<std::shared_ptr<Request>> Engine::Submit(const v1::GenerateRequest& request,
                                                  std::optional<Clock::time_point> deadline,
                                                  std::shared_ptr<RequestSink> sink,
                                                  Protocol protocol) {
  const std::string label = ProtocolLabel(protocol);
  const Clock::time_point arrival = Clock::now();
  if (draining_.load()) {
    metrics_->Rejected("draining", label);
    VLOG(1) << "request " << (request.has_request_id() ? request.request_id() : "-")
            << ": refused code=UNAVAILABLE reason=draining";
    return Unavailable("the server is draining and accepts no new requests");
  }
  const GroupState group = client_->State();
  if (!group.ready) {
    metrics_->Rejected("not_ready", label);
    VLOG(1) << "request " << (request.has_request_id() ? request.request_id() : "-")
            << ": refused code=UNAVAILABLE reason=not_ready";
    return Unavailable("no worker group is ready" +
                       (group.reason.empty() ? std::string() : ": " + group.reason));
  }
  uint64_t seed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    seed = rng_();
  }
  StatusOr<ResolvedRequest> resolved = ResolveRequest(request, LimitsFor(group), *tokenizer_, seed);
  if (!resolved.ok()) {
    metrics_->Rejected(RejectReason(resolved.status()), label);
    LOG(INFO) << "request " << (request.has_request_id() ? request.request_id() : "-")
              << ": refused code=" << StatusCodeName(resolved.status().code())
              << " reason=" << RejectReason(resolved.status());
    return resolved.status();
  }
  resolved->protocol = protocol;
  std::string id = resolved->request_id;
  std::lock_guard<std::mutex> lock(mu_);
  if (id.empty()) id = NewRequestId();
  auto r = std::make_shared<Request>(id, next_seq_id_++, std::move(*resolved), tokenizer_, metrics_,
                                     arrival, deadline, delivery_.Wrap(std::move(sink)));
  if (group.epoch != served_epoch_) TrackGroup(group, arrival);
  std::string reason;
  if (Status s = scheduler_.Admit(r, &reason); !s.ok()) {
    metrics_->Rejected(reason, label);
    LOG(INFO) << "request " << id << ": refused code=" << StatusCodeName(s.code())
              << " reason=" << reason;
    return s;
  }
  metrics_->prompt_tokens.Increment(r->prompt_tokens());
  UpdateGauges();
  VLOG(1) << "request " << id << ": admitted as seq " << r->seq_id() << ", " << r->prompt_tokens()
          << " prompt tokens, max_new_tokens " << r->params().max_new_tokens;
  cv_.notify_all();
  return r;
}

void Engine::RejectInvalid(const Status& status, Protocol protocol) {
  metrics_->Rejected(RejectReason(status), ProtocolLabel(protocol));
}

bool Engine::Cancel(const std::string& request_id) {
  bool found;
  {
    std::lock_guard<std::mutex> lock(mu_);
    found = scheduler_.Cancel(request_id, CancelKind::kByRequest);
  }
  if (found) cv_.notify_all();
  return found;
}

void Engine::ClientGone(const std::shared_ptr<Request>& request) {
  request->RequestCancel(CancelKind::kClientGone);
  cv_.notify_all();
}

ModelLimits Engine::LimitsFor(const GroupState& group) const {
  ModelLimits limits = options_.limits;
  limits.sparsity_available = group.sparsity_available;
  limits.sparsity_default = group.sparsity_default;
  limits.locret_available = group.locret_available;
  limits.prefix_cache_available = group.kv.prefix_cache && group.kv.block_tokens > 0 &&
                                  options_.scheduler.prefix_memory_bytes > 0;
  limits.prefix_cache_block_tokens = limits.prefix_cache_available ? group.kv.block_tokens : 0;
  limits.sparsity_schedules.clear();
  if (group.sparsity_available) limits.sparsity_schedules.push_back(kSparsitySchedule);
  return limits;
}

bool Engine::Ready() const { return !draining_.load() && client_->State().ready; }

void Engine::StartDrain() {
  if (!draining_.exchange(true)) {
    LOG(INFO) << "engine: draining; new requests get UNAVAILABLE";
    metrics_->draining.Set(1);
  }
}

bool Engine::WaitIdle(std::chrono::milliseconds timeout) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!idle_cv_.wait_for(lock, timeout, [&] { return !scheduler_.has_requests(); })) {
      return false;
    }
  }
  // The requests' last messages have reached their RPCs.
  delivery_.Flush();
  return true;
}

void Engine::FailAll(const Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    scheduler_.FailAll(status, Clock::now());
    UpdateGauges();
    idle_cv_.notify_all();
  }
  delivery_.Flush();
}

void Engine::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    const Clock::time_point now = Clock::now();
    const GroupState group = client_->State();
    TrackGroup(group, now);
    if (!group.ready || scheduler_.idle()) {
      scheduler_.Sweep(now);
      UpdateGauges();
      if (!scheduler_.has_requests()) idle_cv_.notify_all();
      cv_.wait_for(lock, kIdlePoll);
      continue;
    }
    StepPlan plan = scheduler_.Plan(now);
    metrics_->StepPhase("schedule").Observe(Seconds(Clock::now() - now));
    UpdateGauges();
    if (plan.empty()) {
      if (!scheduler_.has_requests()) idle_cv_.notify_all();
      continue;
    }
    lock.unlock();
    RunStep(std::move(plan));
    lock.lock();
  }
}

void Engine::TrackGroup(const GroupState& state, Clock::time_point now) {
  metrics_->ready.Set(state.ready && !draining_.load() ? 1 : 0);
  if (state.ready && state.epoch == served_epoch_) return;
  if (served_epoch_ != 0 && (scheduler_.has_requests() || scheduler_.pending_releases() > 0)) {
    LOG(WARNING) << "engine: worker group epoch " << served_epoch_
                 << " lost; failing every request";
    scheduler_.FailAll(Unavailable("the worker group was lost" +
                                   (state.reason.empty() ? std::string() : ": " + state.reason)),
                       now);
    UpdateGauges();
  }
  if (state.ready) {
    LOG(INFO) << "engine: serving worker group epoch " << state.epoch << " (KV "
              << state.kv.total_bytes << " bytes per rank, " << state.kv.bytes_per_token
              << " per position)";
    served_epoch_ = state.epoch;
    scheduler_.SetKvCapacity(state.kv);
    metrics_->group_epoch.Set(static_cast<double>(state.epoch));
  } else {
    served_epoch_ = 0;
  }
}

void Engine::RunStep(StepPlan plan) {
  const Clock::time_point sent = Clock::now();
  metrics_->batch_sequences.Observe(static_cast<double>(plan.work.size()));
  metrics_->batch_tokens.Observe(static_cast<double>(plan.tokens));
  StatusOr<std::vector<v1::StepResponse>> responses = client_->Step(plan.step);
  const Clock::time_point received = Clock::now();
  metrics_->steps.Increment();
  metrics_->StepPhase("workers").Observe(Seconds(received - sent));

  std::lock_guard<std::mutex> lock(mu_);
  if (!responses.ok()) {
    metrics_->step_failures.Increment();
    LOG(WARNING) << "engine: step failed: " << responses.status().ToString();
    // The group is gone (the client declared it lost): every request fails now, not only
    // this step's, since no rank holds their state any more.
    scheduler_.FailAll(Unavailable("the worker group was lost: " + responses.status().message()),
                       received);
    served_epoch_ = 0;
    UpdateGauges();
    idle_cv_.notify_all();
    return;
  }
  double slowest = 0;
  const v1::StepResponse* failed = nullptr;
  for (const v1::StepResponse& r : *responses) {
    slowest = std::max(slowest, r.timings().total_seconds());
    if (r.error_code() != 0 && failed == nullptr) failed = &r;
    if (static_cast<int>(r.rank()) < metrics_->world_size()) {
      CoordinatorMetrics::Rank& m = metrics_->rank(static_cast<int>(r.rank()));
      m.step_seconds->Observe(r.timings().total_seconds());
      m.compute_seconds->Observe(r.timings().compute_seconds());
      m.allreduce_seconds->Observe(r.timings().allreduce_seconds());
    }
  }
  if (failed != nullptr) {
    metrics_->step_failures.Increment();
    const Status status(static_cast<StatusCode>(failed->error_code()),
                        "rank " + std::to_string(failed->rank()) + ": " + failed->error_message());
    LOG(WARNING) << "engine: step " << plan.step.step_id() << " failed: " << status.ToString();
    scheduler_.FailStep(plan, status, received);
  } else {
    ObserveSparsity(*responses);
    const v1::StepTimings& rank0 = responses->front().timings();
    if (rank0.graph_captured()) metrics_->graph_captures.Increment();
    if (rank0.graph_replayed()) metrics_->graph_replays.Increment();
    double load = 0;
    for (const v1::StepResponse& r : *responses)
      load = std::max(load, r.prefix_io().load_seconds());
    if (load > 0) metrics_->prefix.load_seconds->Observe(load);
    scheduler_.Complete(plan, *responses, received);
  }
  const Clock::time_point applied = Clock::now();
  metrics_->StepPhase("apply").Observe(Seconds(applied - received));
  metrics_->StepPhase("total").Observe(Seconds(applied - plan.start));
  metrics_->StepPhase("overhead").Observe(std::max(0.0, Seconds(applied - plan.start) - slowest));
  UpdateGauges();
  if (!scheduler_.has_requests()) idle_cv_.notify_all();
}

void Engine::ObserveSparsity(const std::vector<v1::StepResponse>& responses) {
  const v1::StepResponse& rank0 = responses.front();
  if (!rank0.has_sparsity()) return;  // no forward pass (an empty or release-only step)
  metrics_->sparse_sequence_steps->Increment(rank0.sparsity().sparse_sequences());
  metrics_->dense_sequence_steps->Increment(rank0.sparsity().dense_sequences());
  if (rank0.sparsity().sparse_sequences() == 0) return;
  // Each rank reports the fraction of its own heads and neurons; ranks hold equal shares.
  double heads = 0, neurons = 0;
  for (const v1::StepResponse& r : responses) {
    heads += r.sparsity().active_head_fraction();
    neurons += r.sparsity().active_neuron_fraction();
    if (static_cast<int>(r.rank()) < metrics_->world_size()) {
      metrics_->rank(static_cast<int>(r.rank()))
          .predictor_seconds->Observe(r.timings().predictor_seconds());
    }
  }
  metrics_->sparsity_active_heads.Observe(heads / static_cast<double>(responses.size()));
  metrics_->sparsity_active_neurons.Observe(neurons / static_cast<double>(responses.size()));
}

void Engine::ObservePrefix() {
  const PrefixCacheStats& now = scheduler_.prefix_stats();
  PrefixCacheStats& was = prefix_seen_;
  CoordinatorMetrics::Prefix& m = metrics_->prefix;
  for (int t = 0; t < 3; ++t) {
    m.hits[t]->Increment(static_cast<double>(now.hits[t] - was.hits[t]));
    m.blocks[t]->Set(static_cast<double>(now.blocks[t]));
  }
  m.misses->Increment(static_cast<double>(now.misses - was.misses));
  m.hit_tokens->Increment(static_cast<double>(now.hit_tokens - was.hit_tokens));
  m.read_bytes[1]->Increment(static_cast<double>(now.host_bytes - was.host_bytes));
  m.read_bytes[2]->Increment(static_cast<double>(now.disk_bytes - was.disk_bytes));
  m.lost_blocks->Increment(static_cast<double>(now.lost_blocks - was.lost_blocks));
  m.important_requests->Increment(
      static_cast<double>(now.important_requests - was.important_requests));
  m.important_layers[0]->Increment(
      static_cast<double>(now.important_layers - was.important_layers));
  m.important_layers[1]->Increment(static_cast<double>(now.fallback_layers - was.fallback_layers));
  m.important_restarts->Increment(
      static_cast<double>(now.important_restarts - was.important_restarts));
  m.reordered_files->Increment(static_cast<double>(now.reordered_files - was.reordered_files));
  was = now;
}

void Engine::UpdateGauges() {
  ObservePrefix();
  metrics_->running.Set(static_cast<double>(scheduler_.running()));
  metrics_->waiting.Set(static_cast<double>(scheduler_.waiting()));
  metrics_->kv_reserved_bytes.Set(static_cast<double>(scheduler_.reserved_bytes()));
  const uint64_t total = scheduler_.kv_capacity().total_bytes;
  metrics_->kv_usage_ratio.Set(total > 0 ? static_cast<double>(scheduler_.reserved_bytes()) / total
                                         : 0.0);
}

std::string Engine::NewRequestId() {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "deja-%016llx", static_cast<unsigned long long>(rng_()));
  return buf;
}

}  // namespace deja::coordinator
