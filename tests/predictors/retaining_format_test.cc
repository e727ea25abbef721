// The Locret retaining heads' files: the training data (retaining_data.h) and the heads
// (retaining_heads.h) round-trip; malformed files give errors naming the file and the field or
// tensor, never a crash; a rank loads exactly its heads; the score matches a hand computation.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "common/dtype.h"
#include "common/safetensors.h"
#include "predictors/raw_safetensors.h"
#include "predictors/retaining_data.h"
#include "predictors/retaining_heads.h"
#include "tests/common/temp_dir.h"

namespace deja::predictors {
namespace {

using nlohmann::json;

constexpr int32_t kLayers = 2, kHeads = 4, kHeadDim = 3, kHidden = 5, kRows = 30;

void WriteMeta(const std::string& dir, json extra = json::object()) {
  json j = {{"format", kRetainingDataFormat},
            {"layers", kLayers},
            {"heads", kHeads},
            {"head_dim", kHeadDim},
            {"rows", kRows},
            {"context", 10},
            {"answer_tokens", 2},
            {"texts", {"a.txt"}},
            {"label", "max logit"}};
  for (auto it = extra.begin(); it != extra.end(); ++it) {
    if (it.value().is_null()) {
      j.erase(it.key());
    } else {
      j[it.key()] = it.value();
    }
  }
  std::ofstream(dir + "/meta.json") << j.dump();
}

RetainingLayerData MakeData(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n;
  RetainingLayerData d;
  d.heads = kHeads;
  d.head_dim = kHeadDim;
  d.rows = kRows;
  for (int64_t i = 0; i < kRows * kHeads * 3 * kHeadDim; ++i) d.x.push_back(FloatToHalf(n(rng)));
  for (int64_t i = 0; i < kRows * kHeads; ++i) d.label.push_back(n(rng));
  for (int64_t i = 0; i < kRows; ++i) d.segment.push_back(static_cast<int32_t>(i / 10));
  return d;
}

template <typename T>
void ExpectError(const StatusOr<T>& s, StatusCode code, std::vector<std::string> needles) {
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), code) << s.status().ToString();
  for (const std::string& needle : needles) {
    EXPECT_NE(s.status().message().find(needle), std::string::npos)
        << "'" << needle << "' not in: " << s.status().ToString();
  }
}

TEST(RetainingData, RoundTrips) {
  test_util::TempDir dir;
  WriteMeta(dir.path());
  const RetainingLayerData d0 = MakeData(1), d1 = MakeData(2);
  ASSERT_TRUE(WriteRetainingLayerData(dir.path(), 0, d0).ok());
  ASSERT_TRUE(WriteRetainingLayerData(dir.path(), 1, d1).ok());
  EXPECT_FALSE(std::filesystem::exists(RetainingLayerDataPath(dir.path(), 0) + ".tmp"));
  auto meta = ReadRetainingDataMeta(dir.path());
  ASSERT_TRUE(meta.ok()) << meta.status().ToString();
  EXPECT_EQ(meta->layers, kLayers);
  EXPECT_EQ(meta->heads, kHeads);
  EXPECT_EQ(meta->head_dim, kHeadDim);
  EXPECT_EQ(meta->rows, kRows);
  EXPECT_EQ(json::parse(meta->json)["label"], "max logit");
  for (int32_t l = 0; l < kLayers; ++l) {
    const RetainingLayerData& want = l == 0 ? d0 : d1;
    auto got = ReadRetainingLayerData(dir.path(), *meta, l);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(got->heads, kHeads);
    EXPECT_EQ(got->head_dim, kHeadDim);
    EXPECT_EQ(got->rows, kRows);
    EXPECT_EQ(got->x, want.x);
    EXPECT_EQ(got->label, want.label);
    EXPECT_EQ(got->segment, want.segment);
  }
  ExpectError(ReadRetainingLayerData(dir.path(), *meta, 2), StatusCode::kInvalidArgument,
              {"no layer 2"});
}

