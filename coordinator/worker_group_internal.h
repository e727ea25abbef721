// Private to the worker group's sources: one rank's channel and Step stream, and one group
// connection (the ranks of one rendezvous epoch).
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/worker_group.h"
#include "deja/v1/worker.grpc.pb.h"
#include "proto/internal_plane.h"

namespace deja::coordinator {

inline constexpr int kMaxMessageBytes = 64 << 20;
// A heartbeat call never waits longer than this, so one silent rank cannot delay the others'
// heartbeats past their timeout.
inline constexpr std::chrono::milliseconds kHeartbeatCallLimit(500);

inline double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

struct WorkerGroup::RankLink {
  int rank = 0;
  std::string address;
  uint32_t pid = 0;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Worker::Stub> stub;
  grpc::ClientContext context;  // of the Step stream
  std::unique_ptr<grpc::ClientReaderWriter<v1::StepRequest, v1::StepResponse>> stream;
  std::thread reader;
  // Under Connection::mu.
  std::deque<v1::StepResponse> responses;
  // Monitor thread only.
  Clock::time_point last_ok;
  uint64_t evicted_seen = 0;
  // When a step response last published this rank's KV usage (steady clock, ns): a heartbeat
  // sent before then carries an older view and must not overwrite it.
  std::atomic<int64_t> kv_published_ns{0};
};

struct WorkerGroup::Connection {
  uint64_t epoch = 0;
  std::vector<std::unique_ptr<RankLink>> links;
  std::mutex mu;
  std::condition_variable cv;
  bool lost = false;
  bool closing = false;  // shutdown asked: closed streams are expected
  bool streams_open = false;
  std::string reason;
  uint64_t next_step_id = 0;  // under step_mu_
};

}  // namespace deja::coordinator
