// The retaining heads trainer: per head minibatch AdamW on smooth-L1 + alpha * neighbour L2 with
// sgemm forward/backward passes, heads spread over a thread pool, early stopping on the
// validation loss, then the losses recomputed with the f16-rounded weights through
// RetainingScore.
#include "predictors/retaining_trainer.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "common/dtype.h"
#include "common/thread_pool.h"

namespace deja::predictors {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

std::string Format(const char* fmt, auto... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// f16 bits -> f32 by table: the inputs are converted once per head and batch, which would
// otherwise cost as much as the matmuls.
const std::vector<float>& HalfTable() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t i = 0; i < 65536; ++i) t[i] = HalfToFloat(static_cast<uint16_t>(i));
    return t;
  }();
  return table;
}

// PyTorch's SmoothL1Loss with beta 1 on d = pred - label; writes dloss/dd.
inline float SmoothL1(float d, float* grad) {
  const float a = std::fabs(d);
  if (a < 1.0f) {
    *grad = d;
    return 0.5f * d * d;
  }
  *grad = d > 0 ? 1.0f : -1.0f;
  return a - 0.5f;
}

// prev[i] = 1 when rows[i - 1] is the previous token of rows[i] (the next row, same segment):
// the neighbour pairs of a row list.
std::vector<uint8_t> PrevFlags(const std::vector<int64_t>& rows, const RetainingLayerData& data) {
  std::vector<uint8_t> prev(rows.size(), 0);
  for (size_t i = 1; i < rows.size(); ++i) {
    prev[i] = rows[i] == rows[i - 1] + 1 && data.segment[rows[i]] == data.segment[rows[i - 1]];
  }
  return prev;
}

// Loss sums of one head's predictions `pred` (in the order of `rows`).
struct Sums {
  double smooth_l1 = 0, neighbour = 0;
  int64_t rows = 0, pairs = 0;
};

Sums LossSums(const std::vector<float>& pred, const std::vector<int64_t>& rows,
              const std::vector<uint8_t>& prev, const RetainingLayerData& data, int32_t data_head) {
  Sums s;
  float g;
  for (size_t i = 0; i < rows.size(); ++i) {
    s.smooth_l1 += SmoothL1(pred[i] - data.label[rows[i] * data.heads + data_head], &g);
    if (prev[i]) {
      const double d = double(pred[i]) - double(pred[i - 1]);
      s.neighbour += d * d;
      ++s.pairs;
    }
  }
  s.rows = static_cast<int64_t>(rows.size());
  return s;
}

// Per-head sums -> the means over (rows, heads) and (pairs, heads). Every head sees the same
// rows and pairs, so this is also the mean of the per-head losses.
RetainingLoss Combine(const std::vector<Sums>& heads, float alpha) {
  RetainingLoss l;
  double sl1 = 0, nb = 0;
  for (const Sums& s : heads) {
    sl1 += s.smooth_l1;
    nb += s.neighbour;
  }
  if (heads.empty()) return l;
  l.rows = heads[0].rows;
  l.pairs = heads[0].pairs;
  const double n = double(heads.size());
  l.smooth_l1 = l.rows > 0 ? sl1 / (double(l.rows) * n) : 0.0;
  l.neighbour = l.pairs > 0 ? nb / (double(l.pairs) * n) : 0.0;
  l.total = l.smooth_l1 + double(alpha) * l.neighbour;
  return l;
}

double HeadLoss(const Sums& s, float alpha) {
  return (s.rows > 0 ? s.smooth_l1 / double(s.rows) : 0.0) +
         (s.pairs > 0 ? double(alpha) * s.neighbour / double(s.pairs) : 0.0);
}

