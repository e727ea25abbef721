// A throwaway PKI made with the `openssl` CLI in a directory, for the TLS tests: two CAs, `ca`
// and `other`; `ca` signs the server certificate `server` (for the name "localhost" only) and
// the client certificate `client`; `other` signs `stranger`, a client certificate servers must
// refuse. Each NAME has NAME.pem and NAME.key.
#pragma once

#include <fstream>
#include <iterator>
#include <string>

#include "tests/common/run_shell.h"

namespace deja::test_util {

// Writes the PKI into `dir`, then runs `more_script` (sh) there; "" on success, else the error.
inline std::string MakeTestPki(const std::string& dir, const std::string& more_script = "") {
  const std::string script =
      "set -e\ncd '" + dir +
      "'\n"
      "ca() { openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
      "-keyout $1.key -out $1.pem -days 2 -subj /CN=$1; }\n"
      "leaf() { openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
      "-keyout $1.key -out $1.csr -subj /CN=$1; echo subjectAltName=$3 > $1.ext; "
      "openssl x509 -req -in $1.csr -CA $2.pem -CAkey $2.key -CAcreateserial -out $1.pem "
      "-days 2 -extfile $1.ext; }\n"
      "ca ca; ca other\n"
      "leaf server ca DNS:localhost; leaf client ca DNS:client; leaf stranger other "
      "DNS:stranger\n" +
      more_script;
  std::ofstream(dir + "/make.sh") << script;
  std::string out;
  return RunShell("sh " + dir + "/make.sh", &out) == 0 ? "" : "openssl failed: " + out;
}

inline std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace deja::test_util
