// KV-cache policies through the public API of a real `deja serve --tp 2` whose default policy is
// H2O (`--kv-policy h2o --heavy-tokens 4 --recent-tokens 4`): ModelInfo reports that default, a
// request without CachePolicy.kind runs under it, requests naming full, window or h2o (with or
// without budgets, with decayed scores) run under theirs, and every result equals single-process
// generation under the same policy, in one batch; evictions show in a real /metrics scrape. The
// workers load the model's retaining heads (`--retaining-heads auto`), so ModelInfo reports locret
// available and a locret request, prefilled in chunks of `--locret-chunk 16`, equals single-process
// generation in the same chunks.
#include <thread>

#include "reference_model.h"
#include "serving_util.h"

namespace deja::serving_test {
namespace {

class CachePolicyServingTest : public ServerSuite {
 protected:
  static void SetUpTestSuite() {
    StartSuite("cache_policy",
               {DEJA_BINARY,       "serve", "--model",        ModelDir(),   "--tp",           "2",
                "--port",          "0",     "--metrics-port", "0", "--http-port", "-1",          "--threads",      "1",
                "--kv-memory-mb",  "64",    "--kv-policy",    "h2o",        "--heavy-tokens", "4",
                "--recent-tokens", "4",     "--dtype",        "checkpoint", "--kv-dtype",     "f32",
                "--locret-chunk",  "16"});
  }

  // Greedy single-process generation of `prompt` (BOS prepended) under `cache`.
  static std::vector<int32_t> Reference(const std::string& prompt, int max_new,
                                        const worker::kv::CachePolicyConfig& cache) {
    worker::model::GenerationOptions o;
    o.max_new_tokens = max_new;
    o.stop_at_eos = false;  // as the requests' ignore_eos
    o.cache = cache;
    if (cache.kind == worker::kv::CachePolicyKind::kLocret) {
      o.prefill_chunk = 16;  // the server's --locret-chunk
      if (!ref_->model->retaining_enabled()) {
        Status s = ref_->model->EnableRetaining(ModelDir() + "/retaining.safetensors");
        EXPECT_TRUE(s.ok()) << s.ToString();
      }
    }
    return ref_->Generate(prompt, o);
  }
  static worker::kv::CachePolicyConfig Policy(worker::kv::CachePolicyKind kind, int32_t heavy = -1,
                                              int32_t recent = -1) {
    worker::kv::CachePolicyConfig c;
    c.kind = kind;
    c.heavy_tokens = heavy;
    c.recent_tokens = recent;
    return c;
  }
};

TEST_F(CachePolicyServingTest, ModelInfoReportsTheServerDefault) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::ModelInfo info;
  ASSERT_TRUE(server_->stub().GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.default_cache_policy().kind(), v1::CachePolicy::KIND_H2O);
  EXPECT_EQ(info.default_cache_policy().heavy_tokens(), 4u);
  EXPECT_EQ(info.default_cache_policy().recent_tokens(), 4u);
  EXPECT_TRUE(info.locret_available());
}

TEST_F(CachePolicyServingTest, EachRequestRunsUnderItsPolicyInOneBatch) {
  // ~40-token prompts: a 4 + 4 budget evicts from the prefill on.
  const std::string prompt =
      "And God said, Let there be light: and there was light. And God saw the light, that it "
      "was good: and God divided the light from the darkness.";
  const int max_new = 24;
  StatusOr<std::vector<int32_t>> prompt_ids = ref_->tokenizer->Encode(prompt, true);
  ASSERT_TRUE(prompt_ids.ok());
  const int32_t tenth = static_cast<int32_t>((prompt_ids->size() + 9) / 10);  // ceil(0.1 * prompt)
  struct Case {
    const char* name;
    v1::CachePolicy cache;
    worker::kv::CachePolicyConfig reference;
  };
  std::vector<Case> cases;
  cases.push_back({"unset: the server's h2o 4 + 4", v1::CachePolicy(),
                   Policy(worker::kv::CachePolicyKind::kH2O, 4, 4)});
  v1::CachePolicy c;
  c.set_kind(v1::CachePolicy::KIND_FULL);
  cases.push_back({"full", c, Policy(worker::kv::CachePolicyKind::kFull)});
  c.set_kind(v1::CachePolicy::KIND_H2O);  // the default's kind: its budgets
  cases.push_back({"h2o without budgets", c, Policy(worker::kv::CachePolicyKind::kH2O, 4, 4)});
  c.set_heavy_tokens(2);
  c.set_recent_tokens(6);
  cases.push_back({"h2o 2 + 6", c, Policy(worker::kv::CachePolicyKind::kH2O, 2, 6)});
  c.set_score_decay(0.5f);
  worker::kv::CachePolicyConfig decayed = Policy(worker::kv::CachePolicyKind::kH2O, 2, 6);
  decayed.h2o_decay = 0.5f;
  cases.push_back({"h2o 2 + 6, scores decayed by 0.5", c, decayed});
  c = v1::CachePolicy();
  c.set_kind(v1::CachePolicy::KIND_WINDOW);  // another kind: 10% of the prompt
  cases.push_back(
      {"window without budgets", c, Policy(worker::kv::CachePolicyKind::kWindow, 0, tenth)});
  c = v1::CachePolicy();
  c.set_kind(v1::CachePolicy::KIND_LOCRET);
  c.set_heavy_tokens(3);
  c.set_recent_tokens(5);
  cases.push_back(
      {"locret 3 + 5 in chunks of 16", c, Policy(worker::kv::CachePolicyKind::kLocret, 3, 5)});
  std::vector<std::vector<int32_t>> want;
  for (const Case& k : cases) want.push_back(Reference(prompt, max_new, k.reference));
  // The budgets matter here: the h2o 4 + 4 and full references differ; so does the decay.
  EXPECT_NE(want[0], want[1]);
  EXPECT_NE(want[3], want[4]);

  const std::string m0 = Scrape(server_->metrics_port());
  const double evicted0 = Metric(m0, "deja_worker_kv_evicted_tokens_total{rank=\"0\"}");
  ASSERT_FALSE(std::isnan(evicted0)) << m0;

  std::vector<StreamResult> results(cases.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < cases.size(); ++i) {
    threads.emplace_back([&, i] {
      v1::GenerateRequest r;
      r.set_text(prompt);
      r.mutable_stopping()->set_max_new_tokens(max_new);
      r.mutable_stopping()->set_ignore_eos(true);
      r.mutable_response()->set_return_tokens(true);
      *r.mutable_cache() = cases[i].cache;
      results[i] = Stream(server_->stub(), r);
    });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].name);
    ASSERT_TRUE(results[i].status.ok()) << results[i].status.error_message();
    EXPECT_EQ(results[i].token_ids, want[i]);
  }
  // Evictions reach /metrics with the workers' next heartbeat.
  double evicted = evicted0;
  for (int i = 0; i < 100 && evicted <= evicted0; ++i) {
    std::this_thread::sleep_for(milliseconds(50));
    evicted =
        Metric(Scrape(server_->metrics_port()), "deja_worker_kv_evicted_tokens_total{rank=\"0\"}");
  }
  EXPECT_GT(evicted, evicted0);
}

