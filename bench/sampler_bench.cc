// Token selection cost per sequence and step (worker/sampler.h): rank 0 runs it for every
// sequence of a decode step, so at batch 32 over OPT's 50,272-token vocabulary it handles 1.6M
// logits per step. Args: vocab, mode (0 greedy, 1 greedy + 5 alternatives, 2 sampling with
// temperature, top-k 50 and top-p 0.9).
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "worker/sampling/sampler.h"

namespace deja::worker {
namespace {

void BM_Choose(benchmark::State& state) {
  const int32_t vocab = static_cast<int32_t>(state.range(0));
  const int mode = static_cast<int>(state.range(1));
  // Several rows cycled, so every call reads logits that are not in L1.
  constexpr int kRows = 64;
  std::vector<float> logits(static_cast<size_t>(kRows) * vocab);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.f, 3.f);
  for (float& x : logits) x = normal(rng);
  sampling::SamplingParams p;
  if (mode == 1) p.top_n = 5;
  if (mode == 2) {
    p.do_sample = true;
    p.temperature = 0.8f;
    p.top_k = 50;
    p.top_p = 0.9f;
  }
  sampling::Sampler sampler(p);
  const std::vector<int32_t> history = {2, 100, 200};
  int row = 0;
  for (auto _ : state) {
    StatusOr<sampling::TokenChoice> c =
        sampler.Choose(logits.data() + static_cast<size_t>(row) * vocab, vocab, history);
    benchmark::DoNotOptimize(c);
    row = (row + 1) % kRows;
  }
  state.SetItemsProcessed(state.iterations() * vocab);
  state.SetLabel(mode == 0 ? "greedy" : mode == 1 ? "greedy, top 5" : "sampled");
}

BENCHMARK(BM_Choose)
    ->ArgNames({"vocab", "mode"})
    ->ArgsProduct({{8192, 50272}, {0, 1, 2}})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace deja::worker

BENCHMARK_MAIN();
