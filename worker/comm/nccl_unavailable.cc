// Built when CUDA or NCCL is absent: the NCCL communicator is not available in this build.
#include "worker/comm/nccl_communicator.h"

namespace deja::worker::comm {

StatusOr<std::unique_ptr<comm::Communicator>> MakeNcclCommunicator(KeyValueStore*,
                                                                   const NcclOptions&) {
  return Unavailable("deja was built without NCCL (no CUDA toolkit with NCCL was found)");
}

}  // namespace deja::worker::comm
