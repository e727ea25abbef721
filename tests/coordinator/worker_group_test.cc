// WorkerGroup against fake Worker services over real gRPC: it connects once every registered
// rank is warmed up, runs steps, and declares the group lost (new rendezvous epoch, lost
// callback) on a closed stream, a hung step, missed heartbeats or a fatal response; a group
// registered in the new epoch is served again. Every Worker call carries the group secret.
#include "coordinator/worker_group.h"

#include <gtest/gtest.h>

#include "fake_worker.h"

namespace deja::coordinator {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

class WorkerGroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    metrics_ = std::make_unique<CoordinatorMetrics>(&registry_, ModelInfoLabels{"m", "f16", 2});
    rendezvous_ = std::make_unique<coordinator::RendezvousService>(2);
    options_.world_size = 2;
    options_.step_timeout = milliseconds(400);
    options_.heartbeat_interval = milliseconds(50);
    options_.heartbeat_timeout = milliseconds(400);
    group_ = std::make_unique<WorkerGroup>(options_, rendezvous_.get(), metrics_.get());
    group_->SetLostCallback([this](const std::string&) { ++lost_calls_; });
  }
  // Replaces the group with one built from options_.
  void Rebuild() {
    group_.reset();
    group_ = std::make_unique<WorkerGroup>(options_, rendezvous_.get(), metrics_.get());
    group_->SetLostCallback([this](const std::string&) { ++lost_calls_; });
  }
  void TearDown() override {
    group_.reset();
    workers_.clear();
  }
  // Starts two fake ranks and registers them in the current epoch; with `secret`, they require
  // it.
  void StartGroup(bool warmed = true, const std::string& secret = "") {
    workers_.clear();
    const uint64_t epoch = rendezvous_->group_epoch();
    for (int r = 0; r < 2; ++r) {
      workers_.push_back(std::make_unique<test::FakeWorker>(r, 2, epoch));
      workers_.back()->warmed_up = warmed;
      if (!secret.empty()) workers_.back()->RequireSecret(secret);
      ASSERT_TRUE(
          rendezvous_->RegisterWorker(r, 2, workers_.back()->address(), workers_.back()->pid())
              .ok());
    }
  }
  bool WaitReady(bool ready, milliseconds timeout = milliseconds(5000)) {
    const auto end = Clock::now() + timeout;
    while (Clock::now() < end) {
      if (group_->State().ready == ready) return true;
      std::this_thread::sleep_for(milliseconds(5));
    }
    return group_->State().ready == ready;
  }
  static v1::StepRequest OneSequence() {
    v1::StepRequest req;
    v1::SequenceWork* w = req.add_sequences();
    w->set_seq_id(5);
    w->add_tokens(2);
    w->set_sample(true);
    return req;
  }

  metrics::Registry registry_;
  std::unique_ptr<CoordinatorMetrics> metrics_;
  std::unique_ptr<coordinator::RendezvousService> rendezvous_;
  WorkerGroupOptions options_;
  std::unique_ptr<WorkerGroup> group_;
  std::vector<std::unique_ptr<test::FakeWorker>> workers_;
  std::atomic<int> lost_calls_{0};
};

TEST_F(WorkerGroupTest, ReadyOnlyWhenEveryRankIsWarmAndStepsRoundTrip) {
  EXPECT_FALSE(group_->State().ready);
  EXPECT_EQ(group_->Step(OneSequence()).status().code(), StatusCode::kUnavailable);
  StartGroup(/*warmed=*/false);
  // Registration, then the warm-up poll (slow under sanitizers): wait for it to be reported.
  for (int i = 0; i < 500 && group_->State().reason.find("warming up") == std::string::npos; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  GroupState s = group_->State();
  EXPECT_FALSE(s.ready);
  EXPECT_NE(s.reason.find("warming up"), std::string::npos) << s.reason;
  workers_[0]->warmed_up = true;
  workers_[1]->warmed_up = true;
  ASSERT_TRUE(WaitReady(true));
  s = group_->State();
  EXPECT_EQ(s.epoch, rendezvous_->group_epoch());
  EXPECT_EQ(s.kv.total_bytes, 1u << 20);  // the smaller rank
  EXPECT_EQ(s.kv.bytes_per_token, 101u);  // the larger cost
  for (int i = 0; i < 3; ++i) {
    StatusOr<std::vector<v1::StepResponse>> r = group_->Step(OneSequence());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->size(), 2u);
    EXPECT_EQ((*r)[0].rank(), 0u);
    EXPECT_EQ((*r)[1].rank(), 1u);
    EXPECT_EQ((*r)[0].step_id(), (*r)[1].step_id());
    ASSERT_EQ((*r)[0].results_size(), 1);
    EXPECT_EQ((*r)[0].results(0).token_id(), 7);
  }
  EXPECT_EQ(lost_calls_.load(), 0);
}

