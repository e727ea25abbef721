// Engine over a fake worker group: streaming, finish reasons, concurrency, cancellation, a lost
// group, drain and admission, with the step protocol checked on every step.
#include "coordinator/engine.h"

#include <gtest/gtest.h>

#include <atomic>

#include "coordinator_test_util.h"

namespace deja::coordinator {
namespace {

using std::chrono::milliseconds;

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tokenizer_ = test::LoadTokenizer();
    ASSERT_NE(tokenizer_, nullptr);
    metrics_ = std::make_unique<CoordinatorMetrics>(&registry_, ModelInfoLabels{"m", "f16", 2});
    StatusOr<std::vector<int32_t>> script = tokenizer_->Encode(kScript, false);
    ASSERT_TRUE(script.ok());
    script_ = *script;
    client_ = std::make_unique<test::FakeEngineClient>(script_);
    options_.limits.vocab_size = 8192;
    options_.limits.max_positions = 256;
    options_.limits.default_max_new_tokens = 8;
    options_.limits.default_cache.set_kind(v1::CachePolicy::KIND_FULL);
    options_.scheduler.max_prefill_tokens = 16;
  }
  void TearDown() override {
    engine_.reset();
    if (client_) {
      EXPECT_EQ(client_->protocol_error(), "");
    }
  }
  void StartEngine() {
    engine_ = std::make_unique<Engine>(options_, tokenizer_.get(), client_.get(), metrics_.get());
  }
  struct Call {
    std::shared_ptr<Request> request;
    std::shared_ptr<test::RecordingSink> sink;
    Status status;
  };
  Call Submit(const v1::GenerateRequest& req) {
    Call c;
    c.sink = std::make_shared<test::RecordingSink>();
    StatusOr<std::shared_ptr<Request>> r = engine_->Submit(req, std::nullopt, c.sink);
    if (r.ok()) {
      c.request = *r;
    } else {
      c.status = r.status();
    }
    return c;
  }
  static v1::GenerateRequest Text(const std::string& text, int max_new) {
    v1::GenerateRequest r;
    r.set_text(text);
    r.mutable_stopping()->set_max_new_tokens(max_new);
    return r;
  }
  // Script text of the first n tokens.
  std::string ScriptText(int n) {
    return tokenizer_->Decode({script_.begin(), script_.begin() + n}, true);
  }
  bool WaitFor(const std::function<bool()>& cond, milliseconds timeout = milliseconds(5000)) {
    const auto end = Clock::now() + timeout;
    while (Clock::now() < end) {
      if (cond()) return true;
      std::this_thread::sleep_for(milliseconds(2));
    }
    return cond();
  }