TEST(RetainingData, RejectsBadMeta) {
  test_util::TempDir dir;
  ExpectError(ReadRetainingDataMeta(dir.path()), StatusCode::kFailedPrecondition, {"meta.json"});
  WriteMeta(dir.path(), {{"format", "deja-predictor-data-v1"}});
  ExpectError(ReadRetainingDataMeta(dir.path()), StatusCode::kFailedPrecondition,
              {"meta.json", "format", "deja-predictor-data-v1"});
  test_util::WriteBytes(dir.File("meta.json"), "{not json");
  ExpectError(ReadRetainingDataMeta(dir.path()), StatusCode::kFailedPrecondition, {"meta.json"});
  for (const char* key : {"layers", "heads", "head_dim", "rows"}) {
    WriteMeta(dir.path(), {{key, nullptr}});
    ExpectError(ReadRetainingDataMeta(dir.path()), StatusCode::kInvalidArgument,
                {"meta.json", std::string("'") + key + "'"});
    WriteMeta(dir.path(), {{key, "7"}});
    ExpectError(ReadRetainingDataMeta(dir.path()), StatusCode::kInvalidArgument,
                {std::string("'") + key + "'"});
  }
  WriteMeta(dir.path(), {{"heads", 0}});
  ExpectError(ReadRetainingDataMeta(dir.path()), StatusCode::kInvalidArgument, {"'heads'"});
  // Dimensions whose product overflows must not reach an allocation.
  WriteMeta(dir.path(), {{"rows", int64_t{1} << 62}});
  ExpectError(ReadRetainingDataMeta(dir.path()), StatusCode::kInvalidArgument, {"too many"});
}

TEST(RetainingData, RejectsMalformedLayerFiles) {
  test_util::TempDir dir;
  WriteMeta(dir.path());
  auto meta = ReadRetainingDataMeta(dir.path());
  ASSERT_TRUE(meta.ok());
  const std::string path = RetainingLayerDataPath(dir.path(), 0);
  ExpectError(ReadRetainingLayerData(dir.path(), *meta, 0), StatusCode::kNotFound,
              {"layer_0.safetensors"});

  const RetainingLayerData d = MakeData(3);
  const int64_t in = 3 * kHeadDim;
  std::vector<uint16_t> label16(d.label.size(), 0);
  std::vector<int32_t> seg_short(kRows - 1, 0);
  struct Case {
    const char* what;
    std::vector<std::pair<std::string, RawTensor>> tensors;
    std::vector<std::string> needles;
  };
  const RawTensor x{"F16", {kRows, kHeads, in}, d.x.data(), d.x.size() * 2};
  const RawTensor label{"F32", {kRows, kHeads}, d.label.data(), d.label.size() * 4};
  const RawTensor segment{"I32", {kRows}, d.segment.data(), d.segment.size() * 4};
  const Case cases[] = {
      {"label stored as F16",
       {{"x", x},
        {"label", {"F16", {kRows, kHeads}, label16.data(), label16.size() * 2}},
        {"segment", segment}},
       {"'label'", "dtype F32", "F16"}},
      {"x with the heads and rows swapped",
       {{"x", {"F16", {kHeads, kRows, in}, d.x.data(), d.x.size() * 2}},
        {"label", label},
        {"segment", segment}},
       {"'x'", "shape"}},
      {"segment one row short",
       {{"x", x},
        {"label", label},
        {"segment", {"I32", {kRows - 1}, seg_short.data(), seg_short.size() * 4}}},
       {"'segment'", "shape"}},
      {"segment as F32",
       {{"x", x},
        {"label", label},
        {"segment", {"F32", {kRows}, d.segment.data(), d.segment.size() * 4}}},
       {"'segment'", "dtype I32"}},
      {"no label", {{"x", x}, {"segment", segment}}, {"'label'", "missing"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ASSERT_TRUE(WriteRawSafetensors(path, c.tensors).ok());
    std::vector<std::string> needles = c.needles;
    needles.push_back("layer_0.safetensors");
    ExpectError(ReadRetainingLayerData(dir.path(), *meta, 0), StatusCode::kInvalidArgument,
                needles);
  }

  // Non-finite values, named with their row and head.
  RetainingLayerData bad = d;
  bad.label[7 * kHeads + 2] = std::numeric_limits<float>::quiet_NaN();
  ASSERT_TRUE(WriteRetainingLayerData(dir.path(), 0, bad).ok());
  ExpectError(ReadRetainingLayerData(dir.path(), *meta, 0), StatusCode::kInvalidArgument,
              {"layer_0.safetensors", "'label'", "non-finite", "row 7", "head 2"});
  bad = d;
  bad.x[(5 * kHeads + 3) * in + 4] = FloatToHalf(std::numeric_limits<float>::infinity());
  ASSERT_TRUE(WriteRetainingLayerData(dir.path(), 0, bad).ok());
  ExpectError(ReadRetainingLayerData(dir.path(), *meta, 0), StatusCode::kInvalidArgument,
              {"'x'", "non-finite", "row 5", "head 3"});

  // Every truncation of a good file is an error, never a crash or a short read.
  ASSERT_TRUE(WriteRetainingLayerData(dir.path(), 0, d).ok());
  std::string bytes;
  {
    std::ifstream f(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(f), {});
  }
  for (size_t len = 0; len < bytes.size(); len += (len < 300 ? 1 : 97)) {
    test_util::WriteBytes(path, bytes.substr(0, len));
    auto r = ReadRetainingLayerData(dir.path(), *meta, 0);
    ASSERT_FALSE(r.ok()) << len;
    EXPECT_NE(r.status().message().find("layer_0.safetensors"), std::string::npos)
        << r.status().ToString();
  }
  test_util::WriteBytes(path, bytes.substr(0, bytes.size() - 1));
  ExpectError(ReadRetainingLayerData(dir.path(), *meta, 0), StatusCode::kInvalidArgument,
              {"'segment'", "truncated"});

  // The writer refuses inconsistent sizes rather than writing a file nobody can read.
  bad = d;
  bad.label.pop_back();
  Status s = WriteRetainingLayerData(dir.path(), 1, bad);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("layer_1.safetensors"), std::string::npos) << s.ToString();
}

RetainingHeads RandomHeads(uint64_t seed, int32_t hidden = kHidden) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n;
  RetainingHeads r;
  r.layers = kLayers;
  r.heads = kHeads;
  r.head_dim = kHeadDim;
  r.hidden = hidden;
  auto fill = [&](int64_t count) {
    std::vector<float> v(count);
    for (float& x : v) x = n(rng);
    return v;
  };
  for (int32_t l = 0; l < kLayers; ++l) {
    r.w1.push_back(fill(int64_t{kHeads} * hidden * 3 * kHeadDim));
    r.b1.push_back(fill(int64_t{kHeads} * hidden));
    r.w2.push_back(fill(int64_t{kHeads} * hidden));
    r.b2.push_back(fill(kHeads));
  }
  return r;
}

