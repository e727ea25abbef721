// The NCCL communicator. Where no GPU (or no NCCL) is present, construction fails with an
// Unavailable status that says why, never a crash. With GPUs (the cuda cases, label gpu):
//  - a group of every visible GPU (one on a 1-GPU machine, which is said) over threads: the
//    all-reduce, all-gather and broadcast give the sums and copies, enqueued on the CUDA backend's
//    compute stream, and the all-reduce's device time is accounted;
//  - with two or more GPUs, a peer that never joins a collective makes the other rank fail with
//    DeadlineExceeded within the timeout (the watchdog aborts), never hang.
#include "worker/comm/nccl_communicator.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "kernels/backend.h"
#include "worker/comm/key_value_store.h"
#include "worker/comm/timed_communicator.h"

namespace deja::worker::comm {
namespace {

using namespace std::chrono_literals;

TEST(NcclCommunicatorTest, ConstructionFailsCleanlyOrWorks) {
  auto store = MakeInMemoryStore();
  NcclOptions o;
  auto comm = MakeNcclCommunicator(store.get(), o);
  if (!comm.ok()) {
    EXPECT_EQ(comm.status().code(), StatusCode::kUnavailable) << comm.status().ToString();
    EXPECT_FALSE(comm.status().message().empty());
    std::printf("[ note ] NCCL communicator unavailable here: %s\n",
                comm.status().ToString().c_str());
    return;
  }
  EXPECT_EQ((*comm)->rank(), 0);
  EXPECT_EQ((*comm)->world_size(), 1);
  EXPECT_TRUE((*comm)->device_memory());
}

TEST(NcclCommunicatorTest, BadOptionsAreInvalidArgument) {
  auto store = MakeInMemoryStore();
  NcclOptions o;
  o.rank = 3;
  o.world_size = 2;
  auto comm = MakeNcclCommunicator(store.get(), o);
  // Builds without NCCL answer Unavailable before looking at the options.
  const StatusCode want = comm.status().code() == StatusCode::kUnavailable
                              ? StatusCode::kUnavailable
                              : StatusCode::kInvalidArgument;
  EXPECT_EQ(comm.status().code(), want) << comm.status().ToString();
  EXPECT_EQ(MakeNcclCommunicator(nullptr, NcclOptions{}).status().code(), want);
}

// The GPUs a group test can use: 0 (with the reason printed) where there is no CUDA or NCCL.
int UsableGpus() {
  auto probe = kernels::MakeCudaBackend(0);
  if (!probe.ok()) {
    std::printf("no usable CUDA device: %s\n", probe.status().ToString().c_str());
    return 0;
  }
  int n = 1;
  while (kernels::MakeCudaBackend(n).ok()) ++n;
  auto store = MakeInMemoryStore();
  NcclOptions o;
  o.stream = (*probe)->native_stream();
  if (auto c = MakeNcclCommunicator(store.get(), o); !c.ok()) {
    std::printf("NCCL unavailable: %s\n", c.status().ToString().c_str());
    return 0;
  }
  return n;
}

struct Rank {
  std::unique_ptr<kernels::Backend> backend;
  std::unique_ptr<Communicator> comm;
};

// One rank per GPU, each on its own thread, joined through an in-memory store.
std::vector<Rank> MakeGroup(int world, std::chrono::milliseconds timeout) {
  auto store = MakeInMemoryStore();
  std::vector<Rank> ranks(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto b = kernels::MakeCudaBackend(r);
      ASSERT_TRUE(b.ok()) << b.status().ToString();
      NcclOptions o;
      o.rank = r;
      o.world_size = world;
      o.device = r;
      o.stream = (*b)->native_stream();
      o.timeout = timeout;
      o.key_prefix = "test";
      auto c = MakeNcclCommunicator(store.get(), o);
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      ranks[r] = {std::move(*b), std::move(*c)};
    });
  }
  for (std::thread& t : threads) t.join();
  return ranks;
}

