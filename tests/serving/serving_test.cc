// `deja serve --tp 2` as real processes on loopback, checked against single-process generation
// in this test: greedy and seeded results, 32 concurrent streams with mixed settings, cancel
// returning KV to its baseline (read from a real /metrics scrape), every validation rule,
// health, reflection, model info and tokenization.
#include <atomic>
#include <cmath>
#include <mutex>
#include <thread>

#include "kernels/cpu/bf16_dot.h"
#include "reference_model.h"
#include "serving_util.h"

namespace deja::serving_test {
namespace {

class ServingTest : public ServerSuite {
 protected:
  static void SetUpTestSuite() {
    StartSuite("main", {DEJA_BINARY, "serve", "--model", ModelDir(), "--tp", "2", "--port", "0",
                        "--metrics-port", "0", "--http-port", "-1", "--threads", "1", "--max-batch-sequences", "16",
                        "--max-queue", "64", "--kv-memory-mb", "64",
                        // The references compute with the checkpoint's dtypes.
                        "--dtype", "checkpoint", "--kv-dtype", "f32"});
  }
  // Single-process generation of `prompt` (BOS prepended) with the request's settings.
  static std::vector<int32_t> Reference(const std::string& prompt, int max_new,
                                        const worker::sampling::SamplingParams& sampling = {}) {
    std::lock_guard<std::mutex> lock(reference_mu_);
    worker::model::GenerationOptions o;
    o.sampling = sampling;
    o.max_new_tokens = max_new;
    return ref_->Generate(prompt, o);
  }
  static v1::GenerateRequest Request(const std::string& prompt, int max_new) {
    v1::GenerateRequest r;
    r.set_text(prompt);
    r.mutable_stopping()->set_max_new_tokens(max_new);
    r.mutable_response()->set_return_tokens(true);
    return r;
  }
  static worker::sampling::SamplingParams Sampled(uint64_t seed) {
    worker::sampling::SamplingParams p;
    p.do_sample = true;
    p.temperature = 0.9f;
    p.top_k = 50;
    p.top_p = 0.95f;
    p.seed = seed;
    return p;
  }
  static void SetSampling(const worker::sampling::SamplingParams& p, v1::GenerateRequest* r) {
    r->mutable_sampling()->set_do_sample(p.do_sample);
    r->mutable_sampling()->set_temperature(p.temperature);
    r->mutable_sampling()->set_top_k(p.top_k);
    r->mutable_sampling()->set_top_p(p.top_p);
    r->mutable_sampling()->set_seed(p.seed);
  }
  std::string Decode(const std::vector<int32_t>& ids) { return ref_->tokenizer->Decode(ids, true); }
  // A single-process run ends with EOS when its last token is EOS, else at its length.
  static v1::FinishReason ReasonOf(const std::vector<int32_t>& tokens) {
    return !tokens.empty() && tokens.back() == 2 ? v1::FINISH_REASON_EOS : v1::FINISH_REASON_LENGTH;
  }
  // First position >= from where three ASCII bytes start (a valid stop sequence), or npos.
  static size_t AsciiPieceAt(const std::string& text, size_t from) {
    for (size_t p = from; p + 3 <= text.size(); ++p) {
      if (static_cast<unsigned char>(text[p]) < 0x80 &&
          static_cast<unsigned char>(text[p + 1]) < 0x80 &&
          static_cast<unsigned char>(text[p + 2]) < 0x80) {
        return p;
      }
    }
    return std::string::npos;
  }

