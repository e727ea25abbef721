#include "coordinator/rendezvous_service.h"

#include <glog/logging.h>

#include <algorithm>

#include "proto/grpc_status.h"

namespace deja::coordinator {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kCancelPoll(50);

}  // namespace

RendezvousService::RendezvousService(uint32_t world_size, std::string group_secret,
                                     RendezvousLimits limits)
    : world_size_(world_size),
      limits_(limits),
      auth_(std::move(group_secret), "coordinator (Rendezvous)") {}

RendezvousService::~RendezvousService() { Shutdown(); }

uint64_t RendezvousService::group_epoch() const {
  std::lock_guard<std::mutex> lock(mu_);
  return epoch_;
}

StatusOr<uint64_t> RendezvousService::RegisterWorker(uint32_t rank, uint32_t world_size,
                                                     const std::string& address, uint32_t pid) {
  if (world_size != world_size_) {
    return InvalidArgument("world_size " + std::to_string(world_size) +
                           " differs from the coordinator's " + std::to_string(world_size_));
  }
  if (rank >= world_size_) {
    return InvalidArgument("rank " + std::to_string(rank) + " is not below world_size " +
                           std::to_string(world_size_));
  }
  if (address.empty()) return InvalidArgument("address must be set");
  if (address.size() > limits_.max_key_bytes) {
    return InvalidArgument("address has " + std::to_string(address.size()) +
                           " bytes, more than max_key_bytes " +
                           std::to_string(limits_.max_key_bytes));
  }
  uint64_t epoch = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_) return Unavailable("rendezvous is shutting down");
    auto it = members_.find(rank);
    if (it != members_.end() && (it->second.address != address || it->second.pid != pid)) {
      return Status(StatusCode::kAlreadyExists, "rank " + std::to_string(rank) + " is held by " +
                                                    it->second.address + " (pid " +
                                                    std::to_string(it->second.pid) +
                                                    ") in group epoch " + std::to_string(epoch_));
    }
    members_[rank] = Member{rank, address, pid};
    epoch = epoch_;
  }
  cv_.notify_all();
  LOG(INFO) << "rendezvous: rank " << rank << "/" << world_size_ << " at " << address << " (pid "
            << pid << ") joined group epoch " << epoch;
  return epoch;
}

uint64_t RendezvousService::ResetGroup() {
  uint64_t epoch = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    epoch = ++epoch_;
    members_.clear();
    values_.clear();
    bytes_ = 0;
  }
  cv_.notify_all();
  LOG(INFO) << "rendezvous: group reset, new epoch " << epoch;
  return epoch;
}

std::vector<RendezvousService::Member> RendezvousService::Members() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Member> out;
  for (const auto& [rank, m] : members_) out.push_back(m);
  return out;
}

StatusOr<std::vector<RendezvousService::Member>> RendezvousService::WaitForMembers(
    std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  DEJA_RETURN_IF_ERROR(WaitUntil(
      lock, [&] { return members_.size() == world_size_; }, timeout, {},
      [&] {
        std::string missing;
        for (uint32_t r = 0; r < world_size_; ++r) {
          if (members_.count(r)) continue;
          if (!missing.empty()) missing += ",";
          missing += std::to_string(r);
        }
        return "ranks " + missing + " to register";
      }));
  std::vector<Member> out;
  for (const auto& [rank, m] : members_) out.push_back(m);
  return out;
}

Status RendezvousService::CheckKey(const std::string& key) const {
  if (key.size() > limits_.max_key_bytes) {
    return ResourceExhausted("rendezvous: key of " + std::to_string(key.size()) +
                             " bytes is longer than max_key_bytes " +
                             std::to_string(limits_.max_key_bytes));
  }
  return Status::Ok();
}

Status RendezvousService::SetValue(const std::string& key, std::string value) {
  DEJA_RETURN_IF_ERROR(CheckKey(key));
  if (value.size() > limits_.max_value_bytes) {
    return ResourceExhausted("rendezvous: value of " + std::to_string(value.size()) +
                             " bytes for key '" + key + "' is larger than max_value_bytes " +
                             std::to_string(limits_.max_value_bytes));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_) return Unavailable("rendezvous is shutting down");
    auto it = values_.find(key);
    const size_t old_bytes = it == values_.end() ? 0 : key.size() + it->second.size();
    if (it == values_.end() && values_.size() >= limits_.max_keys) {
      return ResourceExhausted("rendezvous: the store holds max_keys " +
                               std::to_string(limits_.max_keys) + " keys");
    }
    const size_t new_total = bytes_ - old_bytes + key.size() + value.size();
    if (new_total > limits_.max_total_bytes) {
      return ResourceExhausted("rendezvous: storing '" + key + "' would hold " +
                               std::to_string(new_total) + " bytes, more than max_total_bytes " +
                               std::to_string(limits_.max_total_bytes));
    }
    bytes_ = new_total;
    if (it == values_.end()) {
      values_.emplace(key, std::move(value));
    } else {
      it->second = std::move(value);
    }
  }
  cv_.notify_all();
  VLOG(1) << "rendezvous: set " << key;
  return Status::Ok();
}

StatusOr<std::string> RendezvousService::GetValue(const std::string& key,
                                                  std::chrono::milliseconds timeout,
                                                  const std::function<bool()>& cancelled) {
  DEJA_RETURN_IF_ERROR(CheckKey(key));
  std::unique_lock<std::mutex> lock(mu_);
  DEJA_RETURN_IF_ERROR(BlockingWait(
      lock, [&] { return values_.count(key) > 0; }, timeout, cancelled,
      [&] { return "key '" + key + "'"; }));
  return values_.at(key);
}

