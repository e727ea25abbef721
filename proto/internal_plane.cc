#include "proto/internal_plane.h"

#include <glog/logging.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <sys/random.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <tuple>

namespace deja::proto {
namespace {

constexpr size_t kSecretRandomBytes = 32;
constexpr std::chrono::seconds kRefusalLogPeriod(1);

std::string Trimmed(std::string s) {
  while (!s.empty() &&
         (s.back() == '\n' || s.back() == '\r' || s.back() == ' ' || s.back() == '\t')) {
    s.pop_back();
  }
  return s;
}

Status Validate(const std::string& secret, const std::string& origin) {
  if (secret.empty()) return InvalidArgument("the group secret in " + origin + " is empty");
  if (secret.size() < kMinGroupSecretBytes) {
    return InvalidArgument("the group secret in " + origin + " has " +
                           std::to_string(secret.size()) + " bytes; at least " +
                           std::to_string(kMinGroupSecretBytes) + " are needed");
  }
  return Status::Ok();
}

int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// One line a second across every check of the process.
std::atomic<int64_t> g_last_refusal_log_ns{0};

}  // namespace

StatusOr<std::string> GenerateGroupSecret() {
  unsigned char bytes[kSecretRandomBytes];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = ::getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Internal(std::string("getrandom failed: ") + std::strerror(errno));
    }
    got += static_cast<size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * sizeof(bytes));
  for (unsigned char b : bytes) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

StatusOr<std::string> LoadGroupSecret(const std::string& file) {
  if (file.empty()) {
    const char* env = std::getenv(kGroupSecretEnv);
    if (env == nullptr) return std::string();
    std::string secret = Trimmed(env);
    DEJA_RETURN_IF_ERROR(Validate(secret, std::string("$") + kGroupSecretEnv));
    return secret;
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) return InvalidArgument("cannot read the group secret file " + file);
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string secret = Trimmed(ss.str());
  DEJA_RETURN_IF_ERROR(Validate(secret, file));
  return secret;
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  // Every byte of the longer string is visited whatever the contents, and the difference is
  // accumulated without an early exit; `volatile` keeps the compiler from adding one.
  const size_t n = a.size() > b.size() ? a.size() : b.size();
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

void AttachGroupSecret(grpc::ClientContext* ctx, const std::string& secret) {
  if (!secret.empty()) ctx->AddMetadata(kGroupSecretMetadata, secret);
}

GroupSecretCheck::GroupSecretCheck(std::string secret, std::string server)
    : secret_(std::move(secret)), server_(std::move(server)) {}

grpc::Status GroupSecretCheck::Check(const grpc::ServerContext& ctx,
                                     std::string_view method) const {
  if (secret_.empty()) return grpc::Status::OK;
  const auto& md = ctx.client_metadata();
  const auto it = md.find(kGroupSecretMetadata);
  const char* why = nullptr;
  if (it == md.end()) {
    why = "no group secret";
  } else if (!ConstantTimeEquals(std::string_view(it->second.data(), it->second.size()), secret_)) {
    why = "wrong group secret";
  } else {
    return grpc::Status::OK;
  }
  const uint64_t refused = refused_.fetch_add(1) + 1;
  const int64_t now = SteadyNowNs();
  int64_t last = g_last_refusal_log_ns.load();
  const int64_t period = std::chrono::nanoseconds(kRefusalLogPeriod).count();
  if ((last == 0 || now - last >= period) &&
      g_last_refusal_log_ns.compare_exchange_strong(last, now)) {
    LOG(WARNING) << server_ << ": refused " << method << " from " << ctx.peer() << ": " << why
                 << " (" << refused << " refused so far; at most one such line a second)";
  }
  return {grpc::StatusCode::UNAUTHENTICATED,
          std::string(why) + " (gRPC metadata " + kGroupSecretMetadata + ")"};
}

StatusOr<InternalCredentials> InternalCredentials::Load(const InternalTlsFiles& files) {
  InternalCredentials c;
  if (!files.any()) {
    if (!files.server_name.empty()) {
      return InvalidArgument(
          "--internal-tls-server-name needs --internal-tls-cert, "
          "--internal-tls-key and --internal-tls-ca");
    }
    return c;
  }
  if (files.cert_file.empty() || files.key_file.empty() || files.ca_file.empty()) {
    return InvalidArgument(
        "--internal-tls-cert, --internal-tls-key and --internal-tls-ca go together");
  }
  for (const auto& [flag, path, out] :
       {std::tuple{"--internal-tls-cert", &files.cert_file, &c.cert_},
        std::tuple{"--internal-tls-key", &files.key_file, &c.key_},
        std::tuple{"--internal-tls-ca", &files.ca_file, &c.ca_}}) {
    std::ifstream in(*path, std::ios::binary);
    std::ostringstream ss;
    if (in) ss << in.rdbuf();
    if (!in || ss.str().find("-----BEGIN ") == std::string::npos) {
      return InvalidArgument(std::string(flag) + ": cannot read a PEM file at " + *path);
    }
    *out = ss.str();
  }
  c.server_name_ = files.server_name;
  return c;
}

std::shared_ptr<grpc::ServerCredentials> InternalCredentials::Server() const {
  if (!tls()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions o(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  o.pem_root_certs = ca_;
  o.pem_key_cert_pairs.push_back({key_, cert_});
  return grpc::SslServerCredentials(o);
}

std::shared_ptr<grpc::Channel> InternalCredentials::Channel(const std::string& target,
                                                            grpc::ChannelArguments args) const {
  if (!tls()) return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = ca_;
  o.pem_private_key = key_;
  o.pem_cert_chain = cert_;
  if (!server_name_.empty()) args.SetSslTargetNameOverride(server_name_);
  return grpc::CreateCustomChannel(target, grpc::SslCredentials(o), args);
}

}  // namespace deja::proto
