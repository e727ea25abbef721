// Shared by the serving tests: `deja serve` / `deja coordinator` / `deja worker` as child
// processes on loopback (ports, the internal plane's address, worker pids and addresses read
// from their logs), gRPC helpers (health, reflection), and a real HTTP scrape of /metrics.
#pragma once

#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "deja/v1/text_generation.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/comm/process_util.h"

namespace deja::serving_test {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

inline std::string SourceDir() {
  const char* d = std::getenv("DEJA_SOURCE_DIR");
  return d ? d : ".";
}

// models/opt-mini once it is trained, else the random post-LN fixture.
inline std::string ModelDir() {
  const std::string mini = SourceDir() + "/models/opt-mini";
  if (std::filesystem::exists(mini + "/model.safetensors")) return mini;
  return SourceDir() + "/models/opt-tiny-postln";
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::string LogPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("deja_serving_" + std::to_string(::getpid()) + "_" + name + ".log"))
      .string();
}

// A `deja serve` or `deja coordinator` process and what its log says.
class Server {
 public:
  Server(const std::string& name, std::vector<std::string> args)
      : log_(LogPath(name)), process_(std::make_unique<test_util::ChildProcess>(args, log_)) {}

  // Waits for the "serving on" and "internal plane" lines; false if the process died or it took
  // too long.
  bool WaitListening(milliseconds timeout = milliseconds(30000)) {
    const std::regex re(
        "serving on [^:]+:([0-9]+) \\(metrics on port (-?[0-9]+), OpenAI API on port "
        "(-?[0-9]+)\\)");
    const std::regex internal_re("internal plane \\(worker rendezvous\\) on ([^\\s]+)");
    const auto end = Clock::now() + timeout;
    while (Clock::now() < end) {
      std::smatch m, internal;
      const std::string log = ReadFile(log_);
      if (std::regex_search(log, m, re) && std::regex_search(log, internal, internal_re)) {
        port_ = std::stoi(m[1]);
        metrics_port_ = std::stoi(m[2]);
        http_port_ = std::stoi(m[3]);
        internal_target_ = internal[1];
        channel_ = grpc::CreateChannel(target(), grpc::InsecureChannelCredentials());
        stub_ = v1::TextGeneration::NewStub(channel_);
        return true;
      }
      if (process_->Wait(milliseconds(0))) return false;
      std::this_thread::sleep_for(milliseconds(20));
    }
    return false;
  }

  // Pids of the launcher's newest worker group, from its log.
  pid_t pid() const { return process_->pid(); }
  std::vector<pid_t> WorkerPids() const {
    const std::regex re("worker group ([0-9]+) started, pids((?: [0-9]+)+)");
    const std::string log = ReadFile(log_);
    std::vector<pid_t> pids;
    for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator();
         ++it) {
      pids.clear();
      std::istringstream in((*it)[2].str());
      pid_t p;
      while (in >> p) pids.push_back(p);
    }
    return pids;
  }
  // host:port each rank's Worker service advertised last (by rank; "" for a rank not seen).
  std::vector<std::string> WorkerAddresses(int world) const {
    const std::regex re(
        "rank ([0-9]+)/[0-9]+: Worker service listening on .* advertised as ([^\\s]+)");
    const std::string log = ReadFile(log_);
    std::vector<std::string> out(world);
    for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator();
         ++it) {
      const int rank = std::stoi((*it)[1].str());
      if (rank < world) out[rank] = (*it)[2].str();
    }
    return out;
  }
  int GroupsStarted() const {
    const std::regex re("worker group ([0-9]+) started");
    const std::string log = ReadFile(log_);
    int n = 0;
    for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator();
         ++it) {
      n = std::stoi((*it)[1].str());
    }
    return n;
  }

  std::string target() const { return "127.0.0.1:" + std::to_string(port_); }
  // The workers' --coordinator: the internal plane's listener.
  const std::string& internal_target() const { return internal_target_; }
  int metrics_port() const { return metrics_port_; }
  int http_port() const { return http_port_; }
  v1::TextGeneration::Stub& stub() { return *stub_; }
  std::shared_ptr<grpc::Channel> channel() { return channel_; }
  test_util::ChildProcess& process() { return *process_; }
  std::string Log() const { return process_->Log(); }

 private:
  std::string log_;
  std::unique_ptr<test_util::ChildProcess> process_;
  int port_ = 0;
  int metrics_port_ = -1;
  int http_port_ = -1;
  std::string internal_target_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::TextGeneration::Stub> stub_;
};

