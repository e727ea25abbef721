// Kernel benchmarks. Decode Linear (and the Deja Vu gathers) is memory-bound, so each case reports
// the weight bytes it streams per second and the fraction of the machine's measured read bandwidth
// that is (1.0 = at the floor). Several copies of the weights are cycled so a matrix that fits the
// last-level cache is not re-read from it, as in a real model where every layer has its own
// weights.
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <glog/logging.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/kv_row.h"
#include "common/quantize.h"
#include "common/tensor.h"
#include "common/thread_pool.h"
#include "kernels/backend.h"
#include "kernels/cpu/bandwidth.h"
#include "kernels/ops.h"

namespace deja::kernels {
namespace {

// threads == 0: one per core (the default pool); 1: the single-thread GFLOP/s figures, which
// are less disturbed by other processes on a shared machine.
Backend& Cpu(int threads = 0) {
  static std::unique_ptr<Backend> backends[3];
  std::unique_ptr<Backend>& b = backends[std::min(threads, 2)];
  if (b == nullptr) b = MakeCpuBackend(threads);
  return *b;
}

double& BandwidthBytesPerSec() {
  static double bw = 0;
  return bw;
}

Tensor Random(DType dtype, Shape shape, uint32_t seed) {
  Tensor t = Tensor::Empty(dtype, shape);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (int64_t i = 0; i < t.numel(); ++i) StoreFromFloat(t.data(), dtype, i, dist(rng));
  return t;
}

// `rows` KV rows of head_dim (common/kv_row.h) holding random values of [-1, 1).
Tensor RandomKv(DType dtype, int64_t rows, int64_t head_dim, uint32_t seed) {
  if (dtype != DType::kI8) return Random(dtype, {rows, head_dim}, seed);
  Tensor x = Random(DType::kF32, {rows, head_dim}, seed);
  const int64_t row = KvRowElems(dtype, head_dim);
  Tensor t = Tensor::Empty(dtype, {rows, row});
  for (int64_t r = 0; r < rows; ++r) {
    KvRowFromF32(x.as<float>() + r * head_dim, head_dim, dtype, t.as<int8_t>() + r * row);
  }
  return t;
}

// Args: M, N, K, dtype, threads (0 = one per core), tiled (1: bf16 weights laid out in 16-row
// tiles, Layout::kTiled16, as the model does on CPUs that prefer them; skipped elsewhere).
void BM_Linear(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const DType dtype = static_cast<DType>(state.range(3));
  Backend& cpu = Cpu(static_cast<int>(state.range(4)));
  const bool tiled = state.range(5) != 0;
  if (tiled && dtype != DType::kI4 && !cpu.PrefersTiled(dtype)) {
    state.SkipWithError("this CPU does not take tiled weights (no AVX512-BF16, or not bf16)");
    return;
  }
  // At least 128 MiB of weights in total: 4x a 32 MiB L3.
  const int64_t bytes_per_copy =
      dtype == DType::kI4 ? n * k / 2 : n * k * static_cast<int64_t>(DTypeSize(dtype));
  const int copies = static_cast<int>(std::max<int64_t>(1, (int64_t{128} << 20) / bytes_per_copy));
  std::vector<Tensor> weights;
  std::vector<TensorView> views;
  for (int c = 0; c < copies; ++c) {
    Tensor w;
    TensorView view;
    if (dtype == DType::kI4) {  // groups of 128, from random f32 weights (tiled already)
      StatusOr<Int4Matrix> q = QuantizeInt4(Random(DType::kF32, {n, k}, 1 + c).view(), 128, "w");
      CHECK(q.ok()) << q.status().ToString();
      views.push_back(q->view());
      weights.push_back(std::move(q->packed));
      weights.push_back(std::move(q->scale));
      continue;
    }
    if (dtype == DType::kI8) {  // quantized per row from random f32 weights
      StatusOr<QuantizedMatrix> q =
          QuantizeRowsInt8(Random(DType::kF32, {n, k}, 1 + c).view(), "w");
      CHECK(q.ok()) << q.status().ToString();
      view = q->view();
      w = std::move(q->q);
      weights.push_back(std::move(q->scale));
    } else {
      w = Random(dtype, {n, k}, 1 + c);
      view = w.view();
    }
    if (tiled) w = Tile16(TensorView(view), &view);  // the row-major storage is dropped
    weights.push_back(std::move(w));
    views.push_back(view);
  }
  Tensor x = Random(DType::kF32, {m, k}, 100);
  Tensor bias = Random(dtype == DType::kI8 || dtype == DType::kI4 ? DType::kF32 : dtype, {n}, 101);
  Tensor out = Tensor::Zeros(DType::kF32, {m, n});
  int next = 0;
  for (auto _ : state) {
    Status s =
        Linear(cpu, x.view(), views[next], bias.view(), Activation::kNone, false, out.view());
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
    next = (next + 1) % copies;
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * bytes_per_copy);
  state.counters["floor_us"] = 1e6 * bytes_per_copy / BandwidthBytesPerSec();
  state.counters["frac_of_bw"] =
      benchmark::Counter(static_cast<double>(bytes_per_copy) / BandwidthBytesPerSec(),
                         benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * m * n * k * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(DTypeName(dtype)) + (tiled ? " tiled" : ""));
}

constexpr int64_t kF32 = static_cast<int64_t>(DType::kF32);
constexpr int64_t kF16 = static_cast<int64_t>(DType::kF16);
constexpr int64_t kBF16 = static_cast<int64_t>(DType::kBF16);
constexpr int64_t kI8 = static_cast<int64_t>(DType::kI8);
constexpr int64_t kI4 = static_cast<int64_t>(DType::kI4);

// OPT-1.3B sized: fc1 is [8192, 2048], fc2 [2048, 8192], the lm head [50272, 2048]. M = 1, 4,
// 8, 16 are decode batch sizes; 128 is prefill. threads = 1 rows give single-core GFLOP/s.
// The tiled rows are what `--dtype bf16` runs on AVX512-BF16 CPUs: M = 16 one tile x 16 rows in
// one pass, against the M = 1 row beside it (both at the memory's speed: frac_of_bw alike).
BENCHMARK(BM_Linear)
    ->ArgNames({"M", "N", "K", "dtype", "threads", "tiled"})
    ->Args({1, 8192, 2048, kBF16, 0, 1})
    ->Args({1, 8192, 2048, kI4, 0, 1})
    ->Args({2, 8192, 2048, kI4, 0, 1})
    ->Args({4, 8192, 2048, kI4, 0, 1})
    ->Args({8, 8192, 2048, kI4, 0, 1})
    ->Args({16, 8192, 2048, kI4, 0, 1})
    ->Args({16, 2048, 8192, kI4, 0, 1})
    ->Args({64, 8192, 2048, kI4, 0, 1})
    ->Args({512, 8192, 2048, kI4, 0, 1})
    ->Args({1, 8192, 2048, kI8, 0, 1})
    ->Args({16, 8192, 2048, kI8, 0, 1})
    ->Args({128, 8192, 2048, kI8, 0, 1})
    ->Args({512, 8192, 2048, kI8, 0, 1})
    ->Args({512, 8192, 2048, kBF16, 0, 1})
    ->Args({512, 2048, 8192, kI8, 0, 1})
    ->Args({512, 2048, 2048, kI8, 0, 1})
    ->Args({32, 8192, 2048, kI8, 0, 1})
    ->Args({16, 8192, 2048, kI8, 1, 1})
    ->Args({24, 8192, 2048, kI8, 1, 1})
    ->Args({32, 8192, 2048, kI8, 1, 1})
    ->Args({48, 8192, 2048, kI8, 1, 1})
    ->Args({64, 8192, 2048, kI8, 0, 1})
    ->Args({512, 8192, 2048, kI8, 1, 1})
    ->Args({512, 2048, 8192, kI8, 1, 1})
    ->Args({1, 8192, 2048, kI8, 0, 0})
    ->Args({1, 8192, 2048, kI8, 1, 1})
    ->Args({1, 8192, 2048, kBF16, 1, 1})
    ->Args({16, 8192, 2048, kI8, 1, 1})
    ->Args({16, 8192, 2048, kBF16, 1, 1})
    ->Args({4, 8192, 2048, kBF16, 0, 1})
    ->Args({16, 8192, 2048, kBF16, 0, 1})
    ->Args({16, 2048, 8192, kBF16, 0, 1})
    ->Args({32, 8192, 2048, kBF16, 0, 1})
    ->Args({128, 8192, 2048, kBF16, 0, 1})
    ->Args({1, 8192, 2048, kF16, 0, 0})
    ->Args({4, 8192, 2048, kF16, 0, 0})
    ->Args({8, 8192, 2048, kF16, 0, 0})
    ->Args({16, 8192, 2048, kF16, 0, 0})
    ->Args({32, 8192, 2048, kF16, 0, 0})
    ->Args({1, 8192, 2048, kBF16, 0, 0})
    ->Args({16, 8192, 2048, kBF16, 0, 0})
    ->Args({16, 2048, 8192, kBF16, 0, 0})
    ->Args({16, 8192, 2048, kBF16, 1, 0})
    ->Args({16, 2048, 8192, kBF16, 1, 0})
    ->Args({1, 8192, 2048, kF32, 0, 0})
    ->Args({16, 8192, 2048, kF32, 0, 0})
    ->Args({128, 8192, 2048, kF16, 0, 0})
    ->Args({1, 2048, 8192, kF16, 0, 0})
    ->Args({16, 2048, 8192, kF16, 0, 0})
    ->Args({16, 2048, 2048, kF16, 0, 0})
    ->Args({16, 50272, 2048, kF16, 0, 0})
    ->Args({1, 8192, 2048, kF16, 1, 0})
    ->Args({4, 8192, 2048, kF16, 1, 0})
    ->Args({8, 8192, 2048, kF16, 1, 0})
    ->Args({16, 8192, 2048, kF16, 1, 0})
    ->Args({16, 2048, 8192, kF16, 1, 0})
    ->Args({1, 2048, 8192, kF16, 1, 0})
    ->Args({32, 8192, 2048, kF16, 1, 0})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// The compute peaks the prefill fractions are taken against (kernels/cpu/bandwidth.h): 0 fp32
// FMA, 1 VDPBF16PS, 2 VPDPBUSD, 3 AMX TDPBUSD; GOP/s of all threads (0 = one per core) or one.
void BM_ComputePeak(benchmark::State& state) {
  ThreadPool* pool = Cpu(static_cast<int>(state.range(1))).pool();
  double ops = 0;
  for (auto _ : state) {
    switch (state.range(0)) {
      case 0:
        ops = MeasurePeakFmaFlopsPerSec(pool);
        break;
      case 1:
        ops = MeasurePeakBf16DotFlopsPerSec(pool);
        break;
      case 2:
        ops = MeasurePeakVnniOpsPerSec(pool);
        break;
      default:
        ops = MeasurePeakAmxOpsPerSec(pool);
    }
  }
  if (ops == 0) state.SkipWithError("this CPU lacks the instruction");
  state.counters["GOP/s"] = ops * 1e-9;
}
BENCHMARK(BM_ComputePeak)
    ->ArgNames({"kind", "threads"})
    ->Args({0, 0})
    ->Args({1, 0})
    ->Args({2, 0})
    ->Args({3, 0})
    ->Args({1, 1})
    ->Args({2, 1})
    ->Args({3, 1})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond);

// Deja Vu gathers at a known sparsity, next to the dense Linear rows above (M = 1, f16, the
// OPT-1.3B fc1 [8192, 2048] and fc2 stored transposed [8192, 2048]). The kept rows are a random
// subset in ascending order (what sorting the predictor's top-k gives). Bytes are the selected
// rows only, so frac_of_bw compares with the same floor as the dense case. So that a small
// selection is not served from the last-level cache, each copy's rows are split into disjoint
// random subsets and every iteration reads the next (copy, subset): a full cycle reads all
// 128 MiB once.
// Args: M, R (rows of w / wt), K or N, kept rows per 1000, dtype, transposed (0 = fc1
// gather_linear, 1 = fc2 gather_linear_t), threads (0 = one per core).
void BM_Gather(benchmark::State& state) {
  const int64_t m = state.range(0), r = state.range(1), width = state.range(2);
  const int64_t n_rows = std::max<int64_t>(1, r * state.range(3) / 1000);
  const DType dtype = static_cast<DType>(state.range(4));
  const bool transposed = state.range(5) != 0;
  Backend& cpu = Cpu(static_cast<int>(state.range(6)));
  const int64_t bytes_per_copy = r * width * static_cast<int64_t>(DTypeSize(dtype));
  const int copies = static_cast<int>(std::max<int64_t>(1, (int64_t{128} << 20) / bytes_per_copy));
  std::vector<Tensor> weights;
  for (int c = 0; c < copies; ++c) weights.push_back(Random(dtype, {r, width}, 1 + c));
  std::vector<int32_t> perm(static_cast<size_t>(r));
  for (int64_t i = 0; i < r; ++i) perm[i] = static_cast<int32_t>(i);
  std::mt19937 rng(7);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<std::vector<int32_t>> subsets;
  for (int64_t i = 0; i + n_rows <= r; i += n_rows) {
    subsets.emplace_back(perm.begin() + i, perm.begin() + i + n_rows);
    std::sort(subsets.back().begin(), subsets.back().end());
  }
  const int cycle = copies * static_cast<int>(subsets.size());
  Tensor x = Random(DType::kF32, {m, transposed ? n_rows : width}, 100);
  Tensor bias = Random(dtype, {r}, 101);
  Tensor out = Tensor::Zeros(DType::kF32, {m, transposed ? width : n_rows});
  int next = 0;
  for (auto _ : state) {
    const TensorView w = weights[next % copies].view();
    const int32_t* rows = subsets[next / copies].data();
    Status s = transposed ? GatherLinearT(cpu, x.view(), w, rows, n_rows, false, out.view())
                          : GatherLinear(cpu, x.view(), w, bias.view(), rows, n_rows,
                                         Activation::kRelu, false, out.view());
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
    next = (next + 1) % cycle;
    benchmark::DoNotOptimize(out.data());
  }
  const int64_t bytes = n_rows * width * static_cast<int64_t>(DTypeSize(dtype));
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["floor_us"] = 1e6 * bytes / BandwidthBytesPerSec();
  state.counters["frac_of_bw"] =
      benchmark::Counter(static_cast<double>(bytes) / BandwidthBytesPerSec(),
                         benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(transposed ? "gather_linear_t " : "gather_linear ") +
                 DTypeName(dtype));
}

BENCHMARK(BM_Gather)
    ->ArgNames({"M", "R", "K_or_N", "keep_permille", "dtype", "transposed", "threads"})
    ->ArgsProduct({{1}, {8192}, {2048}, {1000, 500, 250, 100}, {kF16}, {0, 1}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// Decode attention as a batched decode step runs it: one query token per sequence, each
// sequence's heads on one pool thread (worker/opt_model.cc hands the pool one job over the
// batch), every slot of every head occupied and visible. Bytes are the K and V rows read, so
// frac_of_bw compares with the memory's floor; enough sequences are cycled that their caches
// (at least 128 MiB) are not served from the last-level cache; with `cached` every query reads
// one sequence, whose rows then stay in L2, so the time is the kernel's arithmetic alone.
// Args: head_dim, slots per head, KV dtype, h2o (1: scores accumulated, as the h2o policy asks),
// cached.
void BM_AttentionDecode(benchmark::State& state) {
  const int64_t hd = state.range(0), slots = state.range(1);
  const DType kv_dtype = static_cast<DType>(state.range(2));
  const bool h2o = state.range(3) != 0, cached = state.range(4) != 0;
  constexpr int64_t kHeads = 8, kBatch = 32;
  Backend& cpu = Cpu();
  const int64_t seq_bytes = 2 * kHeads * slots * static_cast<int64_t>(KvRowBytes(kv_dtype, hd));
  const int64_t seqs =
      cached ? 1
             : kBatch * std::max<int64_t>(
                            1, ((int64_t{128} << 20) / seq_bytes + kBatch - 1) / kBatch);
  struct Seq {
    Tensor k, v, score;
  };
  std::vector<Seq> cache;
  for (int64_t i = 0; i < seqs; ++i) {
    cache.push_back({RandomKv(kv_dtype, kHeads * slots, hd, 200 + 2 * i),
                     RandomKv(kv_dtype, kHeads * slots, hd, 201 + 2 * i),
                     Tensor::Zeros(DType::kF32, {kHeads, slots})});
  }
  // Slots in a shuffled position order, as an H2O cache holds them after evictions.
  std::vector<int32_t> slot_pos(static_cast<size_t>(kHeads * slots));
  std::mt19937 rng(9);
  for (int64_t h = 0; h < kHeads; ++h) {
    std::vector<int32_t> p(static_cast<size_t>(slots));
    for (int64_t s = 0; s < slots; ++s) p[s] = static_cast<int32_t>(s);
    std::shuffle(p.begin(), p.end(), rng);
    std::copy(p.begin(), p.end(), slot_pos.begin() + h * slots);
  }
  const int32_t q_pos = static_cast<int32_t>(slots);
  Tensor q = Random(DType::kF32, {kBatch, kHeads * hd}, 300);
  Tensor out = Tensor::Zeros(DType::kF32, {kBatch, kHeads * hd});
  int64_t next = 0;
  for (auto _ : state) {
    std::vector<Status> status(kBatch);
    cpu.pool()->ParallelFor(kBatch, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        Seq& c = cache[(next + i) % seqs];
        AttentionArgs a;
        a.q = q.view().RowSlice(i, i + 1);
        a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
        a.q_pos = &q_pos;
        a.kv.k = c.k.data();
        a.kv.v = c.v.data();
        a.kv.dtype = kv_dtype;
        a.kv.slot_pos = slot_pos.data();
        a.kv.capacity = static_cast<int32_t>(slots);
        a.kv.used = static_cast<int32_t>(slots);
        a.kv.score = h2o ? c.score.as<float>() : nullptr;
        a.heads = kHeads;
        a.head_dim = static_cast<int32_t>(hd);
        a.out = out.view().RowSlice(i, i + 1);
        status[i] = Attention(cpu, a);
      }
    });
    for (const Status& st : status) {
      if (!st.ok()) state.SkipWithError(st.ToString().c_str());
    }
    next = (next + kBatch) % seqs;
    benchmark::DoNotOptimize(out.data());
  }
  const int64_t bytes = kBatch * seq_bytes;
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["floor_us"] = 1e6 * bytes / BandwidthBytesPerSec();
  state.counters["frac_of_bw"] =
      benchmark::Counter(static_cast<double>(bytes) / BandwidthBytesPerSec(),
                         benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string("kv ") + DTypeName(kv_dtype) + (h2o ? " h2o" : "") +
                 (cached ? " cached" : ""));
}

// opt-mini's heads (32) at the h2o 20% budget (205 slots) and a full 1024-token cache; OPT-1.3B's
// (64) and OPT-6.7B's and larger (128). Then the full policy's decode after a 768-token prompt
// at OPT-1.3B's head size, each KV dtype, from memory and from L2.
BENCHMARK(BM_AttentionDecode)
    ->ArgNames({"head_dim", "slots", "kv_dtype", "h2o", "cached"})
    ->ArgsProduct({{32, 64, 128}, {205, 1024}, {kF16, kF32, kI8}, {1}, {0}})
    ->ArgsProduct({{64}, {768}, {kF32, kF16, kI8}, {0}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// A prefill's attention: `tokens` new queries over a cache of the same tokens (slots in position
// order, causal), OPT-1.3B's 32 heads of 64, one call on the whole pool. Mode 0: per_query (each
// query the bits of its own call: the blocked multi-query kernels); 1: the GEMM path (unset
// per_query); 2: the queries one call each (what per_query cost before the blocked kernels).
// GFLOP/s counts 4 * head_dim flops per visible (query, slot) pair.
void BM_AttentionPrefill(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  const DType kv_dtype = static_cast<DType>(state.range(1));
  const int64_t mode = state.range(2);
  constexpr int64_t kHeads = 32, kHd = 64;
  Backend& cpu = Cpu();
  Tensor k = RandomKv(kv_dtype, kHeads * tokens, kHd, 400);
  Tensor v = RandomKv(kv_dtype, kHeads * tokens, kHd, 401);
  std::vector<int32_t> slot_pos(static_cast<size_t>(kHeads * tokens)), q_pos(tokens);
  for (int64_t i = 0; i < kHeads * tokens; ++i) slot_pos[i] = static_cast<int32_t>(i % tokens);
  for (int64_t t = 0; t < tokens; ++t) q_pos[t] = static_cast<int32_t>(t);
  Tensor q = Random(DType::kF32, {tokens, kHeads * kHd}, 402);
  Tensor out = Tensor::Zeros(DType::kF32, {tokens, kHeads * kHd});
  auto args = [&](int64_t t0, int64_t t1) {
    AttentionArgs a;
    a.q = q.view().RowSlice(t0, t1);
    a.scale = 0.125f;
    a.q_pos = q_pos.data() + t0;
    a.kv.k = k.data();
    a.kv.v = v.data();
    a.kv.dtype = kv_dtype;
    a.kv.slot_pos = slot_pos.data();
    a.kv.capacity = static_cast<int32_t>(tokens);
    a.kv.used = static_cast<int32_t>(tokens);
    a.heads = kHeads;
    a.head_dim = kHd;
    a.out = out.view().RowSlice(t0, t1);
    a.per_query = mode != 1;
    return a;
  };
  for (auto _ : state) {
    Status st;
    if (mode == 2) {
      for (int64_t t = 0; t < tokens && st.ok(); ++t) st = Attention(cpu, args(t, t + 1));
    } else {
      st = Attention(cpu, args(0, tokens));
    }
    if (!st.ok()) state.SkipWithError(st.ToString().c_str());
    benchmark::DoNotOptimize(out.data());
  }
  const double pairs = static_cast<double>(tokens) * (tokens + 1) / 2 * kHeads;
  state.counters["GFLOP/s"] = benchmark::Counter(4.0 * kHd * pairs * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string("kv ") + DTypeName(kv_dtype) +
                 (mode == 0 ? " per_query" : mode == 1 ? " gemm" : " one query per call"));
}

BENCHMARK(BM_AttentionPrefill)
    ->ArgNames({"tokens", "kv_dtype", "mode"})
    ->ArgsProduct({{512}, {kF16, kI8}, {0, 1, 2}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

void BM_ReadBandwidth(benchmark::State& state) {
  for (auto _ : state) {
    double bw = MeasureReadBandwidthBytesPerSec(Cpu().pool());
    state.counters["GB/s"] = bw * 1e-9;
  }
}
BENCHMARK(BM_ReadBandwidth)->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace deja::kernels

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  using deja::kernels::BandwidthBytesPerSec;
  using deja::kernels::Cpu;
  BandwidthBytesPerSec() = deja::kernels::MeasureReadBandwidthBytesPerSec(Cpu().pool());
  std::printf("backend: %s\nOpenBLAS: %s (%d thread per call)\nread bandwidth: %.2f GB/s\n",
              Cpu().name().c_str(), openblas_get_config(), openblas_get_num_threads(),
              BandwidthBytesPerSec() * 1e-9);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
