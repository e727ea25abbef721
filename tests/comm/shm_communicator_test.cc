// The shared-memory communicator: the collective grid for worlds 1-4 with ranks as threads and as
// separate processes (bitwise equal to each other, to the in-process communicator's rank-order
// sums and across slot sizes, so rounds and both all-reduce algorithms add in the same order),
// rendezvous and option errors, disagreeing calls, a peer that leaves, is killed (SIGKILL) or
// hangs (SIGSTOP) turning into an error Status on the survivors, no segment left in /dev/shm
// after any of it, a long wait that sleeps instead of burning a core, and the same-host check. Also
// prints the all-reduce latency of two processes over shared memory and over Gloo.
#include "worker/comm/shm_communicator.h"

#include <dirent.h>
#include <gtest/gtest.h>

#include <chrono>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <vector>

#include "tests/comm/collective_check.h"
#include "tests/comm/process_util.h"
#include "tests/common/temp_dir.h"
#include "worker/comm/host_identity.h"
#include "worker/comm/in_process_communicator.h"
#include "worker/comm/key_value_store.h"
#include "worker/comm/timed_communicator.h"

namespace deja::worker::comm {
namespace {

using namespace std::chrono_literals;
using test_util::ChildProcess;
using test_util::TempDir;
using Group = std::vector<std::unique_ptr<comm::Communicator>>;

// Segments in /dev/shm that a rank 0 of process `pid` created (their names carry it).
std::vector<std::string> Leftovers(pid_t pid) {
  std::vector<std::string> found;
  // Appended rather than "-" + ...: GCC 12 warns (-Wrestrict) about the latter, wrongly.
  std::string mark = "-";
  mark += std::to_string(pid);
  mark += '-';
  if (DIR* d = ::opendir("/dev/shm")) {
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.rfind("deja-", 0) == 0 && name.find(mark) != std::string::npos) {
        found.push_back(name);
      }
    }
    ::closedir(d);
  }
  return found;
}

ShmOptions Options(int rank, int world, const std::string& prefix, size_t slot_bytes) {
  ShmOptions o;
  o.rank = rank;
  o.world_size = world;
  o.key_prefix = prefix;
  o.timeout = 20s;
  o.slot_bytes = slot_bytes;
  return o;
}

// Builds a group of `world` ranks in this process, one thread per rank for the rendezvous.
Group MakeThreadGroup(KeyValueStore& store, int world, const std::string& prefix,
                      size_t slot_bytes = size_t{1} << 20) {
  Group g(world);
  std::vector<Status> status(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto c = MakeShmCommunicator(store, Options(r, world, prefix, slot_bytes));
      status[r] = c.status();
      if (c.ok()) g[r] = std::move(*c);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_TRUE(status[r].ok()) << status[r].ToString();
  // Every rank has mapped the segment, so its name is gone already.
  EXPECT_TRUE(Leftovers(::getpid()).empty()) << Leftovers(::getpid())[0];
  return g;
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str(), nullptr, false);
}

