// The prefix cache through the public API of a real `deja serve --tp 2` with a disk tier and
// tiers small enough that a long prompt's blocks spill from worker memory to host memory to
// disk: a request that shares a prefix with an earlier one reports cached prompt tokens and
// gives the tokens of single-process generation (TP 2 equals TP 1) and the log-probabilities of
// the same request with PrefixCache.MODE_OFF; concurrent requests sharing a prefix all do;
// corrupt disk blocks are recomputed without an error to the client; /metrics shows the hits,
// the bytes read per tier and the blocks per tier. With --prefix-load important, requests read
// the prefix where it is (host, disk) layer by layer; keeping every token, that is exact too,
// and a block lost while reading is recomputed.
#include <filesystem>
#include <fstream>
#include <thread>

#include "reference_model.h"
#include "serving_util.h"

namespace deja::serving_test {
namespace {

std::string CacheDir() { return "/tmp/deja_prefix_serving_" + std::to_string(::getpid()); }

class PrefixCacheServingTest : public ServerSuite {
 protected:
  // `deja serve --tp 2` whose 1 MiB memory and host tiers make a long prompt spill to disk.
  static std::vector<std::string> PrefixServeArgs(const std::vector<std::string>& extra) {
    std::vector<std::string> args = {
        "--kv-memory-mb",           "64", "--prefix-cache-dir",     CacheDir(),
        "--prefix-cache-memory-mb", "1",  "--prefix-cache-host-mb", "1",
        "--prefix-cache-disk-mb",   "64"};
    args.insert(args.end(), extra.begin(), extra.end());
    return ServeArgs(args);
  }
  static void SetUpTestSuite() {
    std::filesystem::remove_all(CacheDir());
    StartSuite("prefix_cache", PrefixServeArgs({}));
  }
  static void TearDownTestSuite() {
    ServerSuite::TearDownTestSuite();
    std::filesystem::remove_all(CacheDir());
  }

  // About 650 tokens (20 blocks, more than the memory and host tiers hold) every question shares.
  static std::string Document() {
    std::string text;
    for (int i = 1; i <= 40; ++i) {
      text += "Verse " + std::to_string(i) +
              ": and the evening and the morning were the day, and it was good. ";
    }
    return text;
  }
  static v1::GenerateRequest Request(const std::string& prompt, bool cache) {
    v1::GenerateRequest r;
    r.set_text(prompt);
    r.mutable_stopping()->set_max_new_tokens(12);
    r.mutable_stopping()->set_ignore_eos(true);
    r.mutable_response()->set_logprobs(true);
    r.mutable_prefix_cache()->set_mode(cache ? v1::PrefixCache::MODE_ON
                                             : v1::PrefixCache::MODE_OFF);
    return r;
  }
  static std::vector<int32_t> Reference(const std::string& prompt) {
    worker::model::GenerationOptions o;
    o.max_new_tokens = 12;
    o.stop_at_eos = false;
    return ref_->Generate(prompt, o);
  }
  static uint32_t Cached(const StreamResult& r) {
    return r.messages.empty() ? 0 : r.messages.back().cached_prompt_tokens();
  }
  static std::vector<float> Logprobs(const StreamResult& r) {
    std::vector<float> out;
    for (const auto& m : r.messages) {
      for (const auto& t : m.tokens()) out.push_back(t.logprob());
    }
    return out;
  }
  static void ExpectClose(const std::vector<float>& a, const std::vector<float>& b) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 2e-3) << "token " << i;
  }
  // `prompt` with MODE_OFF, then MODE_ON: the same tokens (single-process generation's) and
  // log-probabilities. Returns the cached prompt tokens of the second (0 after a failure).
  static uint32_t ExpectSameAsRecomputing(const std::string& prompt) {
    StreamResult off = Stream(server_->stub(), Request(prompt, false));
    StreamResult on = Stream(server_->stub(), Request(prompt, true));
    if (!off.status.ok() || !on.status.ok()) {
      ADD_FAILURE() << off.status.error_message() << " / " << on.status.error_message();
      return 0;
    }
    EXPECT_EQ(Cached(off), 0u);
    EXPECT_EQ(on.token_ids, Reference(prompt));
    EXPECT_EQ(on.token_ids, off.token_ids);
    ExpectClose(Logprobs(on), Logprobs(off));
    return Cached(on);
  }
  // Flips one byte, at(file size) into it, of every block file (written behind the requests:
  // after a moment). Returns how many.
  static int CorruptBlockFiles(uintmax_t (*at)(uintmax_t size)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    int corrupted = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(CacheDir())) {
      if (!e.is_regular_file() || e.path().extension() != ".kvb") continue;
      std::fstream io(e.path(), std::ios::in | std::ios::out | std::ios::binary);
      const auto where = static_cast<std::streamoff>(at(e.file_size()));
      char c = 0;
      io.seekg(where);
      io.read(&c, 1);
      c = static_cast<char>(c ^ 0x21);
      io.seekp(where);
      io.write(&c, 1);
      ++corrupted;
    }
    return corrupted;
  }
  static double Series(const std::string& name) {
    return Metric(Scrape(server_->metrics_port()), name);
  }
};

