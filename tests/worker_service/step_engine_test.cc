// StepEngine on one rank (TP 1, in process): prefill (whole and chunked) then decode gives the
// tokens model::Generate gives; several sequences share a step; a bad sequence is refused alone
// (its result carries the error, it is left as it was, the others' tokens do not change); KV
// usage returns to its baseline.
#include "worker/service/step_engine.h"

#include <gtest/gtest.h>

#include <memory>

#include "kernels/backend.h"
#include "tests/comm/tp_util.h"
#include "tests/common/sim_device.h"
#include "tests/worker_service/step_util.h"
#include "worker/model/generation.h"

namespace deja::worker::service {
namespace {

using deja::v1::StepRequest;
using deja::v1::StepResponse;
using test_util::FirstChunk;
using test_util::NextChunk;

constexpr int32_t kNewTokens = 8;

// Parameter: the device (tests/common/sim_device.h). On devices the step's tokens are chosen
// from the device's top candidates unless a sequence needs whole rows.
class StepEngineTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto b = host() ? StatusOr<std::unique_ptr<kernels::Backend>>(kernels::MakeCpuBackend(1))
                    : test_util::MakeTestBackend(GetParam());
    if (!b.ok()) GTEST_SKIP() << GetParam() << ": " << b.status().ToString();
    backend_ = std::move(*b);
    model::LoadOptions options;
    options.kv_memory_bytes = 64ll << 20;  // the KV pool (devices, cpu_paged): the engine's budget
    options.kv_paged = GetParam() == "cpu_paged";
    auto m = model::LoadModel(test_util::ModelDir(test_util::TpModelName()), backend_.get(),
                              nullptr, options);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    model_ = std::move(*m);
    const int64_t pool = model_->kv_pool_bytes();
    auto engine = StepEngine::Create(model_.get(), pool > 0 ? pool : 64ull << 20);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    engine_ = std::move(*engine);
    ASSERT_TRUE(engine_->WarmUp().ok());
    prompts_ = test_util::TpPrompts(test_util::LoadGolden(test_util::TpModelName()));
    ASSERT_GE(prompts_.size(), 2u);
  }

  bool host() const { return GetParam() == "cpu" || GetParam() == "cpu_paged"; }
  bool paged() const { return GetParam() != "cpu"; }
  // What a sequence of `prompt` + `max_new` positions takes once its prompt is in: all of it,
  // without a pool; with one, the whole 32-slot blocks its prompt reaches.
  uint64_t Taken(uint64_t prompt, uint64_t max_new) const {
    const uint64_t positions = paged() ? (prompt + 31) / 32 * 32 : prompt + max_new;
    return engine_->kv_bytes_per_token() * positions;
  }

  StepResponse Run(const StepRequest& req) {
    StepResponse resp;
    Status fatal = engine_->Run(req, &resp);
    EXPECT_TRUE(fatal.ok()) << fatal.ToString();
    return resp;
  }

  // Feeds each sequence's sampled token back until kNewTokens per sequence.
  std::vector<std::vector<int32_t>> Decode(StepResponse resp, std::vector<uint64_t> ids,
                                           std::vector<uint32_t> lengths) {
    std::vector<std::vector<int32_t>> out(ids.size());
    for (int32_t step = 0;; ++step) {
      EXPECT_EQ(resp.error_code(), 0) << resp.error_message();
      EXPECT_EQ(resp.results_size(), static_cast<int>(ids.size()));
      if (resp.error_code() != 0 || resp.results_size() != static_cast<int>(ids.size())) break;
      StepRequest next;
      next.set_step_id(resp.step_id() + 1);
      for (size_t i = 0; i < ids.size(); ++i) {
        EXPECT_EQ(resp.results(i).seq_id(), ids[i]);
        out[i].push_back(resp.results(i).token_id());
        *next.add_sequences() = NextChunk(ids[i], {resp.results(i).token_id()}, lengths[i]++, true);
      }
      if (step + 1 == kNewTokens) break;
      resp = Run(next);
      graph_captures_ += resp.timings().graph_captured() ? 1 : 0;
      graph_replays_ += resp.timings().graph_replayed() ? 1 : 0;
    }
    return out;
  }

  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<StepEngine> engine_;
  std::vector<std::vector<int32_t>> prompts_;
  int graph_captures_ = 0, graph_replays_ = 0;  // decode steps Decode ran as CUDA-graph steps
};