// Gathers head `head`'s inputs of rows[begin, end) as f32 [n, 3 * head_dim].
void GatherX(const RetainingLayerData& data, int32_t head, const std::vector<int64_t>& rows,
             size_t begin, size_t end, std::vector<float>* out) {
  const std::vector<float>& table = HalfTable();
  const int64_t in = 3 * int64_t{data.head_dim};
  out->resize((end - begin) * in);
  for (size_t i = begin; i < end; ++i) {
    const uint16_t* src = data.x.data() + (rows[i] * data.heads + head) * in;
    float* dst = out->data() + (i - begin) * in;
    for (int64_t k = 0; k < in; ++k) dst[k] = table[src[k]];
  }
}

// The plain predictions of local head `head` of `r` for `rows` through RetainingScore.
std::vector<float> PlainPredictions(const RetainingHeads& r, int32_t layer, int32_t head,
                                    const RetainingLayerData& data,
                                    const std::vector<int64_t>& rows) {
  std::vector<float> pred(rows.size()), x;
  for (size_t i = 0; i < rows.size(); ++i) {
    GatherX(data, r.first_head + head, rows, i, i + 1, &x);
    pred[i] = RetainingScore(r, layer, head, x.data());
  }
  return pred;
}

// One head's MLP with its AdamW state. Parameters are one vector, so a single loop updates
// them: [W1 (hidden x in) | b1 (hidden) | w2 (hidden) | b2].
struct HeadModel {
  int64_t in = 0, hidden = 0;
  std::vector<float> p, m, v, g, best;
  double best_loss = std::numeric_limits<double>::infinity();
  int32_t best_epoch = 0;
  Sums epoch;                         // training sums of the current epoch
  std::vector<float> x, a, pred, dp;  // scratch

  int64_t b1() const { return hidden * in; }
  int64_t w2() const { return b1() + hidden; }
  int64_t b2() const { return w2() + hidden; }
  int64_t size() const { return b2() + 1; }
};

// Forward pass of rows[begin, end): a = relu(x W1^T + b1) [n, hidden], pred [n]. `weights` is a
// parameter vector in HeadModel's layout.
void Forward(HeadModel& h, const std::vector<float>& weights, int64_t n) {
  h.a.resize(n * h.hidden);
  h.pred.resize(n);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, h.hidden, h.in, 1.0f, h.x.data(), h.in,
              weights.data(), h.in, 0.0f, h.a.data(), h.hidden);
  const float* b1 = weights.data() + h.b1();
  const float* w2 = weights.data() + h.w2();
  const float b2 = weights[h.b2()];
  for (int64_t i = 0; i < n; ++i) {
    float* a = h.a.data() + i * h.hidden;
    float s = b2;
    for (int64_t j = 0; j < h.hidden; ++j) {
      a[j] = std::max(a[j] + b1[j], 0.0f);
      s += a[j] * w2[j];
    }
    h.pred[i] = s;
  }
}

struct Batch {
  std::vector<int64_t> rows;
  std::vector<uint8_t> prev;
  int64_t pairs = 0;
};

