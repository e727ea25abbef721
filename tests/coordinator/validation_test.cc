// Every validation rule of the public API gives INVALID_ARGUMENT (FAILED_PRECONDITION for
// sparsity without predictors) naming the field; valid requests resolve every default.
#include "coordinator/validation.h"

#include <google/protobuf/descriptor.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <set>

#include "coordinator/sparsity_mode.h"
#include "coordinator_test_util.h"
#include "worker/kv/policy_table.h"

namespace deja::coordinator {
namespace {

class ValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tokenizer_ = test::LoadTokenizer();
    ASSERT_NE(tokenizer_, nullptr);
    limits_.vocab_size = 8192;
    limits_.max_positions = 64;
    limits_.default_max_new_tokens = 16;
    limits_.default_cache.set_kind(v1::CachePolicy::KIND_FULL);
  }
  StatusOr<ResolvedRequest> Resolve(const v1::GenerateRequest& r) {
    return ResolveRequest(r, limits_, *tokenizer_, /*random_seed=*/77);
  }
  static v1::GenerateRequest Text(const std::string& text) {
    v1::GenerateRequest r;
    r.set_text(text);
    return r;
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  ModelLimits limits_;
};

struct Rule {
  const char* name;
  std::function<void(v1::GenerateRequest*)> mutate;
  StatusCode code;
  const char* field;
};

TEST_F(ValidationTest, EveryRuleNamesItsField) {
  const std::string long_stop(kMaxStopSequenceBytes + 1, 'x');
  const std::vector<Rule> rules = {
      {"negative temperature", [](auto* r) { r->mutable_sampling()->set_temperature(-0.1f); },
       StatusCode::kInvalidArgument, "sampling.temperature"},
      {"nan temperature", [](auto* r) { r->mutable_sampling()->set_temperature(NAN); },
       StatusCode::kInvalidArgument, "sampling.temperature"},
      {"top_p zero", [](auto* r) { r->mutable_sampling()->set_top_p(0.f); },
       StatusCode::kInvalidArgument, "sampling.top_p"},
      {"top_p above one", [](auto* r) { r->mutable_sampling()->set_top_p(1.5f); },
       StatusCode::kInvalidArgument, "sampling.top_p"},
      {"negative top_k", [](auto* r) { r->mutable_sampling()->set_top_k(-1); },
       StatusCode::kInvalidArgument, "sampling.top_k"},
      {"zero repetition penalty",
       [](auto* r) { r->mutable_sampling()->set_repetition_penalty(0.f); },
       StatusCode::kInvalidArgument, "sampling.repetition_penalty"},
      {"max_new_tokens zero", [](auto* r) { r->mutable_stopping()->set_max_new_tokens(0); },
       StatusCode::kInvalidArgument, "stopping.max_new_tokens"},
      {"max_new_tokens past the context",
       [](auto* r) { r->mutable_stopping()->set_max_new_tokens(64); }, StatusCode::kInvalidArgument,
       "stopping.max_new_tokens"},
      {"prompt fills the context",
       [](auto* r) {
         r->mutable_token_ids()->clear_ids();
         for (int i = 0; i < 64; ++i) r->mutable_token_ids()->add_ids(5);
       },
       StatusCode::kInvalidArgument, "input"},
      {"empty text", [](auto* r) { r->set_text(""); }, StatusCode::kInvalidArgument, "input"},
      {"no input", [](auto* r) { r->clear_input(); }, StatusCode::kInvalidArgument, "input"},
      {"empty token ids", [](auto* r) { r->mutable_token_ids()->clear_ids(); },
       StatusCode::kInvalidArgument, "input"},
      {"invalid UTF-8", [](auto* r) { r->set_text("ab\xff"); }, StatusCode::kInvalidArgument,
       "text"},
      {"token id too large",
       [](auto* r) {
         r->mutable_token_ids()->add_ids(2);
         r->mutable_token_ids()->add_ids(8192);
       },
       StatusCode::kInvalidArgument, "token_ids.ids[1]"},
      {"negative token id", [](auto* r) { r->mutable_token_ids()->add_ids(-3); },
       StatusCode::kInvalidArgument, "token_ids.ids[0]"},
      {"five stop sequences",
       [](auto* r) {
         for (int i = 0; i < 5; ++i) r->mutable_stopping()->add_stop_sequences("s");
       },
       StatusCode::kInvalidArgument, "stopping.stop_sequences"},
      {"long stop sequence",
       [long_stop](auto* r) { r->mutable_stopping()->add_stop_sequences(long_stop); },
       StatusCode::kInvalidArgument, "stopping.stop_sequences[0]"},
      {"empty stop sequence",
       [](auto* r) {
         r->mutable_stopping()->add_stop_sequences("ok");
         r->mutable_stopping()->add_stop_sequences("");
       },
       StatusCode::kInvalidArgument, "stopping.stop_sequences[1]"},
      {"stop sequence not UTF-8",
       [](auto* r) { r->mutable_stopping()->add_stop_sequences("\xc3"); },
       StatusCode::kInvalidArgument, "stopping.stop_sequences[0]"},
      {"stop token id out of range",
       [](auto* r) { r->mutable_stopping()->add_stop_token_ids(9000); },
       StatusCode::kInvalidArgument, "stopping.stop_token_ids[0]"},
      {"too many stop token ids",
       [](auto* r) {
         for (int i = 0; i < 17; ++i) r->mutable_stopping()->add_stop_token_ids(i);
       },
       StatusCode::kInvalidArgument, "stopping.stop_token_ids"},
      {"top_n_tokens six", [](auto* r) { r->mutable_response()->set_top_n_tokens(6); },
       StatusCode::kInvalidArgument, "response.top_n_tokens"},
      {"request id with a space", [](auto* r) { r->set_request_id("a b"); },
       StatusCode::kInvalidArgument, "request_id"},
      {"request id too long", [](auto* r) { r->set_request_id(std::string(129, 'a')); },
       StatusCode::kInvalidArgument, "request_id"},
      {"empty request id", [](auto* r) { r->set_request_id(""); }, StatusCode::kInvalidArgument,
       "request_id"},
      {"heavy ratio above one",
       [](auto* r) {
         r->mutable_cache()->set_kind(v1::CachePolicy::KIND_H2O);
         r->mutable_cache()->set_heavy_ratio(1.5f);
       },
       StatusCode::kInvalidArgument, "cache.heavy_ratio"},
      {"heavy ratio and tokens",
       [](auto* r) {
         r->mutable_cache()->set_kind(v1::CachePolicy::KIND_H2O);
         r->mutable_cache()->set_heavy_ratio(0.1f);
         r->mutable_cache()->set_heavy_tokens(3);
       },
       StatusCode::kInvalidArgument, "cache.heavy_tokens"},
      {"heavy budget with window",
       [](auto* r) {
         r->mutable_cache()->set_kind(v1::CachePolicy::KIND_WINDOW);
         r->mutable_cache()->set_heavy_tokens(3);
       },
       StatusCode::kInvalidArgument, "cache.heavy_tokens"},
      {"score decay above one",
       [](auto* r) {
         r->mutable_cache()->set_kind(v1::CachePolicy::KIND_H2O);
         r->mutable_cache()->set_score_decay(1.01f);
       },
       StatusCode::kInvalidArgument, "cache.score_decay"},
      {"score decay of zero",
       [](auto* r) {
         r->mutable_cache()->set_kind(v1::CachePolicy::KIND_H2O);
         r->mutable_cache()->set_score_decay(0.f);
       },
       StatusCode::kInvalidArgument, "cache.score_decay"},
      {"score decay with locret",
       [](auto* r) {
         r->mutable_cache()->set_kind(v1::CachePolicy::KIND_LOCRET);
         r->mutable_cache()->set_score_decay(0.5f);
       },
       StatusCode::kInvalidArgument, "cache.score_decay"},
      {"zero recent tokens",
       [](auto* r) {
         r->mutable_cache()->set_kind(v1::CachePolicy::KIND_WINDOW);
         r->mutable_cache()->set_recent_tokens(0);
       },
       StatusCode::kInvalidArgument, "cache.recent_tokens"},
      {"sparsity on without predictors",
       [](auto* r) { r->mutable_sparsity()->set_mode(v1::Sparsity::MODE_ON); },
       StatusCode::kFailedPrecondition, "sparsity.mode"},
      {"unknown sparsity schedule", [](auto* r) { r->mutable_sparsity()->set_schedule("fast"); },
       StatusCode::kInvalidArgument, "sparsity.schedule"},
      {"unknown sparsity mode",
       [](auto* r) { r->mutable_sparsity()->set_mode(static_cast<v1::Sparsity::Mode>(7)); },
       StatusCode::kInvalidArgument, "sparsity.mode"},
      {"unknown cache kind",
       [](auto* r) { r->mutable_cache()->set_kind(static_cast<v1::CachePolicy::Kind>(9)); },
       StatusCode::kInvalidArgument, "cache.kind"},
  };
  for (const Rule& rule : rules) {
    v1::GenerateRequest r = Text("Hello there");
    rule.mutate(&r);  // token-id rules switch the oneof to token_ids
    StatusOr<ResolvedRequest> got = Resolve(r);
    ASSERT_FALSE(got.ok()) << rule.name;
    EXPECT_EQ(got.status().code(), rule.code) << rule.name << ": " << got.status().ToString();
    EXPECT_EQ(got.status().message().rfind(rule.field, 0), 0u)
        << rule.name << ": message should start with '" << rule.field
        << "': " << got.status().message();
  }
}

TEST_F(ValidationTest, TextPromptGetsBosAndDefaults) {
  StatusOr<ResolvedRequest> r = Resolve(Text("Hello there"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_FALSE(r->prompt.empty());
  EXPECT_EQ(r->prompt[0], 2);
  StatusOr<std::vector<int32_t>> ids = tokenizer_->Encode("Hello there", true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(r->prompt, *ids);
  EXPECT_TRUE(r->text_prompt);
  EXPECT_EQ(r->max_new_tokens, 16);
  EXPECT_FALSE(r->config.sampling().do_sample());
  EXPECT_EQ(r->config.sampling().seed(), 77u);
  EXPECT_FLOAT_EQ(r->config.sampling().temperature(), 1.0f);
  EXPECT_FLOAT_EQ(r->config.sampling().top_p(), 1.0f);
  EXPECT_FLOAT_EQ(r->config.sampling().repetition_penalty(), 1.0f);
  EXPECT_EQ(r->config.prompt_tokens(), r->prompt.size());
  EXPECT_EQ(r->config.max_new_tokens(), 16u);
  EXPECT_EQ(r->config.cache().kind(), v1::WorkerCachePolicy::KIND_FULL);
  EXPECT_FALSE(r->config.sparse());
  EXPECT_EQ(r->ReservedPositions(), static_cast<int64_t>(r->prompt.size()) + 16);
}

TEST_F(ValidationTest, DefaultMaxNewTokensIsClippedToTheContext) {
  v1::GenerateRequest req;
  for (int i = 0; i < 60; ++i) req.mutable_token_ids()->add_ids(7);
  StatusOr<ResolvedRequest> r = Resolve(req);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->max_new_tokens, 4);
  EXPECT_FALSE(r->text_prompt);
  EXPECT_EQ(r->prompt.size(), 60u);  // token ids are used as given: no BOS
  req.mutable_stopping()->set_max_new_tokens(4);
  EXPECT_TRUE(Resolve(req).ok());
}

TEST_F(ValidationTest, SamplingOptionsResolve) {
  v1::GenerateRequest req = Text("x");
  req.mutable_sampling()->set_do_sample(true);
  req.mutable_sampling()->set_temperature(0.7f);
  req.mutable_sampling()->set_top_k(40);
  req.mutable_sampling()->set_top_p(0.9f);
  req.mutable_sampling()->set_seed(5);
  req.mutable_response()->set_top_n_tokens(3);
  req.mutable_stopping()->add_stop_sequences("\n");
  req.mutable_stopping()->add_stop_token_ids(13);
  req.mutable_stopping()->set_time_limit_ms(500);
  req.set_request_id("client-1.a:b_c");
  StatusOr<ResolvedRequest> r = Resolve(req);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->config.sampling().do_sample());
  EXPECT_EQ(r->config.sampling().top_k(), 40);
  EXPECT_EQ(r->config.sampling().seed(), 5u);
  EXPECT_EQ(r->config.top_n(), 3u);
  EXPECT_TRUE(r->logprobs);
  EXPECT_TRUE(r->return_tokens);
  EXPECT_EQ(r->stop_sequences, std::vector<std::string>{"\n"});
  EXPECT_EQ(r->stop_token_ids, std::vector<int32_t>{13});
  EXPECT_EQ(r->time_limit_ms, 500u);
  EXPECT_EQ(r->request_id, "client-1.a:b_c");

  // Temperature 0 is greedy even with do_sample.
  req.mutable_sampling()->set_temperature(0.f);
  r = Resolve(req);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->config.sampling().do_sample());
}

TEST_F(ValidationTest, CachePolicyBudgetsResolveToTokens) {
  v1::GenerateRequest req;
  for (int i = 0; i < 40; ++i) req.mutable_token_ids()->add_ids(9);
  req.mutable_cache()->set_kind(v1::CachePolicy::KIND_H2O);
  req.mutable_cache()->set_heavy_ratio(0.1f);
  req.mutable_cache()->set_recent_tokens(6);
  StatusOr<ResolvedRequest> r = Resolve(req);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->config.cache().kind(), v1::WorkerCachePolicy::KIND_H2O);
  EXPECT_EQ(r->config.cache().heavy_tokens(), 4u);
  EXPECT_EQ(r->config.cache().recent_tokens(), 6u);
  // KV reservation: budget (10) plus the prompt (40), below the full 40 + 16.
  EXPECT_EQ(r->ReservedPositions(), 50);
  req.mutable_cache()->set_kind(v1::CachePolicy::KIND_FULL);
  r = Resolve(req);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->ReservedPositions(), 56);
}

