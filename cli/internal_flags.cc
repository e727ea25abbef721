#include "cli/internal_flags.h"

#include <glog/logging.h>

#include "proto/internal_plane.h"

namespace deja::cli {

void AddInternalListenFlags(Args& args, const std::string& default_port) {
  args.Flag("internal-host",
            "address the internal plane (the workers' Rendezvous) listens on; 0.0.0.0 when "
            "workers run on other hosts",
            "127.0.0.1")
      .Flag("internal-port", "internal plane port (0: any free port)", default_port);
}

StatusOr<InternalListen> InternalListenFromFlags(const Args& args) {
  InternalListen l;
  l.host = args.Str("internal-host");
  DEJA_ASSIGN_OR_RETURN(int64_t port, args.Int("internal-port"));
  if (port < 0 || port > 65535) return InvalidArgument("--internal-port must be in [0, 65535]");
  if (l.host.empty()) return InvalidArgument("--internal-host must not be empty");
  l.port = static_cast<int>(port);
  return l;
}

void AddGroupSecretFlags(Args& args) {
  args.Flag("group-secret-file",
            std::string("file holding the secret shared by the coordinator and its workers "
                        "(default: $") +
                proto::kGroupSecretEnv + ")")
      .Bool("insecure-internal",
            "allow running without a group secret: anyone who reaches the internal plane can "
            "then join the worker group");
}

StatusOr<std::string> GroupSecretFromFlags(const Args& args) {
  DEJA_ASSIGN_OR_RETURN(std::string secret, proto::LoadGroupSecret(args.Str("group-secret-file")));
  if (!secret.empty()) return secret;
  if (args.On("insecure-internal")) {
    LOG(WARNING) << "--insecure-internal: the internal plane runs without a group secret";
    return std::string();
  }
  return InvalidArgument(std::string("no group secret: give --group-secret-file PATH or set $") +
                         proto::kGroupSecretEnv +
                         " (the same secret for the coordinator and every worker), or "
                         "--insecure-internal to run the internal plane without one");
}

}  // namespace deja::cli
