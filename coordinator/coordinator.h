// Coordinator: the public endpoint as one object. Loads the tokenizer and config (no weights),
// hosts deja.v1.TextGeneration, KServe v2's inference.GRPCInferenceService, grpc.health.v1 and
// server reflection on the public gRPC port,
// the workers' Rendezvous on an internal one (coordinator/internal_server.h), Prometheus
// /metrics on a third, the OpenAI-compatible HTTP API on a fourth (off unless http_port is set),
// and owns the engine and the worker group.
//
// Health: the empty service name is liveness (SERVING while the process runs);
// "deja.v1.TextGeneration" is readiness: SERVING only while every rank is connected and warmed
// up and the coordinator is not draining.
#pragma once

#include <grpcpp/server.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/opt_config.h"
#include "common/status.h"
#include "common/tokenizer.h"
#include "coordinator/engine.h"
#include "coordinator/grpc_service.h"
#include "coordinator/kserve_service.h"
#include "coordinator/metrics.h"
#include "coordinator/openai_service.h"
#include "coordinator/rendezvous_service.h"
#include "coordinator/security.h"
#include "coordinator/validation.h"
#include "coordinator/worker_group.h"
#include "http/http_server.h"
#include "metrics/metrics_server.h"
#include "metrics/registry.h"

namespace deja::coordinator {

inline constexpr const char* kReadinessService = "deja.v1.TextGeneration";

inline v1::CachePolicy FullCachePolicy() {
  v1::CachePolicy c;
  c.set_kind(v1::CachePolicy::KIND_FULL);
  return c;
}

struct CoordinatorOptions {
  std::string model_dir;
  int tensor_parallel_size = 1;
  // gRPC address; port 0 picks a free one (see Coordinator::port()).
  std::string host = "127.0.0.1";
  int port = 0;
  // The internal plane: the workers' Rendezvous; port 0 picks a free one (internal_port()).
  std::string internal_host = "127.0.0.1";
  int internal_port = 0;
  // Required of the workers' Rendezvous calls and sent on the coordinator's Worker calls
  // (proto/internal_plane.h); empty runs the internal plane without one.
  std::string group_secret;
  // Mutual TLS of the internal listener and of the calls to the workers; none: plaintext.
  proto::InternalTlsFiles internal_tls;
  RendezvousLimits rendezvous_limits;
  // Prometheus /metrics; port 0 picks a free one, -1 disables it. An empty host binds the API's.
  std::string metrics_host;
  int metrics_port = 0;
  // The OpenAI-compatible HTTP API (coordinator/openai_service.h) on the API's host; port 0
  // picks a free one (http_port()), -1 (the default here; `deja serve` defaults to 8000)
  // disables it. A chat template file (coordinator/chat_template.h); empty: the default.
  int http_port = -1;
  std::string chat_template_file;
  SchedulerOptions scheduler;
  int32_t default_max_new_tokens = 256;
  // The KV-cache policy of requests that leave CachePolicy.kind unset (and the budgets of those
  // that name its kind without them): `deja serve --kv-policy`. Checked by Start().
  v1::CachePolicy default_cache = FullCachePolicy();
  // Prompt tokens per step for a locret sequence (its workers reserve budget + this).
  int32_t locret_chunk = 64;
  // What PrefixCache.MODE_UNSPECIFIED means (the tiers' budgets are in scheduler).
  bool prefix_cache_default = true;
  // Requests that use the prefix cache must carry a cache_salt.
  bool prefix_cache_salt_required = false;
  WorkerGroupOptions group;  // world_size is taken from tensor_parallel_size
  // How long a drain lets admitted requests finish before failing them with UNAVAILABLE.
  std::chrono::milliseconds drain_timeout{30000};
  // TLS and bearer tokens of the API (and /metrics); checked by Start() before anything else.
  SecurityOptions security;
};

class Coordinator {
 public:
  static StatusOr<std::unique_ptr<Coordinator>> Start(const CoordinatorOptions& options);
  // Stops serving at once (requests left fail with UNAVAILABLE).
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  int port() const { return port_; }
  int internal_port() const { return internal_port_; }
  int metrics_port() const { return metrics_server_ ? metrics_server_->port() : -1; }
  int http_port() const { return http_server_ ? http_server_->port() : -1; }
  // host:port of the internal listener, the workers' --coordinator (loopback when it listens on
  // every interface).
  std::string rendezvous_address() const;

  Engine& engine() { return *engine_; }
  WorkerGroup& group() { return *group_; }
  metrics::Registry& registry() { return registry_; }

  // Graceful drain: readiness NOT_SERVING, new requests UNAVAILABLE, admitted requests finish
  // up to drain_timeout, the rest fail with UNAVAILABLE. Returns true when all finished.
  bool Drain();
  // Sends the workers a shutdown step (they exit 0).
  Status ShutdownWorkers() { return group_->ShutdownWorkers(); }

 private:
  explicit Coordinator(const CoordinatorOptions& options) : options_(options) {}
  Status Init();
  void HealthLoop();

  CoordinatorOptions options_;
  std::unique_ptr<BearerAuth> auth_;  // null without --auth-token-file
  std::unique_ptr<Tokenizer> tokenizer_;
  OptConfig config_;
  metrics::Registry registry_;
  std::unique_ptr<CoordinatorMetrics> metrics_;
  std::unique_ptr<metrics::MetricsServer> metrics_server_;
  std::unique_ptr<coordinator::RendezvousService> rendezvous_;
  std::unique_ptr<WorkerGroup> group_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<TextGenerationService> service_;
  std::unique_ptr<KServeService> kserve_;
  std::unique_ptr<OpenAiService> openai_;
  std::unique_ptr<http::HttpServer> http_server_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> internal_server_;
  int internal_port_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread health_;
};

// The ModelInfo of a served model.
v1::ModelInfo MakeModelInfo(const std::string& model_dir, const OptConfig& config,
                            const Tokenizer& tokenizer, int tensor_parallel_size,
                            int32_t default_max_new_tokens,
                            const v1::CachePolicy& default_cache = FullCachePolicy());

}  // namespace deja::coordinator