// Budgets that reach the sequence's length (prompt + max_new_tokens) evict nothing: they resolve
// to the full cache, also when they would overflow 32 bits (2^31-1 + 2^31-1, 2^32-1 + 2^32-1).
TEST_F(ValidationTest, BudgetsReachingTheSequenceLengthResolveToFull) {
  v1::GenerateRequest req;
  for (int i = 0; i < 40; ++i) req.mutable_token_ids()->add_ids(9);
  req.mutable_stopping()->set_max_new_tokens(16);
  for (uint32_t b : {56u / 2, 2147483647u, 2147483648u, 4294967295u}) {
    SCOPED_TRACE(b);
    req.mutable_cache()->set_kind(v1::CachePolicy::KIND_H2O);
    req.mutable_cache()->set_heavy_tokens(b);
    req.mutable_cache()->set_recent_tokens(b);
    StatusOr<ResolvedRequest> r = Resolve(req);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->config.cache().kind(), v1::WorkerCachePolicy::KIND_FULL);
    EXPECT_EQ(r->config.cache().heavy_tokens(), 0u);
    EXPECT_EQ(r->config.cache().recent_tokens(), 0u);
    EXPECT_EQ(r->ReservedPositions(), 56);
  }
  // One position short of the length stays bounded.
  req.mutable_cache()->Clear();
  req.mutable_cache()->set_kind(v1::CachePolicy::KIND_WINDOW);
  req.mutable_cache()->set_recent_tokens(55);
  StatusOr<ResolvedRequest> r = Resolve(req);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->config.cache().kind(), v1::WorkerCachePolicy::KIND_WINDOW);
  req.mutable_cache()->set_recent_tokens(56);
  r = Resolve(req);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->config.cache().kind(), v1::WorkerCachePolicy::KIND_FULL);
}