std::vector<float> Rounded(const std::vector<float>& v) {
  std::vector<float> out;
  for (float x : v) out.push_back(HalfToFloat(FloatToHalf(x)));
  return out;
}

TEST(RetainingHeads, RoundTripsAsF16) {
  test_util::TempDir dir;
  const std::string path = dir.File("retaining.safetensors");
  const RetainingHeads r = RandomHeads(4);
  ASSERT_TRUE(SaveRetainingHeads(path, r, {{"label", "max logit"}, {"epochs", 3}}).ok());
  EXPECT_EQ(RetainingMetaPathFor(path), dir.File("retaining.json"));
  auto got = LoadRetainingHeads(path, kLayers, kHeads, kHeadDim);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->layers, kLayers);
  EXPECT_EQ(got->heads, kHeads);
  EXPECT_EQ(got->head_dim, kHeadDim);
  EXPECT_EQ(got->hidden, kHidden);
  EXPECT_EQ(got->first_head, 0);
  for (int32_t l = 0; l < kLayers; ++l) {
    EXPECT_EQ(got->w1[l], Rounded(r.w1[l]));
    EXPECT_EQ(got->b1[l], Rounded(r.b1[l]));
    EXPECT_EQ(got->w2[l], Rounded(r.w2[l]));
    EXPECT_EQ(got->b2[l], Rounded(r.b2[l]));
  }
  json j = json::parse(got->json);
  EXPECT_EQ(j["format"], kRetainingHeadsFormat);
  EXPECT_EQ(j["activation"], "relu");
  EXPECT_EQ(j["input"], "[q, k, v] of the head, q unscaled");
  EXPECT_EQ(j["label"], "max logit");
  EXPECT_EQ(j["training"]["epochs"], 3);
  EXPECT_FALSE(j["training"].contains("label"));
  // The tensors are f16 on disk, with the documented names and shapes.
  auto ckpt = Checkpoint::OpenFile(path);
  ASSERT_TRUE(ckpt.ok());
  const TensorInfo* w1 = (*ckpt)->Find("layers.1.w1");
  ASSERT_NE(w1, nullptr);
  EXPECT_EQ(w1->dtype, DType::kF16);
  EXPECT_EQ(w1->shape, (Shape{kHeads, kHidden, 3 * kHeadDim}));
  EXPECT_EQ((*ckpt)->Find("layers.0.b2")->shape, (Shape{kHeads}));
  EXPECT_EQ((*ckpt)->names().size(), size_t{4 * kLayers});
}

