// RetainScores on the CPU (Locret retaining heads, kernels/op_table.h): per head, the token rows'
// [q, k, v] gathered into a scratch block, one sgemm against the head's W1, then bias, ReLU and
// the dot with w2 per row. Token blocks are spread over the backend's pool; each pool thread
// calls single-threaded OpenBLAS, or on a batch-invariant backend (Backend::batch_invariant) the
// streaming kernel, whose rows are the same bits however many share the call.
#include <cblas.h>

#include <algorithm>
#include <vector>

#include "common/thread_pool.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/simd.h"

namespace deja::kernels::cpu {

Status CpuRetainScores(Backend& backend, const RetainArgs& a) {
  constexpr int64_t kBlockRows = 64;
  const int32_t hd = a.head_dim, in = 3 * hd, hidden = a.hidden;
  const int64_t blocks = (a.n + kBlockRows - 1) / kBlockRows;
  const bool invariant = backend.batch_invariant();
  auto run = [&](int64_t b0, int64_t b1) {
    thread_local std::vector<float> x, u;
    x.resize(static_cast<size_t>(kBlockRows) * in);
    u.resize(static_cast<size_t>(kBlockRows) * hidden);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = b * kBlockRows, rows = std::min<int64_t>(kBlockRows, a.n - r0);
      for (int32_t h = 0; h < a.heads; ++h) {
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t at = (r0 + r) * a.row_stride + static_cast<int64_t>(h) * hd;
          float* xr = x.data() + r * in;
          std::copy_n(a.q + at, hd, xr);
          std::copy_n(a.k + at, hd, xr + hd);
          std::copy_n(a.v + at, hd, xr + 2 * hd);
        }
        const float* w1 = a.w1 + static_cast<int64_t>(h) * hidden * in;
        if (invariant) {
          LinearSmallM(x.data(), rows, in, w1, DType::kF32, 0, hidden, LinearEpilogue{}, u.data(),
                       hidden);
        } else {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows), hidden,
                      in, 1.0f, x.data(), in, w1, in, 0.0f, u.data(), hidden);
        }
        const float* b1h = a.b1 + static_cast<int64_t>(h) * hidden;
        const float* w2h = a.w2 + static_cast<int64_t>(h) * hidden;
        for (int64_t r = 0; r < rows; ++r) {
          const float* ur = u.data() + r * hidden;
          float s = 0.f;
          for (int32_t j = 0; j < hidden; ++j) s += std::max(ur[j] + b1h[j], 0.f) * w2h[j];
          a.out[(r0 + r) * a.heads + h] = s + a.b2[h];
        }
      }
    }
  };
  if (ThreadPool* pool = backend.pool(); pool != nullptr && blocks > 1) {
    pool->ParallelFor(blocks, run);
  } else {
    run(0, blocks);
  }
  return Status::Ok();
}

}  // namespace deja::kernels::cpu