inline void SetDeadline(grpc::ClientContext* ctx, milliseconds ms = milliseconds(60000)) {
  ctx->set_deadline(std::chrono::system_clock::now() + ms);
}

// grpc.health.v1 Check; -1 when the call fails.
inline int Health(const std::shared_ptr<grpc::Channel>& channel, const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext ctx;
  SetDeadline(&ctx, milliseconds(2000));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  if (!stub->Check(&ctx, req, &resp).ok()) return -1;
  return resp.status();
}

constexpr int kServing = grpc::health::v1::HealthCheckResponse::SERVING;
constexpr int kNotServing = grpc::health::v1::HealthCheckResponse::NOT_SERVING;

inline bool WaitHealth(const std::shared_ptr<grpc::Channel>& channel, int status,
                       milliseconds timeout = milliseconds(60000)) {
  const auto end = Clock::now() + timeout;
  while (Clock::now() < end) {
    if (Health(channel, "deja.v1.TextGeneration") == status) return true;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return false;
}

// GET /metrics on loopback with `headers` ("Name: value\r\n" lines); the whole response.
inline std::string HttpGetMetrics(int port, const std::string& headers = "") {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string req = "GET /metrics HTTP/1.1\r\nHost: localhost\r\n" + headers + "\r\n";
    if (::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[8192];
      ssize_t n;
      while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  return out;
}

// GET /metrics; the body, or "" on failure.
inline std::string Scrape(int port) {
  const std::string out = HttpGetMetrics(port);
  const size_t body = out.find("\r\n\r\n");
  if (out.rfind("HTTP/1.1 200", 0) != 0 || body == std::string::npos) return "";
  return out.substr(body + 4);
}

// The value of one sample line (`name{labels}` exactly as rendered), or NaN.
inline double Metric(const std::string& exposition, const std::string& series) {
  std::istringstream in(exposition);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return std::nan("");
}

// Lists services through server reflection with the generic stub (no reflection stubs ship in
// Debian): ServerReflectionRequest{list_services: ""} is the bytes 0x3a 0x00.
inline std::string ReflectionListing(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  SetDeadline(&ctx, milliseconds(5000));
  grpc::CompletionQueue cq;
  auto next = [&] {
    void* tag = nullptr;
    bool ok = false;
    return cq.Next(&tag, &ok) && ok;
  };
  auto call =
      stub.PrepareCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  std::string bytes;
  call->StartCall(nullptr);
  if (next()) {
    grpc::Slice request(std::string("\x3a\x00", 2));
    call->Write(grpc::ByteBuffer(&request, 1), nullptr);
    if (next()) {
      call->WritesDone(nullptr);
      if (next()) {
        grpc::ByteBuffer reply;
        call->Read(&reply, nullptr);
        if (next()) {
          std::vector<grpc::Slice> slices;
          if (reply.Dump(&slices).ok()) {
            for (const auto& s : slices) {
              bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
            }
          }
        }
      }
    }
  }
  grpc::Status status;
  call->Finish(&status, nullptr);
  next();
  cq.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq.Next(&tag, &ok)) {
  }
  return bytes;
}

// The local address a TCP listener on `port` is bound to, as /proc/net/tcp writes it (hex, e.g.
// 0100007F for 127.0.0.1; an IPv4-mapped address of /proc/net/tcp6, as gRPC's listeners are,
// the same way; other IPv6 addresses in 32 hex digits); "" when none listens.
inline std::string ListenAddress(int port) {
  char want[8];
  std::snprintf(want, sizeof(want), ":%04X", port);
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string slot, local, remote, state;
      f >> slot >> local >> remote >> state;
      if (state != "0A" || local.size() <= 5 || local.substr(local.size() - 5) != want) continue;
      std::string address = local.substr(0, local.size() - 5);
      if (address.size() == 32 && address.rfind("0000000000000000FFFF0000", 0) == 0) {
        address = address.substr(24);
      }
      return address;
    }
  }
  return "";
}

