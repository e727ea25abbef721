// MetricsServer: the endpoint for Prometheus scrapes, on deja's HTTP server (http/http_server.h,
// Boost.Beast: one thread, every connection asynchronous, so idle or slow clients never hold a
// scrape). GET (or HEAD) /metrics renders the Registry, anything else gets 404 (405 for other
// methods); with an authorize function, a scrape without an accepted Authorization header gets
// 401. Requests are bounded in size (431) and time.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"
#include "http/http_server.h"
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
  // Connections beyond this are closed at once (each costs a socket and a few kilobytes).
  int max_connections = 4096;
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

  int port() const { return server_->port(); }
  // Scrapes answered with 200 so far.
  uint64_t scrapes() const { return scrapes_->load(std::memory_order_relaxed); }

 private:
  MetricsServer() = default;
  std::shared_ptr<std::atomic<uint64_t>> scrapes_;
  std::unique_ptr<http::HttpServer> server_;
};

}  // namespace deja::metrics
