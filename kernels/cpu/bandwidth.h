// A memory-bandwidth probe: the floor decode benchmarks compare against (weights read per step
// divided by this rate).
#pragma once

namespace deja {
class ThreadPool;
}

namespace deja::kernels {

// Bytes per second at which all threads of `pool` can stream-read a buffer far larger than the
// last-level cache; the best of a few runs. Allocates and touches ~256 MiB for about a second.
double MeasureReadBandwidthBytesPerSec(ThreadPool* pool);

// The same probe kept ready (its 256 MiB allocated and touched once), for measurements taken
// between other work: Measure(reps) is the best of `reps` reads of the buffer (~5 ms each).
class ReadBandwidthProbe {
 public:
  explicit ReadBandwidthProbe(ThreadPool* pool);
  ~ReadBandwidthProbe();
  double Measure(int reps);

 private:
  ThreadPool* pool_;
  float* data_;
};

}  // namespace deja::kernels

namespace deja::kernels {

// Fused multiply-add throughput in fp32 FLOP/s (2 per lane per FMA) of all threads of `pool`
// (one chunk per thread), the best of a few runs of ~0.1 s: the compute roofline.
double MeasurePeakFmaFlopsPerSec(ThreadPool* pool);
// The same for VDPBF16PS (4 FLOPs per f32 lane and instruction: two bf16 products and their
// sums), the compute roofline of bf16 weights on CPUs with AVX512-BF16; 0 without it.
double MeasurePeakBf16DotFlopsPerSec(ThreadPool* pool);
// The same for VPDPBUSD (2 int8 operations per u8 x s8 product: 128 per instruction), the compute
// roofline of int8 prefill with x quantized on CPUs with AVX512-VNNI; 0 without it.
double MeasurePeakVnniOpsPerSec(ThreadPool* pool);
// The same for TDPBUSD (AMX-INT8: 16 x 16 x 64 products per instruction), the roofline of the
// int8 and int4 Linears on the tiles (kernels/cpu/amx.h); 0 without AMX.
double MeasurePeakAmxOpsPerSec(ThreadPool* pool);

}  // namespace deja::kernels