TEST_P(StepEngineTest, PrefillAndDecodeMatchGenerate) {
  const uint64_t baseline = engine_->Usage().free_bytes();
  const std::vector<int32_t>& p = prompts_.back();
  StepRequest req;
  req.set_step_id(1);
  *req.add_sequences() = FirstChunk(7, p, p.size(), kNewTokens, 3);
  StepResponse resp = Run(req);
  ASSERT_EQ(resp.results_size(), 1);
  EXPECT_EQ(resp.results(0).top_size(), 3);
  EXPECT_EQ(resp.results(0).top(0).id(), resp.results(0).token_id());
  EXPECT_LE(resp.results(0).logprob(), 0.f);
  EXPECT_EQ(resp.kv().sequences(), 1u);
  EXPECT_EQ(baseline - resp.kv().free_bytes(), Taken(p.size(), kNewTokens));
  auto got = Decode(resp, {7}, {static_cast<uint32_t>(p.size())});
  EXPECT_EQ(got[0], test_util::ReferenceGreedy(*model_, p, kNewTokens));

  StepRequest release;
  release.set_step_id(100);
  release.add_release_seq_ids(7);
  release.add_release_seq_ids(12345);  // unknown ids are ignored
  StepResponse r = Run(release);
  EXPECT_EQ(r.error_code(), 0);
  EXPECT_EQ(r.kv().free_bytes(), baseline);
  EXPECT_EQ(r.kv().sequences(), 0u);
  EXPECT_EQ(engine_->Usage().cached_tokens(), 0u);
}

// Budgets that reach the sequence's length, sent straight to a worker (even ones that overflow
// 32 bits when added), keep every token: the full cache's reservation and greedy tokens.
TEST_P(StepEngineTest, BudgetsReachingTheLengthActAsTheFullCache) {
  const uint64_t baseline = engine_->Usage().free_bytes();
  const std::vector<int32_t>& p = prompts_.back();
  StepRequest req;
  req.set_step_id(1);
  auto first = FirstChunk(11, p, p.size(), kNewTokens);
  first.mutable_config()->mutable_cache()->set_kind(deja::v1::WorkerCachePolicy::KIND_H2O);
  first.mutable_config()->mutable_cache()->set_heavy_tokens(2147483647u);
  first.mutable_config()->mutable_cache()->set_recent_tokens(2147483647u);
  first.mutable_config()->mutable_cache()->set_score_decay(0.5f);  // nothing to decay: accepted
  *req.add_sequences() = first;
  StepResponse resp = Run(req);
  ASSERT_EQ(resp.error_code(), 0) << resp.error_message();
  EXPECT_EQ(baseline - resp.kv().free_bytes(), Taken(p.size(), kNewTokens));
  auto got = Decode(resp, {11}, {static_cast<uint32_t>(p.size())});
  EXPECT_EQ(got[0], test_util::ReferenceGreedy(*model_, p, kNewTokens));
}

