// The locret oracle (`deja ppl --locret-oracle`, worker/locret/oracle.h): its scores equal an
// explicit softmax over fresh random queries and keys; the table a dense run records is each
// layer's and head's scores of that run's q and k, laid out [layer][position][head]; and a
// retaining-score override really decides what locret keeps (scores rising with the position keep
// exactly what a recent window of the same budget keeps).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/backend.h"
#include "tests/worker/golden_util.h"
#include "worker/locret/oracle.h"
#include "worker/model/collection.h"
#include "worker/model/generation.h"
#include "worker/model/model.h"

namespace deja::worker {
namespace {

using test_util::ModelDir;

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
  std::vector<int32_t> RandomTokens(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> tok(4, 8191);
    std::vector<int32_t> ids = {2};
    for (int i = 1; i < n; ++i) ids.push_back(tok(rng));
    return ids;
  }
  static kv::CachePolicyConfig Locret(int32_t scored, int32_t stabilisers) {
    kv::CachePolicyConfig c;
    c.kind = kv::CachePolicyKind::kLocret;
    c.heavy_tokens = scored;
    c.recent_tokens = stabilisers;
    return c;
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
  std::vector<int32_t> tokens = RandomTokens(n, 3);
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
  std::vector<int32_t> prompt = RandomTokens(prompt_n, 9);
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
  std::vector<int32_t> tokens = RandomTokens(32, 4);
  model::StepResult step;
  s = model_->Forward({{kv->get(), tokens.data(), 32, false}}, &step);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange) << s.ToString();
  EXPECT_NE(s.message().find("10 positions"), std::string::npos) << s.ToString();
  ASSERT_TRUE(model_->SetRetainingOverride({}, 0).ok());
}

// deja ppl's wiring: an oracle run over a window longer than the budget evicts and gives a finite
// perplexity different from the retaining heads' (the scores decide what is kept).
TEST_F(OracleModelTest, PolicyPerplexityUsesTheScorer) {
  std::vector<int32_t> text = RandomTokens(400, 5);
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
