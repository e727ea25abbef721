// KeyValueStore: the rendezvous store workers meet through before they build a communicator
// (Gloo's rendezvous, NCCL's unique id). The coordinator serves one over gRPC; this file has the
// interface and two local implementations: in memory (ranks as threads of one process) and a
// directory of files (ranks as processes of one machine, for tests and `deja serve` fallbacks).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace deja::worker::comm {

class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  // Stores `value` (any bytes) under `key`, replacing an earlier value.
  virtual Status Set(const std::string& key, std::string_view value) = 0;
  // The value of `key`, waiting up to `timeout` for it to appear; DeadlineExceeded if it does
  // not.
  virtual StatusOr<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Waits up to `timeout` until every key is present; DeadlineExceeded names a missing one.
  virtual Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
};

// Threads of one process.
std::unique_ptr<KeyValueStore> MakeInMemoryStore();

// Processes sharing `dir` (created if absent). One file per key, written to a temporary name and
// renamed, so readers see either nothing or the whole value; readers poll. A directory rather
// than a TCP server because it needs no port, no server process to keep alive and no cleanup
// beyond removing the directory; production rendezvous goes through the coordinator instead.
StatusOr<std::unique_ptr<KeyValueStore>> MakeFileStore(const std::string& dir);

// DeadlineExceeded for a key that did not appear in time (shared by the implementations).
Status KeyTimeout(const std::string& key, std::chrono::milliseconds timeout);

}  // namespace deja::worker::comm
