// RendezvousService: blocking Get/Wait with timeouts, cancellation and shutdown; Register's
// validation, idempotence and group epochs; the store's limits (keys, bytes, value and key size,
// blocking calls, the longest wait); the group secret on every RPC; and GrpcStore reaching it
// over loopback gRPC, good enough for Gloo, and for the same-host check and the shared-memory
// communicator, to build a group of 8 through it within the default limits.
#include "coordinator/rendezvous_service.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <future>
#include <memory>
#include <thread>

#include "proto/internal_plane.h"
#include "tests/worker_service/grpc_rendezvous.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/host_identity.h"
#include "worker/comm/shm_communicator.h"
#include "worker/service/grpc_store.h"

namespace deja::coordinator {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST(RendezvousServiceTest, GetBlocksUntilSet) {
  RendezvousService rv(2);
  auto got = std::async(std::launch::async, [&] { return rv.GetValue("k", 5000ms); });
  EXPECT_EQ(got.wait_for(100ms), std::future_status::timeout);
  ASSERT_TRUE(rv.SetValue("k", std::string("v\0x", 3)).ok());
  StatusOr<std::string> v = got.get();
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, std::string("v\0x", 3));
  ASSERT_TRUE(rv.SetValue("k", "w").ok());  // overwrite
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
  ASSERT_TRUE(rv.SetValue("a", "1").ok());
  Status w = rv.WaitKeys({"a", "b"}, 100ms);
  EXPECT_EQ(w.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(w.message().find("'b'"), std::string::npos) << w.ToString();
}

TEST(RendezvousServiceTest, WaitReturnsWhenEveryKeyExists) {
  RendezvousService rv(2);
  auto waited = std::async(std::launch::async, [&] { return rv.WaitKeys({"a", "b"}, 0ms); });
  ASSERT_TRUE(rv.SetValue("a", "1").ok());
  EXPECT_EQ(waited.wait_for(100ms), std::future_status::timeout);
  ASSERT_TRUE(rv.SetValue("b", "2").ok());
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

  ASSERT_TRUE(rv.SetValue("epoch1/key", "old").ok());
  EXPECT_EQ(rv.ResetGroup(), 2u);
  EXPECT_EQ(rv.group_epoch(), 2u);
  EXPECT_TRUE(rv.Members().empty());
  EXPECT_EQ(rv.GetValue("epoch1/key", 10ms).status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(*rv.RegisterWorker(0, 2, "h:9", 11), 2u);  // the restarted rank
  StatusOr<std::vector<RendezvousService::Member>> partial = rv.WaitForMembers(50ms);
  EXPECT_EQ(partial.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(partial.status().message().find("ranks 1"), std::string::npos);
}

// Contains `needle`, for messages that must name the limit they hit.
bool Names(const Status& s, const std::string& needle) {
  return s.message().find(needle) != std::string::npos;
}

TEST(RendezvousServiceTest, StoreLimitsAreResourceExhaustedNamingTheLimit) {
  RendezvousLimits l;
  l.max_keys = 3;
  l.max_total_bytes = 60;
  l.max_value_bytes = 20;
  l.max_key_bytes = 8;
  RendezvousService rv(2, "", l);
  Status s = rv.SetValue("123456789", "v");
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Names(s, "max_key_bytes")) << s.ToString();
  s = rv.SetValue("k", std::string(21, 'x'));
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Names(s, "max_value_bytes")) << s.ToString();
  ASSERT_TRUE(rv.SetValue("a", std::string(20, 'x')).ok());  // 21 bytes with its key
  ASSERT_TRUE(rv.SetValue("b", std::string(20, 'x')).ok());  // 42
  s = rv.SetValue("c", std::string(20, 'x'));                // 63
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Names(s, "max_total_bytes")) << s.ToString();
  EXPECT_EQ(rv.usage().bytes, 42u);
  ASSERT_TRUE(rv.SetValue("c", "1").ok());  // 44, the third key
  s = rv.SetValue("d", "1");
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Names(s, "max_keys")) << s.ToString();
  // An overwrite adds no key and is charged only the difference.
  ASSERT_TRUE(rv.SetValue("a", "short").ok());
  EXPECT_EQ(rv.usage().bytes, 29u);
  ASSERT_TRUE(rv.SetValue("a", std::string(20, 'q')).ok());
  EXPECT_EQ(rv.usage().bytes, 44u);
  EXPECT_EQ(*rv.GetValue("a", 1ms), std::string(20, 'q'));
  // Key limits hold for reads too, and a Wait on more keys than the store can hold is refused.
  EXPECT_TRUE(Names(rv.GetValue("123456789", 1ms).status(), "max_key_bytes"));
  s = rv.WaitKeys({"a", "b", "c", "d"}, 1ms);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Names(s, "max_keys")) << s.ToString();
  EXPECT_EQ(rv.RegisterWorker(0, 2, std::string(9, 'h'), 1).status().code(),
            StatusCode::kInvalidArgument);
  // A new epoch frees everything.
  rv.ResetGroup();
  EXPECT_EQ(rv.usage().keys, 0u);
  EXPECT_EQ(rv.usage().bytes, 0u);
  EXPECT_TRUE(rv.SetValue("d", "1").ok());
}

