#include "kernels/cpu/bandwidth.h"

#include <algorithm>
#include <chrono>

#include "common/tensor.h"
#include "common/thread_pool.h"
#include "kernels/cpu/simd.h"

namespace deja::kernels {

double MeasureReadBandwidthBytesPerSec(ThreadPool* pool) {
  // 256 MiB: several times any current L3, so the reads come from DRAM.
  constexpr int64_t kFloats = int64_t{64} << 20;
  Tensor buf = Tensor::Empty(DType::kF32, Shape{kFloats});
  float* data = buf.as<float>();
  // Touch in parallel so pages are faulted in (and placed) by the threads that read them. Every
  // page gets distinct contents: zero-filled or repeated pages may be merged by the kernel or
  // hypervisor (KSM) into one physical page, and reading that would measure the cache.
  pool->ParallelFor(kFloats, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) data[i] = static_cast<float>(i);
  });
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    volatile float sink = 0;
    auto start = std::chrono::steady_clock::now();
    // MaxOf is a vector read loop with one cheap op per load: bound by memory, not compute.
    pool->ParallelFor(kFloats, [&](int64_t b, int64_t e) { sink = cpu::MaxOf(data + b, e - b); });
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    (void)sink;
    best = std::max(best, static_cast<double>(kFloats) * sizeof(float) / secs);
  }
  return best;
}

}  // namespace deja::kernels
