// Loading onto a device (worker/model/weight_upload.h) on the simulated device: the checkpoint
// streams through the pinned buffer without becoming resident in host memory (file-backed RSS,
// sampled every millisecond, stays near the largest tensor plus the buffer, far under the
// checkpoint's size), with and without conversion to bf16 on the device; the weights that arrive
// compute what the reference computes; a model that does not fit fails with the bytes needed and
// free; and each tensor-parallel rank of a sharded checkpoint (model.safetensors.index.json, an
// OPT-6.7B-shaped layer) reads exactly its own byte ranges.
#include "worker/model/weight_upload.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/safetensors.h"
#include "kernels/backend.h"
#include "tests/common/sim_device.h"
#include "tests/common/temp_dir.h"
#include "tests/worker/golden_util.h"
#include "worker/model/model.h"
#include "worker/model/opt_weights.h"

namespace deja::worker {
namespace {

// A random pre-LN OPT checkpoint (f32, tied head) of hidden 512, ffn 2048, 8 layers and the
// real vocabulary: 198 MiB, the largest tensor the 98 MiB embedding table.
constexpr int64_t kHidden = 512, kFfn = 2048, kLayers = 8, kVocab = 50272, kPositions = 2048;

int64_t WriteCheckpoint(const std::string& dir) {
  std::ifstream in(test_util::ModelDir("opt-mini") + "/config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  config["hidden_size"] = kHidden;
  config["word_embed_proj_dim"] = kHidden;
  config["ffn_dim"] = kFfn;
  config["num_hidden_layers"] = kLayers;
  config["num_attention_heads"] = 8;
  config["vocab_size"] = kVocab;
  config["max_position_embeddings"] = kPositions;
  config["dtype"] = "float32";
  std::ofstream(dir + "/config.json") << config.dump(2);

  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal(0.f, 0.02f);
  std::vector<std::pair<std::string, Shape>> specs;
  const std::string p = "model.decoder.";
  specs.push_back({p + "embed_tokens.weight", {kVocab, kHidden}});
  specs.push_back({p + "embed_positions.weight", {kPositions + 2, kHidden}});
  specs.push_back({p + "final_layer_norm.weight", {kHidden}});
  specs.push_back({p + "final_layer_norm.bias", {kHidden}});
  for (int64_t l = 0; l < kLayers; ++l) {
    const std::string q = p + "layers." + std::to_string(l) + ".";
    for (const char* name : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
      specs.push_back({q + "self_attn." + name + ".weight", {kHidden, kHidden}});
      specs.push_back({q + "self_attn." + name + ".bias", {kHidden}});
    }
    for (const char* ln : {"self_attn_layer_norm", "final_layer_norm"}) {
      specs.push_back({q + ln + ".weight", {kHidden}});
      specs.push_back({q + ln + ".bias", {kHidden}});
    }
    specs.push_back({q + "fc1.weight", {kFfn, kHidden}});
    specs.push_back({q + "fc1.bias", {kFfn}});
    specs.push_back({q + "fc2.weight", {kHidden, kFfn}});
    specs.push_back({q + "fc2.bias", {kHidden}});
  }
  std::vector<Tensor> data;
  std::vector<std::pair<std::string, TensorView>> tensors;
  int64_t bytes = 0;
  for (const auto& [name, shape] : specs) {
    Tensor t = Tensor::Empty(DType::kF32, shape);
    const bool norm_weight = name.find("layer_norm.weight") != std::string::npos;
    for (int64_t i = 0; i < t.numel(); ++i) {
      t.as<float>()[i] = norm_weight ? 1.f + normal(rng) : normal(rng);
    }
    bytes += static_cast<int64_t>(t.bytes());
    tensors.push_back({name, t.view()});
    data.push_back(std::move(t));
  }
  EXPECT_TRUE(WriteSafetensors(dir + "/model.safetensors", tensors).ok());
  return bytes;
}

// This process's resident file-backed memory (the mapped checkpoint's pages among it), bytes.
int64_t RssFile() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("RssFile:", 0) == 0) return std::stoll(line.substr(8)) * 1024;
  }
  return -1;
}

class WeightUploadTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test_util::TempDir();
    checkpoint_bytes_ = WriteCheckpoint(dir_->path());
  }
  static void TearDownTestSuite() { delete dir_; }

  // Loads on the simulated device while a thread samples RssFile; returns the peak growth.
  StatusOr<std::unique_ptr<model::Model>> LoadWatched(kernels::Backend* backend,
                                                      const model::LoadOptions& options,
                                                      int64_t* peak_growth) {
    // Nothing of the checkpoint resident before: drop the pages the writer left mapped.
    const int64_t base = RssFile();
    std::atomic<bool> done{false};
    std::atomic<int64_t> peak{base};
    std::thread watcher([&] {
      while (!done.load()) {
        peak.store(std::max(peak.load(), RssFile()));
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    });
    auto m = model::LoadModel(dir_->path(), backend, nullptr, options);
    done.store(true);
    watcher.join();
    *peak_growth = std::max<int64_t>(0, peak.load() - base);
    return m;
  }

  static test_util::TempDir* dir_;
  static int64_t checkpoint_bytes_;
};

test_util::TempDir* WeightUploadTest::dir_ = nullptr;
int64_t WeightUploadTest::checkpoint_bytes_ = 0;

TEST_F(WeightUploadTest, StreamsWithoutHoldingTheCheckpointAndComputesAsTheReference) {
  constexpr size_t kStaging = size_t{8} << 20;
  const int64_t largest = kVocab * kHidden * 4;
  std::vector<int32_t> ids = {2, 100, 5000, 31, 7, 42, 50000, 9};
  const int32_t n = static_cast<int32_t>(ids.size());
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "--dtype bf16 (converted on the device)" : "stored f32");
    model::LoadOptions options;
    options.staging_bytes = kStaging;
    options.kv_memory_bytes = 16 << 20;
    if (bf16) options.weight_dtype = DType::kBF16;
    auto sim = test_util::MakeSimDeviceBackend(size_t{1} << 30);
    int64_t growth = 0;
    auto m = LoadWatched(sim.get(), options, &growth);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    // Without streaming the whole file would be resident (198 MiB); with it, about one tensor.
    EXPECT_LT(growth, largest + 2 * static_cast<int64_t>(kStaging) + (16 << 20))
        << "checkpoint " << checkpoint_bytes_;
    EXPECT_LT(growth, checkpoint_bytes_ * 6 / 10);
    std::printf("%s: checkpoint %lld MiB, file-backed RSS grew at most %lld MiB during the load\n",
                bf16 ? "bf16" : "f32", static_cast<long long>(checkpoint_bytes_ >> 20),
                static_cast<long long>(growth >> 20));

    // The reference computes bf16 as every backend must (x rounded to bf16, f32 sums); the CPU
    // backend's prefill-sized GEMMs widen the weights instead.
    auto ref_backend = kernels::MakeReferenceBackend();
    auto want = model::LoadModel(dir_->path(), ref_backend.get(), nullptr, options);
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    model::StepResult a, b;
    auto kva = (*m)->NewSequence(n);
    auto kvb = (*want)->NewSequence(n);
    ASSERT_TRUE(kva.ok() && kvb.ok());
    ASSERT_TRUE((*m)->Forward({{kva->get(), ids.data(), n, true}}, &a).ok());
    ASSERT_TRUE((*want)->Forward({{kvb->get(), ids.data(), n, true}}, &b).ok());
    std::vector<double> ref(b.logits.as<float>(), b.logits.as<float>() + n * kVocab);
    // Same weights; only summation order differs. With bf16 weights that order can flip the
    // rounding of an activation to bf16 (one ulp, 2^-8 relative), which later layers carry: the
    // bound is then the dtype's, as in tests/kernels.
    EXPECT_LE(test_util::RelError(a.logits.as<float>(), ref), bf16 ? 1e-2 : 1e-4);
  }
}

TEST_F(WeightUploadTest, AModelThatDoesNotFitFailsWithTheNumbers) {
  auto sim = test_util::MakeSimDeviceBackend(size_t{64} << 20);
  auto m = model::LoadModel(dir_->path(), sim.get());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(m.status().message().find("the weights need 198 MiB of sim:0 memory, 64 MiB of 64 MiB "
                                      "are free"),
            std::string::npos)
      << m.status().ToString();
}

// A byte range [begin, end) of one checkpoint file.
struct Range {
  std::string file;
  int64_t begin, end;
  bool operator<(const Range& o) const {
    return std::tie(file, begin, end) < std::tie(o.file, o.begin, o.end);
  }
};

