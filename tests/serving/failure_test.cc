// Failure handling and lifecycle with real processes: queue and KV limits refuse at once; a
// worker killed (-9) or hung (SIGSTOP) mid-stream fails in-flight requests with UNAVAILABLE
// within 3 s, readiness drops, the launcher restarts the group and serving resumes; SIGTERM
// drains; `deja coordinator` serves workers started separately (sharing a group secret file,
// meeting on the internal plane).
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "serving_util.h"
#include "tests/common/temp_dir.h"

namespace deja::serving_test {
namespace {

v1::GenerateRequest Long(int max_new, const std::string& id = "") {
  v1::GenerateRequest r;
  r.set_text("And God said");
  r.mutable_stopping()->set_max_new_tokens(max_new);
  r.mutable_stopping()->set_ignore_eos(true);
  r.mutable_response()->set_return_tokens(true);
  if (!id.empty()) r.set_request_id(id);
  return r;
}

grpc::Status Generate(Server& server, const v1::GenerateRequest& req,
                      v1::GenerateResponse* resp = nullptr) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::GenerateResponse local;
  return server.stub().Generate(&ctx, req, resp ? resp : &local);
}

// Streams `req` on a thread; records when the stream ended and how.
class BackgroundStream {
 public:
  BackgroundStream(Server& server, v1::GenerateRequest req) {
    thread_ = std::thread([this, &server, req] {
      grpc::ClientContext ctx;
      SetDeadline(&ctx);
      auto reader = server.stub().GenerateStream(&ctx, req);
      v1::GenerateStreamResponse msg;
      while (reader->Read(&msg)) {
        tokens_ += msg.tokens_size();
        if (msg.finished()) last_ = msg;
      }
      status_ = reader->Finish();
      ended_at_ = Clock::now();
      done_ = true;
    });
  }
  ~BackgroundStream() { Join(); }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  bool WaitTokens(int n, milliseconds timeout = milliseconds(30000)) {
    const auto end = Clock::now() + timeout;
    while (Clock::now() < end && tokens_.load() < n && !done_.load()) {
      std::this_thread::sleep_for(milliseconds(5));
    }
    return tokens_.load() >= n;
  }
  int tokens() const { return tokens_.load(); }
  const grpc::Status& status() const { return status_; }
  const v1::GenerateStreamResponse& last() const { return last_; }
  Clock::time_point ended_at() const { return ended_at_; }

