#include "coordinator/rendezvous_service.h"

#include <glog/logging.h>

#include "proto/grpc_status.h"

namespace deja::coordinator {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kCancelPoll(50);

}  // namespace

RendezvousService::RendezvousService(uint32_t world_size) : world_size_(world_size) {}

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

void RendezvousService::SetValue(const std::string& key, std::string value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    values_[key] = std::move(value);
  }
  cv_.notify_all();
  VLOG(1) << "rendezvous: set " << key;
}

StatusOr<std::string> RendezvousService::GetValue(const std::string& key,
                                                  std::chrono::milliseconds timeout,
                                                  const std::function<bool()>& cancelled) {
  std::unique_lock<std::mutex> lock(mu_);
  DEJA_RETURN_IF_ERROR(WaitUntil(
      lock, [&] { return values_.count(key) > 0; }, timeout, cancelled,
      [&] { return "key '" + key + "'"; }));
  return values_.at(key);
}

Status RendezvousService::WaitKeys(const std::vector<std::string>& keys,
                                   std::chrono::milliseconds timeout,
                                   const std::function<bool()>& cancelled) {
  std::unique_lock<std::mutex> lock(mu_);
  auto first_missing = [&]() -> const std::string* {
    for (const std::string& k : keys) {
      if (!values_.count(k)) return &k;
    }
    return nullptr;
  };
  return WaitUntil(
      lock, [&] { return first_missing() == nullptr; }, timeout, cancelled,
      [&] { return "key '" + *first_missing() + "'"; });
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

grpc::Status RendezvousService::Register(grpc::ServerContext*, const deja::v1::RegisterRequest* req,
                                         deja::v1::RegisterResponse* resp) {
  StatusOr<uint64_t> epoch =
      RegisterWorker(req->rank(), req->world_size(), req->address(), req->pid());
  if (!epoch.ok()) return proto::ToGrpc(epoch.status());
  resp->set_group_epoch(*epoch);
  return grpc::Status::OK;
}

grpc::Status RendezvousService::Set(grpc::ServerContext*, const deja::v1::SetRequest* req,
                                    deja::v1::SetResponse*) {
  if (req->key().empty()) return {grpc::StatusCode::INVALID_ARGUMENT, "key must be set"};
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_) return {grpc::StatusCode::UNAVAILABLE, "rendezvous is shutting down"};
  }
  SetValue(req->key(), req->value());
  return grpc::Status::OK;
}

grpc::Status RendezvousService::Get(grpc::ServerContext* ctx, const deja::v1::GetRequest* req,
                                    deja::v1::GetResponse* resp) {
  StatusOr<std::string> v = GetValue(req->key(), std::chrono::milliseconds(req->timeout_ms()),
                                     [ctx] { return ctx->IsCancelled(); });
  if (!v.ok()) return proto::ToGrpc(v.status());
  resp->set_value(std::move(*v));
  return grpc::Status::OK;
}

grpc::Status RendezvousService::Wait(grpc::ServerContext* ctx, const deja::v1::WaitRequest* req,
                                     deja::v1::WaitResponse*) {
  std::vector<std::string> keys(req->keys().begin(), req->keys().end());
  return proto::ToGrpc(WaitKeys(keys, std::chrono::milliseconds(req->timeout_ms()),
                                [ctx] { return ctx->IsCancelled(); }));
}

}  // namespace deja::coordinator
