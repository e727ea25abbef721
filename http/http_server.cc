// HttpServer over Boost.Beast: an acceptor and one Session per connection, all driven by one
// io_context thread.
#include "http/http_server.h"

#include <glog/logging.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/version.hpp>
#include <array>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <deque>
#include <optional>
#include <thread>
#include <type_traits>

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
  AsyncHandler handler;
  int port = 0;
  std::atomic<int> connections{0};
  std::atomic<uint64_t> requests{0};
  std::atomic<int> in_flight{0};
  std::thread thread;
  asio::io_context ioc{1};
  std::optional<asio::ssl::context> ssl;  // set when the server speaks TLS
  tcp::acceptor acceptor{ioc};

  void Accept();
};

namespace {

using TlsStream = beast::ssl_stream<beast::tcp_stream>;

// One connection: read a request (bounded in size and time), answer it, and read the next while
// the client keeps the connection alive. Stream: beast::tcp_stream, or TlsStream over it (the
// handshake first, under the request timeout).
template <typename Stream>
class Session : public std::enable_shared_from_this<Session<Stream>> {
  static constexpr bool kTls = std::is_same_v<Stream, TlsStream>;
  // Lingering after a refusal reads the raw socket, which a TLS stream cannot skip over.
  static constexpr bool kPlain = !kTls;
  using std::enable_shared_from_this<Session<Stream>>::shared_from_this;

 public:
  Session(tcp::socket socket, HttpServer::Impl* server)
      : stream_(MakeStream(std::move(socket), server)), server_(server) {
    server_->connections.fetch_add(1, std::memory_order_relaxed);
  }
  ~Session() {
    ReplyDone();
    server_->connections.fetch_sub(1, std::memory_order_relaxed);
  }

  void Start() {
    if constexpr (kTls) {
      Tcp().expires_after(std::chrono::milliseconds(server_->options.request_timeout_ms));
      stream_.async_handshake(asio::ssl::stream_base::server,
                              [self = shared_from_this()](beast::error_code ec) {
                                if (ec) {
                                  VLOG(1) << self->server_->options.name
                                          << ": TLS handshake failed: " << ec.message();
                                  return self->Tcp().close();
                                }
                                self->Read(true);
                              });
    } else {
      Read(true);
    }
  }

 private:
  static Stream MakeStream(tcp::socket socket, HttpServer::Impl* server) {
    if constexpr (kTls) {
      return Stream(std::move(socket), *server->ssl);
    } else {
      return Stream(std::move(socket));
    }
  }
  beast::tcp_stream& Tcp() { return beast::get_lowest_layer(stream_); }

  void Read(bool first) {
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(server_->options.max_header_bytes));
    parser_->body_limit(server_->options.max_body_bytes);
    // The first request of a connection has the request timeout; a kept-alive connection waits
    // for its next request up to the idle timeout, then the request timeout applies again (Beast
    // resets it on each read; the bound below is the whole request's).
    Tcp().expires_after(std::chrono::milliseconds(first ? server_->options.request_timeout_ms
                                                        : server_->options.idle_timeout_ms));
    bhttp::async_read(stream_, buffer_, *parser_,
                      [self = shared_from_this()](beast::error_code ec, std::size_t) {
                        self->OnRead(ec);
                      });
  }

  // The server's own refusals, in the form its options ask for (plain text by default).
  Response Refusal(int status, const std::string& message) const {
    if (server_->options.refusal) return server_->options.refusal(status, message);
    return Plain(status, message + "\n");
  }

