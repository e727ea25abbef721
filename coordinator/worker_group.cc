#include "coordinator/worker_group.h"

#include <glog/logging.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <deque>

#include "coordinator/worker_group_internal.h"

namespace deja::coordinator {
namespace {

std::string Ms(std::chrono::milliseconds d) { return std::to_string(d.count()) + " ms"; }

}  // namespace

WorkerGroup::WorkerGroup(const WorkerGroupOptions& options,
                         coordinator::RendezvousService* rendezvous, CoordinatorMetrics* metrics)
    : options_(options), rendezvous_(rendezvous), metrics_(metrics) {
  state_.reason = "waiting for " + std::to_string(options_.world_size) + " ranks to register";
  monitor_ = std::thread([this] { Monitor(); });
}

WorkerGroup::~WorkerGroup() {
  std::shared_ptr<Connection> conn;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    conn = conn_;
    conn_.reset();
    if (conn) retired_.push_back(conn);
  }
  cv_.notify_all();
  if (conn) {
    std::lock_guard<std::mutex> lock(conn->mu);
    conn->closing = true;
    for (auto& link : conn->links) link->context.TryCancel();
  }
  monitor_.join();
  JoinRetired();
}

void WorkerGroup::SetLostCallback(LostCallback callback) {
  std::lock_guard<std::mutex> lock(mu_);
  lost_callback_ = std::move(callback);
}

GroupState WorkerGroup::State() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

void WorkerGroup::DeclareLost(const std::string& reason) {
  std::shared_ptr<Connection> conn;
  {
    std::lock_guard<std::mutex> lock(mu_);
    conn = conn_;
  }
  if (conn) Lose(conn, -1, reason, /*notify=*/false);
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t epoch = rendezvous_->ResetGroup();
  state_.ready = false;
  state_.epoch = 0;
  state_.reason =
      reason + "; waiting for the group to re-register in epoch " + std::to_string(epoch);
}

void WorkerGroup::Monitor() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, options_.heartbeat_interval, [&] { return stop_; });
    if (stop_) break;
    std::shared_ptr<Connection> conn = conn_;
    lock.unlock();
    JoinRetired();
    if (conn) {
      Heartbeat(conn);
    } else {
      TryConnect();
    }
    lock.lock();
  }
}

void WorkerGroup::Heartbeat(const std::shared_ptr<Connection>& conn) {
  for (auto& link : conn->links) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::min(kHeartbeatCallLimit, options_.heartbeat_timeout));
    proto::AttachGroupSecret(&ctx, options_.group_secret);
    v1::WorkerStatus st;
    const int64_t sent_ns = Clock::now().time_since_epoch().count();
    grpc::Status s = link->stub->GetStatus(&ctx, v1::GetStatusRequest(), &st);
    const Clock::time_point now = Clock::now();
    CoordinatorMetrics::Rank& m = metrics_->rank(link->rank);
    if (s.ok() && (st.group_epoch() != conn->epoch || (link->pid != 0 && st.pid() != link->pid))) {
      Lose(conn, link->rank,
           "rank " + std::to_string(link->rank) + " at " + link->address +
               " is another process now (pid " + std::to_string(st.pid()) + ", epoch " +
               std::to_string(st.group_epoch()) + ")");
      return;
    }
    if (s.ok()) {
      link->last_ok = now;
      m.last_heartbeat->Set(UnixNow());
      if (sent_ns > link->kv_published_ns.load()) PublishKv(link->rank, st.kv());
      const uint64_t evicted = st.kv().evicted_tokens_total();
      if (evicted > link->evicted_seen) {
        m.kv_evicted_tokens->Increment(static_cast<double>(evicted - link->evicted_seen));
      }
      link->evicted_seen = evicted;
      continue;
    }
    const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - link->last_ok);
    VLOG(1) << "worker group: heartbeat of rank " << link->rank << " failed: " << s.error_message();
    if (silent > options_.heartbeat_timeout) {
      Lose(conn, link->rank,
           "rank " + std::to_string(link->rank) + " at " + link->address +
               " missed heartbeats for " + Ms(silent) + " (" + s.error_message() + ")");
      return;
    }
  }
}

