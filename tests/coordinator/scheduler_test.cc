// Scheduler: chunked prefill interleaved with decode, admission by queue length and KV bytes,
// and requests leaving the batch (with their KV released) within one step.
#include "coordinator/scheduler.h"

#include <gtest/gtest.h>

#include <set>
#include <unordered_map>

#include "coordinator_test_util.h"

namespace deja::coordinator {
namespace {

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tokenizer_ = test::LoadTokenizer();
    ASSERT_NE(tokenizer_, nullptr);
    metrics_ = std::make_unique<CoordinatorMetrics>(&registry_, ModelInfoLabels{"m", "f16", 2});
    options_.max_prefill_tokens = 8;
    options_.max_batch_sequences = 4;
    options_.max_waiting = 2;
  }

  struct Made {
    std::shared_ptr<Request> request;
    std::shared_ptr<test::RecordingSink> sink;
  };
  Made Make(const std::string& id, int prompt_len, int max_new,
            std::optional<Clock::time_point> deadline = std::nullopt, uint32_t time_limit = 0,
            const v1::WorkerCachePolicy& cache = {}) {
    ResolvedRequest p;
    p.request_id = id;
    for (int i = 0; i < prompt_len; ++i) p.prompt.push_back(100 + i);
    p.max_new_tokens = max_new;
    p.time_limit_ms = time_limit;
    p.config.set_prompt_tokens(static_cast<uint32_t>(prompt_len));
    p.config.set_max_new_tokens(static_cast<uint32_t>(max_new));
    *p.config.mutable_cache() = cache;
    auto sink = std::make_shared<test::RecordingSink>();
    auto r = std::make_shared<Request>(id, next_seq_++, std::move(p), tokenizer_.get(),
                                       metrics_.get(), Clock::now(), deadline, sink);
    return {r, sink};
  }
  // rank 0's answer: token 500 + step for every sampled sequence.
  // Rank 0's answer (and an empty rank 1's) to a planned step.
  static std::vector<v1::StepResponse> Answer(const StepPlan& plan, int32_t token = 500) {
    std::vector<v1::StepResponse> resp(2);
    resp[1].set_rank(1);
    for (size_t i = 0; i < plan.work.size(); ++i) {
      v1::SequenceResult* r = resp[0].add_results();
      r->set_seq_id(plan.step.sequences(static_cast<int>(i)).seq_id());
      r->set_token_id(plan.work[i].sample ? token : -1);
    }
    return resp;
  }
  static std::vector<uint64_t> Releases(const StepPlan& plan) {
    return {plan.step.release_seq_ids().begin(), plan.step.release_seq_ids().end()};
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  metrics::Registry registry_;
  std::unique_ptr<CoordinatorMetrics> metrics_;
  SchedulerOptions options_;
  uint64_t next_seq_ = 1;
};

TEST_F(SchedulerTest, ChunkedPrefillInterleavesWithDecode) {
  Scheduler s(options_);
  std::string reason;
  Made a = Make("a", 4, 10);
  ASSERT_TRUE(s.Admit(a.request, &reason).ok());
  StepPlan p1 = s.Plan(Clock::now());
  ASSERT_EQ(p1.step.sequences_size(), 1);
  EXPECT_EQ(p1.step.sequences(0).tokens_size(), 4);
  EXPECT_TRUE(p1.step.sequences(0).sample());
  EXPECT_TRUE(p1.step.sequences(0).has_config());
  s.Complete(p1, Answer(p1), Clock::now());
  EXPECT_EQ(a.request->generated(), 1);

  Made b = Make("b", 20, 3);
  ASSERT_TRUE(s.Admit(b.request, &reason).ok());
  // B's 20-token prompt takes three steps of at most 8 tokens; A decodes in each of them.
  const int chunks[] = {8, 8, 4};
  for (int step = 0; step < 3; ++step) {
    StepPlan p = s.Plan(Clock::now());
    ASSERT_EQ(p.step.sequences_size(), 2) << step;
    const v1::SequenceWork& decode = p.step.sequences(0);
    EXPECT_EQ(decode.seq_id(), a.request->seq_id());
    EXPECT_EQ(decode.tokens_size(), 1);
    EXPECT_EQ(decode.start_position(), static_cast<uint32_t>(4 + step));
    EXPECT_FALSE(decode.has_config());
    const v1::SequenceWork& prefill = p.step.sequences(1);
    EXPECT_EQ(prefill.seq_id(), b.request->seq_id());
    EXPECT_EQ(prefill.tokens_size(), chunks[step]);
    EXPECT_EQ(prefill.start_position(), static_cast<uint32_t>(8 * step));
    EXPECT_EQ(prefill.has_config(), step == 0);
    EXPECT_EQ(prefill.sample(), step == 2);
    EXPECT_LE(p.tokens, 1 + options_.max_prefill_tokens);
    s.Complete(p, Answer(p), Clock::now());
  }
  EXPECT_EQ(b.request->generated(), 1);
  StepPlan p5 = s.Plan(Clock::now());
  ASSERT_EQ(p5.step.sequences_size(), 2);
  EXPECT_EQ(p5.step.sequences(1).start_position(), 20u);
  EXPECT_EQ(p5.step.sequences(1).tokens(0), 500);
}

TEST_F(SchedulerTest, FinishedSequenceIsReleasedInTheNextStep) {
  Scheduler s(options_);
  std::string reason;
  Made a = Make("a", 3, 2);
  ASSERT_TRUE(s.Admit(a.request, &reason).ok());
  StepPlan p1 = s.Plan(Clock::now());
  s.Complete(p1, Answer(p1), Clock::now());
  StepPlan p2 = s.Plan(Clock::now());
  s.Complete(p2, Answer(p2), Clock::now());
  ASSERT_TRUE(a.sink->done());
  EXPECT_EQ(a.sink->last().finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(a.sink->last().generated_tokens(), 2u);
  EXPECT_EQ(a.sink->last().prompt_tokens(), 3u);
  EXPECT_EQ(s.running(), 0u);
  StepPlan p3 = s.Plan(Clock::now());
  EXPECT_EQ(p3.step.sequences_size(), 0);
  EXPECT_EQ(Releases(p3), std::vector<uint64_t>{a.request->seq_id()});
  EXPECT_TRUE(s.idle());
}

// A sequence one rank refuses fails alone with that rank's error and is released next step; the
// others of the step take their tokens and go on.
TEST_F(SchedulerTest, ARefusedSequenceFailsAloneAndIsReleased) {
  options_.max_prefill_tokens = 16;
  options_.max_waiting = 4;
  Scheduler s(options_);
  std::string reason;
  Made a = Make("a", 3, 5);
  Made b = Make("b", 3, 5);
  Made c = Make("c", 3, 5);
  for (const Made* m : {&a, &b, &c}) ASSERT_TRUE(s.Admit(m->request, &reason).ok());
  StepPlan p1 = s.Plan(Clock::now());
  ASSERT_EQ(p1.step.sequences_size(), 3);
  std::vector<v1::StepResponse> resp = Answer(p1);
  // Rank 1 refuses b (rank 0 answers it as refused too, with its token left at -1).
  v1::SequenceResult* refused = resp[1].add_results();
  refused->set_seq_id(b.request->seq_id());
  refused->set_token_id(-1);
  refused->set_error_code(static_cast<int>(StatusCode::kOutOfRange));
  refused->set_error_message("seq_id 2: 3 tokens exceed the sequence's KV capacity of 1");
  s.Complete(p1, resp, Clock::now());
  ASSERT_TRUE(b.sink->done());
  EXPECT_EQ(b.sink->error().code(), StatusCode::kOutOfRange);
  EXPECT_NE(b.sink->error().message().find("worker rank 1"), std::string::npos)
      << b.sink->error().message();
  EXPECT_FALSE(a.sink->done());
  EXPECT_FALSE(c.sink->done());
  EXPECT_EQ(a.request->generated(), 1);
  EXPECT_EQ(c.request->generated(), 1);
  EXPECT_EQ(s.running(), 2u);
  StepPlan p2 = s.Plan(Clock::now());
  EXPECT_EQ(Releases(p2), std::vector<uint64_t>{b.request->seq_id()});
  ASSERT_EQ(p2.step.sequences_size(), 2);
  EXPECT_EQ(p2.step.sequences(0).seq_id(), a.request->seq_id());
  EXPECT_EQ(p2.step.sequences(1).seq_id(), c.request->seq_id());
}

TEST_F(SchedulerTest, CancelLeavesTheBatchWithinOneStep) {
  Scheduler s(options_);
  std::string reason;
  Made a = Make("a", 3, 50);
  Made b = Make("b", 3, 50);
  ASSERT_TRUE(s.Admit(a.request, &reason).ok());
  ASSERT_TRUE(s.Admit(b.request, &reason).ok());
  StepPlan p1 = s.Plan(Clock::now());
  s.Complete(p1, Answer(p1), Clock::now());
  EXPECT_TRUE(s.Cancel("a", CancelKind::kByRequest));
  EXPECT_FALSE(s.Cancel("nope", CancelKind::kByRequest));
  b.request->RequestCancel(CancelKind::kClientGone);
  StepPlan p2 = s.Plan(Clock::now());
  EXPECT_EQ(p2.step.sequences_size(), 0);
  std::vector<uint64_t> released = Releases(p2);
  std::sort(released.begin(), released.end());
  EXPECT_EQ(released, (std::vector<uint64_t>{a.request->seq_id(), b.request->seq_id()}));
  EXPECT_EQ(a.sink->last().finish_reason(), v1::FINISH_REASON_CANCELLED);
  EXPECT_TRUE(a.sink->error().ok());
  EXPECT_EQ(b.sink->error().code(), StatusCode::kCancelled);
  EXPECT_EQ(s.reserved_bytes(), 0u);
}

TEST_F(SchedulerTest, QueuedRequestCancelledBeforeItStartsNeedsNoRelease) {
  Scheduler s(options_);
  std::string reason;
  Made a = Make("a", 3, 5);
  ASSERT_TRUE(s.Admit(a.request, &reason).ok());
  EXPECT_TRUE(s.Cancel("a", CancelKind::kByRequest));
  StepPlan p = s.Plan(Clock::now());
  EXPECT_TRUE(p.empty());
  EXPECT_TRUE(a.sink->done());
}

TEST_F(SchedulerTest, DeadlineAndTimeLimit) {
  Scheduler s(options_);
  std::string reason;
  Made a = Make("a", 3, 50, Clock::now() - std::chrono::milliseconds(1));
  Made b = Make("b", 3, 50, std::nullopt, /*time_limit=*/1);
  ASSERT_TRUE(s.Admit(a.request, &reason).ok());
  ASSERT_TRUE(s.Admit(b.request, &reason).ok());
  StepPlan p = s.Plan(Clock::now() + std::chrono::milliseconds(5));
  EXPECT_TRUE(p.empty());
  EXPECT_EQ(a.sink->error().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(b.sink->last().finish_reason(), v1::FINISH_REASON_TIME_LIMIT);
}

TEST_F(SchedulerTest, QueueFullIsRefusedAtOnce) {
  options_.max_batch_sequences = 1;
  Scheduler s(options_);
  std::string reason;
  Made a = Make("a", 3, 5), b = Make("b", 3, 5), c = Make("c", 3, 5);
  ASSERT_TRUE(s.Admit(a.request, &reason).ok());
  ASSERT_TRUE(s.Admit(b.request, &reason).ok());
  Status st = s.Admit(c.request, &reason);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(reason, "queue_full");
  // Starting one makes room in the queue.
  StepPlan p = s.Plan(Clock::now());
  EXPECT_EQ(p.step.sequences_size(), 1);
  EXPECT_EQ(s.waiting(), 1u);
  EXPECT_TRUE(s.Admit(c.request, &reason).ok());
}

// Without wait_for_kv (the default) a request that finds the KV memory taken is refused.
TEST_F(SchedulerTest, KvAdmissionReservesWorstCase) {
  Scheduler s(options_);
  // 100 positions of 10 bytes.
  s.SetKvCapacity({1000, 10});
  std::string reason;
  Made a = Make("a", 10, 50);      // 600 bytes
  Made b = Make("b", 10, 50);      // 600 more: does not fit
  Made huge = Make("h", 10, 200);  // 2100 bytes: never fits
  ASSERT_TRUE(s.Admit(a.request, &reason).ok());
  EXPECT_EQ(s.reserved_bytes(), 600u);
  Status st = s.Admit(b.request, &reason);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(reason, "kv_full");
  st = s.Admit(huge.request, &reason);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("max_new_tokens"), std::string::npos);
  s.Cancel("a", CancelKind::kByRequest);
  s.Plan(Clock::now());
  EXPECT_EQ(s.reserved_bytes(), 0u);
  EXPECT_TRUE(s.Admit(b.request, &reason).ok());
}

// With wait_for_kv a request that fits the workers' KV memory but finds it taken waits in the
// queue (first come, first served) and joins the batch when a sequence's reservation is
// released; one that could never fit is refused at once.
TEST_F(SchedulerTest, WaitForKvQueuesUntilMemoryIsFreeAndRefusesWhatNeverFits) {
  options_.wait_for_kv = true;
  options_.max_waiting = 8;
  options_.max_prefill_tokens = 64;
  Scheduler s(options_);
  // 100 positions of 10 bytes.
  s.SetKvCapacity({1000, 10});
  std::string reason;
  Made a = Make("a", 10, 50);      // 600 bytes
  Made b = Make("b", 10, 50);      // 600 more: waits
  Made c = Make("c", 2, 3);        // 50 bytes: would fit, but queues behind b
  Made huge = Make("h", 10, 200);  // 2100 bytes: never fits
  ASSERT_TRUE(s.Admit(a.request, &reason).ok());
  ASSERT_TRUE(s.Admit(b.request, &reason).ok());
  ASSERT_TRUE(s.Admit(c.request, &reason).ok());
  Status st = s.Admit(huge.request, &reason);
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(reason, "kv_full");
  EXPECT_NE(st.message().find("max_new_tokens"), std::string::npos);
  StepPlan p = s.Plan(Clock::now());
  ASSERT_EQ(p.step.sequences_size(), 1);
  EXPECT_EQ(p.step.sequences(0).seq_id(), a.request->seq_id());
  EXPECT_EQ(s.reserved_bytes(), 600u);
  EXPECT_EQ(s.waiting(), 2u);
  s.Complete(p, Answer(p), Clock::now());
  p = s.Plan(Clock::now());  // a decodes; b and c still wait
  EXPECT_EQ(p.step.sequences_size(), 1);
  EXPECT_EQ(s.waiting(), 2u);
  s.Complete(p, Answer(p), Clock::now());
  s.Cancel("a", CancelKind::kByRequest);
  p = s.Plan(Clock::now());  // a's KV is released in this step; b and c join it
  EXPECT_EQ(p.step.release_seq_ids_size(), 1);
  ASSERT_EQ(p.step.sequences_size(), 2);
  EXPECT_EQ(p.step.sequences(0).seq_id(), b.request->seq_id());
  EXPECT_EQ(p.step.sequences(1).seq_id(), c.request->seq_id());
  EXPECT_EQ(s.reserved_bytes(), 650u);
  EXPECT_EQ(s.waiting(), 0u);
  // A smaller worker group (a new epoch) fails a waiting request that can no longer fit.
  Made d = Make("d", 10, 50);
  ASSERT_TRUE(s.Admit(d.request, &reason).ok());
  s.SetKvCapacity({500, 10});
  s.Complete(p, Answer(p), Clock::now());
  s.Plan(Clock::now());
  EXPECT_EQ(d.sink->error().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(s.waiting(), 0u);
}

// A bounded (h2o) sequence reserves its budget plus its prompt while it prefills, then only
// budget + 1 positions, as the workers' caches shrink; the freed bytes admit the queue's head.
TEST_F(SchedulerTest, BoundedPolicyReservationShrinksAfterPrefill) {
  options_.wait_for_kv = true;
  options_.max_waiting = 8;
  options_.max_prefill_tokens = 64;
  Scheduler s(options_);
  s.SetKvCapacity({1000, 10});  // 100 positions of 10 bytes
  std::string reason;
  v1::WorkerCachePolicy h2o;
  h2o.set_kind(v1::WorkerCachePolicy::KIND_H2O);
  h2o.set_heavy_tokens(2);
  h2o.set_recent_tokens(2);
  Made h = Make("h2o", 10, 50, std::nullopt, 0, h2o);
  Made full = Make("full", 10, 80);  // 900 bytes: fits only beside the shrunk reservation
  ASSERT_TRUE(s.Admit(h.request, &reason).ok());
  ASSERT_TRUE(s.Admit(full.request, &reason).ok());
  StepPlan p = s.Plan(Clock::now());
  ASSERT_EQ(p.step.sequences_size(), 1);
  EXPECT_EQ(s.reserved_bytes(), 140u);  // budget 4 + prompt 10
  s.Complete(p, Answer(p), Clock::now());
  EXPECT_EQ(s.reserved_bytes(), 50u);  // budget 4 + 1
  p = s.Plan(Clock::now());
  ASSERT_EQ(p.step.sequences_size(), 2);
  EXPECT_EQ(p.step.sequences(1).seq_id(), full.request->seq_id());
  EXPECT_EQ(s.reserved_bytes(), 950u);
}

// A locret sequence's prompt goes in chunks of its chunk_tokens (its workers hold budget + one
// chunk), even when the step's prefill budget would take more; it reserves budget + chunk.
TEST_F(SchedulerTest, LocretPromptsGoInChunksOfTheirChunkTokens) {
  options_.max_prefill_tokens = 64;
  Scheduler s(options_);
  s.SetKvCapacity({1000, 10});
  std::string reason;
  v1::WorkerCachePolicy locret;
  locret.set_kind(v1::WorkerCachePolicy::KIND_LOCRET);
  locret.set_heavy_tokens(2);
  locret.set_recent_tokens(2);
  locret.set_chunk_tokens(4);
  Made l = Make("locret", 10, 20, std::nullopt, 0, locret);
  ASSERT_TRUE(s.Admit(l.request, &reason).ok());
  std::vector<int> chunks;
  for (int step = 0; step < 3; ++step) {
    StepPlan p = s.Plan(Clock::now());
    ASSERT_EQ(p.step.sequences_size(), 1);
    chunks.push_back(p.step.sequences(0).tokens_size());
    if (step == 0) EXPECT_EQ(s.reserved_bytes(), 80u);  // budget 4 + chunk 4
    s.Complete(p, Answer(p), Clock::now());
  }
  EXPECT_EQ(chunks, (std::vector<int>{4, 4, 2}));
}

// Paged workers (blocks of 4 positions): a full-policy request reserves its prompt's blocks, so
// five fit where one would without paging; each grows a block at a time while decoding, and
// when none is free the newest is preempted: released on the workers, it recomputes its prompt
// and the tokens it had (no sampling), then decodes on. Every request gets all its tokens, the
// reservations never pass the memory, and the workers' view stays consistent (each step
// continues a sequence where the last left it; no released id comes back).
TEST_F(SchedulerTest, PagedKvGrowsByBlocksAndPreemptsTheNewest) {
  options_.max_prefill_tokens = 64;
  options_.max_batch_sequences = 8;
  options_.max_waiting = 8;
  Scheduler s(options_);
  s.SetKvCapacity({400, 10, 4});  // 10 blocks of 4 positions of 10 bytes
  std::string reason;
  std::vector<Made> m;
  for (int i = 0; i < 5; ++i) {
    m.push_back(Make("r" + std::to_string(i), 4, 36));  // 40 positions: all 10 blocks
    ASSERT_TRUE(s.Admit(m.back().request, &reason).ok()) << i;
  }
  // Its prompt's block plus one free block for each reserved sequence: no room for a sixth.
  Made extra = Make("x", 4, 36);
  EXPECT_EQ(s.Admit(extra.request, &reason).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(reason, "kv_full");
  // Without paging the same requests reserve their worst case: one at a time.
  Scheduler old(options_);
  old.SetKvCapacity({400, 10});
  EXPECT_TRUE(old.Admit(Make("o1", 4, 36).request, &reason).ok());
  EXPECT_FALSE(old.Admit(Make("o2", 4, 36).request, &reason).ok());

  std::unordered_map<uint64_t, uint32_t> next_position;  // what the workers hold
  std::set<uint64_t> released;
  bool recomputed = false;
  for (int step = 0; step < 2000 && s.has_requests(); ++step) {
    StepPlan plan = s.Plan(Clock::now());
    for (uint64_t id : Releases(plan)) {
      released.insert(id);
      next_position.erase(id);
    }
    for (const v1::SequenceWork& w : plan.step.sequences()) {
      ASSERT_EQ(released.count(w.seq_id()), 0u) << "step " << step;
      const uint32_t at = next_position.count(w.seq_id()) ? next_position[w.seq_id()] : 0;
      ASSERT_EQ(w.start_position(), at) << "step " << step << " seq " << w.seq_id();
      ASSERT_EQ(w.has_config(), at == 0);
      if (at == 0 && w.config().prompt_tokens() > 4) {
        // A preempted sequence: its tokens so far, the length limit unchanged, no sample.
        recomputed = true;
        EXPECT_EQ(w.config().prompt_tokens() + w.config().max_new_tokens(), 40u);
        if (static_cast<uint32_t>(w.tokens_size()) == w.config().prompt_tokens()) {
          EXPECT_FALSE(w.sample());
        }
      }
      next_position[w.seq_id()] = at + static_cast<uint32_t>(w.tokens_size());
    }
    EXPECT_LE(s.reserved_bytes(), 400u);
    s.Complete(plan, Answer(plan), Clock::now());
  }
  EXPECT_FALSE(s.has_requests());
  EXPECT_GT(s.preemptions(), 0u);
  EXPECT_TRUE(recomputed);
  for (const Made& r : m) {
    EXPECT_EQ(r.request->generated(), 36) << r.request->id();
    EXPECT_TRUE(r.sink->done()) << r.request->id();
    EXPECT_TRUE(r.sink->error().ok()) << r.sink->error().ToString();
    EXPECT_TRUE(r.sink->last().finished()) << r.request->id();
    EXPECT_EQ(r.sink->last().generated_tokens(), 36u) << r.request->id();
  }
  EXPECT_EQ(s.reserved_bytes(), 0u);
}

// The prefix cache in the scheduler: a finished prompt's whole blocks go to the workers'
// memory tier in the next step (a prompt longer than the tier spills its first blocks to host
// between the inserts); a request with the same prefix starts after it, the step after its host
// blocks were loaded; a block a rank could not load is dropped with its subtree and the
// request computes its whole prompt; H2O and MODE_OFF requests never read the cache.
class PrefixSchedulerTest : public SchedulerTest {
 protected:
  void SetUp() override {
    SchedulerTest::SetUp();
    options_.max_prefill_tokens = 64;
    options_.prefix_memory_bytes = 2 * 40;  // 2 blocks of 4 positions of 10 bytes
    options_.prefix_host_bytes = 8 * 40;
    capacity_ = {4000, 10, 4, /*prefix_cache=*/true, /*prefix_disk=*/false};
  }
  Made MakePrefix(const std::string& id, std::vector<int32_t> prompt, bool cache = true,
                  const v1::WorkerCachePolicy& policy = {}) {
    Made m = Make(id, static_cast<int>(prompt.size()), 1, std::nullopt, 0, policy);
    ResolvedRequest p = m.request->params();
    p.prompt = std::move(prompt);
    p.prefix_cache = cache;
    m.request = std::make_shared<Request>(id, m.request->seq_id(), std::move(p), tokenizer_.get(),
                                          metrics_.get(), Clock::now(), std::nullopt, m.sink);
    return m;
  }
  static std::vector<v1::PrefixOp::Kind> Kinds(const StepPlan& plan) {
    std::vector<v1::PrefixOp::Kind> k;
    for (const v1::PrefixOp& op : plan.step.prefix_ops()) k.push_back(op.kind());
    return k;
  }
  // Runs request `m` to its end; the next plan carries its inserts.
  void RunAlone(Scheduler& s, const Made& m) {
    std::string reason;
    ASSERT_TRUE(s.Admit(m.request, &reason).ok());
    StepPlan p = s.Plan(Clock::now());
    ASSERT_EQ(p.step.sequences_size(), 1);
    s.Complete(p, Answer(p), Clock::now());
    ASSERT_TRUE(m.sink->done());
  }
  std::vector<int32_t> Prompt(int32_t last) const {
    std::vector<int32_t> t;
    for (int i = 0; i < 12; ++i) t.push_back(100 + i);  // 3 blocks
    t.push_back(last);
    return t;
  }
  KvCapacity capacity_;
};

// Important-token loading: a prefix partly on host starts at once, reading every cached block
// where it is (no loads, not capped by the memory tier), and is not cached again; the ranks'
// measured shares of important tokens score the blocks; a block lost while a request reads it
// recomputes that request from the start.
TEST_F(PrefixSchedulerTest, ImportantLoadingReadsBlocksWhereTheyAre) {
  options_.prefix_important = true;
  Scheduler s(options_);
  s.SetKvCapacity(capacity_);
  RunAlone(s, MakePrefix("a", Prompt(1)));
  StepPlan inserts = s.Plan(Clock::now());
  using K = v1::PrefixOp;
  ASSERT_EQ(Kinds(inserts), (std::vector<v1::PrefixOp::Kind>{K::KIND_INSERT, K::KIND_INSERT,
                                                             K::KIND_TO_HOST, K::KIND_INSERT}));
  const std::vector<uint64_t> blocks = {inserts.step.prefix_ops(0).block_id(),
                                        inserts.step.prefix_ops(1).block_id(),
                                        inserts.step.prefix_ops(3).block_id()};
  s.Complete(inserts, Answer(inserts), Clock::now());

  const Made b = MakePrefix("b", Prompt(4));
  std::string reason;
  ASSERT_TRUE(s.Admit(b.request, &reason).ok());
  StepPlan start = s.Plan(Clock::now());
  for (const v1::PrefixOp& op : start.step.prefix_ops()) {
    EXPECT_NE(op.kind(), K::KIND_TO_MEMORY);
  }
  ASSERT_EQ(start.step.sequences_size(), 1);
  const v1::SequenceWork& w = start.step.sequences(0);
  EXPECT_EQ(w.start_position(), 12u);
  EXPECT_TRUE(w.config().prefix_important());
  EXPECT_EQ(
      std::vector<uint64_t>(w.config().prefix_blocks().begin(), w.config().prefix_blocks().end()),
      blocks);
  EXPECT_EQ(s.prefix_stats().important_requests, 1u);
  EXPECT_EQ(s.prefix_stats().hits[1], 1u);  // by the slowest tier: host
  const double before = s.prefix_index()->Score(blocks[1]);
  std::vector<v1::StepResponse> resp = Answer(start);
  for (size_t r = 0; r < resp.size(); ++r) {
    resp[r].mutable_prefix_io()->set_important_layers(3);
    v1::BlockImportance* imp = resp[r].mutable_prefix_io()->add_block_importance();
    imp->set_block_id(blocks[1]);
    imp->set_important_fraction(r == 0 ? 0.5 : 0.25);
  }
  s.Complete(start, resp, Clock::now());
  ASSERT_TRUE(b.sink->done());
  EXPECT_EQ(b.sink->last().cached_prompt_tokens(), 12u);
  EXPECT_EQ(s.prefix_stats().important_layers, 3u * resp.size());
  EXPECT_DOUBLE_EQ(s.prefix_index()->Score(blocks[1]), before * (1 + 0.375));
  StepPlan after = s.Plan(Clock::now());  // b's release; nothing of it is inserted
  for (const v1::PrefixOp& op : after.step.prefix_ops()) EXPECT_NE(op.kind(), K::KIND_INSERT);
  s.Complete(after, Answer(after), Clock::now());

  const Made c = MakePrefix("c", Prompt(5));
  ASSERT_TRUE(s.Admit(c.request, &reason).ok());
  StepPlan reading = s.Plan(Clock::now());
  ASSERT_EQ(reading.step.sequences_size(), 1);
  EXPECT_TRUE(reading.step.sequences(0).config().prefix_important());
  const uint64_t first_seq = reading.step.sequences(0).seq_id();
  std::vector<v1::StepResponse> lost = Answer(reading);
  lost[lost.size() - 1].add_prefix_failed(blocks[0]);
  s.Complete(reading, lost, Clock::now());
  EXPECT_EQ(s.prefix_stats().important_restarts, 1u);
  EXPECT_FALSE(c.sink->done());
  StepPlan again = s.Plan(Clock::now());
  ASSERT_EQ(again.step.sequences_size(), 1);
  EXPECT_NE(again.step.sequences(0).seq_id(), first_seq);
  EXPECT_EQ(again.step.sequences(0).start_position(), 0u);
  EXPECT_EQ(again.step.sequences(0).tokens_size(), 13);
  EXPECT_EQ(again.step.sequences(0).config().prefix_blocks_size(), 0);
  EXPECT_EQ(Releases(again), std::vector<uint64_t>{first_seq});
  s.Complete(again, Answer(again), Clock::now());
  EXPECT_TRUE(c.sink->done());
}

TEST_F(PrefixSchedulerTest, FillsReusesFromHostAndRecomputesLostBlocks) {
  Scheduler s(options_);
  s.SetKvCapacity(capacity_);
  ASSERT_NE(s.prefix_index(), nullptr);
  EXPECT_EQ(s.kv_capacity().total_bytes, 4000u);  // the memory tier takes only what is free
  const Made a = MakePrefix("a", Prompt(1));
  RunAlone(s, a);
  EXPECT_EQ(s.prefix_stats().misses, 1u);
  EXPECT_EQ(a.sink->last().cached_prompt_tokens(), 0u);
  StepPlan inserts = s.Plan(Clock::now());
  using K = v1::PrefixOp;
  EXPECT_EQ(Kinds(inserts), (std::vector<v1::PrefixOp::Kind>{K::KIND_INSERT, K::KIND_INSERT,
                                                             K::KIND_TO_HOST, K::KIND_INSERT}));
  const uint64_t b0 = inserts.step.prefix_ops(0).block_id();
  const uint64_t b1 = inserts.step.prefix_ops(1).block_id();
  for (int i : {0, 1, 3}) {
    EXPECT_EQ(inserts.step.prefix_ops(i).seq_id(), a.request->seq_id());
    EXPECT_EQ(inserts.step.prefix_ops(i).block_index(), static_cast<uint32_t>(i == 3 ? 2 : i));
  }
  EXPECT_EQ(inserts.step.prefix_ops(2).block_id(), b0);  // spilled before the third came in
  EXPECT_EQ(Releases(inserts), std::vector<uint64_t>{a.request->seq_id()});
  s.Complete(inserts, Answer(inserts), Clock::now());
  EXPECT_EQ(s.prefix_stats().blocks[0], 2);
  EXPECT_EQ(s.prefix_stats().blocks[1], 1);

  // H2O and MODE_OFF requests compute everything.
  v1::WorkerCachePolicy h2o;
  h2o.set_kind(v1::WorkerCachePolicy::KIND_H2O);
  h2o.set_heavy_tokens(2);
  h2o.set_recent_tokens(2);
  for (const Made& m :
       {MakePrefix("h", Prompt(2), true, h2o), MakePrefix("off", Prompt(3), false)}) {
    std::string reason;
    ASSERT_TRUE(s.Admit(m.request, &reason).ok());
    StepPlan p = s.Plan(Clock::now());
    ASSERT_EQ(p.step.sequences_size(), 1);
    EXPECT_EQ(p.step.sequences(0).config().prefix_blocks_size(), 0);
    EXPECT_EQ(p.step.sequences(0).tokens_size(), 13);
    s.Complete(p, Answer(p), Clock::now());
  }
  s.Complete(s.Plan(Clock::now()), {}, Clock::now());  // their releases

  // b: two blocks (the memory tier's size), the first on host: loaded, then b starts after them.
  const Made b = MakePrefix("b", Prompt(4));
  std::string reason;
  ASSERT_TRUE(s.Admit(b.request, &reason).ok());
  StepPlan load = s.Plan(Clock::now());
  EXPECT_EQ(load.step.sequences_size(), 0);
  ASSERT_EQ(Kinds(load), (std::vector<v1::PrefixOp::Kind>{K::KIND_TO_HOST, K::KIND_TO_MEMORY}));
  EXPECT_EQ(load.step.prefix_ops(1).block_id(), b0);
  s.Complete(load, Answer(load), Clock::now());
  StepPlan start = s.Plan(Clock::now());
  ASSERT_EQ(start.step.sequences_size(), 1);
  const v1::SequenceWork& w = start.step.sequences(0);
  EXPECT_EQ(w.start_position(), 8u);
  EXPECT_EQ(w.tokens_size(), 5);
  EXPECT_EQ(
      std::vector<uint64_t>(w.config().prefix_blocks().begin(), w.config().prefix_blocks().end()),
      (std::vector<uint64_t>{b0, b1}));
  EXPECT_EQ(s.prefix_stats().hits[1], 1u);  // by the slowest tier: host
  s.Complete(start, Answer(start), Clock::now());
  EXPECT_EQ(b.sink->last().cached_prompt_tokens(), 8u);
  s.Complete(s.Plan(Clock::now()), {}, Clock::now());

  // c: its host block fails to load on rank 1; the block and its subtree are dropped, c computes
  // its whole prompt, and the next step tells every rank to forget them.
  StepPlan push = s.Plan(Clock::now());  // nothing pending
  EXPECT_TRUE(push.empty());
  const Made d = MakePrefix("d", {7, 7, 7, 7, 8, 8, 8, 8, 9});  // pushes b0, b1 to host
  RunAlone(s, d);
  s.Complete(s.Plan(Clock::now()), {}, Clock::now());
  const Made c = MakePrefix("c", Prompt(5));
  ASSERT_TRUE(s.Admit(c.request, &reason).ok());
  StepPlan failing = s.Plan(Clock::now());
  ASSERT_EQ(failing.step.sequences_size(), 0);
  std::vector<v1::StepResponse> resp = Answer(failing);
  resp[1].add_prefix_failed(b0);
  s.Complete(failing, resp, Clock::now());
  EXPECT_EQ(s.prefix_stats().lost_blocks, 1u);
  StepPlan recompute = s.Plan(Clock::now());
  ASSERT_EQ(recompute.step.sequences_size(), 1);
  EXPECT_EQ(recompute.step.sequences(0).start_position(), 0u);
  EXPECT_EQ(recompute.step.sequences(0).tokens_size(), 13);
  EXPECT_EQ(recompute.step.sequences(0).config().prefix_blocks_size(), 0);
  std::set<uint64_t> dropped;
  for (const v1::PrefixOp& op : recompute.step.prefix_ops()) {
    if (op.kind() == K::KIND_DROP) dropped.insert(op.block_id());
  }
  EXPECT_EQ(dropped, (std::set<uint64_t>{b0, b1, b0 + 2}));
  EXPECT_FALSE(s.prefix_index()->TierOf(b1).has_value());
}

TEST_F(SchedulerTest, DuplicateIdIsRefused) {
  Scheduler s(options_);
  std::string reason;
  Made a = Make("same", 3, 5), b = Make("same", 3, 5);
  ASSERT_TRUE(s.Admit(a.request, &reason).ok());
  EXPECT_EQ(s.Admit(b.request, &reason).code(), StatusCode::kAlreadyExists);
}

TEST_F(SchedulerTest, BatchLimitHoldsRequestsInTheQueue) {
  options_.max_batch_sequences = 2;
  options_.max_waiting = 8;
  Scheduler s(options_);
  std::string reason;
  std::vector<Made> made;
  for (int i = 0; i < 3; ++i) {
    made.push_back(Make("r" + std::to_string(i), 2, 2));
    ASSERT_TRUE(s.Admit(made.back().request, &reason).ok());
  }
  StepPlan p1 = s.Plan(Clock::now());
  EXPECT_EQ(p1.step.sequences_size(), 2);
  EXPECT_EQ(s.waiting(), 1u);
  s.Complete(p1, Answer(p1), Clock::now());
  StepPlan p2 = s.Plan(Clock::now());  // both finish at 2 tokens
  s.Complete(p2, Answer(p2), Clock::now());
  StepPlan p3 = s.Plan(Clock::now());
  ASSERT_EQ(p3.step.sequences_size(), 1);
  EXPECT_EQ(p3.step.sequences(0).seq_id(), made[2].request->seq_id());
  EXPECT_EQ(p3.step.release_seq_ids_size(), 2);
}

TEST_F(SchedulerTest, FailedStepFailsItsSequencesAndReleasesThem) {
  Scheduler s(options_);
  std::string reason;
  Made a = Make("a", 3, 5), b = Make("b", 3, 5);
  ASSERT_TRUE(s.Admit(a.request, &reason).ok());
  StepPlan p1 = s.Plan(Clock::now());
  s.Complete(p1, Answer(p1), Clock::now());
  ASSERT_TRUE(s.Admit(b.request, &reason).ok());
  StepPlan p2 = s.Plan(Clock::now());
  s.FailStep(p2, Status(StatusCode::kOutOfRange, "rank 1: bad"), Clock::now());
  EXPECT_EQ(a.sink->error().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(b.sink->error().code(), StatusCode::kOutOfRange);
  StepPlan p3 = s.Plan(Clock::now());
  EXPECT_EQ(p3.step.release_seq_ids_size(), 2);
  EXPECT_FALSE(s.has_requests());
}

TEST_F(SchedulerTest, LostGroupFailsEverything) {
  Scheduler s(options_);
  std::string reason;
  Made a = Make("a", 3, 5), b = Make("b", 3, 5);
  ASSERT_TRUE(s.Admit(a.request, &reason).ok());
  StepPlan p1 = s.Plan(Clock::now());
  s.Complete(p1, Answer(p1), Clock::now());
  ASSERT_TRUE(s.Admit(b.request, &reason).ok());
  s.FailAll(Unavailable("lost"), Clock::now());
  EXPECT_EQ(a.sink->error().code(), StatusCode::kUnavailable);
  EXPECT_EQ(b.sink->error().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(s.idle());
  EXPECT_EQ(s.reserved_bytes(), 0u);
}

}  // namespace
}  // namespace deja::coordinator
