// Sampling: greedy, temperature, top-k, top-p, repetition penalty, seeding, log-probs, top-n
// (the fast path against a plain reference), numerical edge cases and parameter validation.
#include "worker/sampling/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace deja::worker {
namespace {

std::vector<float> LogitsFromProbs(const std::vector<double>& p) {
  std::vector<float> l;
  for (double x : p) l.push_back(static_cast<float>(std::log(x)));
  return l;
}

std::vector<int> Histogram(const sampling::SamplingParams& params, const std::vector<float>& logits,
                           int draws) {
  sampling::Sampler s(params);
  std::vector<int> h(logits.size());
  for (int i = 0; i < draws; ++i) ++h[s.Choose(logits.data(), logits.size(), {})->id];
  return h;
}

TEST(SamplerTest, GreedyPicksArgmaxAndReportsLogprob) {
  std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  sampling::Sampler s(sampling::SamplingParams{});
  sampling::TokenChoice c = s.Choose(logits.data(), 4, {}).value();
  EXPECT_EQ(c.id, 1);  // ties go to the lower id
  double z = 0;
  for (float l : logits) z += std::exp(l);
  EXPECT_NEAR(c.logprob, 2.0 - std::log(z), 1e-6);
}

// The fast path (SIMD max and exp-sum, log-probs only for the reported tokens, one-pass top-n)
// against a plain double-precision log_softmax, a scalar arg-max and a full sort, on fresh random
// rows of sizes that hit every vector tail and OPT's 50,272 tokens, with duplicated maxima
// (ties go to the lower id) in half of them.
TEST(SamplerTest, GreedyLogprobsAndTopNMatchAPlainReference) {
  std::mt19937 rng(20261123);
  std::normal_distribution<float> normal(0.f, 4.f);
  for (int32_t vocab : {1, 2, 7, 15, 16, 17, 33, 1000, 1025, 8192, 50272}) {
    for (int trial = 0; trial < 4; ++trial) {
      SCOPED_TRACE("vocab " + std::to_string(vocab) + " trial " + std::to_string(trial));
      std::vector<float> logits(vocab);
      for (float& x : logits) x = normal(rng);
      if (trial % 2 == 1 && vocab > 2) {  // the max twice, the later copy first in the row
        const int32_t hi = static_cast<int32_t>(rng() % vocab);
        logits[vocab - 1] = 30.f;
        logits[hi] = 30.f;
      }
      double mx = logits[0];
      for (float x : logits) mx = std::max<double>(mx, x);
      double sum = 0;
      for (float x : logits) sum += std::exp(x - mx);
      const double lse = mx + std::log(sum);
      int32_t argmax = 0;
      for (int32_t i = 1; i < vocab; ++i) {
        if (logits[i] > logits[argmax]) argmax = i;
      }
      std::vector<int32_t> order(vocab);
      for (int32_t i = 0; i < vocab; ++i) order[i] = i;
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
      sampling::SamplingParams p;
      p.top_n = 5;
      sampling::Sampler sampler(p);
      sampling::TokenChoice c = sampler.Choose(logits.data(), vocab, {}).value();
      EXPECT_EQ(c.id, argmax);
      EXPECT_NEAR(c.logprob, logits[argmax] - lse, 1e-5);
      ASSERT_EQ(c.top.size(), static_cast<size_t>(std::min(5, vocab)));
      for (size_t i = 0; i < c.top.size(); ++i) {
        EXPECT_EQ(c.top[i].first, order[i]) << i;
        EXPECT_NEAR(c.top[i].second, logits[order[i]] - lse, 1e-5) << i;
      }
    }
  }
}

TEST(SamplerTest, SamplingFollowsTheDistribution) {
  std::vector<double> p = {0.1, 0.2, 0.3, 0.4};
  sampling::SamplingParams params;
  params.do_sample = true;
  params.seed = 7;
  const int n = 40000;
  auto h = Histogram(params, LogitsFromProbs(p), n);
  for (size_t i = 0; i < p.size(); ++i) {
    double sd = std::sqrt(n * p[i] * (1 - p[i]));
    EXPECT_NEAR(h[i], n * p[i], 5 * sd) << "token " << i;
  }
}

TEST(SamplerTest, TemperatureSharpens) {
  std::vector<double> p = {0.1, 0.2, 0.3, 0.4};
  sampling::SamplingParams params;
  params.do_sample = true;
  params.temperature = 0.5f;  // p^2 renormalised: 1, 4, 9, 16 over 30
  const int n = 40000;
  auto h = Histogram(params, LogitsFromProbs(p), n);
  std::vector<double> q = {1 / 30.0, 4 / 30.0, 9 / 30.0, 16 / 30.0};
  for (size_t i = 0; i < q.size(); ++i) {
    EXPECT_NEAR(h[i], n * q[i], 5 * std::sqrt(n * q[i] * (1 - q[i])));
  }
}

// A tiny positive temperature is greedy (the logits are scaled relative to the row's max, so they
// cannot overflow to inf - inf); a huge one is uniform, never NaN.
TEST(SamplerTest, TinyTemperatureIsGreedyAndHugeIsUniform) {
  // The most likely token first, and logits of both signs, as a model's are.
  std::vector<double> p = {0.4, 0.1, 0.3, 0.2};
  std::vector<float> logits = LogitsFromProbs(p);
  for (float& l : logits) l += 1.5f;
  sampling::SamplingParams params;
  params.do_sample = true;
  for (float t : {1e-45f, 1e-38f, 1e-6f}) {
    params.temperature = t;
    auto h = Histogram(params, logits, 200);
    EXPECT_EQ(h[0], 200) << "temperature " << t;
  }
  params.temperature = 3e38f;
  const int n = 8000;
  auto h = Histogram(params, logits, n);
  for (int c : h) EXPECT_NEAR(c, n / 4.0, 5 * std::sqrt(n * 0.25 * 0.75));
}

TEST(SamplerTest, TopKAndTopPRestrictTheSupport) {
  std::vector<double> p = {0.05, 0.15, 0.3, 0.5};
  sampling::SamplingParams params;
  params.do_sample = true;
  params.top_k = 2;
  auto h = Histogram(params, LogitsFromProbs(p), 5000);
  EXPECT_EQ(h[0] + h[1], 0);
  EXPECT_GT(h[2], 0);
  params.top_k = 0;
  params.top_p = 0.75f;  // 0.5 + 0.3 reaches 0.75: tokens 3 and 2 only
  h = Histogram(params, LogitsFromProbs(p), 5000);
  EXPECT_EQ(h[0] + h[1], 0);
  EXPECT_GT(h[2], 1000);
  params.top_p = 0.4f;  // the top token alone
  h = Histogram(params, LogitsFromProbs(p), 1000);
  EXPECT_EQ(h[3], 1000);
}

// top_p near 0 keeps only the most likely token; top_k at or beyond the vocabulary is no limit
// (the same draws as top_k = 0 under the same seed).
TEST(SamplerTest, TopPNearZeroIsGreedyAndTopKBeyondTheVocabularyIsNoLimit) {
  std::vector<double> p = {0.2, 0.35, 0.3, 0.15};
  sampling::SamplingParams params;
  params.do_sample = true;
  for (float top_p : {1e-30f, std::numeric_limits<float>::denorm_min(), 1e-3f}) {
    params.top_p = top_p;
    auto h = Histogram(params, LogitsFromProbs(p), 500);
    EXPECT_EQ(h[1], 500) << "top_p " << top_p;
  }
  params.top_p = 1.f;
  params.seed = 11;
  const std::vector<int> unlimited = Histogram(params, LogitsFromProbs(p), 2000);
  for (int32_t k : {4, 5, 1000, std::numeric_limits<int32_t>::max()}) {
    params.top_k = k;
    EXPECT_EQ(Histogram(params, LogitsFromProbs(p), 2000), unlimited) << "top_k " << k;
  }
}

// Masked (-inf) tokens are never chosen while a finite one remains, greedy or sampled; a row
// with nothing finite to choose from, a NaN or a +inf is an error naming it, not a token.
TEST(SamplerTest, MaskedTokensAreNeverChosenAndABrokenRowIsAnError) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> logits = {-inf, 0.5f, -inf, 0.2f, -inf};
  for (bool sample : {false, true}) {
    sampling::SamplingParams params;
    params.do_sample = sample;
    params.top_n = 5;
    params.top_k = sample ? 4 : 0;
    params.repetition_penalty = 1.3f;
    sampling::Sampler s(params);
    for (int i = 0; i < 200; ++i) {
      StatusOr<sampling::TokenChoice> c = s.Choose(logits.data(), 5, {1});
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      EXPECT_TRUE(c->id == 1 || c->id == 3) << c->id;
      EXPECT_TRUE(std::isfinite(c->logprob));
    }
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Broken {
    std::vector<float> row;
    const char* says;
  };
  const std::vector<Broken> broken = {
      {{-inf, -inf, -inf}, "every logit of the row is -inf"},
      {{0.1f, nan, 0.3f}, "token id 1"},
      {{0.1f, 0.2f, inf}, "token id 2"},
  };
  for (bool sample : {false, true}) {
    sampling::SamplingParams params;
    params.do_sample = sample;
    sampling::Sampler s(params);
    for (const Broken& b : broken) {
      StatusOr<sampling::TokenChoice> c = s.Choose(b.row.data(), 3, {});
      ASSERT_FALSE(c.ok()) << b.says;
      EXPECT_EQ(c.status().code(), StatusCode::kInternal);
      EXPECT_NE(c.status().message().find(b.says), std::string::npos) << c.status().message();
    }
  }
}

TEST(SamplerTest, SeedMakesSamplingReproducible) {
  std::vector<float> logits(100);
  for (int i = 0; i < 100; ++i) logits[i] = std::sin(i * 0.37f);
  sampling::SamplingParams params;
  params.do_sample = true;
  params.seed = 42;
  sampling::Sampler a(params), b(params);
  params.seed = 43;
  sampling::Sampler c(params);
  bool differs = false;
  for (int i = 0; i < 50; ++i) {
    int x = a.Choose(logits.data(), 100, {})->id;
    EXPECT_EQ(x, b.Choose(logits.data(), 100, {})->id);
    differs |= x != c.Choose(logits.data(), 100, {})->id;
  }
  EXPECT_TRUE(differs);
}

TEST(SamplerTest, RepetitionPenaltyDemotesSeenTokens) {
  std::vector<float> logits = {1.0f, 3.0f, 2.9f, -1.0f};
  sampling::SamplingParams params;
  params.repetition_penalty = 1.5f;
  sampling::Sampler s(params);
  EXPECT_EQ(s.Choose(logits.data(), 4, {1, 1, 1})->id, 2);  // 3/1.5 = 2 < 2.9, penalised once
  logits = {-1.0f, -0.5f, -0.6f, -3.0f};
  EXPECT_EQ(s.Choose(logits.data(), 4, {1})->id, 2);  // negative: -0.5 * 1.5 = -0.75 < -0.6
}

// Presence and frequency penalties (over the generated tokens only) and a logit bias, against a
// plain reference on fresh random rows and histories: greedy picks the reference's argmax, and
// sampling's draws follow the reference's distribution (a fixed seed gives the same draws as a
// sampler fed the reference's adjusted row with no adjustments).
TEST(SamplerTest, PresenceFrequencyAndLogitBiasMatchAPlainReference) {
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> n(0.f, 2.f);
  std::uniform_int_distribution<int32_t> tok(0, 39);
  for (int trial = 0; trial < 200; ++trial) {
    const int32_t vocab = 40;
    std::vector<float> row(vocab);
    for (float& x : row) x = n(rng);
    std::vector<int32_t> history(1 + trial % 17);
    for (int32_t& t : history) t = tok(rng);
    sampling::SamplingParams p;
    p.presence_penalty = std::uniform_real_distribution<float>(-2.f, 2.f)(rng);
    p.frequency_penalty = std::uniform_real_distribution<float>(-2.f, 2.f)(rng);
    p.output_start = history.size() / 2;
    p.logit_bias = {{tok(rng), 5.f}, {tok(rng), -100.f}};
    std::sort(p.logit_bias.begin(), p.logit_bias.end());
    p.logit_bias.erase(std::unique(p.logit_bias.begin(), p.logit_bias.end(),
                                   [](auto& a, auto& b) { return a.first == b.first; }),
                       p.logit_bias.end());
    // Reference: count the generated ids, subtract, add the biases.
    std::vector<float> ref = row;
    std::map<int32_t, int> counts;
    for (size_t i = p.output_start; i < history.size(); ++i) ++counts[history[i]];
    for (auto [id, c] : counts) ref[id] -= p.presence_penalty + p.frequency_penalty * c;
    for (auto [id, b] : p.logit_bias) ref[id] += b;
    const int32_t want = static_cast<int32_t>(std::max_element(ref.begin(), ref.end()) - ref.begin());
    sampling::Sampler greedy(p);
    sampling::TokenChoice c = greedy.Choose(row.data(), vocab, history).value();
    EXPECT_EQ(c.id, want) << "trial " << trial;
    // The reported log-probability is the model's own (the raw row's log_softmax).
    double mx = *std::max_element(row.begin(), row.end()), sum = 0;
    for (float x : row) sum += std::exp(x - mx);
    EXPECT_NEAR(c.logprob, row[c.id] - (mx + std::log(sum)), 1e-4);
    // Sampling: the same draws as a plain sampler given the adjusted row.
    p.do_sample = true;
    p.seed = static_cast<uint64_t>(trial);
    sampling::SamplingParams plain;
    plain.do_sample = true;
    plain.seed = p.seed;
    sampling::Sampler a(p), b(plain);
    for (int d = 0; d < 5; ++d) {
      EXPECT_EQ(a.Choose(row.data(), vocab, history)->id, b.Choose(ref.data(), vocab, {})->id)
          << "trial " << trial << " draw " << d;
    }
  }
}

TEST(SamplerTest, TopNAlternativesAreSortedLogprobs) {
  std::vector<float> logits = {0.1f, 0.9f, 0.5f, 0.7f, -2.f};
  sampling::SamplingParams params;
  params.top_n = 3;
  sampling::Sampler s(params);
  sampling::TokenChoice c = s.Choose(logits.data(), 5, {}).value();
  ASSERT_EQ(c.top.size(), 3u);
  EXPECT_EQ(c.top[0].first, 1);
  EXPECT_EQ(c.top[1].first, 3);
  EXPECT_EQ(c.top[2].first, 2);
  EXPECT_FLOAT_EQ(c.top[0].second, c.logprob);
  EXPECT_GT(c.top[1].second, c.top[2].second);
}

TEST(SamplerTest, ValidateNamesTheField) {
  struct Case {
    sampling::SamplingParams p;
    const char* field;
  };
  std::vector<Case> cases(8);
  cases[0].p.temperature = -1;
  cases[0].field = "temperature";
  cases[1].p.top_p = 0;
  cases[1].field = "top_p";
  cases[2].p.top_k = -3;
  cases[2].field = "top_k";
  cases[3].p.repetition_penalty = 0;
  cases[3].field = "repetition_penalty";
  cases[4].p.top_n = 99;
  cases[4].field = "top_n";
  cases[5].p.presence_penalty = 2.5f;
  cases[5].field = "presence_penalty";
  cases[6].p.frequency_penalty = -3.f;
  cases[6].field = "frequency_penalty";
  cases[7].p.logit_bias = {{3, 101.f}};
  cases[7].field = "logit_bias";
  for (const Case& c : cases) {
    Status s = c.p.Validate();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(c.field), std::string::npos) << s.message();
  }
  EXPECT_TRUE(sampling::SamplingParams{}.Validate().ok());
}