// A request naming KIND_H2O or KIND_WINDOW without budgets gets 10% of the prompt for each part
// (the proto's default), not zero.
TEST_F(ValidationTest, BoundedKindsWithoutBudgetsTakeTenPercent) {
  v1::GenerateRequest req;
  for (int i = 0; i < 40; ++i) req.mutable_token_ids()->add_ids(9);
  req.mutable_cache()->set_kind(v1::CachePolicy::KIND_H2O);
  StatusOr<ResolvedRequest> r = Resolve(req);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->config.cache().kind(), v1::WorkerCachePolicy::KIND_H2O);
  EXPECT_EQ(r->config.cache().heavy_tokens(), 4u);
  EXPECT_EQ(r->config.cache().recent_tokens(), 4u);
  req.mutable_cache()->set_kind(v1::CachePolicy::KIND_WINDOW);
  r = Resolve(req);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->config.cache().kind(), v1::WorkerCachePolicy::KIND_WINDOW);
  EXPECT_EQ(r->config.cache().heavy_tokens(), 0u);
  EXPECT_EQ(r->config.cache().recent_tokens(), 4u);
}

// The server default (`deja serve --kv-policy h2o --heavy-tokens 6 --recent-tokens 5`) decides
// KIND_UNSPECIFIED, and its budgets fill in those a request of its kind leaves unset; a request
// of another kind keeps the 10% defaults.
TEST_F(ValidationTest, ServerDefaultCachePolicyAndItsBudgets) {
  limits_.default_cache.set_kind(v1::CachePolicy::KIND_H2O);
  limits_.default_cache.set_heavy_tokens(6);
  limits_.default_cache.set_recent_tokens(5);
  ASSERT_TRUE(ValidateDefaultCachePolicy(limits_.default_cache).ok());
  v1::GenerateRequest req;
  for (int i = 0; i < 40; ++i) req.mutable_token_ids()->add_ids(9);
  auto resolved = [&](const v1::CachePolicy& c) {
    *req.mutable_cache() = c;
    StatusOr<ResolvedRequest> r = Resolve(req);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->config.cache() : v1::WorkerCachePolicy();
  };
  v1::CachePolicy c;  // unspecified: the default, whole
  v1::WorkerCachePolicy w = resolved(c);
  EXPECT_EQ(w.kind(), v1::WorkerCachePolicy::KIND_H2O);
  EXPECT_EQ(w.heavy_tokens(), 6u);
  EXPECT_EQ(w.recent_tokens(), 5u);
  c.set_heavy_ratio(0.5f);  // unspecified kind, one budget of its own
  w = resolved(c);
  EXPECT_EQ(w.kind(), v1::WorkerCachePolicy::KIND_H2O);
  EXPECT_EQ(w.heavy_tokens(), 20u);
  EXPECT_EQ(w.recent_tokens(), 5u);
  c = v1::CachePolicy();
  c.set_kind(v1::CachePolicy::KIND_H2O);  // the default's kind: its budgets
  w = resolved(c);
  EXPECT_EQ(w.heavy_tokens(), 6u);
  EXPECT_EQ(w.recent_tokens(), 5u);
  c.set_kind(v1::CachePolicy::KIND_WINDOW);  // another kind: 10%
  w = resolved(c);
  EXPECT_EQ(w.kind(), v1::WorkerCachePolicy::KIND_WINDOW);
  EXPECT_EQ(w.recent_tokens(), 4u);
  c.set_kind(v1::CachePolicy::KIND_FULL);
  EXPECT_EQ(resolved(c).kind(), v1::WorkerCachePolicy::KIND_FULL);

  // Decayed scores: the request's own, else the default's for its kind, else none (1, unset).
  EXPECT_EQ(resolved(v1::CachePolicy()).score_decay(), 0.f);
  limits_.default_cache.set_score_decay(0.6f);
  ASSERT_TRUE(ValidateDefaultCachePolicy(limits_.default_cache).ok());
  EXPECT_EQ(resolved(v1::CachePolicy()).score_decay(), 0.6f);
  c = v1::CachePolicy();
  c.set_kind(v1::CachePolicy::KIND_H2O);
  EXPECT_EQ(resolved(c).score_decay(), 0.6f);
  c.set_score_decay(0.9f);
  EXPECT_EQ(resolved(c).score_decay(), 0.9f);
  c.set_score_decay(1.f);  // the plain sum, asked for over the default's decay
  EXPECT_EQ(resolved(c).score_decay(), 0.f);
  c = v1::CachePolicy();
  c.set_kind(v1::CachePolicy::KIND_WINDOW);  // another kind: no decay
  EXPECT_EQ(resolved(c).score_decay(), 0.f);

  // A window default: a request leaving the kind unset may not add a heavy budget.
  limits_.default_cache = v1::CachePolicy();
  limits_.default_cache.set_kind(v1::CachePolicy::KIND_WINDOW);
  limits_.default_cache.set_recent_ratio(0.25f);
  c = v1::CachePolicy();
  w = resolved(c);
  EXPECT_EQ(w.kind(), v1::WorkerCachePolicy::KIND_WINDOW);
  EXPECT_EQ(w.recent_tokens(), 10u);
  c.set_heavy_tokens(3);
  *req.mutable_cache() = c;
  Status s = Resolve(req).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("cache.heavy_tokens"), std::string::npos) << s.message();
}

