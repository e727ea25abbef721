// HttpServer over Boost.Beast: an acceptor and one Session per connection, all driven by one
// io_context thread.
#include "http/http_server.h"

#include <glog/logging.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/version.hpp>
#include <cctype>
#include <chrono>
#include <optional>
#include <thread>

namespace deja::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;

std::string_view Request::Header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (k == name) return v;
  }
  return {};
}

namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bhttp::response<bhttp::string_body> ToBeast(const Response& r, unsigned version, bool keep_alive) {
  bhttp::response<bhttp::string_body> res{static_cast<bhttp::status>(r.status), version};
  res.set(bhttp::field::server, "deja");
  res.set(bhttp::field::content_type, r.content_type);
  for (const auto& [k, v] : r.headers) res.set(k, v);
  res.keep_alive(keep_alive);
  if (r.head_only) {
    res.content_length(r.body.size());  // the size a GET would have sent
  } else {
    res.body() = r.body;
    res.prepare_payload();
  }
  return res;
}

Response Plain(int status, std::string body) {
  Response r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

}  // namespace

// Destroyed in reverse order: the acceptor, then the context (and with it the sessions its
// abandoned handlers hold, which still count themselves out of `connections`).
struct HttpServer::Impl {
  ServerOptions options;
  Handler handler;
  int port = 0;
  std::atomic<int> connections{0};
  std::atomic<uint64_t> requests{0};
  std::thread thread;
  asio::io_context ioc{1};
  tcp::acceptor acceptor{ioc};

  void Accept();
};

namespace {

// One connection: read a request (bounded in size and time), answer it, and read the next while
// the client keeps the connection alive.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, HttpServer::Impl* server)
      : stream_(std::move(socket)), server_(server) {
    server_->connections.fetch_add(1, std::memory_order_relaxed);
  }
  ~Session() { server_->connections.fetch_sub(1, std::memory_order_relaxed); }

  void Start() { Read(true); }

 private:
  void Read(bool first) {
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(server_->options.max_header_bytes));
    parser_->body_limit(server_->options.max_body_bytes);
    // The first request of a connection has the request timeout; a kept-alive connection waits
    // for its next request up to the idle timeout, then the request timeout applies again (Beast
    // resets it on each read; the bound below is the whole request's).
    stream_.expires_after(std::chrono::milliseconds(first ? server_->options.request_timeout_ms
                                                          : server_->options.idle_timeout_ms));
    bhttp::async_read(stream_, buffer_, *parser_,
                      [self = shared_from_this()](beast::error_code ec, std::size_t) {
                        self->OnRead(ec);
                      });
  }

  void OnRead(beast::error_code ec) {
    if (ec == bhttp::error::end_of_stream || ec == beast::error::timeout ||
        ec == asio::error::operation_aborted || ec == asio::error::connection_reset) {
      return Close();
    }
    if (ec == bhttp::error::header_limit) {
      return Reply(Plain(431, "request header fields too large\n"), false);
    }
    if (ec == bhttp::error::body_limit) {
      return Reply(Plain(413, "request body too large\n"), false);
    }
    if (ec) return Reply(Plain(400, "malformed request: " + ec.message() + "\n"), false);
    const auto& req = parser_->get();
    Request r;
    r.method = std::string(req.method_string().data(), req.method_string().size());
    r.target = std::string(req.target().data(), req.target().size());
    r.path = r.target.substr(0, r.target.find('?'));
    for (const auto& f : req) {
      const auto name = f.name_string();
      r.headers.emplace_back(Lower(std::string_view(name.data(), name.size())),
                             std::string(f.value().data(), f.value().size()));
    }
    r.body = req.body();
    version_ = req.version();
    Response res = server_->handler(r);
    if (r.method == "HEAD") res.head_only = true;
    Reply(std::move(res), req.keep_alive() && server_->options.keep_alive);
  }

  void Reply(Response r, bool keep_alive) {
    auto res = std::make_shared<bhttp::response<bhttp::string_body>>(
        ToBeast(r, version_, keep_alive));
    stream_.expires_after(std::chrono::milliseconds(server_->options.request_timeout_ms));
    server_->requests.fetch_add(1, std::memory_order_relaxed);
    bhttp::async_write(stream_, *res,
                       [self = shared_from_this(), res, keep_alive](beast::error_code ec,
                                                                    std::size_t) {
                         if (ec || !keep_alive) return self->Close();
                         self->Read(false);
                       });
  }

  void Close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.close();
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  unsigned version_ = 11;
  HttpServer::Impl* server_;
};

}  // namespace

void HttpServer::Impl::Accept() {
  acceptor.async_accept(ioc, [this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (!ec) {
      if (connections.load(std::memory_order_relaxed) >= options.max_connections) {
        beast::error_code ignored;
        socket.close(ignored);  // over the cap: closed at once
      } else {
        std::make_shared<Session>(std::move(socket), this)->Start();
      }
    } else {
      LOG_EVERY_N(WARNING, 100) << options.name << ": accept failed: " << ec.message();
    }
    Accept();
  });
}

StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const ServerOptions& options,
                                                       Handler handler) {
  if (options.port < 0 || options.port > 65535) {
    return InvalidArgument(options.name + " port must be in [0, 65535], got " +
                           std::to_string(options.port));
  }
  beast::error_code ec;
  const asio::ip::address address = asio::ip::make_address(options.host, ec);
  if (ec) {
    return InvalidArgument(options.name + " host must be an IP address, got '" + options.host +
                           "'");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->handler = std::move(handler);
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(options.port));
  const std::string where = options.host + ":" + std::to_string(options.port);
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (ec) return Unavailable(options.name + " server cannot bind " + where + ": " + ec.message());
  impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Unavailable(options.name + " server cannot listen on " + where + ": " + ec.message());
  }
  impl->port = impl->acceptor.local_endpoint().port();
  impl->Accept();
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->ioc.run(); });
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() {
  // Stopping the context abandons every pending operation; the sessions it holds are destroyed
  // with it (their sockets closed).
  asio::post(impl_->ioc, [impl = impl_.get()] {
    beast::error_code ignored;
    impl->acceptor.close(ignored);
    impl->ioc.stop();
  });
  impl_->thread.join();
}

int HttpServer::port() const { return impl_->port; }
int HttpServer::connections() const {
  return impl_->connections.load(std::memory_order_relaxed);
}
uint64_t HttpServer::requests() const { return impl_->requests.load(std::memory_order_relaxed); }

}  // namespace deja::http
