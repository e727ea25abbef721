// `deja bench decode`: prefill tokens/s, decode latency at several batch sizes, the measured
// memory read bandwidth, and batch-1 decode as a fraction of the bandwidth floor (weight bytes
// read per token / bandwidth), all from one run.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <optional>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <vector>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/sparsity_cli.h"
#include "common/thread_pool.h"
#include "kernels/cpu/amx.h"
#include "kernels/cpu/bandwidth.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/i8_vnni.h"

namespace deja::cli {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

StatusOr<std::vector<int64_t>> ParseList(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v <= 0) {
      return InvalidArgument("--batches must be a comma-separated list of positive integers");
    }
    out.push_back(v);
  }
  return out;
}

// The middle value (the upper one of an even count).
double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Best-of-`reps` seconds for one prefill of `n` random tokens.
StatusOr<double> TimePrefill(worker::model::Model& model, int32_t n, int reps, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> tok(4,
                                             static_cast<int32_t>(model.config().vocab_size) - 1);
  std::vector<int32_t> ids(n);
  for (int32_t& t : ids) t = tok(rng);
  double best = 1e30;
  worker::model::StepResult out;
  for (int r = 0; r < reps; ++r) {
    DEJA_ASSIGN_OR_RETURN(auto kv, model.NewSequence(n));
    auto t0 = Clock::now();
    DEJA_RETURN_IF_ERROR(model.Forward({{kv.get(), ids.data(), n, false}}, &out));
    best = std::min(best, Since(t0));
  }
  return best;
}

struct DecodeTiming {
  double step_s = 0;                              // median seconds per step
  double predictor_s = 0;                         // median predictor-thread seconds per step
  double head_fraction = 1, neuron_fraction = 1;  // means over the timed steps
};

// `batch` sequences decoding together; with `compare_sparse`, a second set of `batch`
// sequences decodes under Deja Vu sparsity, its steps alternating with the dense ones so both
// see the same machine (shared hosts drift by tens of percent within a minute).
StatusOr<std::pair<DecodeTiming, DecodeTiming>> TimeDecode(
    worker::model::Model& model, int32_t batch, int32_t prompt, int32_t steps, bool compare_sparse,
    std::mt19937& rng, const std::function<void()>& between = {},
    kernels::Backend* profile = nullptr) {
  std::uniform_int_distribution<int32_t> tok(4,
                                             static_cast<int32_t>(model.config().vocab_size) - 1);
  const int sets = compare_sparse ? 2 : 1;
  std::vector<std::unique_ptr<worker::kv::SequenceKv>> kvs;
  std::vector<std::vector<int32_t>> ids(batch * sets);
  worker::model::StepResult out;
  for (int32_t b = 0; b < batch * sets; ++b) {
    DEJA_ASSIGN_OR_RETURN(auto kv, model.NewSequence(prompt + steps + 1));
    ids[b].resize(prompt + steps + 1);
    for (int32_t& t : ids[b]) t = tok(rng);
    DEJA_RETURN_IF_ERROR(
        model.Forward({{kv.get(), ids[b].data(), prompt, false, b >= batch}}, &out));
    kvs.push_back(std::move(kv));
  }
  std::vector<double> times[2], predictor;
  std::pair<DecodeTiming, DecodeTiming> t;
  t.second.head_fraction = t.second.neuron_fraction = 0;
  std::vector<worker::model::SequenceStep> step(batch);
  // --profile-decode-only: a profiler sees the decode steps, not the prompts' prefills.
  if (profile != nullptr) profile->SetProfiling(true);
  for (int32_t s = 0; s < steps; ++s) {
    for (int set = 0; set < sets; ++set) {
      for (int32_t b = 0; b < batch; ++b) {
        const int32_t i = set * batch + b;
        // As a worker decodes: tokens from the device's top candidates, logits left there (so
        // a device step may run as a CUDA graph); host backends fill the logits regardless.
        step[b] = {kvs[i].get(), &ids[i][prompt + s], 1, false, set == 1, false};
      }
      auto t0 = Clock::now();
      DEJA_RETURN_IF_ERROR(model.Forward(step, &out));
      times[set].push_back(Since(t0));
      if (between) between();  // untimed
      if (set == 1) {
        predictor.push_back(out.predictor_seconds);
        t.second.head_fraction += out.active_head_fraction / steps;
        t.second.neuron_fraction += out.active_neuron_fraction / steps;
      }
    }
  }
  if (profile != nullptr) profile->SetProfiling(false);
  t.first.step_s = Median(times[0]);
  if (compare_sparse) {
    t.second.step_s = Median(times[1]);
    t.second.predictor_s = Median(predictor);
  }
  return t;
}

}  // namespace

