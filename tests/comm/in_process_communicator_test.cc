// The in-process communicator: the collective grid against references for worlds 1-4, the
// all-reduce equal to a serial rank-order sum bit for bit, rejected calls that leave the group
// usable, and a peer that leaves or never arrives turning into an error instead of a hang.
#include "worker/comm/in_process_communicator.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "tests/comm/collective_check.h"
#include "worker/comm/timed_communicator.h"

namespace deja::worker::comm {
namespace {

using namespace std::chrono_literals;
using Group = std::vector<std::unique_ptr<comm::Communicator>>;

Group MakeGroup(int world, std::chrono::milliseconds timeout = 30s) {
  auto g = MakeInProcessGroup(world, timeout);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? std::move(*g) : Group{};
}

// Runs fn(rank) on one thread per rank.
void OnEveryRank(int world, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back(fn, r);
  for (std::thread& t : threads) t.join();
}

class InProcessWorldTest : public ::testing::TestWithParam<int> {};

TEST_P(InProcessWorldTest, CollectivesMatchReference) {
  const int world = GetParam();
  std::vector<uint64_t> digests;
  for (int run = 0; run < 2; ++run) {
    Group g = MakeGroup(world);
    ASSERT_EQ(static_cast<int>(g.size()), world);
    std::vector<test_util::CheckResult> results(world);
    OnEveryRank(world, [&](int r) { results[r] = test_util::CheckCollectives(*g[r]); });
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(g[r]->rank(), r);
      EXPECT_EQ(g[r]->world_size(), world);
      EXPECT_TRUE(results[r].problems.empty()) << "rank " << r << ": " << results[r].problems[0];
      EXPECT_EQ(results[r].digest, results[0].digest) << "ranks disagree bitwise";
    }
    digests.push_back(results[0].digest);
  }
  EXPECT_EQ(digests[0], digests[1]) << "results differ between runs";
}

TEST_P(InProcessWorldTest, AllReduceIsTheSerialRankOrderSum) {
  const int world = GetParam();
  const int64_t n = 1001;
  Group g = MakeGroup(world);
  std::vector<std::vector<float>> data;
  for (int r = 0; r < world; ++r) data.push_back(test_util::RankData(r, n, 7));
  std::vector<float> want = data[0];
  for (int r = 1; r < world; ++r) {
    for (int64_t i = 0; i < n; ++i) want[i] += data[r][i];
  }
  OnEveryRank(world, [&](int r) { EXPECT_TRUE(g[r]->AllReduceSum(data[r].data(), n).ok()); });
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(0, std::memcmp(data[r].data(), want.data(), n * sizeof(float))) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, InProcessWorldTest, ::testing::Values(1, 2, 3, 4));

TEST(InProcessTest, StatsCountAllReduces) {
  Group g = MakeGroup(2);
  OnEveryRank(2, [&](int r) {
    std::vector<float> v(300, 1.0f);
    for (int i = 0; i < 5; ++i) EXPECT_TRUE(g[r]->AllReduceSum(v.data(), 300).ok());
    EXPECT_TRUE(g[r]->Barrier().ok());
  });
  for (int r = 0; r < 2; ++r) {
    std::optional<CollectiveStats> s = StatsOf(*g[r]);
    ASSERT_TRUE(s.has_value());
    EXPECT_EQ(s->all_reduce_calls, 5);
    EXPECT_EQ(s->all_reduce_floats, 1500);
    EXPECT_GT(s->all_reduce_seconds, 0);
  }
  // A communicator that is not one of the timed ones has no stats.
  class Plain : public comm::Communicator {
   public:
    int rank() const override { return 0; }
    int world_size() const override { return 1; }
    Status AllReduceSum(float*, int64_t) override { return Status::Ok(); }
    Status AllGather(const float*, int64_t, float*) override { return Status::Ok(); }
    Status Broadcast(void*, size_t, int) override { return Status::Ok(); }
    Status Barrier() override { return Status::Ok(); }
  };
  Plain plain;
  EXPECT_FALSE(StatsOf(plain).has_value());
}

TEST(InProcessTest, DisagreeingCallsAreRejectedAndTheGroupStaysUsable) {
  Group g = MakeGroup(3);
  OnEveryRank(3, [&](int r) {
    std::vector<float> v(10, 1.0f);
    Status s = g[r]->AllReduceSum(v.data(), r == 1 ? 9 : 10);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    s = g[r]->Broadcast(v.data(), 4, 3);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    s = g[r]->Broadcast(v.data(), 4, r);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_TRUE(g[r]->AllReduceSum(v.data(), 10).ok());
    EXPECT_EQ(v[0], 3.0f);
  });
}

TEST(InProcessTest, PeerThatLeavesFailsTheOthers) {
  Group g = MakeGroup(3, 30s);
  const auto start = std::chrono::steady_clock::now();
  std::vector<Status> got(2);
  std::thread a([&] { got[0] = g[0]->Barrier(); });
  std::thread b([&] { got[1] = g[1]->Barrier(); });
  std::this_thread::sleep_for(50ms);
  g[2].reset();
  a.join();
  b.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  for (const Status& s : got) {
    EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
    EXPECT_NE(s.message().find("rank 2"), std::string::npos) << s.ToString();
  }
}

TEST(InProcessTest, PeerThatNeverArrivesTimesOut) {
  Group g = MakeGroup(2, 200ms);
  std::vector<float> v(4, 1.0f);
  const auto start = std::chrono::steady_clock::now();
  Status s = g[0]->AllReduceSum(v.data(), 4);
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  // The group stays failed: the late rank gets the error at once instead of waiting alone.
  EXPECT_EQ(g[1]->Barrier().code(), StatusCode::kDeadlineExceeded);
}

TEST(InProcessTest, BadWorldIsInvalidArgument) {
  EXPECT_EQ(MakeInProcessGroup(0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeInProcessGroup(2, 0ms).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace deja::worker::comm
