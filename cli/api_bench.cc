// Both APIs measured alike: one thread per stream, a timestamp on each piece of text as it
// arrives (a gRPC message with text, an SSE event with text), the time to the first from the
// call's start, the gaps between the following ones (inter-token latency; a piece is one token
// unless a character spans tokens), and generated tokens (the final message's count, the usage
// chunk's) over the level's wall time.
#include "cli/api_bench.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/client_bench.h"
#include "deja/v1/text_generation.grpc.pb.h"

namespace deja::cli {
namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

struct Stream {
  bool ok = false;
  int64_t tokens = 0;
  double ttft_ms = 0;
  std::vector<double> gaps_ms;
};

// One record per piece of text.
class Clocked {
 public:
  explicit Clocked(Clock::time_point start) : start_(start), last_(start) {}
  void Piece(Stream* s) {
    const Clock::time_point now = Clock::now();
    if (first_) {
      s->ttft_ms = Ms(now - start_);
      first_ = false;
    } else {
      s->gaps_ms.push_back(Ms(now - last_));
    }
    last_ = now;
  }

 private:
  Clock::time_point start_, last_;
  bool first_ = true;
};

Stream GrpcStream(const ClientConnection& connection, v1::TextGeneration::Stub& stub,
                  const std::string& prompt, int max_new) {
  Stream s;
  v1::GenerateRequest req;
  req.set_text(prompt);
  req.mutable_stopping()->set_max_new_tokens(max_new);
  req.mutable_stopping()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(30));
  connection.Authorize(&ctx);
  Clocked clock(Clock::now());
  auto reader = stub.GenerateStream(&ctx, req);
  v1::GenerateStreamResponse msg;
  while (reader->Read(&msg)) {
    if (!msg.text_delta().empty()) clock.Piece(&s);
    if (msg.finished()) s.tokens = msg.generated_tokens();
  }
  s.ok = reader->Finish().ok();
  return s;
}

// A streamed completion over plain HTTP/1.1: the chunked body decoded as it arrives, each SSE
// event with a non-empty "text" timed, the usage chunk's completion_tokens counted.
Stream HttpStream(const ClientConnection& connection, const std::string& target,
                  const std::string& prompt, int max_new) {
  Stream s;
  const std::string body =
      nlohmann::json{{"prompt", prompt},           {"max_tokens", max_new},
                     {"temperature", 0},           {"ignore_eos", true},
                     {"stream", true},             {"stream_options", {{"include_usage", true}}}}
          .dump();
  std::string req = "POST /v1/completions HTTP/1.1\r\nHost: " + target +
                    "\r\nContent-Type: application/json\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\n";
  if (!connection.authorization.empty()) req += "Authorization: " + connection.authorization + "\r\n";
  req += "\r\n" + body;
  Clocked clock(Clock::now());
  const int fd = ConnectTcp(target);
  if (fd < 0) return s;
  if (::write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    ::close(fd);
    return s;
  }
  std::string in, events;
  bool head = true, done = false;
  size_t chunk_left = 0;  // bytes of the current chunk not yet taken
  char buf[16384];
  while (!done) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    in.append(buf, static_cast<size_t>(n));
    if (head) {
      const size_t end = in.find("\r\n\r\n");
      if (end == std::string::npos) continue;
      if (in.rfind("HTTP/1.1 200", 0) != 0) break;
      in.erase(0, end + 4);
      head = false;
    }
    // De-chunk into `events`.
    while (!in.empty()) {
      if (chunk_left == 0) {
        const size_t eol = in.find("\r\n");
        if (eol == std::string::npos) break;
        const size_t size = std::strtoul(in.substr(0, eol).c_str(), nullptr, 16);
        if (size == 0 && eol > 0) {
          done = true;
          break;
        }
        in.erase(0, eol + 2);
        chunk_left = size + 2;  // the data and its CRLF
      }
      // The chunk's data goes to `events`, its closing CRLF (the last 2 bytes) nowhere.
      const size_t take = std::min(chunk_left, in.size());
      const size_t data = std::min(take, chunk_left > 2 ? chunk_left - 2 : size_t{0});
      events.append(in, 0, data);
      in.erase(0, take);
      chunk_left -= take;
    }
    for (size_t end; (end = events.find("\n\n")) != std::string::npos;) {
      const std::string ev = events.substr(0, end);
      events.erase(0, end + 2);
      if (ev.rfind("data: ", 0) != 0) continue;
      if (ev == "data: [DONE]") {
        s.ok = true;
        continue;
      }
      const nlohmann::json j = nlohmann::json::parse(ev.substr(6), nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("usage") && j["usage"].is_object()) {
        s.tokens = j["usage"].value("completion_tokens", 0);
      }
      if (j.contains("choices") && !j["choices"].empty() &&
          !j["choices"][0].value("text", "").empty()) {
        clock.Piece(&s);
      }
    }
  }
  ::close(fd);
  return s;
}