  static constexpr const char* kScript =
      " one two three four five six seven eight nine ten eleven twelve thirteen fourteen";
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<int32_t> script_;
  metrics::Registry registry_;
  std::unique_ptr<CoordinatorMetrics> metrics_;
  std::unique_ptr<test::FakeEngineClient> client_;
  EngineOptions options_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(EngineTest, StreamsDeltasAndAFinalMessage) {
  StartEngine();
  v1::GenerateRequest req = Text("Hello", 6);
  req.mutable_response()->set_top_n_tokens(2);
  Call c = Submit(req);
  ASSERT_TRUE(c.status.ok()) << c.status.ToString();
  ASSERT_TRUE(c.sink->WaitDone());
  EXPECT_TRUE(c.sink->error().ok());
  EXPECT_EQ(c.sink->text(), ScriptText(6));
  const v1::GenerateStreamResponse last = c.sink->last();
  EXPECT_TRUE(last.finished());
  EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(last.generated_tokens(), 6u);
  EXPECT_EQ(last.prompt_tokens(), c.request->params().prompt.size());
  EXPECT_GT(last.timings().total_ms(), 0.0);
  int tokens = 0;
  for (const auto& m : c.sink->messages()) {
    EXPECT_EQ(m.request_id(), c.request->id());
    for (const v1::Token& t : m.tokens()) {
      EXPECT_EQ(t.id(), script_[tokens]);
      EXPECT_FLOAT_EQ(t.logprob(), -0.5f);
      EXPECT_EQ(t.top_size(), 2);
      ++tokens;
    }
  }
  EXPECT_EQ(tokens, 6);
  // The finished sequence is released even though no other work follows.
  EXPECT_TRUE(WaitFor([&] { return client_->live_sequences() == 0; }));
}

TEST_F(EngineTest, FinishReasons) {
  StartEngine();
  // EOS at the 4th token.
  client_->SetTokenFn([&](const std::vector<int32_t>&, int n) {
    return n == 3 ? 2 : script_[static_cast<size_t>(n)];
  });
  Call eos = Submit(Text("a", 10));
  ASSERT_TRUE(eos.sink->WaitDone());
  EXPECT_EQ(eos.sink->last().finish_reason(), v1::FINISH_REASON_EOS);
  EXPECT_EQ(eos.sink->last().generated_tokens(), 4u);
  EXPECT_EQ(eos.sink->text(), ScriptText(3));

  v1::GenerateRequest ignore = Text("a", 6);
  ignore.mutable_stopping()->set_ignore_eos(true);
  Call ign = Submit(ignore);
  ASSERT_TRUE(ign.sink->WaitDone());
  EXPECT_EQ(ign.sink->last().finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(ign.sink->last().generated_tokens(), 6u);

  client_->SetTokenFn(
      [&](const std::vector<int32_t>&, int n) { return script_[static_cast<size_t>(n)]; });
  v1::GenerateRequest stop = Text("a", 12);
  stop.mutable_stopping()->add_stop_sequences("four");
  Call st = Submit(stop);
  ASSERT_TRUE(st.sink->WaitDone());
  EXPECT_EQ(st.sink->last().finish_reason(), v1::FINISH_REASON_STOP_SEQUENCE);
  EXPECT_EQ(st.sink->text(), " one two three ");

  v1::GenerateRequest stop_id = Text("a", 12);
  stop_id.mutable_stopping()->add_stop_token_ids(script_[2]);
  Call sid = Submit(stop_id);
  ASSERT_TRUE(sid.sink->WaitDone());
  EXPECT_EQ(sid.sink->last().finish_reason(), v1::FINISH_REASON_STOP_SEQUENCE);
  EXPECT_EQ(sid.sink->last().generated_tokens(), 3u);
  EXPECT_EQ(sid.sink->text(), ScriptText(2));
}

TEST_F(EngineTest, ManyConcurrentRequestsShareSteps) {
  options_.scheduler.max_batch_sequences = 16;
  options_.scheduler.max_waiting = 64;
  client_->SetDelay(milliseconds(1));
  StartEngine();
  std::vector<Call> calls;
  for (int i = 0; i < 32; ++i) {
    v1::GenerateRequest req = Text("Request number " + std::to_string(i), 1 + i % 9);
    if (i % 3 == 0) req.mutable_stopping()->add_stop_sequences("five");
    calls.push_back(Submit(req));
    ASSERT_TRUE(calls.back().status.ok()) << calls.back().status.ToString();
  }
  for (int i = 0; i < 32; ++i) {
    ASSERT_TRUE(calls[i].sink->WaitDone()) << i;
    const int n = 1 + i % 9;
    const v1::GenerateStreamResponse last = calls[i].sink->last();
    if (i % 3 == 0 && n >= 5) {
      EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_STOP_SEQUENCE) << i;
      EXPECT_EQ(calls[i].sink->text(), " one two three four ") << i;
    } else {
      EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_LENGTH) << i;
      EXPECT_EQ(last.generated_tokens(), static_cast<uint32_t>(n)) << i;
      EXPECT_EQ(calls[i].sink->text(), ScriptText(n)) << i;
    }
  }
  size_t widest = 0;
  for (const v1::StepRequest& s : client_->steps()) {
    widest = std::max(widest, static_cast<size_t>(s.sequences_size()));
  }
  EXPECT_GT(widest, 4u);
  EXPECT_LE(widest, 16u);
  EXPECT_TRUE(WaitFor([&] { return client_->live_sequences() == 0; }));
}

