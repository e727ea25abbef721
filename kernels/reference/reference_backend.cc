// The reference backend: the obviously-correct definition of every op, single-threaded, reading
// weights element by element with LoadAsFloat and accumulating in double. Tests compare every
// other backend against it; it is not meant to be fast.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "common/int4.h"
#include "common/kv_row.h"
#include "common/vec_math.h"
#include "kernels/backend.h"
#include "kernels/op_table.h"
#include "kernels/reference/reference_ops.h"

namespace deja::kernels {
namespace {

float At(const TensorView& v, int64_t i) {
  return LoadAsFloat(v.data, v.dtype, static_cast<size_t>(i));
}

// Element i of a matrix whose scale index (row of a weight, column of a transposed one) is s: an
// int8 value times its scale, any other dtype as stored.
double WeightAt(const TensorView& w, int64_t i, int64_t s) {
  const double v = At(w, i);
  return w.dtype == DType::kI8 ? v * static_cast<double>(w.scale[s]) : v;
}

// An activation as a weight of dtype w sees it: bf16 and int8 weights multiply x rounded to bf16
// (the contract of every backend, kernels/op_table.h); other dtypes multiply x itself.
double XFor(float x, DType w) {
  return w == DType::kBF16 || w == DType::kI8 ? BF16ToFloat(FloatToBF16(x))
                                              : static_cast<double>(x);
}

Status RefEmbedding(Backend&, TensorView table, const int32_t* ids, bool, int64_t n, bool accumulate,
                    TensorView out) {
  int64_t dim = table.cols();
  float* o = out.as<float>();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < dim; ++c) {
      const int64_t at =
          table.layout == Layout::kTiled16 ? TiledIndex(ids[i], c, dim) : ids[i] * dim + c;
      const float v = static_cast<float>(WeightAt(table, at, ids[i]));
      o[i * dim + c] = accumulate ? o[i * dim + c] + v : v;
    }
  }
  return Status::Ok();
}

Status RefLayerNorm(Backend&, TensorView x, TensorView gamma, TensorView beta, float eps,
                    TensorView out) {
  int64_t dim = x.cols();
  for (int64_t r = 0; r < x.rows(); ++r) {
    const float* xr = x.as<float>() + r * dim;
    double mean = 0;
    for (int64_t c = 0; c < dim; ++c) mean += xr[c];
    mean /= dim;
    double var = 0;
    for (int64_t c = 0; c < dim; ++c) var += (xr[c] - mean) * (xr[c] - mean);
    var /= dim;
    double inv = 1.0 / std::sqrt(var + eps);
    float* orow = out.as<float>() + r * dim;  // may alias xr: each element is read before written
    for (int64_t c = 0; c < dim; ++c) {
      orow[c] = static_cast<float>((xr[c] - mean) * inv * At(gamma, c) + At(beta, c));
    }
  }
  return Status::Ok();
}

// Linear over int4 weights (common/int4.h): each row of x quantized to int8, symmetric, the
// integer products of each group summed exactly and times the group's scale, the groups' terms
// summed, times x's scale.
Status RefLinearI4(TensorView x, TensorView w, TensorView bias, Activation act, bool accumulate,
                   TensorView out) {
  const int64_t m_rows = x.rows(), k_dim = x.cols(), n_rows = w.rows();
  const int64_t group = w.scale_group, groups = k_dim / group;
  const auto* packed = static_cast<const uint8_t*>(w.data);
  std::vector<int> q(static_cast<size_t>(k_dim));
  float* o = out.as<float>();
  for (int64_t m = 0; m < m_rows; ++m) {
    const float* xm = x.as<float>() + m * k_dim;
    float amax = 0.f;
    for (int64_t k = 0; k < k_dim; ++k) amax = std::max(amax, std::fabs(xm[k]));
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    for (int64_t k = 0; k < k_dim; ++k) q[k] = static_cast<int>(std::nearbyint(xm[k] * inv));
    const double x_scale = amax / 127.f;
    for (int64_t n = 0; n < n_rows; ++n) {
      double acc = 0;
      for (int64_t g = 0; g < groups; ++g) {
        int64_t dot = 0;
        for (int64_t k = g * group; k < (g + 1) * group; ++k) {
          dot += static_cast<int64_t>(q[k]) * Int4Value(packed, n, k, k_dim);
        }
        acc += static_cast<double>(dot) * w.scale[Int4ScaleIndex(n, g, groups)];
      }
      double v = acc * x_scale + (bias.data != nullptr ? At(bias, n) : 0.0);
      if (act == Activation::kRelu) v = std::max(v, 0.0);
      if (accumulate) v += o[m * n_rows + n];
      o[m * n_rows + n] = static_cast<float>(v);
    }
  }
  return Status::Ok();
}