// An H2O sequence through the step protocol gives what model::Generate gives under the same
// budget; after its prompt its reservation shrinks to budget + 1 slots; release frees it all.
TEST_P(StepEngineTest, H2OSequenceMatchesGenerateAndShrinksAfterPrefill) {
  const uint64_t baseline = engine_->Usage().free_bytes();
  const std::vector<int32_t>& p = prompts_.back();
  const uint32_t heavy = 3, recent = 2;
  StepRequest req;
  req.set_step_id(1);
  auto first = FirstChunk(9, p, p.size(), kNewTokens);
  first.mutable_config()->mutable_cache()->set_kind(deja::v1::WorkerCachePolicy::KIND_H2O);
  first.mutable_config()->mutable_cache()->set_heavy_tokens(heavy);
  first.mutable_config()->mutable_cache()->set_recent_tokens(recent);
  *req.add_sequences() = first;
  StepResponse resp = Run(req);
  ASSERT_EQ(resp.error_code(), 0) << resp.error_message();
  // A host cache compacts to budget + 1 slots (in whole blocks from a pool); a device cache
  // keeps budget + chunk slots, in whole blocks.
  if (GetParam() == "cpu") {
    EXPECT_EQ(baseline - resp.kv().free_bytes(),
              engine_->kv_bytes_per_token() * (heavy + recent + 1));
  } else if (GetParam() == "cpu_paged") {
    EXPECT_EQ(baseline - resp.kv().free_bytes(), engine_->kv_bytes_per_token() * 32);
  }
  auto got = Decode(resp, {9}, {static_cast<uint32_t>(p.size())});
  const uint64_t heads = model_->config().num_hidden_layers * model_->config().num_attention_heads;
  EXPECT_EQ(engine_->Usage().cached_tokens(), heads * (heavy + recent));
  EXPECT_GT(engine_->Usage().evicted_tokens_total(), 0u);
  model::GenerationOptions opt;
  opt.max_new_tokens = kNewTokens;
  opt.stop_at_eos = false;
  opt.cache.kind = kv::CachePolicyKind::kH2O;
  opt.cache.heavy_tokens = heavy;
  opt.cache.recent_tokens = recent;
  opt.prefill_chunk = static_cast<int32_t>(p.size());
  auto want = model::Generate(*model_, p, opt);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  std::vector<int32_t> want_ids;
  for (const auto& t : want->tokens) want_ids.push_back(t.id);
  EXPECT_EQ(got[0], want_ids);
  StepRequest release;
  release.set_step_id(100);
  release.add_release_seq_ids(9);
  EXPECT_EQ(Run(release).kv().free_bytes(), baseline);
}

TEST_P(StepEngineTest, ChunkedPrefillAndBatchedSequencesMatchGenerate) {
  const std::vector<int32_t>& a = prompts_.back();
  const std::vector<int32_t>& b = prompts_[prompts_.size() - 2];
  ASSERT_GT(a.size(), 3u);
  // Step 1: a's first 3 tokens (no sample). Step 2: a's rest and all of b, both sampled.
  StepRequest s1;
  s1.set_step_id(1);
  *s1.add_sequences() = FirstChunk(1, a, 3, kNewTokens);
  StepResponse r1 = Run(s1);
  ASSERT_EQ(r1.error_code(), 0) << r1.error_message();
  EXPECT_EQ(r1.results(0).token_id(), -1);
  StepRequest s2;
  s2.set_step_id(2);
  *s2.add_sequences() = NextChunk(1, {a.begin() + 3, a.end()}, 3, true);
  *s2.add_sequences() = FirstChunk(2, b, b.size(), kNewTokens);
  auto got =
      Decode(Run(s2), {1, 2}, {static_cast<uint32_t>(a.size()), static_cast<uint32_t>(b.size())});
  EXPECT_EQ(got[0], test_util::ReferenceGreedy(*model_, a, kNewTokens));
  EXPECT_EQ(got[1], test_util::ReferenceGreedy(*model_, b, kNewTokens));
  // On a device that captures graphs the decode steps of the two sequences ran as graph steps
  // (each shape's first eagerly, its second captured, the rest replayed) and were reported so.
  if (backend_->SupportsGraphs()) {
    EXPECT_GE(graph_captures_, 1);
    EXPECT_GE(graph_replays_, 3);
    EXPECT_LE(graph_captures_ + graph_replays_, kNewTokens - 2);
  } else {
    EXPECT_EQ(graph_captures_ + graph_replays_, 0);
  }
}

