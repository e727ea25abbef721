// Shared by the libFuzzer targets: the invariant check (prints the broken invariant, then traps so
// libFuzzer saves the input), quiet logging, the source tree's location, a scratch directory and
// opt-mini's tokenizer.
#pragma once

#include <glog/logging.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"
#include "common/tokenizer.h"

#ifndef DEJA_SOURCE_DIR
#define DEJA_SOURCE_DIR "."
#endif

namespace deja::fuzz {

[[noreturn]] inline void Fail(const char* condition, const char* file, int line,
                              const std::string& detail) {
  std::fprintf(stderr, "fuzz invariant violated at %s:%d: %s%s%s\n", file, line, condition,
               detail.empty() ? "" : ": ", detail.c_str());
  std::fflush(stderr);
  __builtin_trap();
}

// Logging stays at ERROR and above: the code under test logs refusals at INFO and WARNING, which
// would flood the fuzzer's output and slow every execution.
inline void QuietLogging() {
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = google::GLOG_ERROR;
}

// The source tree: $DEJA_SOURCE_DIR, else the one the target was built from.
inline std::string SourceDir() {
  const char* env = std::getenv("DEJA_SOURCE_DIR");
  return env != nullptr && *env != '\0' ? env : DEJA_SOURCE_DIR;
}

// A fresh directory under $TMPDIR for this process, removed when the process exits normally.
inline const std::string& ScratchDir() {
  // Never destroyed, so the exit handler can still read it.
  static const std::string* const dir = [] {
    const char* base = std::getenv("TMPDIR");
    std::string templ =
        std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/deja_fuzz_XXXXXX";
    if (::mkdtemp(templ.data()) == nullptr) Fail("mkdtemp", __FILE__, __LINE__, templ);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(ScratchDir(), ec);
    });
    return new std::string(templ);
  }();
  return *dir;
}

inline void WriteFile(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) Fail("write", __FILE__, __LINE__, path);
}

// opt-mini's tokenizer, loaded once.
inline const Tokenizer& Tok() {
  static const std::unique_ptr<Tokenizer> tok = [] {
    StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Load(SourceDir() + "/models/opt-mini");
    if (!t.ok()) Fail("Tokenizer::Load", __FILE__, __LINE__, t.status().ToString());
    return std::move(*t);
  }();
  return *tok;
}

}  // namespace deja::fuzz

#define FUZZ_CHECK(cond)                                            \
  do {                                                              \
    if (!(cond)) ::deja::fuzz::Fail(#cond, __FILE__, __LINE__, ""); \
  } while (0)

// `detail` is evaluated only when the check fails.
#define FUZZ_CHECK_MSG(cond, detail)                                      \
  do {                                                                    \
    if (!(cond)) ::deja::fuzz::Fail(#cond, __FILE__, __LINE__, (detail)); \
  } while (0)
