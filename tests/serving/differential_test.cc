// One request never changes another's answer. Seeded random valid requests over every field a
// client may set (cache policies with ratios, token budgets and decay; Deja Vu sparsity on and
// off; the prefix cache on and off, over shared prefixes, with and without a cache_salt; stop
// sequences; greedy and seeded sampling, with repetition, presence and frequency penalties and
// logit biases; cancels) go in random concurrent batches to a real `deja
// serve --tp 2` whose prefill budget is small (--max-prefill-tokens 16, so prompts are split at
// places that depend on what else runs). Each is compared with the same request sent alone, with
// the prefix cache off, to a second server of the same flags and a prefill budget of 8192: the
// same status, tokens and text, log-probabilities within 1e-5. A cancelled request's tokens are a
// prefix of its reference's; no other request fails. Then one round each with int8 and int4
// weights and with an int8 KV cache (DifferentialDtypeTest).
//   DEJA_TEST_SEED=N replays one seed; DEJA_DIFFERENTIAL_REQUESTS=N (default 48) sets how many
//   requests a round sends; DEJA_DIFFERENTIAL_SECONDS=S runs rounds (seeds N, N+1, ...) until S
//   seconds have passed and then holds the loaded server's resident memory (coordinator and
//   workers) flat over the second half of the run: at most 5% over its size at the midpoint (the
//   workers' KV block pools, 64 MiB each, are paged in as blocks are first used: 578 -> 709 MiB
//   over the first 22 rounds, then flat) (`scripts/soak.sh --differential`, 30 minutes).
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include "serving_util.h"

namespace deja::serving_test {
namespace {

uint32_t Seed() {
  if (const char* s = std::getenv("DEJA_TEST_SEED")) return static_cast<uint32_t>(std::stoul(s));
  return std::random_device{}();
}

double SecondsToRun() {
  if (const char* s = std::getenv("DEJA_DIFFERENTIAL_SECONDS")) return std::atof(s);
  return 0;
}

// Resident memory of a process, in bytes (0 when it cannot be read).
uint64_t RssBytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

int RequestsPerRound() {
  if (const char* s = std::getenv("DEJA_DIFFERENTIAL_REQUESTS")) return std::max(1, std::atoi(s));
  return 48;
}

// The servers' flags; `dtype` (int8, int4) sets --dtype, else the default (bf16 here).
std::vector<std::string> DifferentialArgs(const std::string& max_prefill,
                                          const std::string& dtype = "",
                                          const std::string& kv_dtype = "") {
  // A small host tier: what the cache may hold is reached early, so resident memory stays flat.
  std::vector<std::string> extra = {"--kv-memory-mb", "64", "--prefix-cache-host-mb", "4",
                                    "--max-prefill-tokens", max_prefill,
                                    "--max-batch-sequences", "32", "--locret-chunk", "16",
                                    "--sparsity-default", "off", "--retaining-heads", "auto"};
  if (!dtype.empty()) {
    extra.push_back("--dtype");
    extra.push_back(dtype);
  }
  if (!kv_dtype.empty()) {
    extra.push_back("--kv-dtype");
    extra.push_back(kv_dtype);
  }
  const std::string predictors = ModelDir() + "/predictors.safetensors";
  // Deja Vu's gathers read no int4: an int4 server runs without predictors.
  if (std::filesystem::exists(predictors) && dtype != "int4") {
    extra.push_back("--predictors");
    extra.push_back(predictors);
  }
  return ServeArgs(extra);
}

// Words to build prompts from (any text the tokenizer splits into many tokens).
const char* const kWords[] = {"the",   "light",  "and",   "darkness", "evening", "morning",
                              "day",   "waters", "earth", "heaven",   "said",    "God",
                              "king",  "sword",  "love",  "night",    "stars",   "river",
                              "tower", "bread",  "wine",  "fire",     "stone",   "sea"};

struct Case {
  v1::GenerateRequest request;
  int cancel_after = -1;  // messages to read before cancelling; -1: never
  std::string Describe() const { return request.ShortDebugString(); }
};

class Generator {
 public:
  Generator(uint32_t seed, bool sparsity, bool locret) : rng_(seed), sparsity_(sparsity),
                                                         locret_(locret) {
    for (int d = 0; d < 3; ++d) documents_.push_back(Words(60 + 30 * d));
    documents_.push_back(Words(520));  // about 600 tokens
  }

