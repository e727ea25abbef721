#include "worker/service/worker_server.h"

#include <glog/logging.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "deja/v1/worker.grpc.pb.h"
#include "proto/grpc_status.h"
#include "proto/internal_plane.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/host_identity.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/comm/shm_communicator.h"
#include "worker/kv/kv_cache.h"
#include "worker/service/grpc_store.h"
#include "worker/service/step_engine.h"

namespace deja::worker::service {
namespace {

// The names ModelInfo uses ("float32", "float16", "bfloat16", "int8", "int4").
const char* TorchDTypeName(DType t) {
  switch (t) {
    case DType::kF16:
      return "float16";
    case DType::kBF16:
      return "bfloat16";
    case DType::kI8:
      return "int8";
    case DType::kI4:
      return "int4";
    default:
      return "float32";
  }
}

}  // namespace

namespace {

using Clock = std::chrono::steady_clock;
// Messages may carry all-position log-probabilities (tokens x vocab floats).
constexpr int kMaxMessageBytes = 512 << 20;

// Splits "host:port" (host may be "[v6]"); port -1 when absent.
std::pair<std::string, int> SplitHostPort(const std::string& hp) {
  const size_t colon = hp.rfind(':');
  if (colon == std::string::npos) return {hp, -1};
  return {hp.substr(0, colon), std::atoi(hp.c_str() + colon + 1)};
}

}  // namespace

class WorkerServiceImpl final : public deja::v1::Worker::Service {
 public:
  explicit WorkerServiceImpl(WorkerServer* owner)
      : owner_(owner),
        auth_(owner->options_.group_secret, "rank " + std::to_string(owner->options_.rank)) {}

  std::atomic<bool> loaded{false};
  std::atomic<bool> warmed_up{false};
  std::atomic<bool> sparsity{false};  // EnableSparsity succeeded
  std::atomic<bool> locret{false};    // EnableRetaining succeeded
  std::atomic<bool> prefix_cache{false};  // the step engine keeps a prefix cache
  std::atomic<bool> prefix_disk{false};   // ... with a disk tier
  std::atomic<uint64_t> epoch{0};
  // When the coordinator last called (a Step message or GetStatus), in Clock ticks.
  std::atomic<Clock::rep> last_call{0};
  void Touch() { last_call.store(Clock::now().time_since_epoch().count()); }