// One AdamW step of head `head` on a batch.
void TrainStep(HeadModel& h, const RetainingLayerData& data, int32_t head, const Batch& batch,
               int64_t step, const RetainingTrainOptions& o) {
  const int64_t n = static_cast<int64_t>(batch.rows.size());
  GatherX(data, head, batch.rows, 0, batch.rows.size(), &h.x);
  Forward(h, h.p, n);
  // dp = dloss/dpred for the batch loss mean SmoothL1 + alpha * mean neighbour term.
  h.dp.assign(n, 0.0f);
  const float inv_n = 1.0f / float(n);
  for (int64_t i = 0; i < n; ++i) {
    float g;
    h.epoch.smooth_l1 += SmoothL1(h.pred[i] - data.label[batch.rows[i] * data.heads + head], &g);
    h.dp[i] = g * inv_n;
  }
  h.epoch.rows += n;
  if (batch.pairs > 0) {
    const float c = 2.0f * o.alpha / float(batch.pairs);
    for (int64_t i = 1; i < n; ++i) {
      if (!batch.prev[i]) continue;
      const float d = h.pred[i] - h.pred[i - 1];
      h.epoch.neighbour += double(d) * d;
      h.dp[i] += c * d;
      h.dp[i - 1] -= c * d;
    }
    h.epoch.pairs += batch.pairs;
  }
  // Backward: w2, b2 from a; then a becomes dloss/dz (through the relu) for b1 and W1.
  float* gw2 = h.g.data() + h.w2();
  float* gb1 = h.g.data() + h.b1();
  const float* w2 = h.p.data() + h.w2();
  std::fill(gb1, gb1 + 2 * h.hidden + 1, 0.0f);  // b1, w2, b2
  float gb2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    float* a = h.a.data() + i * h.hidden;
    const float d = h.dp[i];
    gb2 += d;
    for (int64_t j = 0; j < h.hidden; ++j) {
      gw2[j] += d * a[j];
      a[j] = a[j] > 0 ? d * w2[j] : 0.0f;
      gb1[j] += a[j];
    }
  }
  h.g[h.b2()] = gb2;
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, h.hidden, h.in, n, 1.0f, h.a.data(),
              h.hidden, h.x.data(), h.in, 0.0f, h.g.data(), h.in);
  // AdamW (decoupled weight decay on W1 and w2 only: decaying b2 would pull the score towards 0
  // rather than towards the label mean it starts at).
  constexpr float kB1 = 0.9f, kB2 = 0.999f, kEps = 1e-8f;
  const float c1 = 1.0f - std::pow(kB1, float(step)), c2 = 1.0f - std::pow(kB2, float(step));
  const float decay = 1.0f - o.lr * o.weight_decay;
  const int64_t size = h.size();
  for (int64_t i = 0; i < size; ++i) {
    const bool decayed = i < h.b1() || (i >= h.w2() && i < h.b2());
    h.m[i] = kB1 * h.m[i] + (1 - kB1) * h.g[i];
    h.v[i] = kB2 * h.v[i] + (1 - kB2) * h.g[i] * h.g[i];
    h.p[i] =
        h.p[i] * (decayed ? decay : 1.0f) - o.lr * (h.m[i] / c1) / (std::sqrt(h.v[i] / c2) + kEps);
  }
}

// Predictions of head `head` for `rows` with parameters `weights` (sgemm path, for the
// per-epoch validation).
std::vector<float> FastPredictions(HeadModel& h, const std::vector<float>& weights,
                                   const RetainingLayerData& data, int32_t head,
                                   const std::vector<int64_t>& rows) {
  constexpr size_t kChunk = 1024;
  std::vector<float> pred(rows.size());
  for (size_t b = 0; b < rows.size(); b += kChunk) {
    const size_t e = std::min(rows.size(), b + kChunk);
    GatherX(data, head, rows, b, e, &h.x);
    Forward(h, weights, static_cast<int64_t>(e - b));
    std::copy(h.pred.begin(), h.pred.end(), pred.begin() + b);
  }
  return pred;
}

// Runs of at most `run` consecutive rows of the same segment, cut from the (sorted) rows.
std::vector<std::pair<size_t, size_t>> CutRuns(const std::vector<int64_t>& rows,
                                               const RetainingLayerData& data, int32_t run) {
  std::vector<std::pair<size_t, size_t>> runs;  // [begin, end) into rows
  const std::vector<uint8_t> prev = PrevFlags(rows, data);
  size_t begin = 0;
  for (size_t i = 1; i <= rows.size(); ++i) {
    if (i == rows.size() || !prev[i] || i - begin >= static_cast<size_t>(run)) {
      if (i > begin) runs.emplace_back(begin, i);
      begin = i;
    }
  }
  return runs;
}

