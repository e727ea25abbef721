// Loading onto a device (worker/model/weight_upload.h) on the simulated device: the checkpoint
// streams through the pinned buffer without becoming resident in host memory (file-backed RSS,
// sampled every millisecond, stays near the largest tensor plus the buffer, far under the
// checkpoint's size), with and without conversion to bf16 on the device; the weights that arrive
// compute what the reference computes; a model that does not fit fails with the bytes needed and
// free.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <fstream>
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

}  // namespace
}  // namespace deja::worker
