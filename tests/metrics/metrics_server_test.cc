// MetricsServer over real loopback sockets: scrape content and headers, 404/405/431, several
// sequential and concurrent scrapes, 401 when an authorizer refuses, bind errors, and a clean
// stop in the destructor.
#include "metrics/metrics_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/common/loopback.h"

namespace deja::metrics {
namespace {

using test_util::SendAll;
int Connect(int port) { return test_util::ConnectLoopback(port); }

// Reads until the server closes its side.
std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  while (true) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

struct HttpReply {
  int status = 0;
  std::string head;
  std::string body;
};

HttpReply Request(int port, const std::string& raw) {
  HttpReply reply;
  const int fd = Connect(port);
  if (fd < 0) return reply;
  if (SendAll(fd, raw)) {
    const std::string all = ReadAll(fd);
    const size_t split = all.find("\r\n\r\n");
    if (split != std::string::npos && all.rfind("HTTP/1.1 ", 0) == 0) {
      reply.status = std::stoi(all.substr(9, 3));
      reply.head = all.substr(0, split);
      reply.body = all.substr(split + 4);
    }
  }
  ::close(fd);
  return reply;
}

HttpReply Get(int port, const std::string& path) {
  return Request(port, "GET " + path + " HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n");
}

class MetricsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto& codes = registry_.AddCounter("deja_coordinator_requests_total", "Requests.", {"code"});
    codes.Add({{"code", "OK"}}).Increment(3);
    codes.Add({{"code", "weird\"value\\\n"}}).Increment();
    registry_.AddGauge("deja_scheduler_waiting_sequences", "Waiting.").Add({}).Set(7);
    auto& ttft = registry_.AddHistogram("deja_coordinator_time_to_first_token_seconds", "TTFT.", {},
                                        {0.01, 0.1});
    ttft.Add({}).Observe(0.005);
    ttft.Add({}).Observe(0.05);
    MetricsServerOptions options;
    options.host = "127.0.0.1";
    options.max_request_bytes = 1024;
    auto server = MetricsServer::Start(&registry_, options);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
    ASSERT_GT(server_->port(), 0);
  }

  Registry registry_;
  std::unique_ptr<MetricsServer> server_;
};

TEST_F(MetricsServerTest, ScrapeReturnsEveryFamilyWithHeaders) {
  const HttpReply reply = Get(server_->port(), "/metrics");
  ASSERT_EQ(reply.status, 200) << reply.head;
  EXPECT_NE(reply.head.find("Content-Type: text/plain; version=0.0.4"), std::string::npos);
  EXPECT_NE(reply.head.find("Content-Length: " + std::to_string(reply.body.size())),
            std::string::npos)
      << reply.head;
  EXPECT_EQ(reply.body, registry_.Serialize());
  for (const char* line : {
           "# TYPE deja_coordinator_requests_total counter\n",
           "deja_coordinator_requests_total{code=\"OK\"} 3\n",
           "deja_coordinator_requests_total{code=\"weird\\\"value\\\\\\n\"} 1\n",
           "# TYPE deja_scheduler_waiting_sequences gauge\n",
           "deja_scheduler_waiting_sequences 7\n",
           "# TYPE deja_coordinator_time_to_first_token_seconds histogram\n",
           "deja_coordinator_time_to_first_token_seconds_bucket{le=\"0.01\"} 1\n",
           "deja_coordinator_time_to_first_token_seconds_bucket{le=\"0.1\"} 2\n",
           "deja_coordinator_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2\n",
           "deja_coordinator_time_to_first_token_seconds_sum 0.055\n",
           "deja_coordinator_time_to_first_token_seconds_count 2\n",
       }) {
    EXPECT_NE(reply.body.find(line), std::string::npos) << "missing: " << line << reply.body;
  }
  EXPECT_EQ(server_->scrapes(), 1u);
}

TEST_F(MetricsServerTest, ScrapesSeeNewValuesAndQueryStringsAreIgnored) {
  Counter& ok = registry_.AddCounter("deja_test_later_total", "Later.").Add({});
  for (int i = 1; i <= 5; ++i) {
    ok.Increment();
    const HttpReply reply = Get(server_->port(), i % 2 ? "/metrics" : "/metrics?x=1");
    ASSERT_EQ(reply.status, 200);
    EXPECT_NE(reply.body.find("deja_test_later_total " + std::to_string(i) + "\n"),
              std::string::npos);
  }
  EXPECT_EQ(server_->scrapes(), 5u);
}