TEST_P(StepEngineTest, BadSequencesAreRefusedAloneAndChangeNothing) {
  const std::vector<int32_t>& p = prompts_.back();
  StepRequest ok;
  ok.set_step_id(1);
  *ok.add_sequences() = FirstChunk(1, p, p.size(), 2);
  ASSERT_EQ(Run(ok).error_code(), 0);
  const deja::v1::KvUsage before = engine_->Usage();
  const int32_t vocab = static_cast<int32_t>(model_->config().vocab_size);
  const uint32_t len = static_cast<uint32_t>(p.size());

  struct Case {
    const char* name;
    deja::v1::SequenceWork work;
    StatusCode code;
  };
  std::vector<Case> cases;
  auto add = [&](const char* name, StatusCode code, deja::v1::SequenceWork work) {
    cases.push_back({name, std::move(work), code});
  };
  add("unknown seq", StatusCode::kNotFound, NextChunk(99, {5}, 4, true));
  add("token out of range", StatusCode::kInvalidArgument, NextChunk(1, {vocab}, len, true));
  add("negative token", StatusCode::kInvalidArgument, NextChunk(1, {-1}, len, true));
  add("wrong position", StatusCode::kFailedPrecondition, NextChunk(1, {5}, len + 1, true));
  add("capacity", StatusCode::kOutOfRange, NextChunk(1, {5, 6, 7}, len, true));
  add("empty tokens", StatusCode::kInvalidArgument, NextChunk(1, {}, len, true));
  add("exists", StatusCode::kAlreadyExists, FirstChunk(1, p, p.size(), 2));
  auto no_config = FirstChunk(3, p, p.size(), 2);
  no_config.clear_config();
  add("no config", StatusCode::kInvalidArgument, no_config);
  add("too long", StatusCode::kOutOfRange,
      FirstChunk(3, p, p.size(), model_->config().max_position_embeddings));
  auto h2o = FirstChunk(3, p, p.size(), 2);
  h2o.mutable_config()->mutable_cache()->set_kind(deja::v1::WorkerCachePolicy::KIND_H2O);
  add("h2o without a budget", StatusCode::kInvalidArgument, h2o);
  h2o.mutable_config()->mutable_cache()->set_heavy_tokens(2);
  h2o.mutable_config()->mutable_cache()->set_recent_tokens(2);
  h2o.mutable_config()->mutable_cache()->set_score_decay(1.5f);
  add("h2o score decay above 1", StatusCode::kInvalidArgument, h2o);
  auto window = FirstChunk(3, p, p.size(), 2);
  window.mutable_config()->mutable_cache()->set_kind(deja::v1::WorkerCachePolicy::KIND_WINDOW);
  window.mutable_config()->mutable_cache()->set_recent_tokens(2);
  window.mutable_config()->mutable_cache()->set_score_decay(0.5f);
  add("window with a score decay", StatusCode::kInvalidArgument, window);
  auto sampling = FirstChunk(3, p, p.size(), 2);
  sampling.mutable_config()->mutable_sampling()->set_do_sample(true);
  add("temperature 0", StatusCode::kInvalidArgument, sampling);
  for (Case& c : cases) {
    StepRequest req;
    req.set_step_id(2);
    *req.add_sequences() = c.work;
    StepResponse r = Run(req);
    EXPECT_EQ(r.error_code(), 0) << c.name;
    EXPECT_FALSE(r.fatal()) << c.name;
    ASSERT_EQ(r.results_size(), 1) << c.name;
    EXPECT_EQ(r.results(0).seq_id(), c.work.seq_id()) << c.name;
    EXPECT_EQ(r.results(0).error_code(), static_cast<int>(c.code))
        << c.name << ": " << r.results(0).error_message();
    EXPECT_NE(r.results(0).error_message().find("seq_id " + std::to_string(c.work.seq_id())),
              std::string::npos)
        << c.name << ": " << r.results(0).error_message();
    EXPECT_EQ(r.results(0).token_id(), -1) << c.name;
    EXPECT_FALSE(r.has_sparsity()) << c.name << ": no forward pass ran";
    EXPECT_EQ(r.kv().free_bytes(), before.free_bytes()) << c.name;
    EXPECT_EQ(r.kv().sequences(), before.sequences()) << c.name;
    EXPECT_EQ(r.kv().cached_tokens(), before.cached_tokens()) << c.name;
  }
  // The sequence still decodes where it was.
  StepRequest next;
  next.set_step_id(3);
  *next.add_sequences() = NextChunk(1, {5}, len, true);
  StepResponse r = Run(next);
  EXPECT_EQ(r.error_code(), 0) << r.error_message();
  ASSERT_EQ(r.results_size(), 1);
  EXPECT_EQ(r.results(0).error_code(), 0) << r.results(0).error_message();
  EXPECT_GE(r.results(0).token_id(), 0);
}