TEST(RetainingHeads, ARankLoadsItsHeads) {
  test_util::TempDir dir;
  const std::string path = dir.File("r.safetensors");
  ASSERT_TRUE(SaveRetainingHeads(path, RandomHeads(5), json::object()).ok());
  auto all = LoadRetainingHeads(path, kLayers, kHeads, kHeadDim, 0, 1);
  ASSERT_TRUE(all.ok());
  const int64_t in = 3 * kHeadDim;
  for (int world : {2, 4}) {
    for (int rank = 0; rank < world; ++rank) {
      auto part = LoadRetainingHeads(path, kLayers, kHeads, kHeadDim, rank, world);
      ASSERT_TRUE(part.ok()) << part.status().ToString();
      const int32_t local = kHeads / world, first = rank * local;
      EXPECT_EQ(part->heads, local);
      EXPECT_EQ(part->first_head, first);
      for (int32_t l = 0; l < kLayers; ++l) {
        auto slice = [&](const std::vector<float>& v, int64_t per_head) {
          return std::vector<float>(v.begin() + first * per_head,
                                    v.begin() + (first + local) * per_head);
        };
        EXPECT_EQ(part->w1[l], slice(all->w1[l], kHidden * in));
        EXPECT_EQ(part->b1[l], slice(all->b1[l], kHidden));
        EXPECT_EQ(part->w2[l], slice(all->w2[l], kHidden));
        EXPECT_EQ(part->b2[l], slice(all->b2[l], 1));
        // The same scores as one process.
        std::vector<float> x(in, 0.5f);
        for (int32_t h = 0; h < local; ++h) {
          EXPECT_EQ(RetainingScore(*part, l, h, x.data()),
                    RetainingScore(*all, l, first + h, x.data()));
        }
      }
    }
  }
  ExpectError(LoadRetainingHeads(path, kLayers, kHeads, kHeadDim, 0, 3),
              StatusCode::kInvalidArgument, {"world size 3", "4 heads"});
  ExpectError(LoadRetainingHeads(path, kLayers, kHeads, kHeadDim, 2, 2),
              StatusCode::kInvalidArgument, {"rank 2"});
}

TEST(RetainingHeads, RejectsAnotherModel) {
  test_util::TempDir dir;
  const std::string path = dir.File("r.safetensors");
  ASSERT_TRUE(SaveRetainingHeads(path, RandomHeads(6), json::object()).ok());
  ExpectError(LoadRetainingHeads(path, kLayers + 1, kHeads, kHeadDim),
              StatusCode::kFailedPrecondition, {"r.json", "'layers' 2", "model's 3"});
  ExpectError(LoadRetainingHeads(path, kLayers, 8, kHeadDim), StatusCode::kFailedPrecondition,
              {"'heads' 4", "model's 8"});
  ExpectError(LoadRetainingHeads(path, kLayers, kHeads, 64), StatusCode::kFailedPrecondition,
              {"'head_dim' 3", "model's 64"});
}

// Rewrites r.json with `edit` applied.
void EditJson(const std::string& json_path, const std::function<void(json&)>& edit) {
  std::ifstream in(json_path);
  json j = json::parse(in);
  edit(j);
  std::ofstream(json_path, std::ios::trunc) << j.dump();
}

