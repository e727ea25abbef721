// H2O end to end on the fixture model: the fast path (OptModel, SequenceKv, CPU kernels) equals
// the plain reference decode loop in tokens and log-probs; mixed policies share one batch; KV
// memory stays bounded for sequences far longer than the budget.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "kernels/backend.h"
#include "tests/common/sim_device.h"
#include "tests/worker/golden_util.h"
#include "tests/worker/h2o_reference.h"
#include "worker/kv/policy_table.h"
#include "worker/model/generation.h"
#include "worker/model/model.h"

namespace deja::worker {
namespace {

using test_util::ModelDir;

constexpr float kLogprobTol = 1e-4f;

// Parameter: the device (tests/common/sim_device.h). On devices, eviction victims are chosen by
// the backend's KvEvict op, so these tests hold it to the host policies.
class H2OTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto b = test_util::MakeTestBackend(GetParam());
    if (!b.ok()) GTEST_SKIP() << GetParam() << ": " << b.status().ToString();
    backend_ = std::move(*b);
    model::LoadOptions options;
    // A GPU's KV pool: 256 MiB, not 80% of its memory per test (the simulated device's 16 MiB
    // are small enough).
    if (GetParam() == "cuda") options.kv_memory_bytes = 256ll << 20;
    options.weight_dtype = test_util::ExactWeightDType(GetParam());
    auto m = model::LoadModel(ModelDir("opt-mini"), backend_.get(), nullptr, options);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    model_ = std::move(*m);
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

  void ExpectMatchesReference(const std::vector<int32_t>& prompt, int32_t heavy, int32_t recent,
                              int32_t steps, float decay = 1.0f,
                              std::vector<int32_t>* ids = nullptr) {
    auto ref = ReferenceH2O::Load(ModelDir("opt-mini"), heavy, recent);
    ASSERT_TRUE(ref.ok()) << ref.status().ToString();
    (*ref)->set_decay(decay);
    std::vector<int32_t> want_ids;
    std::vector<float> want_lp;
    ASSERT_TRUE((*ref)->Greedy(prompt, steps, &want_ids, &want_lp).ok());

    model::GenerationOptions opt;
    opt.max_new_tokens = steps;
    opt.stop_at_eos = false;
    opt.prefill_chunk = static_cast<int32_t>(prompt.size());
    if (heavy >= 0) {
      opt.cache.kind = kv::CachePolicyKind::kH2O;
      opt.cache.heavy_tokens = heavy;
      opt.cache.recent_tokens = recent;
      opt.cache.h2o_decay = decay;
    }
    auto r = Generate(*model_, prompt, opt);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->tokens.size(), want_ids.size());
    for (size_t i = 0; i < want_ids.size(); ++i) {
      ASSERT_EQ(r->tokens[i].id, want_ids[i]) << "step " << i;
      EXPECT_NEAR(r->tokens[i].logprob, want_lp[i], kLogprobTol) << "step " << i;
    }
    if (heavy >= 0) {
      EXPECT_GT(r->evictions, 0);
    }
    if (ids != nullptr) *ids = want_ids;
  }

  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<model::Model> model_;
};

TEST_P(H2OTest, FastPathEqualsReferenceOnRealText) {
  ExpectMatchesReference(RealPrompt(), /*heavy=*/16, /*recent=*/16, /*steps=*/24);
}

TEST_P(H2OTest, FastPathEqualsReferenceOnRandomTokensWithTinyBudget) {
  ExpectMatchesReference(RandomPrompt(120, 5), /*heavy=*/4, /*recent=*/3, /*steps=*/24);
}

// Decayed scores (CachePolicy.score_decay): on a device the paged cache's KvEvict decays them,
// every step, evicting or not; on the CPU, SequenceKv does. The decay changes which tokens stay.
TEST_P(H2OTest, DecayedScoresEqualReference) {
  std::vector<int32_t> decayed, summed;
  ExpectMatchesReference(RealPrompt(), /*heavy=*/4, /*recent=*/12, /*steps=*/24, 0.6f, &decayed);
  ExpectMatchesReference(RealPrompt(), /*heavy=*/4, /*recent=*/12, /*steps=*/24, 1.0f, &summed);
  EXPECT_NE(decayed, summed);
}

// Decayed H2O whose cache holds no more than its budget for the first 44 steps (a 4-token prompt,
// budgets of 8 + 40): those steps decay and evict nothing, so a paged cache has no victim buffer
// yet (it once failed the step, and with it every sequence of the worker group: "kv_evict:
// argument 'victims' is null"); later steps evict.
TEST_P(H2OTest, DecayWithinTheBudgetEqualsReference) {
  ExpectMatchesReference(RandomPrompt(4, 11), /*heavy=*/8, /*recent=*/40, /*steps=*/60, 0.6f);
}

