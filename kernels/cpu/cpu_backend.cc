// The CPU backend: owns the thread pool, wires the op table (Linear, the gathers and attention
// live in their own files) and implements the light row-wise ops here.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "common/thread_pool.h"
#include "kernels/backend.h"
#include "kernels/cpu/bf16_dot.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/simd.h"
#include "kernels/reference/reference_ops.h"

namespace deja::kernels {
namespace cpu {
namespace {

// Elements below which an element-wise op stays on the calling thread.
constexpr int64_t kMinParallelElements = 1 << 14;

int64_t MinRows(int64_t cols) { return std::max<int64_t>(1, kMinParallelElements / cols); }

Status CpuEmbedding(Backend& backend, TensorView table, const int32_t* ids, bool, int64_t n,
                    bool accumulate, TensorView out) {
  const int64_t dim = table.cols();
  const bool int8 = table.dtype == DType::kI8;
  if (table.layout == Layout::kTiled16) {  // a row is every other value of its tile lane
    for (int64_t i = 0; i < n; ++i) {
      float* o = out.as<float>() + i * dim;
      const float scale = int8 ? table.scale[ids[i]] : 1.f;
      for (int64_t c = 0; c < dim; ++c) {
        const int64_t at = TiledIndex(ids[i], c, dim);
        const float v =
            int8 ? table.as<int8_t>()[at] * scale : BF16ToFloat(table.as<uint16_t>()[at]);
        o[c] = accumulate ? o[c] + v : v;
      }
    }
    return Status::Ok();
  }
  const size_t row_bytes = static_cast<size_t>(dim) * DTypeSize(table.dtype);
  backend.pool()->ParallelFor(
      n,
      [&](int64_t i0, int64_t i1) {
        std::vector<float> row(int8 ? static_cast<size_t>(dim) : 0);
        for (int64_t i = i0; i < i1; ++i) {
          const void* src = static_cast<const char*>(table.data) + ids[i] * row_bytes;
          float* o = out.as<float>() + i * dim;
          if (!int8) {
            ConvertToF32(src, table.dtype, dim, o, accumulate);
            continue;
          }
          ConvertToF32(src, DType::kI8, dim, row.data(), false);
          const float scale = table.scale[ids[i]];
          for (int64_t c = 0; c < dim; ++c) o[c] = (accumulate ? o[c] : 0.f) + row[c] * scale;
        }
      },
      MinRows(dim));
  return Status::Ok();
}

Status CpuLayerNorm(Backend& backend, TensorView x, TensorView gamma, TensorView beta, float eps,
                    TensorView out) {
  const int64_t dim = x.cols();
  std::vector<float> g(static_cast<size_t>(dim)), b(static_cast<size_t>(dim));
  ConvertToF32(gamma.data, gamma.dtype, dim, g.data(), false);
  ConvertToF32(beta.data, beta.dtype, dim, b.data(), false);
  backend.pool()->ParallelFor(
      x.rows(),
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          LayerNormRow(x.as<float>() + r * dim, dim, g.data(), b.data(), eps,
                       out.as<float>() + r * dim);
        }
      },
      MinRows(dim));
  return Status::Ok();
}

Status CpuAdd(Backend& backend, TensorView x, TensorView bias, TensorView out) {
  if (bias.data == nullptr) {
    backend.pool()->ParallelFor(
        x.numel(),
        [&](int64_t i0, int64_t i1) { AddInto(x.as<float>() + i0, out.as<float>() + i0, i1 - i0); },
        kMinParallelElements);
    return Status::Ok();
  }
  const int64_t cols = x.cols();
  std::vector<float> b(static_cast<size_t>(cols));
  ConvertToF32(bias.data, bias.dtype, cols, b.data(), false);
  backend.pool()->ParallelFor(
      x.rows(),
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          AddBiasedInto(x.as<float>() + r * cols, b.data(), out.as<float>() + r * cols, cols);
        }
      },
      MinRows(cols));
  return Status::Ok();
}