// A row's top candidates (log_softmax then the k best, ties to the lower id), as a device returns
// them (model::StepResult::top_*).
void TopCandidates(const std::vector<float>& row, int32_t k, std::vector<float>* lp,
                   std::vector<int32_t>* ids) {
  double mx = *std::max_element(row.begin(), row.end()), sum = 0;
  for (float x : row) sum += std::exp(x - mx);
  const double lse = mx + std::log(sum);
  std::vector<int32_t> order(row.size());
  for (size_t i = 0; i < row.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return row[a] > row[b] || (row[a] == row[b] && a < b);
  });
  lp->clear();
  ids->assign(order.begin(), order.begin() + k);
  for (int32_t id : *ids) lp->push_back(static_cast<float>(row[id] - lse));
}

// From a device's top candidates the sampler chooses what it chooses from the whole row: greedy,
// and top-k sampling with top-p (the same RNG draws), on fresh random rows with ties.
TEST(SamplerTest, ChoosingFromTopCandidatesEqualsTheWholeRow) {
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> n(0.f, 3.f);
  constexpr int32_t kVocab = 5000, kK = 64;
  std::vector<sampling::SamplingParams> modes(3);
  modes[0].top_n = 5;
  modes[1].do_sample = true;
  modes[1].top_k = 40;
  modes[1].temperature = 0.7f;
  modes[1].seed = 11;
  modes[2] = modes[1];
  modes[2].top_p = 0.6f;
  modes[2].top_n = 3;
  for (const auto& params : modes) {
    sampling::Sampler whole(params), top(params);
    ASSERT_TRUE(top.CanChooseFromTop(kK));
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<float> row(kVocab);
      for (float& x : row) x = std::round(n(rng) * 4.f) / 4.f;  // coarse values: many ties
      std::vector<float> lp;
      std::vector<int32_t> ids;
      TopCandidates(row, kK, &lp, &ids);
      auto a = whole.Choose(row.data(), kVocab, {});
      auto b = top.ChooseFromTop(lp.data(), ids.data(), kK);
      ASSERT_TRUE(a.ok() && b.ok());
      ASSERT_EQ(a->id, b->id) << "trial " << trial;
      EXPECT_NEAR(a->logprob, b->logprob, 1e-5);
      ASSERT_EQ(a->top.size(), b->top.size());
      for (size_t i = 0; i < a->top.size(); ++i) {
        EXPECT_EQ(a->top[i].first, b->top[i].first);
        EXPECT_NEAR(a->top[i].second, b->top[i].second, 1e-5);
      }
    }
  }
}

TEST(SamplerTest, TopCandidatesAreRefusedWhereTheyDoNotDecide) {
  sampling::SamplingParams p;
  p.repetition_penalty = 1.2f;
  EXPECT_FALSE(sampling::Sampler(p).CanChooseFromTop(64));
  p = {};
  p.do_sample = true;  // top_k off: the whole vocabulary
  EXPECT_FALSE(sampling::Sampler(p).CanChooseFromTop(64));
  p.top_k = 65;
  EXPECT_FALSE(sampling::Sampler(p).CanChooseFromTop(64));
  p.top_k = 64;
  EXPECT_TRUE(sampling::Sampler(p).CanChooseFromTop(64));
  p.logit_bias = {{5, 1.f}};
  EXPECT_FALSE(sampling::Sampler(p).CanChooseFromTop(64));
  p.logit_bias.clear();
  p.presence_penalty = 0.5f;
  EXPECT_FALSE(sampling::Sampler(p).CanChooseFromTop(64));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int32_t id = 3;
  EXPECT_EQ(sampling::Sampler({}).ChooseFromTop(&nan, &id, 1).status().code(),
            StatusCode::kInternal);
}

}  // namespace
}  // namespace deja::worker