uint64_t HeadSeed(uint64_t seed, int32_t layer, int32_t head) {
  // splitmix64 of the three, so nearby seeds give unrelated streams.
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + uint64_t(layer) * 0xBF58476D1CE4E5B9ull +
               uint64_t(head) * 0x94D049BB133111EBull + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

json Curve(const std::vector<double>& v) {
  json a = json::array();
  for (double x : v) a.push_back(std::round(x * 1e6) / 1e6);
  return a;
}

// Float options as the decimal the user gave (not 0.0024999999441206455).
double Decimal(float x) { return std::round(double(x) * 1e7) / 1e7; }

}  // namespace

RetainingSplit SplitBySegment(const std::vector<int32_t>& segment, uint64_t seed) {
  std::vector<int32_t> ids = segment;
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  std::mt19937_64 rng(seed ^ 0x5eed5eedull);
  std::shuffle(ids.begin(), ids.end(), rng);
  RetainingSplit s;
  s.val_segments.assign(ids.begin(), ids.begin() + (ids.size() + 9) / 10);
  std::sort(s.val_segments.begin(), s.val_segments.end());
  for (size_t i = 0; i < segment.size(); ++i) {
    const bool val = std::binary_search(s.val_segments.begin(), s.val_segments.end(), segment[i]);
    (val ? s.val : s.train).push_back(static_cast<int64_t>(i));
  }
  return s;
}

RetainingLoss EvaluateRetainingLoss(const RetainingHeads& r, int32_t layer,
                                    const RetainingLayerData& data,
                                    const std::vector<int64_t>& rows, float alpha) {
  const std::vector<uint8_t> prev = PrevFlags(rows, data);
  std::vector<Sums> sums;
  for (int32_t h = 0; h < r.heads; ++h) {
    sums.push_back(
        LossSums(PlainPredictions(r, layer, h, data, rows), rows, prev, data, r.first_head + h));
  }
  return Combine(sums, alpha);
}

double TopFractionRecall(const std::vector<float>& pred, const RetainingLayerData& data,
                         const std::vector<int64_t>& rows, double fraction) {
  std::map<int32_t, std::vector<size_t>> windows;  // segment -> indices into rows
  for (size_t i = 0; i < rows.size(); ++i) windows[data.segment[rows[i]]].push_back(i);
  const int32_t heads = data.heads;
  double sum = 0;
  int64_t count = 0;
  std::vector<size_t> by_label, by_pred;
  std::vector<uint8_t> in_top(rows.size(), 0);
  for (const auto& window : windows) {
    const std::vector<size_t>& idx = window.second;  // a plain name: lambdas capture it below
    const size_t n = idx.size();
    // ceil, with a guard against 0.2 * 10 = 2.0000000000000004.
    const size_t k = std::clamp<size_t>(static_cast<size_t>(std::ceil(fraction * n - 1e-9)), 1, n);
    for (int32_t h = 0; h < heads; ++h) {
      auto order = [&](std::vector<size_t>* out, auto value) {
        *out = idx;
        std::sort(out->begin(), out->end(), [&](size_t a, size_t b) {
          return value(a) > value(b) || (value(a) == value(b) && a < b);
        });
      };
      order(&by_label, [&](size_t i) { return data.label[rows[i] * heads + h]; });
      order(&by_pred, [&](size_t i) { return pred[i * heads + h]; });
      for (size_t j = 0; j < k; ++j) in_top[by_label[j]] = 1;
      size_t hit = 0;
      for (size_t j = 0; j < k; ++j) hit += in_top[by_pred[j]];
      for (size_t j = 0; j < k; ++j) in_top[by_label[j]] = 0;
      sum += double(hit) / double(k);
      ++count;
    }
  }
  return count > 0 ? sum / double(count) : 0.0;
}

