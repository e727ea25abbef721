// `deja client bench --http-target`: the same streaming workload through deja.v1 gRPC and the
// OpenAI-compatible HTTP API (server-sent events) of one server, alternating, so the two APIs'
// costs compare within one run (see api_bench.cc).
#pragma once

#include <string>
#include <vector>

#include "cli/security_flags.h"
#include "common/status.h"

namespace deja::cli {

// For each level, `rounds` times: that many gRPC GenerateStream calls at once, then as many
// streamed POST /v1/completions to `http_target` (host:port, plaintext), the order swapped each
// round; greedy, EOS ignored, `max_new` tokens each. Prints one JSON line per level: tokens/s,
// time to first token and inter-token latency percentiles per API, and HTTP's ratios to gRPC.
// UNAVAILABLE when a stream of either API fails.
Status RunApiBench(const ClientConnection& connection, const std::string& http_target,
                   const std::vector<int>& levels, int max_new, const std::string& prompt,
                   int rounds);

}  // namespace deja::cli
