#include "coordinator/coordinator.h"

#include <glog/logging.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "coordinator/internal_server.h"

namespace deja::coordinator {
namespace {

constexpr std::chrono::milliseconds kHealthPoll(50);

// The checkpoint dtype the workers keep weights in: config.json's "torch_dtype", or "dtype" as
// newer transformers write it; float32 when neither is given.
std::string WeightDtype(const std::string& model_dir, const OptConfig& config) {
  if (!config.torch_dtype.empty()) return config.torch_dtype;
  std::ifstream in(std::filesystem::path(model_dir) / "config.json");
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("dtype") && j["dtype"].is_string()) {
    return j["dtype"].get<std::string>();
  }
  return "float32";
}

}  // namespace

v1::ModelInfo MakeModelInfo(const std::string& model_dir, const OptConfig& config,
                            const Tokenizer& tokenizer, int tensor_parallel_size,
                            int32_t default_max_new_tokens, const v1::CachePolicy& default_cache) {
  v1::ModelInfo info;
  info.set_model_name(std::filesystem::path(model_dir).lexically_normal().filename().string());
  if (info.model_name().empty()) {
    info.set_model_name(
        std::filesystem::path(model_dir).lexically_normal().parent_path().filename().string());
  }
  info.set_vocab_size(static_cast<uint32_t>(config.vocab_size));
  info.set_max_position_embeddings(static_cast<uint32_t>(config.max_position_embeddings));
  info.set_hidden_size(static_cast<uint32_t>(config.hidden_size));
  info.set_num_layers(static_cast<uint32_t>(config.num_hidden_layers));
  info.set_num_attention_heads(static_cast<uint32_t>(config.num_attention_heads));
  info.set_ffn_dim(static_cast<uint32_t>(config.ffn_dim));
  info.set_tensor_parallel_size(static_cast<uint32_t>(tensor_parallel_size));
  info.set_dtype(WeightDtype(model_dir, config));
  *info.mutable_default_cache_policy() = default_cache;
  if (default_cache.kind() == v1::CachePolicy::KIND_UNSPECIFIED) {
    info.mutable_default_cache_policy()->set_kind(v1::CachePolicy::KIND_FULL);
  }
  // Until a worker group reports otherwise (GetModelInfo asks the engine).
  info.set_sparsity_available(false);
  info.set_default_max_new_tokens(static_cast<uint32_t>(default_max_new_tokens));
  info.set_version(DEJA_VERSION);
  info.set_bos_token_id(
      static_cast<uint32_t>(tokenizer.bos_id() >= 0 ? tokenizer.bos_id() : config.bos_token_id));
  info.set_eos_token_id(
      static_cast<uint32_t>(tokenizer.eos_id() >= 0 ? tokenizer.eos_id() : config.eos_token_id));
  return info;
}

StatusOr<std::unique_ptr<Coordinator>> Coordinator::Start(const CoordinatorOptions& options) {
  std::unique_ptr<Coordinator> c(new Coordinator(options));
  DEJA_RETURN_IF_ERROR(c->Init());
  return c;
}