  void OnRead(beast::error_code ec) {
    if (ec == bhttp::error::end_of_stream || ec == beast::error::timeout ||
        ec == asio::error::operation_aborted || ec == asio::error::connection_reset ||
        ec == asio::ssl::error::stream_truncated) {
      return Close();
    }
    if (ec == bhttp::error::header_limit) {
      return Reply(Refusal(431, "request header fields too large"), false, kPlain);
    }
    if (ec == bhttp::error::body_limit) {
      return Reply(Refusal(413, "request body too large (at most " +
                                     std::to_string(server_->options.max_body_bytes) + " bytes)"),
                   false, kPlain);
    }
    if (ec) return Reply(Refusal(400, "malformed request: " + ec.message()), false);
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
    head_ = r.method == "HEAD";
    keep_alive_ = req.keep_alive() && server_->options.keep_alive;
    // No deadline while the handler works; each write has one. A read of one byte watches for
    // the client going away meanwhile.
    Tcp().expires_never();
    replying_ = true;
    counted_ = true;
    server_->in_flight.fetch_add(1, std::memory_order_relaxed);
    responder_ = std::make_shared<SessionResponder>(shared_from_this(), ++request_gen_);
    WatchClient();
    server_->handler(r, responder_);
  }

 public:
  // --- On the server's thread, from SessionResponder. ---
  void DoSend(Response res) {
    if (!replying_ || streaming_) return;
    replying_ = false;
    if (head_) res.head_only = true;
    Reply(std::move(res), keep_alive_);
  }
  void DoStartStream(int status, std::string content_type,
                     std::vector<std::pair<std::string, std::string>> headers) {
    if (!replying_ || streaming_) return;
    streaming_ = true;
    // HTTP/1.0 has no chunked coding: its client reads the body until the connection closes.
    chunked_ = version_ >= 11;
    std::string head = std::string(chunked_ ? "HTTP/1.1 " : "HTTP/1.0 ") +
                       std::to_string(status) + " " +
                       std::string(bhttp::obsolete_reason(static_cast<bhttp::status>(status))) +
                       "\r\nServer: deja\r\nContent-Type: " + content_type +
                       "\r\nCache-Control: no-cache" +
                       (chunked_ ? "\r\nTransfer-Encoding: chunked" : "") +
                       "\r\nConnection: close\r\n";
    for (const auto& [k, v] : headers) head += k + ": " + v + "\r\n";
    head += "\r\n";
    Queue(std::move(head));
  }
  void DoWrite(std::string data) {
    if (!replying_ || !streaming_ || data.empty()) return;
    if (!chunked_) return Queue(std::move(data));
    char size[32];
    std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
    Queue(size + std::move(data) + "\r\n");
  }
  void DoEnd() {
    if (!replying_ || !streaming_) return;
    replying_ = false;
    server_->requests.fetch_add(1, std::memory_order_relaxed);
    closing_ = true;
    if (chunked_) return Queue("0\r\n\r\n");
    if (!writing_) WriteNext();  // nothing left to write: close now
  }
  void SetGone(std::function<void()> f) { gone_ = std::move(f); }

 private:
  // The reply's half of the connection: SessionResponder posts each call to the server's thread.
  class SessionResponder final : public Responder {
   public:
    SessionResponder(std::shared_ptr<Session> s, uint64_t request)
        : session_(std::move(s)), request_(request) {}
    void Send(Response response) override {
      Post([response = std::move(response)](Session& s) mutable {
        s.DoSend(std::move(response));
      });
    }
    void StartStream(int status, std::string content_type,
                     std::vector<std::pair<std::string, std::string>> headers) override {
      Post([status, ct = std::move(content_type), h = std::move(headers)](Session& s) mutable {
        s.DoStartStream(status, std::move(ct), std::move(h));
      });
    }
    void Write(std::string data) override {
      Post([d = std::move(data)](Session& s) mutable { s.DoWrite(std::move(d)); });
    }
    void End() override {
      Post([](Session& s) { s.DoEnd(); });
    }
    void OnClientGone(std::function<void()> f) override {
      // Set from the handler, on the server's thread, before any reading can report.
      if (auto s = session_.lock()) s->SetGone(std::move(f));
    }

