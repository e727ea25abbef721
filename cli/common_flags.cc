#include "cli/common_flags.h"

#include <glog/logging.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "common/enum_table.h"
#include "coordinator/sparsity_mode.h"
#include "kernels/cpu/bf16_dot.h"
#include "worker/kv/policy_table.h"

namespace deja::cli {
namespace {

// --dtype: the matrices' dtype in memory. `checkpoint` keeps the file's, as views into the
// mmapped file; another value converts them at load (ConvertMatrices takes bf16).
struct WeightDTypeRow {
  const char* name;
  const char* help;
  std::optional<DType> dtype;
  bool automatic = false;
};
const WeightDTypeRow kWeightDTypes[] = {
    {"auto",
     "the fastest for the device: bf16 on GPUs and on CPUs with AVX512-BF16, else as stored",
     std::nullopt, true},
    {"checkpoint", "as stored", std::nullopt},
    {DTypeName(DType::kBF16),
     "converted at load; activations meet them as bf16, with AVX512-BF16 dot products where the "
     "CPU has them",
     DType::kBF16},
    {DTypeName(DType::kI8),
     "weight-only int8, quantized at load per output channel (half of bf16's bytes; on a GPU "
     "on the host as the weights stream to it); on the CPU activations meet them as bf16, "
     "except on CPUs with AVX512-VNNI, which quantize each token's activations to int8 "
     "(DEJA_CPU_VNNI=0: bf16)",
     DType::kI8},
    {DTypeName(DType::kI4),
     "CPU only: the layers' matrices int4 in groups of --int4-group (a quarter of bf16's "
     "bytes), each token's activations quantized to int8; a matrix whose int4 error exceeds "
     "--int4-max-error, the embeddings and the lm head int8",
     DType::kI4},
};

// --kv-dtype: how K and V are stored (the attention kernels read f32, f16 and, on the CPU, int8).
struct KvDTypeRow {
  const char* name;
  const char* help;
  DType dtype;
  bool automatic = false;
};
const KvDTypeRow kKvDTypes[] = {
    {"auto", "f16 where the device's attention reads it (every backend today), else f32",
     DType::kF16, true},
    {DTypeName(DType::kF32), "", DType::kF32},
    {DTypeName(DType::kF16), "half the bytes per cached token", DType::kF16},
    {DTypeName(DType::kI8),
     "CPU only: int8 with a scale per token and head, a quarter of f32's bytes and just over "
     "half of f16's",
     DType::kI8},
};

}  // namespace

void AddModelFlags(Args& args) {
  args.Flag("model", "model directory (HF OPT checkpoint: config.json, safetensors, tokenizer)",
            "", true)
      .Flag("threads", "CPU threads (0 = one per core)", "0");
  AddDtypeFlag(args);
}

void AddDtypeFlag(Args& args) {
  args.Flag("dtype", "weights in memory: " + RowsHelp(kWeightDTypes), kWeightDTypes[0].name)
      .Flag("kv-dtype", "KV cache storage: " + RowsHelp(kKvDTypes), kKvDTypes[0].name)
      .Flag("device", "where the model runs: cpu, cuda (cuda:0) or cuda:N", "cpu")
      .Flag("kv-memory-fraction",
            "on a GPU: the share of its memory free after the weights that the KV block pool "
            "takes (default 0.8; a worker's explicit fraction overrides its --kv-memory-mb)",
            "")
      .Flag("decode-attention",
            "on a GPU: a decode step's KV writes and attention as one call per layer over "
            "every sequence (batched), or one write and attention per sequence (per-sequence, "
            "for comparisons)",
            "batched")
      .Flag("cuda-graphs",
            "on a GPU: run decode steps (one new token per sequence, batch padded to a power of "
            "two) as captured CUDA graphs, replayed step after step (on), or launch every kernel "
            "(off)",
            "on")
      .Flag("int4-group", "--dtype int4: K values per scale (a multiple of 8)", "128")
      .Flag("int4-max-error",
            "--dtype int4: a matrix whose relative error sqrt(sum (q - w)^2 / sum w^2) exceeds "
            "this stays int8",
            "0.15");
}

StatusOr<Device> ParseDevice(const std::string& d) {
  if (d == "cpu") return Device::Host();
  if (d == "cuda") return Device::Cuda(0);
  if (d.rfind("cuda:", 0) == 0 && d.size() > 5 && d.size() <= 8 &&
      d.find_first_not_of("0123456789", 5) == std::string::npos) {
    return Device::Cuda(std::stoi(d.substr(5)));
  }
  return InvalidArgument("--device must be cpu, cuda or cuda:N, not '" + d + "'");
}

StatusOr<Device> DeviceFromFlags(const Args& args) { return ParseDevice(args.Str("device")); }

StatusOr<std::vector<std::string>> RankDevices(const Device& device, const std::string& gpus,
                                               int world) {
  if (device.is_host()) {
    if (!gpus.empty()) return InvalidArgument("--gpus needs --device cuda");
    return std::vector<std::string>(static_cast<size_t>(world), "cpu");
  }
  std::vector<int> ids;
  if (gpus.empty()) {
    if (world > 1 && device.index != 0) {
      return InvalidArgument("--device " + device.ToString() + " with --tp " +
                             std::to_string(world) +
                             ": name each rank's GPU with --gpus (e.g. --gpus 0,1)");
    }
    for (int r = 0; r < world; ++r) ids.push_back(world == 1 ? device.index : r);
  } else {
    size_t begin = 0;
    while (begin <= gpus.size()) {
      size_t end = gpus.find(',', begin);
      if (end == std::string::npos) end = gpus.size();
      const std::string item = gpus.substr(begin, end - begin);
      if (item.empty() || item.size() > 3 ||
          item.find_first_not_of("0123456789") != std::string::npos) {
        return InvalidArgument("--gpus must be comma-separated GPU numbers, not '" + gpus + "'");
      }
      const int id = std::stoi(item);
      if (std::find(ids.begin(), ids.end(), id) != ids.end()) {
        return InvalidArgument("--gpus names GPU " + item + " twice (one rank per GPU)");
      }
      ids.push_back(id);
      begin = end + 1;
    }
    if (static_cast<int>(ids.size()) != world) {
      return InvalidArgument("--gpus names " + std::to_string(ids.size()) + " GPUs for --tp " +
                             std::to_string(world) + " ranks");
    }
  }
  std::vector<std::string> out;
  for (int id : ids) out.push_back("cuda:" + std::to_string(id));
  return out;
}

StatusOr<std::unique_ptr<kernels::Backend>> MakeBackend(const Device& device, int threads) {
  if (device.is_host()) return kernels::MakeCpuBackend(threads);
  StatusOr<std::unique_ptr<kernels::Backend>> b = kernels::MakeCudaBackend(device.index);
  if (!b.ok()) {
    return FailedPrecondition("--device " + device.ToString() +
                              " is not usable: " + b.status().ToString());
  }
  return b;
}

StatusOr<worker::model::LoadOptions> LoadOptionsFromFlags(const Args& args) {
  worker::model::LoadOptions o;
  DEJA_ASSIGN_OR_RETURN(const WeightDTypeRow* weights,
                        ParseRow(kWeightDTypes, args.Str("dtype"), "--dtype"));
  DEJA_ASSIGN_OR_RETURN(const KvDTypeRow* kv,
                        ParseRow(kKvDTypes, args.Str("kv-dtype"), "--kv-dtype"));
  DEJA_ASSIGN_OR_RETURN(Device device, DeviceFromFlags(args));
  o.weight_dtype = weights->dtype;
  o.kv_dtype = kv->dtype;
  // auto: bf16 weights where the device multiplies them fastest (GPU tensor cores, AVX512-BF16
  // dot products; elsewhere bf16 only adds a rounding of the activations), f16 K/V (half the
  // bytes; within 0.01% of f32's perplexity on the fixture).
  std::string why;
  if (weights->automatic) {
    const bool bf16 = !device.is_host() || kernels::cpu::Bf16DotAvailable();
    if (bf16) o.weight_dtype = DType::kBF16;
    why = bf16 ? (device.is_host() ? "bf16 weights (this CPU has AVX512-BF16)"
                                   : "bf16 weights (" + device.ToString() + ")")
               : "weights as stored (this CPU has no AVX512-BF16)";
  }
  if (kv->automatic) {
    why += std::string(why.empty() ? "" : ", ") + "f16 KV cache";
  }
  if (!why.empty()) LOG(INFO) << "--dtype/--kv-dtype auto: " << why;
  const std::string decode = args.Str("decode-attention");
  if (decode != "batched" && decode != "per-sequence") {
    return InvalidArgument("--decode-attention must be batched or per-sequence, got " + decode);
  }
  o.batched_decode_attention = decode == "batched";
  const std::string graphs = args.Str("cuda-graphs");
  if (graphs != "on" && graphs != "off") {
    return InvalidArgument("--cuda-graphs must be on or off, got " + graphs);
  }
  o.decode_graphs = graphs == "on";
  DEJA_ASSIGN_OR_RETURN(int64_t group, args.Int("int4-group"));
  if (group <= 0 || group % 8 != 0 || group > (1 << 16)) {
    return InvalidArgument("--int4-group must be a positive multiple of 8, got " +
                           args.Str("int4-group"));
  }
  o.int4_group = static_cast<int32_t>(group);
  DEJA_ASSIGN_OR_RETURN(o.int4_max_error, args.Double("int4-max-error"));
  if (!(o.int4_max_error >= 0.0)) {
    return InvalidArgument("--int4-max-error must be >= 0, got " + args.Str("int4-max-error"));
  }
  if (o.weight_dtype == DType::kI4 && !device.is_host()) {
    return InvalidArgument("--dtype int4 runs on the CPU only (no CUDA kernel yet), not on " +
                           device.ToString());
  }
  if (!args.Str("kv-memory-fraction").empty()) {
    DEJA_ASSIGN_OR_RETURN(double f, args.Double("kv-memory-fraction"));
    if (!(f > 0.0 && f < 1.0)) {
      return InvalidArgument("--kv-memory-fraction must be in (0, 1), got " +
                             args.Str("kv-memory-fraction"));
    }
    o.kv_memory_fraction = static_cast<float>(f);
  }
  return o;
}

void AddSamplingFlags(Args& args) {
  args.Bool("do-sample", "sample instead of greedy decoding")
      .Flag("temperature", "sampling temperature (> 0 with --do-sample)", "1.0")
      .Flag("top-k", "keep the k most likely tokens (0 = off)", "0")
      .Flag("top-p", "nucleus sampling mass in (0, 1]", "1.0")
      .Flag("repetition-penalty", "CTRL-style penalty (> 0; 1 = off)", "1.0")
      .Flag("seed", "sampling seed", "0")
      .Flag("top-n", "alternatives reported per token (0..5)", "0");
}

StatusOr<worker::sampling::SamplingParams> SamplingFromFlags(const Args& args) {
  worker::sampling::SamplingParams p;
  p.do_sample = args.On("do-sample");
  DEJA_ASSIGN_OR_RETURN(double t, args.Double("temperature"));
  DEJA_ASSIGN_OR_RETURN(int64_t k, args.Int("top-k"));
  DEJA_ASSIGN_OR_RETURN(double tp, args.Double("top-p"));
  DEJA_ASSIGN_OR_RETURN(double rp, args.Double("repetition-penalty"));
  DEJA_ASSIGN_OR_RETURN(int64_t seed, args.Int("seed"));
  DEJA_ASSIGN_OR_RETURN(int64_t n, args.Int("top-n"));
  p.temperature = static_cast<float>(t);
  p.top_k = static_cast<int32_t>(k);
  p.top_p = static_cast<float>(tp);
  p.repetition_penalty = static_cast<float>(rp);
  p.seed = static_cast<uint64_t>(seed);
  p.top_n = static_cast<int32_t>(n);
  DEJA_RETURN_IF_ERROR(p.Validate());
  return p;
}

void AddCachePolicyFlags(Args& args, std::optional<worker::kv::CachePolicyKind> default_kind) {
  args.Flag("kv-policy", "KV cache policy: " + RowsHelp(worker::kv::CachePolicyTable()),
            default_kind ? worker::kv::CachePolicyName(*default_kind) : "")
      .Flag("heavy-ratio", "h2o heavy-hitter budget as a ratio of the prompt length", "0.1")
      .Flag("recent-ratio", "recent-token budget as a ratio of the prompt length", "0.1")
      .Flag("heavy-tokens", "absolute heavy-hitter budget per head (with --recent-tokens)")
      .Flag("recent-tokens", "absolute recent-token budget per head (with --heavy-tokens)")
      .Flag("h2o-decay",
            "with --kv-policy h2o: each step multiplies the accumulated scores by this factor, in "
            "(0, 1], before adding the step's attention (1: the reference's plain sum)",
            "1");
}

StatusOr<worker::kv::CachePolicyConfig> CachePolicyFromFlags(const Args& args) {
  worker::kv::CachePolicyConfig c;
  DEJA_ASSIGN_OR_RETURN(c.kind, worker::kv::ParseCachePolicy(args.Str("kv-policy"), "--kv-policy"));
  DEJA_ASSIGN_OR_RETURN(double heavy, args.Double("heavy-ratio"));
  DEJA_ASSIGN_OR_RETURN(double recent, args.Double("recent-ratio"));
  c.heavy_ratio = static_cast<float>(heavy);
  c.recent_ratio = static_cast<float>(recent);
  if (args.Has("heavy-tokens") || args.Has("recent-tokens")) {
    if (!args.Has("heavy-tokens") || !args.Has("recent-tokens")) {
      return InvalidArgument("--heavy-tokens and --recent-tokens go together");
    }
    DEJA_ASSIGN_OR_RETURN(int64_t ht, args.Int("heavy-tokens"));
    DEJA_ASSIGN_OR_RETURN(int64_t rt, args.Int("recent-tokens"));
    if (ht < 0 || rt < 0 || ht > (1 << 20) || rt > (1 << 20)) {
      return InvalidArgument("--heavy-tokens and --recent-tokens must be in [0, 2^20]");
    }
    c.heavy_tokens = static_cast<int32_t>(ht);
    c.recent_tokens = static_cast<int32_t>(rt);
  }
  DEJA_ASSIGN_OR_RETURN(double decay, args.Double("h2o-decay"));
  if (!(decay > 0.0 && decay <= 1.0)) return InvalidArgument("--h2o-decay must be in (0, 1]");
  if (decay != 1.0 && !worker::kv::CachePolicyOf(c.kind).decays) {
    return InvalidArgument("--h2o-decay applies to --kv-policy h2o only");
  }
  c.h2o_decay = static_cast<float>(decay);
  DEJA_RETURN_IF_ERROR(c.Validate());
  return c;
}

StatusOr<std::vector<double>> ParseNumberList(const std::string& s, const char* flag) {
  std::vector<double> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      size_t used = 0;
      out.push_back(std::stod(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (...) {
      return InvalidArgument(std::string("--") + flag + ": '" + item + "' is not a number");
    }
  }
  if (out.empty()) return InvalidArgument(std::string("--") + flag + " is empty");
  return out;
}

void AddPrefixImportanceFlags(Args& args) {
  args.Flag("prefix-kept-fraction",
            "important-token loading: the fraction of a cached prefix each layer keeps", "0.5")
      .Flag("prefix-alpha",
            "important-token loading: exponent of the probe heads' agreement threshold "
            "(mean Jaccard >= (f / (2 - f))^alpha, f the kept fraction)",
            "0.6")
      .Flag("prefix-probe-heads",
            "important-token loading: each rank's probe heads, comma-separated", "0,1,2")
      .Flag("prefix-dense-layers",
            "important-token loading: the first layers, which load the whole prefix", "1")
      .Flag("prefix-file-order",
            "important-token loading: `importance` (block files rewritten in the background with "
            "their most often chosen tokens first, read contiguously) or `position`",
            "importance");
}

StatusOr<worker::prefix::ImportanceOptions> PrefixImportanceFromFlags(const Args& args) {
  worker::prefix::ImportanceOptions o;
  DEJA_ASSIGN_OR_RETURN(double kept, args.Double("prefix-kept-fraction"));
  DEJA_ASSIGN_OR_RETURN(double alpha, args.Double("prefix-alpha"));
  DEJA_ASSIGN_OR_RETURN(int64_t dense, args.Int("prefix-dense-layers"));
  DEJA_ASSIGN_OR_RETURN(std::vector<double> probes,
                        ParseNumberList(args.Str("prefix-probe-heads"), "prefix-probe-heads"));
  if (!(kept > 0.0 && kept <= 1.0)) {
    return InvalidArgument("--prefix-kept-fraction must be in (0, 1]");
  }
  if (!(alpha >= 0.0 && alpha <= 16.0)) return InvalidArgument("--prefix-alpha must be in [0, 16]");
  if (dense < 0 || dense > 1 << 20) return InvalidArgument("--prefix-dense-layers must be >= 0");
  o.kept_fraction = static_cast<float>(kept);
  o.alpha = static_cast<float>(alpha);
  o.dense_layers = static_cast<int32_t>(dense);
  const std::string order = args.Str("prefix-file-order");
  if (order != "importance" && order != "position") {
    return InvalidArgument("--prefix-file-order must be importance or position, not " + order);
  }
  o.reorder_files = order == "importance";
  o.probe_heads.clear();
  for (double h : probes) {
    if (h < 0 || h > 1 << 20 || h != std::floor(h)) {
      return InvalidArgument("--prefix-probe-heads: " + std::to_string(h) + " is not a head index");
    }
    o.probe_heads.push_back(static_cast<int32_t>(h));
  }
  return o;
}

std::vector<std::string> PrefixImportanceArgs(const Args& args) {
  std::vector<std::string> out;
  for (const char* flag : {"prefix-kept-fraction", "prefix-alpha", "prefix-probe-heads",
                           "prefix-dense-layers", "prefix-file-order"}) {
    out.push_back(std::string("--") + flag);
    out.push_back(args.Str(flag));
  }
  return out;
}

StatusOr<std::string> RetainingHeadsPath(const Args& args) {
  const std::string v = args.Str("retaining-heads");
  if (v == "none") return std::string();
  if (v == "auto") {
    const std::string path = args.Str("model") + "/retaining.safetensors";
    std::error_code ec;
    return std::filesystem::exists(path, ec) ? path : std::string();
  }
  return v;
}

void AddRetainingFlag(Args& args) {
  args.Flag("retaining-heads",
            "with --kv-policy locret: the retaining heads (safetensors, its .json beside it) "
            "[default: <model>/retaining.safetensors]");
}

Status EnableRetainingFromFlags(const Args& args, const worker::kv::CachePolicyConfig& cache,
                                worker::model::Model& model) {
  if (!worker::kv::CachePolicyOf(cache.kind).retaining_heads) {
    if (args.Has("retaining-heads")) {
      return InvalidArgument("--retaining-heads goes with --kv-policy locret");
    }
    return Status::Ok();
  }
  const std::string path = args.Has("retaining-heads")
                               ? args.Str("retaining-heads")
                               : args.Str("model") + "/retaining.safetensors";
  return model.EnableRetaining(path).WithContext("--retaining-heads");
}

void AddSparsityFlags(Args& args) {
  args.Flag("predictors",
            "Deja Vu predictor safetensors (its .json schedule beside it); enables sparsity")
      .Flag("sparsity-oracle",
            "speed runs without predictors: keep this fraction in (0, 1] of heads and neurons, "
            "chosen pseudo-randomly per token (quality is not meaningful)")
      .Flag("sparsity-default",
            OneOf(RowNames(coordinator::SparsityModeTable())) +
                ": sparsity for requests that leave Sparsity.mode unspecified [default: on when "
                "--predictors or --sparsity-oracle is given]");
}

StatusOr<SparsityFlags> SparsityFromFlags(const Args& args) {
  SparsityFlags f;
  if (args.Has("predictors")) {
    f.predictors = args.Str("predictors");
    if (f.predictors.empty()) return InvalidArgument("--predictors must name a file");
    std::error_code ec;
    if (!std::filesystem::is_regular_file(f.predictors, ec)) {
      return InvalidArgument("--predictors: " + f.predictors + " is not a readable file");
    }
    const std::string meta =
        std::filesystem::path(f.predictors).replace_extension(".json").string();
    if (!std::filesystem::is_regular_file(meta, ec)) {
      return InvalidArgument("--predictors: the schedule " + meta + " that goes with " +
                             f.predictors + " does not exist");
    }
    f.options.predictors = f.predictors;
  }
  if (args.Has("sparsity-oracle")) {
    DEJA_ASSIGN_OR_RETURN(double fraction, args.Double("sparsity-oracle"));
    if (!(fraction > 0.0 && fraction <= 1.0) || !std::isfinite(fraction)) {
      return InvalidArgument("--sparsity-oracle must be in (0, 1], got " +
                             args.Str("sparsity-oracle"));
    }
    if (!f.predictors.empty()) {
      return InvalidArgument("--sparsity-oracle and --predictors exclude each other");
    }
    f.oracle = args.Str("sparsity-oracle");
    f.options.oracle_fraction = static_cast<float>(fraction);
  }
  f.enabled = !f.predictors.empty() || f.options.oracle_fraction > 0.0f;
  f.default_on = f.enabled;
  if (args.Has("sparsity-default")) {
    f.default_flag = args.Str("sparsity-default");
    DEJA_ASSIGN_OR_RETURN(f.default_on,
                          coordinator::ParseSparsity(f.default_flag, "--sparsity-default"));
    if (f.default_on && !f.enabled) {
      return InvalidArgument("--sparsity-default on needs --predictors or --sparsity-oracle");
    }
  }
  return f;
}

StatusOr<LoadedModel> LoadModelFromFlags(const Args& args, int64_t kv_pool_mb) {
  LoadedModel m;
  DEJA_ASSIGN_OR_RETURN(int64_t threads, args.Int("threads"));
  DEJA_ASSIGN_OR_RETURN(worker::model::LoadOptions load, LoadOptionsFromFlags(args));
  if (kv_pool_mb > 0) {
    load.kv_paged = true;
    load.kv_memory_bytes = kv_pool_mb << 20;
  }
  DEJA_ASSIGN_OR_RETURN(Device device, DeviceFromFlags(args));
  DEJA_ASSIGN_OR_RETURN(m.backend, MakeBackend(device, static_cast<int>(threads)));
  DEJA_ASSIGN_OR_RETURN(
      m.model, worker::model::LoadModel(args.Str("model"), m.backend.get(), nullptr, load));
  return m;
}

StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot read " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace deja::cli