// A step whose sequences pass the KV budget together creates those that fit, in order, and
// refuses the rest; a sequence repeated in a step runs once and its repeat is refused.
TEST_P(StepEngineTest, BudgetAndRepeatsAreRefusedPerSequence) {
  // With a pool a sequence takes the blocks of its prompt: long prompts, so that few fill it.
  std::vector<int32_t> p = prompts_.back();
  const size_t limit = static_cast<size_t>(model_->config().max_position_embeddings);
  while (paged() && p.size() < limit / 2) p.push_back(p[p.size() % prompts_.back().size()]);
  const deja::v1::KvUsage before = engine_->Usage();
  const uint32_t room = static_cast<uint32_t>(limit - p.size());
  const uint64_t each = Taken(p.size(), room);
  const uint64_t fit = before.free_bytes() / each;
  ASSERT_GE(fit, 1u);
  StepRequest req;
  req.set_step_id(1);
  for (uint64_t i = 0; i <= fit; ++i)
    *req.add_sequences() = FirstChunk(1000 + i, p, p.size(), room);
  *req.add_sequences() = FirstChunk(1000, p, p.size(), room);
  StepResponse r = Run(req);
  ASSERT_EQ(r.results_size(), static_cast<int>(fit + 2));
  for (uint64_t i = 0; i < fit; ++i) {
    EXPECT_EQ(r.results(i).error_code(), 0) << i << ": " << r.results(i).error_message();
    EXPECT_GE(r.results(i).token_id(), 0) << i;
  }
  EXPECT_EQ(r.results(fit).error_code(), static_cast<int>(StatusCode::kResourceExhausted));
  EXPECT_EQ(r.results(fit + 1).error_code(), static_cast<int>(StatusCode::kInvalidArgument));
  EXPECT_NE(r.results(fit + 1).error_message().find("appears twice"), std::string::npos);
  EXPECT_EQ(r.kv().sequences(), fit);
  EXPECT_EQ(before.free_bytes() - r.kv().free_bytes(), fit * each);
}

// One bad sequence among good ones, at every step of their generation: each good sequence gives
// exactly the tokens it gives alone, and the bad one is refused each time.
TEST_P(StepEngineTest, AFailingSequenceLeavesTheOthersTokensUnchanged) {
  ASSERT_GE(prompts_.size(), 3u);
  const int32_t vocab = static_cast<int32_t>(model_->config().vocab_size);
  std::vector<uint64_t> ids = {21, 22, 23};
  std::vector<uint32_t> lengths;
  StepRequest req;
  req.set_step_id(1);
  for (size_t i = 0; i < ids.size(); ++i) {
    *req.add_sequences() = FirstChunk(ids[i], prompts_[i], prompts_[i].size(), kNewTokens);
    lengths.push_back(static_cast<uint32_t>(prompts_[i].size()));
  }
  std::vector<std::vector<int32_t>> got(ids.size());
  for (int32_t step = 0; step < kNewTokens; ++step) {
    // The bad sequence goes in the middle of the batch: a new one with a token outside the
    // vocabulary (so every step also plans, and drops, a fresh cache for it).
    StepRequest with_bad = req;
    with_bad.clear_sequences();
    for (int i = 0; i < req.sequences_size(); ++i) {
      if (i == 1) {
        *with_bad.add_sequences() = FirstChunk(99, {2, vocab + step}, 2, kNewTokens);
      }
      *with_bad.add_sequences() = req.sequences(i);
    }
    StepResponse resp = Run(with_bad);
    ASSERT_EQ(resp.error_code(), 0) << resp.error_message();
    ASSERT_EQ(resp.results_size(), static_cast<int>(ids.size() + 1));
    EXPECT_EQ(resp.results(1).seq_id(), 99u);
    EXPECT_EQ(resp.results(1).error_code(), static_cast<int>(StatusCode::kInvalidArgument));
    StepRequest next;
    next.set_step_id(resp.step_id() + 1);
    for (size_t i = 0; i < ids.size(); ++i) {
      const deja::v1::SequenceResult& res = resp.results(i == 0 ? 0 : i + 1);
      ASSERT_EQ(res.seq_id(), ids[i]);
      ASSERT_EQ(res.error_code(), 0) << res.error_message();
      got[i].push_back(res.token_id());
      *next.add_sequences() = NextChunk(ids[i], {res.token_id()}, lengths[i]++, true);
    }
    req = next;
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(got[i], test_util::ReferenceGreedy(*model_, prompts_[i], kNewTokens)) << i;
  }
}

