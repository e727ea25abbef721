#include "worker/prefix/importance.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "common/kv_row.h"
#include "common/vec_math.h"

namespace deja::worker::prefix {

Status ImportanceOptions::Validate(int32_t heads) const {
  if (!(kept_fraction > 0.f && kept_fraction <= 1.f)) {
    return InvalidArgument("the kept fraction must be in (0, 1], got " +
                           std::to_string(kept_fraction));
  }
  if (!(alpha > 0.f) || !std::isfinite(alpha)) {
    return InvalidArgument("alpha must be a positive number, got " + std::to_string(alpha));
  }
  if (probe_heads.size() < 2) return InvalidArgument("at least two probe heads are needed");
  if (dense_layers < 0) return InvalidArgument("dense layers must be >= 0");
  for (int32_t h : probe_heads) {
    if (h < 0 || h >= heads) {
      return InvalidArgument("probe head " + std::to_string(h) + " is not in [0, " +
                             std::to_string(heads) + ")");
    }
  }
  return Status::Ok();
}

double JaccardThreshold(double kept_fraction, double alpha) {
  const double j = kept_fraction / (2.0 - kept_fraction);
  return std::pow(j, alpha);
}

double Jaccard(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  if (a.empty() && b.empty()) return 1.0;
  std::vector<int32_t> both;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
  const double inter = static_cast<double>(both.size());
  return inter / (static_cast<double>(a.size() + b.size()) - inter);
}

StatusOr<LayerChoice> ChooseImportant(const kernels::KvView& kv, int32_t prefix, const float* q,
                                      int64_t q_stride, int32_t n, int32_t heads, int32_t head_dim,
                                      float scale, const ImportanceOptions& o) {
  DEJA_RETURN_IF_ERROR(o.Validate(heads));
  if (!kv.device.is_host()) return FailedPrecondition("important-token loading needs a host cache");
  LayerChoice out;
  if (prefix <= 0) return out;
  const int32_t k = std::clamp(
      static_cast<int32_t>(std::lround(o.kept_fraction * static_cast<double>(prefix))), 1, prefix);
  const size_t row_bytes = KvRowBytes(kv.dtype, head_dim);
  // Keys transposed ([head_dim][prefix]) so that a query's logits are axpy's over the prefix,
  // which vectorize; exps through vec_math.
  std::vector<float> row(static_cast<size_t>(head_dim));
  std::vector<float> key_t(static_cast<size_t>(prefix) * head_dim);
  std::vector<float> logit(prefix), importance(prefix);
  std::vector<int32_t> order(prefix);
  std::vector<std::vector<int32_t>> sets;
  for (int32_t h : o.probe_heads) {
    for (int32_t s = 0; s < prefix; ++s) {
      const int64_t at = kernels::KvSlotIndex(kv, h, s);
      KvRowToF32(static_cast<const char*>(kv.k) + at * row_bytes, kv.dtype, head_dim, row.data());
      for (int32_t d = 0; d < head_dim; ++d) key_t[static_cast<size_t>(d) * prefix + s] = row[d];
    }
    std::fill(importance.begin(), importance.end(), 0.f);
    for (int32_t i = 0; i < n; ++i) {
      const float* qi = q + i * q_stride + static_cast<int64_t>(h) * head_dim;
      std::fill(logit.begin(), logit.end(), 0.f);
      float* lg = logit.data();
      for (int32_t d = 0; d < head_dim; ++d) {
        const float qd = qi[d] * scale;
        const float* kd = key_t.data() + static_cast<size_t>(d) * prefix;
        for (int32_t s = 0; s < prefix; ++s) lg[s] += qd * kd[s];
      }
      const float sum = ExpShiftInPlace(lg, prefix, MaxOf(lg, prefix));
      const float inv = 1.f / sum;
      float* imp = importance.data();
      for (int32_t s = 0; s < prefix; ++s) imp[s] += lg[s] * inv;
    }
    std::iota(order.begin(), order.end(), 0);
    // Highest importance first; ties to the earlier position.
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      return importance[a] > importance[b] || (importance[a] == importance[b] && a < b);
    });
    std::vector<int32_t> set(order.begin(), order.begin() + k);
    std::sort(set.begin(), set.end());
    sets.push_back(std::move(set));
  }
  // Mean pairwise similarity, and each probe's agreement with the others.
  const size_t m = sets.size();
  std::vector<double> agree(m, 0.0);
  double total = 0;
  int pairs = 0;
  for (size_t a = 0; a < m; ++a) {
    for (size_t b = a + 1; b < m; ++b) {
      const double j = Jaccard(sets[a], sets[b]);
      agree[a] += j;
      agree[b] += j;
      total += j;
      ++pairs;
    }
  }
  out.mean_jaccard = total / pairs;
  out.fallback = out.mean_jaccard < JaccardThreshold(o.kept_fraction, o.alpha);
  if (out.fallback) {
    out.kept.resize(prefix);
    std::iota(out.kept.begin(), out.kept.end(), 0);
  } else {
    out.kept = sets[std::max_element(agree.begin(), agree.end()) - agree.begin()];
  }
  return out;
}

void KeepOnly(const kernels::KvView& kv, int32_t prefix, int32_t heads,
              const std::vector<int32_t>& kept) {
  int32_t* pos = const_cast<int32_t*>(kv.slot_pos);
  for (int32_t h = 0; h < heads; ++h) {
    size_t next = 0;
    for (int32_t s = 0; s < prefix; ++s) {
      if (next < kept.size() && kept[next] == s) {
        ++next;
        continue;
      }
      pos[kernels::KvSlotIndex(kv, h, s)] = -1;
    }
  }
}

}  // namespace deja::worker::prefix
