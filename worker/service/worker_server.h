// WorkerServer: one tensor-parallel rank as a process. Serves deja.v1.Worker on its own address
// (GetStatus from the first moment, Step once warmed up), registers with the coordinator's
// Rendezvous, builds the group's communicator through it (keys under the group epoch: shared
// memory when every CPU rank is on this host, else Gloo; NCCL on GPUs), loads its shard,
// runs one warm-up step, then answers the coordinator's Step stream until it is stopped, told to
// shut down, or a collective fails (then it exits non-zero so the launcher restarts the group).
#pragma once

#include <grpcpp/server.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "common/status.h"
#include "kernels/backend.h"
#include "proto/internal_plane.h"
#include "worker/comm/key_value_store.h"
#include "worker/model/model.h"
#include "worker/prefix/importance.h"

namespace deja::worker::comm {
class Communicator;
}
namespace deja::worker::prefix {
class PrefixStore;
}

namespace deja::worker::service {

class StepEngine;
class WorkerServiceImpl;

// How CPU ranks reach each other (`--cpu-comm`): shared memory when every rank of the group is
// on this host and Gloo (TCP) otherwise, or one of the two whatever the hosts.
enum class CpuComm { kAuto, kShm, kGloo };
StatusOr<CpuComm> ParseCpuComm(const std::string& text);

struct WorkerOptions {
  std::string model_dir;
  int rank = 0;
  int world_size = 1;
  std::string coordinator;  // host:port of the Rendezvous (the internal listener)
  // Sent on every Rendezvous call and required of every Worker call (proto/internal_plane.h);
  // empty runs without one.
  std::string group_secret;
  // Mutual TLS of this worker's listener and of its calls to the coordinator; none: plaintext.
  proto::InternalTlsFiles internal_tls;
  std::string listen = "127.0.0.1:0";  // port 0: any free port
  // Registered with the coordinator; empty: the listen host with the bound port (the host name
  // when listening on every interface).
  std::string advertise;
  int threads = 0;  // CPU threads, 0 = one per core
  Device device = Device::Host();  // --device: the CPU, or a GPU (weights, KV pool, compute)
  uint64_t kv_memory_bytes = 1ull << 30;
  std::chrono::milliseconds connect_timeout{60000};     // reaching the coordinator
  std::chrono::milliseconds collective_timeout{30000};  // rendezvous and collectives
  // Once warmed up, the worker exits (UNAVAILABLE) when no call has come from its coordinator
  // for this long (it sends GetStatus every 250 ms): the coordinator was killed, stopped or cut
  // off, and a rank cannot rejoin a group, so the supervisor (the launcher, Kubernetes) starts
  // a new one. 0: wait for ever.
  std::chrono::milliseconds coordinator_timeout{10000};
  std::string gloo_hostname = "127.0.0.1";              // where Gloo listens
  CpuComm cpu_comm = CpuComm::kAuto;
  // Deja Vu: predictors or oracle mode (neither: every step dense, SequenceConfig.sparse is
  // refused), and what requests that leave Sparsity.mode unspecified get (reported to the
  // coordinator in WorkerStatus).
  model::SparsityOptions sparsity;
  bool sparsity_default = false;
  model::LoadOptions load;  // --dtype
  // Locret retaining heads (Model::EnableRetaining); empty: none, the LOCRET policy is refused.
  std::string retaining_heads;
  // Prefix cache (worker/prefix/prefix_store.h): on when the KV memory is paged. Its disk tier
  // is a directory (this rank's files in rank<N>/ under it); empty: memory and host tiers only.
  bool prefix_cache = true;
  std::string prefix_cache_dir;
  // How a sequence told to (SequenceConfig.prefix_important) reads a prefix from the host or
  // disk tier: per layer, the tokens its probe heads choose.
  prefix::ImportanceOptions prefix_importance;
  bool sparsity_requested() const {
    return !sparsity.predictors.empty() || sparsity.oracle_fraction > 0.0f;
  }
};

class WorkerServer {
 public:
  explicit WorkerServer(WorkerOptions options);
  ~WorkerServer();
  WorkerServer(const WorkerServer&) = delete;
  WorkerServer& operator=(const WorkerServer&) = delete;

  // Starts, then serves until Stop(), a shutdown step, or a fatal error. OK for the first two;
  // the error (start-up failure or failed collective) otherwise.
  Status Run();
  // Asks Run() to return (thread-safe, from any thread, before or during Run()).
  void Stop();

 private:
  friend class WorkerServiceImpl;

  Status StartGrpc();
  StatusOr<uint64_t> Register();
  Status LoadAndWarmUp(uint64_t epoch);
  // The model and what comes with it (predictors, retaining heads); the prefix cache's store.
  // Their failures are load failures (load_failed()).
  Status LoadModelFiles(std::unique_ptr<comm::Communicator> comm);
  Status OpenPrefixStore(std::unique_ptr<prefix::PrefixStore>* out);
  // Shared memory or Gloo, as --cpu-comm says; `kind` names the one built, for the log.
  StatusOr<std::unique_ptr<comm::Communicator>> MakeCpuCommunicator(comm::KeyValueStore& store,
                                                                    const std::string& prefix,
                                                                    std::string* kind);
  // Wakes Run() with the outcome; the first call wins.
  void Finish(Status status);
  bool finished() const;

 public:
  // Whether Run() failed because the model could not be loaded (kExitCannotLoad).
  bool load_failed() const { return load_failed_.load(); }

 private:

  WorkerOptions options_;
  proto::InternalCredentials credentials_;  // loaded by Run()
  std::string address_;
  const std::chrono::steady_clock::time_point started_;
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<StepEngine> engine_;
  std::unique_ptr<WorkerServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::atomic<bool> load_failed_{false};
  Status outcome_;
};

}  // namespace deja::worker::service