// The greedy token ids `server` generates for `prompt` (max_new tokens); empty on error, which
// is reported.
inline std::vector<int32_t> ServedGreedy(v1::TextGeneration::Stub& stub, const std::string& prompt,
                                         int max_new) {
  v1::GenerateRequest req;
  req.set_text(prompt);
  req.mutable_stopping()->set_max_new_tokens(max_new);
  req.mutable_response()->set_return_tokens(true);
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::GenerateResponse resp;
  const grpc::Status s = stub.Generate(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  std::vector<int32_t> ids;
  for (const v1::Token& t : resp.tokens()) ids.push_back(t.id());
  return ids;
}

// `deja serve` of the test model on free ports (API and /metrics), one CPU thread per worker,
// `tp` workers, the checkpoint's dtypes (what the single-process references compute with; the
// default `auto` may pick bf16), then `extra` flags.
inline std::vector<std::string> ServeArgs(const std::vector<std::string>& extra, int tp = 2) {
  std::vector<std::string> args = {
      DEJA_BINARY, "serve",      "--model",        ModelDir(), "--tp",      std::to_string(tp),
      "--port",    "0",          "--metrics-port", "0",        "--threads", "1",
      "--dtype",   "checkpoint", "--kv-dtype",     "f32",      "--http-port", "0"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// `deja coordinator` for a TP-2 group on free ports (no /metrics), its workers holding the
// group secret in `secret_file`.
inline std::vector<std::string> StandaloneCoordinatorArgs(const std::string& secret_file) {
  return {DEJA_BINARY,
          "coordinator",
          "--model",
          ModelDir(),
          "--tp",
          "2",
          "--port",
          "0",
          "--metrics-port",
          "-1",
          "--http-port",
          "-1",
          "--internal-port",
          "0",
          "--group-secret-file",
          secret_file};
}

// `deja worker` processes for every rank of a standalone coordinator's group, with the group
// secret in `secret_file`; `extra` flags are added to each.
inline std::vector<std::unique_ptr<test_util::ChildProcess>> StartWorkers(
    const std::string& internal_target, int world, const std::string& secret_file,
    const std::string& log_prefix, const std::vector<std::string>& extra = {}) {
  std::vector<std::unique_ptr<test_util::ChildProcess>> workers;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> args = {DEJA_BINARY,
                                     "worker",
                                     "--model",
                                     ModelDir(),
                                     "--rank",
                                     std::to_string(r),
                                     "--world",
                                     std::to_string(world),
                                     "--coordinator",
                                     internal_target,
                                     "--group-secret-file",
                                     secret_file,
                                     "--threads",
                                     "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    workers.push_back(
        std::make_unique<test_util::ChildProcess>(args, LogPath(log_prefix + std::to_string(r))));
  }
  return workers;
}

// GetModelInfo (a failed call is a test failure and gives an empty ModelInfo).
inline v1::ModelInfo ModelInfoOf(v1::TextGeneration::Stub& stub) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::ModelInfo info;
  const grpc::Status s = stub.GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return info;
}

// One GenerateStream call, collected.
struct StreamResult {
  grpc::Status status;
  std::string text;  // concatenated deltas
  std::vector<int32_t> token_ids;
  std::vector<v1::GenerateStreamResponse> messages;
  bool finished_last = false;  // the last message, and only it, had finished = true
};

inline StreamResult Stream(v1::TextGeneration::Stub& stub, const v1::GenerateRequest& req,
                           grpc::ClientContext* ctx = nullptr) {
  grpc::ClientContext local;
  if (ctx == nullptr) {
    ctx = &local;
    SetDeadline(ctx);
  }
  StreamResult r;
  auto reader = stub.GenerateStream(ctx, req);
  v1::GenerateStreamResponse msg;
  bool finished_early = false;
  while (reader->Read(&msg)) {
    if (!r.messages.empty() && r.messages.back().finished()) finished_early = true;
    r.text += msg.text_delta();
    for (const v1::Token& t : msg.tokens()) r.token_ids.push_back(t.id());
    r.messages.push_back(msg);
  }
  r.status = reader->Finish();
  r.finished_last = !finished_early && !r.messages.empty() && r.messages.back().finished();
  return r;
}

}  // namespace deja::serving_test
