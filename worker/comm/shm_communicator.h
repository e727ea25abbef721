// ShmCommunicator: the CPU communicator between worker processes of one host, through a POSIX
// shared-memory segment instead of TCP. Rank 0 creates the segment and publishes its name in the
// KeyValueStore (under a prefix per group incarnation, like Gloo's keys); the others map it, and
// the name is unlinked as soon as all have, so nothing is left in /dev/shm however the
// processes end. Collectives copy through per-rank slots of the segment and meet at barriers
// made of atomic counters in it: a waiting rank spins for a bounded time, then sleeps on a
// futex. Like Gloo's, every failure (a dead, stopped or departed peer; a timeout) becomes an
// error Status and the communicator stays failed, so the owner rebuilds the group.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "common/status.h"
#include "worker/comm/communicator.h"
#include "worker/comm/key_value_store.h"

namespace deja::worker::comm {

struct ShmOptions {
  int rank = 0;
  int world_size = 1;
  // Bounds the rendezvous and every wait for the peers inside a collective. A stopped peer
  // surfaces as an error after this long; a dead one (same pid namespace) within milliseconds.
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
  // Namespace of the rendezvous keys in the store: one per group incarnation.
  std::string key_prefix = "shm";
  // Bytes per rank per round; a larger collective runs in rounds of this size. Two slots per
  // rank (consecutive rounds alternate), so the segment is about 2 * world * slot_bytes. Taken
  // from rank 0; a multiple of 64, at least 4 KiB.
  size_t slot_bytes = size_t{1} << 20;
  // The longest a waiting rank polls its peers' counters before it sleeps on a futex. Waking
  // from the futex takes microseconds more than seeing the counter while polling, and on an
  // idle machine the peers arrive within the polling time. The polling time adapts: halved
  // after each wait that ended asleep (on a machine whose cores are busy with other work, the
  // late peer is often waiting for a core, which polling would only keep from it), doubled
  // after each that ended while polling.
  std::chrono::microseconds spin = std::chrono::microseconds(100);
};

// Joins the group; blocks until all `world_size` ranks have mapped the segment or the timeout
// passes. All-reduce: each element is summed over the ranks in rank order (0 + 1 + ...), so the
// result is bitwise equal on every rank, run to run, and to the in-process communicator's. One
// thread at a time may call a communicator. Stats: StatsOf().
StatusOr<std::unique_ptr<comm::Communicator>> MakeShmCommunicator(KeyValueStore& store,
                                                                  const ShmOptions& options);

}  // namespace deja::worker::comm
