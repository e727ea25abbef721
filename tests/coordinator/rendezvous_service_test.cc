// RendezvousService: blocking Get/Wait with timeouts, cancellation and shutdown; Register's
// validation, idempotence and group epochs; and GrpcStore reaching it over loopback gRPC, good
// enough for Gloo to build a group through it.
#include "coordinator/rendezvous_service.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>

#include "tests/worker_service/grpc_rendezvous.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/service/grpc_store.h"

namespace deja::coordinator {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST(RendezvousServiceTest, GetBlocksUntilSet) {
  RendezvousService rv(2);
  auto got = std::async(std::launch::async, [&] { return rv.GetValue("k", 5000ms); });
  EXPECT_EQ(got.wait_for(100ms), std::future_status::timeout);
  rv.SetValue("k", std::string("v\0x", 3));
  StatusOr<std::string> v = got.get();
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, std::string("v\0x", 3));
  rv.SetValue("k", "w");  // overwrite
  EXPECT_EQ(*rv.GetValue("k", 1ms), "w");
}

TEST(RendezvousServiceTest, GetAndWaitTimeOutNamingTheKey) {
  RendezvousService rv(2);
  const Clock::time_point t0 = Clock::now();
  StatusOr<std::string> v = rv.GetValue("missing", 150ms);
  EXPECT_GE(Clock::now() - t0, 150ms);
  EXPECT_LT(Clock::now() - t0, 2s);
  EXPECT_EQ(v.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(v.status().message().find("missing"), std::string::npos);
  rv.SetValue("a", "1");
  Status w = rv.WaitKeys({"a", "b"}, 100ms);
  EXPECT_EQ(w.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(w.message().find("'b'"), std::string::npos) << w.ToString();
}

TEST(RendezvousServiceTest, WaitReturnsWhenEveryKeyExists) {
  RendezvousService rv(2);
  auto waited = std::async(std::launch::async, [&] { return rv.WaitKeys({"a", "b"}, 0ms); });
  rv.SetValue("a", "1");
  EXPECT_EQ(waited.wait_for(100ms), std::future_status::timeout);
  rv.SetValue("b", "2");
  EXPECT_TRUE(waited.get().ok());
}

TEST(RendezvousServiceTest, CancellationAndShutdownWakeWaiters) {
  RendezvousService rv(2);
  std::atomic<bool> cancel{false};
  auto cancelled = std::async(std::launch::async,
                              [&] { return rv.GetValue("x", 0ms, [&] { return cancel.load(); }); });
  auto unbounded = std::async(std::launch::async, [&] { return rv.WaitKeys({"y"}, 0ms); });
  std::this_thread::sleep_for(50ms);
  cancel = true;
  EXPECT_EQ(cancelled.get().status().code(), StatusCode::kCancelled);
  EXPECT_EQ(unbounded.wait_for(100ms), std::future_status::timeout);
  rv.Shutdown();
  ASSERT_EQ(unbounded.wait_for(2s), std::future_status::ready);
  EXPECT_EQ(unbounded.get().code(), StatusCode::kUnavailable);
}

TEST(RendezvousServiceTest, RegisterValidatesAndTracksEpochs) {
  RendezvousService rv(2);
  EXPECT_EQ(rv.RegisterWorker(0, 3, "h:1", 10).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rv.RegisterWorker(2, 2, "h:1", 10).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rv.RegisterWorker(0, 2, "", 10).status().code(), StatusCode::kInvalidArgument);
  auto waiting = std::async(std::launch::async, [&] { return rv.WaitForMembers(5s); });
  EXPECT_EQ(*rv.RegisterWorker(0, 2, "h:1", 10), 1u);
  EXPECT_EQ(*rv.RegisterWorker(0, 2, "h:1", 10), 1u);  // a retried RPC
  EXPECT_EQ(rv.RegisterWorker(0, 2, "h:9", 11).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(waiting.wait_for(50ms), std::future_status::timeout);
  EXPECT_EQ(*rv.RegisterWorker(1, 2, "h:2", 12), 1u);
  auto members = waiting.get();
  ASSERT_TRUE(members.ok());
  ASSERT_EQ(members->size(), 2u);
  EXPECT_EQ((*members)[1].address, "h:2");
  EXPECT_EQ((*members)[1].pid, 12u);

  rv.SetValue("epoch1/key", "old");
  EXPECT_EQ(rv.ResetGroup(), 2u);
  EXPECT_EQ(rv.group_epoch(), 2u);
  EXPECT_TRUE(rv.Members().empty());
  EXPECT_EQ(rv.GetValue("epoch1/key", 10ms).status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(*rv.RegisterWorker(0, 2, "h:9", 11), 2u);  // the restarted rank
  StatusOr<std::vector<RendezvousService::Member>> partial = rv.WaitForMembers(50ms);
  EXPECT_EQ(partial.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(partial.status().message().find("ranks 1"), std::string::npos);
}

using test_util::GrpcRendezvous;
using worker::service::GrpcStore;

TEST(GrpcStoreTest, SetGetWaitOverLoopback) {
  GrpcRendezvous rv(2);
  GrpcStore store(rv.Channel());
  auto got = std::async(std::launch::async, [&] { return store.Get("k", 5000ms); });
  std::this_thread::sleep_for(50ms);
  ASSERT_TRUE(store.Set("k", std::string("a\0b", 3)).ok());
  StatusOr<std::string> v = got.get();
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, std::string("a\0b", 3));
  EXPECT_TRUE(store.Wait({"k"}, 100ms).ok());
  Status w = store.Wait({"k", "nope"}, 100ms);
  EXPECT_EQ(w.code(), StatusCode::kDeadlineExceeded) << w.ToString();
  EXPECT_NE(w.message().find("nope"), std::string::npos);
  EXPECT_EQ(store.Get("nope", 100ms).status().code(), StatusCode::kDeadlineExceeded);
}

TEST(GrpcStoreTest, UnreachableCoordinatorIsAnError) {
  GrpcStore store(grpc::CreateChannel("127.0.0.1:1", grpc::InsecureChannelCredentials()), 500ms);
  EXPECT_FALSE(store.Set("k", "v").ok());
}

TEST(GrpcStoreTest, GlooBuildsAGroupThroughIt) {
  GrpcRendezvous rv(2);
  std::vector<std::thread> ranks;
  std::vector<Status> status(2);
  std::vector<float> sums(2);
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      GrpcStore store(rv.Channel());
      worker::comm::GlooOptions o;
      o.rank = r;
      o.world_size = 2;
      o.timeout = 20s;
      o.key_prefix = "epoch1/gloo";
      auto c = worker::comm::MakeGlooCommunicator(store, o);
      status[r] = c.status();
      if (!c.ok()) return;
      float x = static_cast<float>(r + 1);
      status[r] = (*c)->AllReduceSum(&x, 1);
      sums[r] = x;
    });
  }
  for (std::thread& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r].ToString();
    EXPECT_EQ(sums[r], 3.f);
  }
}

}  // namespace
}  // namespace deja::coordinator
