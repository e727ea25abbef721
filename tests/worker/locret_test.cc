// Locret end to end on the fixture model, with seeded random retaining heads: the fast path
// (OptModel, the RetainScores op, SequenceKv, chunked prefill) equals the plain reference loop
// (tests/worker/h2o_reference.h) in tokens and log-probs; no head ever holds more than the budget
// plus one chunk; mixed policies share a batch; Deja Vu runs beside it; the policy is refused
// without retaining heads; the hindsight scores of `deja-lab ppl --locret-oracle` (at the end).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/backend.h"
#include "predictors/retaining_heads.h"
#include "tests/common/sim_device.h"
#include "tests/common/temp_dir.h"
#include "tests/worker/golden_util.h"
#include "tests/worker/h2o_reference.h"
#include "lab/locret_oracle.h"
#include "lab/collection.h"
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

kv::CachePolicyConfig Locret(int32_t scored, int32_t stabilisers) {
  kv::CachePolicyConfig c;
  c.kind = kv::CachePolicyKind::kLocret;
  c.heavy_tokens = scored;
  c.recent_tokens = stabilisers;
  return c;
}

class LocretTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto b = test_util::MakeTestBackend(GetParam());
    if (!b.ok()) GTEST_SKIP() << GetParam() << ": " << b.status().ToString();
    backend_ = std::move(*b);
    model::LoadOptions options;
    if (GetParam() == "cuda") options.kv_memory_bytes = 256ll << 20;
    options.weight_dtype = test_util::ExactWeightDType(GetParam());
    auto m = model::LoadModel(ModelDir("opt-mini"), backend_.get(), nullptr, options);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    model_ = std::move(*m);
    path_ = dir_.path() + "/retaining.safetensors";
    heads_ = RandomHeads(path_);
    Status s = model_->EnableRetaining(path_);
    ASSERT_TRUE(s.ok()) << s.ToString();
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

// The locret oracle (`deja-lab ppl --locret-oracle`, lab/locret_oracle.h): its scores equal an
// explicit softmax over fresh random queries and keys; the table a dense run records is each
// layer's and head's scores of that run's q and k, laid out [layer][position][head]; and a
// retaining-score override really decides what locret keeps (scores rising with the position keep
// exactly what a recent window of the same budget keeps).

// What OracleScores computes, written out: per query the softmax over the keys it sees, then per
// key the largest log probability and the log of the summed probability over the later queries.
void PlainOracle(const std::vector<float>& q, const std::vector<float>& k, int64_t stride,
                 int64_t offset, int32_t n, int32_t from, int32_t hd, std::vector<double>* max_lp,
                 std::vector<double>* log_mass) {
  max_lp->assign(n, -INFINITY);
  std::vector<double> mass(n, 0.0);
  for (int32_t i = from; i < n; ++i) {
    std::vector<double> e(i + 1);
    double z = 0;
    for (int32_t j = 0; j <= i; ++j) {
      double dot = 0;
      for (int32_t c = 0; c < hd; ++c)
        dot += double{q[i * stride + offset + c]} * k[j * stride + offset + c];
      e[j] = std::exp(dot / std::sqrt(double(hd)));
      z += e[j];
    }
    for (int32_t j = 0; j <= i; ++j) {
      (*max_lp)[j] = std::max((*max_lp)[j], std::log(e[j] / z));
      mass[j] += e[j] / z;
    }
  }
  log_mass->resize(n);
  for (int32_t j = 0; j < n; ++j) (*log_mass)[j] = std::log(mass[j]);
}

TEST(LocretOracle, ScoresEqualExplicitSoftmax) {
  std::mt19937 rng(20261125);
  std::normal_distribution<float> d(0.f, 1.f);
  const int32_t n = 37, hd = 8, heads = 3;
  const int64_t stride = heads * hd + 5;  // rows wider than the heads, as a stacked q/k/v row is
  std::vector<float> q(n * stride), k(n * stride);
  for (float& x : q) x = d(rng);
  for (float& x : k) x = d(rng);
  for (int32_t from : {0, 11, n - 1}) {
    for (int32_t h = 0; h < heads; ++h) {
      std::vector<double> want_max, want_sum;
      PlainOracle(q, k, stride, h * hd, n, from, hd, &want_max, &want_sum);
      std::vector<float> got_max(n), got_sum(n);
      locret::OracleScores(q.data(), k.data(), stride, h * hd, n, from, hd,
                           locret::OracleKind::kMax, got_max.data());
      locret::OracleScores(q.data(), k.data(), stride, h * hd, n, from, hd,
                           locret::OracleKind::kSum, got_sum.data());
      for (int32_t j = 0; j < n; ++j) {
        // Log probabilities: an absolute tolerance (they are O(1..10)).
        EXPECT_NEAR(got_max[j], want_max[j], 1e-4)
            << "from " << from << " head " << h << " j " << j;
        EXPECT_NEAR(got_sum[j], want_sum[j], 1e-4)
            << "from " << from << " head " << h << " j " << j;
        EXPECT_LE(got_max[j], got_sum[j] + 1e-5);  // one term of the sum never exceeds it
      }
    }
  }
}

class OracleModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = kernels::MakeCpuBackend(1);
    auto m = model::LoadModel(ModelDir("opt-mini"), backend_.get());
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    model_ = std::move(*m);
    Status s = model_->EnableRetaining(ModelDir("opt-mini") + "/retaining.safetensors");
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<model::Model> model_;
};

// Keeps every layer's q and k of a dense step.
class QkCopy : public model::LayerObserver {
 public:
  void OnAttention(int32_t, const TensorView&, const TensorView&) override {}
  void OnMlp(int32_t, const TensorView&, const TensorView&) override {}
  void OnQkv(int32_t l, const float* q, const float* k, const float*, int64_t stride,
             int64_t rows) override {
    if (static_cast<size_t>(l) >= qs.size()) qs.resize(l + 1), ks.resize(l + 1);
    qs[l].assign(q, q + rows * stride);
    ks[l].assign(k, k + rows * stride);
    this->stride = stride;
  }
  std::vector<std::vector<float>> qs, ks;
  int64_t stride = 0;
};

TEST_F(OracleModelTest, TableHoldsEachLayersAndHeadsScores) {
  const auto& c = model_->config();
  const int32_t n = 90, from = 40, skip = 2;
  const int32_t heads = static_cast<int32_t>(c.num_attention_heads);
  const int32_t hd = static_cast<int32_t>(c.head_dim());
  std::vector<int32_t> tokens = RandomPrompt(n, 3);
  QkCopy copy;
  model_->set_observer(&copy);
  model::StepResult step;
  ASSERT_TRUE(model::ForwardWindow(*model_, tokens, &step).ok());
  model_->set_observer(nullptr);
  ASSERT_EQ(copy.qs.size(), static_cast<size_t>(c.num_hidden_layers));

  locret::OracleScorer scorer(*model_, locret::OracleKind::kSum, skip);
  ASSERT_TRUE(scorer.Prepare(tokens, from).ok());
  const std::vector<float>& table = scorer.table();
  ASSERT_EQ(table.size(), static_cast<size_t>(c.num_hidden_layers) * n * heads);
  std::vector<float> want(n);
  for (int32_t l = 0; l < static_cast<int32_t>(c.num_hidden_layers); ++l) {
    for (int32_t h = 0; h < heads; ++h) {
      locret::OracleScores(copy.qs[l].data(), copy.ks[l].data(), copy.stride, h * hd, n, from, hd,
                           locret::OracleKind::kSum, want.data());
      for (int32_t j = 0; j < n; ++j) {
        const float got = table[(static_cast<size_t>(l) * n + j) * heads + h];
        if (j < skip) {
          EXPECT_LT(got, -1e29f) << "skipped position " << j << " layer " << l;
        } else {
          EXPECT_FLOAT_EQ(got, want[j]) << "layer " << l << " head " << h << " position " << j;
        }
      }
    }
  }
  EXPECT_FALSE(scorer.Prepare(tokens, n).ok());  // no query left to score with
}