TEST_F(ValidationTest, BadServerDefaultCachePoliciesNameTheField) {
  v1::CachePolicy c;
  c.set_kind(v1::CachePolicy::KIND_WINDOW);
  c.set_heavy_tokens(3);
  Status s = ValidateDefaultCachePolicy(c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("heavy_tokens"), std::string::npos) << s.message();
  c = v1::CachePolicy();
  c.set_kind(v1::CachePolicy::KIND_H2O);
  c.set_recent_ratio(1.5f);
  s = ValidateDefaultCachePolicy(c);
  EXPECT_NE(s.message().find("recent_ratio"), std::string::npos) << s.message();
  c = v1::CachePolicy();
  c.set_kind(static_cast<v1::CachePolicy::Kind>(9));
  EXPECT_EQ(ValidateDefaultCachePolicy(c).code(), StatusCode::kInvalidArgument);
  c.set_kind(v1::CachePolicy::KIND_H2O);
  EXPECT_TRUE(ValidateDefaultCachePolicy(c).ok());
  c.set_score_decay(2.f);
  s = ValidateDefaultCachePolicy(c);
  EXPECT_NE(s.message().find("default cache policy score_decay"), std::string::npos) << s.message();
  c.set_kind(v1::CachePolicy::KIND_WINDOW);
  c.set_score_decay(0.5f);
  s = ValidateDefaultCachePolicy(c);
  EXPECT_NE(s.message().find("score_decay"), std::string::npos) << s.message();
}

