#include "cli/log_setup.h"

#include <glog/logging.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <ostream>
#include <string>

namespace deja::cli {
namespace {

// The process's part, shown in every line's prefix ("" for one-shot commands).
std::string& Role() {
  static std::string role;
  return role;
}

// glog's own prefix (severity, date, time, thread, file:line) with the role before the `]`.
void Prefix(std::ostream& s, const google::LogMessageInfo& l, void*) {
  const auto& t = l.time;
  s << l.severity[0] << std::setw(4) << 1900 + t.year() << std::setw(2) << std::setfill('0')
    << 1 + t.month() << std::setw(2) << t.day() << ' ' << std::setw(2) << t.hour() << ':'
    << std::setw(2) << t.min() << ':' << std::setw(2) << t.sec() << '.' << std::setw(6) << t.usec()
    << ' ' << std::setfill(' ') << std::setw(5) << l.thread_id << std::setfill('0') << ' '
    << l.filename << ':' << l.line_number;
  if (!Role().empty()) s << ' ' << Role();
  s << ']';
}

[[noreturn]] void Bad(const std::string& message) {
  std::fprintf(stderr, "deja: %s\n", message.c_str());
  std::exit(2);
}

int VerboseLevel(const std::string& v, const char* flag) {
  if (v.empty() || v.size() > 2 || v.find_first_not_of("0123456789") != std::string::npos) {
    Bad(std::string(flag) + " must be a verbosity level 0..99, not '" + v + "'");
  }
  return std::atoi(v.c_str());
}

// The value of `--name V` or `--name=V` in argv[first..argc), or "".
std::string FlagValue(int argc, char** argv, int first, const char* name) {
  const std::string eq = std::string(name) + "=";
  for (int i = first; i < argc; ++i) {
    if (name == std::string(argv[i]) && i + 1 < argc) return argv[i + 1];
    if (std::strncmp(argv[i], eq.c_str(), eq.size()) == 0) return argv[i] + eq.size();
  }
  return "";
}

}  // namespace

int SetUpLogging(int argc, char** argv) {
  std::string log_dir = std::getenv("DEJA_LOG_DIR") ? std::getenv("DEJA_LOG_DIR") : "";
  int vlog = std::getenv("DEJA_VLOG") ? VerboseLevel(std::getenv("DEJA_VLOG"), "DEJA_VLOG") : 0;
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> std::string {
      const std::string eq = std::string(flag) + "=";
      if (a.rfind(eq, 0) == 0) return a.substr(eq.size());
      if (i + 1 >= argc) Bad(std::string(flag) + " needs a value");
      return argv[++i];
    };
    if (a == "--log-dir" || a.rfind("--log-dir=", 0) == 0) {
      log_dir = value("--log-dir");
      if (log_dir.empty()) Bad("--log-dir needs a directory");
    } else if (a == "-v" || a.rfind("-v=", 0) == 0) {
      vlog = VerboseLevel(value("-v"), "-v");
    } else if (a == "--v" || a.rfind("--v=", 0) == 0) {
      vlog = VerboseLevel(value("--v"), "--v");
    } else {
      argv[out++] = argv[i];
    }
  }
  argv[out] = nullptr;
  argc = out;

  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "worker") {
    Role() =
        "rank " + FlagValue(argc, argv, 2, "--rank") + "/" + FlagValue(argc, argv, 2, "--world");
  } else if (cmd == "serve" || cmd == "coordinator") {
    Role() = "coordinator";
  }
  FLAGS_v = vlog;
  if (!log_dir.empty()) {
    FLAGS_log_dir = log_dir;
    FLAGS_logtostderr = false;
    FLAGS_alsologtostderr = true;
    ::setenv("DEJA_LOG_DIR", log_dir.c_str(), 1);
  } else {
    FLAGS_logtostderr = true;
  }
  if (vlog > 0) ::setenv("DEJA_VLOG", std::to_string(vlog).c_str(), 1);
  if (const char* v = std::getenv("DEJA_LOG_LEVEL")) FLAGS_minloglevel = std::atoi(v);
  google::InitGoogleLogging(argv[0], &Prefix, nullptr);
  const char* slash = std::strrchr(argv[0], '/');
  ProgramNameStorage() = slash != nullptr ? slash + 1 : argv[0];
  return argc;
}

std::string& ProgramNameStorage() {
  static std::string name = "deja";
  return name;
}

const char* ProgramName() { return ProgramNameStorage().c_str(); }

int Fail(const char* command, const Status& status) {
  std::fprintf(stderr, "%s %s: %s\n", ProgramName(), command, status.ToString().c_str());
  return status.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace deja::cli