Status CpuLogSoftmax(Backend& backend, TensorView x, TensorView out) {
  const int64_t cols = x.cols();
  backend.pool()->ParallelFor(
      x.rows(),
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const float* xr = x.as<float>() + r * cols;
          const float max_v = MaxOf(xr, cols);
          const float log_sum = std::log(SumExpShift(xr, cols, max_v));
          SubtractTwice(xr, cols, max_v, log_sum, out.as<float>() + r * cols);
        }
      },
      MinRows(cols));
  return Status::Ok();
}

Status CpuTopK(Backend& backend, TensorView x, int32_t k, float* values, int32_t* indices) {
  const int64_t cols = x.cols();
  backend.pool()->ParallelFor(
      x.rows(),
      [&](int64_t r0, int64_t r1) {
        thread_local std::vector<int32_t> order;
        order.resize(static_cast<size_t>(cols));
        for (int64_t r = r0; r < r1; ++r) {
          const float* xr = x.as<float>() + r * cols;
          // A strict total order (NaN lowest, then index), so any selection algorithm returns
          // exactly what the reference's stable sort does.
          auto before = [xr](int32_t a, int32_t b) {
            const bool nan_a = std::isnan(xr[a]), nan_b = std::isnan(xr[b]);
            if (nan_a != nan_b) return nan_b;
            if (!nan_a && xr[a] != xr[b]) return xr[a] > xr[b];
            return a < b;
          };
          std::iota(order.begin(), order.end(), 0);
          std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
          for (int32_t j = 0; j < k; ++j) {
            indices[r * k + j] = order[j];
            values[r * k + j] = xr[order[j]];
          }
        }
      },
      MinRows(cols));
  return Status::Ok();
}

class CpuBackend final : public Backend {
 public:
  // The reference's table (KvWrite, Convert and MaskUnits stay the reference's: paged caches in
  // a host KV block pool write through it), the ops this backend speeds up overridden.
  explicit CpuBackend(int threads)
      : pool_(std::make_unique<ThreadPool>(threads)), table_(ReferenceOpTable()) {
    // One OpenBLAS thread per call: the pool threads call sgemm on disjoint slices (linear.cc).
    openblas_set_num_threads(1);
    table_.embedding = CpuEmbedding;
    table_.layer_norm = CpuLayerNorm;
    table_.linear = CpuLinear;
    table_.attention = CpuAttention;
    table_.add = CpuAdd;
    table_.log_softmax = CpuLogSoftmax;
    table_.top_k = CpuTopK;
    table_.gather_linear = CpuGatherLinear;
    table_.gather_linear_t = CpuGatherLinearT;
    table_.kv_evict = CpuKvEvict;
    table_.retain_scores = CpuRetainScores;
  }
  BackendKind kind() const override { return BackendKind::kCpu; }
  bool SupportsPagedKv() const override { return true; }
  std::string name() const override {
    return std::string("cpu(") + SimdTargetName() + ", " + std::to_string(pool_->num_threads()) +
           " threads)";
  }
  const OpTable& ops() const override { return table_; }
  Device device() const override { return Device::Host(); }
  // One thread of its own: this backend's pool is busy with the block the side work overlaps.
  std::unique_ptr<Backend> MakeSideBackend() const override { return MakeCpuBackend(1); }
  bool Supports(OpId op, DType dtype) const override {
    return SupportedByFullBackend(op, dtype);
  }
  bool SupportsTiled(OpId op) const override {
    return op == OpId::kLinear || op == OpId::kEmbedding;
  }
  // DEJA_CPU_TILED=0 keeps bf16 and int8 weights row-major (for A/B runs against the row-major
  // kernel).
  bool PrefersTiled(DType dtype) const override {
    static const bool off = [] {
      const char* env = std::getenv("DEJA_CPU_TILED");
      return env != nullptr && std::string(env) == "0";
    }();
    return (dtype == DType::kBF16 || dtype == DType::kI8) && Bf16DotEnabled() && !off;
  }
  ThreadPool* pool() const override { return pool_.get(); }

 private:
  std::unique_ptr<ThreadPool> pool_;
  OpTable table_;
};

}  // namespace
}  // namespace cpu

std::unique_ptr<Backend> MakeCpuBackend(int threads) {
  return std::make_unique<cpu::CpuBackend>(threads);
}

}  // namespace deja::kernels
