// Weight-only int8 models (`--dtype int8`, `deja quantize`) on the trained fixture opt-mini:
// perplexity on both held-out files within 1% of the checkpoint's f16, greedy agreement with f16
// of at least 0.9 over 32 tokens (weight-only, and with the activations quantized on CPUs with
// AVX512-VNNI), half the weight bytes; a token's logits independent of its step's other rows
// and of its prompt's split; a quantized checkpoint loads to the same logits as quantizing at
// load; Deja Vu and H2O run on int8 weights; malformed int8 checkpoints
// are refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "common/tokenizer.h"
#include "kernels/backend.h"
#include "kernels/cpu/i8_vnni.h"
#include "tests/common/sim_device.h"
#include "tests/common/temp_dir.h"
#include "tests/worker/checkpoint_edit.h"
#include "tests/worker/golden_util.h"
#include "tests/worker/heldout_util.h"
#include "worker/model/generation.h"
#include "worker/model/model.h"
#include "worker/model/quantize_checkpoint.h"

namespace deja::worker {
namespace {

namespace fs = std::filesystem;
using test_util::Greedy;
using test_util::GreedyAgreement;
using test_util::HeldOut;
using test_util::ModelDir;
using test_util::PrefillLogits;
using test_util::TempDir;

std::unique_ptr<model::Model> Load(kernels::Backend* be, const std::string& dir,
                                   std::optional<DType> dtype) {
  model::LoadOptions o;
  o.weight_dtype = dtype;
  auto m = model::LoadModel(dir, be, nullptr, o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(*m) : nullptr;
}


// The CPU's weight-only int8 path while in scope: activations meet the weights as bf16, as on a
// device (with AVX512-VNNI the CPU otherwise quantizes them too).
struct WeightOnlyInt8 {
  WeightOnlyInt8() { kernels::cpu::SetVnniEnabled(false); }
  ~WeightOnlyInt8() { kernels::cpu::SetVnniEnabled(kernels::cpu::VnniAvailable()); }
};

class Int8ModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = kernels::MakeCpuBackend(2);
    int8_ = Load(backend_.get(), ModelDir("opt-mini"), DType::kI8);
    f16_ = Load(backend_.get(), ModelDir("opt-mini"), std::nullopt);
    ASSERT_TRUE(int8_ && f16_);
  }
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<model::Model> int8_, f16_;
};

TEST_F(Int8ModelTest, HalfTheWeightBytes) {
  EXPECT_EQ(int8_->weight_dtype(), DType::kI8);
  EXPECT_EQ(f16_->weight_dtype(), DType::kF16);
  const double ratio = static_cast<double>(int8_->weight_bytes()) / f16_->weight_bytes();
  // One byte per weight plus 4 per row of scales; biases and LayerNorms keep their f16.
  EXPECT_LT(ratio, 0.56);
  EXPECT_GT(ratio, 0.5);
}

// The target: within 1% of f16 (measured on the full files: kjv +0.01%, tinyshakespeare -0.12%).
TEST_F(Int8ModelTest, PerplexityWithinOnePercentOfF16) {
  for (const char* file : {"kjv.txt", "tinyshakespeare.txt"}) {
    const std::vector<int32_t> ids = HeldOut(file, 8192);
    auto want = model::Perplexity(*f16_, ids, 512);
    auto got = model::Perplexity(*int8_, ids, 512);
    ASSERT_TRUE(want.ok() && got.ok());
    const double rel = std::abs(got->perplexity - want->perplexity) / want->perplexity;
    std::printf("%s: f16 %.4f int8 %.4f (%+.3f%%)\n", file, want->perplexity, got->perplexity,
                100.0 * (got->perplexity - want->perplexity) / want->perplexity);
    EXPECT_LE(rel, 0.01) << file;
    EXPECT_GT(rel, 0.0) << file << ": int8 should not reproduce f16 exactly";
  }
}


TEST_F(Int8ModelTest, GreedyAgreementWithF16) {
  // Weight-only int8 (the prompts' prefill too, with bf16 activations): 8 prompts.
  const std::vector<int32_t> text = HeldOut("tinyshakespeare.txt", 4096);
  const double agreement = [&] {
    WeightOnlyInt8 weight_only;
    return GreedyAgreement(*f16_, *int8_, text, 8, 400);
  }();
  std::printf("greedy agreement int8 vs f16 over 8 x 32 tokens: %.3f\n", agreement);
  EXPECT_GE(agreement, 0.9);
}

TEST_F(Int8ModelTest, GreedyAgreementWithF16QuantizedActivations) {
  // With AVX512-VNNI every step quantizes the activations per token too, prefill and decode
  // (kernels/cpu/i8_vnni.h); elsewhere this repeats the weight-only check. Over 32 prompts: an
  // early divergence at a near-tie costs a whole prompt; over these 32, 0.918 with every step
  // quantized (2026-12-02; 0.947 with only prompts of 17+ tokens quantized, 0.971 weight-only).
  const std::vector<int32_t> text = HeldOut("tinyshakespeare.txt", 4096);
  const double agreement = GreedyAgreement(*f16_, *int8_, text, 32, 120);
  std::printf("greedy agreement int8 (%s) vs f16 over 32 x 32 tokens: %.3f\n",
              kernels::cpu::VnniEnabled() ? "quantized activations" : "weight-only", agreement);
  EXPECT_GE(agreement, 0.9);
}

// A sequence's logits do not depend on what runs beside it or on where its prompt was split:
// how a Linear over int8 weights meets its activations (quantized per token on CPUs with
// AVX512-VNNI, bf16 elsewhere) must not depend on the step's row count. The prompt alone in one
// step, then three decode steps alone; against the same prompt in chunks of 8, 8 and 25 beside
// another sequence's 20-token chunk (steps of 8, 28 and 25 rows), then the decode steps beside
// a decode row, a 30-token prefill chunk (31 rows) and nothing.
TEST_F(Int8ModelTest, AnswersDoNotDependOnTheBatchOrThePrefillSplit) {
  const std::vector<int32_t> text = HeldOut("tinyshakespeare.txt", 256);
  std::vector<int32_t> prompt = {2};
  prompt.insert(prompt.end(), text.begin(), text.begin() + 40);
  const std::vector<int32_t> decode = {text[100], text[101], text[102]};
  const int64_t vocab = int8_->config().vocab_size;
  auto row = [&](const model::StepResult& r, int64_t i) {
    return std::vector<double>(r.logits.as<float>() + i * vocab,
                               r.logits.as<float>() + (i + 1) * vocab);
  };
  auto alone = int8_->NewSequence(64);
  ASSERT_TRUE(alone.ok());
  model::StepResult r;
  std::vector<std::vector<double>> want;
  ASSERT_TRUE(int8_->Forward({{alone->get(), prompt.data(), 41}}, &r).ok());
  want.push_back(row(r, 0));
  for (const int32_t& t : decode) {
    ASSERT_TRUE(int8_->Forward({{alone->get(), &t, 1}}, &r).ok());
    want.push_back(row(r, 0));
  }

  auto seq = int8_->NewSequence(64), other = int8_->NewSequence(128);
  ASSERT_TRUE(seq.ok() && other.ok());
  const std::vector<int32_t> other_text(text.begin() + 150, text.begin() + 230);
  const int32_t* o = other_text.data();
  std::vector<std::vector<double>> got;
  ASSERT_TRUE(int8_->Forward({{seq->get(), prompt.data(), 8}}, &r).ok());
  ASSERT_TRUE(int8_->Forward({{seq->get(), prompt.data() + 8, 8}, {other->get(), o, 20}}, &r).ok());
  ASSERT_TRUE(int8_->Forward({{seq->get(), prompt.data() + 16, 25}}, &r).ok());
  got.push_back(row(r, 0));
  ASSERT_TRUE(int8_->Forward({{seq->get(), &decode[0], 1}, {other->get(), o + 20, 1}}, &r).ok());
  got.push_back(row(r, 0));
  ASSERT_TRUE(int8_->Forward({{other->get(), o + 21, 30}, {seq->get(), &decode[1], 1}}, &r).ok());
  got.push_back(row(r, 1));
  ASSERT_TRUE(int8_->Forward({{seq->get(), &decode[2], 1}}, &r).ok());
  got.push_back(row(r, 0));
  for (size_t i = 0; i < want.size(); ++i) {
    std::vector<float> g(got[i].begin(), got[i].end());
    EXPECT_LE(test_util::RelError(g.data(), want[i]), 1e-5) << "logits row " << i;
  }
}

TEST_F(Int8ModelTest, QuantizedCheckpointEqualsQuantizingAtLoad) {
  TempDir tmp;
  const std::string out = tmp.path() + "/int8";
  auto r = model::QuantizeCheckpoint(ModelDir("opt-mini"), out, backend_->pool());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->matrices, 4 * 6 + 1);  // six per layer, the tied embedding once
  EXPECT_LT(r->bytes_out, r->bytes_in * 0.56);
  EXPECT_TRUE(fs::exists(out + "/tokenizer_config.json"));
  EXPECT_TRUE(fs::exists(out + "/predictors.safetensors"));
  // Either dtype request keeps a quantized checkpoint int8; the position embeddings follow the
  // request (f16 under int8, as when quantizing at load).
  auto loaded = Load(backend_.get(), out, DType::kI8);
  ASSERT_TRUE(loaded);
  EXPECT_EQ(loaded->weight_dtype(), DType::kI8);
  EXPECT_EQ(Load(backend_.get(), out, DType::kBF16)->weight_dtype(), DType::kI8);
  const std::vector<int32_t> ids = {2, 100, 200, 300, 400, 500, 600, 700};
  EXPECT_EQ(PrefillLogits(*loaded, ids), PrefillLogits(*int8_, ids));
  // A second run refuses to overwrite, and a quantized checkpoint is not quantized again.
  auto again = model::QuantizeCheckpoint(ModelDir("opt-mini"), out, nullptr);
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);
  auto twice = model::QuantizeCheckpoint(out, tmp.path() + "/twice", nullptr);
  EXPECT_EQ(twice.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(twice.status().message().find("already quantized"), std::string::npos);
}

