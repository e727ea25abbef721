// Flags of the internal plane (docs/serving.md#the-internal-plane): where the coordinator's
// Rendezvous listens (`deja serve`, `deja coordinator`) and the group secret (`deja coordinator`,
// `deja worker`; `deja serve` generates its own and hands it to its workers).
#pragma once

#include <string>

#include "cli/args.h"
#include "common/status.h"

namespace deja::cli {

// --internal-host (default 127.0.0.1) and --internal-port (`default_port`; 0: any free port).
void AddInternalListenFlags(Args& args, const std::string& default_port);
struct InternalListen {
  std::string host;
  int port = 0;
};
StatusOr<InternalListen> InternalListenFromFlags(const Args& args);

// --group-secret-file PATH and --insecure-internal.
void AddGroupSecretFlags(Args& args);
// The secret from --group-secret-file, else $DEJA_GROUP_SECRET. Without either, "" when
// --insecure-internal is given and InvalidArgument otherwise: running the internal plane open to
// anyone who reaches it must be asked for.
StatusOr<std::string> GroupSecretFromFlags(const Args& args);

}  // namespace deja::cli
