// `deja ppl --locret-oracle`: a dense run of each window records q and k per layer, and every
// token is scored by the attention the scored queries give it.
#include "lab/locret_oracle.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "lab/collection.h"

namespace deja::worker::locret {
namespace {

// The lowest score a token gets: below anything a log probability reaches, finite so that
// ranking never compares infinities.
constexpr float kNever = -1e30f;

class QkRecorder : public model::LayerObserver {
 public:
  QkRecorder(int32_t layers, int32_t heads, int32_t head_dim, int32_t from, OracleKind kind,
             int32_t positions)
      : heads_(heads),
        head_dim_(head_dim),
        from_(from),
        kind_(kind),
        positions_(positions),
        table_(static_cast<size_t>(layers) * positions * heads, kNever),
        seen_(layers, false) {}

  void OnAttention(int32_t, const TensorView&, const TensorView&) override {}
  void OnMlp(int32_t, const TensorView&, const TensorView&) override {}
  void OnQkv(int32_t l, const float* q, const float* k, const float*, int64_t stride,
             int64_t rows) override {
    if (l < 0 || l >= static_cast<int32_t>(seen_.size()) || rows != positions_) {
      status_ = Internal("locret oracle: unexpected q/k of layer " + std::to_string(l) + " with " +
                         std::to_string(rows) + " rows");
      return;
    }
    seen_[l] = true;
    std::vector<float> head(positions_);
    for (int32_t h = 0; h < heads_; ++h) {
      OracleScores(q, k, stride, static_cast<int64_t>(h) * head_dim_, positions_, from_, head_dim_,
                   kind_, head.data());
      for (int32_t j = 0; j < positions_; ++j) {
        table_[(static_cast<size_t>(l) * positions_ + j) * heads_ + h] = head[j];
      }
    }
  }

  Status Finish() const {
    if (!status_.ok()) return status_;
    if (std::find(seen_.begin(), seen_.end(), false) != seen_.end()) {
      return Internal("locret oracle: the dense run did not report every layer's q and k");
    }
    return Status::Ok();
  }
  std::vector<float>& table() { return table_; }

 private:
  int32_t heads_, head_dim_, from_;
  OracleKind kind_;
  int32_t positions_;
  std::vector<float> table_;
  std::vector<bool> seen_;
  Status status_;
};

}  // namespace

void OracleScores(const float* q, const float* k, int64_t stride, int64_t offset, int32_t n,
                  int32_t from, int32_t head_dim, OracleKind kind, float* scores) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  std::vector<double> best(static_cast<size_t>(n), -std::numeric_limits<double>::infinity());
  std::vector<double> mass(static_cast<size_t>(n), 0.0);
  std::vector<double> logit(static_cast<size_t>(n));
  for (int32_t i = std::max(from, 0); i < n; ++i) {
    const float* qi = q + i * stride + offset;
    double mx = -std::numeric_limits<double>::infinity();
    for (int32_t j = 0; j <= i; ++j) {
      const float* kj = k + j * stride + offset;
      float dot = 0.f;
      for (int32_t c = 0; c < head_dim; ++c) dot += qi[c] * kj[c];
      logit[j] = static_cast<double>(dot * scale);
      mx = std::max(mx, logit[j]);
    }
    double z = 0;
    for (int32_t j = 0; j <= i; ++j) z += std::exp(logit[j] - mx);
    const double lse = mx + std::log(z);
    for (int32_t j = 0; j <= i; ++j) {
      best[j] = std::max(best[j], logit[j] - lse);
      mass[j] += std::exp(logit[j] - lse);
    }
  }
  for (int32_t j = 0; j < n; ++j) {
    const double s = kind == OracleKind::kMax ? best[j] : std::log(mass[j]);
    scores[j] = std::isfinite(s) ? static_cast<float>(s) : kNever;
  }
}

OracleScorer::OracleScorer(model::Model& model, OracleKind kind, int32_t skip_first)
    : model_(model), kind_(kind), skip_first_(std::max(skip_first, 0)) {}

OracleScorer::~OracleScorer() { (void)model_.SetRetainingOverride({}, 0); }

Status OracleScorer::Prepare(const std::vector<int32_t>& tokens, int32_t from) {
  const auto& c = model_.config();
  const int32_t n = static_cast<int32_t>(tokens.size());
  if (from < 0 || from >= n) {
    return InvalidArgument("locret oracle: the scored queries start at " + std::to_string(from) +
                           ", outside the window's " + std::to_string(n) + " positions");
  }
  if (model_.comm().world_size() != 1) {
    return FailedPrecondition("the locret oracle runs the whole model in one process");
  }
  // The dense run must not itself take the override's scores.
  DEJA_RETURN_IF_ERROR(model_.SetRetainingOverride({}, 0));
  const int32_t heads = static_cast<int32_t>(c.num_attention_heads);
  QkRecorder rec(static_cast<int32_t>(c.num_hidden_layers), heads,
                 static_cast<int32_t>(c.head_dim()), from, kind_, n);
  model_.set_observer(&rec);
  model::StepResult step;
  Status st = model::ForwardWindow(model_, tokens, &step);
  model_.set_observer(nullptr);
  DEJA_RETURN_IF_ERROR(st.WithContext("locret oracle: dense run"));
  DEJA_RETURN_IF_ERROR(rec.Finish());
  table_ = std::move(rec.table());
  const int32_t skip = std::min(skip_first_, n);
  for (size_t l = 0; l < static_cast<size_t>(c.num_hidden_layers); ++l) {
    std::fill_n(table_.begin() + static_cast<std::ptrdiff_t>(l * n * heads),
                static_cast<size_t>(skip) * heads, kNever);
  }
  return model_.SetRetainingOverride(table_, n);
}

}  // namespace deja::worker::locret
