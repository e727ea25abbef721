// Locret end to end on the fixture model, with seeded random retaining heads: the fast path
// (OptModel, the RetainScores op, SequenceKv, chunked prefill) equals the plain reference loop
// (tests/worker/h2o_reference.h) in tokens and log-probs; no head ever holds more than the budget
// plus one chunk; mixed policies share a batch; Deja Vu runs beside it; the policy is refused
// without retaining heads.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/backend.h"
#include "predictors/retaining_heads.h"
#include "tests/common/sim_device.h"
#include "tests/common/temp_dir.h"
#include "tests/worker/golden_util.h"
#include "tests/worker/h2o_reference.h"
#include "worker/model/generation.h"
#include "worker/model/model.h"

namespace deja::worker {
namespace {

using test_util::ModelDir;

constexpr float kLogprobTol = 1e-4f;

// Writes a seeded random set of retaining heads for opt-mini (hidden 8) and loads it back (the
// f16-rounded weights the model uses too).
predictors::RetainingHeads RandomHeads(const std::string& path) {
  predictors::RetainingHeads r;
  r.layers = 4;
  r.heads = 8;
  r.head_dim = 32;
  r.hidden = 8;
  std::mt19937 rng(1234);
  std::normal_distribution<float> w(0.f, 0.2f);
  auto fill = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = w(rng);
    return v;
  };
  for (int32_t l = 0; l < r.layers; ++l) {
    r.w1.push_back(fill(static_cast<size_t>(r.heads) * r.hidden * 3 * r.head_dim));
    r.b1.push_back(fill(static_cast<size_t>(r.heads) * r.hidden));
    r.w2.push_back(fill(static_cast<size_t>(r.heads) * r.hidden));
    r.b2.push_back(fill(static_cast<size_t>(r.heads)));
  }
  Status s = predictors::SaveRetainingHeads(path, r, nlohmann::json::object());
  EXPECT_TRUE(s.ok()) << s.ToString();
  auto loaded = predictors::LoadRetainingHeads(path, 4, 8, 32);
  EXPECT_TRUE(loaded.ok()) << loaded.status().ToString();
  return loaded.ok() ? std::move(*loaded) : r;
}

class LocretTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto b = test_util::MakeTestBackend(GetParam());
    if (!b.ok()) GTEST_SKIP() << GetParam() << ": " << b.status().ToString();
    backend_ = std::move(*b);
    model::LoadOptions options;
    if (GetParam() == "cuda") options.kv_memory_bytes = 256ll << 20;
    auto m = model::LoadModel(ModelDir("opt-mini"), backend_.get(), nullptr, options);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    model_ = std::move(*m);
    path_ = dir_.path() + "/retaining.safetensors";
    heads_ = RandomHeads(path_);
    Status s = model_->EnableRetaining(path_);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }

  std::vector<int32_t> RandomPrompt(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> tok(4, 8191);
    std::vector<int32_t> ids = {2};
    for (int i = 1; i < n; ++i) ids.push_back(tok(rng));
    return ids;
  }

  std::vector<int32_t> RealPrompt() {
    auto golden = test_util::LoadGolden("opt-mini");
    std::vector<int32_t> best;
    for (const auto& c : golden["cases"]) {
      auto ids = c["input_ids"].get<std::vector<int32_t>>();
      if (ids.size() > best.size() && ids.size() < 400) best = ids;
    }
    return best;
  }

  static kv::CachePolicyConfig Locret(int32_t scored, int32_t stabilisers) {
    kv::CachePolicyConfig c;
    c.kind = kv::CachePolicyKind::kLocret;
    c.heavy_tokens = scored;
    c.recent_tokens = stabilisers;
    return c;
  }

  void ExpectMatchesReference(const std::vector<int32_t>& prompt, int32_t scored,
                              int32_t stabilisers, int32_t chunk, int32_t steps) {
    auto ref = ReferenceH2O::Load(ModelDir("opt-mini"), scored, stabilisers, &heads_);
    ASSERT_TRUE(ref.ok()) << ref.status().ToString();
    std::vector<int32_t> want_ids;
    std::vector<float> want_lp;
    int32_t held = 0;
    ASSERT_TRUE((*ref)->Greedy(prompt, steps, &want_ids, &want_lp, chunk, &held).ok());
    EXPECT_LE(held, scored + stabilisers + chunk);

    model::GenerationOptions opt;
    opt.max_new_tokens = steps;
    opt.stop_at_eos = false;
    opt.prefill_chunk = chunk;
    opt.cache = Locret(scored, stabilisers);
    auto r = Generate(*model_, prompt, opt);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->tokens.size(), want_ids.size());
    for (size_t i = 0; i < want_ids.size(); ++i) {
      ASSERT_EQ(r->tokens[i].id, want_ids[i]) << "step " << i;
      EXPECT_NEAR(r->tokens[i].logprob, want_lp[i], kLogprobTol) << "step " << i;
    }
    EXPECT_GT(r->evictions, 0);
  }

  test_util::TempDir dir_;
  std::string path_;
  predictors::RetainingHeads heads_;
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<model::Model> model_;
};

TEST_P(LocretTest, FastPathEqualsReferenceOnRealTextInChunks) {
  ExpectMatchesReference(RealPrompt(), /*scored=*/16, /*stabilisers=*/8, /*chunk=*/32,
                         /*steps=*/24);
}

TEST_P(LocretTest, FastPathEqualsReferenceOnRandomTokensWithTinyBudget) {
  ExpectMatchesReference(RandomPrompt(120, 5), /*scored=*/4, /*stabilisers=*/3, /*chunk=*/16,
                         /*steps=*/24);
}

