// The retaining heads trainer on a synthetic problem whose labels come from a known random MLP of
// the same shape plus noise: it must learn it (validation loss far below predicting the mean),
// the validation loss it reports must equal an independent recomputation from the saved file,
// and the result must not depend on the thread count.
#include "predictors/retaining_trainer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "common/dtype.h"
#include "predictors/retaining_data.h"
#include "predictors/retaining_heads.h"
#include "tests/common/temp_dir.h"

namespace deja::predictors {
namespace {

using nlohmann::json;

constexpr int32_t kHeads = 2, kHeadDim = 4, kIn = 3 * kHeadDim, kTeacherHidden = 8;
constexpr int32_t kWindows = 60, kTokens = 40, kRows = kWindows * kTokens;

// Labels: a random teacher MLP per head on the (f16-rounded) inputs, plus N(0, 0.05) noise.
// Segment ids are sparse and the windows come in no particular order, as from the collector.
RetainingLayerData Synthetic(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n;
  std::vector<float> w1(kHeads * kTeacherHidden * kIn), b1(kHeads * kTeacherHidden),
      w2(kHeads * kTeacherHidden);
  for (float& v : w1) v = n(rng) / std::sqrt(float(kIn));
  for (float& v : b1) v = 0.3f * n(rng);
  for (float& v : w2) v = n(rng);
  RetainingLayerData d;
  d.heads = kHeads;
  d.head_dim = kHeadDim;
  d.rows = kRows;
  d.x.resize(kRows * kHeads * kIn);
  d.label.resize(kRows * kHeads);
  d.segment.resize(kRows);
  for (int64_t r = 0; r < kRows; ++r) {
    d.segment[r] = 1000 - 7 * static_cast<int32_t>(r / kTokens);
    for (int32_t h = 0; h < kHeads; ++h) {
      float x[kIn];
      for (int k = 0; k < kIn; ++k) {
        const uint16_t v = FloatToHalf(n(rng));
        d.x[(r * kHeads + h) * kIn + k] = v;
        x[k] = HalfToFloat(v);
      }
      float s = 2.0f;
      for (int j = 0; j < kTeacherHidden; ++j) {
        float z = b1[h * kTeacherHidden + j];
        for (int k = 0; k < kIn; ++k) z += w1[(h * kTeacherHidden + j) * kIn + k] * x[k];
        s += w2[h * kTeacherHidden + j] * std::max(z, 0.0f);
      }
      d.label[r * kHeads + h] = s + 0.05f * n(rng);
    }
  }
  return d;
}

RetainingTrainOptions Options() {
  RetainingTrainOptions o;
  o.hidden = 16;
  o.lr = 1e-2f;
  o.epochs = 40;
  o.patience = 4;
  o.batch = 128;
  o.run = 16;
  o.seed = 3;
  o.threads = 2;
  return o;
}

void WriteData(const std::string& dir, int32_t layers) {
  json meta = {{"format", kRetainingDataFormat},
               {"layers", layers},
               {"heads", kHeads},
               {"head_dim", kHeadDim},
               {"rows", kRows},
               {"context", kTokens},
               {"answer_tokens", 8},
               {"texts", {"synthetic"}},
               {"label", "teacher MLP + noise"}};
  std::ofstream(dir + "/meta.json") << meta.dump();
  for (int32_t l = 0; l < layers; ++l) {
    ASSERT_TRUE(WriteRetainingLayerData(dir, l, Synthetic(10 + l)).ok());
  }
}

TEST(RetainingTrainer, SplitsByWindow) {
  const RetainingLayerData d = Synthetic(1);
  RetainingSplit a = SplitBySegment(d.segment, 5), b = SplitBySegment(d.segment, 5),
                 c = SplitBySegment(d.segment, 6);
  EXPECT_EQ(a.val, b.val);
  EXPECT_NE(a.val_segments, c.val_segments);
  EXPECT_EQ(a.val_segments.size(), 6u);  // ceil(60 / 10)
  EXPECT_EQ(a.val.size(), 6u * kTokens);
  EXPECT_TRUE(std::is_sorted(a.val.begin(), a.val.end()));
  EXPECT_TRUE(std::is_sorted(a.train.begin(), a.train.end()));
  std::set<int32_t> val_ids(a.val_segments.begin(), a.val_segments.end());
  for (int64_t r : a.val) EXPECT_TRUE(val_ids.count(d.segment[r]));
  for (int64_t r : a.train) EXPECT_FALSE(val_ids.count(d.segment[r]));
  EXPECT_EQ(a.train.size() + a.val.size(), size_t{kRows});
}

TEST(RetainingTrainer, LearnsATeacherMlp) {
  const RetainingLayerData d = Synthetic(2);
  std::vector<std::string> lines;
  auto r =
      TrainRetainingLayer(d, Options(), 0, [&](const std::string& line) { lines.push_back(line); });
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (const std::string& line : lines) std::printf("%s\n", line.c_str());
  std::printf("val loss %.5f (mean predictor %.5f), top-20%% recall %.3f, best epoch %d of %d\n",
              r->val.total, r->val_loss_mean_pred, r->val_top_recall, r->best_epoch, r->epochs_run);
  EXPECT_EQ(lines.size(), size_t(r->epochs_run));
  EXPECT_NE(lines[0].find("layer 0 epoch  1"), std::string::npos) << lines[0];
  EXPECT_GT(r->val_loss_mean_pred, 0.3);
  EXPECT_LT(r->val.total, 0.2 * r->val_loss_mean_pred)
      << "mean predictor " << r->val_loss_mean_pred;
  EXPECT_GT(r->val_top_recall, 0.6);  // chance is about 0.2
  EXPECT_EQ(r->val_rows, 6 * kTokens);
  EXPECT_EQ(r->val_pairs, 6 * (kTokens - 1));
  EXPECT_GE(r->best_epoch, 1);
  EXPECT_LE(r->best_epoch, r->epochs_run);
  EXPECT_EQ(r->train_loss.size(), size_t(r->epochs_run));
  EXPECT_EQ(r->head_best_epoch.size(), size_t{kHeads});
  EXPECT_LT(r->val_loss.back(), r->val_loss.front());
  // The weights are f16 values, as saved.
  for (float v : r->w1) ASSERT_EQ(v, HalfToFloat(FloatToHalf(v)));
  for (float v : r->b2) ASSERT_EQ(v, HalfToFloat(FloatToHalf(v)));
}

TEST(RetainingTrainer, DoesNotDependOnTheThreadCount) {
  const RetainingLayerData d = Synthetic(3);
  RetainingTrainOptions o = Options();
  o.epochs = 3;
  o.threads = 1;
  auto one = TrainRetainingLayer(d, o, 1, nullptr);
  o.threads = 2;
  auto two = TrainRetainingLayer(d, o, 1, nullptr);
  ASSERT_TRUE(one.ok() && two.ok());
  EXPECT_EQ(one->w1, two->w1);
  EXPECT_EQ(one->b1, two->b1);
  EXPECT_EQ(one->w2, two->w2);
  EXPECT_EQ(one->b2, two->b2);
  EXPECT_EQ(one->val.total, two->val.total);
}

TEST(RetainingTrainer, TheNeighbourTermSmoothsTheScores) {
  const RetainingLayerData d = Synthetic(4);
  RetainingTrainOptions o = Options();
  o.epochs = 8;
  o.alpha = 0;
  auto plain = TrainRetainingLayer(d, o, 0, nullptr);
  o.alpha = 5;
  auto smooth = TrainRetainingLayer(d, o, 0, nullptr);
  ASSERT_TRUE(plain.ok() && smooth.ok());
  EXPECT_EQ(plain->val.total, plain->val.smooth_l1);
  EXPECT_LT(smooth->val.neighbour, 0.5 * plain->val.neighbour);
}

double SmoothL1(double d) { return std::fabs(d) < 1 ? 0.5 * d * d : std::fabs(d) - 0.5; }

TEST(RetainingTrainer, ReportsTheSavedFilesValidationLoss) {
  test_util::TempDir dir;
  WriteData(dir.path(), 2);
  const std::string out = dir.File("retaining.safetensors");
  RetainingTrainOptions o = Options();
  o.epochs = 6;
  o.alpha = 0.05f;  // large enough for the neighbour part to show in the total
  ASSERT_TRUE(TrainRetainingHeads(dir.path(), out, o, nullptr).ok());
  auto heads = LoadRetainingHeads(out, 2, kHeads, kHeadDim);
  ASSERT_TRUE(heads.ok()) << heads.status().ToString();
  const json j = json::parse(heads->json);
  EXPECT_EQ(j["label"], "teacher MLP + noise");
  EXPECT_EQ(j["hidden"], o.hidden);
  const json& t = j["training"];
  EXPECT_EQ(t["rows_used"], kRows);
  EXPECT_DOUBLE_EQ(t["options"]["alpha"].get<double>(), 0.05);
  EXPECT_EQ(t["data_meta"]["answer_tokens"], 8);
  ASSERT_EQ(t["layers"].size(), 2u);
  const std::vector<int32_t> val_ids = t["validation_segments"].get<std::vector<int32_t>>();
  EXPECT_EQ(val_ids.size(), 6u);
  auto meta = ReadRetainingDataMeta(dir.path());
  ASSERT_TRUE(meta.ok());
  for (int32_t l = 0; l < 2; ++l) {
    SCOPED_TRACE(l);
    auto d = ReadRetainingLayerData(dir.path(), *meta, l);
    ASSERT_TRUE(d.ok());
    // Plain loops, in double: score every validation row, then the two means.
    double sl1 = 0, nb = 0;
    int64_t rows = 0, pairs = 0;
    std::vector<double> prev(kHeads);
    std::map<int32_t, std::vector<std::pair<double, double>>> windows[kHeads];  // (label, pred)
    for (int64_t r = 0; r < kRows; ++r) {
      const int32_t seg = d->segment[r];
      if (std::find(val_ids.begin(), val_ids.end(), seg) == val_ids.end()) continue;
      const bool pair = r > 0 && d->segment[r - 1] == seg;
      ++rows;
      pairs += pair;
      for (int32_t h = 0; h < kHeads; ++h) {
        // The ranking is compared exactly, so it uses f32 in RetainingScore's order: a double
        // score could swap two near-tied tokens at the top-20% boundary.
        float sf = 0.0f;
        for (int32_t j2 = 0; j2 < o.hidden; ++j2) {
          float z = heads->b1[l][h * o.hidden + j2];
          for (int32_t k = 0; k < kIn; ++k) {
            z += heads->w1[l][(h * o.hidden + j2) * kIn + k] *
                 HalfToFloat(d->x[(r * kHeads + h) * kIn + k]);
          }
          sf += heads->w2[l][h * o.hidden + j2] * std::max(z, 0.0f);
        }
        sf += heads->b2[l][h];
        double s = heads->b2[l][h];
        for (int32_t j2 = 0; j2 < o.hidden; ++j2) {
          double z = heads->b1[l][h * o.hidden + j2];
          for (int32_t k = 0; k < kIn; ++k) {
            z += double(heads->w1[l][(h * o.hidden + j2) * kIn + k]) *
                 HalfToFloat(d->x[(r * kHeads + h) * kIn + k]);
          }
          s += heads->w2[l][h * o.hidden + j2] * std::max(z, 0.0);
        }
        const double label = d->label[r * kHeads + h];
        sl1 += SmoothL1(s - label);
        if (pair) nb += (s - prev[h]) * (s - prev[h]);
        prev[h] = s;
        windows[h][seg].emplace_back(label, sf);
      }
    }
    ASSERT_EQ(rows, 6 * kTokens);
    ASSERT_EQ(pairs, 6 * (kTokens - 1));
    sl1 /= double(rows) * kHeads;
    nb /= double(pairs) * kHeads;
    const json& v = t["layers"][l]["val"];
    EXPECT_NEAR(v["smooth_l1"].get<double>(), sl1, 1e-4 * sl1);
    EXPECT_NEAR(v["neighbour"].get<double>(), nb, 1e-4 * nb);
    EXPECT_NEAR(v["loss"].get<double>(), sl1 + o.alpha * nb, 1e-4 * (sl1 + o.alpha * nb));
    EXPECT_GT(o.alpha * nb, 1e-3 * sl1);  // the neighbour part is really part of the check
    // Top-20% recall per (window, head), averaged.
    double recall = 0;
    int count = 0;
    for (int32_t h = 0; h < kHeads; ++h) {
      for (auto& [seg, items] : windows[h]) {
        const size_t k = (items.size() + 4) / 5;
        std::vector<size_t> by_label(items.size()), by_pred(items.size());
        for (size_t i = 0; i < items.size(); ++i) by_label[i] = by_pred[i] = i;
        std::stable_sort(by_label.begin(), by_label.end(),
                         [&](size_t a, size_t b) { return items[a].first > items[b].first; });
        std::stable_sort(by_pred.begin(), by_pred.end(),
                         [&](size_t a, size_t b) { return items[a].second > items[b].second; });
        std::set<size_t> top(by_label.begin(), by_label.begin() + k);
        size_t hit = 0;
        for (size_t i = 0; i < k; ++i) hit += top.count(by_pred[i]);
        recall += double(hit) / double(k);
        ++count;
      }
    }
    EXPECT_NEAR(t["layers"][l]["val_top20_recall"].get<double>(), recall / count, 1e-9);
    EXPECT_EQ(t["layers"][l]["train_loss"].size(), t["layers"][l]["epochs_run"].get<size_t>());
  }
}

TEST(RetainingTrainer, LimitsRowsAndRejectsBadInput) {
  test_util::TempDir dir;
  const std::string out = dir.File("r.safetensors");
  Status s = TrainRetainingHeads(dir.path(), out, Options(), nullptr);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("meta.json"), std::string::npos) << s.ToString();