Status RendezvousService::WaitKeys(const std::vector<std::string>& keys,
                                   std::chrono::milliseconds timeout,
                                   const std::function<bool()>& cancelled) {
  if (keys.size() > limits_.max_keys) {
    return ResourceExhausted("rendezvous: waiting for " + std::to_string(keys.size()) +
                             " keys, more than max_keys " + std::to_string(limits_.max_keys));
  }
  for (const std::string& k : keys) DEJA_RETURN_IF_ERROR(CheckKey(k));
  std::unique_lock<std::mutex> lock(mu_);
  auto first_missing = [&]() -> const std::string* {
    for (const std::string& k : keys) {
      if (!values_.count(k)) return &k;
    }
    return nullptr;
  };
  return BlockingWait(
      lock, [&] { return first_missing() == nullptr; }, timeout, cancelled,
      [&] { return "key '" + *first_missing() + "'"; });
}

RendezvousService::Usage RendezvousService::usage() const {
  std::lock_guard<std::mutex> lock(mu_);
  Usage u;
  u.keys = values_.size();
  u.bytes = bytes_;
  for (const auto& [k, v] : values_) {
    u.largest_key = std::max(u.largest_key, k.size());
    u.largest_value = std::max(u.largest_value, v.size());
  }
  u.blocking_calls = blocking_calls_;
  u.peak_blocking_calls = peak_blocking_calls_;
  return u;
}

void RendezvousService::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
  }
  cv_.notify_all();
}

Status RendezvousService::WaitUntil(std::unique_lock<std::mutex>& lock,
                                    const std::function<bool()>& ready,
                                    std::chrono::milliseconds timeout,
                                    const std::function<bool()>& cancelled,
                                    const std::function<std::string()>& what) {
  const bool bounded = timeout.count() > 0;
  const Clock::time_point deadline = Clock::now() + timeout;
  while (!ready()) {
    if (shutdown_) return Unavailable("rendezvous is shutting down");
    if (cancelled && cancelled()) return Status(StatusCode::kCancelled, "call cancelled");
    const Clock::time_point now = Clock::now();
    if (bounded && now >= deadline) {
      return Status(StatusCode::kDeadlineExceeded, "rendezvous: timed out after " +
                                                       std::to_string(timeout.count()) +
                                                       " ms waiting for " + what());
    }
    Clock::time_point until = now + kCancelPoll;
    if (bounded && deadline < until) until = deadline;
    cv_.wait_until(lock, until);
  }
  return Status::Ok();
}

Status RendezvousService::BlockingWait(std::unique_lock<std::mutex>& lock,
                                       const std::function<bool()>& ready,
                                       std::chrono::milliseconds timeout,
                                       const std::function<bool()>& cancelled,
                                       const std::function<std::string()>& what) {
  if (ready()) return Status::Ok();
  if (shutdown_) return Unavailable("rendezvous is shutting down");
  if (blocking_calls_ >= limits_.max_blocking_calls) {
    return ResourceExhausted("rendezvous: " + std::to_string(blocking_calls_) +
                             " Get/Wait calls are waiting already, the max_blocking_calls");
  }
  if (timeout.count() <= 0 || timeout > limits_.max_wait) timeout = limits_.max_wait;
  ++blocking_calls_;
  peak_blocking_calls_ = std::max(peak_blocking_calls_, blocking_calls_);
  Status s = WaitUntil(lock, ready, timeout, cancelled, what);
  --blocking_calls_;
  return s;
}

grpc::Status RendezvousService::Register(grpc::ServerContext* ctx,
                                         const deja::v1::RegisterRequest* req,
                                         deja::v1::RegisterResponse* resp) {
  if (grpc::Status a = auth_.Check(*ctx, "Rendezvous.Register"); !a.ok()) return a;
  StatusOr<uint64_t> epoch =
      RegisterWorker(req->rank(), req->world_size(), req->address(), req->pid());
  if (!epoch.ok()) return proto::ToGrpc(epoch.status());
  resp->set_group_epoch(*epoch);
  return grpc::Status::OK;
}

grpc::Status RendezvousService::Set(grpc::ServerContext* ctx, const deja::v1::SetRequest* req,
                                    deja::v1::SetResponse*) {
  if (grpc::Status a = auth_.Check(*ctx, "Rendezvous.Set"); !a.ok()) return a;
  if (req->key().empty()) return {grpc::StatusCode::INVALID_ARGUMENT, "key must be set"};
  return proto::ToGrpc(SetValue(req->key(), req->value()));
}

grpc::Status RendezvousService::Get(grpc::ServerContext* ctx, const deja::v1::GetRequest* req,
                                    deja::v1::GetResponse* resp) {
  if (grpc::Status a = auth_.Check(*ctx, "Rendezvous.Get"); !a.ok()) return a;
  StatusOr<std::string> v = GetValue(req->key(), std::chrono::milliseconds(req->timeout_ms()),
                                     [ctx] { return ctx->IsCancelled(); });
  if (!v.ok()) return proto::ToGrpc(v.status());
  resp->set_value(std::move(*v));
  return grpc::Status::OK;
}

grpc::Status RendezvousService::Wait(grpc::ServerContext* ctx, const deja::v1::WaitRequest* req,
                                     deja::v1::WaitResponse*) {
  if (grpc::Status a = auth_.Check(*ctx, "Rendezvous.Wait"); !a.ok()) return a;
  std::vector<std::string> keys(req->keys().begin(), req->keys().end());
  return proto::ToGrpc(WaitKeys(keys, std::chrono::milliseconds(req->timeout_ms()),
                                [ctx] { return ctx->IsCancelled(); }));
}

}  // namespace deja::coordinator