TEST_F(PrefixCacheServingTest, ModelInfoReportsTheCache) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::ModelInfo info;
  ASSERT_TRUE(server_->stub().GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_TRUE(info.prefix_cache_available());
  EXPECT_EQ(info.prefix_cache_block_tokens(), 32u);
  EXPECT_TRUE(info.prefix_cache_default());
}

TEST_F(PrefixCacheServingTest, ASharedPrefixIsReusedFromEveryTier) {
  const std::string doc = Document() + "\n\nQuestion: ";
  const std::vector<std::string> questions = {"Who made the light?", "What is the firmament?",
                                              "What did God call the dry land?"};
  // The first computes the document and leaves it in the cache; its blocks spill to disk.
  StreamResult first = Stream(server_->stub(), Request(doc + questions[0], true));
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(Cached(first), 0u);
  EXPECT_EQ(first.token_ids, Reference(doc + questions[0]));
  for (size_t q = 1; q < questions.size(); ++q) {
    SCOPED_TRACE(questions[q]);
    // As many blocks as the memory tier holds (7 of 135,168 bytes in 1 MiB), where a sequence
    // reads them.
    EXPECT_EQ(ExpectSameAsRecomputing(doc + questions[q]), 7u * 32);
  }
  // 1 MiB of memory and of host hold a few blocks each: the rest came back from disk.
  EXPECT_GT(Series("deja_prefix_cache_read_bytes_total{tier=\"disk\"}"), 0);
  EXPECT_GE(Series("deja_prefix_cache_hits_total{tier=\"disk\"}"), 1);
  EXPECT_GT(Series("deja_prefix_cache_blocks{tier=\"disk\"}"), 0);
  EXPECT_GT(Series("deja_prefix_cache_hit_tokens_total"), 0);
}

TEST_F(PrefixCacheServingTest, ConcurrentRequestsSharingAPrefix) {
  const std::string doc = "Concurrent. " + Document() + "\n\nAsk: ";
  StreamResult seed = Stream(server_->stub(), Request(doc + "begin", true));
  ASSERT_TRUE(seed.status.ok()) << seed.status.error_message();
  const int n = 6;
  std::vector<StreamResult> results(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      results[i] = Stream(server_->stub(), Request(doc + "question " + std::to_string(i), true));
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < n; ++i) {
    SCOPED_TRACE(i);
    ASSERT_TRUE(results[i].status.ok()) << results[i].status.error_message();
    EXPECT_GT(Cached(results[i]), 0u);
    EXPECT_EQ(results[i].token_ids, Reference(doc + "question " + std::to_string(i)));
  }
}

// cache_salt: a tenant reads only blocks of requests with its own salt. Tenant B sending tenant
// A's prefix computes it all (cached_prompt_tokens 0: it learns nothing of A's prompts); A again
// hits; no salt is a tenant of its own.
TEST_F(PrefixCacheServingTest, SaltsSeparateTenants) {
  const std::string doc = "Salted. " + Document() + "\n\nQ: ";
  auto salted = [&](const std::string& prompt, const char* salt) {
    v1::GenerateRequest r = Request(prompt, true);
    if (salt != nullptr) r.set_cache_salt(salt);
    StreamResult s = Stream(server_->stub(), r);
    EXPECT_TRUE(s.status.ok()) << s.status.error_message();
    EXPECT_EQ(s.token_ids, Reference(prompt));
    return Cached(s);
  };
  EXPECT_EQ(salted(doc + "one", "tenant-a"), 0u);
  EXPECT_EQ(salted(doc + "two", "tenant-b"), 0u);
  EXPECT_EQ(salted(doc + "three", nullptr), 0u);
  EXPECT_GT(salted(doc + "four", "tenant-a"), 0u);
  EXPECT_GT(salted(doc + "five", "tenant-b"), 0u);
  EXPECT_GT(salted(doc + "six", nullptr), 0u);
}

