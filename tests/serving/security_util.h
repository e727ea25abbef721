// For the security tests: a throwaway PKI made with the `openssl` CLI in a temporary directory,
// token files, TLS channels, calls carrying a bearer token, and raw HTTP requests to /metrics.
#pragma once

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "tests/common/run_shell.h"
#include "tests/common/temp_dir.h"
#include "tests/common/test_pki.h"

namespace deja::serving_test {

using test_util::RunShell;

// The PKI of tests/common/test_pki.h (a client that dials 127.0.0.1 must name "localhost").
// Also `tokens` (two tokens, with a comment and blank lines) and `empty_tokens` (comments only).
class TestPki {
 public:
  static constexpr const char* kToken = "tok-3f9a1c7e5b";
  static constexpr const char* kSecondToken = "second-token-0d2e";

  TestPki() {
    error_ = test_util::MakeTestPki(
        dir_.path(), "printf '# deja test tokens\\n\\n  " + std::string(kToken) + "  \\n" +
                         kSecondToken +
                         "\\n' > tokens\n"
                         "printf '# none\\n\\n' > empty_tokens\n");
  }

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  std::string File(const std::string& name) const { return dir_.File(name); }
  std::string Pem(const std::string& name) const {
    return test_util::ReadText(File(name + ".pem"));
  }
  std::string Key(const std::string& name) const {
    return test_util::ReadText(File(name + ".key"));
  }

  // A channel to 127.0.0.1 trusting `ca`, checking the name "localhost", presenting the
  // certificate `client` when not empty.
  std::shared_ptr<grpc::Channel> Channel(const std::string& target,
                                         const std::string& client = "") const {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = Pem("ca");
    if (!client.empty()) {
      ssl.pem_cert_chain = Pem(client);
      ssl.pem_private_key = Key(client);
    }
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride("localhost");
    return grpc::CreateCustomChannel(target, grpc::SslCredentials(ssl), args);
  }

 private:
  test_util::TempDir dir_;
  std::string error_;
};

// A call context with a deadline and, when `token` is not empty, "authorization: Bearer token".
inline std::unique_ptr<grpc::ClientContext> CallWith(const std::string& token) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
  return ctx;
}

}  // namespace deja::serving_test
