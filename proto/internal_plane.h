// The internal plane's access control: the group secret that the coordinator and its workers
// share (docs/serving.md#the-internal-plane). Workers send it on every Rendezvous call, the
// coordinator on every Worker call; each server refuses a missing or wrong one with
// UNAUTHENTICATED. Without it anyone who reaches the internal port could register as a rank,
// read the group's Gloo addresses, and receive the users' prompts as steps.
#pragma once

#include <grpcpp/client_context.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

#include <atomic>
#include <cstddef>
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

}  // namespace deja::proto
