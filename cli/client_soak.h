// `deja client soak`: a long load with random settings against a running server, checking that
// nothing is lost, duplicated or mixed up (see client_soak.cc).
#pragma once

#include <cstdint>
#include <string>

#include "cli/security_flags.h"
#include "common/status.h"

namespace deja::cli {

struct SoakOptions {
  int streams = 200;             // concurrent GenerateStream calls, each replaced when it ends
  double seconds = 600;          // how long to keep them coming
  double cancel_fraction = 0.1;  // streams the client cancels part-way
  double check_fraction = 0.1;   // greedy streams repeated as unary calls and compared
  int max_new_tokens = 64;       // upper bound of the random max_new_tokens
  uint64_t seed = 1;
  std::string prompt_file;  // lines used as prompts; empty: a few built-in ones
};

// Runs the load, prints a JSON summary on stdout (and a progress line every 30 s on stderr),
// and fails when a stream broke an invariant or ended with an unexpected status.
Status RunClientSoak(const ClientConnection& connection, const SoakOptions& options);

}  // namespace deja::cli
