// Flags and set-up shared by the subcommands that load a model in this process.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/args.h"
#include "kernels/backend.h"
#include "worker/kv/eviction_policy.h"
#include "worker/model/model.h"
#include "worker/prefix/importance.h"
#include "worker/sampling/sampler.h"

namespace deja::cli {

// --model, --threads and --dtype.
void AddModelFlags(Args& args);
// --dtype checkpoint|bf16, --kv-dtype f32|f16|int8, --device cpu|cuda[:N] and --kv-memory-fraction
// (also the worker's and serve's flags), and their parse; InvalidArgument naming the flag.
void AddDtypeFlag(Args& args);
StatusOr<worker::model::LoadOptions> LoadOptionsFromFlags(const Args& args);
// --device: "cpu" (the host), "cuda" (cuda:0) or "cuda:N".
StatusOr<Device> DeviceFromFlags(const Args& args);
// "cpu", "cuda" or "cuda:N"; InvalidArgument naming --device otherwise.
StatusOr<Device> ParseDevice(const std::string& device);
// The --device of each of `world` ranks: `device` itself for CPU ranks; GPUs from --gpus (a
// comma-separated list, one distinct GPU per rank) or rank r on GPU r (the named one at --tp 1).
StatusOr<std::vector<std::string>> RankDevices(const Device& device, const std::string& gpus,
                                               int world);
// The backend of `device`: the CPU backend with `threads` threads, or the CUDA backend, which
// fails (FailedPrecondition naming --device and the CUDA reason) where no usable GPU is; never a
// silent CPU fallback.
StatusOr<std::unique_ptr<kernels::Backend>> MakeBackend(const Device& device, int threads);
void AddSamplingFlags(Args& args);
StatusOr<worker::sampling::SamplingParams> SamplingFromFlags(const Args& args);

// --kv-policy (default `default_kind`, nullopt = unset), --heavy/recent-ratio,
// --heavy/recent-tokens.
void AddCachePolicyFlags(Args& args, std::optional<worker::kv::CachePolicyKind> default_kind);
StatusOr<worker::kv::CachePolicyConfig> CachePolicyFromFlags(const Args& args);

// Deja Vu sparsity of a serving worker: --predictors, --sparsity-oracle, --sparsity-default.
struct SparsityFlags {
  worker::model::SparsityOptions options;  // predictors / oracle_fraction as given
  // Predictors or oracle mode set: the worker calls OptModel::EnableSparsity.
  bool enabled = false;
  // What a request leaving Sparsity.mode unspecified gets (on by default when enabled).
  bool default_on = false;
  // The flags again, for the worker processes `deja serve` launches ("" / 0 when unset).
  std::string predictors;
  std::string oracle;
  std::string default_flag;
};
// "a,b,c" as numbers; InvalidArgument naming --`flag` for an empty list or a non-number.
StatusOr<std::vector<double>> ParseNumberList(const std::string& s, const char* flag);

// Important-token loading of cached prefixes read from the host or disk tier (the worker's and
// serve's flags): --prefix-kept-fraction, --prefix-alpha, --prefix-probe-heads,
// --prefix-dense-layers. The heads are checked against the model's by the worker.
void AddPrefixImportanceFlags(Args& args);
StatusOr<worker::prefix::ImportanceOptions> PrefixImportanceFromFlags(const Args& args);
// The same flags again, for the worker processes `deja serve` launches.
std::vector<std::string> PrefixImportanceArgs(const Args& args);

// `deja worker --retaining-heads`: the path to load ("" for none): auto is
// <model>/retaining.safetensors when that file exists, none is "".
StatusOr<std::string> RetainingHeadsPath(const Args& args);

// --retaining-heads (`deja-lab ppl`, `deja generate`), and loading them into `model` when the policy
// is locret (InvalidArgument for the flag with another policy).
void AddRetainingFlag(Args& args);
Status EnableRetainingFromFlags(const Args& args, const worker::kv::CachePolicyConfig& cache,
                                worker::model::Model& model);

void AddSparsityFlags(Args& args);
// InvalidArgument naming the flag: a predictor file (or its .json) that does not exist, an
// oracle fraction outside (0, 1], both set, --sparsity-default not a name of
// coordinator/sparsity_mode.h, or on without predictors or oracle.
StatusOr<SparsityFlags> SparsityFromFlags(const Args& args);

struct LoadedModel {
  std::unique_ptr<kernels::Backend> backend;
  std::unique_ptr<worker::model::Model> model;
};
// kv_pool_mb > 0: the KV caches come from a block pool of that size (paged, as a worker's).
StatusOr<LoadedModel> LoadModelFromFlags(const Args& args, int64_t kv_pool_mb = 0);

// Reads a whole file; NotFound naming it.
StatusOr<std::string> ReadFile(const std::string& path);

}  // namespace deja::cli
