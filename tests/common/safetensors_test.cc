// safetensors reading and writing: round trips for every dtype, the sharded index form, and one
// test per kind of malformed file, each expecting a Status that names the file and the tensor.
#include "common/safetensors.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/common/temp_dir.h"

namespace deja {
namespace {

using test_util::TempDir;
using test_util::WriteBytes;

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// A safetensors file from a header text and `data_bytes` bytes of data.
std::string RawFile(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + header + std::string(data_bytes, '\x01');
}

Tensor Filled(DType dtype, Shape shape, float start) {
  Tensor t = Tensor::Empty(dtype, shape);
  for (int64_t i = 0; i < t.numel(); ++i) StoreFromFloat(t.data(), dtype, i, start + 0.5f * i);
  return t;
}

void ExpectSameData(const TensorView& got, const Tensor& want) {
  ASSERT_EQ(got.dtype, want.dtype());
  ASSERT_EQ(got.shape, want.shape());
  EXPECT_EQ(std::memcmp(got.data, want.data(), want.bytes()), 0);
}

TEST(SafetensorsTest, RoundTripAllDTypes) {
  TempDir dir;
  const Tensor f32 = Filled(DType::kF32, {2, 3}, 1.0f);
  const Tensor f16 = Filled(DType::kF16, {5}, -2.0f);
  const Tensor bf16 = Filled(DType::kBF16, {2, 2, 3}, 3.0f);
  const Tensor scalar = Filled(DType::kF32, Shape{}, 7.0f);
  const Tensor empty = Tensor::Empty(DType::kF16, {0, 4});
  ASSERT_TRUE(WriteSafetensors(dir.File("model.safetensors"),
                               {{"w.f32", f32.view()},
                                {"w.f16", f16.view()},
                                {"w.bf16", bf16.view()},
                                {"scalar", scalar.view()},
                                {"empty", empty.view()}},
                               {{"format", "pt"}})
                  .ok());
  StatusOr<std::unique_ptr<Checkpoint>> ckpt = OpenCheckpoint(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  const Checkpoint& c = **ckpt;
  EXPECT_EQ(c.names(), (std::vector<std::string>{"empty", "scalar", "w.bf16", "w.f16", "w.f32"}));
  EXPECT_EQ(c.metadata().at("format"), "pt");
  EXPECT_EQ(c.Bytes(), f32.bytes() + f16.bytes() + bf16.bytes() + scalar.bytes());
  EXPECT_EQ(c.files(), std::vector<std::string>{dir.File("model.safetensors")});

  StatusOr<TensorView> v = c.Get("w.f32", {2, 3});
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  ExpectSameData(*v, f32);
  // The writer pads the header so f32 data is aligned.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v->data) % 4, 0u);
  ExpectSameData(c.Get("w.f16", {5}).value(), f16);
  ExpectSameData(c.Get("w.bf16", {2, 2, 3}).value(), bf16);
  ExpectSameData(c.Get("scalar", Shape{}).value(), scalar);
  EXPECT_EQ(c.Get("empty", {0, 4}).value().numel(), 0);
  EXPECT_EQ(LoadAsFloat(c.Find("w.bf16")->data, DType::kBF16, 3), 4.5f);
  EXPECT_EQ(Checkpoint::Prefetch(*v), f32.bytes());
  EXPECT_EQ(Checkpoint::Prefetch(c.Get("w.bf16", {2, 2, 3}).value().RowSlice(1, 3)), 12u);
}

TEST(SafetensorsTest, GetReportsShapeMismatchAndMissingTensor) {
  TempDir dir;
  const Tensor t = Filled(DType::kF16, {4, 8}, 0.0f);
  ASSERT_TRUE(WriteSafetensors(dir.File("model.safetensors"), {{"layer.w", t.view()}}).ok());
  auto c = std::move(OpenCheckpoint(dir.path())).value();
  StatusOr<TensorView> bad = c->Get("layer.w", {8, 4});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(bad.status().message(), "layer.w"));
  EXPECT_TRUE(Contains(bad.status().message(), "[4, 8]"));
  EXPECT_TRUE(Contains(bad.status().message(), "[8, 4]"));
  StatusOr<TensorView> missing = c->Get("nope", {1});
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(missing.status().message(), "nope"));
  EXPECT_EQ(c->Find("nope"), nullptr);
}

TEST(SafetensorsTest, ShardedIndexWithTwoShards) {
  TempDir dir;
  const Tensor a = Filled(DType::kF16, {3, 2}, 1.0f);
  const Tensor b = Filled(DType::kBF16, {4}, 2.0f);
  const Tensor c = Filled(DType::kF32, {2, 2}, 3.0f);
  ASSERT_TRUE(WriteSafetensors(dir.File("model-00001-of-00002.safetensors"),
                               {{"a", a.view()}, {"b", b.view()}})
                  .ok());
  ASSERT_TRUE(
      WriteSafetensors(dir.File("model-00002-of-00002.safetensors"), {{"c", c.view()}}).ok());
  WriteBytes(dir.File("model.safetensors.index.json"),
             R"({"metadata": {"total_size": 52}, "weight_map": {
                   "a": "model-00001-of-00002.safetensors",
                   "b": "model-00001-of-00002.safetensors",
                   "c": "model-00002-of-00002.safetensors"}})");
  StatusOr<std::unique_ptr<Checkpoint>> ckpt = OpenCheckpoint(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_EQ((*ckpt)->names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ((*ckpt)->files().size(), 2u);
  EXPECT_EQ((*ckpt)->Bytes(), a.bytes() + b.bytes() + c.bytes());
  ExpectSameData((*ckpt)->Get("a", {3, 2}).value(), a);
  ExpectSameData((*ckpt)->Get("b", {4}).value(), b);
  ExpectSameData((*ckpt)->Get("c", {2, 2}).value(), c);
  EXPECT_EQ((*ckpt)->Find("c")->file, dir.File("model-00002-of-00002.safetensors"));
}

TEST(SafetensorsTest, SingleFileWinsOverIndex) {
  TempDir dir;
  const Tensor a = Filled(DType::kF32, {1}, 1.0f);
  ASSERT_TRUE(WriteSafetensors(dir.File("model.safetensors"), {{"a", a.view()}}).ok());
  WriteBytes(dir.File("model.safetensors.index.json"), "not json");
  EXPECT_TRUE(OpenCheckpoint(dir.path()).ok());
}

TEST(SafetensorsTest, MissingCheckpointIsNotFound) {
  TempDir dir;
  StatusOr<std::unique_ptr<Checkpoint>> none = OpenCheckpoint(dir.path());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(none.status().message(), "model.safetensors"));
  EXPECT_EQ(OpenCheckpoint(dir.File("absent")).status().code(), StatusCode::kNotFound);
}

