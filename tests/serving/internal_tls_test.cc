// Mutual TLS on the internal plane, with real processes and certificates made by openssl in the
// test: `deja serve --tp 2 --internal-tls-*` serves (greedy output equals a single process),
// with one certificate for the group named by --internal-tls-server-name, not by address;
// its internal port and the workers' ports refuse plaintext, a client without a certificate and
// one whose certificate another CA signed; a client with a good certificate still needs the
// group secret; a partial set of TLS flags stops `deja coordinator` at once.
#include <signal.h>

#include <cstdlib>
#include <fstream>

#include "deja/v1/worker.grpc.pb.h"
#include "proto/internal_plane.h"
#include "reference_model.h"
#include "serving_util.h"
#include "tests/common/temp_dir.h"

namespace deja::serving_test {
namespace {

// The name in every certificate of the group (and no address).
constexpr char kGroupName[] = "deja-internal";

// A CA and a certificate it signs for kGroupName (server and client use), under `dir` as
// <name>-ca.pem, <name>.pem, <name>.key. False when openssl fails.
bool MakeCertificates(const std::string& dir, const std::string& name) {
  const std::string p = dir + "/" + name;
  {
    std::ofstream ext(p + ".ext");
    ext << "subjectAltName=DNS:" << kGroupName << "\n"
        << "extendedKeyUsage=serverAuth,clientAuth\n";
  }
  const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  const std::string quiet = " >>" + p + ".log 2>&1";
  const std::string commands[] = {
      "openssl req -x509" + ec + " -keyout " + p + "-ca.key -out " + p + "-ca.pem -days 2" +
          " -subj /CN=" + name + "-ca -addext basicConstraints=critical,CA:TRUE" +
          " -addext keyUsage=critical,keyCertSign" + quiet,
      "openssl req" + ec + " -keyout " + p + ".key -out " + p + ".csr -subj /CN=" + name + quiet,
      "openssl x509 -req -in " + p + ".csr -CA " + p + "-ca.pem -CAkey " + p + "-ca.key" +
          " -CAcreateserial -out " + p + ".pem -days 2 -extfile " + p + ".ext" + quiet,
  };
  for (const std::string& c : commands) {
    if (std::system(c.c_str()) != 0) {
      ADD_FAILURE() << c << "\n" << ReadFile(p + ".log");
      return false;
    }
  }
  return true;
}

grpc::SslCredentialsOptions ClientTls(const std::string& dir, const std::string& ca_name,
                                      const std::string& cert_name) {
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = ReadFile(dir + "/" + ca_name + "-ca.pem");
  if (!cert_name.empty()) {
    o.pem_private_key = ReadFile(dir + "/" + cert_name + ".key");
    o.pem_cert_chain = ReadFile(dir + "/" + cert_name + ".pem");
  }
  return o;
}

std::shared_ptr<grpc::Channel> Dial(const std::string& target,
                                    const std::shared_ptr<grpc::ChannelCredentials>& creds) {
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride(kGroupName);
  return grpc::CreateCustomChannel(target, creds, args);
}

// Rendezvous.Get of a key no one sets, through `creds`, with `secret`.
grpc::StatusCode Get(const std::string& target,
                     const std::shared_ptr<grpc::ChannelCredentials>& creds,
                     const std::string& secret) {
  auto stub = v1::Rendezvous::NewStub(Dial(target, creds));
  grpc::ClientContext ctx;
  SetDeadline(&ctx, milliseconds(3000));
  proto::AttachGroupSecret(&ctx, secret);
  v1::GetRequest req;
  req.set_key("nobody/sets/this");
  req.set_timeout_ms(10);
  v1::GetResponse resp;
  return stub->Get(&ctx, req, &resp).error_code();
}

grpc::StatusCode GetStatus(const std::string& target,
                           const std::shared_ptr<grpc::ChannelCredentials>& creds,
                           const std::string& secret) {
  auto stub = v1::Worker::NewStub(Dial(target, creds));
  grpc::ClientContext ctx;
  SetDeadline(&ctx, milliseconds(3000));
  proto::AttachGroupSecret(&ctx, secret);
  v1::WorkerStatus st;
  return stub->GetStatus(&ctx, v1::GetStatusRequest(), &st).error_code();
}

// The group secret `deja serve` handed its worker `pid` (its environment, readable by its user).
std::string SecretOf(pid_t pid) {
  const std::string env = ReadFile("/proc/" + std::to_string(pid) + "/environ");
  const std::string key = std::string(proto::kGroupSecretEnv) + "=";
  const size_t at = env.find(key);
  if (at == std::string::npos) return "";
  return env.substr(at + key.size(), env.find('\0', at) - at - key.size());
}

TEST(InternalTlsTest, ServesOverMutualTlsAndRefusesPeersWithoutAGoodCertificate) {
  test_util::TempDir tmp;
  ASSERT_TRUE(MakeCertificates(tmp.path(), "group"));
  ASSERT_TRUE(MakeCertificates(tmp.path(), "rogue"));
  std::unique_ptr<ReferenceModel> ref = ReferenceModel::Load();
  ASSERT_TRUE(ref->ok());
  const std::string d = tmp.path() + "/";
  std::vector<std::string> args = {DEJA_BINARY, "serve", "--model", ModelDir(), "--tp", "2"};
  args.insert(args.end(), {"--port", "0", "--metrics-port", "-1", "--http-port", "-1", "--threads", "1"});
  args.insert(args.end(), {"--internal-tls-cert", d + "group.pem", "--internal-tls-key",
                           d + "group.key", "--internal-tls-ca", d + "group-ca.pem"});
  args.insert(args.end(), {"--internal-tls-server-name", kGroupName});
  Server server("tls", args);
  ASSERT_TRUE(server.WaitListening()) << server.Log();
  ASSERT_TRUE(WaitHealth(server.channel(), kServing)) << server.Log();
  EXPECT_NE(server.Log().find("(mutual TLS)"), std::string::npos);

  const std::vector<int32_t> got = ServedGreedy(server.stub(), "And God said", 12);
  worker::model::GenerationOptions o;
  o.max_new_tokens = 12;
  EXPECT_EQ(got, ref->Generate("And God said", o));

  const std::vector<pid_t> pids = server.WorkerPids();
  ASSERT_EQ(pids.size(), 2u) << server.Log();
  const std::string secret = SecretOf(pids[0]);
  ASSERT_EQ(secret.size(), 64u);
  const auto plaintext = grpc::InsecureChannelCredentials();
  const auto no_cert = grpc::SslCredentials(ClientTls(tmp.path(), "group", ""));
  const auto rogue = grpc::SslCredentials(ClientTls(tmp.path(), "group", "rogue"));
  const auto good = grpc::SslCredentials(ClientTls(tmp.path(), "group", "group"));
  // The internal port: only a good certificate gets as far as the secret check.
  const std::string internal = server.internal_target();
  for (const auto& creds : {plaintext, no_cert, rogue}) {
    EXPECT_EQ(Get(internal, creds, secret), grpc::StatusCode::UNAVAILABLE);
  }
  EXPECT_EQ(Get(internal, good, ""), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Get(internal, good, secret), grpc::StatusCode::DEADLINE_EXCEEDED);  // let in
  // The workers' ports likewise.
  for (const std::string& worker : server.WorkerAddresses(2)) {
    ASSERT_FALSE(worker.empty()) << server.Log();
    for (const auto& creds : {plaintext, no_cert, rogue}) {
      EXPECT_EQ(GetStatus(worker, creds, secret), grpc::StatusCode::UNAVAILABLE) << worker;
    }
    EXPECT_EQ(GetStatus(worker, good, ""), grpc::StatusCode::UNAUTHENTICATED) << worker;
    EXPECT_EQ(GetStatus(worker, good, secret), grpc::StatusCode::OK) << worker;
  }
  ASSERT_EQ(::kill(server.process().pid(), SIGTERM), 0);
  EXPECT_EQ(server.process().ExitCode(milliseconds(15000)), 0) << server.Log();
}

TEST(InternalTlsTest, APartialSetOfFlagsIsRefused) {
  test_util::TempDir tmp;
  ASSERT_TRUE(MakeCertificates(tmp.path(), "group"));
  test_util::ChildProcess p({DEJA_BINARY, "coordinator", "--model", ModelDir(), "--tp", "2",
                             "--port", "0", "--metrics-port", "-1", "--http-port", "-1", "--internal-port", "0",
                             "--insecure-internal", "--internal-tls-cert", tmp.File("group.pem")},
                            tmp.File("partial.log"));
  EXPECT_EQ(p.ExitCode(milliseconds(20000)), 2) << p.Log();
  EXPECT_NE(p.Log().find("go together"), std::string::npos) << p.Log();
}

}  // namespace
}  // namespace deja::serving_test