// A window cache keeps budget + 1 slots once its prompt is in; a later chunk of more tokens than
// are free is refused for that sequence, which stays as it was. It used to pass the checks and
// fail the forward pass, which is fatal to the worker (found by fuzz_step).
TEST_P(StepEngineTest, ChunkPastABoundedCacheAfterItsPromptIsRefused) {
  if (!host()) {
    GTEST_SKIP() << "a device cache keeps budget + chunk slots after its prompt: the chunk fits";
  }
  const std::vector<int32_t> p(prompts_.back().begin(), prompts_.back().begin() + 3);
  StepRequest first;
  first.set_step_id(1);
  auto w = FirstChunk(2, p, p.size(), 10);
  w.mutable_config()->mutable_cache()->set_kind(deja::v1::WorkerCachePolicy::KIND_WINDOW);
  w.mutable_config()->mutable_cache()->set_recent_tokens(3);
  *first.add_sequences() = w;
  ASSERT_EQ(Run(first).error_code(), 0);
  const deja::v1::KvUsage before = engine_->Usage();

  StepRequest two;
  two.set_step_id(2);
  *two.add_sequences() = NextChunk(2, {p[1], p[2]}, 3, true);
  StepResponse refused = Run(two);
  EXPECT_EQ(refused.error_code(), 0) << refused.error_message();
  EXPECT_FALSE(refused.fatal());
  ASSERT_EQ(refused.results_size(), 1);
  EXPECT_EQ(refused.results(0).error_code(), static_cast<int>(StatusCode::kOutOfRange))
      << refused.results(0).error_message();
  EXPECT_EQ(refused.kv().free_bytes(), before.free_bytes());
  EXPECT_EQ(refused.kv().cached_tokens(), before.cached_tokens());

  StepRequest one;
  one.set_step_id(3);
  *one.add_sequences() = NextChunk(2, {p[1]}, 3, true);
  StepResponse r = Run(one);
  EXPECT_EQ(r.error_code(), 0) << r.error_message();
  ASSERT_EQ(r.results_size(), 1);
  EXPECT_EQ(r.results(0).error_code(), 0) << r.results(0).error_message();
  EXPECT_GE(r.results(0).token_id(), 0);
}

