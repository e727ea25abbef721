// The internal plane's access control (docs/serving.md#the-internal-plane). The group secret
// that the coordinator and its workers share: workers send it on every Rendezvous call, the
// coordinator on every Worker call; each server refuses a missing or wrong one with
// UNAUTHENTICATED. Without it anyone who reaches the internal port could register as a rank,
// read the group's Gloo addresses, and receive the users' prompts as steps. Optionally mutual
// TLS (InternalCredentials), so that the secret and the steps are not readable on the network.
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/channel_arguments.h>
#include <grpcpp/support/status.h>

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace deja::proto {

// gRPC metadata key carrying the secret (ASCII, so not a -bin key).
inline constexpr char kGroupSecretMetadata[] = "deja-group-secret";
// Where `deja serve` hands the secret to the workers it starts, and where `deja coordinator` /
// `deja worker` look when --group-secret-file is not given. Not a flag: a command line is
// readable by every user of the host (/proc/PID/cmdline), an environment only by the owner.
inline constexpr char kGroupSecretEnv[] = "DEJA_GROUP_SECRET";
// Shorter secrets are refused: a guessable secret is no better than none.
inline constexpr size_t kMinGroupSecretBytes = 16;

// 32 bytes from the kernel's CSPRNG (getrandom), as 64 hex characters.
StatusOr<std::string> GenerateGroupSecret();

// The secret from `file` (trailing whitespace and newlines dropped, as a mounted Kubernetes
// Secret or `echo` writes them), or from kGroupSecretEnv when `file` is empty; "" when neither
// is given. InvalidArgument for an unreadable, empty or too short secret.
StatusOr<std::string> LoadGroupSecret(const std::string& file);

// Equality whose time depends on the lengths only, not on where the strings differ.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

// Adds the secret to an outgoing call (nothing when `secret` is empty).
void AttachGroupSecret(grpc::ClientContext* ctx, const std::string& secret);

// The server side: checks incoming calls against the configured secret.
class GroupSecretCheck {
 public:
  // `server` names this side in the log ("coordinator", "rank 1"). An empty secret accepts
  // every call (the internal plane runs without one).
  GroupSecretCheck(std::string secret, std::string server);

  bool enabled() const { return !secret_.empty(); }
  // OK, or UNAUTHENTICATED for a missing or wrong secret; refusals are logged (at most one line
  // a second, so a flood of bad calls cannot flood the log) and counted.
  grpc::Status Check(const grpc::ServerContext& ctx, std::string_view method) const;
  uint64_t refused() const { return refused_.load(); }

 private:
  const std::string secret_;
  const std::string server_;
  mutable std::atomic<uint64_t> refused_{0};
};

// PEM files of the internal plane's mutual TLS: all three, or none for plaintext.
struct InternalTlsFiles {
  std::string cert_file;  // this process's certificate chain, presented as server and client
  std::string key_file;
  std::string ca_file;  // the CA the peers' certificates must chain to
  // Servers' certificates are checked against this name instead of the host dialled, so one
  // certificate can serve a group whose addresses are not known in advance.
  std::string server_name;
  bool any() const { return !cert_file.empty() || !key_file.empty() || !ca_file.empty(); }
};

// The credentials of every listener and channel of the internal plane: insecure by default;
// with TLS files, servers require and verify a client certificate signed by the CA, and clients
// verify the server's.
class InternalCredentials {
 public:
  InternalCredentials() = default;
  // InvalidArgument naming the flag for a partial set or an unreadable file.
  static StatusOr<InternalCredentials> Load(const InternalTlsFiles& files);

  bool tls() const { return !cert_.empty(); }
  std::shared_ptr<grpc::ServerCredentials> Server() const;
  // A channel to `target`; `args` are kept (message sizes) and get the TLS name override.
  std::shared_ptr<grpc::Channel> Channel(const std::string& target,
                                         grpc::ChannelArguments args = {}) const;

 private:
  std::string cert_, key_, ca_, server_name_;
};

}  // namespace deja::proto