   private:
    template <typename F>
    void Post(F f) {
      std::shared_ptr<Session> s = session_.lock();
      if (!s) return;
      auto ex = s->Tcp().get_executor();
      // A call that reaches the server's thread after the connection moved on to its next
      // request (a late second Send, say) belongs to a reply that is over: it does nothing, so
      // it cannot answer the next request in its place.
      asio::post(ex, [s, request = request_, f = std::move(f)]() mutable {
        if (s->request_gen_ == request) f(*s);
      });
    }
    std::weak_ptr<Session> session_;
    uint64_t request_;  // the request it answers (Session::request_gen_ when it was read)
  };

  // While a reply is pending or streaming, the socket turning readable means the client closed
  // (or sent more than it should, a TLS close_notify included, which ends the connection too).
  // The wait reads nothing, so it neither disturbs TLS nor runs under the stream's timeouts.
  void WatchClient() {
    const uint64_t gen = ++watch_gen_;
    Tcp().socket().async_wait(
        tcp::socket::wait_read, [self = shared_from_this(), gen](beast::error_code ec) {
          // A watch cancelled because the reply went out, or one of an earlier request.
          if (gen != self->watch_gen_ || ec == asio::error::operation_aborted) return;
          self->ClientGone();
        });
  }

  // The current request's reply is out (or will never be): it leaves in_flight.
  void ReplyDone() {
    if (!counted_) return;
    counted_ = false;
    server_->in_flight.fetch_sub(1, std::memory_order_relaxed);
  }

  void ClientGone() {
    if (!replying_ && !(streaming_ && !closing_)) return;
    replying_ = false;
    ReplyDone();
    if (gone_) {
      auto f = std::move(gone_);
      gone_ = nullptr;
      f();
    }
    Close(/*graceful=*/false);
  }

  // Streamed bytes go out in order, one write in flight.
  void Queue(std::string bytes) {
    out_.push_back(std::move(bytes));
    if (!writing_) WriteNext();
  }
  void WriteNext() {
    if (out_.empty()) {
      writing_ = false;
      if (closing_) {
        ReplyDone();
        Close();
      }
      return;
    }
    writing_ = true;
    Tcp().expires_after(std::chrono::milliseconds(server_->options.request_timeout_ms));
    asio::async_write(stream_, asio::buffer(out_.front()),
                      [self = shared_from_this()](beast::error_code ec, std::size_t) {
                        self->out_.pop_front();
                        if (ec) return self->ClientGone();
                        self->WriteNext();
                      });
  }

  // linger: a refusal sent before the request was read whole; the rest of it is read and dropped
  // (for a while) before the connection closes, so that a client still sending sees the answer
  // rather than a reset.
  void Reply(Response r, bool keep_alive, bool linger = false) {
    gone_ = nullptr;  // replied: the client's going away no longer matters
    // Stop watching the client before answering: after the answer, the next request's bytes are
    // the parser's.
    ++watch_gen_;
    beast::error_code ignored;
    Tcp().socket().cancel(ignored);
    auto res = std::make_shared<bhttp::response<bhttp::string_body>>(
        ToBeast(r, version_, keep_alive));
    Tcp().expires_after(std::chrono::milliseconds(server_->options.request_timeout_ms));
    server_->requests.fetch_add(1, std::memory_order_relaxed);
    bhttp::async_write(stream_, *res,
                       [self = shared_from_this(), res, keep_alive, linger](
                           beast::error_code ec, std::size_t) {
                         self->ReplyDone();
                         if (!ec && linger) return self->Linger(0);
                         if (ec || !keep_alive) return self->Close();
                         self->Read(false);
                       });
  }

  // Reads and drops what the client still sends, up to 64 MiB or the request timeout.
  void Linger(size_t dropped) {
    constexpr size_t kMaxDropped = size_t{64} << 20;
    if (dropped == 0) {
      beast::error_code ignored;
      Tcp().socket().shutdown(tcp::socket::shutdown_send, ignored);
      Tcp().expires_after(std::chrono::milliseconds(server_->options.request_timeout_ms));
    }
    if (dropped > kMaxDropped) return Close(/*graceful=*/false);
    Tcp().async_read_some(asio::buffer(linger_buf_),
                          [self = shared_from_this(), dropped](beast::error_code ec, size_t n) {
                            if (ec) return self->Close(/*graceful=*/false);
                            self->Linger(dropped + n);
                          });
  }