  Case Next() {
    Case c;
    v1::GenerateRequest& r = c.request;
    // Prompts: a shared document (prefix-cache hits) and a question, or free text.
    std::string text = Pick(3) > 0 ? documents_[Pick(documents_.size())] + " " + Words(Pick(20) + 3)
                                   : Words(Pick(120) + 2);
    r.set_text(text);
    v1::StoppingCriteria* s = r.mutable_stopping();
    s->set_max_new_tokens(static_cast<int32_t>(Pick(40) + 1));
    s->set_ignore_eos(Pick(2) == 0);
    if (Pick(5) == 0) s->add_stop_sequences(kWords[Pick(std::size(kWords))]);
    r.mutable_response()->set_logprobs(true);
    if (Pick(4) == 0) r.mutable_response()->set_top_n_tokens(static_cast<uint32_t>(Pick(4)));
    if (Pick(3) == 0) {
      v1::SamplingParams* p = r.mutable_sampling();
      p->set_do_sample(true);
      p->set_temperature(0.5f + 0.25f * static_cast<float>(Pick(4)));
      if (Pick(2) == 0) p->set_top_k(static_cast<int32_t>(Pick(50) + 1));
      if (Pick(2) == 0) p->set_top_p(0.5f + 0.1f * static_cast<float>(Pick(5)));
      p->set_seed(rng_());
    }
    if (Pick(6) == 0) r.mutable_sampling()->set_repetition_penalty(1.2f);
    // OpenAI's penalties over the generated tokens (counted from the original prompt's end,
    // also after a preemption recomputes them as prompt) and a logit bias.
    if (Pick(5) == 0) {
      r.mutable_sampling()->set_presence_penalty(0.5f * static_cast<float>(Pick(5)) - 1.f);
      r.mutable_sampling()->set_frequency_penalty(0.5f * static_cast<float>(Pick(5)) - 1.f);
    }
    if (Pick(6) == 0) {
      static constexpr float kBias[] = {-100.f, -5.f, 5.f, 100.f};
      (*r.mutable_sampling()->mutable_logit_bias())[static_cast<int32_t>(Pick(2000) + 4)] =
          kBias[Pick(4)];
    }
    v1::CachePolicy* cache = r.mutable_cache();
    switch (Pick(locret_ ? 4 : 3)) {
      case 0:
        cache->set_kind(v1::CachePolicy::KIND_FULL);
        break;
      case 1:
        cache->set_kind(v1::CachePolicy::KIND_WINDOW);
        Budgets(cache, false);
        break;
      case 2:
        cache->set_kind(v1::CachePolicy::KIND_H2O);
        Budgets(cache, true);
        if (Pick(2) == 0) cache->set_score_decay(Pick(2) == 0 ? 0.6f : 0.9f);
        break;
      default:
        cache->set_kind(v1::CachePolicy::KIND_LOCRET);
        Budgets(cache, true);
        break;
    }
    if (sparsity_ && Pick(2) == 0) r.mutable_sparsity()->set_mode(v1::Sparsity::MODE_ON);
    r.mutable_prefix_cache()->set_mode(Pick(3) == 0 ? v1::PrefixCache::MODE_OFF
                                                    : v1::PrefixCache::MODE_ON);
    if (Pick(3) == 0) r.set_cache_salt(Pick(2) == 0 ? "tenant-a" : "tenant-b");
    if (Pick(8) == 0) c.cancel_after = static_cast<int>(Pick(3));
    return c;
  }

 private:
  size_t Pick(size_t n) { return static_cast<size_t>(rng_() % n); }
  std::string Words(size_t n) {
    std::string out;
    for (size_t i = 0; i < n; ++i) {
      if (i) out += ' ';
      out += kWords[Pick(std::size(kWords))];
    }
    return out;
  }
  // Token budgets (some larger than the prompt) or ratios of the prompt.
  void Budgets(v1::CachePolicy* cache, bool heavy) {
    if (Pick(3) == 0) {
      if (heavy) cache->set_heavy_ratio(0.1f + 0.1f * static_cast<float>(Pick(3)));
      cache->set_recent_ratio(0.1f + 0.1f * static_cast<float>(Pick(3)));
    } else {
      const uint32_t big = Pick(4) == 0 ? 100 : 0;
      if (heavy) cache->set_heavy_tokens(static_cast<uint32_t>(Pick(12) + 1) + big);
      cache->set_recent_tokens(static_cast<uint32_t>(Pick(40) + 1) + big);
    }
  }