  grpc::Status Step(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<deja::v1::StepResponse, deja::v1::StepRequest>* stream) override {
    if (grpc::Status a = auth_.Check(*ctx, "Worker.Step"); !a.ok()) return a;
    if (!warmed_up.load()) return {grpc::StatusCode::UNAVAILABLE, "worker is not ready yet"};
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stream_active_) {
        return {grpc::StatusCode::FAILED_PRECONDITION, "another Step stream is active"};
      }
      stream_active_ = true;
    }
    const int rank = owner_->options_.rank;
    LOG(INFO) << "rank " << rank << ": Step stream opened by " << ctx->peer();
    StepEngine& engine = *owner_->engine_;
    deja::v1::StepRequest req;
    grpc::Status result = grpc::Status::OK;
    while (stream->Read(&req)) {
      Touch();
      deja::v1::StepResponse resp;
      Status fatal = engine.Run(req, &resp);
      const bool written = stream->Write(resp);
      if (!fatal.ok()) {
        owner_->Finish(fatal);
        result = proto::ToGrpc(fatal);
        break;
      }
      if (req.shutdown()) {
        LOG(INFO) << "rank " << rank << ": shutdown requested by the coordinator";
        owner_->Finish(Status::Ok());
        break;
      }
      if (!written) break;
    }
    // Closing the stream releases every sequence of the rank.
    engine.ReleaseAll();
    LOG(INFO) << "rank " << rank << ": Step stream closed";
    std::lock_guard<std::mutex> lock(mu_);
    stream_active_ = false;
    return result;
  }

  grpc::Status GetStatus(grpc::ServerContext* ctx, const deja::v1::GetStatusRequest*,
                         deja::v1::WorkerStatus* st) override {
    if (grpc::Status a = auth_.Check(*ctx, "Worker.GetStatus"); !a.ok()) return a;
    Touch();
    const WorkerOptions& o = owner_->options_;
    st->set_rank(static_cast<uint32_t>(o.rank));
    st->set_world_size(static_cast<uint32_t>(o.world_size));
    st->set_loaded(loaded.load());
    st->set_warmed_up(warmed_up.load());
    st->set_pid(static_cast<uint32_t>(::getpid()));
    st->set_uptime_seconds(std::chrono::duration<double>(Clock::now() - owner_->started_).count());
    st->set_group_epoch(epoch.load());
    st->set_sparsity_available(sparsity.load());
    st->set_sparsity_default(sparsity.load() && o.sparsity_default);
    st->set_locret_available(locret.load());
    st->set_prefix_cache_available(prefix_cache.load());
    st->set_prefix_disk_available(prefix_disk.load());
    if (loaded.load()) {
      st->set_weight_dtype(TorchDTypeName(owner_->model_->weight_dtype()));
      st->set_kv_dtype(TorchDTypeName(owner_->model_->kv_geometry().kv_dtype));
    }
    if (warmed_up.load()) {
      *st->mutable_kv() = owner_->engine_->Usage();
      st->set_kv_bytes_per_token(owner_->engine_->kv_bytes_per_token());
      st->set_kv_block_tokens(static_cast<uint32_t>(owner_->model_->kv_block_slots()));
    } else {
      st->mutable_kv()->set_total_bytes(o.kv_memory_bytes);
      st->mutable_kv()->set_free_bytes(o.kv_memory_bytes);
    }
    return grpc::Status::OK;
  }

 private:
  WorkerServer* owner_;
  const proto::GroupSecretCheck auth_;
  std::mutex mu_;
  bool stream_active_ = false;
};

WorkerServer::WorkerServer(WorkerOptions options)
    : options_(std::move(options)), started_(Clock::now()) {}

WorkerServer::~WorkerServer() {
  if (server_) server_->Shutdown(std::chrono::system_clock::now());
}

void WorkerServer::Stop() { Finish(Status::Ok()); }

void WorkerServer::Finish(Status status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    done_ = true;
    outcome_ = std::move(status);
  }
  cv_.notify_all();
}

bool WorkerServer::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

StatusOr<CpuComm> ParseCpuComm(const std::string& text) {
  if (text == "auto") return CpuComm::kAuto;
  if (text == "shm") return CpuComm::kShm;
  if (text == "gloo") return CpuComm::kGloo;
  return InvalidArgument("--cpu-comm must be auto, shm or gloo, got '" + text + "'");
}

Status WorkerServer::StartGrpc() {
  service_ = std::make_unique<WorkerServiceImpl>(this);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options_.listen, credentials_.Server(), &port);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // a port in use is an error
  builder.RegisterService(service_.get());
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  server_ = builder.BuildAndStart();
  if (!server_ || port == 0) return Unavailable("cannot listen on " + options_.listen);
  if (!options_.advertise.empty()) {
    address_ = options_.advertise;
  } else {
    std::string host = SplitHostPort(options_.listen).first;
    if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::") {
      char name[256] = {};
      ::gethostname(name, sizeof(name) - 1);
      host = name;
    }
    address_ = host + ":" + std::to_string(port);
  }
  LOG(INFO) << "rank " << options_.rank << "/" << options_.world_size
            << ": Worker service listening on " << options_.listen << " (port " << port
            << "), advertised as " << address_ << (credentials_.tls() ? " (mutual TLS)" : "");
  return Status::Ok();
}

