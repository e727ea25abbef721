// The internal plane under attack, with real processes. `deja serve --tp 2` serves the workers'
// Rendezvous only on its internal listener, and only to callers with the group secret it handed
// its workers through their environment. The attack replayed: a worker is killed, and while its
// rank is free a client keeps trying to register a worker of its own (and to read and write the
// group's keys) on the public port (UNIMPLEMENTED: not served there, not listed by reflection)
// and on the internal port without the secret or with a wrong one (UNAUTHENTICATED). The group
// recovers with the real workers, the client's worker never hears from the coordinator, and
// generation equals the single-process run. The workers refuse Step and GetStatus without the
// secret. A standalone `deja coordinator` does not start without a secret unless told to.
#include "proto/internal_plane.h"

#include <signal.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>

#include "deja/v1/worker.grpc.pb.h"
#include "reference_model.h"
#include "serving_util.h"
#include "tests/common/temp_dir.h"
#include "tests/worker_service/step_util.h"

namespace deja::serving_test {
namespace {

// The attacker's worker: answers nothing useful, counts what reaches it.
class FakeWorker final : public v1::Worker::Service {
 public:
  FakeWorker() {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(this);
    server_ = b.BuildAndStart();
  }
  ~FakeWorker() override { server_->Shutdown(std::chrono::system_clock::now()); }
  grpc::Status Step(grpc::ServerContext*,
                    grpc::ServerReaderWriter<v1::StepResponse, v1::StepRequest>* stream) override {
    ++calls_;
    v1::StepRequest req;
    while (stream->Read(&req)) ++steps_;
    return grpc::Status::OK;
  }
  grpc::Status GetStatus(grpc::ServerContext*, const v1::GetStatusRequest*,
                         v1::WorkerStatus*) override {
    ++calls_;
    return grpc::Status::OK;
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  int calls() const { return calls_.load(); }
  int steps() const { return steps_.load(); }

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::atomic<int> calls_{0};
  std::atomic<int> steps_{0};
};

// Keeps calling Register (for every rank, with the fake worker's address), Set, Get and Wait on
// each target until stopped; counts the status codes per target.
class Attacker {
 public:
  struct Target {
    std::string name;
    std::shared_ptr<grpc::Channel> channel;
    std::string secret;  // "" sends none
  };
  Attacker(std::vector<Target> targets, std::string fake_address)
      : targets_(std::move(targets)), fake_address_(std::move(fake_address)) {
    thread_ = std::thread([this] { Run(); });
  }
  ~Attacker() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // target name -> code -> count.
  std::map<std::string, std::map<int, int>> codes() {
    std::lock_guard<std::mutex> lock(mu_);
    return codes_;
  }

 private:
  void Run() {
    for (uint32_t round = 0; !stop_; ++round) {
      for (const Target& t : targets_) {
        auto stub = v1::Rendezvous::NewStub(t.channel);
        auto ctx = [&] {
          auto c = std::make_unique<grpc::ClientContext>();
          SetDeadline(c.get(), milliseconds(2000));
          proto::AttachGroupSecret(c.get(), t.secret);
          return c;
        };
        v1::RegisterRequest reg;
        reg.set_rank(round % 2);
        reg.set_world_size(2);
        reg.set_address(fake_address_);
        reg.set_pid(4242);
        v1::RegisterResponse reg_resp;
        Record(t.name, stub->Register(ctx().get(), reg, &reg_resp));
        for (uint64_t epoch = 1; epoch <= 4; ++epoch) {
          v1::SetRequest set;
          set.set_key("epoch" + std::to_string(epoch) + "/gloo/" + std::to_string(round % 2));
          set.set_value(std::string(600, 'A'));
          v1::SetResponse set_resp;
          Record(t.name, stub->Set(ctx().get(), set, &set_resp));
        }
        v1::GetRequest get;
        get.set_key("epoch2/gloo/0");
        get.set_timeout_ms(10);
        v1::GetResponse get_resp;
        Record(t.name, stub->Get(ctx().get(), get, &get_resp));
        v1::WaitRequest wait;
        wait.add_keys("epoch2/gloo/1");
        wait.set_timeout_ms(10);
        v1::WaitResponse wait_resp;
        Record(t.name, stub->Wait(ctx().get(), wait, &wait_resp));
      }
      std::this_thread::sleep_for(milliseconds(20));
    }
  }
  void Record(const std::string& target, const grpc::Status& s) {
    std::lock_guard<std::mutex> lock(mu_);
    ++codes_[target][s.error_code()];
  }