TEST(RetainingHeads, RejectsMalformedFiles) {
  test_util::TempDir dir;
  const std::string path = dir.File("r.safetensors"), json_path = dir.File("r.json");
  const RetainingHeads good = RandomHeads(7);
  auto reset = [&] { ASSERT_TRUE(SaveRetainingHeads(path, good, json::object()).ok()); };
  auto load = [&] { return LoadRetainingHeads(path, kLayers, kHeads, kHeadDim); };

  reset();
  std::filesystem::remove(json_path);
  ExpectError(load(), StatusCode::kNotFound, {"r.json"});
  reset();
  EditJson(json_path, [](json& j) { j["format"] = "deja-predictors-v1"; });
  ExpectError(load(), StatusCode::kInvalidArgument, {"r.json", "'format'"});
  reset();
  EditJson(json_path, [](json& j) { j["activation"] = "gelu"; });
  ExpectError(load(), StatusCode::kInvalidArgument, {"r.json", "'activation'"});
  reset();
  EditJson(json_path, [](json& j) { j.erase("hidden"); });
  ExpectError(load(), StatusCode::kInvalidArgument, {"r.json", "'hidden'"});
  reset();
  // The JSON says hidden 6 but the tensors have 5.
  EditJson(json_path, [](json& j) { j["hidden"] = 6; });
  ExpectError(load(), StatusCode::kInvalidArgument, {"r.safetensors", "'layers.0.w1'", "shape"});
  reset();
  test_util::WriteBytes(json_path, "[1, 2");
  ExpectError(load(), StatusCode::kInvalidArgument, {"r.json", "not a JSON object"});

  // Tensor problems: build the tensor list by hand.
  const int64_t in = 3 * kHeadDim;
  auto write = [&](const std::function<void(std::vector<std::pair<std::string, Tensor>>&)>& edit) {
    reset();
    std::vector<std::pair<std::string, Tensor>> ts;
    for (int32_t l = 0; l < kLayers; ++l) {
      const std::string p = "layers." + std::to_string(l) + ".";
      const std::pair<std::string, std::pair<const std::vector<float>*, Shape>> parts[] = {
          {"w1", {&good.w1[l], Shape{kHeads, kHidden, in}}},
          {"b1", {&good.b1[l], Shape{kHeads, kHidden}}},
          {"w2", {&good.w2[l], Shape{kHeads, kHidden}}},
          {"b2", {&good.b2[l], Shape{kHeads}}}};
      for (const auto& [name, v] : parts) {
        Tensor t = Tensor::Empty(DType::kF16, v.second);
        for (size_t i = 0; i < v.first->size(); ++i) {
          t.as<uint16_t>()[i] = FloatToHalf((*v.first)[i]);
        }
        ts.emplace_back(p + name, std::move(t));
      }
    }
    edit(ts);
    std::vector<std::pair<std::string, TensorView>> views;
    for (auto& [name, t] : ts) views.emplace_back(name, t.view());
    ASSERT_TRUE(WriteSafetensors(path, views).ok());
  };
  auto find = [](std::vector<std::pair<std::string, Tensor>>& ts, const std::string& name) {
    for (auto& [n, t] : ts) {
      if (n == name) return &t;
    }
    ADD_FAILURE() << name;
    return &ts[0].second;
  };
  write([&](auto& ts) {
    Tensor* t = find(ts, "layers.1.b1");
    t->template as<uint16_t>()[kHidden * 3 + 1] = FloatToHalf(std::nanf(""));
  });
  ExpectError(load(), StatusCode::kInvalidArgument,
              {"r.safetensors", "'layers.1.b1'", "non-finite", "head 3"});
  // A rank whose own heads are finite refuses the file as well.
  ExpectError(LoadRetainingHeads(path, kLayers, kHeads, kHeadDim, 0, 2),
              StatusCode::kInvalidArgument, {"'layers.1.b1'", "non-finite"});
  write([&](auto& ts) {
    *find(ts, "layers.0.w2") = Tensor::Zeros(DType::kF32, Shape{kHeads, kHidden});
  });
  ExpectError(load(), StatusCode::kInvalidArgument, {"'layers.0.w2'", "dtype f32", "F16"});
  write([&](auto& ts) { *find(ts, "layers.0.b2") = Tensor::Zeros(DType::kF16, Shape{kHeads, 1}); });
  ExpectError(load(), StatusCode::kInvalidArgument, {"'layers.0.b2'", "shape"});
  write([&](auto& ts) { ts.pop_back(); });
  ExpectError(load(), StatusCode::kInvalidArgument, {"'layers.1.b2'", "missing"});
  write([&](auto& ts) { ts.emplace_back("layers.2.w1", Tensor::Zeros(DType::kF16, Shape{1})); });
  ExpectError(load(), StatusCode::kInvalidArgument, {"unexpected tensor 'layers.2.w1'"});

  // Truncations of a good file.
  reset();
  std::string bytes;
  {
    std::ifstream f(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(f), {});
  }
  for (size_t len :
       {size_t{0}, size_t{5}, size_t{8}, size_t{100}, bytes.size() / 2, bytes.size() - 1}) {
    test_util::WriteBytes(path, bytes.substr(0, len));
    auto r = load();
    ASSERT_FALSE(r.ok()) << len;
    EXPECT_NE(r.status().message().find("r.safetensors"), std::string::npos)
        << r.status().ToString();
  }

  // Saving refuses what could not be loaded back.
  RetainingHeads big = good;
  big.w2[1][2] = 1e6f;  // beyond the f16 range
  Status s = SaveRetainingHeads(dir.File("big.safetensors"), big, json::object());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("'layers.1.w2'"), std::string::npos) << s.ToString();
  RetainingHeads short_b1 = good;
  short_b1.b1[0].pop_back();
  s = SaveRetainingHeads(dir.File("short.safetensors"), short_b1, json::object());
  EXPECT_NE(s.message().find("'layers.0.b1'"), std::string::npos) << s.ToString();
  RetainingHeads part = good;
  part.first_head = 2;
  EXPECT_FALSE(SaveRetainingHeads(dir.File("part.safetensors"), part, json::object()).ok());
}