// Sorted, with touching or overlapping ranges of a file merged.
std::vector<Range> Merged(std::vector<Range> v) {
  std::sort(v.begin(), v.end());
  std::vector<Range> out;
  for (const Range& r : v) {
    if (!out.empty() && out.back().file == r.file && r.begin <= out.back().end) {
      out.back().end = std::max(out.back().end, r.end);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

int64_t Total(const std::vector<Range>& v) {
  int64_t n = 0;
  for (const Range& r : v) n += r.end - r.begin;
  return n;
}

// One OPT-6.7B-shaped layer (hidden 4096, 32 heads, ffn 16384) with a small vocabulary, f16, in
// two files under model.safetensors.index.json: the embeddings and the attention in the first,
// the MLP and the final LayerNorm in the second (403 MiB). The values do not matter here.
constexpr int64_t kBigHidden = 4096, kBigFfn = 16384, kBigVocab = 1024, kBigPositions = 2048;

void WriteShardedCheckpoint(const std::string& dir) {
  std::ifstream in(test_util::ModelDir("opt-mini") + "/config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  config["hidden_size"] = kBigHidden;
  config["word_embed_proj_dim"] = kBigHidden;
  config["ffn_dim"] = kBigFfn;
  config["num_hidden_layers"] = 1;
  config["num_attention_heads"] = 32;
  config["vocab_size"] = kBigVocab;
  config["max_position_embeddings"] = kBigPositions;
  config["dtype"] = "float16";
  std::ofstream(dir + "/config.json") << config.dump(2);
  const std::string p = "model.decoder.", l = p + "layers.0.";
  const std::vector<std::vector<std::pair<std::string, Shape>>> files = {
      {{p + "embed_tokens.weight", {kBigVocab, kBigHidden}},
       {p + "embed_positions.weight", {kBigPositions + 2, kBigHidden}},
       {l + "self_attn_layer_norm.weight", {kBigHidden}},
       {l + "self_attn_layer_norm.bias", {kBigHidden}},
       {l + "self_attn.q_proj.weight", {kBigHidden, kBigHidden}},
       {l + "self_attn.q_proj.bias", {kBigHidden}},
       {l + "self_attn.k_proj.weight", {kBigHidden, kBigHidden}},
       {l + "self_attn.k_proj.bias", {kBigHidden}},
       {l + "self_attn.v_proj.weight", {kBigHidden, kBigHidden}},
       {l + "self_attn.v_proj.bias", {kBigHidden}},
       {l + "self_attn.out_proj.weight", {kBigHidden, kBigHidden}},
       {l + "self_attn.out_proj.bias", {kBigHidden}}},
      {{l + "final_layer_norm.weight", {kBigHidden}},
       {l + "final_layer_norm.bias", {kBigHidden}},
       {l + "fc1.weight", {kBigFfn, kBigHidden}},
       {l + "fc1.bias", {kBigFfn}},
       {l + "fc2.weight", {kBigHidden, kBigFfn}},
       {l + "fc2.bias", {kBigHidden}},
       {p + "final_layer_norm.weight", {kBigHidden}},
       {p + "final_layer_norm.bias", {kBigHidden}}}};
  nlohmann::json map = nlohmann::json::object();
  for (size_t f = 0; f < files.size(); ++f) {
    const std::string name = "model-0000" + std::to_string(f + 1) + "-of-00002.safetensors";
    std::vector<Tensor> data;
    std::vector<std::pair<std::string, TensorView>> tensors;
    for (const auto& [tensor, shape] : files[f]) {
      Tensor t = Tensor::Empty(DType::kF16, shape);
      std::memset(t.data(), 0, t.bytes());
      tensors.push_back({tensor, t.view()});
      data.push_back(std::move(t));
      map[tensor] = name;
    }
    ASSERT_TRUE(WriteSafetensors(dir + "/" + name, tensors).ok());
  }
  std::ofstream(dir + "/model.safetensors.index.json")
      << nlohmann::json{{"metadata", nlohmann::json::object()}, {"weight_map", map}}.dump();
}

// The byte ranges rank `rank` of `world` must read, worked out from the shapes alone: replicated
// tensors whole; q/k/v/fc1 (and their biases) the rank's rows; out_proj and fc2 the rank's
// columns of every row (their biases whole: added once after the all-reduce). The tied lm head is
// rows of the embedding table, which is read whole.
std::vector<Range> ExpectedRanges(const Checkpoint& ckpt, int rank, int world) {
  std::vector<Range> want;
  for (const std::string& name : ckpt.names()) {
    const TensorInfo* t = ckpt.Find(name);
    const auto offset = [&](const TensorInfo* info) {
      // The tensor's offset in its file: its address minus the file's first tensor's.
      const char* first = nullptr;
      for (const std::string& other : ckpt.names()) {
        const TensorInfo* o = ckpt.Find(other);
        if (o->file != info->file) continue;
        const char* d = static_cast<const char*>(o->data);
        if (first == nullptr || d < first) first = d;
      }
      return static_cast<int64_t>(static_cast<const char*>(info->data) - first);
    };
    const int64_t off = offset(t), es = 2;
    const bool column =
        name.find("q_proj") != std::string::npos || name.find("k_proj") != std::string::npos ||
        name.find("v_proj") != std::string::npos || name.find("fc1") != std::string::npos;
    const bool row = (name.find("out_proj.weight") != std::string::npos ||
                      name.find("fc2.weight") != std::string::npos);
    if (column) {
      const int64_t out = t->shape[0], in = t->shape.rank == 2 ? t->shape[1] : 1;
      const int64_t b = rank * out / world, e = (rank + 1) * out / world;
      want.push_back({t->file, off + b * in * es, off + e * in * es});
    } else if (row) {
      const int64_t out = t->shape[0], in = t->shape[1];
      const int64_t b = rank * in / world, e = (rank + 1) * in / world;
      for (int64_t r = 0; r < out; ++r) {
        want.push_back({t->file, off + (r * in + b) * es, off + (r * in + e) * es});
      }
    } else {
      want.push_back({t->file, off, off + static_cast<int64_t>(t->bytes)});
    }
  }
  return Merged(want);
}

TEST(ShardedLoadTest, EachRankReadsOnlyItsByteRanges) {
  test_util::TempDir dir;
  WriteShardedCheckpoint(dir.path());
  auto ckpt = Checkpoint::OpenDir(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  ASSERT_EQ((*ckpt)->files().size(), 2u);
  auto config = LoadOptConfig(dir.path());
  ASSERT_TRUE(config.ok());
  auto names = ResolveOptTensorNames(**ckpt, *config);
  ASSERT_TRUE(names.ok()) << names.status().ToString();
  const int64_t file_bytes = static_cast<int64_t>((*ckpt)->Bytes());
  // Every tensor's address range, to map a read back to (file, offset).
  struct Span {
    const char* begin;
    const char* end;
    const TensorInfo* info;
  };
  std::vector<Span> spans;
  for (const std::string& n : (*ckpt)->names()) {
    const TensorInfo* t = (*ckpt)->Find(n);
    spans.push_back(
        {static_cast<const char*>(t->data), static_cast<const char*>(t->data) + t->bytes, t});
  }
  for (const auto& [world, rank] :
       std::vector<std::pair<int, int>>{{2, 1}, {4, 0}, {4, 3}, {8, 5}}) {
    SCOPED_TRACE("rank " + std::to_string(rank) + " of " + std::to_string(world));
    auto sim = test_util::MakeSimDeviceBackend(size_t{1} << 30);
    model::ShardSpec shard{rank, world};
    shard.copy_columns = false;
    auto w = model::LoadOptWeights(**ckpt, *config, *names, shard);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    std::vector<std::pair<const void*, size_t>> log;
    model::UploadOptions up;
    up.staging_bytes = size_t{8} << 20;
    up.read_log = &log;
    ASSERT_TRUE(model::UploadWeights(&*w, **ckpt, *sim, up, nullptr).ok());
    std::vector<Range> got;
    for (const auto& [addr, len] : log) {
      const char* a = static_cast<const char*>(addr);
      auto it = std::find_if(spans.begin(), spans.end(),
                             [&](const Span& s) { return a >= s.begin && a + len <= s.end; });
      ASSERT_NE(it, spans.end()) << "a read of " << len << " bytes outside every tensor";
      const char* first = nullptr;
      for (const Span& s : spans) {
        if (s.info->file == it->info->file && (first == nullptr || s.begin < first))
          first = s.begin;
      }
      got.push_back({it->info->file, a - first, a - first + static_cast<int64_t>(len)});
    }
    got = Merged(got);
    const std::vector<Range> want = ExpectedRanges(**ckpt, rank, world);
    EXPECT_EQ(got.size(), want.size());
    for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
      EXPECT_TRUE(got[i].file == want[i].file && got[i].begin == want[i].begin &&
                  got[i].end == want[i].end)
          << "range " << i << ": read [" << got[i].begin << ", " << got[i].end << ") of "
          << got[i].file << ", expected [" << want[i].begin << ", " << want[i].end << ") of "
          << want[i].file;
    }
    std::printf("rank %d of %d read %.1f MiB of the %.1f MiB checkpoint in %zu ranges\n", rank,
                world, Total(got) / 1048576.0, file_bytes / 1048576.0, got.size());
  }
}

}  // namespace
}  // namespace deja::worker
