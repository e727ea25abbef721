// RendezvousService: the server side of deja.v1.Rendezvous, hosted by the coordinator's gRPC
// server. Workers register (rank, address) and meet through its in-memory key-value store to
// build their communicator (Gloo's rendezvous keys, NCCL's unique id).
//
// Group epochs: the service starts at epoch 1. Every rank registering in an epoch gets that
// epoch back, and workers prefix their rendezvous keys with it. When the coordinator declares
// the group lost (a worker died or hung), it calls ResetGroup(): the epoch increases and the
// registrations are forgotten, so the restarted group meets under fresh keys and never reads a
// dead group's addresses. Old keys are dropped with the reset.
//
// Blocking calls (Get, Wait) wait on a condition variable, bounded by their timeout_ms, the RPC's
// deadline or cancellation (checked every 50 ms), and Shutdown().
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "deja/v1/worker.grpc.pb.h"

namespace deja::coordinator {

class RendezvousService final : public deja::v1::Rendezvous::Service {
 public:
  struct Member {
    uint32_t rank = 0;
    std::string address;  // host:port of the rank's Worker service
    uint32_t pid = 0;
  };

  explicit RendezvousService(uint32_t world_size);
  ~RendezvousService() override;

  uint32_t world_size() const { return world_size_; }
  uint64_t group_epoch() const;

  // Returns the epoch the rank joined. INVALID_ARGUMENT when rank >= world_size or world_size
  // differs; ALREADY_EXISTS when another (address, pid) holds the rank in this epoch. The same
  // (rank, address, pid) registering again gets the same epoch (a retried RPC).
  StatusOr<uint64_t> RegisterWorker(uint32_t rank, uint32_t world_size, const std::string& address,
                                    uint32_t pid);
  // Starts a new epoch: forgets registrations and keys, wakes waiters. Returns the new epoch.
  uint64_t ResetGroup();
  // Registered members of the current epoch, by rank.
  std::vector<Member> Members() const;
  // Blocks until every rank of the current epoch has registered; DEADLINE_EXCEEDED naming the
  // missing ranks.
  StatusOr<std::vector<Member>> WaitForMembers(std::chrono::milliseconds timeout);

  // The key-value store. `timeout` <= 0 waits without limit; `cancelled` (optional) is polled.
  void SetValue(const std::string& key, std::string value);
  StatusOr<std::string> GetValue(const std::string& key, std::chrono::milliseconds timeout,
                                 const std::function<bool()>& cancelled = {});
  Status WaitKeys(const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                  const std::function<bool()>& cancelled = {});

  // Wakes every blocked call with UNAVAILABLE and fails later ones; call before shutting the
  // gRPC server down so its handlers return.
  void Shutdown();

  // deja.v1.Rendezvous.
  grpc::Status Register(grpc::ServerContext* ctx, const deja::v1::RegisterRequest* req,
                        deja::v1::RegisterResponse* resp) override;
  grpc::Status Set(grpc::ServerContext* ctx, const deja::v1::SetRequest* req,
                   deja::v1::SetResponse* resp) override;
  grpc::Status Get(grpc::ServerContext* ctx, const deja::v1::GetRequest* req,
                   deja::v1::GetResponse* resp) override;
  grpc::Status Wait(grpc::ServerContext* ctx, const deja::v1::WaitRequest* req,
                    deja::v1::WaitResponse* resp) override;

 private:
  // Waits until `ready` holds (true), a timeout, cancellation or shutdown. Called with `lock`
  // held on mu_.
  Status WaitUntil(std::unique_lock<std::mutex>& lock, const std::function<bool()>& ready,
                   std::chrono::milliseconds timeout, const std::function<bool()>& cancelled,
                   const std::function<std::string()>& what);

  const uint32_t world_size_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t epoch_ = 1;
  bool shutdown_ = false;
  std::map<uint32_t, Member> members_;
  std::map<std::string, std::string> values_;
};

}  // namespace deja::coordinator