StatusOr<uint64_t> WorkerServer::Register() {
  auto stub = deja::v1::Rendezvous::NewStub(credentials_.Channel(options_.coordinator));
  deja::v1::RegisterRequest req;
  req.set_rank(static_cast<uint32_t>(options_.rank));
  req.set_world_size(static_cast<uint32_t>(options_.world_size));
  req.set_address(address_);
  req.set_pid(static_cast<uint32_t>(::getpid()));
  const Clock::time_point deadline = Clock::now() + options_.connect_timeout;
  Status last;
  while (!finished()) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    ctx.set_wait_for_ready(true);
    proto::AttachGroupSecret(&ctx, options_.group_secret);
    deja::v1::RegisterResponse resp;
    last = proto::FromGrpc(stub->Register(&ctx, req, &resp));
    if (last.ok()) return resp.group_epoch();
    if (last.code() != StatusCode::kUnavailable && last.code() != StatusCode::kDeadlineExceeded) {
      return last.WithContext("registering with the coordinator at " + options_.coordinator);
    }
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  if (finished()) return Status(StatusCode::kCancelled, "stopped while registering");
  return Unavailable("cannot reach the coordinator's Rendezvous at " + options_.coordinator +
                     " within " + std::to_string(options_.connect_timeout.count()) +
                     " ms: " + last.ToString());
}

StatusOr<std::unique_ptr<comm::Communicator>> WorkerServer::MakeCpuCommunicator(
    comm::KeyValueStore& store, const std::string& prefix, std::string* kind) {
  bool shm = options_.cpu_comm == CpuComm::kShm;
  std::string why = shm ? "--cpu-comm shm" : "--cpu-comm gloo";
  if (options_.cpu_comm == CpuComm::kAuto) {
    // Every rank publishes where it runs and reads the others', so all choose alike.
    DEJA_ASSIGN_OR_RETURN(comm::SameHostCheck host,
                          comm::CheckSameHost(store, prefix + "/host", options_.rank,
                                              options_.world_size, options_.collective_timeout));
    shm = host.same;
    why = host.same ? "every rank on this host (" + host.detail + ")"
                    : "not every rank on this host: " + host.detail;
  }
  LOG(INFO) << "rank " << options_.rank << ": CPU communicator " << (shm ? "shared memory" : "Gloo")
            << " (" << why << ")";
  if (shm) {
    *kind = "shared-memory";
    comm::ShmOptions o;
    o.rank = options_.rank;
    o.world_size = options_.world_size;
    o.timeout = options_.collective_timeout;
    o.key_prefix = prefix + "/shm";
    return comm::MakeShmCommunicator(store, o);
  }
  *kind = "Gloo";
  comm::GlooOptions g;
  g.rank = options_.rank;
  g.world_size = options_.world_size;
  g.hostname = options_.gloo_hostname;
  g.timeout = options_.collective_timeout;
  g.key_prefix = prefix + "/gloo";
  return comm::MakeGlooCommunicator(store, g);
}