Status RefLinear(Backend&, TensorView x, TensorView w, TensorView bias, Activation act,
                 bool accumulate, TensorView out) {
  if (w.dtype == DType::kI4) return RefLinearI4(x, w, bias, act, accumulate, out);
  int64_t m_rows = x.rows(), k_dim = x.cols(), n_rows = w.rows();
  const float* xs = x.as<float>();
  float* o = out.as<float>();
  for (int64_t m = 0; m < m_rows; ++m) {
    for (int64_t n = 0; n < n_rows; ++n) {
      double acc = bias.data != nullptr ? At(bias, n) : 0.0;
      for (int64_t k = 0; k < k_dim; ++k) {
        const int64_t i = w.layout == Layout::kTiled16 ? TiledIndex(n, k, k_dim) : n * k_dim + k;
        acc += XFor(xs[m * k_dim + k], w.dtype) * WeightAt(w, i, n);
      }
      if (act == Activation::kRelu) acc = std::max(acc, 0.0);
      if (accumulate) acc += o[m * n_rows + n];
      o[m * n_rows + n] = static_cast<float>(acc);
    }
  }
  return Status::Ok();
}

Status RefAttention(Backend&, const AttentionArgs& a) {
  const KvView& kv = a.kv;
  int64_t d = a.head_dim, width = static_cast<int64_t>(a.heads) * d;
  std::vector<double> p(kv.used);
  std::vector<float> row(static_cast<size_t>(d));
  std::vector<int16_t> q16(static_cast<size_t>(d));
  const size_t row_bytes = KvRowBytes(kv.dtype, d);
  // Slot `at`'s key or value row as f32 (int8 rows times their scale).
  auto load = [&](const void* base, int64_t at) {
    KvRowToF32(static_cast<const char*>(base) + at * row_bytes, kv.dtype, d, row.data());
    return row.data();
  };
  for (int64_t t = 0; t < a.q.rows(); ++t) {
    for (int64_t h = 0; h < a.heads; ++h) {
      const float* q = a.q.as<float>() + t * width + h * d;
      float* out = a.out.as<float>() + t * width + h * d;
      const int64_t cache_head = a.head_ids != nullptr ? a.head_ids[h] : h;
      if (a.keep != nullptr && a.keep[t * a.heads + h] == 0) {
        std::fill(out, out + d, 0.f);
        continue;
      }
      double max_score = -std::numeric_limits<double>::infinity();
      std::vector<bool> visible(kv.used, false);
      const double q16_scale = kv.dtype == DType::kI8 ? KvQueryToI16(q, d, q16.data()) : 1.0;
      for (int64_t s = 0; s < kv.used; ++s) {
        const int64_t at = KvSlotIndex(kv, cache_head, s);
        int32_t pos = kv.slot_pos[at];
        if (pos < 0 || pos > a.q_pos[t]) continue;
        visible[s] = true;
        double dot = 0;
        const float* key = load(kv.k, at);
        if (kv.dtype == DType::kI8) {
          // int8 K rows meet the query rounded to int16 (common/kv_row.h).
          for (int64_t i = 0; i < d; ++i) dot += static_cast<double>(q16[i]) * key[i];
          dot *= q16_scale;
        } else {
          for (int64_t i = 0; i < d; ++i) dot += static_cast<double>(q[i]) * key[i];
        }
        dot *= a.scale;
        p[s] = dot;
        max_score = std::max(max_score, dot);
      }
      double sum = 0;
      for (int64_t s = 0; s < kv.used; ++s) {
        if (!visible[s]) continue;
        p[s] = std::exp(p[s] - max_score);
        sum += p[s];
      }
      std::vector<double> acc(d, 0.0);
      for (int64_t s = 0; s < kv.used; ++s) {
        if (!visible[s]) continue;
        double prob = p[s] / sum;
        const int64_t at = KvSlotIndex(kv, cache_head, s);
        const float* value = load(kv.v, at);
        for (int64_t i = 0; i < d; ++i) acc[i] += prob * value[i];
        if (kv.score != nullptr) kv.score[at] += static_cast<float>(prob);
      }
      for (int64_t i = 0; i < d; ++i) out[i] = static_cast<float>(acc[i]);
    }
  }
  return Status::Ok();
}

