#include "coordinator/security.h"

#include <glog/logging.h>
#include <grpcpp/security/server_credentials.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/sha.h>
#include <openssl/x509.h>

#include <array>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace deja::coordinator {
namespace {

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using BioPtr = std::unique_ptr<BIO, BioDeleter>;
using X509Ptr = std::unique_ptr<X509, X509Deleter>;
using KeyPtr = std::unique_ptr<EVP_PKEY, KeyDeleter>;

// The reason of OpenSSL's oldest queued error (and the queue cleared), or `fallback`.
std::string OpenSslError(const std::string& fallback) {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return fallback;
  const char* reason = ERR_reason_error_string(e);
  return reason != nullptr ? reason : fallback;
}

// A file named by `flag`, whole.
StatusOr<std::string> ReadFlagFile(const std::string& path, const std::string& flag) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return InvalidArgument(flag + ": " + path + " is not a readable file");
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (!in) return InvalidArgument(flag + ": cannot read " + path);
  return ss.str();
}

BioPtr MemoryBio(const std::string& data) {
  return BioPtr(BIO_new_mem_buf(data.data(), static_cast<int>(data.size())));
}

// Every certificate of a PEM file; at least one.
StatusOr<std::vector<X509Ptr>> ParseCertificates(const std::string& pem, const std::string& path,
                                                 const std::string& flag) {
  BioPtr bio = MemoryBio(pem);
  std::vector<X509Ptr> certs;
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) certs.emplace_back(x);
  ERR_clear_error();  // the read past the last certificate queues "no start line"
  if (certs.empty()) {
    return InvalidArgument(flag + ": " + path + " holds no PEM certificate");
  }
  return certs;
}

// Encrypted keys are refused rather than prompting for a passphrase on the terminal.
int NoPassphrase(char*, int, int, void*) { return -1; }

StatusOr<KeyPtr> ParseKey(const std::string& pem, const std::string& path,
                          const std::string& flag) {
  BioPtr bio = MemoryBio(pem);
  KeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr));
  if (!key) {
    return InvalidArgument(flag + ": " + path + " holds no unencrypted PEM private key (" +
                           OpenSslError("no key") + ")");
  }
  return key;
}

using Digest = std::array<unsigned char, SHA256_DIGEST_LENGTH>;
static_assert(SHA256_DIGEST_LENGTH == 32, "security.h keeps 32-byte digests");

Digest Sha256(std::string_view s) {
  Digest d;
  SHA256(reinterpret_cast<const unsigned char*>(s.data()), s.size(), d.data());
  return d;
}

bool IsTokenChar(char c) { return c > 0x20 && c < 0x7f; }

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

}  // namespace

BearerAuth::BearerAuth(const std::vector<std::string>& tokens) {
  digests_.reserve(tokens.size());
  for (const std::string& t : tokens) digests_.push_back(Sha256(t));
}

bool BearerAuth::Allows(std::string_view authorization) const {
  constexpr std::string_view kScheme = "bearer ";
  if (authorization.size() <= kScheme.size()) return false;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(authorization[i])) != kScheme[i]) return false;
  }
  // Comparing digests makes the time independent of the tokens' lengths and contents; every
  // token is compared, so neither does it tell which one matched.
  const Digest presented = Sha256(Trim(authorization.substr(kScheme.size())));
  bool ok = false;
  for (const Digest& d : digests_) {
    ok |= CRYPTO_memcmp(presented.data(), d.data(), d.size()) == 0;
  }
  return ok;
}

Status BearerAuth::Check(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const {
  const auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return Unauthenticated(
        "this server needs a bearer token: send 'authorization: Bearer <token>'");
  }
  if (!Allows(std::string_view(it->second.data(), it->second.size()))) {
    return Unauthenticated("the bearer token in 'authorization' is not accepted");
  }
  return Status::Ok();
}