// Chunked prefill and decode: after every step each head holds at most the budget, during a step
// at most budget + chunk (the cache's capacity, fixed from the first token).
TEST_P(LocretTest, BudgetNeverExceeded) {
  const int32_t scored = 12, stabilisers = 4, chunk = 24, budget = scored + stabilisers;
  std::vector<int32_t> tokens = RandomPrompt(300, 11);
  auto kv = model_->NewSequence(400, Locret(scored, stabilisers), 200, chunk);
  ASSERT_TRUE(kv.ok()) << kv.status().ToString();
  EXPECT_EQ((*kv)->capacity(), budget + chunk);
  const size_t bytes = (*kv)->bytes();
  const int64_t heads =
      int64_t{model_->config().num_attention_heads} * model_->config().num_hidden_layers;
  model::StepResult step;
  int32_t done = 0;
  while (done < 300) {
    const int32_t n = done < 200 ? std::min(chunk, 200 - done) : 1;
    ASSERT_TRUE(model_->Forward({{kv->get(), tokens.data() + done, n, false}}, &step).ok());
    done += n;
    EXPECT_LE((*kv)->cached_slots(), heads * budget) << "after " << done << " tokens";
    EXPECT_EQ((*kv)->bytes(), bytes);
  }
  EXPECT_EQ((*kv)->cached_slots(), heads * budget);

  // The perplexity harness reports the same bound for its long-prompt mode.
  auto pr = model::PolicyPerplexity(*model_, std::vector<int32_t>(tokens.begin() + 1, tokens.end()),
                                    300, 200, Locret(scored, stabilisers), false, chunk);
  ASSERT_TRUE(pr.ok()) << pr.status().ToString();
  EXPECT_EQ(pr->peak_prompt_tokens, budget + chunk);
  EXPECT_TRUE(std::isfinite(pr->result.perplexity));
}

// full, h2o and locret sequences in one batch each give what they give alone.
TEST_P(LocretTest, MixedPoliciesInOneBatch) {
  const int64_t vocab = model_->config().vocab_size;
  std::vector<kv::CachePolicyConfig> policies(3);
  policies[1].kind = kv::CachePolicyKind::kH2O;
  policies[2] = Locret(8, 4);
  std::vector<std::vector<int32_t>> prompts = {RandomPrompt(50, 1), RandomPrompt(70, 2),
                                               RandomPrompt(30, 3)};
  auto make = [&](size_t i) {
    return std::move(
        *model_->NewSequence(200, policies[i], static_cast<int32_t>(prompts[i].size()), 100));
  };
  std::vector<std::unique_ptr<kv::SequenceKv>> together, alone;
  for (size_t i = 0; i < 3; ++i) {
    together.push_back(make(i));
    alone.push_back(make(i));
  }
  std::vector<model::SequenceStep> batch;
  for (size_t i = 0; i < 3; ++i)
    batch.push_back({together[i].get(), prompts[i].data(), (int32_t)prompts[i].size(), false});
  model::StepResult rt, ra;
  for (int step = 0; step < 16; ++step) {
    ASSERT_TRUE(model_->Forward(batch, &rt).ok());
    for (size_t i = 0; i < 3; ++i) {
      ASSERT_TRUE(
          model_->Forward({{alone[i].get(), batch[i].tokens, batch[i].n, false}}, &ra).ok());
      std::vector<double> want(ra.logits.as<float>(), ra.logits.as<float>() + vocab);
      ASSERT_LE(test_util::RelError(rt.logits.as<float>() + i * vocab, want), 1e-5)
          << "sequence " << i << " step " << step;
    }
    for (size_t i = 0; i < 3; ++i) {
      prompts[i].push_back(static_cast<int32_t>(17 + step + i));
      batch[i] = {together[i].get(), &prompts[i].back(), 1, false};
    }
  }
  EXPECT_EQ(together[0]->evictions(), 0);
  EXPECT_GT(together[1]->evictions(), 0);
  EXPECT_GT(together[2]->evictions(), 0);
}

// Deja Vu computes q for its predicted heads only; the retaining heads still see every head's
// q, so a sparse locret sequence keeps exactly the tokens a dense one scores highest at layer 0
// (dense there in the fixture's schedule) and runs within its budget.
TEST_P(LocretTest, RunsWithDejaVu) {
  model::SparsityOptions so;
  so.predictors = ModelDir("opt-mini") + "/predictors.safetensors";
  Status s = model_->EnableSparsity(so);
  if (!s.ok()) GTEST_SKIP() << s.ToString();
  model::GenerationOptions opt;
  opt.max_new_tokens = 16;
  opt.stop_at_eos = false;
  opt.prefill_chunk = 32;
  opt.sparse = true;
  opt.cache = Locret(12, 4);
  auto r = Generate(*model_, RandomPrompt(100, 7), opt);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tokens.size(), 16u);
  EXPECT_GT(r->evictions, 0);
  for (const auto& t : r->tokens) EXPECT_TRUE(std::isfinite(t.logprob));
}

INSTANTIATE_TEST_SUITE_P(Devices, LocretTest, ::testing::ValuesIn(test_util::TestDevices()),
                         [](const auto& info) { return info.param; });

TEST(LocretPolicy, RefusedWithoutRetainingHeads) {
  auto be = kernels::MakeCpuBackend(1);
  auto m = model::LoadModel(ModelDir("opt-mini"), be.get());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  kv::CachePolicyConfig c;
  c.kind = kv::CachePolicyKind::kLocret;
  auto kv = (*m)->NewSequence(100, c, 50, 16);
  ASSERT_FALSE(kv.ok());
  EXPECT_EQ(kv.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(kv.status().message().find("retaining heads"), std::string::npos);
  EXPECT_FALSE((*m)->EnableRetaining("/nonexistent/retaining.safetensors").ok());
}

}  // namespace
}  // namespace deja::worker