// Locret: the cache is budget + min(chunk_tokens, prompt) slots per head from the first token (what
// the coordinator admits), a chunk past it is refused alone, and chunk_tokens 0 is refused by name.
TEST_P(StepEngineTest, LocretHoldsBudgetPlusOneChunk) {
  if (GetParam() != "cpu") GTEST_SKIP() << "reservations in positions: the unpaged host engine";
  const Status heads = model_->EnableRetaining(test_util::ModelDir(test_util::TpModelName()) +
                                               "/retaining.safetensors");
  if (!heads.ok()) GTEST_SKIP() << heads.ToString();
  std::vector<int32_t> p = prompts_.back();
  while (p.size() < 12) p.push_back(p.back());
  const uint64_t per_token = engine_->kv_bytes_per_token();
  auto locret = [](deja::v1::SequenceWork* w, uint32_t chunk) {
    auto* c = w->mutable_config()->mutable_cache();
    c->set_kind(deja::v1::WorkerCachePolicy::KIND_LOCRET);
    c->set_heavy_tokens(2);
    c->set_recent_tokens(2);
    c->set_chunk_tokens(chunk);
  };
  const uint64_t free0 = engine_->Usage().free_bytes();

  StepRequest bad;
  bad.set_step_id(1);
  auto w0 = FirstChunk(9, p, 4, 10);
  locret(&w0, 0);
  *bad.add_sequences() = w0;
  StepResponse refused = Run(bad);
  ASSERT_EQ(refused.results_size(), 1);
  EXPECT_EQ(refused.results(0).error_code(), static_cast<int>(StatusCode::kInvalidArgument));
  EXPECT_NE(refused.results(0).error_message().find("chunk_tokens"), std::string::npos);

  StepRequest first;
  first.set_step_id(2);
  auto w = FirstChunk(1, p, 4, 10);
  locret(&w, 4);
  *first.add_sequences() = w;
  const std::vector<int32_t> short_prompt(p.begin(), p.begin() + 3);
  auto s = FirstChunk(2, short_prompt, 3, 10);
  locret(&s, 4);
  *first.add_sequences() = s;
  StepResponse r = Run(first);
  ASSERT_EQ(r.results_size(), 2);
  EXPECT_EQ(r.results(0).error_code(), 0) << r.results(0).error_message();
  EXPECT_EQ(r.results(1).error_code(), 0) << r.results(1).error_message();
  // 4 + 4 slots, and 4 + 3 for the sequence whose whole prompt is shorter than a chunk (it then
  // shrinks to budget + 1 = 5).
  EXPECT_EQ(free0 - r.kv().free_bytes(), per_token * (8 + 5));

  StepRequest too_big;
  too_big.set_step_id(3);
  *too_big.add_sequences() = NextChunk(1, {p[4], p[5], p[6], p[7], p[8]}, 4, false);
  StepResponse big = Run(too_big);
  ASSERT_EQ(big.results_size(), 1);
  EXPECT_EQ(big.results(0).error_code(), static_cast<int>(StatusCode::kOutOfRange));

  StepRequest next;
  next.set_step_id(4);
  *next.add_sequences() = NextChunk(1, {p[4], p[5], p[6], p[7]}, 4, false);
  StepResponse ok = Run(next);
  ASSERT_EQ(ok.results_size(), 1);
  EXPECT_EQ(ok.results(0).error_code(), 0) << ok.results(0).error_message();
  // Between steps every head holds the budget (4 tokens; the short sequence its 3), counted over
  // every (layer, head).
  const uint64_t heads_all = static_cast<uint64_t>(model_->config().num_hidden_layers) *
                             model_->config().num_attention_heads;
  EXPECT_EQ(ok.kv().cached_tokens(), heads_all * (4 + 3));
}

TEST_P(StepEngineTest, AllLogprobsAreLogSoftmaxRows) {
  const std::vector<int32_t> p = {2, 10, 11, 12};
  StepRequest req;
  req.set_step_id(1);
  *req.add_sequences() = FirstChunk(1, p, p.size(), 1);
  req.mutable_sequences(0)->set_want_all_logits(true);
  StepResponse r = Run(req);
  ASSERT_EQ(r.results_size(), 1);
  const int64_t vocab = model_->config().vocab_size;
  ASSERT_EQ(r.results(0).all_logprobs_size(), static_cast<int>(p.size() * vocab));
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(r.results(0).all_logprobs(3 * vocab + i));
  EXPECT_NEAR(sum, 1.0, 1e-4);
  EXPECT_NEAR(r.results(0).all_logprobs(3 * vocab + r.results(0).token_id()),
              r.results(0).logprob(), 1e-5);
}

// cpu_paged: the CPU with its KV in a block pool (deja worker --kv-paging on).
std::vector<std::string> EngineDevices() {
  std::vector<std::string> d = test_util::TestDevices();
  d.insert(d.begin() + 1, "cpu_paged");
  return d;
}

INSTANTIATE_TEST_SUITE_P(Devices, StepEngineTest, ::testing::ValuesIn(EngineDevices()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace deja::worker::service
