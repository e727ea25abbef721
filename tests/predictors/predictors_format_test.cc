// The predictor file pair: save/load round trip, tensor-parallel sharding of the second maps,
// and strict rejection of malformed files with messages naming the file and tensor.
#include <fstream>
#include <random>
#include <string>

#include <gtest/gtest.h>

#include "common/dtype.h"
#include "common/safetensors.h"
#include "predictors/predictors.h"
#include "tests/common/temp_dir.h"
#include "tests/worker/golden_util.h"

namespace deja::predictors {
namespace {

constexpr int32_t kD = 16, kFfn = 13, kHeads = 4, kLayers = 3, kR = 5;

OptConfig Config() {
  OptConfig c;
  c.hidden_size = kD;
  c.ffn_dim = kFfn;
  c.num_attention_heads = kHeads;
  c.num_hidden_layers = kLayers;
  return c;
}

Tensor Random(int64_t rows, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> n;
  Tensor t = Tensor::Empty(DType::kF32, {rows, cols});
  for (int64_t i = 0; i < t.numel(); ++i) t.as<float>()[i] = n(rng);
  return t;
}

float Half(const Tensor& t, int64_t i) { return HalfToFloat(t.as<uint16_t>()[i]); }
float RoundHalf(float x) { return HalfToFloat(FloatToHalf(x)); }

// Layer 0: MLP only (its heads never have a predictor); layer 1: both; layer 2: heads only.
struct Fixture {
  PredictorMeta meta;
  std::vector<LayerPredictors> layers;
  Fixture() {
    std::mt19937 rng(7);
    meta.rank = kR;
    meta.hidden_size = kD;
    meta.ffn_dim = kFfn;
    meta.num_heads = kHeads;
    meta.num_layers = kLayers;
    meta.layers.resize(kLayers);
    meta.layers[0].mlp = {0, -1, -1};
    meta.layers[1].mlp = {6, 0.97f, 0.5f};
    meta.layers[1].heads = {2, 0.96f, 0.6f};
    meta.layers[2].heads = {3, 0.99f, 0.4f};
    layers.resize(kLayers);
    for (int l = 0; l < 2; ++l) {
      layers[l].mlp_fc1 = Random(kR, kD, rng);
      layers[l].mlp_fc2 = Random(kFfn, kR, rng);
    }
    for (int l = 1; l < 3; ++l) {
      layers[l].head_fc1 = Random(kR, kD, rng);
      layers[l].head_fc2 = Random(kHeads, kR, rng);
    }
  }
};

TEST(PredictorsFormat, MetaPath) {
  EXPECT_EQ(MetaPathFor("/a/b/predictors.safetensors"), "/a/b/predictors.json");
  EXPECT_EQ(MetaPathFor("x"), "x.json");
}

TEST(PredictorsFormat, RoundTripWorldOne) {
  test_util::TempDir dir;
  Fixture f;
  const std::string path = dir.File("p.safetensors");
  ASSERT_TRUE(SavePredictors(path, f.meta, f.layers, R"({"note": "x"})").ok());
  auto set = LoadPredictors(path, Config(), 0, 1);
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(set->meta.rank, kR);
  EXPECT_EQ(set->meta.layers[1].mlp.top_k, 6);
  EXPECT_FLOAT_EQ(set->meta.layers[1].heads.recall, 0.96f);
  EXPECT_EQ(set->meta.layers[0].heads.top_k, 0);
  EXPECT_TRUE(set->layers[0].head_fc1.empty());
  EXPECT_TRUE(set->layers[2].mlp_fc1.empty());
  for (int l = 0; l < kLayers; ++l) {
    const std::pair<const Tensor*, const Tensor*> pairs[] = {
        {&f.layers[l].mlp_fc1, &set->layers[l].mlp_fc1},
        {&f.layers[l].mlp_fc2, &set->layers[l].mlp_fc2},
        {&f.layers[l].head_fc1, &set->layers[l].head_fc1},
        {&f.layers[l].head_fc2, &set->layers[l].head_fc2}};
    for (const auto& [want, got] : pairs) {
      ASSERT_EQ(want->empty(), got->empty());
      if (want->empty()) continue;
      ASSERT_EQ(got->dtype(), DType::kF16);
      ASSERT_TRUE(got->shape() == want->shape());
      for (int64_t i = 0; i < want->numel(); ++i) {
        ASSERT_EQ(Half(*got, i), RoundHalf(want->as<float>()[i]));
      }
    }
  }
  auto meta = LoadPredictorMeta(MetaPathFor(path));
  ASSERT_TRUE(meta.ok());
  std::ifstream in(MetaPathFor(path));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"note\""), std::string::npos);  // extra info kept
}

