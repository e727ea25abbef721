// `deja client bench`: concurrent-stream load against a running server (see client_bench.cc).
#pragma once

#include <string>
#include <vector>

#include "cli/security_flags.h"
#include "common/status.h"

namespace deja::cli {

// A connected TCP socket to host:port (the first address that answers), or -1.
int ConnectTcp(const std::string& target);

// Prints one JSON line per concurrency level. `metrics_target` (host:port, may be empty) adds
// the server's overhead and all-reduce fractions over each level (scraped with the connection's
// token, if any). `stop_after` > 0: each stream cancels its request once it has received that
// many tokens (requests that stop early, as with stop sequences).
Status RunClientBench(const ClientConnection& connection, const std::string& metrics_target,
                      const std::vector<int>& levels, int max_new, const std::string& prompt,
                      int stop_after = 0);

}  // namespace deja::cli
