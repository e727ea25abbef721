// `deja serve` (coordinator plus N supervised worker processes on this machine) and
// `deja coordinator` (the coordinator alone; workers are started elsewhere and register with
// its Rendezvous on the internal plane, cli/internal_flags.h). Both drain on SIGTERM/SIGINT:
// readiness turns NOT_SERVING, new requests get UNAVAILABLE, admitted ones finish up to
// --drain-timeout-ms; a second signal stops at once.
#include <fcntl.h>
#include <glog/logging.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/internal_flags.h"
#include "cli/security_flags.h"
#include "coordinator/coordinator.h"
#include "coordinator/launcher.h"
#include "proto/internal_plane.h"
#include "worker/kv/policy_table.h"
#include "worker/service/worker_server.h"

namespace deja::cli {
namespace {

// SIGTERM/SIGINT through a handler that writes to a pipe, read by a thread. Not sigwait with
// the signals blocked: threads started before main (OpenBLAS starts its pool when the library
// loads) would not block them, and a signal delivered to one of those would kill the process.
int g_signal_pipe[2] = {-1, -1};

extern "C" void OnStopSignal(int sig) {
  const char c = static_cast<char>(sig);
  (void)!::write(g_signal_pipe[1], &c, 1);
}

class SignalWaiter {
 public:
  SignalWaiter() {
    if (::pipe2(g_signal_pipe, O_CLOEXEC) != 0) PLOG(FATAL) << "pipe2";
    struct sigaction sa = {};
    sa.sa_handler = OnStopSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(SIGTERM, &sa, nullptr);
    ::sigaction(SIGINT, &sa, nullptr);
    thread_ = std::thread([this] {
      char c = 0;
      while (::read(g_signal_pipe[0], &c, 1) == 1 && c != 0) {
        std::lock_guard<std::mutex> lock(mu_);
        ++signals_;
        LOG(INFO) << "received signal " << static_cast<int>(c) << (signals_ > 1 ? " again" : "");
        cv_.notify_all();
      }
    });
  }
  ~SignalWaiter() {
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGINT, SIG_DFL);
    const char quit = 0;
    (void)!::write(g_signal_pipe[1], &quit, 1);
    thread_.join();
    ::close(g_signal_pipe[0]);
    ::close(g_signal_pipe[1]);
  }
  // Blocks until at least `n` signals arrived, or `timeout` passed; true if they did.
  bool Wait(int n, std::chrono::milliseconds timeout = std::chrono::hours(24 * 365)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return signals_ >= n; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int signals_ = 0;
  std::thread thread_;
};

std::string SelfPath() {
  char buf[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("deja");
}

void AddCoordinatorFlags(Args& args) {
  args.Flag("model", "model directory (HF OPT checkpoint and tokenizer)", "", true)
      .Flag("tp", "tensor-parallel size N (number of workers)", "1")
      .Flag("host", "address the gRPC API listens on (0.0.0.0: every interface)", "127.0.0.1")
      .Flag("port", "gRPC port (0: any free port)", "50051")
      .Flag("metrics-port", "Prometheus /metrics port (0: any free port, -1: off)", "9090")
      .Flag("metrics-host", "address /metrics listens on (default: the API's --host)", "")
      .Flag("http-port",
            "OpenAI-compatible HTTP API port, on --host (0: any free port, -1: off)", "8000")
      .Flag("chat-template",
            "JSON file of the chat template /v1/chat/completions uses (docs/serving.md); "
            "default: a plain User:/Assistant: transcript",
            "")
      .Flag("max-batch-sequences", "sequences per step", "32")
      .Flag("max-prefill-tokens", "prompt tokens per step over all prefill chunks", "512")
      .Flag("locret-chunk",
            "prompt tokens per step for a locret sequence (its cache holds budget + this)", "64")
      .Flag("prefix-cache",
            "on: requests that leave PrefixCache.mode unspecified reuse cached prompt blocks and "
            "leave theirs for later ones (when the workers keep a prefix cache); off: not",
            "on")
      .Bool("prefix-cache-salt-required",
            "refuse (INVALID_ARGUMENT) requests that use the prefix cache without a cache_salt: "
            "tenants share cached prompt blocks only through a salt they agree on")
      .Flag("prefix-load",
            "how a request reads a cached prefix that is partly on host or disk: full (into "
            "the memory tier first; exact) or important (where it is, each layer only the "
            "tokens the workers' probe heads choose: approximate, reads less; see "
            "--prefix-kept-fraction)",
            "full")
      .Flag("prefix-cache-memory-mb",
            "most MiB of each worker's KV memory cached prefix blocks hold (only what running "
            "requests leave free: they move down a tier when a request needs the room)",
            "256")
      .Flag("prefix-cache-host-mb", "MiB of each worker's host memory for cached prefix blocks",
            "1024")
      .Flag("prefix-cache-disk-mb",
            "MiB of each worker's disk for cached prefix blocks (with workers that have a "
            "--prefix-cache-dir)",
            "4096")
      .Flag("max-queue", "requests waiting for the batch before RESOURCE_EXHAUSTED", "64")
      .Flag("default-max-new-tokens", "max_new_tokens when a request leaves it unset", "256")
      .Flag("step-timeout-ms", "a step unanswered this long loses the worker group", "2500")
      .Flag("heartbeat-interval-ms", "worker GetStatus polling period", "250")
      .Flag("heartbeat-timeout-ms", "a worker silent this long loses the group", "1500")
      .Flag("drain-timeout-ms", "how long a drain lets admitted requests finish", "30000")
      .Bool("wait-for-kv",
            "queue a request that finds the KV memory taken (within --max-queue) until it is "
            "free, instead of RESOURCE_EXHAUSTED at once");
  // The server's default KV-cache policy: what a request without CachePolicy.kind gets.
  AddCachePolicyFlags(args, worker::kv::CachePolicyKind::kFull);
  AddServerSecurityFlags(args);
}

// The --kv-policy flags as the API's CachePolicy (ratios unless token budgets were given), with
// the budgets the kind reads.
StatusOr<v1::CachePolicy> DefaultCacheFromFlags(const Args& args) {
  DEJA_ASSIGN_OR_RETURN(worker::kv::CachePolicyConfig c, CachePolicyFromFlags(args));
  const worker::kv::CachePolicyRow& row = worker::kv::CachePolicyOf(c.kind);
  v1::CachePolicy p;
  p.set_kind(row.api);
  if (!row.bounded) return p;
  if (c.h2o_decay != 1.0f) p.set_score_decay(c.h2o_decay);
  if (row.heavy_hitters) {
    if (c.heavy_tokens >= 0) {
      p.set_heavy_tokens(static_cast<uint32_t>(c.heavy_tokens));
    } else {
      p.set_heavy_ratio(c.heavy_ratio);
    }
  }
  if (c.recent_tokens >= 0) {
    if (c.recent_tokens < 1) return InvalidArgument("--recent-tokens must be >= 1");
    p.set_recent_tokens(static_cast<uint32_t>(c.recent_tokens));
  } else {
    p.set_recent_ratio(c.recent_ratio);
  }
  return p;
}

StatusOr<coordinator::CoordinatorOptions> CoordinatorFromFlags(const Args& args) {
  coordinator::CoordinatorOptions o;
  o.model_dir = args.Str("model");
  o.host = args.Str("host");
  o.metrics_host = args.Str("metrics-host");
  DEJA_ASSIGN_OR_RETURN(int64_t tp, args.Int("tp"));
  DEJA_ASSIGN_OR_RETURN(int64_t port, args.Int("port"));
  DEJA_ASSIGN_OR_RETURN(int64_t metrics_port, args.Int("metrics-port"));
  DEJA_ASSIGN_OR_RETURN(int64_t http_port, args.Int("http-port"));
  DEJA_ASSIGN_OR_RETURN(int64_t batch, args.Int("max-batch-sequences"));
  DEJA_ASSIGN_OR_RETURN(int64_t prefill, args.Int("max-prefill-tokens"));
  DEJA_ASSIGN_OR_RETURN(int64_t queue, args.Int("max-queue"));
  DEJA_ASSIGN_OR_RETURN(int64_t max_new, args.Int("default-max-new-tokens"));
  DEJA_ASSIGN_OR_RETURN(int64_t step_ms, args.Int("step-timeout-ms"));
  DEJA_ASSIGN_OR_RETURN(int64_t hb_ms, args.Int("heartbeat-interval-ms"));
  DEJA_ASSIGN_OR_RETURN(int64_t hb_timeout_ms, args.Int("heartbeat-timeout-ms"));
  DEJA_ASSIGN_OR_RETURN(int64_t drain_ms, args.Int("drain-timeout-ms"));
  if (tp < 1 || tp > 64) return InvalidArgument("--tp must be in [1, 64]");
  if (port < 0 || port > 65535) return InvalidArgument("--port must be in [0, 65535]");
  if (metrics_port < -1 || metrics_port > 65535) {
    return InvalidArgument("--metrics-port must be in [-1, 65535]");
  }
  if (http_port < -1 || http_port > 65535) {
    return InvalidArgument("--http-port must be in [-1, 65535]");
  }
  if (batch < 1 || prefill < 1 || queue < 0 || max_new < 1) {
    return InvalidArgument(
        "--max-batch-sequences, --max-prefill-tokens and "
        "--default-max-new-tokens must be >= 1, --max-queue >= 0");
  }
  if (step_ms < 1 || hb_ms < 1 || hb_timeout_ms < 1 || drain_ms < 0) {
    return InvalidArgument("timeouts and intervals must be positive");
  }
  o.tensor_parallel_size = static_cast<int>(tp);
  o.port = static_cast<int>(port);
  o.metrics_port = static_cast<int>(metrics_port);
  o.http_port = static_cast<int>(http_port);
  o.chat_template_file = args.Str("chat-template");
  o.scheduler.max_batch_sequences = static_cast<int32_t>(batch);
  o.scheduler.max_prefill_tokens = static_cast<int32_t>(prefill);
  o.scheduler.max_waiting = static_cast<int32_t>(queue);
  o.scheduler.wait_for_kv = args.On("wait-for-kv");
  o.default_max_new_tokens = static_cast<int32_t>(max_new);
  o.group.step_timeout = std::chrono::milliseconds(step_ms);
  o.group.heartbeat_interval = std::chrono::milliseconds(hb_ms);
  o.group.heartbeat_timeout = std::chrono::milliseconds(hb_timeout_ms);
  o.drain_timeout = std::chrono::milliseconds(drain_ms);
  DEJA_ASSIGN_OR_RETURN(o.default_cache, DefaultCacheFromFlags(args));
  DEJA_ASSIGN_OR_RETURN(int64_t locret_chunk, args.Int("locret-chunk"));
  if (locret_chunk < 1 || locret_chunk > (1 << 20)) {
    return InvalidArgument("--locret-chunk must be in [1, 2^20]");
  }
  o.locret_chunk = static_cast<int32_t>(locret_chunk);
  if (args.Str("prefix-cache") != "on" && args.Str("prefix-cache") != "off") {
    return InvalidArgument("--prefix-cache must be on or off, not '" + args.Str("prefix-cache") +
                           "'");
  }
  o.prefix_cache_default = args.Str("prefix-cache") == "on";
  o.prefix_cache_salt_required = args.On("prefix-cache-salt-required");
  if (args.Str("prefix-load") != "full" && args.Str("prefix-load") != "important") {
    return InvalidArgument("--prefix-load must be full or important, not '" +
                           args.Str("prefix-load") + "'");
  }
  o.scheduler.prefix_important = args.Str("prefix-load") == "important";
  for (auto [flag, bytes] : {std::pair{"prefix-cache-memory-mb", &o.scheduler.prefix_memory_bytes},
                             std::pair{"prefix-cache-host-mb", &o.scheduler.prefix_host_bytes},
                             std::pair{"prefix-cache-disk-mb", &o.scheduler.prefix_disk_bytes}}) {
    DEJA_ASSIGN_OR_RETURN(int64_t mb, args.Int(flag));
    if (mb < 0 || mb > (int64_t{1} << 30)) {
      return InvalidArgument(std::string("--") + flag + " must be in [0, 2^30]");
    }
    *bytes = static_cast<uint64_t>(mb) << 20;
  }
  o.security = ServerSecurityFromFlags(args);
  return o;
}

// Runs until a signal, then drains. With a launcher, the workers are shut down and reaped.
Status Serve(const coordinator::CoordinatorOptions& options,
             const coordinator::LauncherOptions* launcher_options, SignalWaiter& signals) {
  DEJA_ASSIGN_OR_RETURN(std::unique_ptr<coordinator::Coordinator> c,
                        coordinator::Coordinator::Start(options));
  std::unique_ptr<coordinator::Launcher> launcher;
  if (launcher_options != nullptr) {
    coordinator::LauncherOptions lo = *launcher_options;
    lo.coordinator = c->rendezvous_address();
    launcher = std::make_unique<coordinator::Launcher>(lo, &c->group());
    DEJA_RETURN_IF_ERROR(launcher->Start());
  }
  std::fprintf(stderr,
               "deja: serving on %s:%d (metrics on port %d, OpenAI API on port %d); waiting for "
               "%d workers\n",
               options.host.c_str(), c->port(), c->metrics_port(), c->http_port(),
               options.tensor_parallel_size);
  std::fprintf(stderr, "deja: internal plane (worker rendezvous) on %s\n",
               c->rendezvous_address().c_str());
  // Until a signal: announce readiness once, with a command to paste. A worker that cannot load
  // the model stops the server (a new group would fail the same way).
  for (bool announced = false; !signals.Wait(1, std::chrono::milliseconds(100));) {
    if (launcher && !launcher->fatal().empty()) {
      const std::string fatal = launcher->fatal();
      launcher.reset();  // before the coordinator, whose worker group it holds
      c.reset();
      return FailedPrecondition(fatal);
    }
    if (!announced && c->engine().Ready()) {
      announced = true;
      std::fprintf(stderr,
                   "deja: ready (grpc.health.v1 %s is SERVING). Try:\n  %s client stream "
                   "--target 127.0.0.1:%d%s --prompt \"And God said\" --max-new-tokens 32\n",
                   coordinator::kReadinessService, SelfPath().c_str(), c->port(),
                   ClientFlagsHint(options.security).c_str());
    }
  }
  // A second signal cuts the drain short.
  std::atomic<bool> drained{false};
  std::thread impatient([&] {
    while (!drained.load()) {
      if (signals.Wait(2, std::chrono::milliseconds(100))) {
        c->engine().FailAll(Unavailable("the server was stopped"));
        return;
      }
    }
  });
  c->Drain();
  drained.store(true);
  impatient.join();
  if (launcher) {
    if (Status s = c->ShutdownWorkers(); !s.ok()) LOG(WARNING) << s.ToString();
    launcher->WaitForExit(std::chrono::seconds(5));
  }
  launcher.reset();  // before the coordinator, whose worker group it holds
  c.reset();
  LOG(INFO) << "stopped";
  return Status::Ok();
}

}  // namespace

int RunServe(int argc, char** argv, int first) {
  SignalWaiter signals;
  Args args("serve", "Serve --model with a coordinator and --tp worker processes on this host.");
  AddCoordinatorFlags(args);
  AddInternalListenFlags(args, "0");
  AddInternalTlsFlags(args);
  args.Flag("kv-memory-mb", "KV cache budget of each worker, MiB (0: the worker's default)", "0")
      .Flag("threads", "CPU threads per worker (0: this host's cores split evenly)", "0")
      .Flag("worker-host", "address the workers listen on", "127.0.0.1")
      .Flag("retaining-heads",
            "Locret retaining heads the workers load to serve the locret cache policy: auto = "
            "<model>/retaining.safetensors when it exists, none = never, or a path",
            "auto")
      .Flag("kv-paging",
            "on: each CPU worker's KV memory is one pool of blocks that sequences take as they "
            "grow, and admission counts what sequences use (a request that runs out of blocks "
            "is preempted and later recomputed); off: each sequence reserves prompt + "
            "max_new_tokens when it is admitted",
            "on")
      .Flag("cpu-comm",
            "how CPU workers all-reduce: auto (shared memory, as they share this host), shm or "
            "gloo (TCP on loopback)",
            "auto")
      .Flag("gpus",
            "with --device cuda: the GPU of each rank, comma-separated (default: rank r on GPU "
            "r, or all on N with --device cuda:N and --tp 1)",
            "")
      .Flag("prefix-cache-dir",
            "directory of the prefix cache's disk tier (each worker clears and uses "
            "rank<N>/ under it); empty: memory and host tiers only",
            "");
  AddPrefixImportanceFlags(args);
  AddSparsityFlags(args);
  AddDtypeFlag(args);
  if (Status s = args.Parse(argc, argv, first); !s.ok()) return Fail("serve", s);
  if (args.help()) return std::printf("%s", args.Help().c_str()), 0;
  auto run = [&]() -> Status {
    DEJA_ASSIGN_OR_RETURN(coordinator::CoordinatorOptions o, CoordinatorFromFlags(args));
    DEJA_ASSIGN_OR_RETURN(InternalListen internal, InternalListenFromFlags(args));
    o.internal_host = internal.host;
    o.internal_port = internal.port;
    o.internal_tls = InternalTlsFromFlags(args);
    // A fresh secret for every run, which only this process and its workers know.
    DEJA_ASSIGN_OR_RETURN(o.group_secret, proto::GenerateGroupSecret());
    coordinator::LauncherOptions lo;
    lo.group_secret = o.group_secret;
    lo.model_dir = o.model_dir;
    lo.world_size = o.tensor_parallel_size;
    lo.worker_host = args.Str("worker-host");
    DEJA_ASSIGN_OR_RETURN(lo.kv_memory_mb, args.Int("kv-memory-mb"));
    DEJA_ASSIGN_OR_RETURN(int64_t threads, args.Int("threads"));
    if (lo.kv_memory_mb < 0 || threads < 0) {
      return InvalidArgument("--kv-memory-mb and --threads must be >= 0");
    }
    lo.threads_per_worker = static_cast<int>(threads);
    // Checked here too, so a bad value fails serve at once rather than every worker start.
    DEJA_ASSIGN_OR_RETURN(SparsityFlags sparsity, SparsityFromFlags(args));
    lo.predictors = sparsity.predictors;
    lo.sparsity_oracle = sparsity.oracle;
    lo.sparsity_default = sparsity.default_flag;
    DEJA_RETURN_IF_ERROR(LoadOptionsFromFlags(args).status());
    lo.extra_worker_args = {"--dtype", args.Str("dtype"), "--kv-dtype", args.Str("kv-dtype"),
                            "--decode-attention", args.Str("decode-attention"),
                            "--cuda-graphs", args.Str("cuda-graphs"),
                            "--int4-group", args.Str("int4-group"),
                            "--int4-max-error", args.Str("int4-max-error")};
    DEJA_RETURN_IF_ERROR(worker::service::ParseCpuComm(args.Str("cpu-comm")).status());
    if (args.Str("kv-paging") != "on" && args.Str("kv-paging") != "off") {
      return InvalidArgument("--kv-paging must be on or off, not '" + args.Str("kv-paging") + "'");
    }
    lo.extra_worker_args.push_back("--kv-paging");
    lo.extra_worker_args.push_back(args.Str("kv-paging"));
    lo.extra_worker_args.push_back("--cpu-comm");
    lo.extra_worker_args.push_back(args.Str("cpu-comm"));
    if (!args.Str("prefix-cache-dir").empty()) {
      lo.extra_worker_args.push_back("--prefix-cache-dir");
      lo.extra_worker_args.push_back(args.Str("prefix-cache-dir"));
    }
    DEJA_RETURN_IF_ERROR(PrefixImportanceFromFlags(args).status());
    for (std::string& a : PrefixImportanceArgs(args)) lo.extra_worker_args.push_back(std::move(a));
    DEJA_ASSIGN_OR_RETURN(std::string heads, RetainingHeadsPath(args));
    lo.extra_worker_args.push_back("--retaining-heads");
    lo.extra_worker_args.push_back(heads.empty() ? "none" : heads);
    if (!args.Str("kv-memory-fraction").empty()) {
      lo.extra_worker_args.push_back("--kv-memory-fraction");
      lo.extra_worker_args.push_back(args.Str("kv-memory-fraction"));
    }
    DEJA_ASSIGN_OR_RETURN(Device device, DeviceFromFlags(args));
    DEJA_ASSIGN_OR_RETURN(lo.rank_devices, RankDevices(device, args.Str("gpus"), lo.world_size));
    if (!device.is_host()) {
      // Fail here, with the CUDA reason, rather than in every worker start.
      for (const std::string& d : lo.rank_devices) {
        DEJA_ASSIGN_OR_RETURN(Device rd, ParseDevice(d));
        DEJA_RETURN_IF_ERROR(MakeBackend(rd, 1).status());
      }
    }
    for (const std::string& a : InternalTlsWorkerArgs(o.internal_tls)) {
      lo.extra_worker_args.push_back(a);
    }
    return Serve(o, &lo, signals);
  };
  if (Status s = run(); !s.ok()) return Fail("serve", s);
  return 0;
}

int RunCoordinator(int argc, char** argv, int first) {
  SignalWaiter signals;
  Args args("coordinator",
            "Run only the coordinator for --model; start --tp `deja worker` processes elsewhere "
            "with --coordinator pointing at --internal-host:--internal-port and the same group "
            "secret.");
  AddCoordinatorFlags(args);
  AddInternalListenFlags(args, "50052");
  AddGroupSecretFlags(args);
  AddInternalTlsFlags(args);
  if (Status s = args.Parse(argc, argv, first); !s.ok()) return Fail("coordinator", s);
  if (args.help()) return std::printf("%s", args.Help().c_str()), 0;
  auto run = [&]() -> Status {
    DEJA_ASSIGN_OR_RETURN(coordinator::CoordinatorOptions o, CoordinatorFromFlags(args));
    DEJA_ASSIGN_OR_RETURN(InternalListen internal, InternalListenFromFlags(args));
    o.internal_host = internal.host;
    o.internal_port = internal.port;
    o.internal_tls = InternalTlsFromFlags(args);
    DEJA_ASSIGN_OR_RETURN(o.group_secret, GroupSecretFromFlags(args));
    return Serve(o, nullptr, signals);
  };
  if (Status s = run(); !s.ok()) return Fail("coordinator", s);
  return 0;
}

}  // namespace deja::cli