  // graceful: a TLS connection says close_notify first (nothing else may be in flight then).
  void Close(bool graceful = true) {
    if (closed_) return;
    closed_ = true;
    beast::error_code ignored;
    if (kTls && !graceful) {
      Tcp().close();
      return;
    }
    if constexpr (kTls) {
      // close_notify, waiting up to a second for the client's, then the socket.
      Tcp().expires_after(std::chrono::seconds(1));
      stream_.async_shutdown(
          [self = shared_from_this()](beast::error_code) { self->Tcp().close(); });
    } else {
      Tcp().socket().shutdown(tcp::socket::shutdown_send, ignored);
      Tcp().close();
    }
  }

  Stream stream_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  unsigned version_ = 11;
  HttpServer::Impl* server_;
  // The current reply.
  std::shared_ptr<SessionResponder> responder_;
  std::function<void()> gone_;
  bool head_ = false, keep_alive_ = false;
  bool replying_ = false;   // a request waits for its reply
  bool streaming_ = false;  // the reply is a stream
  bool chunked_ = true;     // the stream's body in chunks (HTTP/1.1), else raw until the close
  bool closing_ = false;    // the stream ended: close once its bytes are out
  bool writing_ = false;
  bool counted_ = false;  // the current request counts in the server's in_flight
  bool closed_ = false;
  std::deque<std::string> out_;
  std::array<char, 16384> linger_buf_;
  uint64_t watch_gen_ = 0;
  uint64_t request_gen_ = 0;  // the requests read on this connection
};

}  // namespace

void HttpServer::Impl::Accept() {
  acceptor.async_accept(ioc, [this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (!ec) {
      if (connections.load(std::memory_order_relaxed) >= options.max_connections) {
        beast::error_code ignored;
        socket.close(ignored);  // over the cap: closed at once
      } else if (ssl) {
        std::make_shared<Session<TlsStream>>(std::move(socket), this)->Start();
      } else {
        std::make_shared<Session<beast::tcp_stream>>(std::move(socket), this)->Start();
      }
    } else {
      LOG_EVERY_N(WARNING, 100) << options.name << ": accept failed: " << ec.message();
    }
    Accept();
  });
}

StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const ServerOptions& options,
                                                       Handler handler) {
  return StartAsync(options, [handler = std::move(handler)](const Request& r,
                                                             std::shared_ptr<Responder> reply) {
    reply->Send(handler(r));
  });
}

StatusOr<std::unique_ptr<HttpServer>> HttpServer::StartAsync(const ServerOptions& options,
                                                            AsyncHandler handler) {
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
  if (options.tls_cert_chain.empty() != options.tls_private_key.empty()) {
    return InvalidArgument(options.name + ": a TLS certificate chain and key go together");
  }
  if (!options.tls_cert_chain.empty()) {
    impl->ssl.emplace(asio::ssl::context::tls_server);
    asio::ssl::context& ctx = *impl->ssl;
    ctx.set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                    asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                    asio::ssl::context::no_tlsv1_1 | asio::ssl::context::single_dh_use);
    ctx.use_certificate_chain(asio::buffer(options.tls_cert_chain), ec);
    if (!ec) ctx.use_private_key(asio::buffer(options.tls_private_key), asio::ssl::context::pem, ec);
    if (!ec && !options.tls_client_ca.empty()) {
      ctx.add_certificate_authority(asio::buffer(options.tls_client_ca), ec);
      ctx.set_verify_mode(asio::ssl::verify_peer | asio::ssl::verify_fail_if_no_peer_cert);
    }
    if (ec) return InvalidArgument(options.name + ": TLS material refused: " + ec.message());
  }
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
int HttpServer::in_flight() const { return impl_->in_flight.load(std::memory_order_relaxed); }

bool HttpServer::WaitIdle(std::chrono::milliseconds timeout) const {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (in_flight() > 0) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace deja::http
