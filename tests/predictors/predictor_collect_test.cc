// `deja-lab collect` on a slice of held-out text with opt-mini, checked against a dense forward, and
// a short training on its output.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "common/dtype.h"
#include "common/opt_config.h"
#include "common/safetensors.h"
#include "common/tokenizer.h"
#include "kernels/backend.h"
#include "predictors/predictor_data.h"
#include "predictors/predictors.h"
#include "predictors/trainer.h"
#include "tests/common/temp_dir.h"
#include "tests/worker/golden_util.h"
#include "lab/dejavu_collect.h"

namespace deja::predictors {
namespace {

using worker::dejavu::Collect;
using worker::dejavu::CollectOptions;
using worker::dejavu::CollectSummary;

constexpr int64_t kRows = 600;

float F(const TensorView& v, int64_t i) { return LoadAsFloat(v.data, v.dtype, i); }

class CollectTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test_util::TempDir();
    const std::string model_dir = test_util::ModelDir("opt-mini");
    backend_ = kernels::MakeCpuBackend(2).release();
    auto model = worker::model::LoadModel(model_dir, backend_);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    auto tok = Tokenizer::Load(model_dir);
    ASSERT_TRUE(tok.ok());
    std::ifstream in(test_util::SourceDir() + "/tests/data/heldout/kjv.txt");
    std::stringstream ss;
    ss << in.rdbuf();
    auto ids = (*tok)->Encode(ss.str().substr(0, 12000), false);
    ASSERT_TRUE(ids.ok());
    CollectOptions o;
    o.context = 100;
    o.max_rows = kRows;
    o.seed = 4;
    auto sum = Collect(**model, {*ids}, o, dir_->path(), nullptr);
    ASSERT_TRUE(sum.ok()) << sum.status().ToString();
    summary_ = new CollectSummary(*sum);
  }
  static void TearDownTestSuite() {
    delete summary_;
    delete dir_;
    delete backend_;
  }
  static test_util::TempDir* dir_;
  static kernels::Backend* backend_;
  static CollectSummary* summary_;
};
test_util::TempDir* CollectTest::dir_ = nullptr;
kernels::Backend* CollectTest::backend_ = nullptr;
CollectSummary* CollectTest::summary_ = nullptr;

TEST_F(CollectTest, ShapesAndHeadLabels) {
  ASSERT_NE(summary_, nullptr);
  EXPECT_EQ(summary_->rows, kRows);
  EXPECT_LT(summary_->windows, summary_->windows_total);  // the cap stopped it early
  auto meta = ReadDataMeta(dir_->path());
  ASSERT_TRUE(meta.ok()) << meta.status().ToString();
  EXPECT_EQ(meta->rows, kRows);
  EXPECT_EQ(meta->num_layers, 4);
  for (int32_t l = 0; l < meta->num_layers; ++l) {
    auto mlp = ReadBlockData(dir_->path(), *meta, l, BlockKind::kMlp);
    ASSERT_TRUE(mlp.ok()) << mlp.status().ToString();
    EXPECT_EQ(mlp->units, 1024);
    const double frac = summary_->mlp_active_fraction[l];
    EXPECT_GT(frac, 0.01) << "layer " << l;
    EXPECT_LT(frac, 0.9) << "layer " << l;
    if (l == 0) {
      EXPECT_FALSE(ReadBlockData(dir_->path(), *meta, 0, BlockKind::kHeads).ok());
      continue;
    }
    auto heads = ReadBlockData(dir_->path(), *meta, l, BlockKind::kHeads);
    ASSERT_TRUE(heads.ok()) << heads.status().ToString();
    for (int64_t r = 0; r < heads->rows; ++r) {
      int n = 0;
      for (int64_t h = 0; h < 8; ++h) n += heads->Label(r, h);
      ASSERT_EQ(n, 3) << "ceil(0.3 * 8) heads per token";
    }
  }
}

// heads.x of layer 1 is the MLP-block input of layer 0, so relu(LN2(x) W1 + b1) > 0 recomputed
// from the checkpoint must give mlp.y of layer 0 for the same row.
TEST_F(CollectTest, LabelsMatchADenseRecomputation) {
  auto meta = ReadDataMeta(dir_->path());
  ASSERT_TRUE(meta.ok());
  auto heads1 = ReadBlockData(dir_->path(), *meta, 1, BlockKind::kHeads);
  auto mlp0 = ReadBlockData(dir_->path(), *meta, 0, BlockKind::kMlp);
  ASSERT_TRUE(heads1.ok() && mlp0.ok());
  const std::string model_dir = test_util::ModelDir("opt-mini");
  auto ckpt = Checkpoint::OpenDir(model_dir);
  auto config = LoadOptConfig(model_dir);
  ASSERT_TRUE(ckpt.ok() && config.ok());
  auto names = ResolveOptTensorNames(**ckpt, *config);
  ASSERT_TRUE(names.ok());
  const OptLayerNames ln = names->Layer(0);
  const int64_t d = 256, f = 1024;
  auto g = (*ckpt)->Get(ln.ffn_ln_weight, {d});
  auto b = (*ckpt)->Get(ln.ffn_ln_bias, {d});
  auto w1 = (*ckpt)->Get(ln.fc1_weight, {f, d});
  auto b1 = (*ckpt)->Get(ln.fc1_bias, {f});
  ASSERT_TRUE(g.ok() && b.ok() && w1.ok() && b1.ok());
  int64_t checked = 0, mismatched = 0, active = 0;
  for (int64_t row : {int64_t{0}, int64_t{37}, int64_t{211}, kRows - 1}) {
    std::vector<double> x(d), a(d);
    double mean = 0, var = 0;
    for (int64_t j = 0; j < d; ++j) mean += x[j] = HalfToFloat(heads1->x[row * d + j]);
    mean /= d;
    for (int64_t j = 0; j < d; ++j) var += (x[j] - mean) * (x[j] - mean);
    var /= d;
    for (int64_t j = 0; j < d; ++j) {
      a[j] = (x[j] - mean) / std::sqrt(var + 1e-5) * F(*g, j) + F(*b, j);
    }
    for (int64_t o = 0; o < f; ++o) {
      double z = F(*b1, o);
      for (int64_t j = 0; j < d; ++j) z += a[j] * F(*w1, o * d + j);
      // The stored input is f16; only pre-activations clearly away from 0 must agree.
      if (std::fabs(z) < 2e-2) continue;
      ++checked;
      active += z > 0;
      mismatched += (z > 0) != mlp0->Label(row, o);
    }
  }
  EXPECT_GT(checked, 3000);
  EXPECT_GT(active, 0);
  EXPECT_EQ(mismatched, 0);
}