struct Level {
  int64_t tokens = 0;
  int failed = 0;
  double seconds = 0;
  std::vector<double> ttft_ms, gaps_ms;
};

template <typename F>
void RunStreams(int streams, F one, Level* level) {
  std::mutex mu;
  std::vector<std::thread> threads;
  const Clock::time_point t0 = Clock::now();
  for (int i = 0; i < streams; ++i) {
    threads.emplace_back([&] {
      Stream s = one();
      std::lock_guard<std::mutex> lock(mu);
      if (!s.ok) ++level->failed;
      level->tokens += s.tokens;
      level->ttft_ms.push_back(s.ttft_ms);
      level->gaps_ms.insert(level->gaps_ms.end(), s.gaps_ms.begin(), s.gaps_ms.end());
    });
  }
  for (auto& t : threads) t.join();
  level->seconds += std::chrono::duration<double>(Clock::now() - t0).count();
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

nlohmann::json Report(const Level& l) {
  return {{"generated_tokens", l.tokens},
          {"seconds", l.seconds},
          {"tokens_per_second", l.tokens / std::max(l.seconds, 1e-9)},
          {"ttft_ms_p50", Percentile(l.ttft_ms, 0.5)},
          {"ttft_ms_p99", Percentile(l.ttft_ms, 0.99)},
          {"inter_token_ms_p50", Percentile(l.gaps_ms, 0.5)},
          {"inter_token_ms_p99", Percentile(l.gaps_ms, 0.99)}};
}

}  // namespace

Status RunApiBench(const ClientConnection& connection, const std::string& http_target,
                   const std::vector<int>& levels, int max_new, const std::string& prompt,
                   int rounds) {
  auto stub = v1::TextGeneration::NewStub(connection.channel);
  auto grpc_one = [&] { return GrpcStream(connection, *stub, prompt, max_new); };
  auto http_one = [&] { return HttpStream(connection, http_target, prompt, max_new); };
  // Warm both paths and the workers.
  if (!grpc_one().ok) return Unavailable("a gRPC stream failed (is the server at --target?)");
  if (!http_one().ok) {
    return Unavailable("an HTTP stream failed (is the OpenAI API at --http-target?)");
  }
  for (int streams : levels) {
    Level grpc_level, http_level;
    for (int r = 0; r < rounds; ++r) {
      if (r % 2 == 0) {
        RunStreams(streams, grpc_one, &grpc_level);
        RunStreams(streams, http_one, &http_level);
      } else {
        RunStreams(streams, http_one, &http_level);
        RunStreams(streams, grpc_one, &grpc_level);
      }
    }
    if (grpc_level.failed > 0 || http_level.failed > 0) {
      return Unavailable(std::to_string(grpc_level.failed) + " gRPC and " +
                         std::to_string(http_level.failed) + " HTTP streams of " +
                         std::to_string(streams * rounds) + " each failed");
    }
    nlohmann::json j;
    j["streams"] = streams;
    j["rounds"] = rounds;
    j["max_new_tokens"] = max_new;
    j["grpc"] = Report(grpc_level);
    j["openai_http"] = Report(http_level);
    j["http_over_grpc_tokens_per_second"] =
        j["openai_http"]["tokens_per_second"].get<double>() /
        std::max(j["grpc"]["tokens_per_second"].get<double>(), 1e-9);
    j["http_over_grpc_inter_token_p99"] =
        j["openai_http"]["inter_token_ms_p99"].get<double>() /
        std::max(j["grpc"]["inter_token_ms_p99"].get<double>(), 1e-9);
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  }
  return Status::Ok();
}

}  // namespace deja::cli
