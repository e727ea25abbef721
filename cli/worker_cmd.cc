// `deja worker`: one tensor-parallel rank serving deja.v1.Worker for a coordinator
// (docs/architecture.md#processes). Exits 0 after SIGTERM/SIGINT or the coordinator's shutdown
// step, non-zero when it cannot start or a collective fails (a dead peer takes the group down; the
// launcher restarts it); kExitCannotLoad when the model's files cannot be loaded (the launcher
// then stops).
#include <glog/logging.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <thread>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/internal_flags.h"
#include "common/exit_codes.h"
#include "worker/service/worker_server.h"

namespace deja::cli {
namespace {

// Turns SIGTERM/SIGINT into WorkerServer::Stop(). The handler only writes the signal number to a
// pipe (async-signal-safe; any thread may receive the signal, libraries start threads of their
// own); a watcher thread reads it and stops the server.
int g_signal_pipe[2] = {-1, -1};

extern "C" void OnSignal(int sig) {
  const char c = static_cast<char>(sig);
  [[maybe_unused]] ssize_t n = ::write(g_signal_pipe[1], &c, 1);
}

class SignalWatcher {
 public:
  explicit SignalWatcher(worker::service::WorkerServer* server) {
    PCHECK(::pipe(g_signal_pipe) == 0) << "pipe";
    struct sigaction sa = {};
    sa.sa_handler = OnSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(SIGTERM, &sa, nullptr);
    ::sigaction(SIGINT, &sa, nullptr);
    thread_ = std::thread([server] {
      char c = 0;
      while (::read(g_signal_pipe[0], &c, 1) == 1 && c != kQuit) {
        LOG(INFO) << "received signal " << static_cast<int>(c) << ", stopping";
        server->Stop();
      }
    });
  }
  ~SignalWatcher() {
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGINT, SIG_DFL);
    const char c = kQuit;
    [[maybe_unused]] ssize_t n = ::write(g_signal_pipe[1], &c, 1);
    thread_.join();
    ::close(g_signal_pipe[0]);
    ::close(g_signal_pipe[1]);
  }

 private:
  static constexpr char kQuit = 0;
  std::thread thread_;
};

}  // namespace