TEST_F(MetricsServerTest, HeadHasHeadersOnly) {
  const HttpReply reply = Request(server_->port(), "HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_EQ(reply.status, 200);
  EXPECT_TRUE(reply.body.empty());
}

TEST_F(MetricsServerTest, OtherPathsAre404AndOtherMethods405) {
  EXPECT_EQ(Get(server_->port(), "/").status, 404);
  EXPECT_EQ(Get(server_->port(), "/metricsx").status, 404);
  EXPECT_EQ(Get(server_->port(), "/favicon.ico").status, 404);
  const HttpReply post =
      Request(server_->port(), "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(post.status, 405);
  EXPECT_NE(post.head.find("Allow: GET, HEAD"), std::string::npos);
  EXPECT_EQ(Request(server_->port(), "garbage\r\n\r\n").status, 400);
  EXPECT_EQ(server_->scrapes(), 0u);
}

TEST_F(MetricsServerTest, RequestsSplitOverManyWritesWork) {
  const int fd = Connect(server_->port());
  ASSERT_GE(fd, 0);
  for (const char* piece : {"GE", "T /met", "rics HTTP/1.1\r\n", "Host: x\r\n", "\r\n"}) {
    ASSERT_TRUE(SendAll(fd, piece));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const std::string all = ReadAll(fd);
  ::close(fd);
  EXPECT_EQ(all.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << all;
}

TEST_F(MetricsServerTest, OversizedRequestGets431AndServerKeepsServing) {
  const std::string huge = "GET /metrics HTTP/1.1\r\nX-Pad: " + std::string(4000, 'a') + "\r\n\r\n";
  EXPECT_EQ(Request(server_->port(), huge).status, 431);
  EXPECT_EQ(Get(server_->port(), "/metrics").status, 200);
}

TEST_F(MetricsServerTest, ConcurrentScrapesAllSucceed) {
  constexpr int kThreads = 6;
  constexpr int kEach = 10;
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kEach; ++i) {
        const HttpReply r = Get(server_->port(), "/metrics");
        if (r.status == 200 &&
            r.body.find("deja_scheduler_waiting_sequences 7\n") != std::string::npos) {
          ok.fetch_add(1);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok.load(), kThreads * kEach);
  EXPECT_EQ(server_->scrapes(), static_cast<uint64_t>(kThreads * kEach));
}

TEST_F(MetricsServerTest, IdleClientDoesNotBlockOthers) {
  const int idle = Connect(server_->port());  // connects, never sends
  ASSERT_GE(idle, 0);
  ASSERT_TRUE(SendAll(idle, "GET /met"));
  EXPECT_EQ(Get(server_->port(), "/metrics").status, 200);
  ::close(idle);
}

TEST_F(MetricsServerTest, DestructorStopsServingPromptly) {
  const int port = server_->port();
  const int open_conn = Connect(port);  // an open connection must not delay the stop
  ASSERT_GE(open_conn, 0);
  const auto start = std::chrono::steady_clock::now();
  server_.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  // The server closed its side of the open connection...
  EXPECT_EQ(ReadAll(open_conn), "");
  ::close(open_conn);
  // ...and nobody listens on the port any more.
  EXPECT_EQ(Connect(port), -1);
}

TEST(MetricsServerStartTest, ReportsBindErrorsAsStatus) {
  Registry registry;
  MetricsServerOptions options;
  options.host = "127.0.0.1";
  auto first = MetricsServer::Start(&registry, options);
  ASSERT_TRUE(first.ok());
  options.port = (*first)->port();
  auto second = MetricsServer::Start(&registry, options);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find(std::to_string(options.port)), std::string::npos);

  options.host = "not-an-address";
  EXPECT_EQ(MetricsServer::Start(&registry, options).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MetricsServer::Start(&registry, 70000).status().code(), StatusCode::kInvalidArgument);
}

// With an authorizer, /metrics answers 401 (with WWW-Authenticate) unless it accepts the
// Authorization header, whatever the header name's case; other paths are unaffected.
TEST(MetricsServerAuthTest, ScrapesNeedAnAcceptedAuthorizationHeader) {
  Registry registry;
  registry.AddGauge("deja_test_up", "Up.").Add({}).Set(1);
  MetricsServerOptions options;
  std::vector<std::string> seen;
  std::mutex mu;
  options.authorize = [&](std::string_view a) {
    std::lock_guard<std::mutex> lock(mu);
    seen.emplace_back(a);
    return a == "Bearer good";
  };
  auto server = MetricsServer::Start(&registry, options);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const int port = (*server)->port();
  const HttpReply none = Get(port, "/metrics");
  EXPECT_EQ(none.status, 401);
  EXPECT_NE(none.head.find("\r\nWWW-Authenticate: Bearer realm=\"deja\""), std::string::npos)
      << none.head;
  EXPECT_EQ(none.body.find("deja_test_up"), std::string::npos);
  const auto with = [&](const std::string& header) {
    return Request(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n" + header + "\r\n\r\n");
  };
  EXPECT_EQ(with("Authorization: Bearer bad").status, 401);
  EXPECT_EQ(with("X-Authorization: Bearer good").status, 401);
  const HttpReply good = with("authorization:   Bearer good  ");
  EXPECT_EQ(good.status, 200) << good.head;
  EXPECT_NE(good.body.find("deja_test_up 1"), std::string::npos);
  EXPECT_EQ(with("AUTHORIZATION: Bearer good").status, 200);
  EXPECT_EQ(Request(port, "HEAD /metrics HTTP/1.1\r\n\r\n").status, 401);
  EXPECT_EQ(Get(port, "/other").status, 404);
  EXPECT_EQ((*server)->scrapes(), 2u);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(seen,
            (std::vector<std::string>{"", "Bearer bad", "", "Bearer good", "Bearer good", ""}));
}

int OpenFdCount() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

TEST(MetricsServerStartTest, ManyStartsAndStopsLeakNoDescriptors) {
  Registry registry;
  registry.AddGauge("deja_test_up", "Up.").Add({}).Set(1);
  const int before = OpenFdCount();
  for (int i = 0; i < 20; ++i) {
    auto server = MetricsServer::Start(&registry, 0);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    if (i % 5 == 0) {
      EXPECT_EQ(Get((*server)->port(), "/metrics").status, 200);
    }
  }
  EXPECT_EQ(OpenFdCount(), before);
}

}  // namespace
}  // namespace deja::metrics
