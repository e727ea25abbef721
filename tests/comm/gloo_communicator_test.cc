// The Gloo communicator on loopback: the collective grid for worlds 1-4 with ranks as threads
// and as separate processes (same digests: Gloo's ring order is fixed), rendezvous and option
// errors, and a peer that is killed (SIGKILL) or hangs (SIGSTOP) turning into an error Status on
// the survivors within seconds. Also prints the all-reduce latency of two processes.
#include "worker/comm/gloo_communicator.h"

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <vector>

#include "tests/comm/collective_check.h"
#include "tests/comm/process_util.h"
#include "tests/common/temp_dir.h"
#include "worker/comm/key_value_store.h"
#include "worker/comm/timed_communicator.h"

namespace deja::worker::comm {
namespace {

using namespace std::chrono_literals;
using test_util::ChildProcess;
using test_util::TempDir;
using Group = std::vector<std::unique_ptr<comm::Communicator>>;

// Builds a Gloo group of `world` ranks in this process, one thread per rank for the rendezvous.
Group MakeThreadGroup(KeyValueStore& store, int world, const std::string& prefix) {
  Group g(world);
  std::vector<Status> status(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      GlooOptions opt;
      opt.rank = r;
      opt.world_size = world;
      opt.key_prefix = prefix;
      opt.timeout = 20s;
      auto c = MakeGlooCommunicator(store, opt);
      status[r] = c.status();
      if (c.ok()) g[r] = std::move(*c);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_TRUE(status[r].ok()) << status[r].ToString();
  return g;
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str(), nullptr, false);
}

// Runs the collective grid on a thread group; checks it and returns the ranks' common digest.
uint64_t RunThreadGrid(KeyValueStore& store, int world, const std::string& prefix) {
  Group g = MakeThreadGroup(store, world, prefix);
  for (const auto& c : g) {
    EXPECT_NE(c, nullptr);
    if (c == nullptr) return 0;
  }
  std::vector<test_util::CheckResult> results(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] { results[r] = test_util::CheckCollectives(*g[r]); });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(g[r]->rank(), r);
    EXPECT_EQ(g[r]->world_size(), world);
    EXPECT_TRUE(results[r].problems.empty()) << "rank " << r << ": " << results[r].problems[0];
    EXPECT_EQ(results[r].digest, results[0].digest) << "ranks disagree bitwise";
    std::optional<CollectiveStats> stats = StatsOf(*g[r]);
    EXPECT_TRUE(stats.has_value());
    if (stats) {
      EXPECT_EQ(stats->all_reduce_calls, static_cast<int64_t>(test_util::CollectiveSizes().size()));
    }
  }
  return results[0].digest;
}

class GlooWorldTest : public ::testing::TestWithParam<int> {};

TEST_P(GlooWorldTest, ThreadsMatchReference) {
  auto store = MakeInMemoryStore();
  const uint64_t first = RunThreadGrid(*store, GetParam(), "run0");
  const uint64_t second = RunThreadGrid(*store, GetParam(), "run1");
  EXPECT_EQ(first, second) << "results differ between runs";
}

TEST_P(GlooWorldTest, ProcessesMatchReference) {
  const int world = GetParam();
  TempDir dir;
  std::vector<std::unique_ptr<ChildProcess>> peers;
  for (int r = 0; r < world; ++r) {
    const std::string rs = std::to_string(r);
    peers.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{DEJA_COMM_PEER, "check", rs, std::to_string(world),
                                 dir.File("store"), dir.File("out" + rs), "20000"},
        dir.File("log" + rs)));
  }
  std::vector<std::string> digests;
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(peers[r]->ExitCode(60s), 0) << "rank " << r << ":\n" << peers[r]->Log();
    nlohmann::json out = ReadJson(dir.File("out" + std::to_string(r)));
    ASSERT_TRUE(out.is_object()) << peers[r]->Log();
    EXPECT_TRUE(out["problems"].empty()) << out["problems"].dump();
    digests.push_back(out["digest"].get<std::string>());
  }
  for (int r = 1; r < world; ++r) EXPECT_EQ(digests[r], digests[0]) << "rank " << r;
  // The same additions in the same order as a thread group in this process: bitwise equal.
  auto store = MakeInMemoryStore();
  EXPECT_EQ(digests[0], std::to_string(RunThreadGrid(*store, world, "threads")));
}

INSTANTIATE_TEST_SUITE_P(Worlds, GlooWorldTest, ::testing::Values(1, 2, 3, 4));

TEST(GlooTest, BadOptionsAreInvalidArgument) {
  auto store = MakeInMemoryStore();
  GlooOptions opt;
  opt.rank = 2;
  opt.world_size = 2;
  EXPECT_EQ(MakeGlooCommunicator(*store, opt).status().code(), StatusCode::kInvalidArgument);
  opt.rank = 0;
  opt.timeout = 0ms;
  EXPECT_EQ(MakeGlooCommunicator(*store, opt).status().code(), StatusCode::kInvalidArgument);
}

