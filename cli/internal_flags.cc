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

void AddInternalTlsFlags(Args& args) {
  args.Flag("internal-tls-cert",
            "PEM certificate chain of this process on the internal plane (mutual TLS; with "
            "--internal-tls-key and --internal-tls-ca)")
      .Flag("internal-tls-key", "PEM private key of --internal-tls-cert")
      .Flag("internal-tls-ca", "PEM CA that every internal-plane peer's certificate must chain to")
      .Flag("internal-tls-server-name",
            "name the servers' certificates are checked against (default: the host dialled)");
}

proto::InternalTlsFiles InternalTlsFromFlags(const Args& args) {
  proto::InternalTlsFiles f;
  f.cert_file = args.Str("internal-tls-cert");
  f.key_file = args.Str("internal-tls-key");
  f.ca_file = args.Str("internal-tls-ca");
  f.server_name = args.Str("internal-tls-server-name");
  return f;
}

std::vector<std::string> InternalTlsWorkerArgs(const proto::InternalTlsFiles& files) {
  std::vector<std::string> out;
  for (const auto& [flag, value] : {std::pair{"--internal-tls-cert", &files.cert_file},
                                    std::pair{"--internal-tls-key", &files.key_file},
                                    std::pair{"--internal-tls-ca", &files.ca_file},
                                    std::pair{"--internal-tls-server-name", &files.server_name}}) {
    if (value->empty()) continue;
    out.push_back(flag);
    out.push_back(*value);
  }
  return out;
}

}  // namespace deja::cli