// --prefix-cache-salt-required: ModelInfo says so; a request that would use the cache without a
// salt is INVALID_ARGUMENT naming cache_salt (the server keeps serving), one with MODE_OFF or a
// salt is served.
TEST(PrefixCacheSaltRequired, RefusesUnsaltedRequestsThatUseTheCache) {
  Server server("salt_required", ServeArgs({"--prefix-cache-salt-required"}, 1));
  ASSERT_TRUE(server.WaitListening()) << server.Log();
  ASSERT_TRUE(WaitHealth(server.channel(), kServing)) << server.Log();
  EXPECT_TRUE(ModelInfoOf(server.stub()).prefix_cache_salt_required());
  v1::GenerateRequest r;
  r.set_text("Who made the light?");
  r.mutable_stopping()->set_max_new_tokens(4);
  StreamResult refused = Stream(server.stub(), r);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.status.error_message().find("cache_salt"), std::string::npos)
      << refused.status.error_message();
  r.mutable_prefix_cache()->set_mode(v1::PrefixCache::MODE_OFF);
  EXPECT_TRUE(Stream(server.stub(), r).status.ok());
  r.mutable_prefix_cache()->set_mode(v1::PrefixCache::MODE_ON);
  r.set_cache_salt("tenant-a");
  EXPECT_TRUE(Stream(server.stub(), r).status.ok());
}

TEST_F(PrefixCacheServingTest, CorruptDiskBlocksAreRecomputed) {
  const std::string doc = "Corrupt. " + Document() + "\n\nQ: ";
  StreamResult seed = Stream(server_->stub(), Request(doc + "one", true));
  ASSERT_TRUE(seed.status.ok()) << seed.status.error_message();
  // A byte near the end (the positions) of every block file.
  ASSERT_GT(CorruptBlockFiles([](uintmax_t size) { return size - 7; }), 0);
  const double lost = Series("deja_prefix_cache_lost_blocks_total");
  StreamResult again = Stream(server_->stub(), Request(doc + "two", true));
  ASSERT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_EQ(again.token_ids, Reference(doc + "two"));
  EXPECT_GT(Series("deja_prefix_cache_lost_blocks_total"), lost);
}

// Important-token loading keeping every token (--prefix-kept-fraction 1): the whole prefix is
// read from host and disk where it is, none of it promoted into the memory tier, and the
// result is exact.
class ImportantLoadingServingTest : public PrefixCacheServingTest {
 protected:
  static void SetUpTestSuite() {
    std::filesystem::remove_all(CacheDir());
    StartSuite("prefix_important",
               PrefixServeArgs({"--prefix-load", "important", "--prefix-kept-fraction", "1"}));
  }
};

TEST_F(ImportantLoadingServingTest, ThePrefixIsReadWhereItIsAndExact) {
  const std::string doc = Document() + "\n\nQuestion: ";
  StreamResult first = Stream(server_->stub(), Request(doc + "Who made the light?", true));
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  for (const std::string q : {"What is the firmament?", "What did God call the dry land?"}) {
    SCOPED_TRACE(q);
    // Every whole block of the document, not only what the memory tier holds.
    EXPECT_GT(ExpectSameAsRecomputing(doc + q), 7u * 32);
  }
  EXPECT_GE(Series("deja_prefix_cache_important_requests_total"), 2);
  EXPECT_GT(Series("deja_prefix_cache_important_layers_total{result=\"chosen\"}"), 0);
  EXPECT_GT(Series("deja_prefix_cache_read_bytes_total{tier=\"disk\"}"), 0);
  // Read where they were: nothing came into the memory tier but what it already held.
  EXPECT_LE(Series("deja_prefix_cache_blocks{tier=\"memory\"}"), 7);
}

TEST_F(ImportantLoadingServingTest, ABlockLostWhileReadingIsRecomputed) {
  const std::string doc = "Lost. " + Document() + "\n\nQ: ";
  StreamResult seed = Stream(server_->stub(), Request(doc + "one", true));
  ASSERT_TRUE(seed.status.ok()) << seed.status.error_message();
  // A byte of the keys (a quarter into each file) of every block file.
  ASSERT_GT(CorruptBlockFiles([](uintmax_t size) { return size / 4; }), 0);
  const double restarts = Series("deja_prefix_cache_important_restarts_total");
  const double lost = Series("deja_prefix_cache_lost_blocks_total");
  StreamResult again = Stream(server_->stub(), Request(doc + "two", true));
  ASSERT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_EQ(again.token_ids, Reference(doc + "two"));
  EXPECT_GT(Series("deja_prefix_cache_lost_blocks_total"), lost);
  EXPECT_GT(Series("deja_prefix_cache_important_restarts_total"), restarts);
}

}  // namespace
}  // namespace deja::serving_test
