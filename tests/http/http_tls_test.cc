// HttpServer over TLS, against curl (OpenSSL's client): a certificate the client checks,
// keep-alive and streamed replies over TLS, client certificates when a CA is given (a client
// without one, or with one of another CA, is refused), plaintext on a TLS port refused while the
// server keeps serving, and bad PEM material an error at start.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <thread>

#include "http/http_server.h"
#include "tests/common/run_shell.h"
#include "tests/common/temp_dir.h"
#include "tests/common/test_pki.h"

namespace deja::http {
namespace {

using test_util::RunShell;

// tests/common/test_pki.h's certificates.
class Pki {
 public:
  Pki() {
    const std::string error = test_util::MakeTestPki(dir_.path());
    ok_ = error.empty();
    EXPECT_TRUE(ok_) << error;
  }
  bool ok() const { return ok_; }
  std::string File(const std::string& name) const { return dir_.File(name); }
  std::string Pem(const std::string& name) const {
    return test_util::ReadText(File(name + ".pem"));
  }
  std::string Key(const std::string& name) const {
    return test_util::ReadText(File(name + ".key"));
  }

 private:
  test_util::TempDir dir_;
  bool ok_ = false;
};

// curl to https://localhost:<port><path> trusting `ca`; its exit status and output.
int Curl(const Pki& pki, int port, const std::string& path, const std::string& extra,
         std::string* out) {
  return RunShell("curl -sS --max-time 10 --cacert " + pki.File("ca.pem") + " --resolve localhost:" +
                      std::to_string(port) + ":127.0.0.1 " + extra + " https://localhost:" +
                      std::to_string(port) + path,
                  out);
}

std::unique_ptr<HttpServer> StartTls(const Pki& pki, bool client_ca) {
  ServerOptions o;
  o.tls_cert_chain = pki.Pem("server");
  o.tls_private_key = pki.Key("server");
  if (client_ca) o.tls_client_ca = pki.Pem("ca");
  auto s = HttpServer::StartAsync(o, [](const Request& r, std::shared_ptr<Responder> reply) {
    if (r.path == "/stream") {
      // A streamed reply written from another thread.
      std::thread([reply] {
        reply->StartStream(200, "text/event-stream");
        for (int i = 0; i < 3; ++i) reply->Write("data: " + std::to_string(i) + "\n\n");
        reply->End();
      }).detach();
      return;
    }
    Response res;
    res.body = "hello " + r.path;
    reply->Send(std::move(res));
  });
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(*s) : nullptr;
}

TEST(HttpTlsTest, ServesOverTlsKeepsAliveAndStreams) {
  Pki pki;
  ASSERT_TRUE(pki.ok());
  auto server = StartTls(pki, /*client_ca=*/false);
  ASSERT_NE(server, nullptr);
  std::string out;
  // Two requests on one connection (curl reuses it), the second a stream.
  ASSERT_EQ(Curl(pki, server->port(), "/a", "https://localhost:" + std::to_string(server->port()) +
                                               "/stream",
                 &out),
            0)
      << out;
  EXPECT_NE(out.find("hello /a"), std::string::npos) << out;
  EXPECT_NE(out.find("data: 0\n\ndata: 1\n\ndata: 2\n\n"), std::string::npos) << out;
  // Plaintext to the TLS port: refused, and the server keeps serving.
  EXPECT_NE(RunShell("curl -sS --max-time 5 http://127.0.0.1:" + std::to_string(server->port()) +
                         "/plain",
                     &out),
            0);
  EXPECT_EQ(out.find("hello"), std::string::npos) << out;
  // A client that does not trust the server's CA refuses it.
  EXPECT_NE(RunShell("curl -sS --max-time 5 --cacert " + pki.File("other.pem") +
                         " --resolve localhost:" + std::to_string(server->port()) +
                         ":127.0.0.1 https://localhost:" + std::to_string(server->port()) + "/x",
                     &out),
            0);
  ASSERT_EQ(Curl(pki, server->port(), "/again", "", &out), 0) << out;
  EXPECT_NE(out.find("hello /again"), std::string::npos);
  EXPECT_TRUE(server->WaitIdle(std::chrono::seconds(5)));
}

TEST(HttpTlsTest, ClientCertificatesAreRequiredWhenACaIsGiven) {
  Pki pki;
  ASSERT_TRUE(pki.ok());
  auto server = StartTls(pki, /*client_ca=*/true);
  ASSERT_NE(server, nullptr);
  std::string out;
  EXPECT_NE(Curl(pki, server->port(), "/none", "", &out), 0) << out;
  EXPECT_NE(Curl(pki, server->port(), "/stranger",
                 "--cert " + pki.File("stranger.pem") + " --key " + pki.File("stranger.key"), &out),
            0)
      << out;
  ASSERT_EQ(Curl(pki, server->port(), "/client",
                 "--cert " + pki.File("client.pem") + " --key " + pki.File("client.key"), &out),
            0)
      << out;
  EXPECT_NE(out.find("hello /client"), std::string::npos) << out;
}

TEST(HttpTlsTest, BadPemMaterialIsAnErrorAtStart) {
  Pki pki;
  ASSERT_TRUE(pki.ok());
  ServerOptions o;
  o.tls_cert_chain = pki.Pem("server");
  auto half = HttpServer::Start(o, [](const Request&) { return Response(); });
  ASSERT_FALSE(half.ok());
  EXPECT_NE(half.status().message().find("go together"), std::string::npos);
  o.tls_private_key = "-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n";
  auto bad = HttpServer::Start(o, [](const Request&) { return Response(); });
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("TLS"), std::string::npos) << bad.status().ToString();
  o.tls_private_key = pki.Key("client");  // not the certificate's key
  EXPECT_FALSE(HttpServer::Start(o, [](const Request&) { return Response(); }).ok());
}

}  // namespace
}  // namespace deja::http