TEST(GlooTest, MissingPeerAtRendezvousTimesOut) {
  auto store = MakeInMemoryStore();
  GlooOptions opt;
  opt.world_size = 2;
  opt.timeout = 300ms;
  const auto start = std::chrono::steady_clock::now();
  auto c = MakeGlooCommunicator(*store, opt);
  EXPECT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("rank 0 of 2"), std::string::npos) << c.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(GlooTest, BadRootIsInvalidArgument) {
  auto store = MakeInMemoryStore();
  Group g = MakeThreadGroup(*store, 1, "root");
  ASSERT_NE(g[0], nullptr);
  float x = 1;
  EXPECT_EQ(g[0]->Broadcast(&x, 4, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g[0]->Broadcast(&x, 4, -1).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(g[0]->Broadcast(&x, 4, 0).ok());
}

// Three ranks all-reduce in a loop; once all are running, `sig` hits rank 2. The other two must
// leave their loop with an error Status within `limit`.
void RunPeerFailure(int sig, const std::string& timeout_ms, std::chrono::milliseconds limit) {
  TempDir dir;
  const int world = 3;
  std::vector<std::unique_ptr<ChildProcess>> peers;
  for (int r = 0; r < world; ++r) {
    const std::string rs = std::to_string(r);
    peers.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{DEJA_COMM_PEER, "loop", rs, "3", dir.File("store"),
                                 dir.File("out" + rs), timeout_ms},
        dir.File("log" + rs)));
  }
  const auto ready_deadline = std::chrono::steady_clock::now() + 30s;
  for (int r = 0; r < world; ++r) {
    while (!std::ifstream(dir.File("out" + std::to_string(r) + ".ready")).good()) {
      ASSERT_LT(std::chrono::steady_clock::now(), ready_deadline) << peers[r]->Log();
      std::this_thread::sleep_for(10ms);
    }
  }
  const auto hit = std::chrono::steady_clock::now();
  peers[2]->Kill(sig);
  for (int r = 0; r < 2; ++r) {
    const int code = peers[r]->ExitCode(limit + 2s);
    const double after =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - hit).count();
    EXPECT_EQ(code, 3) << "rank " << r << ":\n"
                       << peers[r]->Log() << "\nrank " << 1 - r << ":\n"
                       << peers[1 - r]->Log() << "\nrank 2:\n"
                       << peers[2]->Log();
    EXPECT_LT(after, std::chrono::duration<double>(limit).count()) << "rank " << r;
    nlohmann::json out = ReadJson(dir.File("out" + std::to_string(r)));
    ASSERT_TRUE(out.is_object()) << peers[r]->Log();
    EXPECT_EQ(out["code"].get<int>(), static_cast<int>(StatusCode::kUnavailable)) << out.dump();
    std::cout << "rank " << r << " failed " << after
              << " s after the signal: " << out["error"].get<std::string>() << "\n";
  }
}

TEST(GlooProcessTest, KilledPeerFailsSurvivors) {
  // Survivors usually notice the killed peer's sockets within ~30 ms (a read error: "Connection
  // reset by peer"). Not always: Gloo's TCP transport (Debian's 2022 snapshot) moves a pair to
  // CLOSED on a plain FIN without failing the operations already pending on it, so a survivor
  // whose send or receive was posted to that pair (or to a survivor that has just exited) waits
  // for the collective timeout; seen in 2 of ~12 full CI runs and 1 of 40 runs on loaded cores,
  // a gdb stack in UnboundBuffer::waitSend. So the bound asserted is the timeout (3 s) plus a
  // margin; in the service the launcher takes the whole group down as soon as one worker exits,
  // so a waiting survivor never holds it up.
  RunPeerFailure(SIGKILL, "3000", 5s);
}

TEST(GlooProcessTest, HungPeerFailsSurvivorsAfterTheTimeout) {
  RunPeerFailure(SIGSTOP, "1000", 5s);
}

TEST(GlooProcessTest, AllReduceLatencyTwoProcesses) {
  TempDir dir;
  std::vector<std::unique_ptr<ChildProcess>> peers;
  for (int r = 0; r < 2; ++r) {
    const std::string rs = std::to_string(r);
    peers.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{DEJA_COMM_PEER, "bench", rs, "2", dir.File("store"),
                                 dir.File("out" + rs), "20000"},
        dir.File("log" + rs)));
  }
  for (int r = 0; r < 2; ++r) ASSERT_EQ(peers[r]->ExitCode(60s), 0) << peers[r]->Log();
  nlohmann::json out = ReadJson(dir.File("out0"));
  ASSERT_TRUE(out.is_array());
  for (const auto& row : out) {
    const double mean = row["mean_us"].get<double>();
    std::cout << "gloo all-reduce, 2 processes, " << row["floats"] << " floats: mean " << mean
              << " us, p50 " << row["p50_us"] << " us, p90 " << row["p90_us"] << " us\n";
    ::testing::Test::RecordProperty("allreduce_mean_us_" + row["floats"].dump(),
                                    std::to_string(mean));
    EXPECT_GT(mean, 0);
  }
}

}  // namespace
}  // namespace deja::worker::comm
