#include "worker/comm/timed_communicator.h"

#include <chrono>

namespace deja::worker::comm {

Status TimedCommunicator::AllReduceSum(float* data, int64_t n) {
  const auto start = std::chrono::steady_clock::now();
  Status s = DoAllReduceSum(data, n);
  const auto nanos =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count();
  calls_.fetch_add(1, std::memory_order_relaxed);
  floats_.fetch_add(n, std::memory_order_relaxed);
  if (wall_time_) nanos_.fetch_add(nanos, std::memory_order_relaxed);
  return s;
}

CollectiveStats TimedCommunicator::stats() const {
  CollectiveStats s;
  s.all_reduce_calls = calls_.load(std::memory_order_relaxed);
  s.all_reduce_floats = floats_.load(std::memory_order_relaxed);
  s.all_reduce_seconds = static_cast<double>(nanos_.load(std::memory_order_relaxed)) * 1e-9;
  return s;
}

void TimedCommunicator::ResetStats() {
  calls_.store(0, std::memory_order_relaxed);
  floats_.store(0, std::memory_order_relaxed);
  nanos_.store(0, std::memory_order_relaxed);
}

std::optional<CollectiveStats> StatsOf(const comm::Communicator& comm) {
  const auto* timed = dynamic_cast<const TimedCommunicator*>(&comm);
  if (timed == nullptr) return std::nullopt;
  return timed->stats();
}

}  // namespace deja::worker::comm
