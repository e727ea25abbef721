// The OPT model on the CPU backend against Hugging Face transformers (fp32) on the committed
// goldens of both fixture models: logits, per-position log-probs, greedy continuations and
// perplexity. Also: batching, chunked prefill and the reference backend give the same answers.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "common/tokenizer.h"
#include "kernels/backend.h"
#include "tests/common/sim_device.h"
#include "tests/worker/golden_util.h"
#include "worker/model/generation.h"
#include "worker/model/model.h"

namespace deja::worker {
namespace {

using test_util::LoadGolden;
using test_util::ModelDir;
using test_util::RelError;

constexpr double kLogitRelTol = 1e-3;
constexpr double kLogprobAbsTol = 1e-3;
constexpr double kPplRelTol = 1e-3;

// Parameters: the fixture and the device (tests/common/sim_device.h). Tolerances are the same on
// every device except where noted.
class OptGoldenTest : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {
 protected:
  void SetUp() override {
    auto b = test_util::MakeTestBackend(Device());
    if (!b.ok()) GTEST_SKIP() << Device() << ": " << b.status().ToString();
    backend_ = std::move(*b);
    model::LoadOptions options;
    // A GPU's KV pool: 256 MiB, not 80% of its memory per test (the simulated device's 16 MiB
    // are small enough).
    if (Device() == "cuda") options.kv_memory_bytes = 256ll << 20;
    options.weight_dtype = test_util::ExactWeightDType(Device());
    auto m = model::LoadModel(ModelDir(Fixture()), backend_.get(), nullptr, options);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    model_ = std::move(*m);
    golden_ = LoadGolden(Fixture());
    ASSERT_TRUE(golden_.contains("cases"));
  }

  const std::string& Fixture() const { return std::get<0>(GetParam()); }
  const std::string& Device() const { return std::get<1>(GetParam()); }
  // Batched against single-sequence logits: one summation order on host backends; cuBLAS may
  // pick another GEMM algorithm for another row count.
  double BatchTol() const { return Device() == "cuda" ? 1e-4 : 1e-5; }

  std::vector<int32_t> Ids(const nlohmann::json& c) {
    return c["input_ids"].get<std::vector<int32_t>>();
  }

  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<model::Model> model_;
  nlohmann::json golden_;
};

TEST_P(OptGoldenTest, TokenizerMatchesGoldenInputIds) {
  auto tok = Tokenizer::Load(ModelDir(Fixture()));
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  for (const auto& c : golden_["cases"]) {
    auto ids = (*tok)->Encode(c["prompt"].get<std::string>(), true);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, Ids(c)) << c["name"];
  }
}

TEST_P(OptGoldenTest, LogitsAndLogprobsMatchHf) {
  const int64_t vocab = model_->config().vocab_size;
  for (const auto& c : golden_["cases"]) {
    std::vector<int32_t> ids = Ids(c);
    auto kv = model_->NewSequence(static_cast<int32_t>(ids.size()));
    ASSERT_TRUE(kv.ok());
    model::StepResult r;
    Status st =
        model_->Forward({{kv->get(), ids.data(), static_cast<int32_t>(ids.size()), true}}, &r);
    ASSERT_TRUE(st.ok()) << st.ToString();
    const float* last = r.logits.as<float>() + (ids.size() - 1) * vocab;
    auto want = c["last_logits"].get<std::vector<double>>();
    ASSERT_EQ(want.size(), static_cast<size_t>(vocab));
    EXPECT_LE(RelError(last, want), kLogitRelTol) << c["name"];
    auto lp = c["next_token_logprobs"].get<std::vector<double>>();
    ASSERT_EQ(lp.size(), ids.size() - 1);
    double worst = 0;
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      const float* row = r.logits.as<float>() + i * vocab;
      double mx = row[0], sum = 0;
      for (int64_t j = 1; j < vocab; ++j) mx = std::max<double>(mx, row[j]);
      for (int64_t j = 0; j < vocab; ++j) sum += std::exp(row[j] - mx);
      double got = row[ids[i + 1]] - mx - std::log(sum);
      worst = std::max(worst, std::abs(got - lp[i]));
    }
    EXPECT_LE(worst, kLogprobAbsTol) << c["name"];
  }
}

TEST_P(OptGoldenTest, GreedyContinuationsIdentical) {
  model::GenerationOptions opt;
  opt.stop_at_eos = false;
  opt.prefill_chunk = 100;  // also exercises chunked prefill on the long prompts
  for (const auto& c : golden_["cases"]) {
    auto want = c["greedy_ids"].get<std::vector<int32_t>>();
    opt.max_new_tokens = static_cast<int32_t>(want.size());
    auto r = Generate(*model_, Ids(c), opt);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    std::vector<int32_t> got;
    for (const sampling::TokenChoice& t : r->tokens) got.push_back(t.id);
    EXPECT_EQ(got, want) << c["name"];
  }
}