TEST_F(WorkerGroupTest, ClosedStreamLosesTheGroupAndANewEpochIsServed) {
  StartGroup();
  ASSERT_TRUE(WaitReady(true));
  const uint64_t epoch = rendezvous_->group_epoch();
  workers_[1]->Stop();
  const auto t0 = Clock::now();
  StatusOr<std::vector<v1::StepResponse>> r = group_->Step(OneSequence());
  if (r.ok()) r = group_->Step(OneSequence());  // the close may land after one step
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_LT(Clock::now() - t0, milliseconds(1000));
  ASSERT_TRUE(WaitReady(false));
  EXPECT_GT(rendezvous_->group_epoch(), epoch);
  EXPECT_EQ(lost_calls_.load(), 1);
  EXPECT_TRUE(rendezvous_->Members().empty());

  StartGroup();
  ASSERT_TRUE(WaitReady(true));
  EXPECT_EQ(group_->State().epoch, rendezvous_->group_epoch());
  EXPECT_TRUE(group_->Step(OneSequence()).ok());
}

TEST_F(WorkerGroupTest, HungStepTimesOut) {
  StartGroup();
  ASSERT_TRUE(WaitReady(true));
  workers_[0]->hang_steps = true;
  const auto t0 = Clock::now();
  StatusOr<std::vector<v1::StepResponse>> r = group_->Step(OneSequence());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("no answer"), std::string::npos) << r.status().message();
  EXPECT_LT(Clock::now() - t0, options_.step_timeout + milliseconds(500));
  EXPECT_FALSE(group_->State().ready);
  EXPECT_EQ(lost_calls_.load(), 1);
}

TEST_F(WorkerGroupTest, MissedHeartbeatsLoseAnIdleGroup) {
  StartGroup();
  ASSERT_TRUE(WaitReady(true));
  workers_[1]->hang_status = true;
  const auto t0 = Clock::now();
  ASSERT_TRUE(WaitReady(false, milliseconds(3000)));
  EXPECT_LT(Clock::now() - t0, options_.heartbeat_timeout + milliseconds(1000));
  EXPECT_NE(group_->State().reason.find("heartbeat"), std::string::npos) << group_->State().reason;
  const std::string m = registry_.Serialize();
  EXPECT_NE(m.find("deja_worker_failures_total{rank=\"1\"} 1"), std::string::npos) << m;
}

TEST_F(WorkerGroupTest, FatalResponseLosesTheGroup) {
  StartGroup();
  ASSERT_TRUE(WaitReady(true));
  workers_[1]->fatal_next = true;
  EXPECT_EQ(group_->Step(OneSequence()).status().code(), StatusCode::kUnavailable);
  EXPECT_FALSE(group_->State().ready);
}

TEST_F(WorkerGroupTest, DeclareLostResetsWithoutCallingBack) {
  StartGroup();
  ASSERT_TRUE(WaitReady(true));
  const uint64_t epoch = rendezvous_->group_epoch();
  group_->DeclareLost("launcher restart");
  EXPECT_FALSE(group_->State().ready);
  EXPECT_GT(rendezvous_->group_epoch(), epoch);
  EXPECT_EQ(lost_calls_.load(), 0);
}

TEST_F(WorkerGroupTest, ShutdownIsNotALoss) {
  StartGroup();
  ASSERT_TRUE(WaitReady(true));
  const uint64_t epoch = rendezvous_->group_epoch();
  EXPECT_TRUE(group_->ShutdownWorkers().ok());
  EXPECT_TRUE(workers_[0]->saw_shutdown.load());
  EXPECT_TRUE(workers_[1]->saw_shutdown.load());
  EXPECT_FALSE(group_->State().ready);
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(lost_calls_.load(), 0);
  EXPECT_GT(rendezvous_->group_epoch(), epoch);  // the old registrations are not reused
  EXPECT_FALSE(group_->State().ready);
}

TEST_F(WorkerGroupTest, EveryWorkerCallCarriesTheGroupSecret) {
  const std::string secret(64, 'k');
  // Without the secret the ranks answer nothing: the group never becomes ready.
  StartGroup(/*warmed=*/true, secret);
  for (int i = 0; i < 500 && (workers_[0]->refused() == 0 ||
                              group_->State().reason.find("no group secret") == std::string::npos);
       ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_FALSE(WaitReady(true, milliseconds(300)));
  EXPECT_NE(group_->State().reason.find("no group secret"), std::string::npos)
      << group_->State().reason;
  EXPECT_GT(workers_[0]->refused(), 0u);
  // With it: connects, steps, heartbeats and the shutdown step all pass.
  options_.group_secret = secret;
  group_->DeclareLost("restart with the secret");
  Rebuild();
  StartGroup(/*warmed=*/true, secret);
  ASSERT_TRUE(WaitReady(true)) << group_->State().reason;
  StatusOr<std::vector<v1::StepResponse>> r = group_->Step(OneSequence());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::this_thread::sleep_for(options_.heartbeat_timeout + milliseconds(100));
  EXPECT_TRUE(group_->State().ready) << group_->State().reason;
  EXPECT_TRUE(group_->ShutdownWorkers().ok());
  EXPECT_TRUE(workers_[1]->saw_shutdown.load());
  EXPECT_EQ(workers_[0]->refused(), 0u);
  EXPECT_EQ(workers_[1]->refused(), 0u);
}

}  // namespace
}  // namespace deja::coordinator
