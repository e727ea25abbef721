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

namespace deja::serving_test {

using test_util::RunShell;

// Two CAs: `ca` signs the server's certificate `server` (for the name "localhost" only, so a
// client that dials 127.0.0.1 must name it) and the client certificate `client`; `other` signs
// `stranger`, a client certificate the server must refuse. Each NAME has NAME.pem and NAME.key.
// Also `tokens` (two tokens, with a comment and blank lines) and `empty_tokens` (comments only).
class TestPki {
 public:
  static constexpr const char* kToken = "tok-3f9a1c7e5b";
  static constexpr const char* kSecondToken = "second-token-0d2e";

  TestPki() {
    const std::string script =
        "set -e\ncd '" + dir_.path() +
        "'\n"
        "ca() { openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
        "-keyout $1.key -out $1.pem -days 2 -subj /CN=$1; }\n"
        "leaf() { openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
        "-keyout $1.key -out $1.csr -subj /CN=$1; echo subjectAltName=$3 > $1.ext; "
        "openssl x509 -req -in $1.csr -CA $2.pem -CAkey $2.key -CAcreateserial -out $1.pem "
        "-days 2 -extfile $1.ext; }\n"
        "ca ca; ca other\n"
        "leaf server ca DNS:localhost; leaf client ca DNS:client; leaf stranger other "
        "DNS:stranger\n"
        "printf '# deja test tokens\\n\\n  " +
        std::string(kToken) + "  \\n" + kSecondToken +
        "\\n' > tokens\n"
        "printf '# none\\n\\n' > empty_tokens\n";
    std::ofstream(dir_.File("make.sh")) << script;
    std::string out;
    if (RunShell("sh " + dir_.File("make.sh"), &out) != 0) error_ = "openssl failed: " + out;
  }

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  std::string File(const std::string& name) const { return dir_.File(name); }
  std::string Pem(const std::string& name) const { return Read(File(name + ".pem")); }
  std::string Key(const std::string& name) const { return Read(File(name + ".key")); }

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
  static std::string Read(const std::string& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

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