  std::mt19937 rng_;
  bool sparsity_, locret_;
  std::vector<std::string> documents_;
};

struct Outcome {
  grpc::Status status;
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
  std::string text;
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
  bool cancelled = false;
};

Outcome Run(v1::TextGeneration::Stub& stub, const Case& c) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, milliseconds(120000));
  Outcome o;
  auto reader = stub.GenerateStream(&ctx, c.request);
  v1::GenerateStreamResponse msg;
  int read = 0;
  while (reader->Read(&msg)) {
    o.text += msg.text_delta();
    for (const v1::Token& t : msg.tokens()) {
      o.ids.push_back(t.id());
      o.logprobs.push_back(t.logprob());
    }
    if (msg.finished()) o.finish = msg.finish_reason();
    if (c.cancel_after >= 0 && ++read > c.cancel_after && !o.cancelled) {
      ctx.TryCancel();
      o.cancelled = true;
    }
  }
  o.status = reader->Finish();
  return o;
}

class DifferentialTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    loaded_ = new Server("differential_loaded", DifferentialArgs("16"));
    alone_ = new Server("differential_alone", DifferentialArgs("8192"));
  }
  static void TearDownTestSuite() {
    delete loaded_;
    delete alone_;
    loaded_ = alone_ = nullptr;
  }
  void SetUp() override {
    for (Server* s : {loaded_, alone_}) {
      ASSERT_TRUE(s->WaitListening()) << s->Log();
      ASSERT_TRUE(WaitHealth(s->channel(), kServing)) << s->Log();
    }
  }
  static v1::ModelInfo Info() { return ModelInfoOf(alone_->stub()); }

  static inline Server* loaded_ = nullptr;
  static inline Server* alone_ = nullptr;
};

// One round: `total` requests of `seed`; returns how many were compared.
int RunRound(Server& loaded, Server& alone, const v1::ModelInfo& info, uint32_t seed, int total) {
  std::printf("differential_test seed: %u (replay with DEJA_TEST_SEED=%u)\n", seed, seed);
  std::fflush(stdout);
  Generator gen(seed, info.sparsity_available(), info.locret_available());
  std::mt19937 batch_rng(seed ^ 0x5eedu);
  std::vector<Case> cases;
  for (int i = 0; i < total; ++i) cases.push_back(gen.Next());

  // The loaded server: random batches of 1 to 12 concurrent streams, each batch sent at once.
  std::vector<Outcome> got_all(cases.size());
  for (size_t begin = 0; begin < cases.size();) {
    const size_t n = std::min(cases.size() - begin, static_cast<size_t>(batch_rng() % 12 + 1));
    std::vector<std::thread> threads;
    for (size_t i = begin; i < begin + n; ++i) {
      threads.emplace_back([&, i] { got_all[i] = Run(loaded.stub(), cases[i]); });
    }
    for (auto& t : threads) t.join();
    begin += n;
  }
  // The reference: each alone, computing its whole prompt (MODE_OFF), never cancelled.
  int checked = 0, cancelled = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    Case single = cases[i];
    single.cancel_after = -1;
    single.request.mutable_prefix_cache()->set_mode(v1::PrefixCache::MODE_OFF);
    const Outcome want = Run(alone.stub(), single);
    const Outcome& got = got_all[i];
    SCOPED_TRACE("seed " + std::to_string(seed) + " request " + std::to_string(i) + ": " +
                 cases[i].Describe());
    if (!want.status.ok()) {
      ADD_FAILURE() << "the reference failed: " << want.status.error_message();
      continue;
    }
    if (got.cancelled) {
      ++cancelled;
      // Cancelled by its own client: CANCELLED, or OK when it finished first; what it received
      // is the start of the reference.
      EXPECT_TRUE(got.status.ok() || got.status.error_code() == grpc::StatusCode::CANCELLED)
          << got.status.error_message();
      EXPECT_LE(got.ids.size(), want.ids.size());
      if (got.ids.size() <= want.ids.size()) {
        EXPECT_TRUE(std::equal(got.ids.begin(), got.ids.end(), want.ids.begin()));
      }
      continue;
    }
    if (!got.status.ok()) {
      ADD_FAILURE() << "a valid request failed: " << got.status.error_message();
      continue;
    }
    EXPECT_EQ(got.ids, want.ids);
    EXPECT_EQ(got.text, want.text);
    EXPECT_EQ(got.finish, want.finish);
    EXPECT_EQ(got.logprobs, want.logprobs);  // bit for bit
    ++checked;
  }
  std::printf("%d requests compared, %d cancelled\n", checked, cancelled);
  return checked;
}