TEST(SafetensorsTest, WriterRejectsDuplicatesAndUnsupportedDTypes) {
  TempDir dir;
  const Tensor f = Filled(DType::kF32, {2}, 0.0f);
  const Tensor i = Tensor::Zeros(DType::kI32, {2});
  EXPECT_EQ(WriteSafetensors(dir.File("x"), {{"a", f.view()}, {"a", f.view()}}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteSafetensors(dir.File("x"), {{"i", i.view()}}).code(),
            StatusCode::kInvalidArgument);
}

// A file whose header is `header` followed by `data_bytes` bytes; opening must fail with `code`
// and a message naming the file and `mentions`.
struct Malformed {
  const char* test_name;
  std::string header;
  size_t data_bytes;
  StatusCode code;
  std::string mentions;
};

class MalformedTest : public ::testing::TestWithParam<Malformed> {};

TEST_P(MalformedTest, FailsWithClearStatus) {
  const Malformed& m = GetParam();
  TempDir dir;
  WriteBytes(dir.File("model.safetensors"), RawFile(m.header, m.data_bytes));
  StatusOr<std::unique_ptr<Checkpoint>> ckpt = OpenCheckpoint(dir.path());
  ASSERT_FALSE(ckpt.ok());
  EXPECT_EQ(ckpt.status().code(), m.code) << ckpt.status().ToString();
  EXPECT_TRUE(Contains(ckpt.status().message(), "model.safetensors")) << ckpt.status().ToString();
  EXPECT_TRUE(Contains(ckpt.status().message(), m.mentions)) << ckpt.status().ToString();
}

const StatusCode kDataLoss = StatusCode::kDataLoss;
const StatusCode kInvalid = StatusCode::kInvalidArgument;

INSTANTIATE_TEST_SUITE_P(
    Headers, MalformedTest,
    ::testing::Values(
        Malformed{"TruncatedJson", R"({"w": {"dtype": "F32", "shape": [1], "data_o)", 4, kDataLoss,
                  "JSON"},
        Malformed{"BadJson", R"({"w": nonsense})", 4, kDataLoss, "JSON"},
        Malformed{"HeaderNotObject", R"([1, 2, 3])", 0, kDataLoss, "not a JSON object"},
        Malformed{"MissingDtype", R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", 4, kDataLoss,
                  "'w'"},
        Malformed{"MissingShape", R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})", 4,
                  kDataLoss, "'w'"},
        Malformed{"MissingOffsets", R"({"w": {"dtype": "F32", "shape": [1]}})", 4, kDataLoss,
                  "'w'"},
        Malformed{"EntryNotObject", R"({"w": 3})", 0, kDataLoss, "'w'"},
        Malformed{"NegativeDim",
                  R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4, kDataLoss,
                  "'w'"},
        Malformed{"OffsetsOutOfRange",
                  R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 4, kDataLoss,
                  "'w'"},
        Malformed{"EndBeforeBegin",
                  R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", 8, kDataLoss,
                  "'w'"},
        Malformed{"ByteSizeMismatch",
                  R"({"w": {"dtype": "F16", "shape": [3], "data_offsets": [0, 8]}})", 8, kDataLoss,
                  "'w'"},
        Malformed{"ShapeOverflows",
                  R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296],
                     "data_offsets": [0, 0]}})",
                  0, kDataLoss, "'w'"},
        Malformed{"Overlapping",
                  R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                      "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                  12, kDataLoss, "'b'"},
        Malformed{"DuplicateName",
                  R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                      "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                  8, kDataLoss, "duplicate tensor 'w'"},
        Malformed{"UnsupportedDType",
                  R"({"ids": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})", 8, kInvalid,
                  "'ids' has dtype 'I64'"},
        Malformed{"RankAboveFour",
                  R"({"w": {"dtype": "F32", "shape": [1,1,1,1,1], "data_offsets": [0, 4]}})", 4,
                  kInvalid, "'w'"},
        Malformed{"MetadataNotStrings", R"({"__metadata__": {"n": 3}})", 0, kDataLoss,
                  "__metadata__"}),
    [](const ::testing::TestParamInfo<Malformed>& info) { return info.param.test_name; });

