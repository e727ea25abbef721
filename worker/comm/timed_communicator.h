// TimedCommunicator: the base of deja's communicators that accounts every all-reduce (calls,
// floats and wall seconds) for the per-rank all-reduce metrics. The counters are atomics so a
// metrics thread may read them while the model thread runs collectives.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>

#include "worker/comm/communicator.h"

namespace deja::worker::comm {

struct CollectiveStats {
  int64_t all_reduce_calls = 0;
  int64_t all_reduce_floats = 0;
  double all_reduce_seconds = 0;
};

class TimedCommunicator : public comm::Communicator {
 public:
  // Times DoAllReduceSum; failed calls count too (their time is spent all the same).
  Status AllReduceSum(float* data, int64_t n) final;

  CollectiveStats stats() const;
  void ResetStats();

 protected:
  TimedCommunicator() = default;
  // `wall_time` false: the calls are counted but their time is what the implementation reports
  // through AddSeconds (an asynchronous collective's wall time is only its enqueueing).
  explicit TimedCommunicator(bool wall_time) : wall_time_(wall_time) {}
  virtual Status DoAllReduceSum(float* data, int64_t n) = 0;
  void AddSeconds(double seconds) {
    nanos_.fetch_add(static_cast<int64_t>(seconds * 1e9), std::memory_order_relaxed);
  }

 private:
  std::atomic<int64_t> calls_{0};
  std::atomic<int64_t> floats_{0};
  std::atomic<int64_t> nanos_{0};
  bool wall_time_ = true;
};

// The stats of `comm` if it is one of deja's timed communicators, else nullopt (the solo one).
std::optional<CollectiveStats> StatsOf(const comm::Communicator& comm);

}  // namespace deja::worker::comm