uint64_t GroupRss(const Server& s) {
  uint64_t rss = RssBytes(s.pid());
  for (pid_t p : s.WorkerPids()) rss += RssBytes(p);
  return rss;
}

TEST_F(DifferentialTest, AnswersDoNotDependOnWhatElseRuns) {
  const v1::ModelInfo info = Info();
  ASSERT_TRUE(info.prefix_cache_available());
  const uint32_t seed = Seed();
  const auto start = Clock::now();
  const double seconds = SecondsToRun();
  std::vector<uint64_t> rss;
  int rounds = 0;
  do {
    EXPECT_GT(RunRound(*loaded_, *alone_, info, seed + static_cast<uint32_t>(rounds),
                       RequestsPerRound()),
              0);
    ++rounds;
    rss.push_back(GroupRss(*loaded_));
    std::printf("round %d: resident memory %.1f MiB (coordinator %.1f MiB)\n", rounds,
                rss.back() / 1048576.0, RssBytes(loaded_->pid()) / 1048576.0);
    if (::testing::Test::HasFailure()) break;
  } while (std::chrono::duration<double>(Clock::now() - start).count() < seconds);
  const uint64_t first = rss.front(), middle = rss[rss.size() / 2], last = rss.back();
  std::printf("%d rounds; loaded server's resident memory %.1f MiB after the first, %.1f MiB "
              "at the midpoint, %.1f MiB at the end\n",
              rounds, first / 1048576.0, middle / 1048576.0, last / 1048576.0);
  if (rounds >= 8) {
    EXPECT_LE(last, middle + middle / 20) << "resident memory grew over the second half";
  }
  // The loaded server is still serving.
  EXPECT_EQ(Health(loaded_->channel(), ""), kServing);
}

// The same over reduced precision, one round of 24 requests each: int8 weights (on AVX512-VNNI
// each token's activations quantized to int8 in every step), int4 weights (always quantized),
// and an int8 KV cache over f16 and over bf16 weights (rows quantized per token and head as they
// are written, so a key's f32 value must not depend on which step or chunk computed it: the
// model makes its Linears and attention batch-invariant; cached prefixes, evictions and
// compactions move rows with their scales). A kernel that chose its arithmetic by the step's row
// count would fail here.
struct DtypeRound {
  const char* name;
  const char* dtype;     // --dtype, or "" for the checkpoint's
  const char* kv_dtype;  // --kv-dtype, or "" for f32
};
class DifferentialDtypeTest : public ::testing::TestWithParam<DtypeRound> {};

TEST_P(DifferentialDtypeTest, AnswersDoNotDependOnWhatElseRuns) {
  const DtypeRound& r = GetParam();
  Server loaded(std::string("differential_loaded_") + r.name,
                DifferentialArgs("16", r.dtype, r.kv_dtype));
  Server alone(std::string("differential_alone_") + r.name,
               DifferentialArgs("8192", r.dtype, r.kv_dtype));
  for (Server* s : {&loaded, &alone}) {
    ASSERT_TRUE(s->WaitListening()) << s->Log();
    ASSERT_TRUE(WaitHealth(s->channel(), kServing)) << s->Log();
  }
  const v1::ModelInfo info = ModelInfoOf(alone.stub());
  if (*r.dtype != '\0' && std::string(r.dtype) != "bf16") EXPECT_EQ(info.dtype(), r.dtype);
  if (*r.kv_dtype != '\0') EXPECT_EQ(info.kv_dtype(), r.kv_dtype);
  EXPECT_GT(RunRound(loaded, alone, info, Seed(), 24), 0);
  EXPECT_EQ(Health(loaded.channel(), ""), kServing);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, DifferentialDtypeTest,
                         ::testing::Values(DtypeRound{"int8", "int8", ""},
                                           DtypeRound{"int4", "int4", ""},
                                           DtypeRound{"kv_int8", "", "int8"},
                                           DtypeRound{"kv_int8_bf16", "bf16", "int8"}),
                         [](const ::testing::TestParamInfo<DtypeRound>& p) {
                           return std::string(p.param.name);
                         });

}  // namespace
}  // namespace deja::serving_test