int RunBenchDecode(int argc, char** argv, int first) {
  Args args("bench decode", "Prefill and decode speed against the memory-bandwidth floor.");
  AddModelFlags(args);
  args.Flag("prefill-tokens", "tokens in the timed prefill", "512")
      .Flag("prompt-tokens", "prompt length before the timed decode steps", "64")
      .Flag("decode-steps", "timed decode steps per batch size", "32")
      .Flag("batches", "decode batch sizes", "1,4,16")
      .Flag("warmup-rounds",
            "untimed decode rounds per batch size first (their freed KV caches are reused, as "
            "in a worker that has served sequences of this size)",
            "1")
      .Flag("kv-paging-mb",
            "0: each sequence's KV cache is its own allocation; > 0: the caches come from a "
            "block pool of this many MiB, as in a worker with --kv-paging on",
            "0")
      .Bool("json", "print one JSON object as the last line")
      .Bool("profile-decode-only",
            "open a profiler capture range (cudaProfilerStart/Stop) around the timed decode "
            "steps only, for ncu --profile-from-start off");
  AddSparsityRunFlags(args);
  if (Status s = args.Parse(argc, argv, first); !s.ok()) return Fail("bench decode", s);
  if (args.help()) return std::printf("%s", args.Help().c_str()), 0;
  auto run = [&]() -> StatusOr<nlohmann::json> {
    DEJA_ASSIGN_OR_RETURN(int64_t kv_paging_mb, args.Int("kv-paging-mb"));
    if (kv_paging_mb < 0) return InvalidArgument("--kv-paging-mb must be >= 0");
    DEJA_ASSIGN_OR_RETURN(LoadedModel m, LoadModelFromFlags(args, kv_paging_mb));
    DEJA_ASSIGN_OR_RETURN(std::optional<worker::model::SparsityOptions> sparsity,
                          SparsityRunOptions(args));
    if (sparsity) DEJA_RETURN_IF_ERROR(m.model->EnableSparsity(*sparsity));
    DEJA_ASSIGN_OR_RETURN(int64_t prefill_tokens, args.Int("prefill-tokens"));
    DEJA_ASSIGN_OR_RETURN(int64_t prompt, args.Int("prompt-tokens"));
    DEJA_ASSIGN_OR_RETURN(int64_t steps, args.Int("decode-steps"));
    DEJA_ASSIGN_OR_RETURN(std::vector<int64_t> batches, ParseList(args.Str("batches")));
    DEJA_ASSIGN_OR_RETURN(int64_t warmup_rounds, args.Int("warmup-rounds"));
    if (warmup_rounds < 0) return InvalidArgument("--warmup-rounds must be >= 0");
    const int64_t limit = m.model->config().max_position_embeddings;
    prefill_tokens = std::min(prefill_tokens, limit);
    if (prompt + steps + 1 > limit || prompt < 1 || steps < 1) {
      return InvalidArgument("--prompt-tokens + --decode-steps must fit the position limit");
    }
    std::mt19937 rng(1);
    nlohmann::json j;
    j["model"] = args.Str("model");
    j["kv_paging_mb"] = kv_paging_mb;
    j["blas"] = openblas_get_config();
    j["threads"] = m.backend->pool() ? m.backend->pool()->num_threads() : 1;
    j["device"] = m.backend->device().ToString();
    const bool on_device = !m.backend->device().is_host();
    // On a GPU both ceilings are measured on it: a device-to-device copy (bytes read plus
    // written, as the weights' single read is bounded by) and a bf16 GEMM.
    kernels::DevicePeaks device_peaks;
    if (on_device) {
      DEJA_ASSIGN_OR_RETURN(device_peaks, kernels::MeasureDevicePeaks(*m.backend));
      j["device_copy_gb_per_s"] = device_peaks.copy_bytes_per_s / 1e9;
      j["device_bf16_gemm_tflop_per_s"] = device_peaks.bf16_gemm_flops_per_s / 1e12;
    }
    // The host's read bandwidth (a device backend has no thread pool and no host floor).
    std::optional<kernels::ReadBandwidthProbe> probe;
    if (!on_device) probe.emplace(m.backend->pool());
    const double start_bw = on_device ? device_peaks.copy_bytes_per_s : probe->Measure(5);
    j["bandwidth_start_gb_per_s"] = start_bw / 1e9;
    j["weight_bytes"] = m.model->weight_bytes();
    // The floors use the bandwidth measured beside each batch's steps (the median of its probes),
    // floor_ms_per_token batch 1's when it runs: this host's memory bandwidth moves by up to 1.7x
    // over seconds, and a probe taken earlier saw another state of it.
    // The compute roofline of batched decode: 2 FLOPs (or ops) per weight per token at the
    // measured peak of the instruction the Linears multiply with: fp32 FMA (weights widened in
    // registers); VDPBF16PS for bf16 weights where the CPU has it (kernels/cpu/bf16_dot.h);
    // VPDPBUSD for int8 and int4 weights where x is quantized (kernels/cpu/i8_vnni.h), or the
    // AMX tiles from the rows where those Linears switch to them (kernels/cpu/amx.h).
    double peak_flops = on_device ? device_peaks.bf16_gemm_flops_per_s
                                  : kernels::MeasurePeakFmaFlopsPerSec(m.backend->pool());
    j["weight_dtype"] = DTypeName(m.model->weight_dtype());
    if (on_device) {
      j["compute_peak"] = "bf16_gemm";
    } else {
      j["peak_fma_gflop_per_s"] = peak_flops / 1e9;
      j["compute_peak"] = "fma_f32";
    }
    const DType wd = m.model->weight_dtype();
    if (!on_device && (wd == DType::kBF16 || wd == DType::kI8 || wd == DType::kI4) &&
        kernels::cpu::Bf16DotEnabled()) {
      peak_flops = kernels::MeasurePeakBf16DotFlopsPerSec(m.backend->pool());
      j["peak_bf16_dot_gflop_per_s"] = peak_flops / 1e9;
      j["compute_peak"] = "bf16_dot";
    }
    const bool vnni = !on_device &&
                      (wd == DType::kI4 || (wd == DType::kI8 && kernels::cpu::Bf16DotEnabled())) &&
                      kernels::cpu::QuantizesX();
    if (vnni) {
      peak_flops = kernels::MeasurePeakVnniOpsPerSec(m.backend->pool());
      j["peak_vnni_gop_per_s"] = peak_flops / 1e9;
      j["compute_peak"] = "vnni_dot";
    }
    const bool amx = vnni && kernels::cpu::AmxEnabled();
    const double amx_peak = amx ? kernels::MeasurePeakAmxOpsPerSec(m.backend->pool()) : 0;
    if (amx) j["peak_amx_gop_per_s"] = amx_peak / 1e9;
    // The rows from which the int8 and int4 Linears run on AMX tiles.
    const int64_t amx_from_rows =
        wd == DType::kI4 ? kernels::cpu::kAmxI4MinRows : kernels::cpu::kVnniDirectMaxM + 1;
    auto peak_for = [&](int64_t rows) {
      return amx && rows >= amx_from_rows ? amx_peak : peak_flops;
    };
    j["prefill_compute_peak"] = j["compute_peak"];
    // The weights a token multiplies (one rank: bench decode runs one): the layers' matrices and
    // the lm head, from the config, whatever their dtypes.
    const OptConfig& c = m.model->config();
    const double weights = static_cast<double>(c.num_hidden_layers) *
                               (4.0 * c.hidden_size * c.hidden_size +
                                2.0 * c.hidden_size * c.ffn_dim) +
                           static_cast<double>(c.vocab_size) * c.word_embed_proj_dim;
    DEJA_ASSIGN_OR_RETURN(double prefill_s,
                          TimePrefill(*m.model, static_cast<int32_t>(prefill_tokens), 3, rng));
    j["prefill_tokens"] = prefill_tokens;
    j["prefill_tokens_per_s"] = prefill_tokens / prefill_s;
    // The GEMMs' share of the compute peak (2 FLOPs per weight per token; attention not counted).
    j["prefill_fraction_of_compute_peak"] =
        2.0 * weights * static_cast<double>(prefill_tokens) / prefill_s / peak_flops;
    // Where the int8 and int4 Linears run on AMX tiles, their own peak too: the VNNI one is not
    // the limit there.
    if (amx) {
      j["prefill_fraction_of_amx_peak"] =
          2.0 * weights * static_cast<double>(prefill_tokens) / prefill_s / amx_peak;
    }
    double batch1 = 0, sparse_batch1 = 0, batch1_bw = 0;
    // K and V rows one step reads: each sequence attends over prompt + s + 1 slots at step s,
    // every layer and head of this rank (the full caches bench decode makes).
    const worker::kv::KvGeometry g = m.model->kv_geometry();
    const double mean_slots = static_cast<double>(prompt) + (static_cast<double>(steps) + 1) / 2;
    const double kv_bytes_per_sequence =
        2.0 * g.layers * g.heads * static_cast<double>(g.RowBytes()) * mean_slots;
    j["kv_dtype"] = DTypeName(g.kv_dtype);
    j["warmup_rounds"] = warmup_rounds;
    for (int64_t b : batches) {
      for (int64_t w = 0; w < warmup_rounds; ++w) {
        DEJA_RETURN_IF_ERROR(TimeDecode(*m.model, static_cast<int32_t>(b),
                                        static_cast<int32_t>(prompt), static_cast<int32_t>(steps),
                                        sparsity.has_value(), rng)
                                 .status());
      }
      // The bandwidth beside this batch's steps: batch 1 one probe after each step (untimed;
      // its floor is the weights read from memory), larger batches one before and one after
      // their steps, so that a model that fits the cache keeps it between them.
      std::vector<double> step_bw;
      std::function<void()> between;
      if (!on_device && b == 1) between = [&] { step_bw.push_back(probe->Measure(1)); };
      if (!on_device && b != 1) step_bw.push_back(probe->Measure(1));
      DEJA_ASSIGN_OR_RETURN(
          auto timing,
          TimeDecode(*m.model, static_cast<int32_t>(b), static_cast<int32_t>(prompt),
                     static_cast<int32_t>(steps), sparsity.has_value(), rng, between,
                     args.On("profile-decode-only") ? m.backend.get() : nullptr));
      if (!on_device && b != 1) step_bw.push_back(probe->Measure(1));
      const DecodeTiming& dense = timing.first;
      nlohmann::json d;
      d["batch"] = b;
      d["ms_per_step"] = dense.step_s * 1e3;
      d["tokens_per_s"] = b / dense.step_s;
      // The roofline of a step: whichever binds of the weights read once and their FLOPs for
      // b tokens, then the K/V reads, which wait for the layer's q and hold up the next Linear.
      const double step_bw_bytes = step_bw.empty() ? start_bw : Median(step_bw);
      const double compute_floor_s = 2.0 * weights * static_cast<double>(b) / peak_for(b);
      const double kv_bytes = kv_bytes_per_sequence * static_cast<double>(b);
      const double weights_floor_s =
          std::max(m.model->weight_bytes() / step_bw_bytes, compute_floor_s);
      d["bandwidth_gb_per_s"] = step_bw_bytes / 1e9;
      d["compute_floor_ms_per_step"] = compute_floor_s * 1e3;
      d["kv_read_bytes_per_step"] = kv_bytes;
      d["attention_floor_ms_per_step"] = kv_bytes / step_bw_bytes * 1e3;
      d["floor_ms_per_step"] = (weights_floor_s + kv_bytes / step_bw_bytes) * 1e3;
      d["fraction_of_roofline"] = d["floor_ms_per_step"].get<double>() / (dense.step_s * 1e3);
      if (b == 1 && !step_bw.empty()) batch1_bw = step_bw_bytes;
      if (b == 1) batch1 = dense.step_s;
      std::fprintf(stderr, "decode batch %3ld: %8.3f ms/step %9.1f tokens/s, %.2f of the roofline\n",
                   static_cast<long>(b), dense.step_s * 1e3, b / dense.step_s,
                   d["fraction_of_roofline"].get<double>());
      if (sparsity) {
        // Deja Vu: the same batch size under sparsity, steps interleaved with the dense ones.
        const DecodeTiming& sp = timing.second;
        nlohmann::json js;
        js["ms_per_step"] = sp.step_s * 1e3;
        js["tokens_per_s"] = b / sp.step_s;
        js["speedup_vs_dense"] = dense.step_s / sp.step_s;
        js["predictor_ms_per_step"] = sp.predictor_s * 1e3;
        js["predictor_fraction_of_step"] = sp.predictor_s / sp.step_s;
        js["active_head_fraction"] = sp.head_fraction;
        js["active_neuron_fraction"] = sp.neuron_fraction;
        d["sparse"] = js;
        if (b == 1) sparse_batch1 = sp.step_s;
        std::fprintf(stderr,
                     "  sparse batch %3ld: %8.3f ms/step (%.2fx dense), predictor %.3f ms, "
                     "active heads %.3f neurons %.3f\n",
                     static_cast<long>(b), sp.step_s * 1e3, dense.step_s / sp.step_s,
                     sp.predictor_s * 1e3, sp.head_fraction, sp.neuron_fraction);
      }
      j["decode"].push_back(d);
    }
    const double bw = batch1_bw > 0 ? batch1_bw : start_bw;
    const double floor_s = m.model->weight_bytes() / bw;
    j["bandwidth_gb_per_s"] = bw / 1e9;
    j["floor_ms_per_token"] = floor_s * 1e3;
    if (batch1 > 0) {
      j["batch1_fraction_of_floor"] = floor_s / batch1;
      for (auto& d : j["decode"]) {
        d["speedup_vs_batch1"] = d["tokens_per_s"].get<double>() * batch1;
      }
    }
    if (sparsity) {
      j["sparsity"] = {{"predictors", sparsity->predictors},
                       {"oracle_fraction", sparsity->oracle_fraction},
                       {"mlp_fraction", sparsity->mlp_fraction},
                       {"head_fraction", sparsity->head_fraction},
                       {"dense_layers", sparsity->dense_layers}};
      if (sparse_batch1 > 0) j["sparse_batch1_speedup_vs_dense"] = batch1 / sparse_batch1;
    }
    return j;
  };
  StatusOr<nlohmann::json> j = run();
  if (!j.ok()) return Fail("bench decode", j.status());
  if (args.On("json")) {
    std::printf("%s\n", j->dump().c_str());
  } else {
    std::printf("%s\n", j->dump(2).c_str());
  }
  return 0;
}

int RunBench(int argc, char** argv, int first) {
  if (first < argc && std::string(argv[first]) == "decode") {
    return RunBenchDecode(argc, argv, first + 1);
  }
  if (first < argc && std::string(argv[first]) == "kv") return RunBenchKv(argc, argv, first + 1);
  std::fprintf(stderr, "usage: deja bench decode|kv [flags]   (see deja bench <name> --help)\n");
  return 2;
}

}  // namespace deja::cli
