#include "coordinator/delivery.h"

#include <utility>

namespace deja::coordinator {

class DeliveryQueue::QueuedSink final : public RequestSink {
 public:
  QueuedSink(std::shared_ptr<RequestSink> sink, DeliveryQueue* queue)
      : sink_(std::move(sink)), queue_(queue) {}
  void OnMessage(v1::GenerateStreamResponse message) override {
    queue_->Post(
        [sink = sink_, m = std::move(message)]() mutable { sink->OnMessage(std::move(m)); });
  }
  void OnError(const Status& status) override {
    queue_->Post([sink = sink_, status] { sink->OnError(status); });
  }

 private:
  std::shared_ptr<RequestSink> sink_;
  DeliveryQueue* queue_;
};

DeliveryQueue::DeliveryQueue() : thread_([this] { Run(); }) {}

DeliveryQueue::~DeliveryQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_ptr<RequestSink> DeliveryQueue::Wrap(std::shared_ptr<RequestSink> sink) {
  return std::make_shared<QueuedSink>(std::move(sink), this);
}

void DeliveryQueue::Post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(fn));
    ++posted_;
  }
  cv_.notify_one();
}

void DeliveryQueue::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t target = posted_;
  done_cv_.wait(lock, [&] { return delivered_ >= target; });
}

void DeliveryQueue::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_, and everything delivered
    // Take what is there and deliver it without the lock, so the engine can post meanwhile.
    std::deque<std::function<void()>> batch;
    batch.swap(queue_);
    lock.unlock();
    for (auto& fn : batch) fn();
    lock.lock();
    delivered_ += batch.size();
    done_cv_.notify_all();
  }
}

}  // namespace deja::coordinator
