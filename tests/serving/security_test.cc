// The public API's security with real `deja serve` processes on loopback: TLS (a plaintext
// client is refused; health and reflection answer on the TLS port without a token), mutual TLS
// (no client certificate, or one from another CA, is refused), bearer tokens (none or a wrong
// one is UNAUTHENTICATED on every method, counted as a rejection and never reaching the engine;
// the right one gives the open server's greedy text), /metrics with --metrics-auth, `deja
// client` and the Python example with the flags, the loopback default bind, and bad flag values
// naming the flag. Certificates are made with the `openssl` CLI at test time.
#include <ifaddrs.h>
#include <net/if.h>

#include <cmath>
#include <cstdlib>

#include "security_util.h"
#include "serving_util.h"

namespace deja::serving_test {
namespace {

v1::GenerateRequest Greedy(int max_new = 16) {
  v1::GenerateRequest r;
  r.set_text("And God said");
  r.mutable_stopping()->set_max_new_tokens(max_new);
  r.mutable_stopping()->set_ignore_eos(true);
  return r;
}

// Generate with `token` on `channel`; the status, and the text in *text.
grpc::Status GenerateWith(const std::shared_ptr<grpc::Channel>& channel, const std::string& token,
                          std::string* text = nullptr, const v1::GenerateRequest& req = Greedy()) {
  auto stub = v1::TextGeneration::NewStub(channel);
  v1::GenerateResponse resp;
  grpc::Status s = stub->Generate(CallWith(token).get(), req, &resp);
  if (text != nullptr) *text = resp.text();
  return s;
}

double Series(const std::string& exposition, const std::string& series) {
  const double v = Metric(exposition, series);
  return std::isnan(v) ? 0.0 : v;
}

// Three servers, started once: `open_` (no TLS, no tokens, default host), `tls_` (TLS, tokens,
// --metrics-auth) and `mtls_` (TLS with client certificates required).
class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    pki_ = new TestPki();
    if (!pki_->ok()) return;
    open_ = new Server("open", ServeArgs({}, /*tp=*/1));
    tls_ = new Server("tls", ServeArgs({"--tls-cert", pki_->File("server.pem"), "--tls-key",
                                        pki_->File("server.key"), "--auth-token-file",
                                        pki_->File("tokens"), "--metrics-auth"},
                                       /*tp=*/1));
    mtls_ = new Server(
        "mtls", ServeArgs({"--tls-cert", pki_->File("server.pem"), "--tls-key",
                           pki_->File("server.key"), "--tls-client-ca", pki_->File("ca.pem")},
                          /*tp=*/1));
  }
  static void TearDownTestSuite() {
    delete open_;
    delete tls_;
    delete mtls_;
    delete pki_;
  }
  void SetUp() override {
    ASSERT_TRUE(pki_->ok()) << pki_->error();
    for (Server* s : {open_, tls_, mtls_}) ASSERT_TRUE(s->WaitListening()) << s->Log();
    ASSERT_TRUE(WaitHealth(open_->channel(), kServing)) << open_->Log();
    ASSERT_TRUE(WaitHealth(pki_->Channel(tls_->target()), kServing)) << tls_->Log();
    ASSERT_TRUE(WaitHealth(pki_->Channel(mtls_->target(), "client"), kServing)) << mtls_->Log();
  }
  // The open server's greedy text, the reference for every authenticated call.
  static std::string Expected() {
    std::string text;
    EXPECT_TRUE(GenerateWith(open_->channel(), "", &text).ok());
    EXPECT_FALSE(text.empty());
    return text;
  }
  // `deja client generate` against the TLS server with `flags`; its exit code and output.
  static int Client(const std::string& name, std::vector<std::string> flags, std::string* log,
                    const std::string& env = "") {
    std::vector<std::string> args;
    if (!env.empty()) args = {"/usr/bin/env", env};
    for (const char* a : {DEJA_BINARY, "client", "generate", "--prompt", "And God said",
                          "--max-new-tokens", "16", "--ignore-eos", "--timeout-ms", "20000"}) {
      args.push_back(a);
    }
    args.insert(args.end(), flags.begin(), flags.end());
    test_util::ChildProcess p(args, LogPath("client_" + name));
    const int code = p.ExitCode(milliseconds(30000));
    *log = p.Log();
    return code;
  }

