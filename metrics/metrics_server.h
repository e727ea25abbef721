// MetricsServer: a minimal HTTP/1.1 endpoint for Prometheus scrapes. One thread multiplexes
// every connection with poll(); GET (or HEAD) /metrics renders the Registry, anything else gets
// 404 (405 for other methods); with an authorize function, a scrape without an accepted
// Authorization header gets 401. Each response closes its connection, which Prometheus accepts.
// Requests are bounded in size and idle time so a stuck client cannot hold the server.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/status.h"
#include "metrics/registry.h"

namespace deja::metrics {

using Authorizer = std::function<bool(std::string_view authorization)>;

struct MetricsServerOptions {
  // Address to bind: "127.0.0.1" for loopback only, "0.0.0.0" so other hosts can scrape.
  std::string host = "127.0.0.1";
  // 0 picks a free port; MetricsServer::port() reports it.
  int port = 0;
  // Request line plus headers; larger requests get 431 and are closed.
  size_t max_request_bytes = 8192;
  // Connections beyond this are closed at once.
  int max_connections = 64;
  // A connection that neither completes its request nor drains its response in this time is
  // closed.
  int idle_timeout_ms = 10000;
  // When set, /metrics answers only requests whose Authorization header value (passed as is,
  // "" when absent) it accepts; the others get 401 with `WWW-Authenticate: Bearer`. Called on
  // the server's thread.
  Authorizer authorize;
};

class MetricsServer {
 public:
  // Binds and starts serving `registry`, which must outlive the server. Errors (bad host, port
  // in use) come back as UNAVAILABLE or INVALID_ARGUMENT, never as a crash.
  static StatusOr<std::unique_ptr<MetricsServer>> Start(const Registry* registry,
                                                        const MetricsServerOptions& options);
  static StatusOr<std::unique_ptr<MetricsServer>> Start(const Registry* registry, int port) {
    MetricsServerOptions options;
    options.port = port;
    return Start(registry, options);
  }

  // Stops accepting, closes every connection and joins the thread.
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }
  // Scrapes answered with 200 so far.
  uint64_t scrapes() const { return scrapes_.load(std::memory_order_relaxed); }

 private:
  struct Connection;
  MetricsServer(const Registry* registry, const MetricsServerOptions& options, int listen_fd,
                int wake_fd, int port);
  void Run();
  void Accept();
  // Reads what is available; returns false when the connection should be closed.
  bool OnReadable(Connection* conn);
  // Writes what the socket takes; returns false when done or failed.
  bool OnWritable(Connection* conn);
  void Respond(Connection* conn);

  const Registry* registry_;
  MetricsServerOptions options_;
  int listen_fd_;
  int wake_fd_;  // eventfd written by the destructor
  int port_;
  std::atomic<uint64_t> scrapes_{0};
  std::vector<std::unique_ptr<Connection>> connections_;  // used by thread_ only
  std::thread thread_;
};

// Builds the HTTP response for one request head (request line + headers, without the final
// blank line). Exposed for tests. Sets *is_scrape when the response is a 200 from /metrics.
std::string HttpResponseFor(const std::string& request_head, const Registry& registry,
                            bool* is_scrape, const Authorizer& authorize = nullptr);

}  // namespace deja::metrics
