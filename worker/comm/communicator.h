// Communicator: the collectives tensor parallelism needs. Implementations: a solo one (world 1),
// an in-process one for tests, Gloo (CPU, TCP) and NCCL (GPU). A faster path is another
// implementation, never an `if` inside the layers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/status.h"

namespace deja::worker::comm {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // data[i] = sum over ranks of data[i], in place.
  virtual Status AllReduceSum(float* data, int64_t n) = 0;
  // out = concatenation over ranks of each rank's `in` (n floats each); out holds n * world.
  virtual Status AllGather(const float* in, int64_t n, float* out) = 0;
  virtual Status Broadcast(void* data, size_t bytes, int root) = 0;
  virtual Status Barrier() = 0;
  // Whether the collectives take device memory (NCCL) rather than host memory (Gloo, in-process).
  // A model on a device wraps a host communicator in MakeStagedCommunicator.
  virtual bool device_memory() const { return false; }
  // A failure no call has reported yet: asynchronous collectives (NCCL's, enqueued on the
  // device's stream) fail after their call returned. The model checks it at the end of a step.
  virtual Status CheckHealth() { return Status::Ok(); }
};

// World of one: every collective is the identity.
std::unique_ptr<Communicator> MakeSoloCommunicator();

}  // namespace deja::worker::comm
