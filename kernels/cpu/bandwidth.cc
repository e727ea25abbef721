#include "kernels/cpu/bandwidth.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <new>

#include "common/tensor.h"
#include "common/thread_pool.h"
#include "kernels/cpu/simd.h"

namespace deja::kernels {

namespace {
// 256 MiB: several times any current L3, so the reads come from DRAM.
constexpr int64_t kProbeFloats = int64_t{64} << 20;
}  // namespace

ReadBandwidthProbe::ReadBandwidthProbe(ThreadPool* pool)
    : pool_(pool), data_(static_cast<float*>(std::aligned_alloc(64, kProbeFloats * 4))) {
  if (data_ == nullptr) throw std::bad_alloc();
  // Touch in parallel so pages are faulted in (and placed) by the threads that read them. Every
  // page gets distinct contents: zero-filled or repeated pages may be merged by the kernel or
  // hypervisor (KSM) into one physical page, and reading that would measure the cache.
  float* data = data_;
  pool_->ParallelFor(kProbeFloats, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) data[i] = static_cast<float>(i);
  });
}

ReadBandwidthProbe::~ReadBandwidthProbe() { std::free(data_); }

double ReadBandwidthProbe::Measure(int reps) {
  double best = 0;
  const float* data = data_;
  for (int rep = 0; rep < reps; ++rep) {
    volatile float sink = 0;
    auto start = std::chrono::steady_clock::now();
    // MaxOf is a vector read loop with one cheap op per load: bound by memory, not compute.
    pool_->ParallelFor(kProbeFloats, [&](int64_t b, int64_t e) { sink = MaxOf(data + b, e - b); });
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    (void)sink;
    best = std::max(best, static_cast<double>(kProbeFloats) * sizeof(float) / secs);
  }
  return best;
}

double MeasureReadBandwidthBytesPerSec(ThreadPool* pool) {
  return ReadBandwidthProbe(pool).Measure(5);
}

}  // namespace deja::kernels
