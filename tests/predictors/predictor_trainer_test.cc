// The trainer on a synthetic problem whose labels come from a known low-rank map: it must learn
// it (high recall), and the recall it reports must match an independent recomputation from the
// saved file on the same validation rows.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/dtype.h"
#include "predictors/predictor_data.h"
#include "predictors/predictors.h"
#include "predictors/trainer.h"
#include "tests/common/temp_dir.h"

namespace deja::predictors {
namespace {

constexpr int32_t kD = 32, kFfn = 64, kHeads = 8, kLayers = 2, kRows = 4000;

// Labels: unit j active when (B A x)_j > threshold, A [4, d], B [units, 4] random.
BlockData Synthetic(int64_t units, uint64_t seed, float threshold) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n;
  std::vector<float> a(4 * kD), b(units * 4);
  for (float& v : a) v = n(rng) / std::sqrt(float(kD));
  for (float& v : b) v = n(rng);
  BlockData d;
  d.rows = kRows;
  d.dim = kD;
  d.units = units;
  d.x.resize(kRows * kD);
  d.y.assign(kRows * d.label_bytes(), 0);
  std::vector<float> x(kD);
  for (int64_t r = 0; r < kRows; ++r) {
    for (int j = 0; j < kD; ++j) {
      d.x[r * kD + j] = FloatToHalf(n(rng));
      x[j] = HalfToFloat(d.x[r * kD + j]);
    }
    float h[4] = {0, 0, 0, 0};
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < kD; ++j) h[i] += a[i * kD + j] * x[j];
    }
    for (int64_t u = 0; u < units; ++u) {
      float z = 0;
      for (int i = 0; i < 4; ++i) z += b[u * 4 + i] * h[i];
      if (z > threshold) d.y[r * d.label_bytes() + u / 8] |= 1 << (u % 8);
    }
  }
  return d;
}

TrainOptions Options() {
  TrainOptions o;
  o.rank = 16;
  o.epochs = 12;
  o.batch = 256;
  o.lr = 1e-2f;
  o.seed = 3;
  o.threads = 2;
  return o;
}

TEST(PredictorTrainer, SplitIsDeterministicAndDisjoint) {
  RowSplit a = SplitRows(1001, 5), b = SplitRows(1001, 5), c = SplitRows(1001, 6);
  EXPECT_EQ(a.val, b.val);
  EXPECT_NE(a.val, c.val);
  EXPECT_EQ(a.val.size(), 101u);
  std::vector<int64_t> all = a.train;
  all.insert(all.end(), a.val.begin(), a.val.end());
  std::sort(all.begin(), all.end());
  for (int64_t i = 0; i < 1001; ++i) ASSERT_EQ(all[i], i);
}

TEST(PredictorTrainer, LearnsALowRankMap) {
  BlockData data = Synthetic(kFfn, 11, 1.0f);
  auto r = TrainBlock(data, Options(), 42, nullptr);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_GT(r->label_mean, 0.1);
  EXPECT_LT(r->label_mean, 0.5);
  EXPECT_GT(r->recall, 0.9);
  // Class-balanced BCE trades precision for recall; the run stops once recall > 0.99.
  EXPECT_GT(r->precision, 0.5);
  EXPECT_GT(r->top_k, 0);
  EXPECT_LT(r->top_k, kFfn);
  EXPECT_GE(r->topk_recall, 0.95);
  EXPECT_EQ(r->val_rows, 400);
  EXPECT_GE(r->best_epoch, 1);
  EXPECT_LE(r->best_epoch, r->epochs_run);
}

// Writes a two-layer collect directory with synthetic rows.
void WriteData(const std::string& dir) {
  nlohmann::json meta = {{"format", kDataFormat}, {"hidden_size", kD}, {"ffn_dim", kFfn},
                         {"num_heads", kHeads},   {"num_layers", kLayers}, {"rows", kRows}};
  std::ofstream(dir + "/meta.json") << meta.dump();
  BlockData none;
  none.dim = kD;
  none.units = kHeads;
  ASSERT_TRUE(WriteLayerData(dir, 0, Synthetic(kFfn, 1, 1.0f), none).ok());
  ASSERT_TRUE(WriteLayerData(dir, 1, Synthetic(kFfn, 2, 0.5f), Synthetic(kHeads, 3, 0.3f)).ok());
}

