// `deja client bench`: concurrent-stream load against a running server (see client_bench.cc).
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace deja::cli {

// Prints one JSON line per concurrency level. `metrics_target` (host:port, may be empty) adds
// the server's overhead and all-reduce fractions over each level.
Status RunClientBench(const std::string& target, const std::string& metrics_target,
                      const std::vector<int>& levels, int max_new, const std::string& prompt);

}  // namespace deja::cli
