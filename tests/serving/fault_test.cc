// Faults of the serving process itself, with real processes: `deja serve` killed (-9) takes its
// workers with it (no orphans), as does a standalone `deja coordinator` its separately started
// workers (they exit); `deja serve` stopped (SIGSTOP) and continued serves again
// without a manual step; logs written to a full disk (stderr on /dev/full) do not stop serving.
// Worker faults (kill -9, SIGSTOP of a worker) are in failure_test.cc.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

#include <fstream>
#include <string>

#include "serving_util.h"
#include "tests/common/temp_dir.h"

namespace deja::serving_test {
namespace {

v1::GenerateRequest Request(int max_new) {
  v1::GenerateRequest r;
  r.set_text("And God said");
  r.mutable_stopping()->set_max_new_tokens(max_new);
  r.mutable_stopping()->set_ignore_eos(true);
  return r;
}

grpc::Status Generate(v1::TextGeneration::Stub& stub, int max_new, v1::GenerateResponse* resp,
                      milliseconds deadline = milliseconds(30000)) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, deadline);
  return stub.Generate(&ctx, Request(max_new), resp);
}

// Running and not a zombie (an exited child not yet reaped still answers kill(pid, 0)).
bool Alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z';
}

bool WaitGone(const std::vector<pid_t>& pids, milliseconds timeout) {
  const auto end = Clock::now() + timeout;
  while (Clock::now() < end) {
    bool any = false;
    for (pid_t p : pids) any |= Alive(p);
    if (!any) return true;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return false;
}

// A free TCP port on loopback (bound and released; nothing else here takes ports from the
// ephemeral range in the meantime).
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

TEST(FaultTest, KilledServeTakesItsWorkersWithIt) {
  Server server("kill_serve", ServeArgs({}));
  ASSERT_TRUE(server.WaitListening()) << server.Log();
  ASSERT_TRUE(WaitHealth(server.channel(), kServing)) << server.Log();
  const std::vector<pid_t> workers = server.WorkerPids();
  ASSERT_EQ(workers.size(), 2u) << server.Log();
  for (pid_t p : workers) ASSERT_TRUE(Alive(p));
  ASSERT_EQ(::kill(server.process().pid(), SIGKILL), 0);
  EXPECT_TRUE(WaitGone(workers, milliseconds(3000))) << "workers outlived a killed serve";
}

// Workers started on their own (as on Kubernetes) do not outlive their coordinator: once it is
// gone they exit non-zero, so that their supervisor starts a new group.
TEST(FaultTest, WorkersOfAKilledCoordinatorExit) {
  test_util::TempDir tmp;
  const std::string secret_file = tmp.File("group-secret");
  test_util::WriteBytes(secret_file, "0123456789abcdef0123456789abcdef\n");
  Server server("kill_coordinator", StandaloneCoordinatorArgs(secret_file));
  ASSERT_TRUE(server.WaitListening()) << server.Log();
  auto workers = StartWorkers(server.internal_target(), 2, secret_file, "orphan_worker",
                              {"--coordinator-timeout-ms", "2000"});
  ASSERT_TRUE(WaitHealth(server.channel(), kServing)) << server.Log() << workers[0]->Log();
  v1::GenerateResponse resp;
  ASSERT_TRUE(Generate(server.stub(), 4, &resp).ok());
  const auto killed = Clock::now();
  ASSERT_EQ(::kill(server.process().pid(), SIGKILL), 0);
  for (auto& w : workers) {
    const int code = w->ExitCode(milliseconds(6000));
    EXPECT_NE(code, 0) << w->Log();
    EXPECT_NE(w->Log().find("no call from the coordinator"), std::string::npos) << w->Log();
  }
  EXPECT_LT(Clock::now() - killed, milliseconds(6000));
}

TEST(FaultTest, StoppedServeServesAgainWhenContinued) {
  Server server("stop_serve", ServeArgs({}));
  ASSERT_TRUE(server.WaitListening()) << server.Log();
  ASSERT_TRUE(WaitHealth(server.channel(), kServing)) << server.Log();
  // A stream in flight while the coordinator is stopped for 4 s (past every heartbeat and step
  // timeout): when it continues, the stream either carries on to its last token or, if the
  // group was replaced meanwhile, ends with UNAVAILABLE within 3 s; serving resumes on its own.
  grpc::Status stream_status;
  Clock::time_point ended_at;
  uint32_t generated = 0;
  std::thread stream([&] {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, milliseconds(60000));
    auto reader = server.stub().GenerateStream(&ctx, Request(200));
    v1::GenerateStreamResponse msg;
    while (reader->Read(&msg)) {
      if (msg.finished()) generated = msg.generated_tokens();
    }
    stream_status = reader->Finish();
    ended_at = Clock::now();
  });
  std::this_thread::sleep_for(milliseconds(300));
  ASSERT_EQ(::kill(server.process().pid(), SIGSTOP), 0);
  std::this_thread::sleep_for(milliseconds(4000));
  const auto resumed = Clock::now();
  ASSERT_EQ(::kill(server.process().pid(), SIGCONT), 0);
  stream.join();
  if (stream_status.ok()) {
    EXPECT_EQ(generated, 200u);
  } else {
    EXPECT_EQ(stream_status.error_code(), grpc::StatusCode::UNAVAILABLE)
        << stream_status.error_message();
    EXPECT_LT(ended_at - resumed, milliseconds(3000));
  }
  // Serving resumes on its own. Right after SIGCONT the readiness may still say SERVING for the
  // group the coordinator is about to declare lost (its step timed out while it was stopped), so
  // a request may get UNAVAILABLE until the new group is up: retried within the 30 s.
  const auto deadline = Clock::now() + milliseconds(30000);
  grpc::Status s;
  v1::GenerateResponse resp;
  do {
    ASSERT_TRUE(WaitHealth(server.channel(), kServing, milliseconds(30000))) << server.Log();
    resp.Clear();
    s = Generate(server.stub(), 8, &resp);
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE) break;
    std::this_thread::sleep_for(milliseconds(100));
  } while (Clock::now() < deadline);
  ASSERT_TRUE(s.ok()) << s.error_message() << "\n" << server.Log();
  EXPECT_EQ(resp.generated_tokens(), 8u);
}

TEST(FaultTest, LogsOnAFullDiskDoNotStopServing) {
  const int port = FreePort();
  ASSERT_GT(port, 0);
  // Every log line of serve and its workers fails with ENOSPC.
  test_util::ChildProcess serve({DEJA_BINARY, "serve", "--model", ModelDir(), "--tp", "2", "--port",
                                 std::to_string(port), "--metrics-port", "-1", "--http-port", "-1", "--threads", "1"},
                                "/dev/full");
  ASSERT_GT(serve.pid(), 0);
  auto channel =
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
  ASSERT_TRUE(WaitHealth(channel, kServing, milliseconds(60000)));
  auto stub = v1::TextGeneration::NewStub(channel);
  for (int i = 0; i < 5; ++i) {
    v1::GenerateResponse resp;
    grpc::Status s = Generate(*stub, 16, &resp);
    ASSERT_TRUE(s.ok()) << i << ": " << s.error_message();
    EXPECT_EQ(resp.generated_tokens(), 16u);
  }
  EXPECT_FALSE(serve.Wait(milliseconds(0))) << "serve exited";
  ASSERT_EQ(::kill(serve.pid(), SIGTERM), 0);
  EXPECT_EQ(serve.ExitCode(milliseconds(15000)), 0);
}

}  // namespace
}  // namespace deja::serving_test
