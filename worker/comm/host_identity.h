// Whether the ranks of a group share one host, which decides between the shared-memory
// communicator (same host) and Gloo's TCP (otherwise). Every rank publishes its identity in the
// rendezvous store and compares all of them, so every rank reaches the same answer.
#pragma once

#include <chrono>
#include <string>

#include "common/status.h"
#include "worker/comm/key_value_store.h"

namespace deja::worker::comm {

// What must be equal for two processes to share a POSIX shared-memory segment: the kernel's
// boot id, the host name (containers of one machine share the boot id but not, normally, the
// host name), the effective user (the segment is private to it) and the /dev/shm file system
// (a container may have its own). An unreadable boot id or a missing /dev/shm makes the
// identity "unknown", which matches nothing.
std::string HostIdentity();

struct SameHostCheck {
  bool same = false;
  // For the log: the shared identity, or the first rank whose identity differs.
  std::string detail;
};

// Publishes this rank's HostIdentity() under `key_prefix`/<rank> and reads every rank's, waiting
// up to `timeout` for them.
StatusOr<SameHostCheck> CheckSameHost(KeyValueStore& store, const std::string& key_prefix, int rank,
                                      int world_size, std::chrono::milliseconds timeout);

}  // namespace deja::worker::comm