// Runs the collective grid on `g` (one thread per rank); checks it and returns the ranks'
// common digest.
uint64_t RunGrid(Group& g) {
  const int world = static_cast<int>(g.size());
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

uint64_t RunThreadGrid(KeyValueStore& store, int world, const std::string& prefix,
                       size_t slot_bytes = size_t{1} << 20) {
  Group g = MakeThreadGroup(store, world, prefix, slot_bytes);
  return RunGrid(g);
}

class ShmWorldTest : public ::testing::TestWithParam<int> {};

TEST_P(ShmWorldTest, ThreadsMatchReference) {
  auto store = MakeInMemoryStore();
  const uint64_t first = RunThreadGrid(*store, GetParam(), "run0");
  const uint64_t second = RunThreadGrid(*store, GetParam(), "run1");
  EXPECT_EQ(first, second) << "results differ between runs";
  // 4 KiB slots: the larger sizes take many rounds, and the all-reduce sums whole rounds on
  // every rank for the small ones and shares for the large ones; the bits stay the same.
  EXPECT_EQ(first, RunThreadGrid(*store, GetParam(), "small", 4096)) << "slot size matters";
  // The in-process communicator's serial rank-order sums, bit for bit.
  auto in_process = MakeInProcessGroup(GetParam(), 60s);
  ASSERT_TRUE(in_process.ok());
  EXPECT_EQ(first, RunGrid(*in_process));
  EXPECT_TRUE(Leftovers(::getpid()).empty());
}

TEST_P(ShmWorldTest, ProcessesMatchReference) {
  const int world = GetParam();
  TempDir dir;
  std::vector<std::unique_ptr<ChildProcess>> peers;
  for (int r = 0; r < world; ++r) {
    const std::string rs = std::to_string(r);
    peers.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{DEJA_COMM_PEER, "--shm", "check", rs, std::to_string(world),
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
  EXPECT_TRUE(Leftovers(peers[0]->pid()).empty());
  auto store = MakeInMemoryStore();
  EXPECT_EQ(digests[0], std::to_string(RunThreadGrid(*store, world, "threads")));
}

INSTANTIATE_TEST_SUITE_P(Worlds, ShmWorldTest, ::testing::Values(1, 2, 3, 4));

// Counts of several rounds, odd remainders, on ranks with other values: the exact sums.
TEST(ShmTest, LargeCountsRunInRounds) {
  auto store = MakeInMemoryStore();
  const int world = 3;
  Group g = MakeThreadGroup(*store, world, "large", 8192);
  std::vector<std::vector<float>> out(world);
  const int64_t n = 5 * 2048 + 7;  // five 8 KiB rounds and a bit
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      out[r].resize(n);
      for (int64_t i = 0; i < n; ++i) out[r][i] = static_cast<float>(i % 1000) * (r + 1);
      EXPECT_TRUE(g[r]->AllReduceSum(out[r].data(), n).ok());
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(out[r][i], static_cast<float>(i % 1000) * 6) << "rank " << r << " i " << i;
    }
  }
}

TEST(ShmTest, BadOptionsAreInvalidArgument) {
  auto store = MakeInMemoryStore();
  ShmOptions opt;
  opt.rank = 2;
  opt.world_size = 2;
  EXPECT_EQ(MakeShmCommunicator(*store, opt).status().code(), StatusCode::kInvalidArgument);
  opt.rank = 0;
  opt.timeout = 0ms;
  EXPECT_EQ(MakeShmCommunicator(*store, opt).status().code(), StatusCode::kInvalidArgument);
  opt.timeout = 1s;
  opt.slot_bytes = 4000;
  EXPECT_EQ(MakeShmCommunicator(*store, opt).status().code(), StatusCode::kInvalidArgument);
  opt.slot_bytes = 4096;
  opt.spin = -1us;
  EXPECT_EQ(MakeShmCommunicator(*store, opt).status().code(), StatusCode::kInvalidArgument);
}

TEST(ShmTest, MissingPeerAtRendezvousTimesOutAndLeavesNothing) {
  auto store = MakeInMemoryStore();
  ShmOptions opt;
  opt.world_size = 2;
  opt.timeout = 300ms;
  const auto start = std::chrono::steady_clock::now();
  auto c = MakeShmCommunicator(*store, opt);
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable) << c.status().ToString();
  EXPECT_NE(c.status().message().find("rank 0 of 2"), std::string::npos) << c.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_TRUE(Leftovers(::getpid()).empty());
  // Rank 1 finds the name, but the segment is gone with its creator's attempt.
  opt.rank = 1;
  c = MakeShmCommunicator(*store, opt);
  EXPECT_FALSE(c.ok());
  // A rank 1 that never hears from rank 0.
  auto empty = MakeInMemoryStore();
  c = MakeShmCommunicator(*empty, opt);
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable) << c.status().ToString();
  EXPECT_NE(c.status().message().find("rank 1 of 2"), std::string::npos) << c.status().ToString();
}

TEST(ShmTest, BadRootIsInvalidArgument) {
  auto store = MakeInMemoryStore();
  Group g = MakeThreadGroup(*store, 1, "root");
  ASSERT_NE(g[0], nullptr);
  float x = 1;
  EXPECT_EQ(g[0]->Broadcast(&x, 4, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(g[0]->Broadcast(&x, 4, -1).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(g[0]->Broadcast(&x, 4, 0).ok());
}

TEST(ShmTest, DisagreeingCallsAreRejectedAndTheGroupStaysUsable) {
  auto store = MakeInMemoryStore();
  Group g = MakeThreadGroup(*store, 3, "disagree");
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      std::vector<float> v(10, 1.0f);
      Status s = g[r]->AllReduceSum(v.data(), r == 1 ? 9 : 10);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
      s = g[r]->Broadcast(v.data(), 4, r);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
      s = r == 2 ? g[r]->Barrier() : g[r]->AllGather(v.data(), 1, v.data() + 5);
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
      std::fill(v.begin(), v.end(), 1.0f);
      EXPECT_TRUE(g[r]->AllReduceSum(v.data(), 10).ok());
      EXPECT_EQ(v[0], 3.0f);
    });
  }
  for (std::thread& t : threads) t.join();
}

