// The predictor trainer: minibatch AdamW on class-balanced BCE with sgemm forward/backward
// passes, early stopping on validation recall, then the top-k schedule.
#include "predictors/trainer.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/dtype.h"
#include "predictors/predictors.h"

namespace deja::predictors {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kMaxParts = 16;

std::string Format(const char* fmt, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}

// Rows `rows[begin, end)` of the inputs as f32 [n, d].
void GatherX(const BlockData& data, const std::vector<int64_t>& rows, size_t begin, size_t end,
             std::vector<float>* out) {
  const int64_t d = data.dim;
  out->resize((end - begin) * d);
  for (size_t i = begin; i < end; ++i) {
    const uint16_t* src = data.x.data() + rows[i] * d;
    float* dst = out->data() + (i - begin) * d;
    for (int64_t j = 0; j < d; ++j) dst[j] = HalfToFloat(src[j]);
  }
}

// z = (x W1^T) W2^T for n rows; h is scratch [n, r].
void Forward(const std::vector<float>& x, int64_t n, const BlockData& data, int32_t r,
             const std::vector<float>& w1, const std::vector<float>& w2, std::vector<float>* h,
             std::vector<float>* z) {
  const int64_t d = data.dim, u = data.units;
  h->resize(n * r);
  z->resize(n * u);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, r, d, 1.0f, x.data(), d, w1.data(), d,
              0.0f, h->data(), r);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, u, r, 1.0f, h->data(), r, w2.data(), r,
              0.0f, z->data(), u);
}

// Weighted BCE of one logit: returns the loss, writes dloss/dz (unnormalised).
inline float Bce(float z, bool y, float pw, float nw, float* grad) {
  const float e = std::exp(-std::fabs(z));
  const float s = z >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
  const float softplus_abs = std::log1p(e);  // log(1 + exp(-|z|))
  if (y) {
    *grad = pw * (s - 1.0f);
    return pw * (softplus_abs + std::max(-z, 0.0f));  // softplus(-z)
  }
  *grad = nw * s;
  return nw * (softplus_abs + std::max(z, 0.0f));  // softplus(z)
}

// Runs fn(begin, end, part) over [0, n) split into `parts` contiguous pieces on that many
// threads (the elementwise loss/gradient pass is as costly as the matmuls otherwise).
void ParallelFor(int64_t n, int parts, const std::function<void(int64_t, int64_t, int)>& fn) {
  parts = static_cast<int>(std::clamp<int64_t>(parts, 1, std::max<int64_t>(n, 1)));
  if (parts == 1) return fn(0, n, 0);
  std::vector<std::thread> threads;
  for (int p = 1; p < parts; ++p) {
    threads.emplace_back(fn, n * p / parts, n * (p + 1) / parts, p);
  }
  fn(0, n / parts, 0);
  for (std::thread& t : threads) t.join();
}

struct Eval {
  double loss = 0, recall = 0, precision = 0;
};

// Validation loss and thresholded (logit > 0) recall / precision over all unit-rows.
Eval Evaluate(const BlockData& data, const std::vector<int64_t>& rows, int32_t r,
              const std::vector<float>& w1, const std::vector<float>& w2, float pw, float nw,
              std::vector<float>* logits_out) {
  const int64_t u = data.units;
  constexpr size_t kChunk = 4096;
  std::vector<float> x, h, z;
  if (logits_out) logits_out->resize(rows.size() * u);
  double loss = 0;
  int64_t tp = 0, fp = 0, fn = 0;
  for (size_t b = 0; b < rows.size(); b += kChunk) {
    const size_t e = std::min(rows.size(), b + kChunk);
    GatherX(data, rows, b, e, &x);
    Forward(x, static_cast<int64_t>(e - b), data, r, w1, w2, &h, &z);
    for (size_t i = b; i < e; ++i) {
      const float* zr = z.data() + (i - b) * u;
      for (int64_t j = 0; j < u; ++j) {
        const bool y = data.Label(rows[i], j);
        float g;
        loss += Bce(zr[j], y, pw, nw, &g);
        const bool p = zr[j] > 0;
        tp += p && y;
        fp += p && !y;
        fn += !p && y;
      }
    }
    if (logits_out) std::copy(z.begin(), z.end(), logits_out->begin() + b * u);
  }
  Eval ev;
  ev.loss = loss / std::max<double>(1, double(rows.size()) * u);
  ev.recall = tp + fn > 0 ? double(tp) / double(tp + fn) : 1.0;
  ev.precision = tp + fp > 0 ? double(tp) / double(tp + fp) : 0.0;
  return ev;
}

