// `deja client bench`: load against a running server. For each concurrency level, that many
// GenerateStream calls run at once (greedy, EOS ignored, a fixed number of new tokens); the
// result is generated tokens per second over the wall time, time to first token, and, when
// --metrics-target is given, the server's own step accounting over the same interval from
// /metrics: coordinator + RPC overhead as a fraction of the step, and the all-reduce share of
// rank 0's step.
#include "cli/client_bench.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "deja/v1/text_generation.grpc.pb.h"

namespace deja::cli {
namespace {

using Clock = std::chrono::steady_clock;

// GET /metrics from host:port, with an Authorization header when `authorization` is set; "" on
// failure.
std::string Scrape(const std::string& target, const std::string& authorization) {
  std::string out;
  const int fd = ConnectTcp(target);
  if (fd >= 0) {
    std::string req = "GET /metrics HTTP/1.1\r\nHost: " + target + "\r\n";
    if (!authorization.empty()) req += "Authorization: " + authorization + "\r\n";
    req += "\r\n";
    if (::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[8192];
      ssize_t n;
      while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
  }
  const size_t body = out.find("\r\n\r\n");
  return body == std::string::npos ? "" : out.substr(body + 4);
}

double Sample(const std::string& exposition, const std::string& series) {
  std::istringstream in(exposition);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return 0.0;
}

struct Level {
  int streams = 0;
  int64_t tokens = 0;
  int failed = 0;
  double seconds = 0;
  std::vector<double> ttft_ms;
};

Level RunLevel(const ClientConnection& connection, v1::TextGeneration::Stub& stub, int streams,
               int max_new, const std::string& prompt, int stop_after = 0) {
  Level level;
  level.streams = streams;
  std::atomic<int64_t> tokens{0};
  std::atomic<int> failed{0};
  std::vector<double> ttft(streams, 0.0);
  const Clock::time_point t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < streams; ++i) {
    threads.emplace_back([&, i] {
      v1::GenerateRequest req;
      req.set_text(prompt);
      req.mutable_stopping()->set_max_new_tokens(max_new);
      req.mutable_stopping()->set_ignore_eos(true);
      if (stop_after > 0) {
        // Cancelled by id once stop_after tokens arrived: the stream ends with its final message.
        req.set_request_id("bench-" + std::to_string(streams) + "-" + std::to_string(i) + "-" +
                           std::to_string(t0.time_since_epoch().count()));
        req.mutable_response()->set_return_tokens(true);
      }
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(30));
      connection.Authorize(&ctx);
      auto reader = stub.GenerateStream(&ctx, req);
      v1::GenerateStreamResponse msg;
      int received = 0;
      bool cancelled = false;
      while (reader->Read(&msg)) {
        received += msg.tokens_size();
        if (stop_after > 0 && !cancelled && received >= stop_after) {
          cancelled = true;
          grpc::ClientContext cctx;
          connection.Authorize(&cctx);
          v1::CancelRequest creq;
          creq.set_request_id(req.request_id());
          v1::CancelResponse cresp;
          if (!stub.Cancel(&cctx, creq, &cresp).ok()) ++failed;
        }
        if (msg.finished()) {
          tokens += msg.generated_tokens();
          ttft[i] = msg.timings().time_to_first_token_ms();
        }
      }
      if (!reader->Finish().ok()) ++failed;
    });
  }
  for (auto& t : threads) t.join();
  level.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  level.tokens = tokens.load();
  level.failed = failed.load();
  level.ttft_ms = ttft;
  return level;
}

}  // namespace

int ConnectTcp(const std::string& target) {
  const size_t colon = target.rfind(':');
  if (colon == std::string::npos) return -1;
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(target.substr(0, colon).c_str(), target.substr(colon + 1).c_str(), &hints,
                    &res) != 0) {
    return -1;
  }
  int fd = ::socket(res->ai_family, res->ai_socktype, res->ai_protocol);
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
    ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(res);
  return fd;
}

Status RunClientBench(const ClientConnection& connection, const std::string& metrics_target,
                      const std::vector<int>& levels, int max_new, const std::string& prompt,
                      int stop_after) {
  auto stub = v1::TextGeneration::NewStub(connection.channel);
  auto scrape = [&] {
    return metrics_target.empty() ? "" : Scrape(metrics_target, connection.authorization);
  };
  RunLevel(connection, *stub, 1, 4, prompt);  // warm the connection and the workers
  double single_rate = 0;
  for (int streams : levels) {
    const std::string before = scrape();
    Level level = RunLevel(connection, *stub, streams, max_new, prompt, stop_after);
    const std::string after = scrape();
    if (level.failed > 0) {
      return Unavailable(std::to_string(level.failed) + " of " + std::to_string(streams) +
                         " streams failed");
    }
    nlohmann::json j;
    j["streams"] = streams;
    j["max_new_tokens"] = max_new;
    if (stop_after > 0) j["stop_after_tokens"] = stop_after;
    j["generated_tokens"] = level.tokens;
    j["seconds"] = level.seconds;
    const double rate = level.tokens / std::max(level.seconds, 1e-9);
    j["tokens_per_second"] = rate;
    if (streams == 1) single_rate = rate;
    if (single_rate > 0) j["speedup_vs_1_stream"] = rate / single_rate;
    std::sort(level.ttft_ms.begin(), level.ttft_ms.end());
    j["ttft_ms_median"] = level.ttft_ms[level.ttft_ms.size() / 2];
    if (!before.empty() && !after.empty()) {
      auto delta = [&](const std::string& series) {
        return Sample(after, series) - Sample(before, series);
      };
      const double steps = delta("deja_coordinator_step_duration_seconds_count{phase=\"total\"}");
      const double total = delta("deja_coordinator_step_duration_seconds_sum{phase=\"total\"}");
      const double overhead =
          delta("deja_coordinator_step_duration_seconds_sum{phase=\"overhead\"}");
      const double rank_step = delta("deja_worker_step_duration_seconds_sum{rank=\"0\"}");
      const double allreduce = delta("deja_worker_allreduce_duration_seconds_sum{rank=\"0\"}");
      j["steps"] = steps;
      if (steps > 0) j["step_ms_mean"] = 1e3 * total / steps;
      // Mean sequences per step (prefill steps included): how many ran at once.
      if (steps > 0) j["tokens_per_step"] = static_cast<double>(level.tokens) / steps;
      if (total > 0) j["overhead_fraction_of_step"] = overhead / total;
      if (rank_step > 0) j["allreduce_fraction_of_rank0_step"] = allreduce / rank_step;
    }
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  }
  return Status::Ok();
}

}  // namespace deja::cli