void WorkerGroup::ReadLoop(std::shared_ptr<Connection> conn, int rank) {
  RankLink& link = *conn->links[rank];
  v1::StepResponse response;
  while (link.stream->Read(&response)) {
    const bool fatal = response.fatal();
    const std::string message = response.error_message();
    {
      std::lock_guard<std::mutex> lock(conn->mu);
      link.responses.push_back(std::move(response));
    }
    conn->cv.notify_all();
    if (fatal) {
      Lose(conn, rank, "rank " + std::to_string(rank) + " lost its state: " + message);
    }
    response.Clear();
  }
  bool expected;
  {
    std::lock_guard<std::mutex> lock(conn->mu);
    expected = conn->closing || conn->lost;
  }
  conn->cv.notify_all();
  if (!expected) {
    Lose(conn, rank,
         "rank " + std::to_string(rank) + " at " + link.address + ": Step stream closed");
  }
}

void WorkerGroup::Lose(const std::shared_ptr<Connection>& conn, int rank, const std::string& reason,
                       bool notify) {
  std::lock_guard<std::mutex> lock(mu_);
  {
    {
      std::lock_guard<std::mutex> conn_lock(conn->mu);
      if (conn->lost || conn->closing) return;
      conn->lost = true;
      conn->reason = reason;
      for (auto& link : conn->links) link->context.TryCancel();
    }
    conn->cv.notify_all();
    if (conn_ == conn) {
      conn_.reset();
      retired_.push_back(conn);
    }
    const uint64_t epoch = rendezvous_->ResetGroup();
    state_.ready = false;
    state_.epoch = 0;
    state_.kv = KvCapacity();
    state_.reason = reason;
    metrics_->group_losses.Increment();
    if (rank >= 0) metrics_->rank(rank).failures->Increment();
    for (auto& link : conn->links) metrics_->rank(link->rank).up->Set(0);
    LOG(WARNING) << "worker group: epoch " << conn->epoch << " lost: " << reason
                 << "; waiting for the group to re-register in epoch " << epoch;
  }
  if (notify && lost_callback_) lost_callback_(reason);
}

StatusOr<std::vector<v1::StepResponse>> WorkerGroup::Step(v1::StepRequest request) {
  std::lock_guard<std::mutex> step_lock(step_mu_);
  std::shared_ptr<Connection> conn;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!state_.ready || !conn_) {
      return Unavailable("no worker group is ready: " + state_.reason);
    }
    conn = conn_;
  }
  request.set_step_id(++conn->next_step_id);
  for (auto& link : conn->links) {
    if (!link->stream->Write(request)) {
      Lose(conn, link->rank,
           "rank " + std::to_string(link->rank) + " at " + link->address +
               ": Step stream closed while sending");
      std::lock_guard<std::mutex> lock(conn->mu);
      return Unavailable(conn->reason);
    }
  }
  std::unique_lock<std::mutex> lock(conn->mu);
  auto answered = [&] {
    for (auto& link : conn->links) {
      if (link->responses.empty()) return false;
    }
    return true;
  };
  const bool in_time =
      conn->cv.wait_for(lock, options_.step_timeout, [&] { return conn->lost || answered(); });
  if (conn->lost) return Unavailable(conn->reason);
  if (!in_time) {
    int silent = -1;
    std::string ranks;
    for (auto& link : conn->links) {
      if (!link->responses.empty()) continue;
      if (silent < 0) silent = link->rank;
      ranks += (ranks.empty() ? "" : ",") + std::to_string(link->rank);
    }
    lock.unlock();
    const std::string reason = "step " + std::to_string(request.step_id()) +
                               ": no answer from rank(s) " + ranks + " within " +
                               Ms(options_.step_timeout);
    Lose(conn, silent, reason);
    return Unavailable(reason);
  }
  std::vector<v1::StepResponse> out;
  out.reserve(conn->links.size());
  std::string broken;
  int blame = -1;
  for (auto& link : conn->links) {
    out.push_back(std::move(link->responses.front()));
    link->responses.pop_front();
    const v1::StepResponse& r = out.back();
    if (!broken.empty()) continue;
    if (r.fatal()) {
      // The rank lost its state (its reader declares the group lost too).
      broken = "rank " + std::to_string(link->rank) + " lost its state: " + r.error_message();
      blame = link->rank;
    } else if (r.step_id() != request.step_id()) {
      broken = "rank " + std::to_string(link->rank) + " answered step " +
               std::to_string(r.step_id()) + " to step " + std::to_string(request.step_id());
    }
  }
  lock.unlock();
  if (!broken.empty()) {
    Lose(conn, blame, broken);
    return Unavailable(broken);
  }
  const int64_t now_ns = Clock::now().time_since_epoch().count();
  for (size_t i = 0; i < out.size(); ++i) {
    conn->links[i]->kv_published_ns.store(now_ns);
    PublishKv(conn->links[i]->rank, out[i].kv());
  }
  return out;
}