struct Adam {
  std::vector<float> m, v;
  explicit Adam(size_t n) : m(n, 0.0f), v(n, 0.0f) {}
  void Step(std::vector<float>& w, const std::vector<float>& g, int64_t t,
            const TrainOptions& o) {
    constexpr float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    const float c1 = 1.0f - std::pow(b1, float(t)), c2 = 1.0f - std::pow(b2, float(t));
    const float decay = 1.0f - o.lr * o.weight_decay;
    for (size_t i = 0; i < w.size(); ++i) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      w[i] = w[i] * decay - o.lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
    }
  }
};

void RoundToHalf(std::vector<float>& w) {
  for (float& x : w) x = HalfToFloat(FloatToHalf(x));
}

Tensor ToTensor(const std::vector<float>& w, int64_t rows, int64_t cols) {
  Tensor t = Tensor::Empty(DType::kF32, {rows, cols});
  std::copy(w.begin(), w.end(), t.as<float>());
  return t;
}

// Float options as the decimal the user gave (not 0.0010000000474974513).
double Decimal(float x) { return std::round(double(x) * 1e7) / 1e7; }

nlohmann::json Rounded(const std::vector<double>& v) {
  nlohmann::json a = nlohmann::json::array();
  for (double x : v) a.push_back(std::round(x * 1e5) / 1e5);
  return a;
}

}  // namespace

uint64_t BlockSeed(uint64_t seed, int32_t layer, BlockKind kind) {
  return seed + 2 * static_cast<uint64_t>(layer) + (kind == BlockKind::kHeads ? 1 : 0);
}

RowSplit SplitRows(int64_t rows, uint64_t seed) {
  std::vector<int64_t> perm(rows);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937_64 rng(seed ^ 0x5eed5eedull);
  std::shuffle(perm.begin(), perm.end(), rng);
  const int64_t n_val = (rows + 9) / 10;
  RowSplit s;
  s.val.assign(perm.begin(), perm.begin() + n_val);
  s.train.assign(perm.begin() + n_val, perm.end());
  std::sort(s.val.begin(), s.val.end());
  std::sort(s.train.begin(), s.train.end());
  return s;
}

TopKCurve EvaluateTopK(const float* logits, const BlockData& data,
                       const std::vector<int64_t>& rows) {
  const int64_t u = data.units;
  TopKCurve c;
  c.recall.assign(u, 0.0);
  c.precision.assign(u, 0.0);
  std::vector<int32_t> order(u);
  int64_t recall_rows = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const float* z = logits + i * u;
    std::iota(order.begin(), order.end(), 0);
    // Ties go to the lower unit index, so an independent recomputation picks the same sets.
    std::sort(order.begin(), order.end(), [z](int32_t a, int32_t b) {
      return z[a] > z[b] || (z[a] == z[b] && a < b);
    });
    int64_t total = 0;
    for (int64_t j = 0; j < u; ++j) total += data.Label(rows[i], j);
    int64_t hit = 0;
    for (int64_t k = 0; k < u; ++k) {
      hit += data.Label(rows[i], order[k]);
      if (total > 0) c.recall[k] += double(hit) / double(total);
      c.precision[k] += double(hit) / double(k + 1);
    }
    recall_rows += total > 0;
  }
  for (int64_t k = 0; k < u; ++k) {
    c.recall[k] = recall_rows > 0 ? c.recall[k] / double(recall_rows) : 1.0;
    c.precision[k] /= std::max<double>(1, double(rows.size()));
  }
  return c;
}