Status WorkerServer::LoadAndWarmUp(uint64_t epoch) {
  const Clock::time_point t0 = Clock::now();
  if (options_.device.is_host()) {
    backend_ = kernels::MakeCpuBackend(options_.threads);
  } else {
    StatusOr<std::unique_ptr<kernels::Backend>> b = kernels::MakeCudaBackend(options_.device.index);
    if (!b.ok()) {
      return FailedPrecondition("--device " + options_.device.ToString() +
                                " is not usable: " + b.status().ToString());
    }
    backend_ = std::move(*b);
  }
  // The group: NCCL on the compute stream for GPU ranks; shared memory or Gloo (TCP) for CPU
  // ranks.
  std::unique_ptr<comm::Communicator> comm;
  if (options_.world_size > 1) {
    GrpcStore store(credentials_.Channel(options_.coordinator), std::chrono::seconds(10),
                    options_.group_secret);
    const std::string prefix = "epoch" + std::to_string(epoch);
    std::string kind = "NCCL";
    if (options_.device.is_host()) {
      DEJA_ASSIGN_OR_RETURN(comm, MakeCpuCommunicator(store, prefix, &kind));
    } else {
      comm::NcclOptions n;
      n.rank = options_.rank;
      n.world_size = options_.world_size;
      n.device = options_.device.index;
      n.stream = backend_->native_stream();
      n.timeout = options_.collective_timeout;
      n.rendezvous_timeout = options_.collective_timeout;
      n.key_prefix = prefix + "/nccl";
      DEJA_ASSIGN_OR_RETURN(comm, comm::MakeNcclCommunicator(&store, n));
    }
    LOG(INFO) << "rank " << options_.rank << ": " << kind << " group of " << options_.world_size
              << " built (epoch " << epoch << ")";
  }
  if (Status s = LoadModelFiles(std::move(comm)); !s.ok()) {
    load_failed_.store(true);
    return s;
  }
  // On a device the KV block pool is the budget (--kv-memory-mb, or the fraction of free memory
  // asked for, in whole blocks).
  const uint64_t kv_budget = model_->kv_pool_bytes() > 0
                                 ? static_cast<uint64_t>(model_->kv_pool_bytes())
                                 : options_.kv_memory_bytes;
  std::unique_ptr<prefix::PrefixStore> prefix_store;
  if (options_.prefix_cache && model_->kv_pool() != nullptr) {
    if (Status s = OpenPrefixStore(&prefix_store); !s.ok()) {
      load_failed_.store(true);
      return s;
    }
  }
  DEJA_ASSIGN_OR_RETURN(engine_,
                        StepEngine::Create(model_.get(), kv_budget, std::move(prefix_store)));
  // Freed sequences' caches are kept for the next ones up to the budget the admission allows
  // (none are freed when the caches come from a pool).
  kv::SetKvTensorPoolLimit(model_->kv_pool_bytes() > 0 ? 0 : kv_budget);
  service_->loaded.store(true);
  LOG(INFO) << "rank " << options_.rank << ": shard of " << options_.model_dir << " loaded ("
            << model_->weight_bytes() << " weight bytes)";
  DEJA_RETURN_IF_ERROR(engine_->WarmUp().WithContext("warm-up step"));
  service_->warmed_up.store(true);
  LOG(INFO) << "rank " << options_.rank << ": warmed up, ready after "
            << std::chrono::duration<double>(Clock::now() - t0).count() << " s; KV budget "
            << kv_budget << " bytes, " << engine_->kv_bytes_per_token()
            << " bytes per cached position";
  return Status::Ok();
}

Status WorkerServer::LoadModelFiles(std::unique_ptr<comm::Communicator> comm) {
  DEJA_ASSIGN_OR_RETURN(
      model_, model::LoadModel(options_.model_dir, backend_.get(), std::move(comm), options_.load));
  if (options_.sparsity_requested()) {
    const model::SparsityOptions& so = options_.sparsity;
    DEJA_RETURN_IF_ERROR(model_->EnableSparsity(so).WithContext(
        so.predictors.empty() ? "enabling oracle sparsity"
                              : "loading the sparsity predictors " + so.predictors));
    service_->sparsity.store(true);
    LOG(INFO) << "rank " << options_.rank << ": Deja Vu sparsity enabled ("
              << (so.predictors.empty() ? "oracle, fraction " + std::to_string(so.oracle_fraction)
                                        : "predictors " + so.predictors)
              << "), default " << (options_.sparsity_default ? "on" : "off");
  }
  if (!options_.retaining_heads.empty()) {
    DEJA_RETURN_IF_ERROR(
        model_->EnableRetaining(options_.retaining_heads)
            .WithContext("loading the retaining heads " + options_.retaining_heads));
    service_->locret.store(true);
    LOG(INFO) << "rank " << options_.rank << ": Locret retaining heads "
              << options_.retaining_heads;
  }
  return Status::Ok();
}