  static std::mutex reference_mu_;
};

std::mutex ServingTest::reference_mu_;

TEST_F(ServingTest, HealthReflectionInfoAndTokenize) {
  EXPECT_EQ(Health(server_->channel(), ""), kServing);
  EXPECT_EQ(Health(server_->channel(), "deja.v1.TextGeneration"), kServing);
  const std::string listing = ReflectionListing(server_->channel());
  EXPECT_NE(listing.find("deja.v1.TextGeneration"), std::string::npos);
  EXPECT_NE(listing.find("grpc.health.v1.Health"), std::string::npos);

  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::ModelInfo info;
  ASSERT_TRUE(server_->stub().GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.tensor_parallel_size(), 2u);
  EXPECT_EQ(info.vocab_size(), static_cast<uint32_t>(ref_->model->config().vocab_size));
  EXPECT_EQ(info.max_position_embeddings(),
            static_cast<uint32_t>(ref_->model->config().max_position_embeddings));
  EXPECT_EQ(info.eos_token_id(), 2u);
  // What the workers run with, as they report it.
  EXPECT_EQ(info.dtype(), "float16");
  EXPECT_EQ(info.kv_dtype(), "float32");

  grpc::ClientContext tctx;
  SetDeadline(&tctx);
  v1::TokenizeRequest treq;
  treq.set_text("And God said");
  treq.set_add_bos(true);
  v1::TokenizeResponse tresp;
  ASSERT_TRUE(server_->stub().Tokenize(&tctx, treq, &tresp).ok());
  StatusOr<std::vector<int32_t>> ids = ref_->tokenizer->Encode("And God said", true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(std::vector<int32_t>(tresp.ids().begin(), tresp.ids().end()), *ids);
  EXPECT_EQ(tresp.tokens_size(), tresp.ids_size());
}

TEST_F(ServingTest, GreedyMatchesSingleProcessGeneration) {
  for (const std::string prompt : {"And God said", "ROMEO:", "The",
                                   "In the beginning God created the heaven and the earth."}) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    v1::GenerateResponse resp;
    grpc::Status s = server_->stub().Generate(&ctx, Request(prompt, 32), &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    std::vector<int32_t> got;
    for (const v1::Token& t : resp.tokens()) got.push_back(t.id());
    const std::vector<int32_t> want = Reference(prompt, 32);
    EXPECT_EQ(got, want) << prompt;
    EXPECT_EQ(resp.text(), Decode(want)) << prompt;
    EXPECT_EQ(resp.generated_tokens(), want.size());
    EXPECT_EQ(resp.finish_reason(), ReasonOf(want));
  }
}

TEST_F(ServingTest, SeededSamplingIsReproducibleAndMatchesSingleProcess) {
  const worker::sampling::SamplingParams p = Sampled(1234);
  v1::GenerateRequest req = Request("And God said", 24);
  SetSampling(p, &req);
  std::vector<std::vector<int32_t>> runs;
  for (int i = 0; i < 2; ++i) {
    StreamResult r = Stream(server_->stub(), req);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    runs.push_back(r.token_ids);
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(runs[0], Reference("And God said", 24, p));
  // A different seed gives a different continuation.
  SetSampling(Sampled(99), &req);
  StreamResult other = Stream(server_->stub(), req);
  ASSERT_TRUE(other.status.ok());
  EXPECT_NE(other.token_ids, runs[0]);
}

TEST_F(ServingTest, ThirtyTwoConcurrentStreamsWithMixedSettings) {
  const std::vector<std::string> prompts = {"And God said", "ROMEO:",   "The king",
                                            "Thou shalt",   "My lord,", "It was"};
  struct Case {
    v1::GenerateRequest request;
    std::vector<int32_t> want;  // expected tokens
    std::string want_text;
    v1::FinishReason reason = v1::FINISH_REASON_UNSPECIFIED;
    bool check_tokens = true;
  };
  std::vector<Case> cases(32);
  for (int i = 0; i < 32; ++i) {
    Case& c = cases[i];
    const std::string& prompt = prompts[i % prompts.size()];
    const int max_new = 4 + (i * 7) % 29;
    c.request = Request(prompt, max_new);
    c.request.set_request_id("concurrent-" + std::to_string(i));
    worker::sampling::SamplingParams sampling;
    switch (i % 4) {
      case 1:
        sampling = Sampled(1000 + i);
        SetSampling(sampling, &c.request);
        break;
      case 3:
        c.request.mutable_response()->set_top_n_tokens(3);
        break;
      default:
        break;
    }
    c.want = Reference(prompt, max_new, sampling);
    c.want_text = Decode(c.want);
    c.reason = ReasonOf(c.want);
    const size_t at = AsciiPieceAt(c.want_text, c.want_text.size() / 2);
    if (i % 4 == 2 && at != std::string::npos) {
      // Stop on a piece of the greedy text: the text ends right before it.
      const std::string stop = c.want_text.substr(at, 3);
      c.request.mutable_stopping()->add_stop_sequences(stop);
      c.want_text = c.want_text.substr(0, c.want_text.find(stop));
      c.reason = v1::FINISH_REASON_STOP_SEQUENCE;
      c.check_tokens = false;
    }
  }
  std::vector<StreamResult> results(32);
  std::vector<std::thread> threads;
  for (int i = 0; i < 32; ++i) {
    threads.emplace_back([&, i] { results[i] = Stream(server_->stub(), cases[i].request); });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 32; ++i) {
    const StreamResult& r = results[i];
    const Case& c = cases[i];
    ASSERT_TRUE(r.status.ok()) << i << ": " << r.status.error_message();
    ASSERT_TRUE(r.finished_last) << i;
    const v1::GenerateStreamResponse& last = r.messages.back();
    EXPECT_EQ(last.finish_reason(), c.reason) << i;
    EXPECT_EQ(last.request_id(), "concurrent-" + std::to_string(i));
    EXPECT_GT(last.prompt_tokens(), 0u);
    EXPECT_EQ(last.generated_tokens(), r.token_ids.size()) << i;
    EXPECT_EQ(r.text, c.want_text) << i;
    if (c.check_tokens) {
      EXPECT_EQ(r.token_ids, c.want) << i;
    } else {
      EXPECT_EQ(std::vector<int32_t>(c.want.begin(), c.want.begin() + r.token_ids.size()),
                r.token_ids)
          << i;
    }
    for (const auto& m : r.messages) {
      for (const v1::Token& t : m.tokens()) {
        if (i % 4 == 3) {
          EXPECT_EQ(t.top_size(), 3) << i;
          EXPECT_LE(t.logprob(), 0.f);
        }
      }
    }
  }
}

TEST_F(ServingTest, TimeLimitEndsARequestWithItsText) {
  v1::GenerateRequest req = Request("And God said", 900);
  req.mutable_stopping()->set_ignore_eos(true);
  req.mutable_stopping()->set_time_limit_ms(300);
  StreamResult r = Stream(server_->stub(), req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_TRUE(r.finished_last);
  EXPECT_EQ(r.messages.back().finish_reason(), v1::FINISH_REASON_TIME_LIMIT);
  EXPECT_LT(r.token_ids.size(), 900u);
  EXPECT_EQ(r.messages.back().generated_tokens(), r.token_ids.size());
}

// Reserved KV bytes (total - free) of both ranks, as a scrape of /metrics shows them.
std::pair<double, double> KvUsed(int metrics_port) {
  const std::string m = Scrape(metrics_port);
  auto used = [&](const char* rank) {
    const std::string r = std::string("{rank=\"") + rank + "\"}";
    return Metric(m, "deja_worker_kv_total_bytes" + r) - Metric(m, "deja_worker_kv_free_bytes" + r);
  };
  return {used("0"), used("1")};
}

// Waits until both ranks report their KV memory with none of it reserved (the baseline of an
// idle server).
bool WaitKvIdle(int port, milliseconds timeout) {
  const auto end = Clock::now() + timeout;
  while (Clock::now() < end) {
    const std::string m = Scrape(port);
    const bool reported = Metric(m, "deja_worker_kv_total_bytes{rank=\"0\"}") > 0 &&
                          Metric(m, "deja_worker_kv_total_bytes{rank=\"1\"}") > 0;
    if (reported && KvUsed(port) == std::make_pair(0.0, 0.0)) return true;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return false;
}

TEST_F(ServingTest, CancelMidStreamReturnsKvToBaseline) {
  const int port = server_->metrics_port();
  ASSERT_GT(port, 0);
  ASSERT_TRUE(WaitKvIdle(port, milliseconds(3000))) << Scrape(port);
  const std::string idle = Scrape(port);
  ASSERT_GT(Metric(idle, "deja_worker_kv_total_bytes{rank=\"0\"}"), 0) << idle;

  for (const bool by_rpc : {true, false}) {
    v1::GenerateRequest req = Request("And God said", 800);
    req.mutable_stopping()->set_ignore_eos(true);
    req.set_request_id(by_rpc ? "cancel-by-rpc" : "cancel-by-client");
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    auto reader = server_->stub().GenerateStream(&ctx, req);
    v1::GenerateStreamResponse msg;
    int seen = 0;
    while (seen < 5 && reader->Read(&msg)) seen += msg.tokens_size();
    ASSERT_GE(seen, 5);
    const std::pair<double, double> busy = KvUsed(port);
    EXPECT_GT(busy.first, 0);
    EXPECT_GT(busy.second, 0);
    if (by_rpc) {
      grpc::ClientContext cctx;
      SetDeadline(&cctx);
      v1::CancelRequest creq;
      creq.set_request_id(req.request_id());
      v1::CancelResponse cresp;
      ASSERT_TRUE(server_->stub().Cancel(&cctx, creq, &cresp).ok());
      EXPECT_TRUE(cresp.found());
      bool finished = false;
      while (reader->Read(&msg)) finished = msg.finished();
      EXPECT_TRUE(finished);
      EXPECT_EQ(msg.finish_reason(), v1::FINISH_REASON_CANCELLED);
      EXPECT_LT(msg.generated_tokens(), 800u);
      EXPECT_TRUE(reader->Finish().ok());
    } else {
      ctx.TryCancel();
      while (reader->Read(&msg)) {
      }
      EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
    }
    EXPECT_TRUE(WaitKvIdle(port, milliseconds(3000)))
        << "KV usage did not return to the baseline after "
        << (by_rpc ? "Cancel" : "the client went away") << "\n"
        << Scrape(port);
  }
  const std::string m = Scrape(port);
  EXPECT_EQ(Metric(m, "deja_worker_kv_sequences{rank=\"0\"}"), 0);
  EXPECT_EQ(Metric(m, "deja_coordinator_running_requests"), 0);
  grpc::ClientContext cctx;
  SetDeadline(&cctx);
  v1::CancelRequest unknown;
  unknown.set_request_id("never-seen");
  v1::CancelResponse cresp;
  ASSERT_TRUE(server_->stub().Cancel(&cctx, unknown, &cresp).ok());
  EXPECT_FALSE(cresp.found());
}

TEST_F(ServingTest, EveryValidationRuleIsInvalidArgumentNamingTheField) {
  struct Rule {
    std::function<void(v1::GenerateRequest*)> mutate;
    const char* field;
  };
  const std::vector<Rule> rules = {
      {[](auto* r) { r->mutable_sampling()->set_temperature(-1); }, "sampling.temperature"},
      {[](auto* r) { r->mutable_sampling()->set_top_p(0); }, "sampling.top_p"},
      {[](auto* r) { r->mutable_sampling()->set_top_p(1.01f); }, "sampling.top_p"},
      {[](auto* r) { r->mutable_sampling()->set_top_k(-2); }, "sampling.top_k"},
      {[](auto* r) { r->mutable_sampling()->set_repetition_penalty(-1); },
       "sampling.repetition_penalty"},
      {[](auto* r) { r->mutable_stopping()->set_max_new_tokens(0); }, "stopping.max_new_tokens"},
      {[](auto* r) { r->mutable_stopping()->set_max_new_tokens(100000); },
       "stopping.max_new_tokens"},
      {[](auto* r) {
         for (int i = 0; i < 2000; ++i) r->mutable_token_ids()->add_ids(5);
       },
       "input"},
      {[](auto* r) { r->set_text(""); }, "input"},
      {[](auto* r) { r->clear_input(); }, "input"},
      {[](auto* r) { r->set_text("caf\xc3"); }, "text"},
      {[](auto* r) { r->mutable_token_ids()->add_ids(1 << 20); }, "token_ids.ids[0]"},
      {[](auto* r) {
         for (int i = 0; i < 5; ++i) r->mutable_stopping()->add_stop_sequences("x");
       },
       "stopping.stop_sequences"},
      {[](auto* r) { r->mutable_stopping()->add_stop_sequences(std::string(300, 'a')); },
       "stopping.stop_sequences[0]"},
      {[](auto* r) { r->mutable_response()->set_top_n_tokens(6); }, "response.top_n_tokens"},
      {[](auto* r) { r->set_request_id("bad id"); }, "request_id"},
  };
  for (size_t i = 0; i < rules.size(); ++i) {
    v1::GenerateRequest req = Request("Hello", 4);
    rules[i].mutate(&req);
    for (const bool stream : {false, true}) {
      grpc::Status s;
      if (stream) {
        s = Stream(server_->stub(), req).status;
      } else {
        grpc::ClientContext ctx;
        SetDeadline(&ctx);
        v1::GenerateResponse resp;
        s = server_->stub().Generate(&ctx, req, &resp);
      }
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << i << " " << rules[i].field;
      EXPECT_EQ(s.error_message().rfind(rules[i].field, 0), 0u)
          << rules[i].field << ": " << s.error_message();
    }
  }
  const std::string m = Scrape(server_->metrics_port());
  EXPECT_GE(Metric(m, "deja_coordinator_rejections_total{protocol=\"grpc\",reason=\"invalid_argument\"}"),
            2.0 * rules.size());
}

// The defaults (--dtype auto, --kv-dtype auto): the workers pick bf16 weights on a CPU with
// AVX512-BF16 (else the checkpoint's f16) and an f16 KV cache, and ModelInfo reports what they
// run with.
TEST(AutoDtypeServingTest, ModelInfoReportsWhatTheWorkersChose) {
  Server server("auto_dtype", {DEJA_BINARY, "serve", "--model", ModelDir(), "--tp", "1", "--port",
                               "0", "--metrics-port", "-1", "--http-port", "-1", "--threads", "1"});
  ASSERT_TRUE(server.WaitListening()) << server.Log();
  ASSERT_TRUE(WaitHealth(server.channel(), kServing)) << server.Log();
  const v1::ModelInfo info = ModelInfoOf(server.stub());
  EXPECT_EQ(info.dtype(), kernels::cpu::Bf16DotAvailable() ? "bfloat16" : "float16");
  EXPECT_EQ(info.kv_dtype(), "float16");
  EXPECT_NE(server.Log().find("--dtype/--kv-dtype auto: "), std::string::npos) << server.Log();
}

// --dtype int8 at TP 2: each rank quantizes its slices at load, ModelInfo says int8, and greedy
// generation runs and stops at its length.
TEST(Int8ServingTest, TensorParallelInt8Serves) {
  Server server("int8", {DEJA_BINARY, "serve", "--model", ModelDir(), "--tp", "2", "--port", "0",
                         "--metrics-port", "-1", "--http-port", "-1", "--threads", "2", "--dtype", "int8"});
  ASSERT_TRUE(server.WaitListening()) << server.Log();
  ASSERT_TRUE(WaitHealth(server.channel(), kServing)) << server.Log();
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    v1::ModelInfo info;
    ASSERT_TRUE(server.stub().GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
    EXPECT_EQ(info.dtype(), "int8");
  }
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::GenerateRequest req;
  req.set_text("And God said");
  req.mutable_stopping()->set_max_new_tokens(16);
  req.mutable_stopping()->set_ignore_eos(true);
  v1::GenerateResponse resp;
  grpc::Status s = server.stub().Generate(&ctx, req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.generated_tokens(), 16u);
  EXPECT_EQ(resp.finish_reason(), v1::FINISH_REASON_LENGTH);
}

// Paged KV memory (the default) too small for the streams at once: 1 MiB per rank holds 7
// blocks of 32 positions of opt-mini at TP 2 and f32, and each stream reaches 4. Streams are
// admitted on the blocks they use, the newest are preempted when blocks run out and recompute
// their tokens later; every stream still gets the tokens it gets alone (greedy), and /metrics
// counts the preemptions.
TEST(PagedKvServingTest, PreemptedStreamsGiveTheTokensTheyGiveAlone) {
  Server server("paged", ServeArgs({"--kv-memory-mb", "1", "--wait-for-kv", "--max-batch-sequences",
                                    "16", "--max-queue", "64"}));
  ASSERT_TRUE(server.WaitListening()) << server.Log();
  ASSERT_TRUE(WaitHealth(server.channel(), kServing)) << server.Log();
  std::unique_ptr<ReferenceModel> ref = ReferenceModel::Load();
  ASSERT_TRUE(ref->ok());
  const std::vector<std::string> prompts = {
      "And God said",       "ROMEO:",  "The",     "In the beginning",
      "Let there be light", "O Romeo", "Hear me", "Now"};
  constexpr int kMaxNew = 90;
  std::vector<v1::GenerateResponse> got(prompts.size());
  std::vector<grpc::Status> status(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i) {
    threads.emplace_back([&, i] {
      v1::GenerateRequest r;
      r.set_text(prompts[i]);
      r.mutable_stopping()->set_max_new_tokens(kMaxNew);
      r.mutable_stopping()->set_ignore_eos(true);
      r.mutable_response()->set_return_tokens(true);
      grpc::ClientContext ctx;
      SetDeadline(&ctx);
      status[i] = server.stub().Generate(&ctx, r, &got[i]);
    });
  }
  for (auto& t : threads) t.join();
  worker::model::GenerationOptions o;
  o.max_new_tokens = kMaxNew;
  o.stop_at_eos = false;
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(status[i].ok()) << prompts[i] << ": " << status[i].error_message();
    std::vector<int32_t> ids;
    for (const v1::Token& t : got[i].tokens()) ids.push_back(t.id());
    EXPECT_EQ(ids, ref->Generate(prompts[i], o)) << prompts[i];
    EXPECT_EQ(got[i].generated_tokens(), static_cast<uint32_t>(kMaxNew));
  }
  const std::string m = Scrape(server.metrics_port());
  EXPECT_GT(Metric(m, "deja_coordinator_preemptions_total"), 0) << server.Log();
  EXPECT_EQ(Metric(m, "deja_coordinator_kv_reserved_bytes"), 0);
}

TEST_F(ServingTest, MetricsHaveEveryFamily) {
  const std::string m = Scrape(server_->metrics_port());
  for (const char* family : {"deja_coordinator_requests_total",
                             "deja_coordinator_rejections_total",
                             "deja_coordinator_request_duration_seconds",
                             "deja_coordinator_queue_duration_seconds",
                             "deja_coordinator_time_to_first_token_seconds",
                             "deja_coordinator_inter_token_latency_seconds",
                             "deja_coordinator_prompt_tokens_total",
                             "deja_coordinator_generated_tokens_total",
                             "deja_coordinator_running_requests",
                             "deja_coordinator_waiting_requests",
                             "deja_coordinator_batch_size_sequences",
                             "deja_coordinator_step_duration_seconds",
                             "deja_coordinator_kv_cache_usage_ratio",
                             "deja_worker_up",
                             "deja_worker_step_duration_seconds",
                             "deja_worker_allreduce_duration_seconds",
                             "deja_worker_failures_total",
                             "deja_worker_last_heartbeat_timestamp_seconds",
                             "deja_sparsity_active_head_fraction",
                             "deja_sparsity_active_neuron_fraction",
                             "deja_sparsity_sequence_steps_total",
                             "deja_build_info",
                             "deja_model_info"}) {
    EXPECT_NE(m.find("# TYPE " + std::string(family) + " "), std::string::npos) << family;
  }
  EXPECT_EQ(Metric(m, "deja_worker_up{rank=\"1\"}"), 1);
  EXPECT_GT(Metric(m, "deja_worker_last_heartbeat_timestamp_seconds{rank=\"0\"}"), 1e9);
}

}  // namespace
}  // namespace deja::serving_test
