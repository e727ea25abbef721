// DeliveryQueue: wrapped sinks' calls arrive in the order they were made, on another thread;
// Flush returns only once everything posted before it has arrived; destroying the queue
// delivers what is still pending.
#include "coordinator/delivery.h"

#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace deja::coordinator {
namespace {

class SlowSink final : public RequestSink {
 public:
  void OnMessage(v1::GenerateStreamResponse message) override {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    std::lock_guard<std::mutex> lock(mu_);
    got_.push_back(std::to_string(message.generated_tokens()));
    threads_.push_back(std::this_thread::get_id());
  }
  void OnError(const Status& status) override {
    std::lock_guard<std::mutex> lock(mu_);
    got_.push_back("error:" + status.message());
    threads_.push_back(std::this_thread::get_id());
  }
  std::vector<std::string> got() {
    std::lock_guard<std::mutex> lock(mu_);
    return got_;
  }
  std::vector<std::thread::id> threads() {
    std::lock_guard<std::mutex> lock(mu_);
    return threads_;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> got_;
  std::vector<std::thread::id> threads_;
};

v1::GenerateStreamResponse Message(uint32_t n) {
  v1::GenerateStreamResponse m;
  m.set_generated_tokens(n);
  return m;
}

TEST(DeliveryQueueTest, InOrderOffTheCallingThreadAndFlushWaits) {
  DeliveryQueue queue;
  auto a = std::make_shared<SlowSink>(), b = std::make_shared<SlowSink>();
  std::shared_ptr<RequestSink> qa = queue.Wrap(a), qb = queue.Wrap(b);
  for (uint32_t i = 0; i < 20; ++i) {
    qa->OnMessage(Message(i));
    qb->OnMessage(Message(100 + i));
  }
  qa->OnError(Unavailable("gone"));
  // 41 calls of 200 us each have not all arrived by now.
  EXPECT_LT(a->got().size() + b->got().size(), 41u);
  queue.Flush();
  std::vector<std::string> want_a, want_b;
  for (uint32_t i = 0; i < 20; ++i) {
    want_a.push_back(std::to_string(i));
    want_b.push_back(std::to_string(100 + i));
  }
  want_a.push_back("error:gone");
  EXPECT_EQ(a->got(), want_a);
  EXPECT_EQ(b->got(), want_b);
  for (std::thread::id t : a->threads()) EXPECT_NE(t, std::this_thread::get_id());
}

TEST(DeliveryQueueTest, DestructionDeliversWhatIsPending) {
  auto a = std::make_shared<SlowSink>();
  {
    DeliveryQueue queue;
    std::shared_ptr<RequestSink> qa = queue.Wrap(a);
    for (uint32_t i = 0; i < 10; ++i) qa->OnMessage(Message(i));
  }
  EXPECT_EQ(a->got().size(), 10u);
}

}  // namespace
}  // namespace deja::coordinator