Status RefGatherLinear(Backend&, TensorView x, TensorView w, TensorView bias, const int32_t* rows,
                       int64_t n_rows, Activation act, bool accumulate, TensorView out) {
  const int64_t m_rows = x.rows(), k_dim = x.cols();
  const float* xs = x.as<float>();
  float* o = out.as<float>();
  for (int64_t m = 0; m < m_rows; ++m) {
    for (int64_t j = 0; j < n_rows; ++j) {
      const int64_t n = rows[j];
      double acc = bias.data != nullptr ? At(bias, n) : 0.0;
      for (int64_t k = 0; k < k_dim; ++k) {
        const int64_t i = w.layout == Layout::kTiled16 ? TiledIndex(n, k, k_dim) : n * k_dim + k;
        acc += XFor(xs[m * k_dim + k], w.dtype) * WeightAt(w, i, n);
      }
      if (act == Activation::kRelu) acc = std::max(acc, 0.0);
      if (accumulate) acc += o[m * n_rows + j];
      o[m * n_rows + j] = static_cast<float>(acc);
    }
  }
  return Status::Ok();
}

Status RefGatherLinearT(Backend&, TensorView x, TensorView wt, const int32_t* rows, int64_t n_rows,
                        bool accumulate, TensorView out) {
  const int64_t m_rows = x.rows(), n_dim = wt.cols();
  const float* xs = x.as<float>();
  float* o = out.as<float>();
  for (int64_t m = 0; m < m_rows; ++m) {
    for (int64_t n = 0; n < n_dim; ++n) {
      double acc = 0.0;
      for (int64_t j = 0; j < n_rows; ++j) {
        acc += XFor(xs[m * n_rows + j], wt.dtype) * WeightAt(wt, rows[j] * n_dim + n, n);
      }
      if (accumulate) acc += o[m * n_dim + n];
      o[m * n_dim + n] = static_cast<float>(acc);
    }
  }
  return Status::Ok();
}

Status RefAdd(Backend&, TensorView x, TensorView bias, TensorView out) {
  const int64_t cols = x.cols();
  for (int64_t i = 0; i < x.numel(); ++i) {
    double b = bias.data != nullptr ? At(bias, i % cols) : 0.0;
    out.as<float>()[i] = static_cast<float>(out.as<float>()[i] + (x.as<float>()[i] + b));
  }
  return Status::Ok();
}

Status RefLogSoftmax(Backend&, TensorView x, TensorView out) {
  int64_t cols = x.cols();
  for (int64_t r = 0; r < x.rows(); ++r) {
    const float* xr = x.as<float>() + r * cols;
    double max_v = -std::numeric_limits<double>::infinity();
    for (int64_t c = 0; c < cols; ++c) max_v = std::max<double>(max_v, xr[c]);
    double sum = 0;
    for (int64_t c = 0; c < cols; ++c) sum += std::exp(xr[c] - max_v);
    double log_z = max_v + std::log(sum);
    float* orow = out.as<float>() + r * cols;
    for (int64_t c = 0; c < cols; ++c) orow[c] = static_cast<float>(xr[c] - log_z);
  }
  return Status::Ok();
}

Status RefTopK(Backend&, TensorView x, int32_t k, float* values, int32_t* indices) {
  int64_t cols = x.cols();
  std::vector<int32_t> order(cols);
  for (int64_t r = 0; r < x.rows(); ++r) {
    const float* xr = x.as<float>() + r * cols;
    auto key = [&](int32_t i) {
      return std::isnan(xr[i]) ? -std::numeric_limits<float>::infinity() : xr[i];
    };
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      if (key(a) != key(b)) return key(a) > key(b);
      if (std::isnan(xr[a]) != std::isnan(xr[b])) return !std::isnan(xr[a]);
      return a < b;
    });
    for (int32_t j = 0; j < k; ++j) {
      indices[r * k + j] = order[j];
      values[r * k + j] = xr[order[j]];
    }
  }
  return Status::Ok();
}

}  // namespace

