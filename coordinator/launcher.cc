#include "coordinator/launcher.h"

#include <glog/logging.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <string_view>

#include "common/exit_codes.h"
#include "proto/internal_plane.h"

namespace deja::coordinator {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kPoll(50);
// A group that ran this long before failing restarts after the minimum backoff again.
constexpr std::chrono::seconds kStableRun(60);

std::string DescribeExit(int rank, pid_t pid, int status) {
  std::string what = WIFEXITED(status) ? "exited with code " + std::to_string(WEXITSTATUS(status))
                     : WIFSIGNALED(status)
                         ? "was killed by signal " + std::to_string(WTERMSIG(status))
                         : "stopped";
  return "worker rank " + std::to_string(rank) + " (pid " + std::to_string(pid) + ") " + what;
}

}  // namespace

Launcher::Launcher(const LauncherOptions& options, WorkerGroup* group)
    : options_(options), group_(group), pids_(options.world_size, 0) {
  group_->SetLostCallback([this](const std::string& reason) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      lost_ = true;
      lost_reason_ = reason;
    }
    cv_.notify_all();
  });
}

Launcher::~Launcher() {
  Stop();
  group_->SetLostCallback(nullptr);
}

Status Launcher::Start() {
  std::string binary = options_.binary;
  char resolved[PATH_MAX] = {};
  const ssize_t n = ::readlink(binary.c_str(), resolved, sizeof(resolved) - 1);
  if (n > 0) binary.assign(resolved, static_cast<size_t>(n));
  if (::access(binary.c_str(), X_OK) != 0) {
    return FailedPrecondition("cannot execute the worker binary " + binary);
  }
  int threads = options_.threads_per_worker;
  if (threads <= 0) {
    threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) /
                              std::max(1, options_.world_size));
  }
  worker_args_ = {binary,          "worker",
                  "--model",       options_.model_dir,
                  "--world",       std::to_string(options_.world_size),
                  "--coordinator", options_.coordinator,
                  "--listen",      options_.worker_host + ":0",
                  "--threads",     std::to_string(threads)};
  if (options_.kv_memory_mb > 0) {
    worker_args_.push_back("--kv-memory-mb");
    worker_args_.push_back(std::to_string(options_.kv_memory_mb));
  }
  for (const auto& [flag, value] : {std::pair{"--predictors", &options_.predictors},
                                    std::pair{"--sparsity-oracle", &options_.sparsity_oracle},
                                    std::pair{"--sparsity-default", &options_.sparsity_default}}) {
    if (value->empty()) continue;
    worker_args_.push_back(flag);
    worker_args_.push_back(*value);
  }
  for (const std::string& a : options_.extra_worker_args) worker_args_.push_back(a);
  const std::string secret_prefix = std::string(proto::kGroupSecretEnv) + "=";
  worker_env_.clear();
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    if (std::string_view(*e).substr(0, secret_prefix.size()) != secret_prefix) {
      worker_env_.emplace_back(*e);
    }
  }
  if (!options_.group_secret.empty()) worker_env_.push_back(secret_prefix + options_.group_secret);
  supervisor_ = std::thread([this] { Supervise(); });
  return Status::Ok();
}

pid_t Launcher::Spawn(int rank) const {
  std::vector<std::string> args = worker_args_;
  args.push_back("--rank");
  args.push_back(std::to_string(rank));
  if (rank < static_cast<int>(options_.rank_devices.size())) {
    args.push_back("--device");
    args.push_back(options_.rank_devices[rank]);
  }
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env = worker_env_;
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    // Only async-signal-safe calls until exec. The parent blocks SIGTERM/SIGINT for its signal
    // thread; the worker must receive them. It dies with the supervisor thread that forked it.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  return pid;
}

Status Launcher::SpawnGroup() {
  std::vector<pid_t> started;
  for (int r = 0; r < options_.world_size; ++r) {
    const pid_t pid = Spawn(r);
    if (pid < 0) {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = 0; i < started.size(); ++i) pids_[i] = started[i];
      return Unavailable("fork failed for worker rank " + std::to_string(r));
    }
    started.push_back(pid);
  }
  std::lock_guard<std::mutex> lock(mu_);
  pids_ = started;
  ++groups_started_;
  std::string list;
  for (pid_t p : started) list.append(" ").append(std::to_string(p));
  LOG(INFO) << "launcher: worker group " << groups_started_ << " started, pids" << list;
  return Status::Ok();
}