TEST(RendezvousServiceTest, BlockingCallsAreBoundedInNumberAndTime) {
  RendezvousLimits l;
  l.max_blocking_calls = 2;
  l.max_wait = 300ms;
  RendezvousService rv(2, "", l);
  ASSERT_TRUE(rv.SetValue("here", "1").ok());
  // No limit asked, or more than max_wait: both end after max_wait.
  auto unbounded = std::async(std::launch::async, [&] { return rv.GetValue("x", 0ms); });
  auto longer = std::async(std::launch::async, [&] { return rv.WaitKeys({"y"}, 60s); });
  const Clock::time_point t0 = Clock::now();
  while (rv.usage().blocking_calls < 2 && Clock::now() - t0 < 2s) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(rv.usage().blocking_calls, 2);
  // A third waiter is refused at once, naming the limit; a read that need not wait is not.
  StatusOr<std::string> third = rv.GetValue("z", 10s);
  EXPECT_EQ(third.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Names(third.status(), "max_blocking_calls")) << third.status().ToString();
  EXPECT_EQ(rv.WaitKeys({"z"}, 10s).code(), StatusCode::kResourceExhausted);
  EXPECT_LT(Clock::now() - t0, 250ms);
  EXPECT_EQ(*rv.GetValue("here", 10s), "1");
  EXPECT_TRUE(rv.WaitKeys({"here"}, 10s).ok());
  EXPECT_EQ(unbounded.get().status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(longer.get().code(), StatusCode::kDeadlineExceeded);
  EXPECT_GE(Clock::now() - t0, 250ms);
  EXPECT_LT(Clock::now() - t0, 3s);
  // The slots are free again.
  EXPECT_EQ(rv.usage().blocking_calls, 0);
  EXPECT_EQ(rv.usage().peak_blocking_calls, 2);
  EXPECT_EQ(rv.GetValue("z", 20ms).status().code(), StatusCode::kDeadlineExceeded);
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

// Each Rendezvous method once, with `secret` attached when not empty; the codes in the order
// Register, Set, Get, Wait.
std::vector<grpc::StatusCode> CallEveryMethod(deja::v1::Rendezvous::Stub& stub,
                                              const std::string& secret) {
  auto ctx = [&] {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + 5s);
    proto::AttachGroupSecret(c.get(), secret);
    return c;
  };
  std::vector<grpc::StatusCode> codes;
  deja::v1::RegisterRequest reg;
  reg.set_rank(0);
  reg.set_world_size(2);
  reg.set_address("127.0.0.1:9");
  reg.set_pid(1);
  deja::v1::RegisterResponse reg_resp;
  codes.push_back(stub.Register(ctx().get(), reg, &reg_resp).error_code());
  deja::v1::SetRequest set;
  set.set_key("epoch1/gloo/0");
  set.set_value("x");
  deja::v1::SetResponse set_resp;
  codes.push_back(stub.Set(ctx().get(), set, &set_resp).error_code());
  deja::v1::GetRequest get;
  get.set_key("epoch1/gloo/0");
  get.set_timeout_ms(100);
  deja::v1::GetResponse get_resp;
  codes.push_back(stub.Get(ctx().get(), get, &get_resp).error_code());
  deja::v1::WaitRequest wait;
  wait.add_keys("epoch1/gloo/0");
  wait.set_timeout_ms(100);
  deja::v1::WaitResponse wait_resp;
  codes.push_back(stub.Wait(ctx().get(), wait, &wait_resp).error_code());
  return codes;
}

TEST(GrpcRendezvousTest, EveryCallNeedsTheGroupSecret) {
  const std::string secret = *proto::GenerateGroupSecret();
  GrpcRendezvous rv(2, secret);
  auto stub = deja::v1::Rendezvous::NewStub(rv.Channel());
  const std::vector<grpc::StatusCode> refused(4, grpc::StatusCode::UNAUTHENTICATED);
  // None, a wrong one, a prefix of the right one, the right one with a byte more.
  for (const std::string& wrong :
       {std::string(), std::string(64, '0'), secret.substr(0, 63), secret + "0"}) {
    EXPECT_EQ(CallEveryMethod(*stub, wrong), refused) << "secret '" << wrong << "'";
  }
  EXPECT_EQ(rv.service().refused_calls(), 16u);
  EXPECT_TRUE(rv.service().Members().empty());
  EXPECT_EQ(rv.service().usage().keys, 0u);
  const std::vector<grpc::StatusCode> ok(4, grpc::StatusCode::OK);
  EXPECT_EQ(CallEveryMethod(*stub, secret), ok);
  EXPECT_EQ(rv.service().Members().size(), 1u);
  // The workers' client sends it.
  GrpcStore store(rv.Channel(), 5s, secret);
  EXPECT_EQ(*store.Get("epoch1/gloo/0", 100ms), "x");
  GrpcStore without(rv.Channel(), 5s);
  EXPECT_EQ(without.Get("epoch1/gloo/0", 100ms).status().code(), StatusCode::kUnauthenticated);
}

TEST(GrpcRendezvousTest, AFloodOfWaitingGetsIsRefusedBeyondTheLimit) {
  const std::string secret = *proto::GenerateGroupSecret();
  RendezvousLimits l;
  l.max_blocking_calls = 8;
  l.max_wait = 1s;
  GrpcRendezvous rv(2, secret, l);
  constexpr int kCalls = 100;
  std::vector<std::future<std::pair<grpc::StatusCode, Clock::duration>>> calls;
  for (int i = 0; i < kCalls; ++i) {
    calls.push_back(std::async(std::launch::async, [&] {
      auto stub = deja::v1::Rendezvous::NewStub(rv.Channel());
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + 30s);
      proto::AttachGroupSecret(&ctx, secret);
      deja::v1::GetRequest req;
      req.set_key("never");  // timeout_ms 0: no limit asked
      deja::v1::GetResponse resp;
      const Clock::time_point t0 = Clock::now();
      const grpc::StatusCode code = stub->Get(&ctx, req, &resp).error_code();
      return std::make_pair(code, Clock::now() - t0);
    }));
  }
  int waited = 0, refused = 0;
  for (auto& c : calls) {
    const auto [code, took] = c.get();
    if (code == grpc::StatusCode::DEADLINE_EXCEEDED) {
      ++waited;
      EXPECT_LT(took, 5s);
    } else {
      EXPECT_EQ(code, grpc::StatusCode::RESOURCE_EXHAUSTED);
      ++refused;
    }
  }
  EXPECT_GE(waited, 8);  // the slots may serve another waiter once one times out
  EXPECT_GE(refused, kCalls / 2);
  EXPECT_EQ(waited + refused, kCalls);
  EXPECT_EQ(rv.service().usage().peak_blocking_calls, 8);
}