// The same request gives the same tokens, and log-probabilities within 1e-5 (the GEMMs of a
// 5-token chunk and of a whole prompt round differently), however its prompt is split into
// prefill steps (a server's prefill budget and its other requests decide the split): window and
// H2O caches attend to the whole prompt and evict once it is in. (Evicting after each step, as
// before, changed tokens.)
TEST_P(H2OTest, PrefillSplitsChangeNothing) {
  const std::vector<int32_t> prompt = RealPrompt();
  ASSERT_GT(prompt.size(), 100u);
  struct Case {
    kv::CachePolicyKind kind;
    float decay;
  };
  for (const Case& c : {Case{kv::CachePolicyKind::kWindow, 1.0f},
                        Case{kv::CachePolicyKind::kH2O, 1.0f}, Case{kv::CachePolicyKind::kH2O, 0.6f}}) {
    model::GenerationOptions opt;
    opt.max_new_tokens = 16;
    opt.stop_at_eos = false;
    opt.cache.kind = c.kind;
    opt.cache.heavy_tokens = c.kind == kv::CachePolicyKind::kH2O ? 6 : 0;
    opt.cache.recent_tokens = 10;
    opt.cache.h2o_decay = c.decay;
    opt.prefill_chunk = static_cast<int32_t>(prompt.size());
    auto whole = Generate(*model_, prompt, opt);
    ASSERT_TRUE(whole.ok()) << whole.status().ToString();
    EXPECT_GT(whole->evictions, 0);
    for (int32_t chunk : {5, 64}) {
      opt.prefill_chunk = chunk;
      auto split = Generate(*model_, prompt, opt);
      ASSERT_TRUE(split.ok()) << split.status().ToString();
      ASSERT_EQ(split->tokens.size(), whole->tokens.size());
      for (size_t i = 0; i < whole->tokens.size(); ++i) {
        EXPECT_EQ(split->tokens[i].id, whole->tokens[i].id)
            << kv::CachePolicyName(c.kind) << " decay " << c.decay << " chunk " << chunk
            << " token " << i;
        EXPECT_NEAR(split->tokens[i].logprob, whole->tokens[i].logprob, 1e-5f)
            << kv::CachePolicyName(c.kind) << " decay " << c.decay << " chunk " << chunk
            << " token " << i;
      }
      EXPECT_EQ(split->evictions, whole->evictions);
    }
  }
}

TEST_P(H2OTest, ReferenceWithoutEvictionEqualsFullCache) {
  ExpectMatchesReference(RandomPrompt(40, 6), -1, -1, 8);
}

