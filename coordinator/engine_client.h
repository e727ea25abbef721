// EngineClient: the coordinator's view of the worker group, the seam between the batching
// engine and the processes that compute. The gRPC implementation (WorkerGroup) drives real
// ranks over Worker.Step streams; tests substitute a fake that answers steps in-process.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "coordinator/scheduler.h"
#include "deja/v1/worker.pb.h"

namespace deja::coordinator {

struct GroupState {
  // Every rank connected (its Step stream open) and warmed up.
  bool ready = false;
  // Rendezvous epoch of the connected group; 0 when none. A new value means a new group whose
  // ranks hold none of the previous group's sequences.
  uint64_t epoch = 0;
  KvCapacity kv;
  // Every rank has Deja Vu sparsity enabled (it accepts SequenceConfig.sparse), and every
  // rank's default for requests that leave Sparsity.mode unspecified is on.
  bool sparsity_available = false;
  bool sparsity_default = false;
  // Every rank holds Locret retaining heads (it accepts the LOCRET cache policy).
  bool locret_available = false;
  // What the group computes with (rank 0's WorkerStatus.weight_dtype and kv_dtype).
  std::string weight_dtype, kv_dtype;
  // Why the group is not ready, for UNAVAILABLE messages and logs.
  std::string reason;
};

class EngineClient {
 public:
  virtual ~EngineClient() = default;

  virtual int world_size() const = 0;
  // Thread-safe and cheap (a copy under a lock).
  virtual GroupState State() const = 0;
  // Sends `request` to every rank of the ready group and waits for each rank's answer, under
  // the step timeout; the responses are indexed by rank. UNAVAILABLE when no group is ready,
  // or when a rank is lost, times out or reports a fatal error during the step: the client
  // then declares the group lost (State().ready turns false) before returning. One step at a
  // time; the client numbers step_id.
  virtual StatusOr<std::vector<v1::StepResponse>> Step(v1::StepRequest request) = 0;
};

}  // namespace deja::coordinator
