// MetricsServer: the scrape endpoint's rules, served by http::HttpServer.
#include "metrics/metrics_server.h"

#include <glog/logging.h>

#include <utility>

namespace deja::metrics {

StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const Registry* registry,
                                                              const MetricsServerOptions& options) {
  CHECK(registry != nullptr);
  std::unique_ptr<MetricsServer> m(new MetricsServer());
  m->scrapes_ = std::make_shared<std::atomic<uint64_t>>(0);
  http::ServerOptions o;
  o.name = "metrics";
  o.host = options.host;
  o.port = options.port;
  o.max_header_bytes = options.max_request_bytes;
  o.max_body_bytes = 0;  // a scrape has no body
  o.max_connections = options.max_connections;
  o.request_timeout_ms = options.idle_timeout_ms;
  o.idle_timeout_ms = options.idle_timeout_ms;
  o.keep_alive = false;  // each scrape closes its connection, which Prometheus accepts
  auto handler = [registry, authorize = options.authorize,
                  scrapes = m->scrapes_](const http::Request& req) {
    http::Response r;
    if (req.path != "/metrics") {  // scrapers may add query parameters
      r.status = 404;
      r.body = "try /metrics\n";
      return r;
    }
    if (req.method != "GET" && req.method != "HEAD") {
      r.status = 405;
      r.body = "use GET\n";
      r.headers.emplace_back("Allow", "GET, HEAD");
      return r;
    }
    if (authorize && !authorize(req.Header("authorization"))) {
      r.status = 401;
      r.body = "a bearer token is required\n";
      r.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"deja\"");
      return r;
    }
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = registry->Serialize();
    scrapes->fetch_add(1, std::memory_order_relaxed);
    return r;
  };
  DEJA_ASSIGN_OR_RETURN(m->server_, http::HttpServer::Start(o, std::move(handler)));
  LOG(INFO) << "metrics: serving http://" << options.host << ":" << m->server_->port()
            << "/metrics";
  return m;
}

MetricsServer::~MetricsServer() {
  server_.reset();
  VLOG(1) << "metrics: stopped after " << scrapes() << " scrapes";
}

}  // namespace deja::metrics
