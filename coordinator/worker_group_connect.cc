// WorkerGroup::TryConnect: from a complete registration to a ready group (statuses polled
// until every rank is warmed up in the epoch, Step streams opened, an empty step answered).
#include <glog/logging.h>

#include <algorithm>

#include "coordinator/sparsity_mode.h"
#include "coordinator/worker_group_internal.h"

namespace deja::coordinator {

void WorkerGroup::TryConnect() {
  const int n = options_.world_size;
  const uint64_t epoch = rendezvous_->group_epoch();
  std::vector<coordinator::RendezvousService::Member> members = rendezvous_->Members();
  if (static_cast<int>(members.size()) < n) {
    std::lock_guard<std::mutex> lock(mu_);
    state_.reason = "waiting for ranks to register in epoch " + std::to_string(epoch) + " (" +
                    std::to_string(members.size()) + " of " + std::to_string(n) + ")";
    return;
  }
  const Clock::time_point now = Clock::now();
  if (!pending_ || pending_->epoch != epoch) {
    LOG(INFO) << "worker group: all " << n << " ranks registered in epoch " << epoch
              << "; waiting for them to warm up";
    pending_ = std::make_shared<Connection>();
    pending_->epoch = epoch;
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kMaxMessageBytes);
    args.SetMaxSendMessageSize(kMaxMessageBytes);
    std::sort(members.begin(), members.end(),
              [](const auto& a, const auto& b) { return a.rank < b.rank; });
    for (const auto& m : members) {
      auto link = std::make_unique<RankLink>();
      link->rank = static_cast<int>(m.rank);
      link->address = m.address;
      link->pid = m.pid;
      link->channel = options_.credentials.Channel(m.address, args);
      link->stub = v1::Worker::NewStub(link->channel);
      link->last_ok = now;
      pending_->links.push_back(std::move(link));
    }
  }
  std::shared_ptr<Connection> conn = pending_;
  std::vector<v1::WorkerStatus> statuses(n);
  std::string waiting;
  for (auto& link : conn->links) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + kHeartbeatCallLimit);
    proto::AttachGroupSecret(&ctx, options_.group_secret);
    v1::WorkerStatus& st = statuses[link->rank];
    grpc::Status s = link->stub->GetStatus(&ctx, v1::GetStatusRequest(), &st);
    if (s.ok()) link->last_ok = now;
    if (s.ok() && st.loaded() && st.warmed_up() && st.group_epoch() == epoch) continue;
    waiting += " rank " + std::to_string(link->rank) + " (" +
               (s.ok() ? (st.group_epoch() != epoch ? "other epoch"
                          : st.loaded()             ? "warming up"
                                                    : "loading")
                       : "unreachable: " + s.error_message()) +
               ")";
    if (now - link->last_ok > 4 * options_.heartbeat_timeout) {
      // A registered rank that never answers holds its slot; start over so a restarted
      // process can register again.
      const std::string reason = "rank " + std::to_string(link->rank) + " at " + link->address +
                                 " registered but is unreachable";
      LOG(WARNING) << "worker group: " << reason << "; resetting epoch " << epoch;
      metrics_->rank(link->rank).failures->Increment();
      pending_.reset();
      DeclareLost(reason);
      std::lock_guard<std::mutex> lock(mu_);
      if (lost_callback_) lost_callback_(reason);
      return;
    }
  }
  if (!waiting.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    state_.reason = "epoch " + std::to_string(epoch) + ": waiting for" + waiting;
    return;
  }
  pending_.reset();
  KvCapacity kv;
  kv.total_bytes = UINT64_MAX;
  kv.block_tokens = UINT32_MAX;
  bool sparsity_available = true, sparsity_default = true, locret_available = true;
  kv.prefix_cache = kv.prefix_disk = true;
  for (const v1::WorkerStatus& st : statuses) {
    kv.total_bytes = std::min<uint64_t>(kv.total_bytes, st.kv().total_bytes());
    kv.bytes_per_token = std::max<uint64_t>(kv.bytes_per_token, st.kv_bytes_per_token());
    // Paged admission only when every rank pages, in blocks of the same size.
    kv.block_tokens = kv.block_tokens == UINT32_MAX || kv.block_tokens == st.kv_block_tokens()
                          ? st.kv_block_tokens()
                          : 0;
    sparsity_available &= st.sparsity_available();
    sparsity_default &= st.sparsity_default();
    locret_available &= st.locret_available();
    kv.prefix_cache &= st.prefix_cache_available();
    kv.prefix_disk &= st.prefix_disk_available();
  }
  if (kv.block_tokens == UINT32_MAX) kv.block_tokens = 0;
  sparsity_default &= sparsity_available;
  if (sparsity_available) {
    LOG(INFO) << "worker group epoch " << epoch << ": Deja Vu sparsity available, default "
              << SparsityName(sparsity_default);
  }
  for (auto& link : conn->links) {
    proto::AttachGroupSecret(&link->context, options_.group_secret);
    link->stream = link->stub->Step(&link->context);
    link->evicted_seen = statuses[link->rank].kv().evicted_tokens_total();
  }
  conn->streams_open = true;
  for (auto& link : conn->links) {
    link->reader = std::thread([this, conn, r = link->rank] { ReadLoop(conn, r); });
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) {
      retired_.push_back(conn);
      std::lock_guard<std::mutex> conn_lock(conn->mu);
      conn->closing = true;
      for (auto& link : conn->links) link->context.TryCancel();
      return;
    }
    conn_ = conn;
    state_.ready = false;  // until the first empty step proves every stream
    state_.epoch = epoch;
  }
  // An empty step checks that every rank accepted its stream.
  StatusOr<std::vector<v1::StepResponse>> ping = [&] {
    std::lock_guard<std::mutex> lock(step_mu_);
    v1::StepRequest req;
    req.set_step_id(++conn->next_step_id);
    for (auto& link : conn->links) {
      if (!link->stream->Write(req))
        return StatusOr<std::vector<v1::StepResponse>>(
            Unavailable("rank " + std::to_string(link->rank) + " refused its Step stream"));
    }
    std::unique_lock<std::mutex> lock2(conn->mu);
    auto all = [&] {
      for (auto& link : conn->links) {
        if (link->responses.empty()) return false;
      }
      return true;
    };
    if (!conn->cv.wait_for(lock2, options_.step_timeout, [&] { return conn->lost || all(); }) ||
        conn->lost) {
      return StatusOr<std::vector<v1::StepResponse>>(
          Unavailable(conn->lost ? conn->reason : "no answer to the first step"));
    }
    std::vector<v1::StepResponse> out;
    for (auto& link : conn->links) {
      out.push_back(std::move(link->responses.front()));
      link->responses.pop_front();
    }
    return StatusOr<std::vector<v1::StepResponse>>(std::move(out));
  }();
  if (!ping.ok()) {
    Lose(conn, -1, "connecting to epoch " + std::to_string(epoch) + ": " + ping.status().message());
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (conn_ != conn) return;
  state_.ready = true;
  state_.kv = kv;
  state_.sparsity_available = sparsity_available;
  state_.sparsity_default = sparsity_default;
  state_.locret_available = locret_available;
  state_.weight_dtype = statuses[0].weight_dtype();
  state_.kv_dtype = statuses[0].kv_dtype();
  state_.reason.clear();
  for (auto& link : conn->links) {
    CoordinatorMetrics::Rank& m = metrics_->rank(link->rank);
    m.up->Set(1);
    m.last_heartbeat->Set(UnixNow());
    if (link->kv_published_ns.load() == 0) PublishKv(link->rank, statuses[link->rank].kv());
  }
  LOG(INFO) << "worker group: epoch " << epoch << " ready, " << n << " ranks, KV " << kv.total_bytes
            << " bytes per rank, " << kv.bytes_per_token << " bytes per position, "
            << (kv.block_tokens > 0
                    ? "paged in blocks of " + std::to_string(kv.block_tokens) + " positions"
                    : std::string("not paged"));
}

}  // namespace deja::coordinator
