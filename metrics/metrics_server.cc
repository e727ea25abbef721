// MetricsServer: socket setup, the poll loop, and the few HTTP rules a scrape endpoint needs.
#include "metrics/metrics_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <glog/logging.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

namespace deja::metrics {
namespace {

using Clock = std::chrono::steady_clock;
// How long a finished connection waits for the client to close before it is closed anyway.
constexpr int kLingerMs = 2000;

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

std::string PlainResponse(int code, const char* reason, const std::string& body) {
  return "HTTP/1.1 " + std::to_string(code) + " " + reason +
         "\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
}

// The value of header `name` (lower case) in a request head, trimmed; "" when absent.
std::string HeaderValue(const std::string& head, const std::string& name) {
  size_t pos = head.find("\r\n");
  while (pos != std::string::npos) {
    const size_t start = pos + 2;
    const size_t end = head.find("\r\n", start);
    const std::string line = head.substr(start, end == std::string::npos ? end : end - start);
    const size_t colon = line.find(':');
    if (colon == name.size()) {
      bool same = true;
      for (size_t i = 0; i < colon && same; ++i) {
        same = std::tolower(static_cast<unsigned char>(line[i])) == name[i];
      }
      if (same) {
        const size_t b = line.find_first_not_of(" \t", colon + 1);
        const size_t e = line.find_last_not_of(" \t");
        return b == std::string::npos ? "" : line.substr(b, e - b + 1);
      }
    }
    pos = end;
  }
  return "";
}

}  // namespace

// A connection reads one request head, writes one response, then lingers: it half-closes and
// discards whatever the client still sends until EOF, because closing a socket with unread data
// sends a reset that can destroy the response before the client reads it.
struct MetricsServer::Connection {
  enum class State { kReading, kWriting, kLingering };
  int fd = -1;
  State state = State::kReading;
  std::string in;
  std::string out;
  size_t out_offset = 0;
  Clock::time_point deadline;

  ~Connection() {
    if (fd >= 0) ::close(fd);
  }
};

std::string HttpResponseFor(const std::string& request_head, const Registry& registry,
                            bool* is_scrape, const Authorizer& authorize) {
  *is_scrape = false;
  const size_t line_end = request_head.find("\r\n");
  const std::string line = request_head.substr(0, line_end);
  // "METHOD SP target SP HTTP/x.y"
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string::npos || line.compare(sp2 + 1, 5, "HTTP/") != 0) {
    return PlainResponse(400, "Bad Request", "malformed request line\n");
  }
  const std::string method = line.substr(0, sp1);
  std::string target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  target = target.substr(0, target.find('?'));  // scrapers may add query parameters
  if (target != "/metrics") return PlainResponse(404, "Not Found", "try /metrics\n");
  if (method != "GET" && method != "HEAD") {
    std::string r = PlainResponse(405, "Method Not Allowed", "use GET\n");
    r.insert(r.find("\r\n") + 2, "Allow: GET, HEAD\r\n");
    return r;
  }
  if (authorize && !authorize(HeaderValue(request_head, "authorization"))) {
    std::string r = PlainResponse(401, "Unauthorized", "a bearer token is required\n");
    r.insert(r.find("\r\n") + 2, "WWW-Authenticate: Bearer realm=\"deja\"\r\n");
    return r;
  }
  const std::string body = registry.Serialize();
  *is_scrape = true;
  std::string head =
      "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8"
      "\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
  return method == "HEAD" ? head : head + body;
}

StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const Registry* registry,
                                                              const MetricsServerOptions& options) {
  CHECK(registry != nullptr);
  if (options.port < 0 || options.port > 65535) {
    return InvalidArgument("metrics port must be in [0, 65535], got " +
                           std::to_string(options.port));
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(options.port));
  if (::inet_pton(AF_INET, options.host.c_str(), &addr.sin_addr) != 1) {
    return InvalidArgument("metrics host must be an IPv4 address, got '" + options.host + "'");
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Unavailable(Errno("metrics socket"));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const std::string where = options.host + ":" + std::to_string(options.port);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    Status s = Unavailable(Errno("metrics server cannot bind " + where));
    ::close(fd);
    return s;
  }
  if (::listen(fd, 64) != 0) {
    Status s = Unavailable(Errno("metrics server cannot listen on " + where));
    ::close(fd);
    return s;
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int wake = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake < 0) {
    Status s = Unavailable(Errno("metrics eventfd"));
    ::close(fd);
    return s;
  }
  const int port = ntohs(addr.sin_port);
  LOG(INFO) << "metrics: serving http://" << options.host << ":" << port << "/metrics";
  return std::unique_ptr<MetricsServer>(new MetricsServer(registry, options, fd, wake, port));
}