TEST(ShmTest, PeerThatLeavesFailsTheOthersAndTheGroupStaysFailed) {
  auto store = MakeInMemoryStore();
  Group g = MakeThreadGroup(*store, 3, "leave");
  const auto start = std::chrono::steady_clock::now();
  std::vector<Status> got(2);
  std::thread a([&] { got[0] = g[0]->Barrier(); });
  std::thread b([&] { got[1] = g[1]->Barrier(); });
  std::this_thread::sleep_for(50ms);
  g[2].reset();
  a.join();
  b.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(got[r].code(), StatusCode::kUnavailable) << got[r].ToString();
    EXPECT_NE(got[r].message().find("rank 2"), std::string::npos) << got[r].ToString();
    float x = 1;
    EXPECT_EQ(g[r]->AllReduceSum(&x, 1).code(), StatusCode::kUnavailable);
  }
}

TEST(ShmTest, PeerThatNeverArrivesTimesOut) {
  auto store = MakeInMemoryStore();
  Group g(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      ShmOptions o = Options(r, 2, "late", 4096);
      o.timeout = 200ms;
      auto c = MakeShmCommunicator(*store, o);
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      g[r] = std::move(*c);
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_NE(g[0], nullptr);
  const auto start = std::chrono::steady_clock::now();
  Status s = g[0]->Barrier();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("within 200 ms"), std::string::npos) << s.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  // Rank 1 arrives late and finds the group failed.
  s = g[1]->Barrier();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("rank 0 failed"), std::string::npos) << s.ToString();
}

// A rank that waits long for its peer sleeps rather than polling: half a second of waiting costs
// it little CPU time.
TEST(ShmTest, WaitingRankSleeps) {
  auto store = MakeInMemoryStore();
  Group g = MakeThreadGroup(*store, 2, "sleep");
  double cpu_seconds = -1;
  std::thread waiter([&] {
    timespec a, b;
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    EXPECT_TRUE(g[0]->Barrier().ok());
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
    cpu_seconds = (b.tv_sec - a.tv_sec) + 1e-9 * (b.tv_nsec - a.tv_nsec);
  });
  std::this_thread::sleep_for(500ms);
  EXPECT_TRUE(g[1]->Barrier().ok());
  waiter.join();
  std::cout << "CPU time of a rank waiting 500 ms: " << cpu_seconds * 1e3 << " ms\n";
  EXPECT_LT(cpu_seconds, 0.05);
}

TEST(ShmTest, SameHostCheck) {
  auto store = MakeInMemoryStore();
  const std::string me = HostIdentity();
  ASSERT_NE(me.find("boot_id="), std::string::npos) << me;
  std::vector<StatusOr<SameHostCheck>> got(3, Internal("unset"));
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] { got[r] = CheckSameHost(*store, "host", r, 3, 5s); });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(got[r].ok()) << got[r].status().ToString();
    EXPECT_TRUE(got[r]->same) << got[r]->detail;
  }
  // A rank elsewhere: every rank says no.
  ASSERT_TRUE(store->Set("other/1", "boot_id=elsewhere host=b uid=0 shm=1:2").ok());
  StatusOr<SameHostCheck> no = CheckSameHost(*store, "other", 0, 2, 5s);
  ASSERT_TRUE(no.ok()) << no.status().ToString();
  EXPECT_FALSE(no->same);
  EXPECT_NE(no->detail.find("rank 1 has boot_id=elsewhere"), std::string::npos) << no->detail;
  // A rank that never publishes.
  EXPECT_FALSE(CheckSameHost(*store, "missing", 0, 2, 100ms).ok());
}

// Starts `world` comm_peer --shm processes in `mode`.
std::vector<std::unique_ptr<ChildProcess>> StartPeers(const TempDir& dir, const std::string& mode,
                                                      int world, const std::string& timeout_ms,
                                                      const std::vector<int>& ranks) {
  std::vector<std::unique_ptr<ChildProcess>> peers;
  for (int r : ranks) {
    const std::string rs = std::to_string(r);
    peers.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{DEJA_COMM_PEER, "--shm", mode, rs, std::to_string(world),
                                 dir.File("store"), dir.File("out" + rs), timeout_ms},
        dir.File("log" + rs)));
  }
  return peers;
}