StatusOr<BlockResult> TrainBlock(const BlockData& data, const TrainOptions& o, uint64_t seed,
                                 const LogFn& log) {
  if (o.rank < 1 || o.epochs < 1 || o.batch < 1 || o.lr <= 0 || o.weight_decay < 0 ||
      o.patience < 1 || o.target_recall <= 0 || o.target_recall > 1) {
    return InvalidArgument("bad training options (rank, epochs, batch, patience >= 1, lr > 0, "
                           "weight decay >= 0, target recall in (0, 1])");
  }
  if (data.rows < 20) {
    return InvalidArgument("too few rows to train on (" + std::to_string(data.rows) +
                           "; at least 20)");
  }
  const auto t0 = Clock::now();
  openblas_set_num_threads(std::max(1, o.threads));
  const int32_t r = o.rank;
  const int64_t d = data.dim, u = data.units;
  BlockResult res;
  RowSplit split = SplitRows(data.rows, seed);
  res.train_rows = static_cast<int64_t>(split.train.size());
  res.val_rows = static_cast<int64_t>(split.val.size());
  int64_t positives = 0;
  for (int64_t row : split.train) {
    for (int64_t j = 0; j < u; ++j) positives += data.Label(row, j);
  }
  res.label_mean = double(positives) / (double(res.train_rows) * double(u));
  const double w = std::clamp(res.label_mean, 1e-6, 1.0 - 1e-6);
  const float pw = static_cast<float>(1.0 - w), nw = static_cast<float>(w);

  std::mt19937_64 rng(seed);
  std::vector<float> w1(r * d), w2(u * r);
  {
    std::uniform_real_distribution<float> a(-1.0f / std::sqrt(float(d)), 1.0f / std::sqrt(float(d)));
    std::uniform_real_distribution<float> b(-1.0f / std::sqrt(float(r)), 1.0f / std::sqrt(float(r)));
    for (float& x : w1) x = a(rng);
    for (float& x : w2) x = b(rng);
  }
  Adam adam1(w1.size()), adam2(w2.size());
  std::vector<float> best1 = w1, best2 = w2;
  double best_recall = -1, best_loss = 0;
  int32_t since_best = 0;
  int64_t step = 0;
  std::vector<int64_t> order = split.train;
  std::vector<float> x, h, z, y, g1(w1.size()), g2(w2.size()), dh;
  for (int32_t epoch = 1; epoch <= o.epochs; ++epoch) {
    const auto te = Clock::now();
    std::shuffle(order.begin(), order.end(), rng);
    double loss_sum = 0;
    for (size_t b = 0; b < order.size(); b += o.batch) {
      const size_t e = std::min(order.size(), b + o.batch);
      const int64_t n = static_cast<int64_t>(e - b);
      GatherX(data, order, b, e, &x);
      Forward(x, n, data, r, w1, w2, &h, &z);
      const float scale = 1.0f / float(n * u);
      double part_loss[kMaxParts] = {};
      ParallelFor(n, std::min(o.threads, kMaxParts), [&](int64_t begin, int64_t end, int part) {
        double l = 0;
        for (int64_t i = begin; i < end; ++i) {
          float* zr = z.data() + i * u;
          for (int64_t j = 0; j < u; ++j) {
            float g;
            l += Bce(zr[j], data.Label(order[b + i], j), pw, nw, &g);
            zr[j] = g * scale;  // z now holds dloss/dz
          }
        }
        part_loss[part] = l;
      });
      for (double l : part_loss) loss_sum += l;
      dh.resize(n * r);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, u, r, n, 1.0f, z.data(), u, h.data(), r,
                  0.0f, g2.data(), r);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, r, u, 1.0f, z.data(), u,
                  w2.data(), r, 0.0f, dh.data(), r);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r, d, n, 1.0f, dh.data(), r, x.data(), d,
                  0.0f, g1.data(), d);
      ++step;
      adam1.Step(w1, g1, step, o);
      adam2.Step(w2, g2, step, o);
    }
    const Eval ev = Evaluate(data, split.val, r, w1, w2, pw, nw, nullptr);
    res.train_loss.push_back(loss_sum / (double(order.size()) * u));
    res.val_loss.push_back(ev.loss);
    res.val_recall.push_back(ev.recall);
    res.val_precision.push_back(ev.precision);
    res.epochs_run = epoch;
    const bool better = ev.recall > best_recall || (ev.recall == best_recall && ev.loss < best_loss);
    if (better) {
      best_recall = ev.recall;
      best_loss = ev.loss;
      best1 = w1;
      best2 = w2;
      res.best_epoch = epoch;
      since_best = 0;
    } else {
      ++since_best;
    }
    if (log) {
      log(Format("  epoch %2d  train loss %.4f  val loss %.4f  val recall %.4f  precision %.4f"
                 "  %.1f s",
                 epoch, res.train_loss.back(), ev.loss, ev.recall, ev.precision,
                 std::chrono::duration<double>(Clock::now() - te).count()));
    }
    if (ev.recall > o.stop_recall || since_best >= o.patience) break;
  }
  // Everything reported from here on uses the weights exactly as they are saved (f16).
  RoundToHalf(best1);
  RoundToHalf(best2);
  std::vector<float> logits;
  const Eval fin = Evaluate(data, split.val, r, best1, best2, pw, nw, &logits);
  res.recall = fin.recall;
  res.precision = fin.precision;
  const TopKCurve curve = EvaluateTopK(logits.data(), data, split.val);
  int64_t k = u;
  for (int64_t i = 0; i < u; ++i) {
    if (curve.recall[i] >= o.target_recall) {
      k = i + 1;
      break;
    }
  }
  res.top_k = k < u ? static_cast<int32_t>(k) : 0;
  res.topk_recall = curve.recall[k - 1];
  res.topk_precision = curve.precision[k - 1];
  res.fc1 = ToTensor(best1, r, d);
  res.fc2 = ToTensor(best2, u, r);
  res.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return res;
}