TEST(NcclCommunicatorTest, GroupOfEveryGpuCollectives_cuda) {
  const int world = UsableGpus();
  if (world == 0) GTEST_SKIP() << "needs a GPU with NCCL";
  if (world == 1)
    std::printf("[ note ] one GPU: NCCL runs with world size 1 (multi-GPU was not available)\n");
  std::vector<Rank> ranks = MakeGroup(world, 60s);
  ASSERT_EQ(static_cast<int>(ranks.size()), world);
  constexpr int64_t n = 1000;
  std::vector<std::thread> threads;
  std::vector<Status> status(world);
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      kernels::Backend& be = *ranks[r].backend;
      Communicator& c = *ranks[r].comm;
      auto run = [&]() -> Status {
        std::vector<float> host(n);
        for (int64_t i = 0; i < n; ++i) host[i] = static_cast<float>(r + 1) * (i % 7);
        DEJA_ASSIGN_OR_RETURN(Tensor x, be.Allocate(DType::kF32, {n}));
        DEJA_ASSIGN_OR_RETURN(Tensor all, be.Allocate(DType::kF32, {n * world}));
        DEJA_RETURN_IF_ERROR(be.CopyHostToDevice(x.data(), host.data(), n * sizeof(float)));
        DEJA_RETURN_IF_ERROR(c.AllGather(x.as<float>(), n, all.as<float>()));
        DEJA_RETURN_IF_ERROR(c.AllReduceSum(x.as<float>(), n));
        DEJA_RETURN_IF_ERROR(c.Barrier());
        std::vector<float> sum(n), gathered(n * world);
        DEJA_RETURN_IF_ERROR(be.CopyDeviceToHost(sum.data(), x.data(), n * sizeof(float)));
        DEJA_RETURN_IF_ERROR(
            be.CopyDeviceToHost(gathered.data(), all.data(), gathered.size() * sizeof(float)));
        const float ranks_sum = world * (world + 1) / 2.0f;
        for (int64_t i = 0; i < n; ++i) {
          if (sum[i] != ranks_sum * (i % 7)) return Internal("all-reduce mismatch");
          for (int q = 0; q < world; ++q) {
            if (gathered[q * n + i] != static_cast<float>(q + 1) * (i % 7)) {
              return Internal("all-gather mismatch");
            }
          }
        }
        int32_t token = r == 0 ? 4242 : 0;
        DEJA_ASSIGN_OR_RETURN(Tensor t, be.Allocate(DType::kI32, {1}));
        DEJA_RETURN_IF_ERROR(be.CopyHostToDevice(t.data(), &token, sizeof(token)));
        DEJA_RETURN_IF_ERROR(c.Broadcast(t.data(), sizeof(token), 0));
        DEJA_RETURN_IF_ERROR(be.CopyDeviceToHost(&token, t.data(), sizeof(token)));
        if (token != 4242) return Internal("broadcast mismatch");
        DEJA_RETURN_IF_ERROR(c.Barrier());
        DEJA_RETURN_IF_ERROR(c.CheckHealth());
        std::optional<CollectiveStats> st = StatsOf(c);
        if (!st || st->all_reduce_calls != 3 || st->all_reduce_seconds <= 0) {
          return Internal("all-reduce stats not accounted");
        }
        return Status::Ok();
      };
      status[r] = run();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_TRUE(status[r].ok()) << r << ": " << status[r].ToString();
}

TEST(NcclCommunicatorTest, SilentPeerFailsWithinTimeout_cuda) {
  const int world = UsableGpus();
  if (world < 2) GTEST_SKIP() << "needs two GPUs with NCCL (multi-GPU was not available)";
  std::vector<Rank> ranks = MakeGroup(2, 2s);
  ASSERT_EQ(ranks.size(), 2u);
  auto x = ranks[0].backend->Allocate(DType::kF32, {16});
  ASSERT_TRUE(x.ok());
  const auto t0 = std::chrono::steady_clock::now();
  // Rank 1 never joins: rank 0's all-reduce is enqueued, then the watchdog aborts it.
  ASSERT_TRUE(ranks[0].comm->AllReduceSum(x->as<float>(), 16).ok());
  Status s = ranks[0].comm->Barrier();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  EXPECT_LT(seconds, 10.0);
  EXPECT_FALSE(ranks[0].comm->CheckHealth().ok());
  EXPECT_FALSE(ranks[0].comm->AllReduceSum(x->as<float>(), 16).ok());
}

}  // namespace
}  // namespace deja::worker::comm
