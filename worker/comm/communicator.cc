#include "worker/comm/communicator.h"

#include <cstring>

namespace deja::worker::comm {
namespace {

class SoloCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  Status AllReduceSum(float*, int64_t) override { return Status::Ok(); }
  Status AllGather(const float* in, int64_t n, float* out) override {
    if (in != out) std::memcpy(out, in, static_cast<size_t>(n) * sizeof(float));
    return Status::Ok();
  }
  Status Broadcast(void*, size_t, int root) override {
    if (root != 0) return InvalidArgument("broadcast root " + std::to_string(root) + " >= world 1");
    return Status::Ok();
  }
  Status Barrier() override { return Status::Ok(); }
};

}  // namespace

std::unique_ptr<Communicator> MakeSoloCommunicator() {
  return std::make_unique<SoloCommunicator>();
}

}  // namespace deja::worker::comm