TEST(GrpcStoreTest, GlooGroupOfEightFitsTheDefaultLimits) {
  constexpr int kRanks = 8;
  const std::string secret = *proto::GenerateGroupSecret();
  GrpcRendezvous rv(kRanks, secret);
  std::vector<std::thread> ranks;
  std::vector<Status> status(kRanks);
  std::vector<float> sums(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      // Started apart, as processes are, so the early ranks wait for the late ones' keys.
      std::this_thread::sleep_for(r * 30ms);
      GrpcStore store(rv.Channel(), 10s, secret);
      worker::comm::GlooOptions o;
      o.rank = r;
      o.world_size = kRanks;
      o.timeout = 30s;
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
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r].ToString();
    EXPECT_EQ(sums[r], kRanks * (kRanks + 1) / 2.f);
  }
  // What a real group stores (quoted in rendezvous_service.h), against the defaults.
  const RendezvousService::Usage u = rv.service().usage();
  const RendezvousLimits d;
  std::printf(
      "8-rank Gloo rendezvous: %zu keys, %zu bytes, largest key %zu, largest value %zu, "
      "at most %d blocking calls at once\n",
      u.keys, u.bytes, u.largest_key, u.largest_value, u.peak_blocking_calls);
  EXPECT_GE(u.peak_blocking_calls, 1);  // the staggered start made ranks wait
  EXPECT_LE(u.keys * 32, d.max_keys);
  EXPECT_LE(u.bytes * 64, d.max_total_bytes);
  EXPECT_LE(u.largest_value * 64, d.max_value_bytes);
  EXPECT_LE(u.largest_key * 8, d.max_key_bytes);
  EXPECT_LE(u.peak_blocking_calls * 4, d.max_blocking_calls);
}