  static inline TestPki* pki_ = nullptr;
  static inline Server* open_ = nullptr;
  static inline Server* tls_ = nullptr;
  static inline Server* mtls_ = nullptr;
};

TEST_F(SecurityTest, TlsServesAndAPlaintextClientIsRefused) {
  std::string text;
  grpc::Status s = GenerateWith(pki_->Channel(tls_->target()), TestPki::kToken, &text);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(text, Expected());
  // Health (liveness and readiness) and reflection on the TLS port, without a token.
  EXPECT_EQ(Health(pki_->Channel(tls_->target()), ""), kServing);
  EXPECT_NE(ReflectionListing(pki_->Channel(tls_->target())).find("deja.v1.TextGeneration"),
            std::string::npos);
  // Plaintext: no handshake, so no call at all, with or without a token.
  auto plain = grpc::CreateChannel(tls_->target(), grpc::InsecureChannelCredentials());
  EXPECT_EQ(GenerateWith(plain, TestPki::kToken).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Health(plain, ""), -1);
  // The certificate names "localhost" only: dialing 127.0.0.1 without naming it fails.
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = pki_->Pem("ca");
  auto unnamed = grpc::CreateChannel(tls_->target(), grpc::SslCredentials(ssl));
  EXPECT_EQ(GenerateWith(unnamed, TestPki::kToken).error_code(), grpc::StatusCode::UNAVAILABLE);
  // A client trusting another CA refuses the server.
  ssl.pem_root_certs = pki_->Pem("other");
  grpc::ChannelArguments named;
  named.SetSslTargetNameOverride("localhost");
  auto distrust = grpc::CreateCustomChannel(tls_->target(), grpc::SslCredentials(ssl), named);
  EXPECT_EQ(GenerateWith(distrust, TestPki::kToken).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(SecurityTest, MutualTlsRefusesClientsWithoutACertificateOfItsCa) {
  std::string text;
  grpc::Status s = GenerateWith(pki_->Channel(mtls_->target(), "client"), "", &text);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(text, Expected());
  EXPECT_EQ(GenerateWith(pki_->Channel(mtls_->target()), "").error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Health(pki_->Channel(mtls_->target()), ""), -1);
  EXPECT_EQ(GenerateWith(pki_->Channel(mtls_->target(), "stranger"), "").error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Health(pki_->Channel(mtls_->target(), "stranger"), ""), -1);
}

TEST_F(SecurityTest, EveryMethodNeedsAnAcceptedTokenAndRefusalsNeverReachTheEngine) {
  auto channel = pki_->Channel(tls_->target());
  auto stub = v1::TextGeneration::NewStub(channel);
  auto scrape = [&] {
    const std::string r = HttpGetMetrics(
        tls_->metrics_port(), "Authorization: Bearer " + std::string(TestPki::kToken) + "\r\n");
    return r.substr(std::min(r.size(), r.find("\r\n\r\n")));
  };
  const std::string before = scrape();
  int refused = 0;
  for (const std::string& token :
       {std::string(), std::string("not-a-token"), std::string(TestPki::kToken) + "x"}) {
    SCOPED_TRACE("token '" + token + "'");
    v1::GenerateResponse g;
    grpc::Status s = stub->Generate(CallWith(token).get(), Greedy(), &g);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
    auto stream_ctx = CallWith(token);  // outlives the reader
    auto reader = stub->GenerateStream(stream_ctx.get(), Greedy());
    v1::GenerateStreamResponse m;
    EXPECT_FALSE(reader->Read(&m));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
    v1::TokenizeRequest tr;
    tr.set_text("hi");
    v1::TokenizeResponse t;
    EXPECT_EQ(stub->Tokenize(CallWith(token).get(), tr, &t).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::ModelInfo info;
    EXPECT_EQ(
        stub->GetModelInfo(CallWith(token).get(), v1::GetModelInfoRequest(), &info).error_code(),
        grpc::StatusCode::UNAUTHENTICATED);
    v1::CancelRequest cr;
    cr.set_request_id("x");
    v1::CancelResponse c;
    EXPECT_EQ(stub->Cancel(CallWith(token).get(), cr, &c).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    refused += 5;
  }
  // A token in another scheme is refused too.
  {
    auto ctx = CallWith("");
    ctx->AddMetadata("authorization", std::string("Basic ") + TestPki::kToken);
    v1::ModelInfo info;
    EXPECT_EQ(stub->GetModelInfo(ctx.get(), v1::GetModelInfoRequest(), &info).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    ++refused;
  }
  const std::string after = scrape();
  const std::string rejected = "deja_coordinator_rejections_total{protocol=\"grpc\",reason=\"unauthenticated\"}";
  EXPECT_EQ(Series(after, rejected) - Series(before, rejected), refused) << after;
  EXPECT_EQ(Series(after, "deja_coordinator_prompt_tokens_total"),
            Series(before, "deja_coordinator_prompt_tokens_total"));
  // Both tokens of the file work, on every method; the scheme's case does not matter.
  for (const char* token : {TestPki::kToken, TestPki::kSecondToken}) {
    std::string text;
    grpc::Status s = GenerateWith(channel, token, &text);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(text, Expected());
    v1::TokenizeRequest tr;
    tr.set_text("hi");
    v1::TokenizeResponse t;
    EXPECT_TRUE(stub->Tokenize(CallWith(token).get(), tr, &t).ok());
    v1::ModelInfo info;
    EXPECT_TRUE(stub->GetModelInfo(CallWith(token).get(), v1::GetModelInfoRequest(), &info).ok());
  }
  auto ctx = CallWith("");
  ctx->AddMetadata("authorization", std::string("bearer ") + TestPki::kToken);
  v1::ModelInfo info;
  EXPECT_TRUE(stub->GetModelInfo(ctx.get(), v1::GetModelInfoRequest(), &info).ok());
}

TEST_F(SecurityTest, MetricsAuthAsksForTheToken) {
  const std::string none = HttpGetMetrics(tls_->metrics_port());
  EXPECT_EQ(none.rfind("HTTP/1.1 401 ", 0), 0u) << none;
  EXPECT_NE(none.find("\r\nWWW-Authenticate: Bearer"), std::string::npos) << none;
  EXPECT_EQ(none.find("deja_"), std::string::npos) << none;
  const std::string wrong = HttpGetMetrics(tls_->metrics_port(), "Authorization: Bearer nope\r\n");
  EXPECT_EQ(wrong.rfind("HTTP/1.1 401 ", 0), 0u) << wrong;
  const std::string right = HttpGetMetrics(
      tls_->metrics_port(), "authorization: Bearer " + std::string(TestPki::kSecondToken) + "\r\n");
  EXPECT_EQ(right.rfind("HTTP/1.1 200 ", 0), 0u) << right;
  EXPECT_NE(right.find("deja_coordinator_requests_total"), std::string::npos);
  // Without --metrics-auth, /metrics stays open.
  EXPECT_NE(Scrape(open_->metrics_port()).find("deja_coordinator_requests_total"),
            std::string::npos);
}

TEST_F(SecurityTest, DejaClientWithTheFlags) {
  const std::string expected = Expected();
  const std::string target = tls_->target();
  const std::vector<std::string> tls = {
      "--target", target, "--tls-ca", pki_->File("ca.pem"), "--tls-server-name", "localhost"};
  std::string log;
  std::vector<std::string> flags = tls;
  flags.insert(flags.end(), {"--auth-token-file", pki_->File("tokens")});
  EXPECT_EQ(Client("file", flags, &log), 0) << log;
  EXPECT_NE(log.find(expected + "\n"), std::string::npos) << log;
  EXPECT_EQ(Client("env", tls, &log, std::string("DEJA_AUTH_TOKEN=") + TestPki::kSecondToken), 0)
      << log;
  EXPECT_NE(log.find(expected + "\n"), std::string::npos) << log;
  EXPECT_EQ(Client("no_token", tls, &log), 1) << log;
  EXPECT_NE(log.find("UNAUTHENTICATED"), std::string::npos) << log;
  EXPECT_EQ(
      Client("plaintext", {"--target", target, "--auth-token-file", pki_->File("tokens")}, &log), 1)
      << log;
  EXPECT_NE(log.find("UNAVAILABLE"), std::string::npos) << log;
  // Mutual TLS: the client certificate of the server's CA.
  const std::vector<std::string> mtls = {"--target",          mtls_->target(),
                                         "--tls-ca",          pki_->File("ca.pem"),
                                         "--tls-server-name", "localhost",
                                         "--tls-cert",        pki_->File("client.pem"),
                                         "--tls-key",         pki_->File("client.key")};
  EXPECT_EQ(Client("mtls", mtls, &log), 0) << log;
  EXPECT_NE(log.find(expected + "\n"), std::string::npos) << log;
  // Flags that do not go together, or files that are not what they should be.
  EXPECT_EQ(Client("half_pair", {"--target", target, "--tls-cert", pki_->File("client.pem")}, &log),
            2);
  EXPECT_NE(log.find("--tls-cert and --tls-key go together"), std::string::npos) << log;
  EXPECT_EQ(Client("bad_ca", {"--target", target, "--tls-ca", pki_->File("tokens")}, &log), 2);
  EXPECT_NE(log.find("--tls-ca"), std::string::npos) << log;
  EXPECT_EQ(Client("bad_pair",
                   {"--target", target, "--tls-ca", pki_->File("ca.pem"), "--tls-cert",
                    pki_->File("client.pem"), "--tls-key", pki_->File("stranger.key")},
                   &log),
            2);
  EXPECT_NE(log.find("--tls-key"), std::string::npos) << log;
  EXPECT_EQ(Client("name_plain", {"--target", target, "--tls-server-name", "x"}, &log), 2);
  EXPECT_NE(log.find("--tls-server-name"), std::string::npos) << log;
  EXPECT_EQ(Client("no_tokens",
                   {"--target", target, "--auth-token-file", pki_->File("empty_tokens")}, &log),
            2);
  EXPECT_NE(log.find("--auth-token-file"), std::string::npos) << log;
}

std::string Python() {
  const char* py = std::getenv("DEJA_PYTHON");
  return py ? py : "python3";
}

TEST_F(SecurityTest, PythonExampleWithTlsAndToken) {
  std::string out;
  if (RunShell(Python() + " -c 'import grpc, grpc_tools'", &out) != 0) {
    GTEST_SKIP() << "grpcio/grpcio-tools not importable by " << Python() << " (pip install "
                 << "grpcio grpcio-tools, or set DEJA_PYTHON)";
  }
  test_util::TempDir gen;
  ASSERT_EQ(RunShell(Python() + " -m grpc_tools.protoc -I " + SourceDir() +
                         "/proto --python_out=" + gen.path() + " --grpc_python_out=" + gen.path() +
                         " " + SourceDir() + "/proto/deja/v1/text_generation.proto",
                     &out),
            0)
      << out;
  const std::string expected = Expected();
  const std::string client = Python() + " " + SourceDir() +
                             "/examples/python_client.py --timeout 30 --gen-dir " + gen.path() +
                             " --tls-ca " + pki_->File("ca.pem") + " --tls-server-name localhost";
  const std::string request = " generate 'And God said' --max-new-tokens 16";
  // Greedy decoding stops at EOS; the C++ reference ignores it, so compare prefixes.
  auto same_start = [&](const std::string& got) {
    const std::string line = got.substr(0, got.find('\n'));
    return !line.empty() && expected.rfind(line, 0) == 0;
  };
  ASSERT_EQ(RunShell(client + " --target " + tls_->target() + " --auth-token-file " +
                         pki_->File("tokens") + request,
                     &out),
            0)
      << out;
  EXPECT_TRUE(same_start(out)) << out << "\nexpected " << expected;
  ASSERT_EQ(RunShell("DEJA_AUTH_TOKEN=" + std::string(TestPki::kSecondToken) + " " + client +
                         " --target " + tls_->target() + request,
                     &out),
            0)
      << out;
  EXPECT_TRUE(same_start(out)) << out;
  EXPECT_NE(RunShell(client + " --target " + tls_->target() + request, &out), 0);
  EXPECT_NE(out.find("UNAUTHENTICATED"), std::string::npos) << out;
  ASSERT_EQ(
      RunShell(client + " --target " + mtls_->target() + " --tls-cert " + pki_->File("client.pem") +
                   " --tls-key " + pki_->File("client.key") + request,
               &out),
      0)
      << out;
  EXPECT_TRUE(same_start(out)) << out;
}

// The first IPv4 address of this host that is not loopback, or "".
std::string NonLoopbackAddress() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* a = list; a != nullptr && found.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if ((a->ifa_flags & IFF_LOOPBACK) != 0 || (a->ifa_flags & IFF_UP) == 0) continue;
    char buf[INET_ADDRSTRLEN];
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    if (::inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf)) != nullptr) found = buf;
  }
  ::freeifaddrs(list);
  return found;
}

// errno of a TCP connect to ip:port (0 when it connected).
int ConnectErrno(const std::string& ip, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, ip.c_str(), &addr.sin_addr);
  const int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  const int err = rc == 0 ? 0 : errno;
  ::close(fd);
  return err;
}

