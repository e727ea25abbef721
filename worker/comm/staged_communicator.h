// A host communicator (Gloo, in-process) for a model whose tensors live on a device: every
// collective copies its device buffer to a host buffer, runs the host collective there and copies
// the result back. It lets a device model run tensor parallelism where no device communicator
// exists (the simulated test device, or GPUs without NCCL) at the price of two copies per call;
// NCCL takes device memory itself and needs no staging.
#pragma once

#include <memory>

#include "kernels/backend.h"
#include "worker/comm/communicator.h"

namespace deja::worker::comm {

// `backend` outlives the result and does the copies; `host` must take host memory. The result is
// a timed communicator (StatsOf): its all-reduce time includes the copies.
std::unique_ptr<Communicator> MakeStagedCommunicator(kernels::Backend* backend,
                                                     std::unique_ptr<Communicator> host);

}  // namespace deja::worker::comm