TEST(PredictorsFormat, ShardsSecondMapsByRank) {
  test_util::TempDir dir;
  Fixture f;
  const std::string path = dir.File("p.safetensors");
  ASSERT_TRUE(SavePredictors(path, f.meta, f.layers).ok());
  // ffn 13 over 2 ranks: rows [0, 7) and [7, 13); heads 4: [0, 2) and [2, 4).
  const int64_t ffn_begin[] = {0, 7}, ffn_rows[] = {7, 6}, head_begin[] = {0, 2};
  for (int rank = 0; rank < 2; ++rank) {
    auto set = LoadPredictors(path, Config(), rank, 2);
    ASSERT_TRUE(set.ok()) << set.status().ToString();
    const LayerPredictors& lp = set->layers[1];
    ASSERT_TRUE(lp.mlp_fc1.shape() == Shape({kR, kD}));  // replicated
    for (int64_t i = 0; i < kR * kD; ++i) {
      ASSERT_EQ(Half(lp.mlp_fc1, i), RoundHalf(f.layers[1].mlp_fc1.as<float>()[i]));
    }
    ASSERT_TRUE(lp.mlp_fc2.shape() == Shape({ffn_rows[rank], kR}));
    for (int64_t i = 0; i < ffn_rows[rank] * kR; ++i) {
      ASSERT_EQ(Half(lp.mlp_fc2, i),
                RoundHalf(f.layers[1].mlp_fc2.as<float>()[ffn_begin[rank] * kR + i]));
    }
    ASSERT_TRUE(lp.head_fc2.shape() == Shape({2, kR}));
    for (int64_t i = 0; i < 2 * kR; ++i) {
      ASSERT_EQ(Half(lp.head_fc2, i),
                RoundHalf(f.layers[1].head_fc2.as<float>()[head_begin[rank] * kR + i]));
    }
  }
  EXPECT_FALSE(LoadPredictors(path, Config(), 2, 2).ok());
}

class Malformed : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.File("p.safetensors");
    ASSERT_TRUE(SavePredictors(path_, f_.meta, f_.layers).ok());
  }
  // Rewrites the safetensors file with `tensors` (f16 copies of the fixture unless given).
  void Rewrite(const std::vector<std::pair<std::string, TensorView>>& tensors) {
    ASSERT_TRUE(WriteSafetensors(path_, tensors).ok());
  }
  void ExpectError(const std::string& needle, const OptConfig& c = Config()) {
    auto set = LoadPredictors(path_, c, 0, 1);
    ASSERT_FALSE(set.ok()) << "expected an error mentioning " << needle;
    EXPECT_EQ(set.status().code(), StatusCode::kInvalidArgument) << set.status().ToString();
    EXPECT_NE(set.status().message().find(needle), std::string::npos) << set.status().ToString();
  }
  std::string JsonText() {
    std::ifstream in(MetaPathFor(path_));
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  test_util::TempDir dir_;
  Fixture f_;
  std::string path_;
};

Tensor F16(const Tensor& t) {
  Tensor h = Tensor::Empty(DType::kF16, t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) h.as<uint16_t>()[i] = FloatToHalf(t.as<float>()[i]);
  return h;
}

TEST_F(Malformed, ModelDimensionsMismatch) {
  OptConfig c = Config();
  c.hidden_size = 32;
  ExpectError("hidden_size", c);
  c = Config();
  c.num_hidden_layers = 4;
  ExpectError("num_layers", c);
}