TEST_F(SecurityTest, WithoutHostTheServerListensOnLoopbackOnly) {
  const int port = std::stoi(open_->target().substr(open_->target().rfind(':') + 1));
  EXPECT_NE(open_->Log().find("serving on 127.0.0.1:"), std::string::npos) << open_->Log();
  EXPECT_EQ(ListenAddress(port), "0100007F");
  EXPECT_EQ(ListenAddress(open_->metrics_port()), "0100007F");
  const std::string ip = NonLoopbackAddress();
  if (ip.empty()) {
    GTEST_SKIP() << "no non-loopback IPv4 address to try";
  }
  EXPECT_EQ(ConnectErrno(ip, port), ECONNREFUSED) << ip;
  EXPECT_EQ(ConnectErrno(ip, open_->metrics_port()), ECONNREFUSED) << ip;
  EXPECT_EQ(ConnectErrno("127.0.0.1", port), 0);
}

// A bad file or combination stops `deja serve` / `deja coordinator` at once, naming the flag.
TEST(SecurityFlagsTest, BadValuesFailAtOnceNamingTheFlag) {
  TestPki pki;
  ASSERT_TRUE(pki.ok()) << pki.error();
  const std::string cert = pki.File("server.pem"), key = pki.File("server.key");
  const std::string missing = pki.File("missing.pem");
  struct Case {
    const char* name;
    std::vector<std::string> flags;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"cert_missing", {"--tls-cert", missing, "--tls-key", key}, "--tls-cert: " + missing},
      {"key_missing", {"--tls-cert", cert, "--tls-key", missing}, "--tls-key: " + missing},
      {"cert_alone", {"--tls-cert", cert}, "--tls-cert and --tls-key go together"},
      {"key_alone", {"--tls-key", key}, "--tls-cert and --tls-key go together"},
      {"cert_not_pem",
       {"--tls-cert", pki.File("tokens"), "--tls-key", key},
       "--tls-cert: " + pki.File("tokens") + " holds no PEM certificate"},
      {"key_not_pem", {"--tls-cert", cert, "--tls-key", cert}, "--tls-key: " + cert},
      {"key_mismatch",
       {"--tls-cert", cert, "--tls-key", pki.File("stranger.key")},
       "is not the key of the certificate in --tls-cert"},
      {"ca_not_pem",
       {"--tls-cert", cert, "--tls-key", key, "--tls-client-ca", pki.File("server.key")},
       "--tls-client-ca: " + pki.File("server.key") + " holds no PEM certificate"},
      {"ca_without_tls",
       {"--tls-client-ca", pki.File("ca.pem")},
       "--tls-client-ca needs --tls-cert"},
      {"tokens_missing", {"--auth-token-file", missing}, "--auth-token-file: " + missing},
      {"tokens_empty",
       {"--auth-token-file", pki.File("empty_tokens")},
       "--auth-token-file: " + pki.File("empty_tokens") + " holds no token"},
      {"metrics_auth_alone", {"--metrics-auth"}, "--metrics-auth needs --auth-token-file"},
  };
  for (const char* command : {"serve", "coordinator"}) {
    for (const Case& c : cases) {
      std::vector<std::string> args = {DEJA_BINARY, command, "--model",        ModelDir(),
                                       "--port",    "0",     "--metrics-port", "-1", "--http-port", "-1"};
      // A standalone coordinator also needs a group secret, refused first without one.
      if (std::string(command) == "coordinator") args.push_back("--insecure-internal");
      args.insert(args.end(), c.flags.begin(), c.flags.end());
      test_util::ChildProcess p(args, LogPath(std::string("flags_") + command + "_" + c.name));
      EXPECT_EQ(p.ExitCode(milliseconds(20000)), 2) << command << " " << c.name << ": " << p.Log();
      EXPECT_NE(p.Log().find(c.message), std::string::npos)
          << command << " " << c.name << ": " << p.Log();
    }
  }
}

}  // namespace
}  // namespace deja::serving_test