// With sparsity available, the server default decides MODE_UNSPECIFIED; MODE_ON/OFF and a
// known schedule override it.
TEST_F(ValidationTest, SparsityModeAndServerDefault) {
  limits_.sparsity_available = true;
  limits_.sparsity_schedules = {"default"};
  auto sparse = [&](v1::Sparsity::Mode mode, const char* schedule) {
    v1::GenerateRequest req = Text("x");
    req.mutable_sparsity()->set_mode(mode);
    if (schedule != nullptr) req.mutable_sparsity()->set_schedule(schedule);
    StatusOr<ResolvedRequest> r = Resolve(req);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() && r->config.sparse();
  };
  for (const bool server_default : {false, true}) {
    limits_.sparsity_default = server_default;
    EXPECT_EQ(sparse(v1::Sparsity::MODE_UNSPECIFIED, nullptr), server_default);
    EXPECT_TRUE(sparse(v1::Sparsity::MODE_ON, nullptr));
    EXPECT_FALSE(sparse(v1::Sparsity::MODE_OFF, nullptr));
    EXPECT_TRUE(sparse(v1::Sparsity::MODE_UNSPECIFIED, "default"));
  }
  v1::GenerateRequest req = Text("x");
  req.mutable_sparsity()->set_schedule("default");
  StatusOr<ResolvedRequest> r = Resolve(req);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->config.sparsity_schedule(), "default");
  req.mutable_sparsity()->set_mode(v1::Sparsity::MODE_OFF);
  EXPECT_EQ(Resolve(req).status().code(), StatusCode::kInvalidArgument);
  // A server default of on means nothing without sparsity.
  limits_.sparsity_available = false;
  limits_.sparsity_default = true;
  EXPECT_FALSE(sparse(v1::Sparsity::MODE_UNSPECIFIED, nullptr));
}

