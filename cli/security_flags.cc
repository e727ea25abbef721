#include "cli/security_flags.h"

#include <cctype>
#include <cstdlib>
#include <vector>

namespace deja::cli {

void AddServerSecurityFlags(Args& args) {
  args.Flag("tls-cert", "PEM certificate chain: the API port speaks TLS (with --tls-key)")
      .Flag("tls-key", "PEM private key of --tls-cert (unencrypted)")
      .Flag("tls-client-ca",
            "PEM CA certificates: clients must present a certificate they signed (mutual TLS)")
      .Flag("auth-token-file",
            "bearer tokens, one per line ('#' comments and blank lines skipped): every "
            "TextGeneration call must send 'authorization: Bearer <token>' (health and "
            "reflection stay open)")
      .Bool("metrics-auth", "/metrics asks for a token of --auth-token-file too");
}

coordinator::SecurityOptions ServerSecurityFromFlags(const Args& args) {
  coordinator::SecurityOptions s;
  s.tls_cert = args.Str("tls-cert");
  s.tls_key = args.Str("tls-key");
  s.tls_client_ca = args.Str("tls-client-ca");
  s.auth_token_file = args.Str("auth-token-file");
  s.metrics_auth = args.On("metrics-auth");
  return s;
}

std::string ClientFlagsHint(const coordinator::SecurityOptions& security) {
  std::string hint;
  if (!security.tls_cert.empty()) hint += " --tls-ca CA_OF_TLS_CERT.pem";
  if (!security.tls_client_ca.empty()) hint += " --tls-cert CLIENT.pem --tls-key CLIENT.key";
  if (!security.auth_token_file.empty()) hint += " --auth-token-file " + security.auth_token_file;
  return hint;
}

void AddClientSecurityFlags(Args& args) {
  args.Bool("tls", "connect with TLS, trusting the system's CA certificates")
      .Flag("tls-ca", "PEM CA certificates that signed the server's certificate (implies TLS)")
      .Flag("tls-cert", "PEM client certificate for mutual TLS (with --tls-key; implies TLS)")
      .Flag("tls-key", "PEM private key of --tls-cert")
      .Flag("tls-server-name",
            "name to check the server's certificate against (default: the "
            "--target host)")
      .Flag("auth-token-file",
            "file whose first token is sent as 'authorization: Bearer <token>' (default: "
            "$DEJA_AUTH_TOKEN)");
}

void ClientConnection::Authorize(grpc::ClientContext* context) const {
  if (!authorization.empty()) context->AddMetadata("authorization", authorization);
}

StatusOr<ClientConnection> ConnectFromFlags(const Args& args, const std::string& target) {
  if (args.Has("tls-cert") != args.Has("tls-key")) {
    return InvalidArgument("--tls-cert and --tls-key go together");
  }
  const bool tls = args.On("tls") || args.Has("tls-ca") || args.Has("tls-cert");
  if (args.Has("tls-server-name") && !tls) {
    return InvalidArgument("--tls-server-name needs TLS (--tls-ca, or --tls for the system's CAs)");
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  grpc::ChannelArguments channel_args;
  if (tls) {
    grpc::SslCredentialsOptions ssl;
    if (args.Has("tls-ca")) {
      DEJA_ASSIGN_OR_RETURN(ssl.pem_root_certs,
                            coordinator::ReadPemCertificates(args.Str("tls-ca"), "--tls-ca"));
    }
    if (args.Has("tls-cert")) {
      DEJA_ASSIGN_OR_RETURN(coordinator::PemKeyPair pair,
                            coordinator::ReadPemKeyPair(args.Str("tls-cert"), args.Str("tls-key"),
                                                        "--tls-cert", "--tls-key"));
      ssl.pem_cert_chain = std::move(pair.cert_chain);
      ssl.pem_private_key = std::move(pair.private_key);
    }
    credentials = grpc::SslCredentials(ssl);
    if (args.Has("tls-server-name")) {
      channel_args.SetSslTargetNameOverride(args.Str("tls-server-name"));
    }
  }
  ClientConnection c;
  std::string token;
  if (args.Has("auth-token-file")) {
    DEJA_ASSIGN_OR_RETURN(
        std::vector<std::string> tokens,
        coordinator::ReadTokenFile(args.Str("auth-token-file"), "--auth-token-file"));
    token = tokens.front();
  } else if (const char* env = std::getenv("DEJA_AUTH_TOKEN"); env != nullptr) {
    token = env;
    while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) {
      token.pop_back();
    }
  }
  if (!token.empty()) c.authorization = "Bearer " + token;
  c.channel = grpc::CreateCustomChannel(target, credentials, channel_args);
  return c;
}

}  // namespace deja::cli