TEST_F(CollectTest, ShortTrainingLoadsForTheModel) {
  TrainOptions o;
  o.rank = 16;
  o.epochs = 2;
  o.batch = 128;
  const std::string out = dir_->File("pred.safetensors");
  Status s = TrainPredictors(dir_->path(), out, o, nullptr);
  ASSERT_TRUE(s.ok()) << s.ToString();
  auto config = LoadOptConfig(test_util::ModelDir("opt-mini"));
  ASSERT_TRUE(config.ok());
  auto set = LoadPredictors(out, *config, 1, 2);
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  ASSERT_EQ(set->layers.size(), 4u);
  EXPECT_TRUE(set->layers[0].head_fc1.empty());
  EXPECT_TRUE(set->layers[3].mlp_fc1.shape() == Shape({16, 256}));
  EXPECT_TRUE(set->layers[3].mlp_fc2.shape() == Shape({512, 16}));
  EXPECT_TRUE(set->layers[3].head_fc2.shape() == Shape({4, 16}));
}

// The committed opt-mini predictors on rows of held-out text (not the train split the trainer
// validated on): top-k recall at the schedule's k is close to what predictors.json reports.
TEST_F(CollectTest, CommittedPredictorsRecallOnHeldOutRowsMatchesTheReport) {
  const std::string path = test_util::ModelDir("opt-mini") + "/predictors.safetensors";
  auto config = LoadOptConfig(test_util::ModelDir("opt-mini"));
  ASSERT_TRUE(config.ok());
  auto set = LoadPredictors(path, *config, 0, 1);
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  auto meta = ReadDataMeta(dir_->path());
  ASSERT_TRUE(meta.ok());
  int checked = 0;
  for (int32_t layer = 0; layer < config->num_hidden_layers; ++layer) {
    for (BlockKind kind : {BlockKind::kMlp, BlockKind::kHeads}) {
      const BlockSchedule& sched = kind == BlockKind::kMlp ? set->meta.layers[layer].mlp
                                                           : set->meta.layers[layer].heads;
      if (sched.top_k == 0) continue;
      const LayerPredictors& lp = set->layers[layer];
      const Tensor& fc1 = kind == BlockKind::kMlp ? lp.mlp_fc1 : lp.head_fc1;
      const Tensor& fc2 = kind == BlockKind::kMlp ? lp.mlp_fc2 : lp.head_fc2;
      auto data = ReadBlockData(dir_->path(), *meta, layer, kind);
      ASSERT_TRUE(data.ok()) << data.status().ToString();
      const int64_t r = fc1.shape()[0], d = fc1.shape()[1], units = fc2.shape()[0];
      ASSERT_EQ(units, data->units);
      std::vector<float> logits(static_cast<size_t>(data->rows * units));
      std::vector<float> hidden(static_cast<size_t>(r));
      for (int64_t row = 0; row < data->rows; ++row) {
        for (int64_t i = 0; i < r; ++i) {
          double acc = 0;
          for (int64_t k = 0; k < d; ++k) {
            acc += F(fc1.view(), i * d + k) *
                   LoadAsFloat(data->x.data(), DType::kF16, row * d + k);
          }
          hidden[i] = static_cast<float>(acc);
        }
        for (int64_t u = 0; u < units; ++u) {
          double acc = 0;
          for (int64_t i = 0; i < r; ++i) acc += F(fc2.view(), u * r + i) * hidden[i];
          logits[row * units + u] = static_cast<float>(acc);
        }
      }
      std::vector<int64_t> rows(static_cast<size_t>(data->rows));
      for (int64_t i = 0; i < data->rows; ++i) rows[i] = i;
      TopKCurve curve = EvaluateTopK(logits.data(), *data, rows);
      const double recall = curve.recall[sched.top_k - 1];
      EXPECT_NEAR(recall, sched.recall, 0.05)
          << "layer " << layer << " " << BlockKindName(kind) << " top-k " << sched.top_k;
      ++checked;
    }
  }
  EXPECT_GE(checked, 4);
}

}  // namespace
}  // namespace deja::predictors