  WriteData(dir.path(), 1);
  RetainingTrainOptions o = Options();
  o.epochs = 1;
  o.max_rows = 15 * kTokens + 7;  // 15 whole windows and part of a 16th
  ASSERT_TRUE(TrainRetainingHeads(dir.path(), out, o, nullptr).ok());
  auto heads = LoadRetainingHeads(out, 1, kHeads, kHeadDim);
  ASSERT_TRUE(heads.ok());
  const json t = json::parse(heads->json)["training"];
  EXPECT_EQ(t["rows_used"], 15 * kTokens + 7);
  EXPECT_EQ(t["validation_segments"].size(), 2u);  // ceil(16 / 10)

  // A single window cannot be split.
  o.max_rows = kTokens;
  s = TrainRetainingHeads(dir.path(), out, o, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("2 windows"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("layer 0"), std::string::npos) << s.ToString();

  o = Options();
  o.hidden = 0;
  EXPECT_EQ(TrainRetainingLayer(Synthetic(1), o, 0, nullptr).status().code(),
            StatusCode::kInvalidArgument);
  test_util::WriteBytes(RetainingLayerDataPath(dir.path(), 0), "short");
  s = TrainRetainingHeads(dir.path(), out, Options(), nullptr);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("layer_0.safetensors"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace deja::predictors