// What a CPU worker does by default: the same-host check, then the shared-memory rendezvous.
TEST(GrpcStoreTest, ShmGroupOfEightFitsTheDefaultLimits) {
  constexpr int kRanks = 8;
  const std::string secret = *proto::GenerateGroupSecret();
  GrpcRendezvous rv(kRanks, secret);
  std::vector<std::thread> ranks;
  std::vector<Status> status(kRanks);
  std::vector<float> sums(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      std::this_thread::sleep_for(r * 30ms);
      GrpcStore store(rv.Channel(), 10s, secret);
      auto host = worker::comm::CheckSameHost(store, "epoch1/host", r, kRanks, 30s);
      status[r] = host.status();
      if (!host.ok()) return;
      EXPECT_TRUE(host->same) << host->detail;
      worker::comm::ShmOptions o;
      o.rank = r;
      o.world_size = kRanks;
      o.timeout = 30s;
      o.key_prefix = "epoch1/shm";
      auto c = worker::comm::MakeShmCommunicator(store, o);
      status[r] = c.status();
      if (!c.ok()) return;
      float x = static_cast<float>(r + 1);
      status[r] = (*c)->AllReduceSum(&x, 1);
      sums[r] = x;
    });
  }
  for (std::thread& t : ranks) t.join();
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r].ToString();
    EXPECT_EQ(sums[r], kRanks * (kRanks + 1) / 2.f);
  }
  const RendezvousService::Usage u = rv.service().usage();
  const RendezvousLimits d;
  std::printf(
      "8-rank host check + shm rendezvous: %zu keys, %zu bytes, largest key %zu, largest value "
      "%zu, at most %d blocking calls at once\n",
      u.keys, u.bytes, u.largest_key, u.largest_value, u.peak_blocking_calls);
  EXPECT_LE(u.keys * 32, d.max_keys);
  EXPECT_LE(u.bytes * 64, d.max_total_bytes);
  EXPECT_LE(u.largest_value * 64, d.max_value_bytes);
  EXPECT_LE(u.largest_key * 8, d.max_key_bytes);
  EXPECT_LE(u.peak_blocking_calls * 4, d.max_blocking_calls);
}

}  // namespace
}  // namespace deja::coordinator