TEST_F(ValidationTest, PrefixCacheModeAndServerDefault) {
  auto cached = [&](v1::PrefixCache::Mode mode) {
    v1::GenerateRequest req = Text("x");
    req.mutable_prefix_cache()->set_mode(mode);
    StatusOr<ResolvedRequest> r = Resolve(req);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() && r->prefix_cache;
  };
  for (const bool server_default : {false, true}) {
    limits_.prefix_cache_default = server_default;
    EXPECT_EQ(cached(v1::PrefixCache::MODE_UNSPECIFIED), server_default);
    EXPECT_TRUE(cached(v1::PrefixCache::MODE_ON));
    EXPECT_FALSE(cached(v1::PrefixCache::MODE_OFF));
  }
  v1::GenerateRequest req = Text("x");
  req.mutable_prefix_cache()->set_mode(static_cast<v1::PrefixCache::Mode>(7));
  const Status st = Resolve(req).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("prefix_cache.mode"), std::string::npos) << st.ToString();
}

// The prefix cache's key: requests computing their prompt alike (dense, or sparse with one
// schedule) and carrying the same cache_salt share a key; anything else gives another. A salt is
// at most 256 bytes, and required where the server says so (for requests that use the cache).
TEST_F(ValidationTest, CacheSaltAndThePrefixKey) {
  limits_.sparsity_available = true;
  limits_.sparsity_schedules = {"default", "light"};
  auto key = [&](v1::Sparsity::Mode mode, const char* schedule, const char* salt) {
    v1::GenerateRequest req = Text("x");
    req.mutable_sparsity()->set_mode(mode);
    if (schedule != nullptr) req.mutable_sparsity()->set_schedule(schedule);
    if (salt != nullptr) req.set_cache_salt(salt);
    StatusOr<ResolvedRequest> r = Resolve(req);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->prefix_key : std::string("error");
  };
  const std::string dense = key(v1::Sparsity::MODE_OFF, nullptr, nullptr);
  EXPECT_EQ(dense, key(v1::Sparsity::MODE_OFF, nullptr, nullptr));
  const std::vector<std::string> others = {
      key(v1::Sparsity::MODE_ON, nullptr, nullptr), key(v1::Sparsity::MODE_ON, "light", nullptr),
      key(v1::Sparsity::MODE_OFF, nullptr, "tenant-a"), key(v1::Sparsity::MODE_OFF, nullptr, ""),
      key(v1::Sparsity::MODE_ON, nullptr, "tenant-a")};
  for (size_t i = 0; i < others.size(); ++i) {
    EXPECT_NE(others[i], dense) << i;
    for (size_t j = 0; j < i; ++j) EXPECT_NE(others[i], others[j]) << i << " " << j;
  }
  EXPECT_EQ(key(v1::Sparsity::MODE_OFF, nullptr, "tenant-a"),
            key(v1::Sparsity::MODE_OFF, nullptr, "tenant-a"));

  v1::GenerateRequest req = Text("x");
  req.set_cache_salt(std::string(257, 's'));
  Status st = Resolve(req).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("cache_salt"), std::string::npos) << st.ToString();
  req.set_cache_salt(std::string(256, 's'));
  EXPECT_TRUE(Resolve(req).ok());

  limits_.prefix_cache_salt_required = true;
  limits_.prefix_cache_default = true;
  req.clear_cache_salt();
  st = Resolve(req).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("cache_salt"), std::string::npos) << st.ToString();
  req.mutable_prefix_cache()->set_mode(v1::PrefixCache::MODE_OFF);  // no cache: no salt needed
  EXPECT_TRUE(Resolve(req).ok());
  req.mutable_prefix_cache()->set_mode(v1::PrefixCache::MODE_ON);
  req.set_cache_salt("tenant-a");
  EXPECT_TRUE(Resolve(req).ok());
}

