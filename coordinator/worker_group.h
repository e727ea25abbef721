// WorkerGroup: the gRPC EngineClient. Watches the Rendezvous service for a complete group of
// registered ranks, waits until each reports it is loaded and warmed up in that epoch, opens
// one long-lived Worker.Step stream per rank and runs steps over them. It detects a lost group
// by a closed stream, a fatal step response, a step timeout, or missed heartbeats (GetStatus
// polling), then fails the step in flight, starts a new rendezvous epoch (so the restarted
// group meets under fresh keys) and tells the launcher through the lost callback. Serving
// resumes when a complete group has registered in the new epoch and warmed up.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/engine_client.h"
#include "coordinator/metrics.h"
#include "coordinator/rendezvous_service.h"

namespace deja::coordinator {

struct WorkerGroupOptions {
  int world_size = 1;
  // A step with no answer from every rank in this time loses the group.
  std::chrono::milliseconds step_timeout{2500};
  // GetStatus polling period, and how long a rank may go without a successful answer.
  std::chrono::milliseconds heartbeat_interval{250};
  std::chrono::milliseconds heartbeat_timeout{1500};
  // Sent on every Worker call (Step, GetStatus); the workers refuse calls without it.
  std::string group_secret;
  // Of the channels to the workers (mutual TLS or plaintext).
  proto::InternalCredentials credentials;
};

class WorkerGroup final : public EngineClient {
 public:
  using LostCallback = std::function<void(const std::string& reason)>;

  // `rendezvous` and `metrics` outlive the group. Starts the monitor thread.
  WorkerGroup(const WorkerGroupOptions& options, coordinator::RendezvousService* rendezvous,
              CoordinatorMetrics* metrics);
  ~WorkerGroup() override;
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Called (from an internal thread, under the group's lock: it must only signal) each time
  // the coordinator declares the group lost.
  void SetLostCallback(LostCallback callback);
  // The launcher saw a worker exit (or is restarting the group): the connected group, if any,
  // is lost, and the rendezvous starts a new epoch. Returns once no old registration remains,
  // so workers started afterwards join the new epoch.
  void DeclareLost(const std::string& reason);
  // Sends a shutdown step (workers answer and exit 0) and closes the streams without treating
  // it as a loss (no lost callback); the rendezvous starts a new epoch. No-op without a ready
  // group.
  Status ShutdownWorkers();

  int world_size() const override { return options_.world_size; }
  GroupState State() const override;
  StatusOr<std::vector<v1::StepResponse>> Step(v1::StepRequest request) override;

 private:
  struct Connection;
  struct RankLink;

  void Monitor();
  // Polls a registered but not yet connected group; connects once every rank is warmed up.
  void TryConnect();
  void Heartbeat(const std::shared_ptr<Connection>& conn);
  // Marks `conn` lost (first call wins), cancels its streams, resets the rendezvous epoch and,
  // when `notify`, runs the lost callback (under mu_, so it never runs after a later
  // DeclareLost). `rank` < 0 when no single rank is to blame.
  void Lose(const std::shared_ptr<Connection>& conn, int rank, const std::string& reason,
            bool notify = true);
  void ReadLoop(std::shared_ptr<Connection> conn, int rank);
  // Sets the rank's KV gauges.
  void PublishKv(int rank, const v1::KvUsage& kv);
  void JoinRetired();

  const WorkerGroupOptions options_;
  coordinator::RendezvousService* rendezvous_;
  CoordinatorMetrics* metrics_;

  mutable std::mutex mu_;
  std::condition_variable cv_;  // wakes the monitor (stop)
  bool stop_ = false;
  GroupState state_;
  std::shared_ptr<Connection> conn_;                  // the ready group
  std::vector<std::shared_ptr<Connection>> retired_;  // lost groups whose threads to join
  LostCallback lost_callback_;
  // A registered group being polled before it is ready (monitor thread only).
  std::shared_ptr<Connection> pending_;

  std::mutex step_mu_;  // one step at a time
  std::thread monitor_;
};

}  // namespace deja::coordinator
