// `deja collect --locret`: runs whole windows densely with a LayerObserver that keeps each layer's
// q, k and v, turns them into retaining-head rows and labels, then writes them per layer.
#include "lab/locret_collect.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "common/dtype.h"
#include "predictors/retaining_data.h"
#include "lab/collection.h"

namespace deja::worker::locret {
namespace {

using Clock = std::chrono::steady_clock;

// Keeps the last window's rows per layer: x as f16 [context_len, heads, 3 * head_dim] and labels
// [context_len, heads].
class Recorder : public model::LayerObserver {
 public:
  Recorder(const OptConfig& c, int32_t answer, RetainingLabel label_kind)
      : label_kind_(label_kind),
        heads_(static_cast<int32_t>(c.num_attention_heads)),
        head_dim_(static_cast<int32_t>(c.head_dim())),
        answer_(answer),
        x_(c.num_hidden_layers),
        label_(c.num_hidden_layers) {}

  void OnAttention(int32_t, const TensorView&, const TensorView&) override {}
  void OnMlp(int32_t, const TensorView&, const TensorView&) override {}
  void OnQkv(int32_t l, const float* q, const float* k, const float* v, int64_t stride,
             int64_t rows) override {
    if (l < 0 || l >= static_cast<int32_t>(x_.size()) || rows <= answer_) {
      status_ = Internal("collect --locret: unexpected q/k/v of layer " + std::to_string(l) +
                         " with " + std::to_string(rows) + " rows");
      return;
    }
    const int32_t n = static_cast<int32_t>(rows), ctx = n - answer_;
    const int32_t hd = head_dim_, in = 3 * hd;
    auto& x = x_[l];
    x.resize(static_cast<size_t>(ctx) * heads_ * in);
    for (int32_t j = 0; j < ctx; ++j) {
      for (int32_t h = 0; h < heads_; ++h) {
        const int64_t at = j * stride + static_cast<int64_t>(h) * hd;
        uint16_t* dst = x.data() + (static_cast<int64_t>(j) * heads_ + h) * in;
        for (int32_t c = 0; c < hd; ++c) {
          dst[c] = FloatToHalf(q[at + c]);
          dst[hd + c] = FloatToHalf(k[at + c]);
          dst[2 * hd + c] = FloatToHalf(v[at + c]);
        }
      }
    }
    auto& lab = label_[l];
    lab.resize(static_cast<size_t>(ctx) * heads_);
    std::vector<float> head_labels(ctx);
    for (int32_t h = 0; h < heads_; ++h) {
      RetainingLabels(q, k, stride, static_cast<int64_t>(h) * hd, n, ctx, hd, head_labels.data(),
                      label_kind_);
      for (int32_t j = 0; j < ctx; ++j) lab[static_cast<size_t>(j) * heads_ + h] = head_labels[j];
    }
  }

  const Status& status() const { return status_; }
  // Appends the first `take` rows of the last window to each layer's data, as segment `segment`.
  void Append(int64_t take, int32_t segment, std::vector<predictors::RetainingLayerData>* data) {
    const int64_t in = 3 * static_cast<int64_t>(head_dim_);
    for (size_t l = 0; l < x_.size(); ++l) {
      auto& d = (*data)[l];
      d.x.insert(d.x.end(), x_[l].begin(), x_[l].begin() + take * heads_ * in);
      d.label.insert(d.label.end(), label_[l].begin(), label_[l].begin() + take * heads_);
      d.segment.insert(d.segment.end(), static_cast<size_t>(take), segment);
      d.rows += take;
    }
  }

 private:
  RetainingLabel label_kind_;
  int32_t heads_, head_dim_, answer_;
  std::vector<std::vector<uint16_t>> x_;
  std::vector<std::vector<float>> label_;
  Status status_;
};

struct Window {
  size_t doc;
  int64_t begin;
};

}  // namespace

void RetainingLabels(const float* q, const float* k, int64_t stride, int64_t offset, int32_t n,
                     int32_t context_len, int32_t head_dim, float* labels, RetainingLabel kind) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  auto logit = [&](int32_t i, int32_t j) {
    const float* qi = q + i * stride + offset;
    const float* kj = k + j * stride + offset;
    float dot = 0.f;
    for (int32_t c = 0; c < head_dim; ++c) dot += qi[c] * kj[c];
    return dot * scale;
  };
  // kLogProb: each answer query's log-softmax denominator over the keys it sees (j <= i).
  std::vector<double> lse(static_cast<size_t>(n), 0.0);
  if (kind == RetainingLabel::kLogProb) {
    std::vector<float> row;
    for (int32_t i = context_len; i < n; ++i) {
      row.resize(static_cast<size_t>(i) + 1);
      float mx = -std::numeric_limits<float>::infinity();
      for (int32_t j = 0; j <= i; ++j) mx = std::max(mx, row[j] = logit(i, j));
      double z = 0;
      for (int32_t j = 0; j <= i; ++j) z += std::exp(static_cast<double>(row[j]) - mx);
      lse[i] = mx + std::log(z);
    }
  }
  for (int32_t j = 0; j < context_len; ++j) {
    float best = -std::numeric_limits<float>::infinity();
    for (int32_t i = context_len; i < n; ++i) {
      best = std::max(best, static_cast<float>(logit(i, j) - lse[i]));
    }
    labels[j] = best;
  }
}

