// InProcessCommunicator: N ranks as threads of one process, meeting at a shared hub. Every
// collective is a few barrier phases over pointers the ranks post to the hub; the all-reduce
// sums the ranks' buffers in rank order 0..N-1 for every element, so the result is the same on
// every rank and in every run (and equals what a serial loop over the ranks would give).
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "common/status.h"
#include "worker/comm/communicator.h"

namespace deja::worker::comm {

// One communicator per rank (index = rank), each to be used by one thread. A rank that waits
// longer than `timeout` at a collective, or whose peer's communicator was destroyed, gets an
// error Status (DeadlineExceeded / Unavailable) and the group stays failed from then on: the
// in-process analogue of a peer dying. Stats: StatsOf() in timed_communicator.h.
StatusOr<std::vector<std::unique_ptr<comm::Communicator>>> MakeInProcessGroup(
    int world, std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace deja::worker::comm
