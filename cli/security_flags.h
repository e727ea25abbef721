// The flags of the public API's security, both sides: the server's (`deja serve`, `deja
// coordinator`: TLS, client certificates, bearer tokens, /metrics auth) and the client's
// (`deja client`: the channel to open and the token to send).
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "cli/args.h"
#include "coordinator/security.h"

namespace deja::cli {

// --tls-cert, --tls-key, --tls-client-ca, --auth-token-file, --metrics-auth.
void AddServerSecurityFlags(Args& args);
// The flags as given; the files are read and checked when the coordinator starts.
coordinator::SecurityOptions ServerSecurityFromFlags(const Args& args);
// The `deja client` flags that reach a server started with `security` (placeholders for files
// the server does not know, such as the CA that signed its certificate).
std::string ClientFlagsHint(const coordinator::SecurityOptions& security);

// --tls, --tls-ca, --tls-cert, --tls-key, --tls-server-name, --auth-token-file.
void AddClientSecurityFlags(Args& args);

// A channel to the server and the token its calls carry.
struct ClientConnection {
  std::shared_ptr<grpc::Channel> channel;
  // "Bearer <token>", or empty when no token was given.
  std::string authorization;

  // Adds the token, if any, to a call's metadata.
  void Authorize(grpc::ClientContext* context) const;
};

// Opens a channel to `target` as the flags say: TLS when --tls, --tls-ca or --tls-cert is
// given; the token from --auth-token-file (its first token), else from $DEJA_AUTH_TOKEN.
// InvalidArgument naming the flag for a bad file or a combination that does not go together.
StatusOr<ClientConnection> ConnectFromFlags(const Args& args, const std::string& target);

}  // namespace deja::cli
