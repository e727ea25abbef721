// Hands requests' output to the RPC layer on a thread of its own, in the order it was produced.
// Writing a stream message runs gRPC's send path (a sendmsg and thread wake-ups) in the calling
// thread; called from the engine loop, that sat between a step's results and the next step:
// 15% of each step with 153 streams on opt-mini when measured (6% with this thread). Wrapped
// sinks post their calls here instead, and the loop goes straight on to the next step.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "coordinator/request.h"

namespace deja::coordinator {

class DeliveryQueue {
 public:
  DeliveryQueue();
  // Delivers everything posted so far, then stops the thread.
  ~DeliveryQueue();
  DeliveryQueue(const DeliveryQueue&) = delete;
  DeliveryQueue& operator=(const DeliveryQueue&) = delete;

  // A sink whose calls reach `sink` on the delivery thread, in order.
  std::shared_ptr<RequestSink> Wrap(std::shared_ptr<RequestSink> sink);
  // Returns once everything posted before the call has been delivered.
  void Flush();

 private:
  class QueuedSink;
  void Post(std::function<void()> fn);
  void Run();

  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t posted_ = 0, delivered_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace deja::coordinator
