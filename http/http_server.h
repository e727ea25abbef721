// HttpServer: deja's HTTP/1.1 endpoints (plaintext or TLS, OpenSSL through Asio) on Boost.Beast
// (Debian's libboost-dev), one thread
// running an Asio io_context that multiplexes every connection asynchronously, so idle or slow
// clients hold a socket and a few kilobytes, never a thread.
//
// Bounds, each a clear status and never a stall of the others: a request head over
// max_header_bytes gets 431, a body over max_body_bytes 413, a malformed request 400; a request
// not complete within request_timeout_ms (slow clients, one byte a second) and a keep-alive
// connection idle for idle_timeout_ms are closed; connections beyond max_connections are closed
// on accept. Keep-alive follows the request (HTTP/1.1 default on, `Connection: close` off)
// unless the server turns it off.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace deja::http {

struct Request {
  std::string method;  // "GET", "POST", ...
  std::string target;  // path and query, as sent
  std::string path;    // target without the query
  std::vector<std::pair<std::string, std::string>> headers;  // names in lower case
  std::string body;
  // The value of header `name` (lower case), "" when absent.
  std::string_view Header(std::string_view name) const;
};

struct Response {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers
  std::string body;
  bool head_only = false;  // a HEAD request: the headers of the body, without it
};

// Called on the server's thread for each complete request; it must not block for long.
using Handler = std::function<Response(const Request&)>;

// A reply in progress, which any thread may complete: Send a whole response, or StartStream,
// then Write chunks (chunked transfer: server-sent events go out as they are written) and End.
// Calls after the reply ended, or after the client went away, do nothing, even once a kept-alive
// connection has read its next request (which has its own Responder). The connection closes
// after a streamed reply.
class Responder {
 public:
  virtual ~Responder() = default;
  virtual void Send(Response response) = 0;
  virtual void StartStream(int status, std::string content_type,
                           std::vector<std::pair<std::string, std::string>> headers = {}) = 0;
  virtual void Write(std::string data) = 0;
  virtual void End() = 0;
  // `f` runs once, on the server's thread, if the client closes the connection (or the server
  // stops) before the reply ended: the place to cancel the work behind it. Set it before the
  // handler returns.
  virtual void OnClientGone(std::function<void()> f) = 0;
};

// Called on the server's thread with each complete request; the reply may come later, from any
// thread, through the Responder.
using AsyncHandler = std::function<void(const Request&, std::shared_ptr<Responder>)>;

struct ServerOptions {
  // Address to bind: "127.0.0.1" for loopback only, "0.0.0.0" so other hosts can connect.
  std::string host = "127.0.0.1";
  // 0 picks a free port; HttpServer::port() reports it.
  int port = 0;
  size_t max_header_bytes = 8192;
  size_t max_body_bytes = size_t{1} << 20;
  int max_connections = 4096;
  int request_timeout_ms = 10000;
  int idle_timeout_ms = 30000;
  // false: every response closes its connection (simple scrapers read to EOF).
  bool keep_alive = true;
  // The body of the server's own refusals (431, 413, 400 before any handler ran), for an API
  // whose errors have a format of their own; unset: plain text.
  std::function<Response(int status, const std::string& message)> refusal;
  // For log lines: what this server serves ("metrics", ...).
  std::string name = "http";
  // TLS: the PEM certificate chain and private key (both, or neither: plaintext), and the PEM
  // CAs that client certificates must chain to (empty: none is asked for).
  std::string tls_cert_chain;
  std::string tls_private_key;
  std::string tls_client_ca;
};

class HttpServer {
 public:
  // Binds and starts serving. Errors (bad host, port in use) come back as UNAVAILABLE or
  // INVALID_ARGUMENT, never as a crash.
  static StatusOr<std::unique_ptr<HttpServer>> Start(const ServerOptions& options,
                                                     Handler handler);
  static StatusOr<std::unique_ptr<HttpServer>> StartAsync(const ServerOptions& options,
                                                          AsyncHandler handler);
  // Stops accepting, closes every connection and joins the thread.
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;
  // Open connections now, and requests answered so far.
  int connections() const;
  uint64_t requests() const;
  // Requests received whose reply has not been written out (or abandoned by its client) yet.
  int in_flight() const;
  // Waits until in_flight() is 0 (the replies a drain let finish have left); false on timeout.
  bool WaitIdle(std::chrono::milliseconds timeout) const;

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace deja::http