StatusOr<std::vector<std::string>> ReadTokenFile(const std::string& path, const std::string& flag) {
  DEJA_ASSIGN_OR_RETURN(const std::string text, ReadFlagFile(path, flag));
  std::vector<std::string> tokens;
  std::istringstream in(text);
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    const std::string_view t = Trim(line);
    if (t.empty() || t.front() == '#') continue;
    for (char c : t) {
      if (!IsTokenChar(c)) {
        return InvalidArgument(flag + ": line " + std::to_string(line_no) + " of " + path +
                               " holds whitespace or a non-printable character inside its token");
      }
    }
    tokens.emplace_back(t);
  }
  if (tokens.empty()) return InvalidArgument(flag + ": " + path + " holds no token");
  return tokens;
}

StatusOr<std::string> ReadPemCertificates(const std::string& path, const std::string& flag) {
  DEJA_ASSIGN_OR_RETURN(std::string pem, ReadFlagFile(path, flag));
  DEJA_RETURN_IF_ERROR(ParseCertificates(pem, path, flag).status());
  return pem;
}

StatusOr<PemKeyPair> ReadPemKeyPair(const std::string& cert_path, const std::string& key_path,
                                    const std::string& cert_flag, const std::string& key_flag) {
  PemKeyPair pair;
  DEJA_ASSIGN_OR_RETURN(pair.cert_chain, ReadFlagFile(cert_path, cert_flag));
  DEJA_ASSIGN_OR_RETURN(pair.private_key, ReadFlagFile(key_path, key_flag));
  DEJA_ASSIGN_OR_RETURN(std::vector<X509Ptr> chain,
                        ParseCertificates(pair.cert_chain, cert_path, cert_flag));
  DEJA_ASSIGN_OR_RETURN(KeyPtr key, ParseKey(pair.private_key, key_path, key_flag));
  if (X509_check_private_key(chain.front().get(), key.get()) != 1) {
    ERR_clear_error();
    return InvalidArgument(key_flag + ": " + key_path + " is not the key of the certificate in " +
                           cert_flag + " " + cert_path);
  }
  if (X509_cmp_current_time(X509_get0_notAfter(chain.front().get())) < 0) {
    LOG(WARNING) << cert_flag << ": " << cert_path << " has expired; peers will refuse it";
  }
  return pair;
}

StatusOr<ServerSecurity> LoadServerSecurity(const SecurityOptions& o) {
  ServerSecurity s;
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return InvalidArgument("--tls-cert and --tls-key go together");
  }
  if (!o.tls_client_ca.empty() && o.tls_cert.empty()) {
    return InvalidArgument("--tls-client-ca needs --tls-cert and --tls-key");
  }
  if (o.metrics_auth && o.auth_token_file.empty()) {
    return InvalidArgument("--metrics-auth needs --auth-token-file");
  }
  s.credentials = grpc::InsecureServerCredentials();
  if (!o.tls_cert.empty()) {
    DEJA_ASSIGN_OR_RETURN(PemKeyPair pair,
                          ReadPemKeyPair(o.tls_cert, o.tls_key, "--tls-cert", "--tls-key"));
    grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    ssl.pem_key_cert_pairs.push_back({pair.private_key, pair.cert_chain});
    if (!o.tls_client_ca.empty()) {
      DEJA_ASSIGN_OR_RETURN(ssl.pem_root_certs,
                            ReadPemCertificates(o.tls_client_ca, "--tls-client-ca"));
      ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
      s.client_ca = ssl.pem_root_certs;
    }
    s.pem = pair;
    s.credentials = grpc::SslServerCredentials(ssl);
    s.tls = true;
  }
  if (!o.auth_token_file.empty()) {
    DEJA_ASSIGN_OR_RETURN(std::vector<std::string> tokens,
                          ReadTokenFile(o.auth_token_file, "--auth-token-file"));
    s.auth = std::make_unique<BearerAuth>(tokens);
    s.metrics_auth = o.metrics_auth;
  }
  LOG(INFO) << "api security: "
            << (!s.tls                    ? "plaintext"
                : o.tls_client_ca.empty() ? "TLS"
                                          : "TLS with client certificates required")
            << ", "
            << (s.auth ? "bearer token required" +
                             std::string(s.metrics_auth ? " (also /metrics)" : "")
                       : std::string("no token required"));
  return s;
}

}  // namespace deja::coordinator