// 1 head, head_dim 1 (x = [q, k, v]), hidden 2, weights exactly representable in f16:
//   z = W1 x + b1 = [0.5 - 0.5 - 1 + 1.5, 1 + 2 - 1 - 1] = [0.5, 1]
//   s = w2 . relu(z) + b2 = 2 * 0.5 - 1 * 1 + 0.5 = 0.5
// with x = [-2, 0, -1]: z = [-1 + 0 - 1 + 1.5, -2 + 0 - 1 - 1] = [-0.5, -4], relu 0, s = b2 = 0.5;
// with x = [4, 0, 0]: z = [2 + 1.5, 4 - 1] = [3.5, 3], s = 7 - 3 + 0.5 = 4.5.
TEST(RetainingHeads, ScoreMatchesAHandComputation) {
  RetainingHeads r;
  r.layers = 1;
  r.heads = 1;
  r.head_dim = 1;
  r.hidden = 2;
  r.w1 = {{0.5f, -0.25f, 1.0f, 1.0f, 1.0f, 1.0f}};
  r.b1 = {{1.5f, -1.0f}};
  r.w2 = {{2.0f, -1.0f}};
  r.b2 = {{0.5f}};
  const float x1[] = {1, 2, -1}, x2[] = {-2, 0, -1}, x3[] = {4, 0, 0};
  EXPECT_FLOAT_EQ(RetainingScore(r, 0, 0, x1), 0.5f);
  EXPECT_FLOAT_EQ(RetainingScore(r, 0, 0, x2), 0.5f);
  EXPECT_FLOAT_EQ(RetainingScore(r, 0, 0, x3), 4.5f);
  // The same through the file.
  test_util::TempDir dir;
  const std::string path = dir.File("hand.safetensors");
  ASSERT_TRUE(SaveRetainingHeads(path, r, json::object()).ok());
  auto loaded = LoadRetainingHeads(path, 1, 1, 1);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(RetainingScore(*loaded, 0, 0, x1), 0.5f);
  EXPECT_EQ(RetainingScore(*loaded, 0, 0, x3), 4.5f);
}

}  // namespace
}  // namespace deja::predictors