TEST(SafetensorsTest, MetadataIsAllowed) {
  TempDir dir;
  WriteBytes(dir.File("model.safetensors"), RawFile(R"({"__metadata__": {"format": "pt"},
                         "w": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}})",
                                                    4));
  StatusOr<std::unique_ptr<Checkpoint>> ckpt = OpenCheckpoint(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_EQ((*ckpt)->names(), std::vector<std::string>{"w"});
}

TEST(SafetensorsTest, FileSmallerThanLengthPrefix) {
  TempDir dir;
  WriteBytes(dir.File("model.safetensors"), "abc");
  StatusOr<std::unique_ptr<Checkpoint>> ckpt = OpenCheckpoint(dir.path());
  EXPECT_EQ(ckpt.status().code(), StatusCode::kDataLoss);
  WriteBytes(dir.File("model.safetensors"), "");
  EXPECT_EQ(OpenCheckpoint(dir.path()).status().code(), StatusCode::kDataLoss);
}

TEST(SafetensorsTest, HeaderLengthLargerThanFile) {
  TempDir dir;
  std::string bytes = RawFile(R"({})", 0);
  bytes[0] = '\x40';  // claims a 64-byte header; the file has 2
  WriteBytes(dir.File("model.safetensors"), bytes);
  StatusOr<std::unique_ptr<Checkpoint>> ckpt = OpenCheckpoint(dir.path());
  ASSERT_EQ(ckpt.status().code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(ckpt.status().message(), "model.safetensors"));
  EXPECT_TRUE(Contains(ckpt.status().message(), "larger than the file"));
  bytes[7] = '\x7f';  // a huge length must not overflow the comparison
  WriteBytes(dir.File("model.safetensors"), bytes);
  EXPECT_EQ(OpenCheckpoint(dir.path()).status().code(), StatusCode::kDataLoss);
}