// Scores that rise with the position make locret keep the newest tokens: the same tokens and
// log-probs as a locret cache of the same budget that keeps only stabilisers (a recent window
// prefilled in the same chunks). Scores that fall with it keep the oldest instead, which differs.
TEST_F(OracleModelTest, OverrideDecidesWhatLocretKeeps) {
  const auto& c = model_->config();
  const int32_t prompt_n = 120, steps = 24, positions = prompt_n + steps;
  const int32_t heads = static_cast<int32_t>(c.num_attention_heads);
  std::vector<float> rising(static_cast<size_t>(c.num_hidden_layers) * positions * heads);
  std::vector<float> falling(rising.size());
  for (size_t i = 0; i < rising.size(); ++i) {
    const int32_t pos = static_cast<int32_t>(i / heads % positions);
    rising[i] = static_cast<float>(pos);
    falling[i] = -static_cast<float>(pos);
  }
  std::vector<int32_t> prompt = RandomPrompt(prompt_n, 9);
  auto generate = [&](const kv::CachePolicyConfig& policy) {
    model::GenerationOptions opt;
    opt.max_new_tokens = steps;
    opt.stop_at_eos = false;
    opt.prefill_chunk = 16;
    opt.cache = policy;
    auto r = Generate(*model_, prompt, opt);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : model::GenerationResult{};
  };
  const model::GenerationResult window = generate(Locret(0, 12));
  ASSERT_TRUE(model_->SetRetainingOverride(rising, positions).ok());
  const model::GenerationResult newest = generate(Locret(4, 8));
  ASSERT_TRUE(model_->SetRetainingOverride(falling, positions).ok());
  const model::GenerationResult oldest = generate(Locret(4, 8));
  ASSERT_TRUE(model_->SetRetainingOverride({}, 0).ok());
  const model::GenerationResult heads_run = generate(Locret(4, 8));

  ASSERT_EQ(newest.tokens.size(), window.tokens.size());
  ASSERT_EQ(oldest.tokens.size(), window.tokens.size());
  ASSERT_EQ(heads_run.tokens.size(), window.tokens.size());
  double oldest_diff = 0, heads_diff = 0;
  for (size_t i = 0; i < window.tokens.size(); ++i) {
    ASSERT_EQ(newest.tokens[i].id, window.tokens[i].id) << "step " << i;
    EXPECT_NEAR(newest.tokens[i].logprob, window.tokens[i].logprob, 1e-5) << "step " << i;
    oldest_diff = std::max(oldest_diff,
                           std::fabs(double{oldest.tokens[i].logprob} - window.tokens[i].logprob));
    heads_diff = std::max(
        heads_diff, std::fabs(double{heads_run.tokens[i].logprob} - window.tokens[i].logprob));
  }
  EXPECT_GT(oldest_diff, 1e-3);  // keeping the oldest tokens changes the predictions
  EXPECT_GT(heads_diff, 1e-3);   // and the override, cleared, gives the heads back
}

TEST_F(OracleModelTest, OverrideRefusesBadTables) {
  const auto& c = model_->config();
  const int32_t heads = static_cast<int32_t>(c.num_attention_heads);
  std::vector<float> table(static_cast<size_t>(c.num_hidden_layers) * 10 * heads, 0.f);
  Status s = model_->SetRetainingOverride(table, 11);  // the size says 10 positions
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  // A table of 10 positions, and a sequence that writes past them: the step fails, clearly.
  ASSERT_TRUE(model_->SetRetainingOverride(table, 10).ok());
  auto kv = model_->NewSequence(64, Locret(4, 4), 32, 32);
  ASSERT_TRUE(kv.ok()) << kv.status().ToString();
  std::vector<int32_t> tokens = RandomPrompt(32, 4);
  model::StepResult step;
  s = model_->Forward({{kv->get(), tokens.data(), 32, false}}, &step);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange) << s.ToString();
  EXPECT_NE(s.message().find("10 positions"), std::string::npos) << s.ToString();
  ASSERT_TRUE(model_->SetRetainingOverride({}, 0).ok());
}

// deja-lab ppl's wiring: an oracle run over a window longer than the budget evicts and gives a finite
// perplexity different from the retaining heads' (the scores decide what is kept).
TEST_F(OracleModelTest, PolicyPerplexityUsesTheScorer) {
  std::vector<int32_t> text = RandomPrompt(400, 5);
  text.erase(text.begin());
  const int32_t context = 200, prompt = 150;
  locret::OracleScorer scorer(*model_, locret::OracleKind::kSum, 1);
  auto oracle = model::PolicyPerplexity(
      *model_, text, context, prompt, Locret(8, 16), false, 32, [&](const std::vector<int32_t>& w) {
        return scorer.Prepare(std::vector<int32_t>(w.begin(), w.end() - 1), prompt - 1);
      });
  ASSERT_TRUE(oracle.ok()) << oracle.status().ToString();
  ASSERT_TRUE(model_->SetRetainingOverride({}, 0).ok());
  auto heads = model::PolicyPerplexity(*model_, text, context, prompt, Locret(8, 16), false, 32);
  ASSERT_TRUE(heads.ok()) << heads.status().ToString();
  EXPECT_TRUE(std::isfinite(oracle->result.perplexity));
  EXPECT_GT(oracle->evictions, 0);
  EXPECT_EQ(oracle->result.tokens, heads->result.tokens);
  EXPECT_NE(oracle->result.perplexity, heads->result.perplexity);
  EXPECT_EQ(oracle->peak_prompt_tokens, 8 + 16 + 32);
}

}  // namespace
}  // namespace deja::worker
