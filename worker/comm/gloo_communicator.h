// GlooCommunicator: the CPU communicator between worker processes, over Gloo's TCP transport.
// Ranks meet through a KeyValueStore (Gloo's rendezvous keys live there under a prefix), build a
// full mesh of TCP pairs, and then run Gloo's collectives. Gloo reports failures by throwing;
// here every failure becomes a Status, and after the first one the communicator stays failed
// (Gloo leaves the pairs in an unknown state after an I/O error), so the owner tears the group
// down and rebuilds it.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "common/status.h"
#include "worker/comm/communicator.h"
#include "worker/comm/key_value_store.h"

namespace deja::worker::comm {

struct GlooOptions {
  int rank = 0;
  int world_size = 1;
  // Where this rank listens: a network interface name (e.g. "eth0") if set, else a host name or
  // address. Loopback by default: every rank on this machine.
  std::string iface;
  std::string hostname = "127.0.0.1";
  // Bounds the rendezvous and every collective. A dead or hung peer surfaces as an error within
  // this time (sooner when its sockets close, as they do when a process dies).
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
  // Namespace of the rendezvous keys in the store: one per group incarnation, so a restarted
  // group never reads a dead group's addresses.
  std::string key_prefix = "gloo";
};

// Joins the group; blocks until all `world_size` ranks have joined or the timeout passes.
// The all-reduce is Gloo's ring algorithm, chosen explicitly: for a given world size and length
// the order of the additions is fixed, so results are bitwise reproducible run to run and equal
// on every rank. One thread at a time may call a communicator. Stats: StatsOf().
StatusOr<std::unique_ptr<comm::Communicator>> MakeGlooCommunicator(KeyValueStore& store,
                                                                   const GlooOptions& options);

}  // namespace deja::worker::comm
