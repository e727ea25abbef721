// NCCL communicator for GPU workers: the collectives run on the device, on the communicator's
// own CUDA stream, and every pointer passed to it must be device memory. Rank 0 creates the
// ncclUniqueId and publishes it through the rendezvous store; the others read it. Built only
// when CUDA and NCCL are found; elsewhere MakeNcclCommunicator returns Unavailable.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "common/status.h"
#include "worker/comm/communicator.h"
#include "worker/comm/key_value_store.h"

namespace deja::worker::comm {

struct NcclOptions {
  int rank = 0;
  int world_size = 1;
  int device = 0;                 // CUDA device of this rank
  std::string key_prefix = "nccl";  // distinct per group epoch, like Gloo's
  std::chrono::milliseconds rendezvous_timeout{60000};
};

// Unavailable (with the reason) when built without NCCL or when no CUDA device can be used.
StatusOr<std::unique_ptr<comm::Communicator>> MakeNcclCommunicator(KeyValueStore* store,
                                                                   const NcclOptions& options);

}  // namespace deja::worker::comm