Status Coordinator::Init() {
  const CoordinatorOptions& o = options_;
  if (o.tensor_parallel_size < 1) return InvalidArgument("--tp must be >= 1");
  if (o.scheduler.max_batch_sequences < 1 || o.scheduler.max_prefill_tokens < 1 ||
      o.scheduler.max_waiting < 0) {
    return InvalidArgument(
        "max batch sequences and max prefill tokens must be >= 1, the queue "
        "limit >= 0");
  }
  DEJA_ASSIGN_OR_RETURN(ServerSecurity security, LoadServerSecurity(o.security));
  auth_ = std::move(security.auth);
  DEJA_ASSIGN_OR_RETURN(config_, LoadOptConfig(o.model_dir));
  if (config_.num_attention_heads % o.tensor_parallel_size != 0 ||
      config_.ffn_dim % o.tensor_parallel_size != 0) {
    return InvalidArgument("tensor parallel size " + std::to_string(o.tensor_parallel_size) +
                           " must divide the model's " +
                           std::to_string(config_.num_attention_heads) + " heads and " +
                           std::to_string(config_.ffn_dim) + " ffn neurons");
  }
  DEJA_ASSIGN_OR_RETURN(tokenizer_, Tokenizer::Load(o.model_dir));

  ModelInfoLabels labels;
  labels.tensor_parallel_size = o.tensor_parallel_size;
  DEJA_RETURN_IF_ERROR(ValidateDefaultCachePolicy(o.default_cache));
  v1::ModelInfo info = MakeModelInfo(o.model_dir, config_, *tokenizer_, o.tensor_parallel_size,
                                     o.default_max_new_tokens, o.default_cache);
  labels.model = info.model_name();
  labels.dtype = info.dtype();
  metrics_ = std::make_unique<CoordinatorMetrics>(&registry_, labels);
  if (o.metrics_port >= 0) {
    metrics::MetricsServerOptions mo;
    mo.host = o.metrics_host.empty() ? o.host : o.metrics_host;
    mo.port = o.metrics_port;
    if (security.metrics_auth) {
      mo.authorize = [auth = auth_.get()](std::string_view a) { return auth->Allows(a); };
    }
    DEJA_ASSIGN_OR_RETURN(metrics_server_, metrics::MetricsServer::Start(&registry_, mo));
  }

  DEJA_ASSIGN_OR_RETURN(const proto::InternalCredentials internal_credentials,
                        proto::InternalCredentials::Load(o.internal_tls));
  rendezvous_ = std::make_unique<coordinator::RendezvousService>(
      o.tensor_parallel_size, o.group_secret, o.rendezvous_limits);
  WorkerGroupOptions go = o.group;
  go.world_size = o.tensor_parallel_size;
  go.group_secret = o.group_secret;
  go.credentials = internal_credentials;
  group_ = std::make_unique<WorkerGroup>(go, rendezvous_.get(), metrics_.get());

  EngineOptions eo;
  eo.scheduler = o.scheduler;
  eo.limits.vocab_size = static_cast<int32_t>(config_.vocab_size);
  eo.limits.max_positions = static_cast<int32_t>(config_.max_position_embeddings);
  eo.limits.bos_id = static_cast<int32_t>(info.bos_token_id());
  eo.limits.eos_id = static_cast<int32_t>(info.eos_token_id());
  eo.limits.default_max_new_tokens = o.default_max_new_tokens;
  eo.limits.default_cache = info.default_cache_policy();
  eo.limits.locret_chunk = o.locret_chunk;
  eo.limits.prefix_cache_default = o.prefix_cache_default;
  eo.limits.prefix_cache_salt_required = o.prefix_cache_salt_required;
  engine_ = std::make_unique<Engine>(eo, tokenizer_.get(), group_.get(), metrics_.get());
  service_ = std::make_unique<TextGenerationService>(engine_.get(), info, auth_.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  const std::string address = o.host + ":" + std::to_string(o.port);
  builder.AddListeningPort(address, security.credentials, &port_);
  // A port another process holds is an error, not a shared listener (SO_REUSEPORT would hand
  // the other server half of the new connections).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(service_.get());
  kserve_ = std::make_unique<KServeService>(engine_.get(), info.model_name(), auth_.get());
  builder.RegisterService(kserve_.get());
  server_ = builder.BuildAndStart();
  if (!server_ || port_ == 0) {
    return Unavailable("cannot listen on " + address + " (in use, or not an address of this host)");
  }
  DEJA_ASSIGN_OR_RETURN(InternalServer internal,
                        StartInternalServer(o.internal_host, o.internal_port, rendezvous_.get(),
                                            internal_credentials.Server()));
  internal_server_ = std::move(internal.server);
  internal_port_ = internal.port;
  if (o.group_secret.empty()) {
    LOG(WARNING) << "coordinator: the internal plane runs without a group secret: anyone who "
                    "reaches "
                 << rendezvous_address() << " can join the worker group";
  }
  if (o.http_port >= 0) {
    OpenAiOptions ao;
    ao.model = info.model_name();
    ao.max_model_len = static_cast<int32_t>(config_.max_position_embeddings);
    ao.auth = auth_.get();
    if (!o.chat_template_file.empty()) {
      DEJA_ASSIGN_OR_RETURN(ao.chat_template, ChatTemplate::Load(o.chat_template_file));
    }
    openai_ = std::make_unique<OpenAiService>(engine_.get(), std::move(ao));
    http::ServerOptions ho;
    ho.host = o.host;
    ho.port = o.http_port;
    ho.name = "openai";
    // Prompts (and token id lists) are larger than scrapes; long generations hold a reply open
    // without a deadline (each write has one).
    ho.max_body_bytes = size_t{8} << 20;
    ho.refusal = OpenAiService::Refusal;
    ho.max_header_bytes = 16384;
    // The API's certificate (and client CAs) on this port too.
    ho.tls_cert_chain = security.pem.cert_chain;
    ho.tls_private_key = security.pem.private_key;
    ho.tls_client_ca = security.client_ca;
    DEJA_ASSIGN_OR_RETURN(
        http_server_,
        http::HttpServer::StartAsync(ho, [svc = openai_.get()](const http::Request& r,
                                                               std::shared_ptr<http::Responder> w) {
          svc->Handle(r, std::move(w));
        }));
  }
  server_->GetHealthCheckService()->SetServingStatus(kReadinessService, false);
  health_ = std::thread([this] { HealthLoop(); });
  LOG(INFO) << "coordinator: serving " << info.model_name() << " (TP " << o.tensor_parallel_size
            << ") on " << o.host << ":" << port_ << ", OpenAI API on port " << http_port()
            << ", metrics on port " << metrics_port()
            << ", internal plane on " << o.internal_host << ":" << internal_port_
            << (internal_credentials.tls() ? " (mutual TLS)" : "") << "; waiting for "
            << o.tensor_parallel_size << " workers to register";
  return Status::Ok();
}

Coordinator::~Coordinator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (health_.joinable()) health_.join();
  if (server_) server_->GetHealthCheckService()->SetServingStatus(false);
  if (rendezvous_) rendezvous_->Shutdown();
  if (engine_) engine_->FailAll(Unavailable("the server is shutting down"));
  // Its handlers hold the engine; the errors above went out where their connections allowed.
  if (http_server_) http_server_->WaitIdle(std::chrono::seconds(1));
  http_server_.reset();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  if (internal_server_) {
    internal_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  // Members go in reverse order: internal server, server, service, engine, group, rendezvous,
  // metrics.
}

std::string Coordinator::rendezvous_address() const {
  const std::string& h = options_.internal_host;
  const bool any = h.empty() || h == "0.0.0.0" || h == "[::]" || h == "::";
  return (any ? std::string("127.0.0.1") : h) + ":" + std::to_string(internal_port_);
}

bool Coordinator::Drain() {
  engine_->StartDrain();
  server_->GetHealthCheckService()->SetServingStatus(kReadinessService, false);
  LOG(INFO) << "coordinator: draining, up to " << options_.drain_timeout.count() << " ms";
  const bool drained = engine_->WaitIdle(options_.drain_timeout);
  if (!drained) {
    LOG(WARNING) << "coordinator: drain timed out; failing the requests left";
    engine_->FailAll(Unavailable("the server shut down before the request finished"));
  }
  // The last HTTP replies leave the server before it stops.
  if (http_server_) http_server_->WaitIdle(std::chrono::seconds(5));
  if (drained) {
    LOG(INFO) << "coordinator: drained";
  }
  return drained;
}

void Coordinator::HealthLoop() {
  bool serving = false;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    const bool ready = engine_->Ready();
    if (ready != serving) {
      serving = ready;
      server_->GetHealthCheckService()->SetServingStatus(kReadinessService, ready);
      const GroupState g = engine_->group();
      LOG(INFO) << "coordinator: readiness " << (ready ? "SERVING" : "NOT_SERVING")
                << (ready
                        ? ""
                        : " (" + (engine_->draining() ? std::string("draining") : g.reason) + ")");
    }
    cv_.wait_for(lock, kHealthPoll);
  }
}

}  // namespace deja::coordinator