TEST_F(Malformed, MissingHalfOfAPair) {
  Tensor a = F16(f_.layers[0].mlp_fc1), b = F16(f_.layers[1].mlp_fc1),
         c = F16(f_.layers[1].mlp_fc2);
  Rewrite({{"mlp.0.fc1", a.view()}, {"mlp.1.fc1", b.view()}, {"mlp.1.fc2", c.view()}});
  ExpectError("'mlp.0.fc2'");
}

TEST_F(Malformed, WrongShapeNamesTheTensor) {
  Tensor a = F16(f_.layers[0].mlp_fc1), b = F16(f_.layers[0].mlp_fc1);
  Rewrite({{"mlp.0.fc1", a.view()}, {"mlp.0.fc2", b.view()}});  // [r, d] where [ffn, r] belongs
  ExpectError("'mlp.0.fc2' has shape");
}

TEST_F(Malformed, WrongDtypeNamesTheTensor) {
  Tensor a = F16(f_.layers[0].mlp_fc1);
  Rewrite({{"mlp.0.fc1", a.view()}, {"mlp.0.fc2", f_.layers[0].mlp_fc2.view()}});
  ExpectError("'mlp.0.fc2' has dtype");
}

TEST_F(Malformed, UnexpectedAndLayerZeroHeadTensors) {
  Tensor a = F16(f_.layers[1].head_fc1);
  Rewrite({{"mlp.7.fc1", a.view()}});
  ExpectError("unexpected tensor 'mlp.7.fc1'");
  Tensor b = F16(f_.layers[1].head_fc2);
  Rewrite({{"heads.0.fc1", a.view()}, {"heads.0.fc2", b.view()}});
  ExpectError("heads.0");
}

TEST_F(Malformed, SparseScheduleWithoutTensors) {
  Rewrite({});
  ExpectError("'mlp.1.fc1' is missing");
}

TEST_F(Malformed, BadJson) {
  test_util::WriteBytes(MetaPathFor(path_), "{\"format\": ");
  ExpectError("not a JSON object");
  test_util::WriteBytes(MetaPathFor(path_), R"({"format": "other"})");
  ExpectError("'format'");
  std::string text = JsonText();
  ASSERT_TRUE(SavePredictors(path_, f_.meta, f_.layers).ok());
  text = JsonText();
  std::string bad = text;
  bad.replace(bad.find("\"top_k\": 6"), 10, "\"top_k\": 99");
  test_util::WriteBytes(MetaPathFor(path_), bad);
  ExpectError("layers[1].mlp.top_k");
  bad = text;
  bad.replace(bad.find("\"rank\": 5"), 9, "\"rank\": -5");
  test_util::WriteBytes(MetaPathFor(path_), bad);
  ExpectError("'rank'");
}

TEST_F(Malformed, MissingFiles) {
  auto set = LoadPredictors(dir_.File("none.safetensors"), Config(), 0, 1);
  ASSERT_FALSE(set.ok());
  EXPECT_NE(set.status().message().find("none.json"), std::string::npos);
  test_util::WriteBytes(path_, "garbage");
  auto set2 = LoadPredictors(path_, Config(), 0, 1);
  ASSERT_FALSE(set2.ok());
  EXPECT_NE(set2.status().message().find("p.safetensors"), std::string::npos)
      << set2.status().ToString();
}

// The predictors committed for models/opt-mini (predictors/README.md) load for that model.
TEST(PredictorsFormat, CommittedOptMiniPredictorsLoad) {
  const std::string dir = test_util::ModelDir("opt-mini");
  auto config = LoadOptConfig(dir);
  ASSERT_TRUE(config.ok());
  for (int rank = 0; rank < 2; ++rank) {
    auto set = LoadPredictors(dir + "/predictors.safetensors", *config, rank, 2);
    ASSERT_TRUE(set.ok()) << set.status().ToString();
    EXPECT_EQ(set->meta.layers[0].heads.top_k, 0);
    for (int l = 0; l < 4; ++l) {
      EXPECT_TRUE(set->layers[l].mlp_fc2.shape() == Shape({512, set->meta.rank}));
      const BlockSchedule& m = set->meta.layers[l].mlp;
      if (m.top_k > 0) EXPECT_GE(m.recall, 0.95f) << "layer " << l;
    }
  }
}

}  // namespace
}  // namespace deja::predictors