Status WorkerGroup::ShutdownWorkers() {
  std::shared_ptr<Connection> conn;
  {
    std::lock_guard<std::mutex> lock(mu_);
    conn = conn_;
  }
  if (!conn) return Status::Ok();
  {
    std::lock_guard<std::mutex> lock(conn->mu);
    if (conn->lost) return Status::Ok();
    conn->closing = true;
  }
  v1::StepRequest request;
  request.set_shutdown(true);
  Status result = Status::Ok();
  {
    std::lock_guard<std::mutex> step_lock(step_mu_);
    request.set_step_id(++conn->next_step_id);
    for (auto& link : conn->links) link->stream->Write(request);
    std::unique_lock<std::mutex> lock(conn->mu);
    const bool done = conn->cv.wait_for(lock, options_.step_timeout, [&] {
      for (auto& link : conn->links) {
        if (link->responses.empty()) return false;
      }
      return true;
    });
    if (!done) result = Unavailable("not every rank confirmed the shutdown");
    for (auto& link : conn->links) link->context.TryCancel();
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (conn_ == conn) {
    conn_.reset();
    retired_.push_back(conn);
  }
  // A new epoch, so the monitor does not reconnect to the registrations of the old group.
  rendezvous_->ResetGroup();
  state_.ready = false;
  state_.epoch = 0;
  state_.reason = "the workers were shut down";
  for (auto& link : conn->links) metrics_->rank(link->rank).up->Set(0);
  LOG(INFO) << "worker group: epoch " << conn->epoch << " shut down";
  return result;
}

void WorkerGroup::PublishKv(int rank, const v1::KvUsage& kv) {
  CoordinatorMetrics::Rank& m = metrics_->rank(rank);
  m.kv_total_bytes->Set(static_cast<double>(kv.total_bytes()));
  m.kv_free_bytes->Set(static_cast<double>(kv.free_bytes()));
  m.kv_cached_tokens->Set(static_cast<double>(kv.cached_tokens()));
  m.kv_sequences->Set(kv.sequences());
}

void WorkerGroup::JoinRetired() {
  std::vector<std::shared_ptr<Connection>> retired;
  {
    std::lock_guard<std::mutex> lock(mu_);
    retired.swap(retired_);
  }
  for (auto& conn : retired) {
    for (auto& link : conn->links) {
      if (link->reader.joinable()) link->reader.join();
      if (link->stream) {
        grpc::Status s = link->stream->Finish();
        VLOG(1) << "worker group: rank " << link->rank << " stream finished: " << s.error_message();
      }
    }
  }
}

}  // namespace deja::coordinator
