// Important-token loading's choice (worker/prefix/importance.h) against a plain reference on
// random keys and queries, its Jaccard test by hand, and the masking of the tokens left out.
#include "worker/prefix/importance.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "kernels/backend.h"
#include "tests/comm/tp_util.h"
#include "worker/model/model.h"

namespace deja::worker::prefix {
namespace {

constexpr int32_t kHeads = 4, kDim = 8;

// A contiguous host cache of `prefix` slots per head (slot == position).
struct Cache {
  explicit Cache(int32_t prefix)
      : n(prefix),
        k(static_cast<size_t>(kHeads) * prefix * kDim),
        pos(static_cast<size_t>(kHeads) * prefix) {
    for (int32_t h = 0; h < kHeads; ++h) {
      for (int32_t s = 0; s < prefix; ++s) pos[static_cast<size_t>(h) * prefix + s] = s;
    }
  }
  kernels::KvView View() {
    kernels::KvView v;
    v.k = k.data();
    v.v = k.data();
    v.dtype = DType::kF32;
    v.slot_pos = pos.data();
    v.capacity = n;
    v.used = n;
    return v;
  }
  float* key(int32_t h, int32_t s) { return k.data() + (static_cast<size_t>(h) * n + s) * kDim; }
  int32_t n;
  std::vector<float> k;
  std::vector<int32_t> pos;
};

// The reference: doubles, one head at a time.
std::vector<int32_t> TopK(Cache& c, const std::vector<float>& q, int32_t rows, int32_t h, int32_t k,
                          float scale, std::vector<double>* importance = nullptr) {
  std::vector<double> imp(c.n, 0.0);
  for (int32_t i = 0; i < rows; ++i) {
    std::vector<double> l(c.n);
    for (int32_t s = 0; s < c.n; ++s) {
      double dot = 0;
      for (int32_t d = 0; d < kDim; ++d) {
        dot += static_cast<double>(q[(static_cast<size_t>(i) * kHeads + h) * kDim + d]) *
               c.key(h, s)[d];
      }
      l[s] = dot * scale;
    }
    const double most = *std::max_element(l.begin(), l.end());
    double sum = 0;
    for (double x : l) sum += std::exp(x - most);
    for (int32_t s = 0; s < c.n; ++s) imp[s] += std::exp(l[s] - most) / sum;
  }
  std::vector<int32_t> order(c.n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return imp[a] > imp[b]; });
  std::vector<int32_t> set(order.begin(), order.begin() + k);
  std::sort(set.begin(), set.end());
  if (importance != nullptr) *importance = imp;
  return set;
}

// `got` is a top k of `imp` up to float rounding: k tokens, none of them less important than a
// token left out by more than 1e-5 of the summed importance (the fast path sums in float).
void ExpectTopK(const std::vector<int32_t>& got, const std::vector<double>& imp, int32_t k) {
  ASSERT_EQ(got.size(), static_cast<size_t>(k));
  double total = 0, least_kept = 1e300, most_dropped = -1e300;
  for (size_t s = 0; s < imp.size(); ++s) {
    total += imp[s];
    if (std::binary_search(got.begin(), got.end(), static_cast<int32_t>(s))) {
      least_kept = std::min(least_kept, imp[s]);
    } else {
      most_dropped = std::max(most_dropped, imp[s]);
    }
  }
  EXPECT_GE(least_kept, most_dropped - 1e-5 * total);
}

TEST(ImportanceTest, ThresholdAndJaccardByHand) {
  // k/n = 0.5: two random halves share a third of their union on average.
  EXPECT_NEAR(JaccardThreshold(0.5, 1.0), 1.0 / 3.0, 1e-12);
  EXPECT_NEAR(JaccardThreshold(0.5, 0.6), std::pow(1.0 / 3.0, 0.6), 1e-12);
  EXPECT_NEAR(JaccardThreshold(0.2, 0.6), std::pow(0.2 / 1.8, 0.6), 1e-12);
  EXPECT_DOUBLE_EQ(Jaccard({1, 2, 3}, {2, 3, 4}), 0.5);
  EXPECT_DOUBLE_EQ(Jaccard({1, 2}, {1, 2}), 1.0);
  EXPECT_DOUBLE_EQ(Jaccard({1}, {2}), 0.0);
  ImportanceOptions o;
  EXPECT_TRUE(o.Validate(4).ok());
  o.kept_fraction = 0;
  EXPECT_EQ(o.Validate(4).code(), StatusCode::kInvalidArgument);
  o = ImportanceOptions();
  o.probe_heads = {0, 9};
  EXPECT_EQ(o.Validate(4).code(), StatusCode::kInvalidArgument);
}

// Heads that share their keys agree: every head keeps the reference's top k of the probes.
// Independent random heads disagree at a small kept fraction: the layer keeps everything.
TEST(ImportanceTest, AgreeingProbesKeepTheReferenceTopKAndDisagreeingOnesFallBack) {
  std::mt19937 rng(3);
  std::normal_distribution<float> g(0.f, 1.f);
  for (int trial = 0; trial < 20; ++trial) {
    const int32_t n = 24 + trial, rows = 1 + trial % 5;
    Cache c(n);
    for (float& x : c.k) x = g(rng);
    for (int32_t h = 1; h < kHeads; ++h) {  // shared keys: the heads see the same tokens
      for (int32_t s = 0; s < n; ++s) std::copy(c.key(0, s), c.key(0, s) + kDim, c.key(h, s));
    }
    std::vector<float> q(static_cast<size_t>(rows) * kHeads * kDim);
    for (int32_t i = 0; i < rows; ++i) {
      for (int32_t d = 0; d < kDim; ++d) {
        const float x = 2.f * g(rng);
        for (int32_t h = 0; h < kHeads; ++h)
          q[(static_cast<size_t>(i) * kHeads + h) * kDim + d] = x;
      }
    }
    ImportanceOptions o;
    o.kept_fraction = 0.25f;
    const float scale = 1.f / std::sqrt(static_cast<float>(kDim));
    StatusOr<LayerChoice> ch =
        ChooseImportant(c.View(), n, q.data(), kHeads * kDim, rows, kHeads, kDim, scale, o);
    ASSERT_TRUE(ch.ok()) << ch.status().ToString();
    EXPECT_FALSE(ch->fallback);
    EXPECT_NEAR(ch->mean_jaccard, 1.0, 1e-12);
    const int32_t k = static_cast<int32_t>(std::lround(0.25 * n));
    std::vector<double> imp;
    const std::vector<int32_t> want = TopK(c, q, rows, 0, k, scale, &imp);
    if (ch->kept != want) {
      SCOPED_TRACE("trial " + std::to_string(trial) + ": a near tie chosen differently");
      ExpectTopK(ch->kept, imp, k);
    }
    EXPECT_EQ(ch->kept.size(), want.size());
    KeepOnly(c.View(), n, kHeads, ch->kept);
    for (int32_t h = 0; h < kHeads; ++h) {
      for (int32_t s = 0; s < n; ++s) {
        const bool kept = std::binary_search(ch->kept.begin(), ch->kept.end(), s);
        EXPECT_EQ(c.pos[static_cast<size_t>(h) * n + s], kept ? s : -1);
      }
    }
  }
  // Independent heads, one sharp query each: their top 10% barely overlap.
  int fallbacks = 0;
  for (int trial = 0; trial < 20; ++trial) {
    const int32_t n = 200;
    Cache c(n);
    for (float& x : c.k) x = g(rng);
    std::vector<float> q(static_cast<size_t>(kHeads) * kDim);
    for (float& x : q) x = 3.f * g(rng);
    ImportanceOptions o;
    o.kept_fraction = 0.1f;
    StatusOr<LayerChoice> ch = ChooseImportant(c.View(), n, q.data(), kHeads * kDim, 1, kHeads,
                                               kDim, 1.f / std::sqrt(8.f), o);
    ASSERT_TRUE(ch.ok());
    if (ch->fallback) {
      ++fallbacks;
      EXPECT_EQ(ch->kept.size(), static_cast<size_t>(n));
    }
  }
  EXPECT_GE(fallbacks, 18);
}

// In the model: keeping every token (k = n) changes nothing; at 50% with a test that always
// passes, layer 0 (dense) keeps the whole prefix, every later layer and head keeps exactly half,
// the same set in every head, and the step still gives finite log-probabilities.
TEST(ImportanceModelTest, TheModelKeepsWhatTheProbesChoose) {
  auto backend = kernels::MakeCpuBackend(1);
  model::LoadOptions lo;
  lo.kv_memory_bytes = 16ll << 20;
  lo.kv_paged = true;
  auto m =
      model::LoadModel(test_util::ModelDir(test_util::TpModelName()), backend.get(), nullptr, lo);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  model::Model& model = **m;
  const int32_t bs = model.kv_block_slots();
  std::vector<int32_t> prefix(2 * bs), tail(9);
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> tok(4,
                                             static_cast<int32_t>(model.config().vocab_size) - 1);
  for (int32_t& t : prefix) t = tok(rng);
  for (int32_t& t : tail) t = tok(rng);
  auto pre = model.NewSequence(static_cast<int32_t>(prefix.size()));
  ASSERT_TRUE(pre.ok());
  model::StepResult step;
  ASSERT_TRUE(model.Forward({{pre->get(), prefix.data(), 2 * bs, false}}, &step).ok());
  auto run = [&](float kept, float alpha, std::unique_ptr<kv::SequenceKv>* out) {
    ImportanceOptions o;
    o.kept_fraction = kept;
    o.alpha = alpha;
    EXPECT_TRUE(model.SetPrefixImportance(o).ok());
    auto kv = model.NewSequence(2 * bs + 9);
    EXPECT_TRUE(kv.ok());
    EXPECT_TRUE((*kv)->SeedPrefix({(*pre)->pool_block(0), (*pre)->pool_block(1)}, false).ok());
    (*kv)->SetImportantPrefix(2 * bs);
    model::StepResult r;
    EXPECT_TRUE(model.Forward({{kv->get(), tail.data(), 9, true}}, &r).ok());
    *out = std::move(*kv);
    return std::vector<float>(r.logits.as<float>(),
                              r.logits.as<float>() + 9 * model.config().vocab_size);
  };
  std::unique_ptr<kv::SequenceKv> plain_kv, all_kv, half_kv;
  auto plain = [&] {
    auto kv = model.NewSequence(2 * bs + 9);
    EXPECT_TRUE((*kv)->SeedPrefix({(*pre)->pool_block(0), (*pre)->pool_block(1)}, false).ok());
    model::StepResult r;
    EXPECT_TRUE(model.Forward({{kv->get(), tail.data(), 9, true}}, &r).ok());
    return std::vector<float>(r.logits.as<float>(),
                              r.logits.as<float>() + 9 * model.config().vocab_size);
  }();
  EXPECT_EQ(run(1.0f, 0.6f, &all_kv), plain);
  model.TakeImportanceStats();
  const std::vector<float> half = run(0.5f, 50.0f, &half_kv);  // t = (1/3)^50: always passes
  for (float x : half) ASSERT_TRUE(std::isfinite(x));
  EXPECT_NE(half, plain);
  const model::Model::ImportanceStats st = model.TakeImportanceStats();
  const int32_t layers = static_cast<int32_t>(model.config().num_hidden_layers);
  const int32_t heads = half_kv->geometry().heads;
  for (int32_t l = 0; l < layers; ++l) {
    const kernels::KvView v = half_kv->View(l);
    std::vector<int32_t> first;
    for (int32_t h = 0; h < heads; ++h) {
      std::vector<int32_t> kept;
      for (int32_t s = 0; s < 2 * bs; ++s) {
        if (v.slot_pos[kernels::KvSlotIndex(v, h, s)] >= 0) kept.push_back(s);
      }
      EXPECT_EQ(kept.size(), static_cast<size_t>(l == 0 ? 2 * bs : bs)) << "layer " << l;
      if (h == 0) first = kept;
      EXPECT_EQ(kept, first) << "layer " << l << " head " << h;
    }
    if (l > 0) EXPECT_EQ(st.chosen[l], 1) << "layer " << l;
  }
}

}  // namespace
}  // namespace deja::worker::prefix
