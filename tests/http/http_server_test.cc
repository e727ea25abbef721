// HttpServer over real loopback sockets: requests and keep-alive, the size bounds (431, 413) and
// malformed requests (400), slow clients closed at the request timeout, the connection cap, and
// 1,000 idle plus 100 slow connections that do not delay another client's answer past 100 ms;
// replies from other threads, streamed replies, and a client that leaves mid-stream.
#include "http/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/common/loopback.h"

namespace deja::http {
namespace {

using Clock = std::chrono::steady_clock;

using test_util::SendAll;
int Connect(int port) { return test_util::ConnectLoopback(port); }

// Reads one response whose body has a Content-Length (or up to EOF).
std::string ReadResponse(int fd) {
  std::string out;
  char buf[4096];
  while (true) {
    const size_t head_end = out.find("\r\n\r\n");
    if (head_end != std::string::npos) {
      const size_t cl = out.find("Content-Length: ");
      if (cl != std::string::npos && cl < head_end) {
        const size_t len = std::stoul(out.substr(cl + 16));
        if (out.size() >= head_end + 4 + len) return out.substr(0, head_end + 4 + len);
      }
    }
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

// Appends what the connection sends until the server closes it.
void ReadUntilClosed(int fd, std::string* got) {
  char buf[4096];
  while (true) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return;
    got->append(buf, static_cast<size_t>(n));
  }
}

int StatusOf(const std::string& response) {
  return response.rfind("HTTP/1.1 ", 0) == 0 ? std::stoi(response.substr(9, 3)) : 0;
}

// Whether the server closed the connection (EOF) within the socket's receive timeout.
bool ClosedByServer(int fd) {
  char c;
  return ::recv(fd, &c, 1, 0) == 0;
}

std::unique_ptr<HttpServer> StartEcho(ServerOptions o = {}) {
  auto s = HttpServer::Start(o, [](const Request& r) {
    Response res;
    res.body = r.method + " " + r.path + " " + std::to_string(r.body.size()) + " " +
               std::string(r.Header("x-test"));
    return res;
  });
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(*s) : nullptr;
}

TEST(HttpServerTest, AnswersAndKeepsTheConnectionAlive) {
  auto server = StartEcho();
  ASSERT_NE(server, nullptr);
  const int fd = Connect(server->port());
  ASSERT_GE(fd, 0);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(SendAll(fd, "POST /a?b=c HTTP/1.1\r\nHost: x\r\nX-Test: v" + std::to_string(i) +
                                "\r\nContent-Length: 5\r\n\r\nhello"));
    const std::string r = ReadResponse(fd);
    EXPECT_EQ(StatusOf(r), 200) << r;
    EXPECT_NE(r.find("POST /a 5 v" + std::to_string(i)), std::string::npos) << r;
  }
  ASSERT_TRUE(SendAll(fd, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  EXPECT_EQ(StatusOf(ReadResponse(fd)), 200);
  EXPECT_TRUE(ClosedByServer(fd));
  ::close(fd);
  EXPECT_EQ(server->requests(), 4u);
}

TEST(HttpServerTest, OversizedHeaderIs431BodyIs413MalformedIs400) {
  ServerOptions o;
  o.max_header_bytes = 1024;
  o.max_body_bytes = 100;
  auto server = StartEcho(o);
  ASSERT_NE(server, nullptr);
  auto one = [&](const std::string& raw) {
    const int fd = Connect(server->port());
    EXPECT_GE(fd, 0);
    SendAll(fd, raw);
    const std::string r = ReadResponse(fd);
    ::close(fd);
    return StatusOf(r);
  };
  EXPECT_EQ(one("GET / HTTP/1.1\r\nX-Big: " + std::string(2000, 'a') + "\r\n\r\n"), 431);
  EXPECT_EQ(one("POST / HTTP/1.1\r\nContent-Length: 101\r\n\r\n" + std::string(101, 'b')), 413);
  EXPECT_EQ(one("NOT A REQUEST\r\n\r\n"), 400);
  EXPECT_EQ(one("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), 200);  // and it keeps serving
}

TEST(HttpServerTest, SlowClientsAreClosedAtTheRequestTimeout) {
  ServerOptions o;
  o.request_timeout_ms = 300;
  auto server = StartEcho(o);
  ASSERT_NE(server, nullptr);
  const int fd = Connect(server->port());
  ASSERT_GE(fd, 0);
  const auto t0 = Clock::now();
  // One byte every 100 ms never completes a request before the deadline.
  bool closed = false;
  for (int i = 0; i < 30 && !closed; ++i) {
    if (!SendAll(fd, "G")) closed = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    char c;
    const ssize_t n = ::recv(fd, &c, 1, MSG_DONTWAIT);
    if (n == 0) closed = true;
  }
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_TRUE(closed);
  EXPECT_LT(s, 2.0);
  ::close(fd);
}

TEST(HttpServerTest, ConnectionsPastTheCapAreClosedAtOnce) {
  ServerOptions o;
  o.max_connections = 10;
  auto server = StartEcho(o);
  ASSERT_NE(server, nullptr);
  std::vector<int> idle;
  for (int i = 0; i < 10; ++i) idle.push_back(Connect(server->port()));
  for (int i = 0; i < 200 && server->connections() < 10; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(server->connections(), 10);
  const int extra = Connect(server->port());
  ASSERT_GE(extra, 0);
  EXPECT_TRUE(ClosedByServer(extra));
  ::close(extra);
  for (int fd : idle) ::close(fd);
}

TEST(HttpServerTest, ThousandIdleAndSlowConnectionsDoNotDelayAnAnswer) {
  // 1,000 connections that send nothing and 100 that send a byte now and then, then requests
  // from a well-behaved client: each answered within 100 ms.
  constexpr int kIdle = 1000, kSlow = 100;
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  const rlim_t want = 2 * (kIdle + kSlow) + 64;  // both ends of every connection are ours
  if (lim.rlim_cur < want) {
    lim.rlim_cur = std::min(want, lim.rlim_max);
    ::setrlimit(RLIMIT_NOFILE, &lim);
  }
  if (lim.rlim_cur < want) {
    GTEST_SKIP() << "needs " << want << " file descriptors; the hard limit is " << lim.rlim_max;
  }
  auto server = StartEcho();
  ASSERT_NE(server, nullptr);
  std::vector<int> fds;
  for (int i = 0; i < kIdle + kSlow; ++i) {
    const int fd = Connect(server->port());
    ASSERT_GE(fd, 0) << "connection " << i;
    fds.push_back(fd);
  }
  for (int i = 0; i < 500 && server->connections() < kIdle + kSlow; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(server->connections(), kIdle + kSlow);
  double worst = 0;
  for (int round = 0; round < 5; ++round) {
    for (int i = kIdle; i < kIdle + kSlow; ++i) SendAll(fds[i], "G");  // the slow ones trickle
    const auto t0 = Clock::now();
    const int fd = Connect(server->port());
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(SendAll(fd, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"));
    const std::string r = ReadResponse(fd);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    worst = std::max(worst, ms);
    EXPECT_EQ(StatusOf(r), 200) << r;
    ::close(fd);
  }
  EXPECT_LT(worst, 100.0) << "the slowest of 5 answers beside " << kIdle << " idle and " << kSlow
                          << " slow connections";
  for (int fd : fds) ::close(fd);
}

TEST(HttpServerTest, AReplyMayComeLaterFromAnotherThread) {
  std::vector<std::thread> workers;
  std::mutex mu;
  auto server = HttpServer::StartAsync({}, [&](const Request& r, std::shared_ptr<Responder> out) {
    std::lock_guard<std::mutex> lock(mu);
    workers.emplace_back([out, path = r.path] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      Response res;
      res.body = "late " + path;
      out->Send(std::move(res));
      out->Send(Response{});  // a second reply does nothing
    });
  });
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const int fd = Connect((*server)->port());
  ASSERT_GE(fd, 0);
  for (const char* path : {"/one", "/two"}) {  // and the connection is kept alive
    ASSERT_TRUE(SendAll(fd, std::string("GET ") + path + " HTTP/1.1\r\nHost: x\r\n\r\n"));
    const std::string r = ReadResponse(fd);
    EXPECT_EQ(StatusOf(r), 200) << r;
    EXPECT_NE(r.find(std::string("late ") + path), std::string::npos) << r;
  }
  ::close(fd);
  std::lock_guard<std::mutex> lock(mu);
  for (auto& w : workers) w.join();
}

TEST(HttpServerTest, AnEarlierRequestsResponderCannotAnswerTheNextRequest) {
  // On a kept-alive connection the responder of /one, kept past its reply, sends again while /two
  // is pending: that call belongs to a reply that is over and does nothing; /two gets its own.
  std::shared_ptr<Responder> first;
  std::thread worker;
  std::mutex mu;
  auto server = HttpServer::StartAsync({}, [&](const Request& r, std::shared_ptr<Responder> out) {
    std::lock_guard<std::mutex> lock(mu);
    if (r.path == "/one") {
      first = out;
      Response res;
      res.body = "first";
      out->Send(std::move(res));
      return;
    }
    Response stale;
    stale.body = "stale";
    first->Send(std::move(stale));  // reaches the server's thread before /two's own reply
    worker = std::thread([out] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      Response res;
      res.body = "second";
      out->Send(std::move(res));
    });
  });
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const int fd = Connect((*server)->port());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, "GET /one HTTP/1.1\r\nHost: x\r\n\r\n"));
  const std::string one = ReadResponse(fd);
  EXPECT_NE(one.find("first"), std::string::npos) << one;
  ASSERT_TRUE(SendAll(fd, "GET /two HTTP/1.1\r\nHost: x\r\n\r\n"));
  const std::string two = ReadResponse(fd);
  EXPECT_EQ(StatusOf(two), 200) << two;
  EXPECT_NE(two.find("second"), std::string::npos) << two;
  EXPECT_EQ(two.find("stale"), std::string::npos) << two;
  ::close(fd);
  std::lock_guard<std::mutex> lock(mu);
  if (worker.joinable()) worker.join();
}

TEST(HttpServerTest, StreamsChunksAsTheyAreWrittenThenCloses) {
  std::thread writer;
  auto server = HttpServer::StartAsync({}, [&](const Request&, std::shared_ptr<Responder> out) {
    out->StartStream(200, "text/event-stream");
    writer = std::thread([out] {
      for (int i = 0; i < 3; ++i) {
        out->Write("data: " + std::to_string(i) + "\n\n");
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
      }
      out->End();
      out->Write("data: after the end\n\n");  // ignored
    });
  });
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const int fd = Connect((*server)->port());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"));
  // The first event arrives before the last is written.
  std::string got;
  char buf[4096];
  const auto t0 = Clock::now();
  while (got.find("data: 0") == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    ASSERT_GT(n, 0);
    got.append(buf, static_cast<size_t>(n));
  }
  const double first_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  EXPECT_LT(first_ms, 60.0);
  ReadUntilClosed(fd, &got);
  EXPECT_EQ(StatusOf(got), 200) << got;
  EXPECT_NE(got.find("Content-Type: text/event-stream"), std::string::npos) << got;
  EXPECT_NE(got.find("Transfer-Encoding: chunked"), std::string::npos) << got;
  const size_t a = got.find("data: 0"), b = got.find("data: 1"), c = got.find("data: 2");
  EXPECT_TRUE(a < b && b < c && c != std::string::npos) << got;
  EXPECT_NE(got.find("\r\n0\r\n\r\n"), std::string::npos) << "the last chunk: " << got;
  EXPECT_EQ(got.find("after the end"), std::string::npos) << got;
  ::close(fd);
  writer.join();
}

TEST(HttpServerTest, StreamsToAnHttp10ClientWithoutChunksUntilTheClose) {
  // HTTP/1.0 has no chunked coding: the events come raw and the connection's close ends them.
  std::thread writer;
  auto server = HttpServer::StartAsync({}, [&](const Request&, std::shared_ptr<Responder> out) {
    out->StartStream(200, "text/event-stream");
    writer = std::thread([out] {
      for (int i = 0; i < 3; ++i) out->Write("data: " + std::to_string(i) + "\n\n");
      out->End();
    });
  });
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const int fd = Connect((*server)->port());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, "POST /v1/completions HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}"));
  std::string got;
  ReadUntilClosed(fd, &got);
  ASSERT_EQ(got.rfind("HTTP/1.0 200 ", 0), 0u) << got;
  EXPECT_EQ(got.find("Transfer-Encoding"), std::string::npos) << got;
  const size_t body = got.find("\r\n\r\n");
  ASSERT_NE(body, std::string::npos) << got;
  EXPECT_EQ(got.substr(body + 4), "data: 0\n\ndata: 1\n\ndata: 2\n\n");
  ::close(fd);
  writer.join();
}

TEST(HttpServerTest, AClientThatLeavesIsReportedOnce) {
  std::atomic<int> gone{0};
  std::shared_ptr<Responder> kept;
  auto server = HttpServer::StartAsync({}, [&](const Request&, std::shared_ptr<Responder> out) {
    out->OnClientGone([&gone] { gone.fetch_add(1); });
    out->StartStream(200, "text/event-stream");
    out->Write("data: first\n\n");
    kept = out;  // the work behind the reply goes on until the client leaves
  });
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const int fd = Connect((*server)->port());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n"));
  std::string got;
  char buf[1024];
  while (got.find("first") == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    ASSERT_GT(n, 0);
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  for (int i = 0; i < 200 && gone.load() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(gone.load(), 1);
  kept->Write("data: nobody reads this\n\n");
  kept->End();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(gone.load(), 1);
}

TEST(HttpServerTest, BindErrorsAreStatuses) {
  ServerOptions o;
  o.host = "not-an-address";
  EXPECT_EQ(HttpServer::Start(o, [](const Request&) { return Response{}; }).status().code(),
            StatusCode::kInvalidArgument);
  auto first = StartEcho();
  ASSERT_NE(first, nullptr);
  o.host = "127.0.0.1";
  o.port = first->port();
  EXPECT_EQ(HttpServer::Start(o, [](const Request&) { return Response{}; }).status().code(),
            StatusCode::kUnavailable);
}

}  // namespace
}  // namespace deja::http