// Recall / precision of the top-k sets and at logit > 0, in double from the saved weights.
struct Recomputed {
  double topk_recall = 0, threshold_recall = 0, threshold_precision = 0;
};
Recomputed Recompute(const BlockData& data, const std::vector<int64_t>& rows, const Tensor& fc1,
                     const Tensor& fc2, int32_t k) {
  const int64_t r = fc1.shape()[0], u = data.units;
  Recomputed out;
  int64_t tp = 0, fp = 0, fn = 0, recall_rows = 0;
  std::vector<double> h(r), z(u);
  std::vector<int32_t> order(u);
  for (int64_t row : rows) {
    for (int64_t i = 0; i < r; ++i) {
      h[i] = 0;
      for (int64_t j = 0; j < data.dim; ++j) {
        h[i] += double(HalfToFloat(fc1.as<uint16_t>()[i * data.dim + j])) *
                HalfToFloat(data.x[row * data.dim + j]);
      }
    }
    for (int64_t o = 0; o < u; ++o) {
      z[o] = 0;
      for (int64_t i = 0; i < r; ++i) z[o] += double(HalfToFloat(fc2.as<uint16_t>()[o * r + i])) * h[i];
      const bool y = data.Label(row, o), p = z[o] > 0;
      tp += p && y;
      fp += p && !y;
      fn += !p && y;
    }
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return z[a] > z[b]; });
    int64_t total = 0, hit = 0;
    for (int64_t o = 0; o < u; ++o) total += data.Label(row, o);
    for (int32_t i = 0; i < k; ++i) hit += data.Label(row, order[i]);
    if (total > 0) {
      out.topk_recall += double(hit) / double(total);
      ++recall_rows;
    }
  }
  out.topk_recall /= double(recall_rows);
  out.threshold_recall = double(tp) / double(tp + fn);
  out.threshold_precision = double(tp) / double(tp + fp);
  return out;
}

// Trains predictors on the data in data_dir with o, writes them to out and loads them back
// (one rank) for the test model's shape.
StatusOr<PredictorSet> TrainAndLoad(const std::string& data_dir, const std::string& out,
                                    const TrainOptions& o) {
  DEJA_RETURN_IF_ERROR(TrainPredictors(data_dir, out, o, nullptr));
  OptConfig c;
  c.hidden_size = kD;
  c.ffn_dim = kFfn;
  c.num_attention_heads = kHeads;
  c.num_hidden_layers = kLayers;
  return LoadPredictors(out, c, 0, 1);
}