std::string Launcher::ReapExited() {
  std::lock_guard<std::mutex> lock(mu_);
  std::string first;
  for (int r = 0; r < static_cast<int>(pids_.size()); ++r) {
    if (pids_[r] <= 0) continue;
    int status = 0;
    if (::waitpid(pids_[r], &status, WNOHANG) == pids_[r]) {
      const std::string what = DescribeExit(r, pids_[r], status);
      if (stop_) {
        LOG(INFO) << "launcher: " << what;
      } else {
        LOG(WARNING) << "launcher: " << what;
      }
      if (first.empty()) first = what;
      if (WIFEXITED(status) && WEXITSTATUS(status) == kExitCannotLoad && fatal_.empty()) {
        fatal_ = what + ": it cannot load the model (its error is logged above)";
      }
      pids_[r] = 0;
    }
  }
  return first;
}

void Launcher::KillGroup() {
  std::vector<pid_t> pids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pids.swap(pids_);
    pids_.assign(options_.world_size, 0);
  }
  for (pid_t p : pids) {
    if (p > 0) ::kill(p, SIGKILL);
  }
  for (pid_t p : pids) {
    if (p > 0) ::waitpid(p, nullptr, 0);
  }
}

void Launcher::Supervise() {
  std::chrono::milliseconds backoff = options_.restart_backoff_min;
  Clock::time_point started = Clock::now();
  if (Status s = SpawnGroup(); !s.ok()) LOG(ERROR) << "launcher: " << s.ToString();
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, kPoll, [&] { return stop_ || lost_; });
    if (stop_) break;
    lock.unlock();
    std::string reason = ReapExited();
    lock.lock();
    if (reason.empty() && lost_) reason = lost_reason_;
    bool any_running = false;
    for (pid_t p : pids_) any_running |= p > 0;
    if (reason.empty() && !any_running) reason = "no worker is running";
    if (reason.empty()) continue;
    lock.unlock();
    LOG(WARNING) << "launcher: taking the worker group down: " << reason;
    KillGroup();
    lock.lock();
    const std::string fatal = fatal_;
    lock.unlock();
    if (!fatal.empty()) {
      // Its files would fail every new group the same way.
      LOG(ERROR) << "launcher: not restarting: " << fatal;
      group_->DeclareLost("the worker group stopped: " + fatal);
      lock.lock();
      break;
    }
    group_->DeclareLost("worker group restarted: " + reason);
    if (Clock::now() - started > kStableRun) backoff = options_.restart_backoff_min;
    lock.lock();
    lost_ = false;  // losses reported for the group just killed are handled
    if (cv_.wait_for(lock, backoff, [&] { return stop_; })) break;
    backoff = std::min(backoff * 2, options_.restart_backoff_max);
    lock.unlock();
    if (Status s = SpawnGroup(); !s.ok()) LOG(ERROR) << "launcher: " << s.ToString();
    started = Clock::now();
    lock.lock();
  }
  lock.unlock();
  // The workers die with the thread that forked them (PR_SET_PDEATHSIG), so this thread ends
  // them itself, gently first, before it returns.
  Shutdown();
}

bool Launcher::WaitForExit(std::chrono::milliseconds timeout) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stop_) {
      stop_ = true;
      await_exit_ = timeout;
    }
  }
  cv_.notify_all();
  if (supervisor_.joinable()) supervisor_.join();
  std::lock_guard<std::mutex> lock(mu_);
  return exited_on_their_own_;
}

void Launcher::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (supervisor_.joinable()) supervisor_.join();
}

bool Launcher::AllExited() {
  ReapExited();
  std::lock_guard<std::mutex> lock(mu_);
  for (pid_t p : pids_) {
    if (p > 0) return false;
  }
  return true;
}

void Launcher::Shutdown() {
  std::chrono::milliseconds await;
  {
    std::lock_guard<std::mutex> lock(mu_);
    await = await_exit_;
  }
  Clock::time_point deadline = Clock::now() + await;
  while (!AllExited() && Clock::now() < deadline) std::this_thread::sleep_for(kPoll);
  if (AllExited()) {
    std::lock_guard<std::mutex> lock(mu_);
    exited_on_their_own_ = true;
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (pid_t p : pids_) {
      if (p > 0) ::kill(p, SIGTERM);
    }
  }
  deadline = Clock::now() + options_.stop_grace;
  while (!AllExited() && Clock::now() < deadline) std::this_thread::sleep_for(kPoll);
  if (!AllExited()) {
    LOG(WARNING) << "launcher: workers still running after SIGTERM; killing them";
    KillGroup();
  }
}

std::string Launcher::fatal() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fatal_;
}

uint64_t Launcher::groups_started() const {
  std::lock_guard<std::mutex> lock(mu_);
  return groups_started_;
}

std::vector<pid_t> Launcher::worker_pids() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pids_;
}

}  // namespace deja::coordinator
