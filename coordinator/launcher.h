// Launcher: runs N `deja worker` processes (fork/exec of this binary) next to an in-process
// coordinator and keeps the group alive. A worker that exits, or a group the coordinator
// declares lost (hang, step timeout), takes the whole group down: every worker is killed, the
// rendezvous starts a new epoch, and a new group is started after a backoff (NCCL, and Gloo
// after a failed collective, cannot re-admit one rank into a live group).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "coordinator/worker_group.h"

namespace deja::coordinator {

struct LauncherOptions {
  // The deja binary; children run `<binary> worker ...`.
  std::string binary = "/proc/self/exe";
  std::string model_dir;
  int world_size = 1;
  // host:port of the coordinator's Rendezvous (its internal listener).
  std::string coordinator;
  // Handed to every worker in its environment (proto::kGroupSecretEnv), never on its command
  // line, which any user of the host can read.
  std::string group_secret;
  // Host the workers listen on (each picks a free port).
  std::string worker_host = "127.0.0.1";
  // CPU threads per worker; 0 splits this machine's cores evenly.
  int threads_per_worker = 0;
  // KV budget per worker in MiB; 0 keeps the worker's default.
  int64_t kv_memory_mb = 0;
  // Deja Vu, passed on as the workers' flags of the same names when set: --predictors FILE,
  // --sparsity-oracle FRACTION, --sparsity-default on|off.
  std::string predictors;
  std::string sparsity_oracle;
  std::string sparsity_default;
  std::vector<std::string> extra_worker_args;
  // `--device` of each rank (cuda:0, cuda:1, ...) when the ranks differ; empty: none is added.
  std::vector<std::string> rank_devices;
  // Restart backoff: starts at the minimum, doubles while groups keep failing soon after they
  // start, and returns to the minimum once a group has run for a minute.
  std::chrono::milliseconds restart_backoff_min{200};
  std::chrono::milliseconds restart_backoff_max{10000};
  // Stop(): SIGTERM first, SIGKILL after this.
  std::chrono::milliseconds stop_grace{5000};
};

class Launcher {
 public:
  // `group` outlives the launcher; the launcher installs its lost callback.
  Launcher(const LauncherOptions& options, WorkerGroup* group);
  // Stop()s.
  ~Launcher();
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;

  // Starts the supervisor, which starts the first group.
  Status Start();
  // Stops restarting; workers still running get SIGTERM, then SIGKILL after stop_grace; all
  // are reaped. Safe to call twice.
  void Stop();
  // Waits up to `timeout` for every worker to exit on its own (after a shutdown step), then
  // Stop()s. True when they all exited in time.
  bool WaitForExit(std::chrono::milliseconds timeout);

  // Groups started so far (1 after the first start).
  uint64_t groups_started() const;
  // Pids of the current group's live workers, by rank (0 for a rank not running).
  std::vector<pid_t> worker_pids() const;
  // Set when a worker exited with kExitCannotLoad (its model's files cannot be loaded): the
  // launcher stopped restarting, and this says which rank; empty otherwise.
  std::string fatal() const;

 private:
  void Supervise();
  // Starts every rank; on failure kills what started.
  Status SpawnGroup();
  pid_t Spawn(int rank) const;
  // SIGKILLs and reaps every worker of the current group.
  void KillGroup();
  bool AllExited();
  // On the supervisor thread at stop: waits await_exit_ for the workers to exit on their own,
  // then SIGTERM, then SIGKILL after stop_grace.
  void Shutdown();
  // Reaps exited workers; returns a description of the first unexpected exit, or "".
  std::string ReapExited();

  const LauncherOptions options_;
  WorkerGroup* group_;
  std::vector<std::string> worker_args_;  // argv without the per-rank part
  std::vector<std::string> worker_env_;   // this process's environment plus the group secret

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::chrono::milliseconds await_exit_{0};
  bool exited_on_their_own_ = false;
  bool lost_ = false;
  std::string lost_reason_;
  std::string fatal_;  // fatal()
  std::vector<pid_t> pids_;
  uint64_t groups_started_ = 0;
  std::thread supervisor_;
};

}  // namespace deja::coordinator