// An unknown kind names the field and the kinds the table has.
TEST_F(ValidationTest, UnknownCacheKindsListTheKnownOnes) {
  v1::GenerateRequest req = Text("x");
  req.mutable_cache()->set_kind(static_cast<v1::CachePolicy::Kind>(9));
  Status s = Resolve(req).status();
  EXPECT_EQ(s.message(),
            "cache.kind must be KIND_FULL, KIND_WINDOW, KIND_H2O or KIND_LOCRET, got 9");
  v1::CachePolicy c;
  c.set_kind(static_cast<v1::CachePolicy::Kind>(9));
  s = ValidateDefaultCachePolicy(c);
  EXPECT_EQ(
      s.message(),
      "default cache policy kind must be KIND_FULL, KIND_WINDOW, KIND_H2O or KIND_LOCRET, got 9");
  // Locret needs workers with retaining heads: FAILED_PRECONDITION naming the field without.
  req.mutable_cache()->set_kind(v1::CachePolicy::KIND_LOCRET);
  limits_.locret_available = false;
  s = Resolve(req).status();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("cache.kind"), std::string::npos) << s.ToString();
  limits_.locret_available = true;
  limits_.locret_chunk = 24;
  {
    StatusOr<ResolvedRequest> r = Resolve(req);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->config.cache().chunk_tokens(), 24u);
    // Admission reserves budget + one chunk (at most the prompt), not budget + prompt.
    const int64_t budget = r->config.cache().heavy_tokens() + r->config.cache().recent_tokens();
    EXPECT_EQ(r->ReservedPositions(),
              std::min<int64_t>(budget + std::min<int64_t>(24, r->prompt.size()),
                                r->prompt.size() + r->max_new_tokens));
  }
  // Every kind of the table resolves to its worker value.
  for (const worker::kv::CachePolicyRow& row : worker::kv::CachePolicyTable()) {
    req.mutable_cache()->set_kind(row.api);
    StatusOr<ResolvedRequest> r = Resolve(req);
    ASSERT_TRUE(r.ok()) << row.name << ": " << r.status().ToString();
    EXPECT_EQ(r->config.cache().kind(), row.wire) << row.name;
    EXPECT_EQ(r->BoundedCache(), row.bounded) << row.name;
    EXPECT_EQ(r->config.cache().heavy_tokens() > 0, row.heavy_hitters) << row.name;
  }
}