// Three ranks all-reduce in a loop; once all are running, `sig` hits rank 2. The other two must
// leave their loop with an error Status within `limit`, and leave nothing in /dev/shm.
void RunPeerFailure(int sig, const std::string& timeout_ms, std::chrono::milliseconds limit) {
  TempDir dir;
  auto peers = StartPeers(dir, "loop", 3, timeout_ms, {0, 1, 2});
  const auto ready_deadline = std::chrono::steady_clock::now() + 30s;
  for (int r = 0; r < 3; ++r) {
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
    EXPECT_EQ(code, 3) << "rank " << r << ":\n" << peers[r]->Log();
    EXPECT_LT(after, std::chrono::duration<double>(limit).count()) << "rank " << r;
    nlohmann::json out = ReadJson(dir.File("out" + std::to_string(r)));
    ASSERT_TRUE(out.is_object()) << peers[r]->Log();
    EXPECT_EQ(out["code"].get<int>(), static_cast<int>(StatusCode::kUnavailable)) << out.dump();
    std::cout << "rank " << r << " failed " << after
              << " s after the signal: " << out["error"].get<std::string>() << "\n";
  }
  EXPECT_TRUE(Leftovers(peers[0]->pid()).empty());
}

TEST(ShmProcessTest, KilledPeerFailsSurvivorsAtOnce) {
  // The survivors watch their peers' processes, so the 10 s timeout never comes into it.
  RunPeerFailure(SIGKILL, "10000", 2s);
}

TEST(ShmProcessTest, HungPeerFailsSurvivorsAfterTheTimeout) { RunPeerFailure(SIGSTOP, "1000", 5s); }

// Rank 0 dies after creating the segment, before rank 2 has started: rank 1, which mapped it,
// gives up at its timeout and removes the name.
TEST(ShmProcessTest, CreatorKilledDuringRendezvousLeavesNothing) {
  TempDir dir;
  auto peers = StartPeers(dir, "check", 3, "1500", {0, 1});
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (Leftovers(peers[0]->pid()).empty()) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << peers[0]->Log();
    std::this_thread::sleep_for(1ms);
  }
  // Give rank 1 the time to map it.
  std::this_thread::sleep_for(300ms);
  peers[0]->Kill(SIGKILL);
  EXPECT_EQ(peers[1]->ExitCode(10s), 2) << peers[1]->Log();
  EXPECT_NE(ReadJson(dir.File("out1"))["error"].get<std::string>().find("mapped segment"),
            std::string::npos)
      << peers[1]->Log();
  EXPECT_TRUE(Leftovers(peers[0]->pid()).empty()) << Leftovers(peers[0]->pid())[0];
}

// The all-reduce latency of two processes at decode sizes, over shared memory (polling first, as
// by default, and sleeping on the futex at once) and over Gloo.
TEST(ShmProcessTest, AllReduceLatencyTwoProcesses) {
  for (const std::string name : {"shm", "shm-nopoll", "gloo"}) {
    TempDir dir;
    std::vector<std::unique_ptr<ChildProcess>> peers;
    for (int r = 0; r < 2; ++r) {
      const std::string rs = std::to_string(r);
      std::vector<std::string> args = {DEJA_COMM_PEER,       "bench", rs, "2", dir.File("store"),
                                       dir.File("out" + rs), "20000"};
      if (name == "shm") args.insert(args.begin() + 1, "--shm");
      if (name == "shm-nopoll") args.insert(args.begin() + 1, {"--shm", "--spin-us", "0"});
      peers.push_back(std::make_unique<ChildProcess>(args, dir.File("log" + rs)));
    }
    for (int r = 0; r < 2; ++r) ASSERT_EQ(peers[r]->ExitCode(120s), 0) << peers[r]->Log();
    nlohmann::json out = ReadJson(dir.File("out0"));
    ASSERT_TRUE(out.is_array());
    for (const auto& row : out) {
      const double mean = row["mean_us"].get<double>();
      std::cout << name << " all-reduce, 2 processes, " << row["floats"] << " floats: mean " << mean
                << " us, p50 " << row["p50_us"] << " us, p90 " << row["p90_us"] << " us\n";
      ::testing::Test::RecordProperty(name + "_allreduce_mean_us_" + row["floats"].dump(),
                                      std::to_string(mean));
      EXPECT_GT(mean, 0);
    }
  }
}

}  // namespace
}  // namespace deja::worker::comm