  const std::vector<Target> targets_;
  const std::string fake_address_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::map<std::string, std::map<int, int>> codes_;
  std::thread thread_;
};

// The pids the rendezvous admitted in its newest group epoch, from the coordinator's log.
std::set<pid_t> PidsOfNewestEpoch(const std::string& log) {
  const std::regex re(
      "rendezvous: rank [0-9]+/[0-9]+ at [^ ]+ \\(pid ([0-9]+)\\) joined group epoch ([0-9]+)");
  std::map<int, std::set<pid_t>> by_epoch;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator();
       ++it) {
    by_epoch[std::stoi((*it)[2].str())].insert(std::stoi((*it)[1].str()));
  }
  return by_epoch.empty() ? std::set<pid_t>() : by_epoch.rbegin()->second;
}

// A process's environment variable, read from /proc (same user only).
std::string EnvOf(pid_t pid, const std::string& name) {
  const std::string env = ReadFile("/proc/" + std::to_string(pid) + "/environ");
  const std::string key = name + "=";
  for (size_t at = 0; at < env.size();) {
    const size_t end = env.find('\0', at);
    const std::string entry = env.substr(at, end == std::string::npos ? end : end - at);
    if (entry.rfind(key, 0) == 0) return entry.substr(key.size());
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return "";
}

// Worker.GetStatus and a Worker.Step with a real prompt, sending `secret` ("" for none); the
// codes of both.
std::pair<grpc::StatusCode, grpc::StatusCode> CallWorker(const std::string& address,
                                                         const std::string& secret) {
  auto stub = v1::Worker::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  SetDeadline(&ctx, milliseconds(5000));
  proto::AttachGroupSecret(&ctx, secret);
  v1::WorkerStatus st;
  const grpc::StatusCode status_code =
      stub->GetStatus(&ctx, v1::GetStatusRequest(), &st).error_code();
  grpc::ClientContext step_ctx;
  SetDeadline(&step_ctx, milliseconds(5000));
  proto::AttachGroupSecret(&step_ctx, secret);
  auto stream = stub->Step(&step_ctx);
  v1::StepRequest req;
  req.set_step_id(1);
  *req.add_sequences() = test_util::FirstChunk(99, {2, 133, 9}, 3, 4);
  stream->Write(req);
  stream->WritesDone();
  v1::StepResponse resp;
  while (stream->Read(&resp)) {
  }
  return {status_code, stream->Finish().error_code()};
}

TEST(InternalPlaneTest, AFreedRankCannotBeTakenAndTheGroupRecovers) {
  std::unique_ptr<ReferenceModel> ref = ReferenceModel::Load();
  ASSERT_TRUE(ref->ok());
  Server server("plane", {DEJA_BINARY, "serve", "--model", ModelDir(), "--tp", "2", "--port", "0",
                          "--metrics-port", "-1", "--http-port", "-1", "--threads", "1"});
  ASSERT_TRUE(server.WaitListening()) << server.Log();
  ASSERT_TRUE(WaitHealth(server.channel(), kServing)) << server.Log();
  ASSERT_NE(server.internal_target(), server.target());
  auto internal = grpc::CreateChannel(server.internal_target(), grpc::InsecureChannelCredentials());

  // The public port lists only the public services; the internal one offers no reflection or
  // health to a stranger.
  const std::string listing = ReflectionListing(server.channel());
  EXPECT_NE(listing.find("deja.v1.TextGeneration"), std::string::npos) << listing;
  EXPECT_EQ(listing.find("Rendezvous"), std::string::npos) << listing;
  EXPECT_EQ(ReflectionListing(internal), "");
  EXPECT_EQ(Health(internal, ""), -1);

  // The secret went to the workers in their environment, never on a command line.
  const std::vector<pid_t> pids = server.WorkerPids();
  ASSERT_EQ(pids.size(), 2u) << server.Log();
  const std::string secret = EnvOf(pids[0], proto::kGroupSecretEnv);
  ASSERT_EQ(secret.size(), 64u);
  EXPECT_EQ(EnvOf(pids[1], proto::kGroupSecretEnv), secret);
  EXPECT_EQ(EnvOf(server.process().pid(), proto::kGroupSecretEnv), "");
  for (pid_t p : {server.process().pid(), pids[0], pids[1]}) {
    EXPECT_EQ(ReadFile("/proc/" + std::to_string(p) + "/cmdline").find(secret), std::string::npos);
  }
  const std::string wrong = std::string(secret.rbegin(), secret.rend());

  FakeWorker fake;
  const int groups = server.GroupsStarted();
  Attacker attacker({{"public", server.channel(), ""},
                     {"public+secret", server.channel(), secret},
                     {"internal, no secret", internal, ""},
                     {"internal, wrong secret", internal, wrong}},
                    fake.address());
  std::this_thread::sleep_for(milliseconds(300));
  ASSERT_EQ(::kill(pids[1], SIGKILL), 0);
  // The launcher restarts the group; the attacker keeps trying while the rank is free and while
  // the new group registers and warms up.
  EXPECT_TRUE(server.GroupsStarted() > groups ||
              WaitHealth(server.channel(), kNotServing, milliseconds(5000)));
  ASSERT_TRUE(WaitHealth(server.channel(), kServing, milliseconds(90000))) << server.Log();
  std::this_thread::sleep_for(milliseconds(500));
  attacker.Stop();

  const auto codes = attacker.codes();
  ASSERT_EQ(codes.size(), 4u);
  for (const auto& [target, by_code] : codes) {
    const int want = target.rfind("public", 0) == 0 ? grpc::StatusCode::UNIMPLEMENTED
                                                    : grpc::StatusCode::UNAUTHENTICATED;
    int total = 0;
    for (const auto& [code, n] : by_code) {
      EXPECT_EQ(code, want) << target << ": " << n << " calls got code " << code;
      total += n;
    }
    std::printf("%s: %d calls, each must get code %d\n", target.c_str(), total, want);
    EXPECT_GE(total, 60) << target;
  }
  EXPECT_EQ(fake.calls(), 0);
  EXPECT_EQ(fake.steps(), 0);
  EXPECT_NE(server.Log().find("refused Rendezvous."), std::string::npos);

  // The recovered group is the launcher's new workers, and they serve correctly.
  EXPECT_GT(server.GroupsStarted(), groups);
  const std::vector<pid_t> now = server.WorkerPids();
  EXPECT_EQ(PidsOfNewestEpoch(server.Log()), std::set<pid_t>(now.begin(), now.end()))
      << server.Log();
  const std::vector<int32_t> got = ServedGreedy(server.stub(), "And God said", 16);
  worker::model::GenerationOptions o;
  o.max_new_tokens = 16;
  EXPECT_EQ(got, ref->Generate("And God said", o));

  // The workers themselves refuse callers without the secret.
  const std::vector<std::string> workers = server.WorkerAddresses(2);
  for (const std::string& address : workers) {
    ASSERT_FALSE(address.empty()) << server.Log();
    for (const std::string& bad : {std::string(), wrong}) {
      const auto [status_code, step_code] = CallWorker(address, bad);
      EXPECT_EQ(status_code, grpc::StatusCode::UNAUTHENTICATED) << address;
      EXPECT_EQ(step_code, grpc::StatusCode::UNAUTHENTICATED) << address;
    }
  }
  // Still serving after all that.
  EXPECT_EQ(ServedGreedy(server.stub(), "And God said", 16), got);
}

TEST(InternalPlaneTest, StandaloneCommandsNeedASecretOrInsecureInternal) {
  test_util::TempDir tmp;
  std::vector<std::string> coordinator = {DEJA_BINARY, "coordinator", "--model", ModelDir()};
  coordinator.insert(coordinator.end(), {"--tp", "2", "--port", "0", "--metrics-port", "-1", "--http-port", "-1"});
  coordinator.insert(coordinator.end(), {"--internal-port", "0"});
  test_util::ChildProcess none(coordinator, tmp.File("none.log"));
  EXPECT_EQ(none.ExitCode(milliseconds(20000)), 2) << none.Log();
  EXPECT_NE(none.Log().find("no group secret"), std::string::npos) << none.Log();
  EXPECT_NE(none.Log().find("--insecure-internal"), std::string::npos) << none.Log();

  const std::string short_file = tmp.File("short");
  test_util::WriteBytes(short_file, "hunter2\n");
  std::vector<std::string> args = coordinator;
  args.insert(args.end(), {"--group-secret-file", short_file});
  test_util::ChildProcess too_short(args, tmp.File("short.log"));
  EXPECT_EQ(too_short.ExitCode(milliseconds(20000)), 2) << too_short.Log();
  EXPECT_NE(too_short.Log().find("at least 16"), std::string::npos) << too_short.Log();

  args = coordinator;
  args.insert(args.end(), {"--group-secret-file", tmp.File("missing")});
  test_util::ChildProcess missing(args, tmp.File("missing.log"));
  EXPECT_EQ(missing.ExitCode(milliseconds(20000)), 2) << missing.Log();
  EXPECT_NE(missing.Log().find("cannot read the group secret file"), std::string::npos)
      << missing.Log();

  args = coordinator;
  args.push_back("--insecure-internal");
  Server insecure("insecure", args);
  ASSERT_TRUE(insecure.WaitListening()) << insecure.Log();
  EXPECT_NE(insecure.Log().find("without a group secret"), std::string::npos) << insecure.Log();
  ASSERT_EQ(::kill(insecure.process().pid(), SIGTERM), 0);
  EXPECT_EQ(insecure.process().ExitCode(milliseconds(15000)), 0) << insecure.Log();
}

}  // namespace
}  // namespace deja::serving_test