// A quantized checkpoint on a device (the simulated one, running the reference ops): the int8
// values and their scales are uploaded as they are, and the logits match the CPU's int8 model up
// to summation order (f32 against the reference's double sums; bf16-rounded inputs can amplify
// a last-bit difference: 1e-3, as the bf16 device tests), the CPU's activations in bf16 as the
// device's.
TEST_F(Int8ModelTest, QuantizedCheckpointOnADevice) {
  TempDir tmp;
  const std::string out = tmp.path() + "/int8";
  ASSERT_TRUE(model::QuantizeCheckpoint(ModelDir("opt-mini"), out, nullptr).ok());
  auto sim = test_util::MakeSimDeviceBackend(size_t{256} << 20);
  model::LoadOptions o;
  o.kv_memory_bytes = 16 << 20;
  auto dev = model::LoadModel(out, sim.get(), nullptr, o);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  EXPECT_EQ((*dev)->weight_dtype(), DType::kI8);
  auto cpu = Load(backend_.get(), out, DType::kI8);
  const std::vector<int32_t> ids = {2, 100, 200, 300, 400, 500, 600, 700};
  const std::vector<float> got = PrefillLogits(**dev, ids);
  WeightOnlyInt8 weight_only;
  const std::vector<float> want = PrefillLogits(*cpu, ids);
  ASSERT_EQ(got.size(), want.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  EXPECT_LE(std::sqrt(num / den), 1e-3);
}

double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

// --dtype int8 with a float checkpoint on a device: the matrices are quantized on the host as
// they stream (the CPU's per-row rule, so the same int8 values and scales), and the logits match
// the CPU's int8 model at TP 1 and on each rank's slices at TP 2 (row-parallel slices get their
// own row scales, as the CPU's copied slices do). Tolerance as above.
TEST_F(Int8ModelTest, QuantizingOnTheWayToADevice) {
  auto sim = test_util::MakeSimDeviceBackend(size_t{256} << 20);
  model::LoadOptions o;
  o.kv_memory_bytes = 16 << 20;
  o.weight_dtype = DType::kI8;
  auto dev = model::LoadModel(ModelDir("opt-mini"), sim.get(), nullptr, o);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  EXPECT_EQ((*dev)->weight_dtype(), DType::kI8);
  EXPECT_LT((*dev)->weight_bytes(), f16_->weight_bytes() * 0.56);
  const std::vector<int32_t> ids = {2, 100, 200, 300, 400, 500, 600, 700};
  const std::vector<float> got = PrefillLogits(**dev, ids);
  WeightOnlyInt8 weight_only;
  EXPECT_LE(RelativeError(got, PrefillLogits(*int8_, ids)), 1e-3);
}

TEST_F(Int8ModelTest, DejaVuAndH2oOnInt8Weights) {
  // int8 + Deja Vu (the fixture's predictors) + H2O at a 20% budget together, against f16 with
  // the same sparsity and policy: within 1% of its perplexity.
  const std::vector<int32_t> ids = HeldOut("kjv.txt", 4096);
  model::SparsityOptions s;
  s.predictors = ModelDir("opt-mini") + "/predictors.safetensors";
  kv::CachePolicyConfig h2o;
  h2o.kind = kv::CachePolicyKind::kH2O;
  double ppl[2];
  int i = 0;
  for (model::Model* m : {f16_.get(), int8_.get()}) {
    ASSERT_TRUE(m->EnableSparsity(s).ok());
    auto r = model::PolicyPerplexity(*m, ids, 512, 256, h2o, /*sparse=*/true);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_GT(r->evictions, 0);
    ppl[i++] = r->result.perplexity;
  }
  std::printf("Deja Vu + H2O 20%%: f16 %.4f int8 %.4f\n", ppl[0], ppl[1]);
  EXPECT_LE(std::abs(ppl[1] - ppl[0]) / ppl[0], 0.01);
}

TEST_F(Int8ModelTest, MalformedInt8CheckpointsAreRefusedByName) {
  TempDir tmp;
  const std::string q = tmp.path() + "/q";
  ASSERT_TRUE(model::QuantizeCheckpoint(ModelDir("opt-mini"), q, nullptr).ok());
  const std::string fc1 = "model.decoder.layers.1.fc1.weight";
  struct Case {
    const char* name;
    std::function<void(std::vector<std::pair<std::string, TensorView>>*)> edit;
    const char* message;
  };
  std::vector<Tensor> keep;
  const Case cases[] = {
      {"missing scale",
       [&](std::vector<std::pair<std::string, TensorView>>* t) {
         std::erase_if(*t, [&](const auto& p) { return p.first == fc1 + ".scale"; });
       },
       "has no 'model.decoder.layers.1.fc1.weight.scale'"},
      {"negative scale",
       [&](std::vector<std::pair<std::string, TensorView>>* t) {
         for (auto& p : *t)
           if (p.first == fc1 + ".scale") static_cast<float*>(p.second.data)[3] = -1.f;
       },
       "scales are finite and >= 0"},
      {"nan scale",
       [&](std::vector<std::pair<std::string, TensorView>>* t) {
         for (auto& p : *t)
           if (p.first == fc1 + ".scale") static_cast<float*>(p.second.data)[0] = std::nanf("");
       },
       "scales are finite and >= 0"},
      {"scale of the wrong length",
       [&](std::vector<std::pair<std::string, TensorView>>* t) {
         for (auto& p : *t)
           if (p.first == fc1 + ".scale") p.second.shape = Shape{p.second.numel() - 1};
       },
       "fc1.weight.scale"},
      {"int8 -128",
       [&](std::vector<std::pair<std::string, TensorView>>* t) {
         for (auto& p : *t)
           if (p.first == fc1) static_cast<int8_t*>(p.second.data)[5] = -128;
       },
       "holds -128"},
      {"int8 bias",
       [&](std::vector<std::pair<std::string, TensorView>>* t) {
         for (auto& p : *t) {
           if (p.first == "model.decoder.layers.0.fc1.bias") {
             Tensor b = Tensor::Zeros(DType::kI8, p.second.shape);
             p.second = b.view();
             keep.push_back(std::move(b));
           }
         }
       },
       "only matrices may be quantized"},
  };
  int i = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string dir = tmp.path() + "/bad" + std::to_string(i++);
    test_util::RewriteCheckpoint(q, dir, c.edit, &keep);
    model::LoadOptions o;
    auto m = model::LoadModel(dir, backend_.get(), nullptr, o);
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument) << m.status().ToString();
    EXPECT_NE(m.status().message().find(c.message), std::string::npos) << m.status().ToString();
  }
}

}  // namespace
}  // namespace deja::worker