TEST_F(EngineTest, CancelByIdAndClientGoneFreeTheirKv) {
  client_->SetDelay(milliseconds(2));
  StartEngine();
  v1::GenerateRequest req = Text("Hello", 200);
  req.set_request_id("to-cancel");
  Call a = Submit(req);
  Call b = Submit(Text("Hello", 200));
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  // Decoding, as the streams show (the request's own counters belong to the engine thread).
  ASSERT_TRUE(
      WaitFor([&] { return a.sink->messages().size() >= 3 && b.sink->messages().size() >= 3; }));
  EXPECT_EQ(client_->live_sequences(), 2u);
  EXPECT_TRUE(engine_->Cancel("to-cancel"));
  EXPECT_FALSE(engine_->Cancel("unknown"));
  engine_->ClientGone(b.request);
  ASSERT_TRUE(a.sink->WaitDone());
  ASSERT_TRUE(b.sink->WaitDone());
  EXPECT_EQ(a.sink->last().finish_reason(), v1::FINISH_REASON_CANCELLED);
  EXPECT_EQ(b.sink->error().code(), StatusCode::kCancelled);
  EXPECT_TRUE(WaitFor([&] { return client_->live_sequences() == 0; }));
}

TEST_F(EngineTest, LostGroupFailsRequestsThenNewGroupServes) {
  client_->SetDelay(milliseconds(2));
  StartEngine();
  Call a = Submit(Text("Hello", 100));
  ASSERT_TRUE(a.status.ok());
  ASSERT_TRUE(WaitFor([&] { return a.sink->messages().size() >= 2; }));
  const auto lost_at = Clock::now();
  client_->LoseGroupAtNextStep();
  ASSERT_TRUE(a.sink->WaitDone());
  EXPECT_LT(Clock::now() - lost_at, milliseconds(1000));
  EXPECT_EQ(a.sink->error().code(), StatusCode::kUnavailable);
  EXPECT_FALSE(engine_->Ready());
  Call refused = Submit(Text("Hello", 3));
  EXPECT_EQ(refused.status.code(), StatusCode::kUnavailable);

  client_->SetReady(true, 2);
  ASSERT_TRUE(WaitFor([&] { return engine_->Ready(); }));
  Call b = Submit(Text("Hello", 3));
  ASSERT_TRUE(b.status.ok()) << b.status.ToString();
  ASSERT_TRUE(b.sink->WaitDone());
  EXPECT_EQ(b.sink->last().finish_reason(), v1::FINISH_REASON_LENGTH);
}

TEST_F(EngineTest, GroupReplacedWhileIdleFailsQueuedWork) {
  StartEngine();
  client_->SetReady(false, 0);
  Call refused = Submit(Text("Hello", 3));
  EXPECT_EQ(refused.status.code(), StatusCode::kUnavailable);
  EXPECT_NE(refused.status.message().find("no worker group"), std::string::npos);
}

TEST_F(EngineTest, RankErrorFailsOnlyThatStepsRequests) {
  StartEngine();
  client_->ErrorAtNextStep(static_cast<int>(StatusCode::kOutOfRange));
  Call a = Submit(Text("Hello", 3));
  ASSERT_TRUE(a.sink->WaitDone());
  EXPECT_EQ(a.sink->error().code(), StatusCode::kOutOfRange);
  Call b = Submit(Text("Hello", 3));
  ASSERT_TRUE(b.sink->WaitDone());
  EXPECT_TRUE(b.sink->error().ok());
  EXPECT_TRUE(engine_->Ready());
}