TEST(PredictorTrainer, ReportedRecallMatchesTheSavedFile) {
  test_util::TempDir dir;
  WriteData(dir.path());
  const std::string out = dir.File("pred.safetensors");
  TrainOptions o = Options();
  o.epochs = 6;
  auto set = TrainAndLoad(dir.path(), out, o);
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  std::ifstream in(MetaPathFor(out));
  nlohmann::json j = nlohmann::json::parse(in);
  auto meta = ReadDataMeta(dir.path());
  ASSERT_TRUE(meta.ok());
  struct Case {
    int32_t layer;
    BlockKind kind;
  };
  for (Case cs : {Case{0, BlockKind::kMlp}, Case{1, BlockKind::kMlp}, Case{1, BlockKind::kHeads}}) {
    SCOPED_TRACE(std::to_string(cs.layer) + BlockKindName(cs.kind));
    auto data = ReadBlockData(dir.path(), *meta, cs.layer, cs.kind);
    ASSERT_TRUE(data.ok());
    const RowSplit split = SplitRows(data->rows, BlockSeed(o.seed, cs.layer, cs.kind));
    const LayerPredictors& lp = set->layers[cs.layer];
    const bool mlp = cs.kind == BlockKind::kMlp;
    const BlockSchedule& s = mlp ? set->meta.layers[cs.layer].mlp : set->meta.layers[cs.layer].heads;
    const nlohmann::json& info = j["layers"][cs.layer][BlockKindName(cs.kind)];
    const int32_t k = s.top_k > 0 ? s.top_k : static_cast<int32_t>(data->units);
    Recomputed rc = Recompute(*data, split.val, mlp ? lp.mlp_fc1 : lp.head_fc1,
                              mlp ? lp.mlp_fc2 : lp.head_fc2, k);
    EXPECT_NEAR(rc.topk_recall, info["topk_recall"].get<double>(), 1e-3);
    EXPECT_NEAR(rc.threshold_recall, info["threshold_recall"].get<double>(), 1e-3);
    EXPECT_NEAR(rc.threshold_precision, info["threshold_precision"].get<double>(), 1e-3);
    if (s.top_k > 0) {
      EXPECT_NEAR(rc.topk_recall, s.recall, 1e-3);
      EXPECT_GE(s.recall, o.target_recall);
    }
    EXPECT_EQ(info["val_rows"].get<int64_t>(), static_cast<int64_t>(split.val.size()));
  }
  EXPECT_GT(set->meta.layers[0].mlp.top_k, 0);
  EXPECT_LT(set->meta.layers[0].mlp.top_k, kFfn);
}

// --head-target-recall 1: the heads' schedule keeps as many heads as hold every validation row's
// important heads (top-k recall exactly 1, or dense), while the MLP schedule still follows
// --target-recall; the JSON records both targets.
TEST(PredictorTrainer, HeadTargetRecallOfOneHoldsEveryImportantHead) {
  test_util::TempDir dir;
  WriteData(dir.path());
  const std::string out = dir.File("pred.safetensors");
  TrainOptions o = Options();
  o.epochs = 6;
  o.head_target_recall = 1.0f;
  auto set = TrainAndLoad(dir.path(), out, o);
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  std::ifstream in(MetaPathFor(out));
  nlohmann::json j = nlohmann::json::parse(in);
  // The same data with the heads at the MLP's target (0.95) keeps fewer heads on this data.
  const std::string out95 = dir.File("pred95.safetensors");
  TrainOptions o95 = o;
  o95.head_target_recall = 0.f;
  auto set95 = TrainAndLoad(dir.path(), out95, o95);
  ASSERT_TRUE(set95.ok()) << set95.status().ToString();
  auto kept = [](const BlockSchedule& h) { return h.top_k > 0 ? h.top_k : kHeads; };
  for (int32_t l = 1; l < kLayers; ++l) {
    const BlockSchedule& h = set->meta.layers[l].heads;
    if (h.top_k > 0) EXPECT_FLOAT_EQ(h.recall, 1.0f) << l;
    EXPECT_GT(kept(h), kept(set95->meta.layers[l].heads)) << l;
  }
  EXPECT_GT(set->meta.layers[0].mlp.top_k, 0);
  EXPECT_LT(set->meta.layers[0].mlp.top_k, kFfn);
  EXPECT_DOUBLE_EQ(j["training"]["head_target_recall"].get<double>(), 1.0);
  EXPECT_NEAR(j["training"]["target_recall"].get<double>(), o.target_recall, 1e-6);
}

TEST(PredictorTrainer, RejectsADirectoryThatIsNotCollectOutput) {
  test_util::TempDir dir;
  Status s = TrainPredictors(dir.path(), dir.File("p.safetensors"), Options(), nullptr);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("meta.json"), std::string::npos) << s.ToString();
  WriteData(dir.path());
  test_util::WriteBytes(LayerDataPath(dir.path(), 1), "short");
  s = TrainPredictors(dir.path(), dir.File("p.safetensors"), Options(), nullptr);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("layer_1.safetensors"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace deja::predictors