TEST_F(CachePolicyServingTest, BadBudgetsAreInvalidArgumentNamingTheField) {
  v1::GenerateRequest r;
  r.set_text("And God said");
  r.mutable_cache()->set_heavy_ratio(0.2f);
  r.mutable_cache()->set_heavy_tokens(3);  // with the default's kind
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::GenerateResponse resp;
  grpc::Status s = server_->stub().Generate(&ctx, r, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("cache.heavy_tokens"), std::string::npos) << s.error_message();
  // The server keeps serving.
  EXPECT_EQ(Health(server_->channel(), "deja.v1.TextGeneration"), kServing);
  // A decay out of range, and one for a kind without accumulated scores.
  for (auto [kind, decay, why] :
       {std::tuple{v1::CachePolicy::KIND_H2O, 1.5f, "must be in (0, 1]"},
        std::tuple{v1::CachePolicy::KIND_H2O, 0.f, "must be in (0, 1]"},
        std::tuple{v1::CachePolicy::KIND_WINDOW, 0.5f, "applies to KIND_H2O only, not KIND_WINDOW"}}) {
    v1::GenerateRequest bad;
    bad.set_text("And God said");
    bad.mutable_cache()->set_kind(kind);
    bad.mutable_cache()->set_score_decay(decay);
    grpc::ClientContext bctx;
    SetDeadline(&bctx);
    grpc::Status bs = server_->stub().Generate(&bctx, bad, &resp);
    EXPECT_EQ(bs.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << decay;
    EXPECT_NE(bs.error_message().find(std::string("cache.score_decay ") + why), std::string::npos)
        << bs.error_message();
  }
}

}  // namespace
}  // namespace deja::serving_test
