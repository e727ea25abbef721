// NCCL communicator for GPU workers: the collectives take device memory and are enqueued on the
// compute stream the model's ops run on (NcclOptions::stream), so they are ordered with the
// layers without any host synchronisation. Rank 0 creates the ncclUniqueId and publishes it
// through the rendezvous store; the others read it. Failures are Status values, never hangs:
//  - initialisation is non-blocking and abandoned (ncclCommAbort) past the rendezvous timeout;
//  - a watchdog thread aborts the communicator when a collective has not completed within
//    `timeout` (a dead or hung peer), which releases the stream; the call that notices it, or
//    CheckHealth() at the end of the step, returns the error, and the group restarts.
// Built only when CUDA and NCCL are found; elsewhere MakeNcclCommunicator returns Unavailable.
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
  int device = 0;                   // CUDA device of this rank
  void* stream = nullptr;           // cudaStream_t of the compute stream; null: a stream of its own
  std::string key_prefix = "nccl";  // distinct per group epoch, like Gloo's
  std::chrono::milliseconds rendezvous_timeout{60000};
  // A collective not done after this is a failed peer: the communicator aborts.
  std::chrono::milliseconds timeout{60000};
};

// Unavailable (with the reason) when built without NCCL or when no CUDA device can be used.
StatusOr<std::unique_ptr<comm::Communicator>> MakeNcclCommunicator(KeyValueStore* store,
                                                                   const NcclOptions& options);

}  // namespace deja::worker::comm