StatusOr<RetainingLayerResult> TrainRetainingLayer(const RetainingLayerData& data,
                                                   const RetainingTrainOptions& o, int32_t layer,
                                                   const LogFn& log) {
  if (o.hidden < 1 || o.epochs < 1 || o.batch < 1 || o.run < 1 || o.patience < 1 || o.threads < 1 ||
      !(o.lr > 0) || !(o.weight_decay >= 0) || !(o.alpha >= 0)) {
    return InvalidArgument(
        "bad training options (hidden, epochs, batch, run, patience, threads "
        ">= 1, lr > 0, weight decay >= 0, alpha >= 0)");
  }
  const int64_t in = 3 * int64_t{data.head_dim};
  if (data.heads < 1 || data.head_dim < 1 ||
      data.x.size() != static_cast<size_t>(data.rows * data.heads * in) ||
      data.label.size() != static_cast<size_t>(data.rows * data.heads) ||
      data.segment.size() != static_cast<size_t>(data.rows)) {
    return InvalidArgument("retaining data: x, label and segment sizes disagree with rows " +
                           std::to_string(data.rows) + ", heads " + std::to_string(data.heads) +
                           " and head_dim " + std::to_string(data.head_dim));
  }
  const auto t0 = Clock::now();
  RetainingLayerResult res;
  RetainingSplit split = SplitBySegment(data.segment, o.seed);
  if (split.train.empty() || split.val.empty()) {
    return InvalidArgument(
        "retaining data: the split needs at least 2 windows (segments); "
        "there are " +
        std::to_string(split.val_segments.size()) + " with " + std::to_string(data.rows) + " rows");
  }
  res.rows = data.rows;
  res.train_rows = static_cast<int64_t>(split.train.size());
  res.val_rows = static_cast<int64_t>(split.val.size());
  res.val_windows = static_cast<int32_t>(split.val_segments.size());
  const std::vector<uint8_t> val_prev = PrevFlags(split.val, data);
  for (uint8_t p : val_prev) res.val_pairs += p;

  // Heads run concurrently, so each sgemm stays on its caller's thread: that keeps a head's
  // arithmetic, and so the result, independent of --threads.
  openblas_set_num_threads(1);
  ThreadPool pool(o.threads);
  const int32_t heads = data.heads;
  std::vector<HeadModel> models(heads);
  res.label_mean.assign(heads, 0.0);
  pool.ParallelFor(heads, [&](int64_t hb, int64_t he) {
    for (int64_t hh = hb; hh < he; ++hh) {
      const int32_t h = static_cast<int32_t>(hh);
      HeadModel& m = models[h];
      m.in = in;
      m.hidden = o.hidden;
      m.p.assign(m.size(), 0.0f);
      m.m.assign(m.size(), 0.0f);
      m.v.assign(m.size(), 0.0f);
      m.g.assign(m.size(), 0.0f);
      // Statistics of the training rows: the label mean (b2 starts there, so training starts
      // centred) and the inputs' mean squared norm, which scales W1 so that the pre-activations
      // start near unit variance whatever the scale of q, k and v (for unit-variance inputs
      // this is N(0, 1 / sqrt(3 * head_dim))).
      const std::vector<float>& table = HalfTable();
      double label_sum = 0, sq_sum = 0;
      for (int64_t row : split.train) {
        label_sum += data.label[row * heads + h];
        const uint16_t* src = data.x.data() + (row * heads + h) * in;
        for (int64_t k = 0; k < in; ++k) sq_sum += double(table[src[k]]) * table[src[k]];
      }
      res.label_mean[h] = label_sum / double(split.train.size());
      const double mean_sq = std::max(sq_sum / double(split.train.size()), 1e-6);
      std::mt19937_64 rng(HeadSeed(o.seed, layer, h));
      std::normal_distribution<float> w1_init(0.0f, float(1.0 / std::sqrt(mean_sq)));
      std::normal_distribution<float> w2_init(0.0f, 1.0f / std::sqrt(float(o.hidden)));
      for (int64_t i = 0; i < m.b1(); ++i) m.p[i] = w1_init(rng);
      for (int64_t i = m.w2(); i < m.b2(); ++i) m.p[i] = w2_init(rng);
      m.p[m.b2()] = static_cast<float>(res.label_mean[h]);
      m.best = m.p;
    }
  });

  // Batches: runs of consecutive rows, shuffled per epoch by a layer-level generator shared by
  // all heads (the order does not depend on the threads either).
  const std::vector<std::pair<size_t, size_t>> runs = CutRuns(split.train, data, o.run);
  std::mt19937_64 order_rng(HeadSeed(o.seed, layer, -1));
  std::vector<size_t> run_order(runs.size());
  std::iota(run_order.begin(), run_order.end(), 0);
  std::vector<Batch> batches;
  double best_layer_loss = std::numeric_limits<double>::infinity();
  int32_t since_best = 0;
  int64_t step = 0;
  for (int32_t epoch = 1; epoch <= o.epochs; ++epoch) {
    const auto te = Clock::now();
    std::shuffle(run_order.begin(), run_order.end(), order_rng);
    batches.clear();
    for (size_t r : run_order) {
      const auto [rb, re] = runs[r];
      if (batches.empty() ||
          batches.back().rows.size() + (re - rb) > static_cast<size_t>(o.batch)) {
        batches.emplace_back();
      }
      Batch& b = batches.back();
      b.rows.insert(b.rows.end(), split.train.begin() + rb, split.train.begin() + re);
    }
    for (Batch& b : batches) {
      b.prev = PrevFlags(b.rows, data);
      b.pairs = std::accumulate(b.prev.begin(), b.prev.end(), int64_t{0});
    }
    std::vector<Sums> train_sums(heads), val_sums(heads);
    pool.ParallelFor(heads, [&](int64_t hb, int64_t he) {
      for (int64_t hh = hb; hh < he; ++hh) {
        const int32_t h = static_cast<int32_t>(hh);
        HeadModel& m = models[h];
        m.epoch = Sums();
        int64_t t = step;
        for (const Batch& b : batches) TrainStep(m, data, h, b, ++t, o);
        train_sums[h] = m.epoch;
        val_sums[h] =
            LossSums(FastPredictions(m, m.p, data, h, split.val), split.val, val_prev, data, h);
        const double loss = HeadLoss(val_sums[h], o.alpha);
        if (loss < m.best_loss) {
          m.best_loss = loss;
          m.best = m.p;
          m.best_epoch = epoch;
        }
      }
    });
    step += static_cast<int64_t>(batches.size());
    // The training sums count a row once per epoch, so their means are the epoch's average
    // objective (with the weights moving during the epoch).
    const RetainingLoss tl = Combine(train_sums, o.alpha);
    const RetainingLoss vl = Combine(val_sums, o.alpha);
    res.train_loss.push_back(tl.total);
    res.val_loss.push_back(vl.total);
    res.epochs_run = epoch;
    if (vl.total < best_layer_loss) {
      best_layer_loss = vl.total;
      res.best_epoch = epoch;
      since_best = 0;
    } else {
      ++since_best;
    }
    if (log) {
      log(
          Format("layer %d epoch %2d  train loss %.5f  val loss %.5f (smooth-L1 %.5f, neighbour "
                 "%.5f)  %.1f s",
                 layer, epoch, tl.total, vl.total, vl.smooth_l1, vl.neighbour, Seconds(te)));
    }
    if (since_best >= o.patience) break;
  }

  // Everything reported from here on uses the weights exactly as they are saved: each head's
  // best epoch, rounded to f16, scored through RetainingScore.
  RetainingHeads r;
  r.layers = 1;
  r.heads = heads;
  r.head_dim = data.head_dim;
  r.hidden = o.hidden;
  r.w1.resize(1);
  r.b1.resize(1);
  r.w2.resize(1);
  r.b2.resize(1);
  for (int32_t h = 0; h < heads; ++h) {
    std::vector<float>& p = models[h].best;
    for (float& x : p) x = HalfToFloat(FloatToHalf(x));
    const HeadModel& m = models[h];
    r.w1[0].insert(r.w1[0].end(), p.begin(), p.begin() + m.b1());
    r.b1[0].insert(r.b1[0].end(), p.begin() + m.b1(), p.begin() + m.w2());
    r.w2[0].insert(r.w2[0].end(), p.begin() + m.w2(), p.begin() + m.b2());
    r.b2[0].push_back(p[m.b2()]);
    res.head_best_epoch.push_back(m.best_epoch);
  }
  std::vector<std::vector<float>> preds(heads);
  std::vector<Sums> final_sums(heads);
  std::vector<double> mean_pred_loss(heads, 0.0);
  pool.ParallelFor(heads, [&](int64_t hb, int64_t he) {
    for (int64_t h = hb; h < he; ++h) {
      preds[h] = PlainPredictions(r, 0, static_cast<int32_t>(h), data, split.val);
      final_sums[h] = LossSums(preds[h], split.val, val_prev, data, static_cast<int32_t>(h));
      float g;
      for (int64_t row : split.val) {
        mean_pred_loss[h] += SmoothL1(float(res.label_mean[h]) - data.label[row * heads + h], &g);
      }
    }
  });
  res.val = Combine(final_sums, o.alpha);
  res.val_loss_mean_pred = std::accumulate(mean_pred_loss.begin(), mean_pred_loss.end(), 0.0) /
                           (double(heads) * double(split.val.size()));
  std::vector<float> pred(split.val.size() * heads);
  for (int32_t h = 0; h < heads; ++h) {
    for (size_t i = 0; i < split.val.size(); ++i) pred[i * heads + h] = preds[h][i];
  }
  res.val_top_recall = TopFractionRecall(pred, data, split.val, kRankingFraction);
  res.w1 = std::move(r.w1[0]);
  res.b1 = std::move(r.b1[0]);
  res.w2 = std::move(r.w2[0]);
  res.b2 = std::move(r.b2[0]);
  res.seconds = Seconds(t0);
  return res;
}