StatusOr<CollectSummary> CollectRetaining(model::Model& model,
                                          const std::vector<std::vector<int32_t>>& documents,
                                          const CollectOptions& o, const std::string& out_dir,
                                          const std::function<void(const std::string&)>& progress) {
  const OptConfig& c = model.config();
  if (o.context < 2 || o.context > c.max_position_embeddings) {
    return InvalidArgument("context must be in [2, " + std::to_string(c.max_position_embeddings) +
                           "] for this model");
  }
  if (o.answer_tokens < 1 || o.answer_tokens >= o.context) {
    return InvalidArgument("answer tokens must be in [1, context)");
  }
  if (o.max_rows < 1) return InvalidArgument("max rows must be >= 1");
  if (model.comm().world_size() != 1) {
    return FailedPrecondition("collect runs the whole model in one process (world size 1)");
  }
  CollectSummary sum;
  std::vector<Window> windows;
  for (size_t d = 0; d < documents.size(); ++d) {
    const int64_t n = static_cast<int64_t>(documents[d].size());
    for (int64_t b = 0; b + o.context - 1 <= n; b += o.context - 1) windows.push_back({d, b});
  }
  if (windows.empty()) {
    return InvalidArgument("the text has no whole window of " + std::to_string(o.context) +
                           " tokens");
  }
  sum.windows_total = static_cast<int64_t>(windows.size());
  std::mt19937_64 rng(o.seed);
  std::shuffle(windows.begin(), windows.end(), rng);

  const int32_t layers = static_cast<int32_t>(c.num_hidden_layers);
  const int32_t ctx = o.context - o.answer_tokens;  // the most rows one window gives
  const int64_t cap = std::min<int64_t>(o.max_rows, sum.windows_total * ctx);
  std::vector<predictors::RetainingLayerData> data(layers);
  for (auto& d : data) {
    d.heads = static_cast<int32_t>(c.num_attention_heads);
    d.head_dim = static_cast<int32_t>(c.head_dim());
    d.x.reserve(static_cast<size_t>(cap) * d.heads * 3 * d.head_dim);
    d.label.reserve(static_cast<size_t>(cap) * d.heads);
    d.segment.reserve(static_cast<size_t>(cap));
  }
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return Unavailable("cannot create " + out_dir + ": " + ec.message());

  Recorder rec(c, o.answer_tokens, o.label);
  model.set_observer(&rec);
  model::CollectProgress report(progress, "collect --locret");
  const int32_t bos = static_cast<int32_t>(c.bos_token_id);
  std::vector<int32_t> tokens;
  model::StepResult step;
  Status st;
  for (const Window& w : windows) {
    if (sum.rows >= cap) break;
    const std::vector<int32_t>& doc = documents[w.doc];
    // The context before the answer has a seeded random length in [answer, context - answer]
    // (the paper's prompts vary in length): a fixed cut would tie the scores to absolute
    // positions, and tokens past the cut would never be scored in training.
    const int32_t ctx_len = std::uniform_int_distribution<int32_t>(
        std::min(o.answer_tokens, o.context - o.answer_tokens), o.context - o.answer_tokens)(rng);
    tokens.assign(1, bos);
    tokens.insert(tokens.end(), doc.begin() + w.begin,
                  doc.begin() + w.begin + ctx_len + o.answer_tokens - 1);
    st = model::ForwardWindow(model, tokens, &step);
    if (st.ok()) st = rec.status();
    if (!st.ok()) break;
    const int64_t take = std::min<int64_t>(ctx_len, cap - sum.rows);
    rec.Append(take, static_cast<int32_t>(sum.windows), &data);
    sum.rows += take;
    ++sum.windows;
    report.Update(sum.windows, sum.windows_total, sum.rows, cap, sum.windows * o.context);
  }
  model.set_observer(nullptr);
  if (!st.ok()) return st.WithContext("collect --locret");
  sum.seconds = report.seconds();
  for (int32_t l = 0; l < layers; ++l) {
    DEJA_RETURN_IF_ERROR(predictors::WriteRetainingLayerData(out_dir, l, data[l]));
  }
  nlohmann::json j = {
      {"format", predictors::kRetainingDataFormat},
      {"model", o.model_dir},
      {"texts", o.texts},
      {"layers", c.num_hidden_layers},
      {"heads", c.num_attention_heads},
      {"head_dim", c.head_dim()},
      {"rows", sum.rows},
      {"context", o.context},
      {"answer_tokens", o.answer_tokens},
      {"max_rows", o.max_rows},
      {"seed", o.seed},
      {"windows", sum.windows},
      {"windows_total", sum.windows_total},
      {"seconds", sum.seconds},
      {"label",
       "per window a context of seeded random length c in [answer_tokens, context - "
       "answer_tokens] then answer_tokens answer positions; per (layer, head, position j < c): "
       "the max over the answer queries i in [c, c + answer_tokens) of " +
           std::string(o.label == RetainingLabel::kLogit
                           ? "q_i . k_j / sqrt(head_dim) (the pre-softmax logit)"
                           : "log softmax_j(q_i . k / sqrt(head_dim)) (the log attention "
                             "probability)")},
      {"label_kind", o.label == RetainingLabel::kLogit ? "logit" : "logprob"},
      {"input", "per head [q, k, v] of the token, q as projected (unscaled), f16"}};
  DEJA_RETURN_IF_ERROR(model::WriteJsonFile(out_dir + "/meta.json", j));
  return sum;
}

}  // namespace deja::worker::locret