Status TrainPredictors(const std::string& data_dir, const std::string& out_path,
                       const TrainOptions& o, const LogFn& log) {
  DEJA_ASSIGN_OR_RETURN(DataMeta dm, ReadDataMeta(data_dir));
  PredictorMeta meta;
  meta.rank = o.rank;
  meta.hidden_size = dm.hidden_size;
  meta.ffn_dim = dm.ffn_dim;
  meta.num_heads = dm.num_heads;
  meta.num_layers = dm.num_layers;
  meta.layers.resize(dm.num_layers);
  std::vector<LayerPredictors> weights(dm.num_layers);
  nlohmann::json layers_info = nlohmann::json::array();
  const auto t0 = Clock::now();
  for (int32_t l = 0; l < dm.num_layers; ++l) {
    nlohmann::json li = {{"layer", l}};
    for (BlockKind kind : {BlockKind::kMlp, BlockKind::kHeads}) {
      if (kind == BlockKind::kHeads && l == 0) continue;
      const char* name = BlockKindName(kind);
      StatusOr<BlockData> data = ReadBlockData(data_dir, dm, l, kind);
      if (!data.ok()) return data.status();
      if (log) {
        log(Format("layer %d %s: %lld rows, d %lld -> r %d -> %lld units", l, name,
                   static_cast<long long>(data->rows), static_cast<long long>(data->dim), o.rank,
                   static_cast<long long>(data->units)));
      }
      TrainOptions ko = o;
      if (kind == BlockKind::kHeads) ko.target_recall = o.HeadTargetRecall();
      StatusOr<BlockResult> br = TrainBlock(*data, ko, BlockSeed(o.seed, l, kind), log);
      if (!br.ok()) {
        return br.status().WithContext("layer " + std::to_string(l) + " " + name);
      }
      BlockSchedule& s = kind == BlockKind::kMlp ? meta.layers[l].mlp : meta.layers[l].heads;
      s.top_k = br->top_k;
      s.recall = br->top_k > 0 ? static_cast<float>(br->topk_recall) : -1.0f;
      s.precision = br->top_k > 0 ? static_cast<float>(br->topk_precision) : -1.0f;
      if (kind == BlockKind::kMlp) {
        weights[l].mlp_fc1 = std::move(br->fc1);
        weights[l].mlp_fc2 = std::move(br->fc2);
      } else {
        weights[l].head_fc1 = std::move(br->fc1);
        weights[l].head_fc2 = std::move(br->fc2);
      }
      li[name] = {{"train_rows", br->train_rows},
                  {"val_rows", br->val_rows},
                  {"label_mean", br->label_mean},
                  {"epochs_run", br->epochs_run},
                  {"best_epoch", br->best_epoch},
                  {"train_loss", Rounded(br->train_loss)},
                  {"val_loss", Rounded(br->val_loss)},
                  {"val_recall", Rounded(br->val_recall)},
                  {"val_precision", Rounded(br->val_precision)},
                  {"threshold_recall", br->recall},
                  {"threshold_precision", br->precision},
                  {"topk_recall", br->topk_recall},
                  {"topk_precision", br->topk_precision},
                  {"seconds", br->seconds}};
      if (br->top_k == 0) li[name]["dense_reason"] = "no top-k below all units reaches the target";
      if (log) {
        log(Format("layer %d %s: best epoch %d of %d; threshold recall %.4f precision %.4f; "
                   "top-k %d (%s) recall %.4f precision %.4f; %.1f s",
                   l, name, br->best_epoch, br->epochs_run, br->recall, br->precision, br->top_k,
                   br->top_k == 0 ? "dense" : "sparse", br->topk_recall, br->topk_precision,
                   br->seconds));
      }
    }
    layers_info.push_back(li);
  }
  nlohmann::json extra;
  extra["layers"] = layers_info;
  extra["training"] = {{"data", data_dir},
                       {"rows_per_layer", dm.rows},
                       {"epochs", o.epochs},
                       {"batch", o.batch},
                       {"lr", Decimal(o.lr)},
                       {"weight_decay", Decimal(o.weight_decay)},
                       {"target_recall", Decimal(o.target_recall)},
                       {"head_target_recall", Decimal(o.HeadTargetRecall())},
                       {"patience", o.patience},
                       {"stop_recall", Decimal(o.stop_recall)},
                       {"seed", o.seed},
                       {"validation_fraction", 0.1},
                       {"seconds", std::chrono::duration<double>(Clock::now() - t0).count()},
                       {"loss", "class-balanced BCE, positive weight 1-w, negative weight w"},
                       {"threshold_metrics", "micro-averaged over unit-rows at logit > 0"},
                       {"topk_metrics", "per-row recall / precision of the top-k set, averaged"}};
  nlohmann::json collect = nlohmann::json::parse(dm.json, nullptr, false);
  if (!collect.is_discarded()) extra["collect"] = collect;
  return SavePredictors(out_path, meta, weights, extra.dump());
}

}  // namespace deja::predictors