Status TrainRetainingHeads(const std::string& data_dir, const std::string& out_path,
                           const RetainingTrainOptions& o, const LogFn& log) {
  DEJA_ASSIGN_OR_RETURN(RetainingDataMeta meta, ReadRetainingDataMeta(data_dir));
  if (o.max_rows < 0) return InvalidArgument("max_rows must be >= 0");
  const auto t0 = Clock::now();
  RetainingHeads all;
  all.layers = meta.layers;
  all.heads = meta.heads;
  all.head_dim = meta.head_dim;
  all.hidden = o.hidden;
  json layers_info = json::array();
  std::vector<int32_t> first_val_segments;
  int64_t rows_used = 0;
  for (int32_t l = 0; l < meta.layers; ++l) {
    StatusOr<RetainingLayerData> data = ReadRetainingLayerData(data_dir, meta, l);
    if (!data.ok()) return data.status();
    RetainingLayerData& d = *data;
    if (o.max_rows > 0 && o.max_rows < d.rows) {
      // The first rows: the collector writes whole windows in a shuffled order, so these are a
      // sample of windows (the last one possibly cut short).
      d.rows = o.max_rows;
      d.x.resize(static_cast<size_t>(d.rows * d.heads * 3 * d.head_dim));
      d.label.resize(static_cast<size_t>(d.rows * d.heads));
      d.segment.resize(static_cast<size_t>(d.rows));
    }
    rows_used = d.rows;
    if (log) {
      log(Format("layer %d: %lld rows, %d heads, [q, k, v] %d -> hidden %d -> 1", l,
                 static_cast<long long>(d.rows), d.heads, 3 * d.head_dim, o.hidden));
    }
    StatusOr<RetainingLayerResult> res = TrainRetainingLayer(d, o, l, log);
    if (!res.ok()) return res.status().WithContext("layer " + std::to_string(l));
    const RetainingLayerResult& lr = *res;
    all.w1.push_back(lr.w1);
    all.b1.push_back(lr.b1);
    all.w2.push_back(lr.w2);
    all.b2.push_back(lr.b2);
    json li = {{"layer", l},
               {"rows", lr.rows},
               {"train_rows", lr.train_rows},
               {"val_rows", lr.val_rows},
               {"val_pairs", lr.val_pairs},
               {"val_windows", lr.val_windows},
               {"label_mean", lr.label_mean},
               {"epochs_run", lr.epochs_run},
               {"best_epoch", lr.best_epoch},
               {"head_best_epochs", lr.head_best_epoch},
               {"train_loss", Curve(lr.train_loss)},
               {"val_loss", Curve(lr.val_loss)},
               {"val",
                {{"loss", lr.val.total},
                 {"smooth_l1", lr.val.smooth_l1},
                 {"neighbour", lr.val.neighbour}}},
               {"val_loss_predicting_mean", lr.val_loss_mean_pred},
               {"val_top20_recall", lr.val_top_recall},
               {"seconds", lr.seconds}};
    // Every layer's split is the same when its rows are the same windows (they are, from the
    // collector); record a layer's own validation windows only if they differ.
    const RetainingSplit split = SplitBySegment(d.segment, o.seed);
    if (l == 0) {
      first_val_segments = split.val_segments;
    } else if (split.val_segments != first_val_segments) {
      li["validation_segments"] = split.val_segments;
    }
    layers_info.push_back(li);
    if (log) {
      log(
          Format("layer %d: best epoch %d of %d; val loss %.5f (smooth-L1 %.5f, neighbour %.5f; "
                 "predicting the mean: %.5f); top-20%% recall %.4f; %.1f s",
                 l, lr.best_epoch, lr.epochs_run, lr.val.total, lr.val.smooth_l1, lr.val.neighbour,
                 lr.val_loss_mean_pred, lr.val_top_recall, lr.seconds));
    }
  }
  json data_meta = json::parse(meta.json, nullptr, /*allow_exceptions=*/false);
  json info;
  info["label"] =
      !data_meta.is_discarded() && data_meta.contains("label") ? data_meta["label"] : json(nullptr);
  info["data"] = data_dir;
  info["rows_per_layer"] = meta.rows;
  info["rows_used"] = rows_used;
  info["options"] = {{"hidden", o.hidden},    {"alpha", Decimal(o.alpha)},
                     {"lr", Decimal(o.lr)},   {"weight_decay", Decimal(o.weight_decay)},
                     {"epochs", o.epochs},    {"patience", o.patience},
                     {"batch", o.batch},      {"run", o.run},
                     {"threads", o.threads},  {"seed", o.seed},
                     {"max_rows", o.max_rows}};
  info["loss"] =
      "mean over (rows, heads) of SmoothL1(pred - label, beta 1) + alpha * mean over "
      "(neighbour pairs, heads) of (pred_i - pred_{i-1})^2";
  info["split"] =
      "by window: ceil(10%) of the segment ids, shuffled with the seed, are "
      "validation";
  info["validation_segments"] = first_val_segments;
  info["selection"] =
      "each head keeps the epoch with its lowest validation loss; training stops "
      "after `patience` epochs without a better layer validation loss";
  info["ranking_metric"] =
      "val_top20_recall: per validation window and head, the fraction of "
      "the window's top ceil(20%) tokens by label that are among its top "
      "ceil(20%) by predicted score, averaged over (window, head); a "
      "random ranking scores about 0.2";
  info["reported_with"] = "the saved f16 weights";
  info["seconds"] = Seconds(t0);
  info["layers"] = layers_info;
  if (!data_meta.is_discarded()) info["data_meta"] = data_meta;
  return SaveRetainingHeads(out_path, all, info);
}

}  // namespace deja::predictors