namespace ref {

Status KvWrite(Backend&, const KvView& kv, int32_t heads, int32_t head_dim, const int32_t* slots,
               const int32_t* positions, int32_t n, TensorView k, TensorView v,
               const float* scores) {
  const int64_t width = static_cast<int64_t>(heads) * head_dim;
  const size_t row_bytes = KvRowBytes(kv.dtype, head_dim);
  for (int32_t h = 0; h < heads; ++h) {
    for (int32_t i = 0; i < n; ++i) {
      const int64_t at = KvSlotIndex(kv, h, slots[static_cast<int64_t>(h) * n + i]);
      const int64_t src = i * width + static_cast<int64_t>(h) * head_dim;
      KvRowFromF32(k.as<float>() + src, head_dim, kv.dtype,
                   static_cast<char*>(kv.k) + at * row_bytes);
      KvRowFromF32(v.as<float>() + src, head_dim, kv.dtype,
                   static_cast<char*>(kv.v) + at * row_bytes);
      const_cast<int32_t*>(kv.slot_pos)[at] = positions[i];
      if (kv.score != nullptr) {
        kv.score[at] = scores != nullptr ? scores[static_cast<int64_t>(i) * heads + h] : 0.f;
      }
    }
  }
  return Status::Ok();
}

// Each sequence in turn: its KvWrite, then its one-token Attention, over a KvView made of its
// row of the block table (the plain composition the batched kernels are held to).
Status DecodeAttention(Backend& b, const DecodeAttentionArgs& a) {
  const int64_t width = static_cast<int64_t>(a.heads) * a.head_dim;
  for (int32_t i = 0; i < a.seqs; ++i) {
    KvView kv = a.kv;
    kv.blocks = a.blocks + static_cast<int64_t>(i) * a.max_blocks;
    kv.used = a.used[i];
    kv.capacity = a.max_blocks * a.kv.block_slots;
    const bool keeps = (a.flags[i] & kDecodeKeepsScore) != 0;
    const bool adds = (a.flags[i] & kDecodeAddsScore) != 0;
    kv.score = keeps ? a.kv.score : nullptr;
    TensorView k{const_cast<float*>(a.k + i * a.kv_stride), DType::kF32, Shape{1, width}};
    TensorView v{const_cast<float*>(a.v + i * a.kv_stride), DType::kF32, Shape{1, width}};
    DEJA_RETURN_IF_ERROR(KvWrite(b, kv, a.heads, a.head_dim,
                                 a.slots + static_cast<int64_t>(i) * a.heads, a.q_pos + i, 1, k, v,
                                 nullptr));
    AttentionArgs att;
    att.q = TensorView{const_cast<float*>(a.q + i * a.q_stride), DType::kF32, Shape{1, width}};
    att.scale = a.scale;
    att.q_pos = a.q_pos + i;
    att.kv = kv;
    att.kv.score = adds ? a.kv.score : nullptr;
    att.heads = a.heads;
    att.head_dim = a.head_dim;
    att.out = TensorView{a.out + i * width, DType::kF32, Shape{1, width}};
    DEJA_RETURN_IF_ERROR(RefAttention(b, att));
  }
  return Status::Ok();
}

// Each sequence's KvEvict over a KvView made of its row of the block table, with the arguments of
// its params row.
Status DecodeEvict(Backend& b, const DecodeEvictArgs& a) {
  for (int32_t i = 0; i < a.seqs; ++i) {
    const int32_t* p = a.params + static_cast<int64_t>(i) * kDecodeEvictParams;
    KvEvictArgs e;
    e.rank = static_cast<KvRank>(p[0]);
    e.excess = p[1];
    e.oldest_recent = p[2];
    e.length = p[3];
    std::memcpy(&e.decay, &p[4], sizeof(float));
    if (e.excess == 0 && e.decay == 1.0f) continue;
    const uint64_t address =
        static_cast<uint32_t>(p[5]) | (static_cast<uint64_t>(static_cast<uint32_t>(p[6])) << 32);
    KvView kv = a.kv;
    kv.blocks = a.blocks + static_cast<int64_t>(i) * a.max_blocks;
    kv.used = a.used[i];
    kv.capacity = a.max_blocks * a.kv.block_slots;
    DEJA_RETURN_IF_ERROR(KvEvict(b, kv, a.heads, e, reinterpret_cast<int32_t*>(address)));
  }
  return Status::Ok();
}

Status RetainScores(Backend&, const RetainArgs& a) {
  const int32_t in = 3 * a.head_dim;
  std::vector<float> x(static_cast<size_t>(in));
  for (int32_t i = 0; i < a.n; ++i) {
    for (int32_t h = 0; h < a.heads; ++h) {
      const int64_t at = i * a.row_stride + static_cast<int64_t>(h) * a.head_dim;
      for (int32_t c = 0; c < a.head_dim; ++c) {
        x[c] = a.q[at + c];
        x[a.head_dim + c] = a.k[at + c];
        x[2 * a.head_dim + c] = a.v[at + c];
      }
      double s = a.b2[h];
      for (int32_t j = 0; j < a.hidden; ++j) {
        const float* w = a.w1 + (static_cast<int64_t>(h) * a.hidden + j) * in;
        double u = a.b1[static_cast<int64_t>(h) * a.hidden + j];
        for (int32_t c = 0; c < in; ++c) u += static_cast<double>(w[c]) * x[c];
        if (u > 0) s += static_cast<double>(a.w2[static_cast<int64_t>(h) * a.hidden + j]) * u;
      }
      a.out[static_cast<int64_t>(i) * a.heads + h] = static_cast<float>(s);
    }
  }
  return Status::Ok();
}

Status KvEvict(Backend&, const KvView& kv, int32_t heads, const KvEvictArgs& a, int32_t* victims) {
  struct Cand {
    double rank;
    int32_t pos, slot;
  };
  std::vector<Cand> cand;
  for (int32_t h = 0; h < heads; ++h) {
    if (a.decay != 1.f) {
      for (int32_t s = 0; s < kv.used; ++s) {
        const int64_t at = KvSlotIndex(kv, h, s);
        if (kv.slot_pos[at] >= 0) kv.score[at] *= a.decay;
      }
    }
    cand.clear();
    for (int32_t s = 0; s < kv.used; ++s) {
      const int64_t at = KvSlotIndex(kv, h, s);
      const int32_t pos = kv.slot_pos[at];
      if (pos < 0 || pos >= a.oldest_recent) continue;
      double rank = pos;
      if (a.rank == KvRank::kScore) rank = kv.score[at];
      if (a.rank == KvRank::kMeanScore) {
        rank = kv.score[at] / static_cast<float>(a.length - pos);  // in float, as the policy
      }
      cand.push_back({rank, pos, s});
    }
    std::sort(cand.begin(), cand.end(), [](const Cand& x, const Cand& y) {
      return x.rank < y.rank || (x.rank == y.rank && x.pos < y.pos);
    });
    for (int32_t j = 0; j < a.excess; ++j) {
      int32_t slot = -1;
      if (j < static_cast<int32_t>(cand.size())) {
        slot = cand[j].slot;
        const int64_t at = KvSlotIndex(kv, h, slot);
        const_cast<int32_t*>(kv.slot_pos)[at] = -1;
        if (kv.score != nullptr) kv.score[at] = 0.f;
      }
      victims[static_cast<int64_t>(h) * a.excess + j] = slot;
    }
  }
  return Status::Ok();
}

Status Convert(Backend&, TensorView src, TensorView dst) {
  const int64_t n = src.numel();
  std::vector<float> tmp(static_cast<size_t>(std::min<int64_t>(n, 1 << 16)));
  for (int64_t i0 = 0; i0 < n; i0 += static_cast<int64_t>(tmp.size())) {
    const int64_t m = std::min<int64_t>(static_cast<int64_t>(tmp.size()), n - i0);
    for (int64_t i = 0; i < m; ++i) tmp[i] = At(src, i0 + i);
    ConvertFromF32(tmp.data(), m, dst.dtype,
                   static_cast<char*>(dst.data) + static_cast<size_t>(i0) * DTypeSize(dst.dtype));
  }
  return Status::Ok();
}

Status MaskUnits(Backend&, TensorView x, const uint8_t* keep, int32_t unit_width) {
  const int64_t rows = x.rows(), cols = x.cols(), units = cols / unit_width;
  float* p = x.as<float>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t u = 0; u < units; ++u) {
      if (keep[r * units + u] != 0) continue;
      for (int64_t c = u * unit_width; c < (u + 1) * unit_width; ++c) p[r * cols + c] = 0.0f;
    }
  }
  return Status::Ok();
}

