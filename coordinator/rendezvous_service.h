// RendezvousService: the server side of deja.v1.Rendezvous, hosted by the coordinator's
// internal gRPC server (never the public API port). Workers register (rank, address) and meet
// through its in-memory key-value store to build their communicator (Gloo's rendezvous keys,
// NCCL's unique id).
//
// Group epochs: the service starts at epoch 1. Every rank registering in an epoch gets that
// epoch back, and workers prefix their rendezvous keys with it. When the coordinator declares
// the group lost (a worker died or hung), it calls ResetGroup(): the epoch increases and the
// registrations are forgotten, so the restarted group meets under fresh keys and never reads a
// dead group's addresses. Old keys are dropped with the reset.
//
// Blocking calls (Get, Wait) wait on a condition variable, bounded by their timeout_ms (capped at
// RendezvousLimits::max_wait, also when they ask for none), the RPC's deadline or cancellation
// (checked every 50 ms), and Shutdown().
//
// Every RPC must carry the group secret when one is configured (proto/internal_plane.h), and the
// store is bounded (RendezvousLimits): a client that reaches the port can neither join the group
// nor exhaust the coordinator's memory or threads.
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
#include "proto/internal_plane.h"

namespace deja::coordinator {

// Beyond any of these a call fails with RESOURCE_EXHAUSTED naming the limit. What a real group
// needs, measured by GlooGroupOfEightFitsTheDefaultLimits (rendezvous_service_test.cc): a Gloo
// group of 8 ranks stores 16 keys (`epoch<E>/gloo/rank_<r>` and `epoch<E>/gloo/<r>`, at most 18
// bytes in epoch 1), 7,880 bytes in all, the largest value 952 bytes (a rank's addresses for its
// 7 peers), with up to 7 Get/Wait calls waiting at once (one per rank waiting for a later one).
// The defaults leave 64 times the keys, 500 times the bytes, 9 times the waiting calls.
struct RendezvousLimits {
  size_t max_keys = 1024;
  size_t max_total_bytes = 4 << 20;  // keys plus values
  size_t max_value_bytes = 256 << 10;
  size_t max_key_bytes = 256;  // also the longest address a rank may register
  // Get/Wait calls waiting at once; each holds a thread of the server.
  int max_blocking_calls = 64;
  // The longest a Get/Wait waits, also when its timeout_ms is 0 (no limit asked).
  std::chrono::milliseconds max_wait{300000};
};

class RendezvousService final : public deja::v1::Rendezvous::Service {
 public:
  struct Member {
    uint32_t rank = 0;
    std::string address;  // host:port of the rank's Worker service
    uint32_t pid = 0;
  };
  struct Usage {
    size_t keys = 0;
    size_t bytes = 0;  // keys plus values
    size_t largest_key = 0;
    size_t largest_value = 0;
    int blocking_calls = 0;
    int peak_blocking_calls = 0;  // since the service started
  };

  // `group_secret` empty: the RPCs accept callers without one (--insecure-internal).
  explicit RendezvousService(uint32_t world_size, std::string group_secret = "",
                             RendezvousLimits limits = {});
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

  // The key-value store. `timeout` <= 0 waits up to limits().max_wait, as does a longer one;
  // `cancelled` (optional) is polled. RESOURCE_EXHAUSTED beyond a limit.
  Status SetValue(const std::string& key, std::string value);
  StatusOr<std::string> GetValue(const std::string& key, std::chrono::milliseconds timeout,
                                 const std::function<bool()>& cancelled = {});
  Status WaitKeys(const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                  const std::function<bool()>& cancelled = {});

  Usage usage() const;
  const RendezvousLimits& limits() const { return limits_; }
  // Calls refused for a missing or wrong group secret.
  uint64_t refused_calls() const { return auth_.refused(); }

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
  // WaitUntil for a client's Get/Wait: returns at once when `ready` holds; otherwise counts the
  // call against max_blocking_calls and caps its timeout at max_wait.
  Status BlockingWait(std::unique_lock<std::mutex>& lock, const std::function<bool()>& ready,
                      std::chrono::milliseconds timeout, const std::function<bool()>& cancelled,
                      const std::function<std::string()>& what);
  Status CheckKey(const std::string& key) const;

  const uint32_t world_size_;
  const RendezvousLimits limits_;
  const proto::GroupSecretCheck auth_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t epoch_ = 1;
  bool shutdown_ = false;
  std::map<uint32_t, Member> members_;
  std::map<std::string, std::string> values_;
  size_t bytes_ = 0;  // keys plus values in values_
  int blocking_calls_ = 0;
  int peak_blocking_calls_ = 0;
};

}  // namespace deja::coordinator