// A sequence the workers refuse fails alone, with their error, in the middle of other streams:
// those stream every token they would have streamed alone, and the engine stays ready.
TEST_F(EngineTest, ARefusedSequenceFailsAloneAndTheOthersComplete) {
  client_->SetDelay(milliseconds(1));
  StartEngine();
  Call a = Submit(Text("Hello", 10));
  ASSERT_TRUE(a.status.ok());
  ASSERT_TRUE(WaitFor([&] { return a.request->generated() >= 2; }));
  // The third admitted request is refused at its 3rd decode step (position prompt + 2).
  std::atomic<uint64_t> bad_seq{0};
  client_->SetRefuseFn([&bad_seq](const v1::SequenceWork& w) {
    return w.seq_id() == bad_seq.load() && w.start_position() >= 3;
  });
  Call b = Submit(Text("Hello", 10));
  ASSERT_TRUE(b.status.ok());
  bad_seq = b.request->seq_id() + 1;  // sequence ids are handed out in order
  Call bad = Submit(Text("Hi", 10));
  ASSERT_TRUE(bad.status.ok());
  ASSERT_EQ(bad.request->seq_id(), bad_seq.load());
  Call c = Submit(Text("Hello", 10));
  ASSERT_TRUE(c.status.ok());
  ASSERT_TRUE(bad.sink->WaitDone());
  EXPECT_EQ(bad.sink->error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.sink->error().message().find("injected"), std::string::npos);
  for (Call* call : {&a, &b, &c}) {
    ASSERT_TRUE(call->sink->WaitDone());
    EXPECT_TRUE(call->sink->error().ok()) << call->sink->error().ToString();
    EXPECT_EQ(call->sink->text(), ScriptText(10));
    EXPECT_EQ(call->sink->last().finish_reason(), v1::FINISH_REASON_LENGTH);
  }
  EXPECT_TRUE(engine_->Ready());
  // The refused sequence is released like the others.
  EXPECT_TRUE(WaitFor([&] { return client_->live_sequences() == 0; }));
}

TEST_F(EngineTest, DrainRefusesNewAndFinishesRunning) {
  client_->SetDelay(milliseconds(2));
  StartEngine();
  Call a = Submit(Text("Hello", 20));
  ASSERT_TRUE(a.status.ok());
  engine_->StartDrain();
  EXPECT_FALSE(engine_->Ready());
  Call refused = Submit(Text("Hello", 3));
  EXPECT_EQ(refused.status.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(engine_->WaitIdle(milliseconds(5000)));
  EXPECT_EQ(a.sink->last().finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(a.sink->last().generated_tokens(), 20u);
}

TEST_F(EngineTest, DrainTimeoutFailsTheRest) {
  client_->SetDelay(milliseconds(5));
  StartEngine();
  Call a = Submit(Text("Hello", 200));
  engine_->StartDrain();
  EXPECT_FALSE(engine_->WaitIdle(milliseconds(50)));
  engine_->FailAll(Unavailable("shutting down"));
  ASSERT_TRUE(a.sink->WaitDone());
  EXPECT_EQ(a.sink->error().code(), StatusCode::kUnavailable);
}

TEST_F(EngineTest, QueueAndKvLimitsGiveResourceExhausted) {
  options_.scheduler.max_batch_sequences = 1;
  options_.scheduler.max_waiting = 1;
  client_->SetDelay(milliseconds(5));
  StartEngine();
  Call a = Submit(Text("Hello", 100));
  ASSERT_TRUE(WaitFor([&] { return !a.sink->messages().empty(); }));
  Call b = Submit(Text("Hello", 100));
  Call c = Submit(Text("Hello", 100));
  EXPECT_TRUE(b.status.ok());
  EXPECT_EQ(c.status.code(), StatusCode::kResourceExhausted);
  engine_->FailAll(Unavailable("done"));

  client_->SetKv(1024 * 50, 1024);  // 50 positions
  ASSERT_TRUE(WaitFor([&] { return engine_->WaitIdle(milliseconds(0)); }));
  client_->SetReady(true, 7);  // a new epoch brings the new capacity
  ASSERT_TRUE(WaitFor([&] { return engine_->Ready(); }));
  Call d = Submit(Text("Hello", 100));
  EXPECT_EQ(d.status.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(d.status.message().find("KV"), std::string::npos);
}

TEST_F(EngineTest, InvalidRequestsAreRefused) {
  StartEngine();
  v1::GenerateRequest req = Text("Hello", 3);
  req.mutable_sampling()->set_top_p(2.f);
  Call a = Submit(req);
  EXPECT_EQ(a.status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a.status.message().rfind("sampling.top_p", 0), 0u);
  v1::GenerateRequest dup = Text("Hello", 100);
  dup.set_request_id("dup");
  client_->SetDelay(milliseconds(5));
  Call first = Submit(dup);
  Call second = Submit(dup);
  EXPECT_TRUE(first.status.ok());
  EXPECT_EQ(second.status.code(), StatusCode::kAlreadyExists);
}

}  // namespace
}  // namespace deja::coordinator
