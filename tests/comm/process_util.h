// ChildProcess: a fork/exec'd helper whose output goes to a log file, reaped (and killed if
// still running) on destruction, so a failing test never leaves processes behind.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace deja::test_util {

class ChildProcess {
 public:
  // Starts `args[0]` with `args`; stdout and stderr go to `log_path`. pid() < 0 on failure.
  ChildProcess(const std::vector<std::string>& args, const std::string& log_path)
      : log_path_(log_path) {
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      // Only async-signal-safe calls between fork and exec.
      int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
  }
  ~ChildProcess() {
    if (pid_ > 0 && !exit_status_) {
      ::kill(pid_, SIGKILL);
      int st = 0;
      ::waitpid(pid_, &st, 0);
    }
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }

  void Kill(int sig) {
    if (pid_ > 0 && !exit_status_) ::kill(pid_, sig);
  }

  // The raw wait status once the child has ended, or nullopt if it is still running at the
  // deadline.
  std::optional<int> Wait(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (pid_ > 0 && !exit_status_) {
      int st = 0;
      pid_t got = ::waitpid(pid_, &st, WNOHANG);
      if (got == pid_) {
        exit_status_ = st;
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return exit_status_;
  }

  // The exit code, or -1 if the child was killed or is still running.
  int ExitCode(std::chrono::milliseconds timeout) {
    std::optional<int> st = Wait(timeout);
    if (!st || !WIFEXITED(*st)) return -1;
    return WEXITSTATUS(*st);
  }

  // The child's output so far, and its command line and state if it is still running.
  std::string Log() const {
    std::ifstream in(log_path_);
    std::stringstream ss;
    ss << in.rdbuf();
    if (pid_ > 0 && !exit_status_) {
      const std::string proc = "/proc/" + std::to_string(pid_);
      std::ifstream cmd(proc + "/cmdline"), wchan(proc + "/wchan");
      std::string c((std::istreambuf_iterator<char>(cmd)), std::istreambuf_iterator<char>());
      for (char& ch : c) ch = ch == '\0' ? ' ' : ch;
      std::string w((std::istreambuf_iterator<char>(wchan)), std::istreambuf_iterator<char>());
      ss << "[still running: pid " << pid_ << " cmdline '" << c << "' wchan '" << w << "']";
    }
    return ss.str();
  }

 private:
  pid_t pid_ = -1;
  std::string log_path_;
  std::optional<int> exit_status_;
};

}  // namespace deja::test_util