Status LinearI8QuantizedX(TensorView x, TensorView w, TensorView bias, Activation act,
                          bool accumulate, TensorView out) {
  const int64_t m_rows = x.rows(), k_dim = x.cols(), n_rows = w.rows();
  std::vector<int> q(static_cast<size_t>(k_dim));
  float* o = out.as<float>();
  for (int64_t m = 0; m < m_rows; ++m) {
    const float* xm = x.as<float>() + m * k_dim;
    float amax = 0.f, lo = 0.f;
    for (int64_t k = 0; k < k_dim; ++k) {
      amax = std::max(amax, std::fabs(xm[k]));
      lo = std::min(lo, xm[k]);
    }
    // A row without negative values uses all 255 steps above zero; q is x / scale, the zero
    // point (0 or 128) left out: it only shifts the kernels' unsigned operand.
    const float levels = lo >= 0.f ? 255.f : 127.f;
    const float inv = amax > 0.f ? levels / amax : 0.f;
    for (int64_t k = 0; k < k_dim; ++k) q[k] = static_cast<int>(std::nearbyint(xm[k] * inv));
    const double x_scale = amax / levels;
    for (int64_t n = 0; n < n_rows; ++n) {
      int64_t dot = 0;
      for (int64_t k = 0; k < k_dim; ++k) {
        const int64_t i = w.layout == Layout::kTiled16 ? TiledIndex(n, k, k_dim) : n * k_dim + k;
        dot += q[k] * static_cast<int64_t>(w.as<int8_t>()[i]);
      }
      double v = static_cast<double>(dot) * x_scale * w.scale[n] +
                 (bias.data != nullptr ? At(bias, n) : 0.0);
      if (act == Activation::kRelu) v = std::max(v, 0.0);
      if (accumulate) v += o[m * n_rows + n];
      o[m * n_rows + n] = static_cast<float>(v);
    }
  }
  return Status::Ok();
}

}  // namespace ref

