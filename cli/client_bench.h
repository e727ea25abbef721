// `deja client bench`: concurrent-stream load against a running server (see client_bench.cc).
#pragma once

#include <string>
#include <vector>

#include "cli/security_flags.h"
#include "common/status.h"

namespace deja::cli {

// Prints one JSON line per concurrency level. `metrics_target` (host:port, may be empty) adds
// the server's overhead and all-reduce fractions over each level (scraped with the connection's
// token, if any).
Status RunClientBench(const ClientConnection& connection, const std::string& metrics_target,
                      const std::vector<int>& levels, int max_new, const std::string& prompt);

}  // namespace deja::cli
