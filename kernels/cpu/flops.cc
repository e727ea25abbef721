// A peak fp32 FMA-throughput probe: the compute roofline batched decode is compared against
// (2 * parameters * batch FLOPs per step). Compiled once per x86 target by Highway and
// dispatched at run time, so it uses the widest vectors the machine has, as the kernels do.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/flops.cc"
// clang-format off
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// clang-format on

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "common/thread_pool.h"
#include "kernels/cpu/bandwidth.h"
#include "kernels/cpu/amx.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/i8_vnni.h"

HWY_BEFORE_NAMESPACE();
namespace deja::kernels::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// FLOPs done: 2 * lanes * 16 accumulators * iters. 16 independent chains hide the FMA latency
// on every current core (latency 4 x 2 pipes = 8 in flight, with room to spare).
double FmaLoop(int64_t iters, float seed) {
  const hn::ScalableTag<float> df;
  auto a = hn::Set(df, 1.0f + 1e-7f * seed), b = hn::Set(df, 1e-7f);
  // Distinct starting values: identical chains would be merged into one by the compiler.
  auto c0 = hn::Set(df, seed), c1 = hn::Set(df, seed + 1), c2 = hn::Set(df, seed + 2);
  auto c3 = hn::Set(df, seed + 3), c4 = hn::Set(df, seed + 4), c5 = hn::Set(df, seed + 5);
  auto c6 = hn::Set(df, seed + 6), c7 = hn::Set(df, seed + 7), c8 = hn::Set(df, seed + 8);
  auto c9 = hn::Set(df, seed + 9), c10 = hn::Set(df, seed + 10), c11 = hn::Set(df, seed + 11);
  auto c12 = hn::Set(df, seed + 12), c13 = hn::Set(df, seed + 13), c14 = hn::Set(df, seed + 14);
  auto c15 = hn::Set(df, seed + 15);
  for (int64_t i = 0; i < iters; ++i) {
    c0 = hn::MulAdd(c0, a, b); c1 = hn::MulAdd(c1, a, b); c2 = hn::MulAdd(c2, a, b);
    c3 = hn::MulAdd(c3, a, b); c4 = hn::MulAdd(c4, a, b); c5 = hn::MulAdd(c5, a, b);
    c6 = hn::MulAdd(c6, a, b); c7 = hn::MulAdd(c7, a, b); c8 = hn::MulAdd(c8, a, b);
    c9 = hn::MulAdd(c9, a, b); c10 = hn::MulAdd(c10, a, b); c11 = hn::MulAdd(c11, a, b);
    c12 = hn::MulAdd(c12, a, b); c13 = hn::MulAdd(c13, a, b); c14 = hn::MulAdd(c14, a, b);
    c15 = hn::MulAdd(c15, a, b);
  }
  auto s = hn::Add(hn::Add(hn::Add(c0, c1), hn::Add(c2, c3)), hn::Add(hn::Add(c4, c5), hn::Add(c6, c7)));
  s = hn::Add(s, hn::Add(hn::Add(hn::Add(c8, c9), hn::Add(c10, c11)),
                         hn::Add(hn::Add(c12, c13), hn::Add(c14, c15))));
  // Consume the result so the loop is not removed.
  return hn::GetLane(hn::SumOfLanes(df, s)) * 0.0 +
         2.0 * static_cast<double>(hn::Lanes(df)) * 16.0 * static_cast<double>(iters);
}

}  // namespace HWY_NAMESPACE
}  // namespace deja::kernels::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deja::kernels {
namespace cpu {
HWY_EXPORT(FmaLoop);
}  // namespace cpu

namespace {

// The best of 3 runs of `loop` (returning the FLOPs it did) on one plain thread per pool thread,
// so each surely runs its own loop concurrently.
double MeasurePeak(ThreadPool* pool, double (*loop)(int64_t, float)) {
  const int threads = pool ? pool->num_threads() : 1;
  constexpr int64_t kIters = int64_t{1} << 23;
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<double> flops(threads, 0.0);
    auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> run;
    for (int t = 0; t < threads; ++t) {
      run.emplace_back([&flops, t, loop] {
        flops[t] = loop(kIters, static_cast<float>(t + 1));
      });
    }
    for (std::thread& th : run) th.join();
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    double total = 0;
    for (double f : flops) total += f;
    best = std::max(best, total / secs);
  }
  return best;
}

double FmaLoopDispatched(int64_t iters, float seed) {
  return HWY_DYNAMIC_DISPATCH(cpu::FmaLoop)(iters, seed);
}

}  // namespace

double MeasurePeakFmaFlopsPerSec(ThreadPool* pool) { return MeasurePeak(pool, FmaLoopDispatched); }

double MeasurePeakBf16DotFlopsPerSec(ThreadPool* pool) {
  return cpu::Bf16DotAvailable() ? MeasurePeak(pool, cpu::Bf16DotLoop) : 0.0;
}

double MeasurePeakVnniOpsPerSec(ThreadPool* pool) {
  return cpu::VnniAvailable() ? MeasurePeak(pool, cpu::VnniDotLoop) : 0.0;
}

double MeasurePeakAmxOpsPerSec(ThreadPool* pool) {
  return cpu::AmxAvailable()
             ? MeasurePeak(pool, [](int64_t iters, float) { return cpu::AmxDotLoop(iters / 8); })
             : 0.0;
}

}  // namespace deja::kernels
#endif  // HWY_ONCE