 private:
  std::atomic<int> tokens_{0};
  std::atomic<bool> done_{false};
  grpc::Status status_;
  v1::GenerateStreamResponse last_;
  Clock::time_point ended_at_;
  std::thread thread_;
};

TEST(FailureTest, KilledOrHungWorkerFailsRequestsFastAndTheGroupRecovers) {
  Server server("kill", ServeArgs({}));
  ASSERT_TRUE(server.WaitListening()) << server.Log();
  ASSERT_TRUE(WaitHealth(server.channel(), kServing)) << server.Log();

  for (const int sig : {SIGKILL, SIGSTOP}) {
    const std::vector<pid_t> pids = server.WorkerPids();
    ASSERT_EQ(pids.size(), 2u) << server.Log();
    const int groups = server.GroupsStarted();
    BackgroundStream stream(server, Long(900));
    ASSERT_TRUE(stream.WaitTokens(3)) << server.Log();
    const auto hit = Clock::now();
    ASSERT_EQ(::kill(pids[sig == SIGKILL ? 1 : 0], sig), 0);
    stream.Join();
    EXPECT_EQ(stream.status().error_code(), grpc::StatusCode::UNAVAILABLE)
        << stream.status().error_message();
    EXPECT_LT(stream.ended_at() - hit, milliseconds(3000)) << "signal " << sig;
    EXPECT_LT(stream.tokens(), 900);
    // Readiness drops (or the group is already back), then the restarted group serves.
    EXPECT_TRUE(server.GroupsStarted() > groups ||
                WaitHealth(server.channel(), kNotServing, milliseconds(3000)));
    ASSERT_TRUE(WaitHealth(server.channel(), kServing, milliseconds(60000))) << server.Log();
    EXPECT_GT(server.GroupsStarted(), groups);
    v1::GenerateResponse resp;
    grpc::Status s = Generate(server, Long(8), &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.generated_tokens(), 8u);
  }
  const std::string m = Scrape(server.metrics_port());
  EXPECT_GE(Metric(m, "deja_coordinator_group_losses_total"), 2);
  EXPECT_GE(Metric(m, "deja_coordinator_requests_total{code=\"UNAVAILABLE\",finish_reason=\"\",protocol=\"grpc\"}"),
            2);
}

TEST(FailureTest, QueueAndKvFullAreRefusedAtOnceThenSigtermDrains) {
  // One sequence in the batch, one in the queue, 3 MiB of KV per rank (768 positions of
  // opt-mini at TP 2 and f32).
  Server server("limits", ServeArgs({"--max-batch-sequences", "1", "--max-queue", "1",
                                     "--kv-memory-mb", "3", "--drain-timeout-ms", "20000"}));
  ASSERT_TRUE(server.WaitListening()) << server.Log();
  ASSERT_TRUE(WaitHealth(server.channel(), kServing)) << server.Log();

  // More KV than a rank has in total.
  auto t0 = Clock::now();
  grpc::Status s = Generate(server, Long(900));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_LT(Clock::now() - t0, milliseconds(1000));

  // Long enough to be still running when the third request comes, however fast the steps (on
  // shared memory a step of opt-mini can take well under a millisecond).
  BackgroundStream running(server, Long(600, "running"));
  ASSERT_TRUE(running.WaitTokens(2)) << server.Log();
  BackgroundStream queued(server, Long(6, "queued"));
  const auto queued_by = Clock::now() + milliseconds(5000);
  while (Metric(Scrape(server.metrics_port()), "deja_coordinator_waiting_requests") < 1) {
    ASSERT_LT(Clock::now(), queued_by) << "the second request never queued";
    std::this_thread::sleep_for(milliseconds(5));
  }
  t0 = Clock::now();
  s = Generate(server, Long(6));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find("queue"), std::string::npos) << s.error_message();
  EXPECT_LT(Clock::now() - t0, milliseconds(1000));

