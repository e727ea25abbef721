// Flags of the internal plane (docs/serving.md#the-internal-plane): where the coordinator's
// Rendezvous listens (`deja serve`, `deja coordinator`), the group secret (`deja coordinator`,
// `deja worker`; `deja serve` generates its own and hands it to its workers) and mutual TLS (all
// three; `deja serve` passes its files on to its workers).
#pragma once

#include <string>
#include <vector>

#include "cli/args.h"
#include "common/status.h"
#include "proto/internal_plane.h"

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

// --internal-tls-cert, --internal-tls-key, --internal-tls-ca, --internal-tls-server-name.
void AddInternalTlsFlags(Args& args);
// The files as given (checked when loaded: proto::InternalCredentials::Load).
proto::InternalTlsFiles InternalTlsFromFlags(const Args& args);
// The same flags again, for the workers `deja serve` starts.
std::vector<std::string> InternalTlsWorkerArgs(const proto::InternalTlsFiles& files);

}  // namespace deja::cli