MetricsServer::MetricsServer(const Registry* registry, const MetricsServerOptions& options,
                             int listen_fd, int wake_fd, int port)
    : registry_(registry),
      options_(options),
      listen_fd_(listen_fd),
      wake_fd_(wake_fd),
      port_(port),
      thread_([this] { Run(); }) {}

MetricsServer::~MetricsServer() {
  const uint64_t one = 1;
  if (::write(wake_fd_, &one, sizeof(one)) != sizeof(one)) {
    PLOG(ERROR) << "metrics: cannot wake the server thread";
  }
  thread_.join();
  connections_.clear();
  ::close(listen_fd_);
  ::close(wake_fd_);
  VLOG(1) << "metrics: stopped after " << scrapes() << " scrapes";
}

void MetricsServer::Run() {
  std::vector<pollfd> fds;
  while (true) {
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    for (const auto& c : connections_) {
      const bool writing = c->state == Connection::State::kWriting;
      fds.push_back({c->fd, static_cast<short>(writing ? POLLOUT : POLLIN), 0});
    }
    // Wake at least once a second to enforce idle deadlines.
    const int ready = ::poll(fds.data(), fds.size(), 1000);
    if (ready < 0 && errno != EINTR) {
      PLOG(ERROR) << "metrics: poll failed; server stops";
      return;
    }
    if (fds[0].revents != 0) return;
    const Clock::time_point now = Clock::now();
    std::vector<std::unique_ptr<Connection>> keep;
    keep.reserve(connections_.size());
    for (size_t i = 0; i < connections_.size(); ++i) {
      Connection* c = connections_[i].get();
      const short ev = ready > 0 ? fds[i + 2].revents : 0;
      bool alive = now < c->deadline;
      if (alive && ev != 0) {
        if (c->state == Connection::State::kWriting) {
          alive = (ev & (POLLERR | POLLHUP)) == 0 && OnWritable(c);
        } else {
          alive = OnReadable(c);
        }
      }
      if (alive) keep.push_back(std::move(connections_[i]));
    }
    connections_ = std::move(keep);
    if (ready > 0 && (fds[1].revents & POLLIN)) Accept();
  }
}

void MetricsServer::Accept() {
  while (true) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        PLOG(WARNING) << "metrics: accept failed";
      }
      return;
    }
    if (static_cast<int>(connections_.size()) >= options_.max_connections) {
      ::close(fd);
      continue;
    }
    auto conn = std::make_unique<Connection>();
    conn->fd = fd;
    conn->deadline = Clock::now() + std::chrono::milliseconds(options_.idle_timeout_ms);
    connections_.push_back(std::move(conn));
  }
}

bool MetricsServer::OnReadable(Connection* conn) {
  char buf[4096];
  while (true) {
    const ssize_t n = ::recv(conn->fd, buf, sizeof(buf), 0);
    if (n == 0) return false;  // closed before a full request
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK;
    }
    if (conn->state == Connection::State::kLingering) continue;  // discard
    conn->in.append(buf, static_cast<size_t>(n));
    const size_t end = conn->in.find("\r\n\r\n");
    if (end != std::string::npos && end + 4 <= options_.max_request_bytes) {
      conn->in.resize(end);
      Respond(conn);
      return OnWritable(conn);
    }
    if (conn->in.size() > options_.max_request_bytes) {
      conn->out = PlainResponse(431, "Request Header Fields Too Large", "request too large\n");
      conn->state = Connection::State::kWriting;
      return OnWritable(conn);
    }
  }
}

void MetricsServer::Respond(Connection* conn) {
  bool is_scrape = false;
  conn->out = HttpResponseFor(conn->in, *registry_, &is_scrape, options_.authorize);
  if (is_scrape) scrapes_.fetch_add(1, std::memory_order_relaxed);
  conn->state = Connection::State::kWriting;
  conn->deadline = Clock::now() + std::chrono::milliseconds(options_.idle_timeout_ms);
}

bool MetricsServer::OnWritable(Connection* conn) {
  while (conn->out_offset < conn->out.size()) {
    const ssize_t n = ::send(conn->fd, conn->out.data() + conn->out_offset,
                             conn->out.size() - conn->out_offset, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK;
    }
    conn->out_offset += static_cast<size_t>(n);
  }
  // Done: half-close so the client sees the end of the response, then linger (see Connection).
  ::shutdown(conn->fd, SHUT_WR);
  conn->state = Connection::State::kLingering;
  conn->in.clear();
  conn->out.clear();
  conn->deadline = Clock::now() + std::chrono::milliseconds(kLingerMs);
  return true;
}

}  // namespace deja::metrics