TEST_P(OptGoldenTest, PerplexityMatchesHf) {
  if (Device() == "sim") {
    GTEST_SKIP() << "minutes with the reference attention over 1024-token windows; the logits "
                    "and greedy cases cover the simulated device";
  }
  auto tok = Tokenizer::Load(ModelDir(Fixture()));
  ASSERT_TRUE(tok.ok());
  ASSERT_TRUE(golden_.contains("ppl"));
  for (const auto& p : golden_["ppl"]) {
    std::ifstream in(test_util::SourceDir() + "/" + p["file"].get<std::string>());
    std::stringstream ss;
    ss << in.rdbuf();
    auto ids = (*tok)->Encode(ss.str(), false);
    ASSERT_TRUE(ids.ok());
    auto r = Perplexity(*model_, *ids, p["context"].get<int32_t>());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->tokens, p["tokens"].get<int64_t>());
    double want = p["perplexity"].get<double>();
    EXPECT_LE(std::abs(r->perplexity - want) / want, kPplRelTol)
        << p["file"] << " context " << p["context"] << ": got " << r->perplexity << " want "
        << want;
  }
}

// Sequences of different lengths in one batch give the logits each gives alone.
TEST_P(OptGoldenTest, BatchedEqualsSingle) {
  const int64_t vocab = model_->config().vocab_size;
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& c : golden_["cases"]) {
    if (c["input_ids"].size() < 300) prompts.push_back(Ids(c));
  }
  ASSERT_GE(prompts.size(), 3u);
  std::vector<std::unique_ptr<kv::SequenceKv>> kvs;
  std::vector<model::SequenceStep> batch;
  for (auto& p : prompts) {
    kvs.push_back(std::move(*model_->NewSequence(static_cast<int32_t>(p.size()) + 1)));
    batch.push_back({kvs.back().get(), p.data(), static_cast<int32_t>(p.size()), false});
  }
  model::StepResult together;
  ASSERT_TRUE(model_->Forward(batch, &together).ok());
  // One decode step for all of them at once.
  std::vector<int32_t> next(prompts.size(), 7);
  for (size_t i = 0; i < batch.size(); ++i) batch[i] = {kvs[i].get(), &next[i], 1, false};
  model::StepResult decoded;
  ASSERT_TRUE(model_->Forward(batch, &decoded).ok());
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto kv = model_->NewSequence(static_cast<int32_t>(prompts[i].size()) + 1);
    model::StepResult alone;
    ASSERT_TRUE(model_->Forward({{kv->get(), prompts[i].data(),
                                  static_cast<int32_t>(prompts[i].size()), false}},
                                &alone).ok());
    std::vector<double> want(alone.logits.as<float>(), alone.logits.as<float>() + vocab);
    EXPECT_LE(RelError(together.logits.as<float>() + i * vocab, want), BatchTol());
    ASSERT_TRUE(model_->Forward({{kv->get(), &next[i], 1, false}}, &alone).ok());
    want.assign(alone.logits.as<float>(), alone.logits.as<float>() + vocab);
    EXPECT_LE(RelError(decoded.logits.as<float>() + i * vocab, want), BatchTol());
  }
}

// The whole model on the plain reference backend agrees with the backend under test.
TEST_P(OptGoldenTest, ReferenceBackendAgrees) {
  auto ref_backend = kernels::MakeReferenceBackend();
  auto ref = model::LoadModel(ModelDir(Fixture()), ref_backend.get());
  ASSERT_TRUE(ref.ok());
  const auto& c = golden_["cases"][2];
  std::vector<int32_t> ids = Ids(c);
  const int64_t vocab = model_->config().vocab_size;
  model::StepResult a, b;
  auto kva = model_->NewSequence(static_cast<int32_t>(ids.size()));
  auto kvb = (*ref)->NewSequence(static_cast<int32_t>(ids.size()));
  const int32_t n = static_cast<int32_t>(ids.size());
  ASSERT_TRUE(model_->Forward({{kva->get(), ids.data(), n, false}}, &a).ok());
  ASSERT_TRUE((*ref)->Forward({{kvb->get(), ids.data(), n, false}}, &b).ok());
  std::vector<double> want(b.logits.as<float>(), b.logits.as<float>() + vocab);
  EXPECT_LE(RelError(a.logits.as<float>(), want), BatchTol());
}

TEST_P(OptGoldenTest, PositionLimitEnforced) {
  const int32_t limit = static_cast<int32_t>(model_->config().max_position_embeddings);
  EXPECT_EQ(model_->NewSequence(limit + 1).status().code(), StatusCode::kOutOfRange);
  model::GenerationOptions opt;
  opt.max_new_tokens = 2;
  std::vector<int32_t> prompt(limit - 1, 5);
  auto r = Generate(*model_, prompt, opt);
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(r.status().message().find("position limit"), std::string::npos);
}

TEST_P(OptGoldenTest, BadTokenIdRejected) {
  auto kv = model_->NewSequence(4);
  int32_t bad = static_cast<int32_t>(model_->config().vocab_size);
  model::StepResult r;
  Status s = model_->Forward({{kv->get(), &bad, 1, false}}, &r);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*kv)->length(), 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, OptGoldenTest,
                         ::testing::Combine(::testing::Values("opt-mini", "opt-tiny-postln"),
                                            ::testing::ValuesIn(test_util::TestDevices())),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param) + "_" + std::get<1>(info.param);
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace deja::worker