Status WorkerServer::OpenPrefixStore(std::unique_ptr<prefix::PrefixStore>* out) {
  std::unique_ptr<prefix::BlockFiles> files;
  if (!options_.prefix_cache_dir.empty()) {
    // Files of another model, dtype, geometry or group shape never pass the layout check.
    const kv::KvGeometry g = model_->kv_geometry();
    const std::string layout = options_.model_dir + "|" + DTypeName(model_->weight_dtype()) +
                               "|" + DTypeName(g.kv_dtype) + "|" + std::to_string(g.layers) +
                               "x" + std::to_string(g.heads) + "x" + std::to_string(g.head_dim) +
                               "|" + std::to_string(model_->kv_block_slots()) + "|" +
                               std::to_string(options_.rank) + "/" +
                               std::to_string(options_.world_size) + "|importance-ordered";
    const std::string dir = options_.prefix_cache_dir + "/rank" + std::to_string(options_.rank);
    DEJA_ASSIGN_OR_RETURN(files, prefix::BlockFiles::Open(dir, std::hash<std::string>{}(layout)));
    service_->prefix_disk.store(true);
  }
  if (Status st = model_->SetPrefixImportance(options_.prefix_importance); !st.ok()) {
    return Status(st.code(), "--prefix-probe-heads: " + st.message());
  }
  *out = std::make_unique<prefix::PrefixStore>(model_->kv_pool(), std::move(files),
                                               options_.prefix_importance.reorder_files);
  service_->prefix_cache.store(true);
  LOG(INFO) << "rank " << options_.rank << ": prefix cache on"
            << (options_.prefix_cache_dir.empty()
                    ? ""
                    : ", disk tier in " + options_.prefix_cache_dir);
  return Status::Ok();
}

Status WorkerServer::Run() {
  if (options_.rank < 0 || options_.world_size < 1 || options_.rank >= options_.world_size) {
    return InvalidArgument("rank " + std::to_string(options_.rank) + " must be in [0, world " +
                           std::to_string(options_.world_size) + ")");
  }
  if (options_.kv_memory_bytes == 0) return InvalidArgument("the KV memory budget must be > 0");
  DEJA_ASSIGN_OR_RETURN(credentials_, proto::InternalCredentials::Load(options_.internal_tls));
  DEJA_RETURN_IF_ERROR(StartGrpc());
  StatusOr<uint64_t> epoch = Register();
  if (epoch.ok()) {
    service_->epoch.store(*epoch);
    LOG(INFO) << "rank " << options_.rank << ": registered with " << options_.coordinator
              << ", group epoch " << *epoch;
    if (!finished()) {
      if (Status s = LoadAndWarmUp(*epoch); !s.ok()) Finish(s);
    }
  } else if (epoch.status().code() != StatusCode::kCancelled) {
    Finish(epoch.status());
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (!done_ && options_.coordinator_timeout.count() > 0) {
    // The watch starts at warm-up: the coordinator polls every rank from then on.
    service_->Touch();
    const auto timeout = options_.coordinator_timeout;
    while (!cv_.wait_for(lock,
                         std::min<std::chrono::milliseconds>(timeout / 4, std::chrono::seconds(1)),
                         [&] { return done_; })) {
      const Clock::time_point last{Clock::duration(service_->last_call.load())};
      if (Clock::now() - last <= timeout) continue;
      lock.unlock();
      Finish(Unavailable("no call from the coordinator for " + std::to_string(timeout.count()) +
                         " ms (--coordinator-timeout-ms): it is gone; exiting so that a new "
                         "group can start"));
      lock.lock();
    }
  }
  cv_.wait(lock, [&] { return done_; });
  Status outcome = outcome_;
  lock.unlock();
  LOG(INFO) << "rank " << options_.rank << ": stopping (" << outcome.ToString() << ")";
  // Let an in-flight step answer; then cancel the long-lived Step stream.
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server_.reset();
  return outcome;
}

}  // namespace deja::worker::service
