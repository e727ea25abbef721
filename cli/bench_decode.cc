// `deja bench decode`: prefill tokens/s, decode latency at several batch sizes, the measured
// memory read bandwidth, and batch-1 decode as a fraction of the bandwidth floor (weight bytes
// read per token / bandwidth), all from one run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <sstream>
#include <vector>

#include <cblas.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "common/thread_pool.h"
#include "kernels/cpu/bandwidth.h"

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

// Best-of-`reps` seconds for one prefill of `n` random tokens.
StatusOr<double> TimePrefill(worker::OptModel& model, int32_t n, int reps, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> tok(4, static_cast<int32_t>(model.config().vocab_size) - 1);
  std::vector<int32_t> ids(n);
  for (int32_t& t : ids) t = tok(rng);
  double best = 1e30;
  worker::StepResult out;
  for (int r = 0; r < reps; ++r) {
    DEJA_ASSIGN_OR_RETURN(auto kv, model.NewSequence(n));
    auto t0 = Clock::now();
    DEJA_RETURN_IF_ERROR(model.Forward({{kv.get(), ids.data(), n, false}}, &out));
    best = std::min(best, Since(t0));
  }
  return best;
}

// Median seconds per decode step for `batch` sequences decoding together.
StatusOr<double> TimeDecode(worker::OptModel& model, int32_t batch, int32_t prompt,
                            int32_t steps, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> tok(4, static_cast<int32_t>(model.config().vocab_size) - 1);
  std::vector<std::unique_ptr<worker::SequenceKv>> kvs;
  std::vector<std::vector<int32_t>> ids(batch);
  worker::StepResult out;
  for (int32_t b = 0; b < batch; ++b) {
    DEJA_ASSIGN_OR_RETURN(auto kv, model.NewSequence(prompt + steps + 1));
    ids[b].resize(prompt + steps + 1);
    for (int32_t& t : ids[b]) t = tok(rng);
    DEJA_RETURN_IF_ERROR(model.Forward({{kv.get(), ids[b].data(), prompt, false}}, &out));
    kvs.push_back(std::move(kv));
  }
  std::vector<double> times;
  std::vector<worker::SequenceStep> step(batch);
  for (int32_t s = 0; s < steps; ++s) {
    for (int32_t b = 0; b < batch; ++b) step[b] = {kvs[b].get(), &ids[b][prompt + s], 1, false};
    auto t0 = Clock::now();
    DEJA_RETURN_IF_ERROR(model.Forward(step, &out));
    times.push_back(Since(t0));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int RunBenchDecode(int argc, char** argv, int first) {
  Args args("bench decode", "Prefill and decode speed against the memory-bandwidth floor.");
  AddModelFlags(args);
  args.Flag("prefill-tokens", "tokens in the timed prefill", "512")
      .Flag("prompt-tokens", "prompt length before the timed decode steps", "64")
      .Flag("decode-steps", "timed decode steps per batch size", "32")
      .Flag("batches", "decode batch sizes", "1,4,16")
      .Bool("json", "print one JSON object as the last line");
  if (Status s = args.Parse(argc, argv, first); !s.ok()) return Fail("bench decode", s);
  if (args.help()) return std::printf("%s", args.Help().c_str()), 0;
  auto run = [&]() -> StatusOr<nlohmann::json> {
    DEJA_ASSIGN_OR_RETURN(LoadedModel m, LoadModelFromFlags(args));
    DEJA_ASSIGN_OR_RETURN(int64_t prefill_tokens, args.Int("prefill-tokens"));
    DEJA_ASSIGN_OR_RETURN(int64_t prompt, args.Int("prompt-tokens"));
    DEJA_ASSIGN_OR_RETURN(int64_t steps, args.Int("decode-steps"));
    DEJA_ASSIGN_OR_RETURN(std::vector<int64_t> batches, ParseList(args.Str("batches")));
    const int64_t limit = m.model->config().max_position_embeddings;
    prefill_tokens = std::min(prefill_tokens, limit);
    if (prompt + steps + 1 > limit || prompt < 1 || steps < 1) {
      return InvalidArgument("--prompt-tokens + --decode-steps must fit the position limit");
    }
    std::mt19937 rng(1);
    nlohmann::json j;
    j["model"] = args.Str("model");
    j["blas"] = openblas_get_config();
    j["threads"] = m.backend->pool() ? m.backend->pool()->num_threads() : 1;
    const double bw = kernels::MeasureReadBandwidthBytesPerSec(m.backend->pool());
    j["bandwidth_gb_per_s"] = bw / 1e9;
    j["weight_bytes"] = m.model->weight_bytes();
    const double floor_s = m.model->weight_bytes() / bw;
    j["floor_ms_per_token"] = floor_s * 1e3;
    DEJA_ASSIGN_OR_RETURN(double prefill_s,
                          TimePrefill(*m.model, static_cast<int32_t>(prefill_tokens), 3, rng));
    j["prefill_tokens"] = prefill_tokens;
    j["prefill_tokens_per_s"] = prefill_tokens / prefill_s;
    double batch1 = 0;
    for (int64_t b : batches) {
      DEJA_ASSIGN_OR_RETURN(double step_s, TimeDecode(*m.model, static_cast<int32_t>(b),
                                                      static_cast<int32_t>(prompt),
                                                      static_cast<int32_t>(steps), rng));
      nlohmann::json d;
      d["batch"] = b;
      d["ms_per_step"] = step_s * 1e3;
      d["tokens_per_s"] = b / step_s;
      j["decode"].push_back(d);
      if (b == 1) batch1 = step_s;
      std::fprintf(stderr, "decode batch %3ld: %8.3f ms/step %9.1f tokens/s\n",
                   static_cast<long>(b), step_s * 1e3, b / step_s);
    }
    if (batch1 > 0) {
      j["batch1_fraction_of_floor"] = floor_s / batch1;
      for (auto& d : j["decode"]) {
        d["speedup_vs_batch1"] = d["tokens_per_s"].get<double>() * batch1;
      }
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