  // SIGTERM: readiness NOT_SERVING, new requests UNAVAILABLE, admitted ones finish.
  ASSERT_EQ(::kill(server.process().pid(), SIGTERM), 0);
  EXPECT_TRUE(WaitHealth(server.channel(), kNotServing, milliseconds(2000)));
  EXPECT_EQ(Health(server.channel(), ""), kServing);
  s = Generate(server, Long(4));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  running.Join();
  queued.Join();
  EXPECT_TRUE(running.status().ok()) << running.status().error_message();
  EXPECT_EQ(running.last().finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(running.last().generated_tokens(), 600u);
  EXPECT_TRUE(queued.status().ok()) << queued.status().error_message();
  EXPECT_EQ(queued.last().generated_tokens(), 6u);
  const std::vector<pid_t> workers = server.WorkerPids();
  EXPECT_EQ(server.process().ExitCode(milliseconds(15000)), 0) << server.Log();
  for (pid_t p : workers) EXPECT_NE(::kill(p, 0), 0) << "worker " << p << " outlived serve";
}

TEST(FailureTest, TensorParallelSizeMustDivideTheModel) {
  test_util::ChildProcess p({DEJA_BINARY, "serve", "--model", ModelDir(), "--tp", "3", "--port",
                             "0", "--metrics-port", "-1", "--http-port", "-1"},
                            LogPath("tp3"));
  EXPECT_EQ(p.ExitCode(milliseconds(20000)), 2);
  EXPECT_NE(p.Log().find("must divide"), std::string::npos) << p.Log();
}

// A checkpoint whose weights are cut short passes the start-up checks (config.json, tokenizer)
// and fails in the workers: serve stops at once, exits non-zero and says why, instead of
// restarting the group forever.
TEST(FailureTest, AWeightFileThatCannotLoadStopsServe) {
  test_util::TempDir tmp;
  const std::string model = tmp.File("model");
  std::filesystem::copy(ModelDir(), model, std::filesystem::copy_options::recursive);
  const std::string weights = model + "/model.safetensors";
  std::filesystem::resize_file(weights, std::filesystem::file_size(weights) / 2);
  test_util::ChildProcess p({DEJA_BINARY, "serve", "--model", model, "--tp", "2", "--port", "0",
                             "--metrics-port", "-1", "--http-port", "-1"},
                            LogPath("cut-weights"));
  EXPECT_EQ(p.ExitCode(milliseconds(30000)), 1) << p.Log();
  EXPECT_NE(p.Log().find("cannot load the model"), std::string::npos) << p.Log();
  EXPECT_NE(p.Log().find("DATA_LOSS"), std::string::npos) << p.Log();
  EXPECT_EQ(p.Log().find("group 2 started"), std::string::npos) << "restarted: " << p.Log();
}

// A port another server holds is a start-up error naming it (no SO_REUSEPORT sharing), and
// /metrics listens on the API's host unless told otherwise.
TEST(FailureTest, PortInUseIsAnErrorAndMetricsBindTheApiHost) {
  Server first("port_first", {DEJA_BINARY, "coordinator", "--model", ModelDir(), "--tp", "2",
                              "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0", "--http-port", "-1",
                              "--internal-port", "0", "--insecure-internal"});
  ASSERT_TRUE(first.WaitListening()) << first.Log();
  EXPECT_EQ(ListenAddress(first.metrics_port()), "0100007F");
  const std::string port = first.target().substr(first.target().rfind(':') + 1);
  test_util::ChildProcess second(
      {DEJA_BINARY, "coordinator", "--model", ModelDir(), "--tp", "2", "--host", "127.0.0.1",
       "--port", port, "--metrics-port", "-1", "--http-port", "-1", "--internal-port", "0", "--insecure-internal"},
      LogPath("port_second"));
  EXPECT_NE(second.ExitCode(milliseconds(20000)), 0) << second.Log();
  EXPECT_NE(second.Log().find("cannot listen on 127.0.0.1:" + port), std::string::npos)
      << second.Log();
  ASSERT_EQ(::kill(first.process().pid(), SIGTERM), 0);
  EXPECT_EQ(first.process().ExitCode(milliseconds(15000)), 0) << first.Log();
}

TEST(FailureTest, CoordinatorServesWorkersStartedSeparately) {
  // As a mounted Kubernetes Secret would hold it, with a trailing newline.
  test_util::TempDir tmp;
  const std::string secret_file = tmp.File("group-secret");
  test_util::WriteBytes(secret_file, "0123456789abcdef0123456789abcdef\n");
  Server server("coordinator", StandaloneCoordinatorArgs(secret_file));
  ASSERT_TRUE(server.WaitListening()) << server.Log();
  EXPECT_EQ(server.metrics_port(), -1);
  EXPECT_EQ(Health(server.channel(), "deja.v1.TextGeneration"), kNotServing);
  auto workers = StartWorkers(server.internal_target(), 2, secret_file, "worker");
  ASSERT_TRUE(WaitHealth(server.channel(), kServing)) << server.Log() << workers[0]->Log();
  v1::GenerateResponse resp;
  grpc::Status s = Generate(server, Long(5), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.generated_tokens(), 5u);
  // `deja client` against it.
  test_util::ChildProcess client({DEJA_BINARY, "client", "generate", "--target", server.target(),
                                  "--prompt", "And God said", "--max-new-tokens", "4", "--json"},
                                 LogPath("client"));
  EXPECT_EQ(client.ExitCode(milliseconds(20000)), 0) << client.Log();
  EXPECT_NE(client.Log().find("\"generated_tokens\":4"), std::string::npos) << client.Log();
  test_util::ChildProcess bad({DEJA_BINARY, "client", "stream", "--target", server.target(),
                               "--prompt", "x", "--top-p", "3"},
                              LogPath("client_bad"));
  EXPECT_EQ(bad.ExitCode(milliseconds(20000)), 2) << bad.Log();
  EXPECT_NE(bad.Log().find("INVALID_ARGUMENT: sampling.top_p"), std::string::npos) << bad.Log();
  ASSERT_EQ(::kill(server.process().pid(), SIGTERM), 0);
  EXPECT_EQ(server.process().ExitCode(milliseconds(15000)), 0) << server.Log();
}

}  // namespace
}  // namespace deja::serving_test