int RunWorker(int argc, char** argv, int first) {
  Args args("worker", "Serve one tensor-parallel rank of --model for the coordinator.");
  args.Flag("model", "model directory (HF OPT checkpoint)", "", true)
      .Flag("rank", "this worker's rank in [0, world)", "", true)
      .Flag("world", "tensor-parallel size N", "", true)
      .Flag("coordinator",
            "host:port of the coordinator's internal plane (its --internal-host:--internal-port)",
            "", true)
      .Flag("listen", "host:port of this worker's gRPC service (port 0: any free port)",
            "127.0.0.1:0")
      .Flag("advertise", "host:port registered with the coordinator (default: from --listen)")
      .Flag("threads", "CPU threads (0 = one per core)", "0")
      .Flag("kv-memory-mb", "KV cache memory budget of this rank, MiB", "1024")
      .Flag("connect-timeout-ms", "how long to keep trying to reach the coordinator", "60000")
      .Flag("collective-timeout-ms", "bound on the Gloo or NCCL rendezvous and on every collective",
            "30000")
      .Flag("coordinator-timeout-ms",
            "after warm-up, exit when the coordinator has not called for this long (0: never)",
            "10000")
      .Flag("gloo-host", "address Gloo listens on for its peers", "127.0.0.1")
      .Flag("cpu-comm",
            "how CPU ranks all-reduce: auto (shared memory when every rank is on this host, "
            "else Gloo), shm or gloo",
            "auto")
      .Flag("kv-paging",
            "on: the CPU KV memory is one pool of blocks that sequences take as they grow (a "
            "sequence holds what it has used); off: each sequence allocates its maximum length "
            "when it starts (devices always page)",
            "on");
  AddGroupSecretFlags(args);
  AddInternalTlsFlags(args);
  AddSparsityFlags(args);
  args.Flag("retaining-heads",
            "Locret retaining heads (safetensors, its .json beside it): serve the locret cache "
            "policy; auto = <model>/retaining.safetensors when it exists, none = never",
            "auto");
  args.Flag("prefix-cache",
            "on: keep prompt KV blocks the coordinator asks for (reused by later requests with "
            "the same prefix; needs --kv-paging on); off: never",
            "on")
      .Flag("prefix-cache-dir",
            "directory of the prefix cache's disk tier (files of this rank under rank<N>/, "
            "cleared at start); empty: no disk tier",
            "");
  AddPrefixImportanceFlags(args);
  AddDtypeFlag(args);
  if (Status s = args.Parse(argc, argv, first); !s.ok()) return Fail("worker", s);
  if (args.help()) return std::printf("%s", args.Help().c_str()), 0;

  worker::service::WorkerOptions o;
  auto parse = [&]() -> Status {
    DEJA_ASSIGN_OR_RETURN(int64_t rank, args.Int("rank"));
    DEJA_ASSIGN_OR_RETURN(int64_t world, args.Int("world"));
    DEJA_ASSIGN_OR_RETURN(int64_t threads, args.Int("threads"));
    DEJA_ASSIGN_OR_RETURN(int64_t kv_mb, args.Int("kv-memory-mb"));
    DEJA_ASSIGN_OR_RETURN(int64_t connect_ms, args.Int("connect-timeout-ms"));
    DEJA_ASSIGN_OR_RETURN(int64_t collective_ms, args.Int("collective-timeout-ms"));
    DEJA_ASSIGN_OR_RETURN(int64_t coordinator_ms, args.Int("coordinator-timeout-ms"));
    if (coordinator_ms < 0) return InvalidArgument("--coordinator-timeout-ms must be >= 0");
    if (world < 1 || world > 4096) return InvalidArgument("--world must be in [1, 4096]");
    if (rank < 0 || rank >= world) return InvalidArgument("--rank must be in [0, --world)");
    if (kv_mb <= 0) return InvalidArgument("--kv-memory-mb must be > 0");
    if (connect_ms <= 0 || collective_ms <= 0) {
      return InvalidArgument("--connect-timeout-ms and --collective-timeout-ms must be > 0");
    }
    o.model_dir = args.Str("model");
    o.rank = static_cast<int>(rank);
    o.world_size = static_cast<int>(world);
    o.coordinator = args.Str("coordinator");
    o.listen = args.Str("listen");
    o.advertise = args.Str("advertise");
    o.threads = static_cast<int>(threads);
    o.kv_memory_bytes = static_cast<uint64_t>(kv_mb) << 20;
    o.connect_timeout = std::chrono::milliseconds(connect_ms);
    o.collective_timeout = std::chrono::milliseconds(collective_ms);
    o.coordinator_timeout = std::chrono::milliseconds(coordinator_ms);
    o.gloo_hostname = args.Str("gloo-host");
    DEJA_ASSIGN_OR_RETURN(o.cpu_comm, worker::service::ParseCpuComm(args.Str("cpu-comm")));
    DEJA_ASSIGN_OR_RETURN(SparsityFlags sparsity, SparsityFromFlags(args));
    o.sparsity = sparsity.options;
    o.sparsity_default = sparsity.default_on;
    DEJA_ASSIGN_OR_RETURN(o.load, LoadOptionsFromFlags(args));
    DEJA_ASSIGN_OR_RETURN(o.retaining_heads, RetainingHeadsPath(args));
    DEJA_ASSIGN_OR_RETURN(o.device, DeviceFromFlags(args));
    // An unusable GPU fails here, with the CUDA reason, before any connection is made.
    if (!o.device.is_host()) DEJA_RETURN_IF_ERROR(MakeBackend(o.device, 1).status());
    // On a GPU the KV pool is --kv-memory-mb, unless a fraction of the free memory is asked for.
    if (args.Str("kv-memory-fraction").empty()) {
      o.load.kv_memory_bytes = static_cast<int64_t>(o.kv_memory_bytes);
    }
    if (args.Str("kv-paging") != "on" && args.Str("kv-paging") != "off") {
      return InvalidArgument("--kv-paging must be on or off, not '" + args.Str("kv-paging") + "'");
    }
    o.load.kv_paged = o.device.is_host() && args.Str("kv-paging") == "on";
    if (args.Str("prefix-cache") != "on" && args.Str("prefix-cache") != "off") {
      return InvalidArgument("--prefix-cache must be on or off, not '" + args.Str("prefix-cache") +
                             "'");
    }
    o.prefix_cache = args.Str("prefix-cache") == "on";
    o.prefix_cache_dir = args.Str("prefix-cache-dir");
    DEJA_ASSIGN_OR_RETURN(o.prefix_importance, PrefixImportanceFromFlags(args));
    o.internal_tls = InternalTlsFromFlags(args);
    DEJA_ASSIGN_OR_RETURN(o.group_secret, GroupSecretFromFlags(args));
    return Status::Ok();
  };
  if (Status s = parse(); !s.ok()) return Fail("worker", s);

  worker::service::WorkerServer server(o);
  Status outcome;
  {
    SignalWatcher watcher(&server);
    outcome = server.Run();
  }
  if (!outcome.ok()) {
    const int code = Fail("worker", outcome);
    return server.load_failed() ? kExitCannotLoad : code;
  }
  LOG(INFO) << "rank " << o.rank << ": exited cleanly";
  return 0;
}

}  // namespace deja::cli