// The sparsity mode table: every row round-trips between its name, its meaning and its proto
// value, unknown names and values are refused with the accepted ones listed, and every value of
// Sparsity.Mode has a row.
TEST(SparsityModeTest, EveryRowRoundTrips) {
  std::set<std::string> names;
  for (const SparsityModeRow& row : SparsityModeTable()) {
    SCOPED_TRACE(v1::Sparsity::Mode_Name(row.mode));
    StatusOr<std::optional<bool>> on = SparsityFromProto(row.mode, "sparsity.mode");
    ASSERT_TRUE(on.ok()) << on.status().ToString();
    EXPECT_EQ(*on, row.on);
    EXPECT_EQ(SparsityToProto(row.on), row.mode);
    if (std::string(row.name).empty()) {
      EXPECT_FALSE(row.on.has_value());  // only "the server's default" has no spelling
      continue;
    }
    EXPECT_TRUE(names.insert(row.name).second);
    ASSERT_TRUE(row.on.has_value());
    EXPECT_STREQ(SparsityName(*row.on), row.name);
    StatusOr<bool> parsed = ParseSparsity(row.name, "--sparsity");
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(*parsed, *row.on);
  }
}

TEST(SparsityModeTest, EveryProtoValueHasARow) {
  const google::protobuf::EnumDescriptor* d = v1::Sparsity::Mode_descriptor();
  for (int i = 0; i < d->value_count(); ++i) {
    const auto mode = static_cast<v1::Sparsity::Mode>(d->value(i)->number());
    EXPECT_TRUE(SparsityFromProto(mode, "sparsity.mode").ok()) << d->value(i)->name();
  }
  EXPECT_EQ(static_cast<int>(SparsityModeTable().size()), d->value_count());
}

TEST(SparsityModeTest, UnknownNamesAndValuesListTheAcceptedOnes) {
  Status s = ParseSparsity("yes", "--sparsity-default").status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "--sparsity-default must be on or off, got 'yes'");
  EXPECT_FALSE(ParseSparsity("", "--sparsity").ok());
  s = SparsityFromProto(static_cast<v1::Sparsity::Mode>(7), "sparsity.mode").status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "sparsity.mode must be MODE_UNSPECIFIED, MODE_ON or MODE_OFF, got 7");
}

TEST(RequestIdTest, Charset) {
  EXPECT_TRUE(ValidateRequestId("abc-DEF_0.9:x").ok());
  EXPECT_FALSE(ValidateRequestId("a/b").ok());
  EXPECT_FALSE(ValidateRequestId("é").ok());
}

}  // namespace
}  // namespace deja::coordinator
