// The public API's security: TLS (and mutual TLS) credentials for the gRPC port, and bearer
// tokens that deja.v1.TextGeneration calls (and, optionally, /metrics scrapes) must carry.
// Everything is read and checked once at start; a bad file is an error naming its flag.
//
// grpc.health.v1 and server reflection never ask for a token: Kubernetes probes carry none, and
// reflection describes only the public proto. They are served on the same (TLS) port.
#pragma once

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/support/string_ref.h>

#include <array>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace deja::coordinator {

// File names as given to `deja serve` / `deja coordinator`; empty means unset.
struct SecurityOptions {
  // PEM certificate chain and private key of the API port (--tls-cert, --tls-key); both or
  // neither. Unset: plaintext.
  std::string tls_cert;
  std::string tls_key;
  // PEM CA certificates (--tls-client-ca): every client must present a certificate they sign.
  std::string tls_client_ca;
  // Bearer tokens, one per line (--auth-token-file). Unset: no token is asked for.
  std::string auth_token_file;
  // /metrics asks for a token too (--metrics-auth; needs auth_token_file).
  bool metrics_auth = false;
};

// The accepted tokens and their check.
class BearerAuth {
 public:
  // Keeps only the tokens' SHA-256 digests.
  explicit BearerAuth(const std::vector<std::string>& tokens);

  // True when `authorization` is "Bearer <token>" (the scheme in any case) for one of the
  // tokens. The time taken depends on the length of what was sent, never on how much of a
  // token it matched or on which token it was.
  bool Allows(std::string_view authorization) const;
  // OK, or UNAUTHENTICATED saying what was wrong (never echoing what was sent), for a call's
  // metadata (keys are lower case in gRPC).
  Status Check(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const;

 private:
  std::vector<std::array<unsigned char, 32>> digests_;
};

// The tokens of a token file: one per line, surrounding whitespace dropped, blank lines and
// lines starting with '#' skipped. InvalidArgument naming `flag` when the file cannot be read,
// holds no token, or a token holds whitespace or a control character.
StatusOr<std::vector<std::string>> ReadTokenFile(const std::string& path, const std::string& flag);

// PEM files named by `flag`s, checked, as text (also for clients' credentials).
// InvalidArgument naming the flag when a file cannot be read or holds no certificate, or the
// key is missing, encrypted, or not the key of the chain's first certificate.
StatusOr<std::string> ReadPemCertificates(const std::string& path, const std::string& flag);
struct PemKeyPair {
  std::string cert_chain;
  std::string private_key;
};
StatusOr<PemKeyPair> ReadPemKeyPair(const std::string& cert_path, const std::string& key_path,
                                    const std::string& cert_flag, const std::string& key_flag);

// What SecurityOptions come to once read.
struct ServerSecurity {
  std::shared_ptr<grpc::ServerCredentials> credentials;  // insecure when TLS is off
  bool tls = false;
  // The PEM material behind `credentials` (the HTTP API serves the same certificate): empty
  // without TLS; client_ca empty unless client certificates are required.
  PemKeyPair pem;
  std::string client_ca;
  std::unique_ptr<BearerAuth> auth;  // null: no token needed
  bool metrics_auth = false;
};

// Reads and checks every file: each readable and PEM, the key the certificate's, the client
// CA holding at least one certificate, the token file at least one token; flags that go
// together given together. InvalidArgument naming the flag otherwise.
StatusOr<ServerSecurity> LoadServerSecurity(const SecurityOptions& options);

}  // namespace deja::coordinator