// full, window and h2o sequences in one batch each give what they give alone.
TEST_P(H2OTest, MixedPoliciesInOneBatch) {
  const int64_t vocab = model_->config().vocab_size;
  std::vector<kv::CachePolicyConfig> policies(3);
  policies[1].kind = kv::CachePolicyKind::kWindow;
  policies[2].kind = kv::CachePolicyKind::kH2O;
  std::vector<std::vector<int32_t>> prompts = {RandomPrompt(50, 1), RandomPrompt(70, 2),
                                               RandomPrompt(90, 3)};
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
  for (int step = 0; step < 20; ++step) {
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

// A device's decode step runs every sequence's KV write and attention as one DecodeAttention
// call per layer (metadata uploaded once per step); the same model loaded to attend one sequence
// at a time gives the same logits (bit for bit where both paths run the same kernels: the
// simulated device) over mixed policies and lengths (full, window, h2o with and without decay,
// sequences joining and leaving), and the batched path is the one the steps took.
TEST_P(H2OTest, BatchedDecodeEqualsPerSequenceDecode) {
  if (GetParam() == "cpu") {
    GTEST_SKIP() << "host backends attend one sequence per pool thread; no DecodeAttention";
  }
  model::LoadOptions options;
  if (GetParam() == "cuda") options.kv_memory_bytes = 256ll << 20;
  options.weight_dtype = test_util::ExactWeightDType(GetParam());
  options.batched_decode_attention = false;
  auto loaded = model::LoadModel(ModelDir("opt-mini"), backend_.get(), nullptr, options);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  model::Model& per_seq = **loaded;
  const int64_t vocab = model_->config().vocab_size;
  std::vector<kv::CachePolicyConfig> policies(5);
  policies[1].kind = kv::CachePolicyKind::kWindow;
  policies[2].kind = kv::CachePolicyKind::kH2O;
  policies[3].kind = kv::CachePolicyKind::kH2O;
  policies[3].h2o_decay = 0.7f;
  policies[3].heavy_tokens = 3;
  policies[3].recent_tokens = 4;
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < policies.size(); ++i) {
    prompts.push_back(RandomPrompt(10 + 37 * static_cast<int>(i), 40 + static_cast<uint32_t>(i)));
  }
  struct Pair {
    std::unique_ptr<kv::SequenceKv> batched, alone;
  };
  std::vector<Pair> seqs(policies.size());
  for (size_t i = 0; i < policies.size(); ++i) {
    const int32_t n = static_cast<int32_t>(prompts[i].size());
    auto a = model_->NewSequence(260, policies[i], n, n);
    auto b = per_seq.NewSequence(260, policies[i], n, n);
    ASSERT_TRUE(a.ok() && b.ok());
    seqs[i] = {std::move(*a), std::move(*b)};
  }
  // Each sequence's prompt alone, then decode steps over those still running: sequence 4 joins
  // at step 6 (its prompt in a step of its own), sequence 0 leaves after step 12.
  model::StepResult ra, rb;
  auto prefill = [&](size_t i) {
    const int32_t n = static_cast<int32_t>(prompts[i].size());
    ASSERT_TRUE(model_->Forward({{seqs[i].batched.get(), prompts[i].data(), n, false}}, &ra).ok());
    ASSERT_TRUE(per_seq.Forward({{seqs[i].alone.get(), prompts[i].data(), n, false}}, &rb).ok());
  };
  for (size_t i = 0; i < 4; ++i) prefill(i);
  const int64_t before = model_->batched_decode_steps();
  std::vector<size_t> running = {0, 1, 2, 3};
  for (int step = 0; step < 24; ++step) {
    if (step == 6) {
      prefill(4);
      running.push_back(4);
    }
    if (step == 13) running.erase(running.begin());
    std::vector<model::SequenceStep> ba, bb;
    for (size_t i : running) {
      prompts[i].push_back(static_cast<int32_t>(100 + 7 * step + 13 * i));
      ba.push_back({seqs[i].batched.get(), &prompts[i].back(), 1, false});
      bb.push_back({seqs[i].alone.get(), &prompts[i].back(), 1, false});
    }
    ASSERT_TRUE(model_->Forward(ba, &ra).ok());
    ASSERT_TRUE(per_seq.Forward(bb, &rb).ok());
    for (size_t j = 0; j < running.size(); ++j) {
      const float* got = ra.logits.as<float>() + j * vocab;
      const float* want = rb.logits.as<float>() + j * vocab;
      if (GetParam() == "sim") {
        ASSERT_EQ(0, std::memcmp(got, want, vocab * sizeof(float)))
            << "sequence " << running[j] << " step " << step;
      } else {
        std::vector<double> w(want, want + vocab);
        ASSERT_LE(test_util::RelError(got, w), 1e-5)
            << "sequence " << running[j] << " step " << step;
      }
    }
  }
  EXPECT_EQ(model_->batched_decode_steps() - before, 24);
  EXPECT_EQ(per_seq.batched_decode_steps(), 0);
  for (size_t i = 1; i < 4; ++i) {
    EXPECT_GT(seqs[i].batched->evictions(), 0) << i;
    EXPECT_EQ(seqs[i].batched->evictions(), seqs[i].alone->evictions()) << i;
  }
}

// A sequence runs to the position limit on a budget of 20 slots per head: the allocation never
// changes after the prefill and the cached slots never exceed the budget.
TEST_P(H2OTest, MemoryBoundedToThePositionLimit) {
  if (GetParam() == "sim") {
    GTEST_SKIP() << "a minute of simulated-device decode steps; the other cases cover device "
                    "eviction, and cpu and cuda run this one";
  }
  const int32_t limit = static_cast<int32_t>(model_->config().max_position_embeddings);
  std::vector<int32_t> prompt = RandomPrompt(64, 9);
  model::GenerationOptions opt;
  opt.cache.kind = kv::CachePolicyKind::kH2O;
  opt.cache.heavy_tokens = 10;
  opt.cache.recent_tokens = 10;
  opt.stop_at_eos = false;
  opt.max_new_tokens = limit - static_cast<int32_t>(prompt.size());
  auto r = Generate(*model_, prompt, opt);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(static_cast<int32_t>(r->tokens.size()), opt.max_new_tokens);
  // The host cache shrinks to budget + 1 after the prefill; a device cache keeps budget + chunk
  // slots, in whole 32-slot pool blocks.
  const size_t slots = GetParam() == "cpu" ? 21 : (20 + prompt.size() + 31) / 32 * 32;
  EXPECT_EQ(r->kv_bytes, model_->kv_geometry().SlotBytes() * slots);
  const int64_t heads = model_->config().num_attention_heads * model_->config().num_hidden_layers;
  EXPECT_EQ(r->evictions, heads * (limit - 1 - 20));  // every token past the budget, every head
}

INSTANTIATE_TEST_SUITE_P(Devices, H2OTest, ::testing::ValuesIn(test_util::TestDevices()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace deja::worker