// Every truncation and every single-byte corruption of a valid file must yield a Status (or, for
// harmless corruptions, a checkpoint), never a crash.
TEST(SafetensorsTest, TruncationsAndCorruptionsNeverCrash) {
  TempDir dir;
  const Tensor a = Filled(DType::kF16, {3, 5}, 1.0f);
  const Tensor b = Filled(DType::kF32, {4}, 2.0f);
  const std::string good = dir.File("good.safetensors");
  ASSERT_TRUE(WriteSafetensors(good, {{"a", a.view()}, {"b", b.view()}}).ok());
  std::string bytes;
  {
    MappedFile f = std::move(MappedFile::Open(good)).value();
    bytes.assign(reinterpret_cast<const char*>(f.data()), f.size());
  }
  const std::string path = dir.File("bad.safetensors");
  for (size_t len = 0; len < bytes.size(); ++len) {
    WriteBytes(path, bytes.substr(0, len));
    EXPECT_FALSE(Checkpoint::OpenFile(path).ok()) << "truncated to " << len;
  }
  for (size_t i = 0; i < bytes.size() - a.bytes() - b.bytes(); ++i) {
    for (char c : {'\0', '"', '}', '9', '\xff'}) {
      std::string corrupt = bytes;
      corrupt[i] = c;
      WriteBytes(path, corrupt);
      StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::OpenFile(path);
      if (!ckpt.ok()) continue;
      // Reading every byte of every accepted tensor faults (or trips ASan) if a view escaped
      // the mapping.
      for (const std::string& name : (*ckpt)->names()) {
        const TensorInfo* info = (*ckpt)->Find(name);
        std::vector<char> copy(info->bytes);
        if (info->bytes > 0) std::memcpy(copy.data(), info->data, info->bytes);
        EXPECT_EQ(Checkpoint::Prefetch(info->view()), info->bytes);
      }
    }
  }
}

// Sharded form: writes two valid shards holding "a" and "b", then `index` as the index.
class ShardedErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const Tensor a = Filled(DType::kF16, {2}, 1.0f);
    const Tensor b = Filled(DType::kF16, {2}, 2.0f);
    ASSERT_TRUE(WriteSafetensors(dir_.File("s1.safetensors"), {{"a", a.view()}}).ok());
    ASSERT_TRUE(WriteSafetensors(dir_.File("s2.safetensors"), {{"b", b.view()}}).ok());
  }
  Status OpenWithIndex(const std::string& index) {
    WriteBytes(dir_.File("model.safetensors.index.json"), index);
    return OpenCheckpoint(dir_.path()).status();
  }
  TempDir dir_;
};

TEST_F(ShardedErrorTest, MissingShardFile) {
  Status s = OpenWithIndex(R"({"weight_map": {"a": "s1.safetensors", "b": "s3.safetensors"}})");
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(s.message(), "s3.safetensors"));
  EXPECT_TRUE(Contains(s.message(), "'b'"));
}

TEST_F(ShardedErrorTest, TensorAbsentFromItsShard) {
  Status s = OpenWithIndex(
      R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors", "c": "s2.safetensors"}})");
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(s.message(), "'c'"));
  EXPECT_TRUE(Contains(s.message(), "s2.safetensors"));
  Status wrong = OpenWithIndex(R"({"weight_map": {"a": "s2.safetensors", "b": "s1.safetensors"}})");
  EXPECT_EQ(wrong.code(), StatusCode::kNotFound);
}

TEST_F(ShardedErrorTest, DuplicateAcrossShards) {
  const Tensor a = Filled(DType::kF16, {2}, 5.0f);
  ASSERT_TRUE(
      WriteSafetensors(dir_.File("s2.safetensors"), {{"a", a.view()}, {"b", a.view()}}).ok());
  Status s = OpenWithIndex(R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(s.message(), "duplicate tensor 'a'"));
  EXPECT_TRUE(Contains(s.message(), "s1.safetensors"));
  EXPECT_TRUE(Contains(s.message(), "s2.safetensors"));
}

TEST_F(ShardedErrorTest, MalformedIndex) {
  EXPECT_EQ(OpenWithIndex(R"({"weight_map": )").code(), StatusCode::kDataLoss);
  EXPECT_EQ(OpenWithIndex(R"({"metadata": {}})").code(), StatusCode::kDataLoss);
  EXPECT_EQ(OpenWithIndex(R"({"weight_map": {"a": 1}})").code(), StatusCode::kDataLoss);
  EXPECT_EQ(OpenWithIndex("").code(), StatusCode::kDataLoss);
  Status escape = OpenWithIndex(R"({"weight_map": {"a": "../s1.safetensors"}})");
  EXPECT_EQ(escape.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(escape.message(), "'a'"));
}

TEST_F(ShardedErrorTest, ShardContentErrorNamesShard) {
  WriteBytes(dir_.File("s2.safetensors"), RawFile(R"({"b": {"dtype": "F16"}})", 0));
  Status s = OpenWithIndex(R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})");
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(s.message(), "s2.safetensors"));
  EXPECT_TRUE(Contains(s.message(), "'b'"));
}

}  // namespace
}  // namespace deja