namespace {

OpTable MakeReferenceTable() {
  OpTable t;
  t.embedding = RefEmbedding;
  t.layer_norm = RefLayerNorm;
  t.linear = RefLinear;
  t.attention = RefAttention;
  t.add = RefAdd;
  t.log_softmax = RefLogSoftmax;
  t.top_k = RefTopK;
  t.gather_linear = RefGatherLinear;
  t.gather_linear_t = RefGatherLinearT;
  t.kv_write = ref::KvWrite;
  t.kv_evict = ref::KvEvict;
  t.retain_scores = ref::RetainScores;
  t.convert = ref::Convert;
  t.mask_units = ref::MaskUnits;
  t.decode_attention = ref::DecodeAttention;
  t.decode_evict = ref::DecodeEvict;
  return t;
}

class ReferenceBackend final : public Backend {
 public:
  ReferenceBackend() : table_(ReferenceOpTable()) {}
  BackendKind kind() const override { return BackendKind::kReference; }
  std::string name() const override { return "reference"; }
  Device device() const override { return Device::Host(); }
  // Stateless: another instance serves overlapped work on its own thread.
  std::unique_ptr<Backend> MakeSideBackend() const override { return MakeReferenceBackend(); }
  const OpTable& ops() const override { return table_; }
  bool Supports(OpId op, DType dtype) const override { return SupportedByFullBackend(op, dtype); }
  bool SupportsTiled(OpId op) const override {
    return op == OpId::kLinear || op == OpId::kEmbedding;
  }
  bool SupportsPagedKv() const override { return true; }

 private:
  OpTable table_;
};

}  // namespace

const OpTable& ReferenceOpTable() {
  static const OpTable table = MakeReferenceTable();
  return table;
}

std::unique_ptr<Backend> MakeReferenceBackend() { return std::make_unique<ReferenceBackend>(); }

}  // namespace deja::kernels
