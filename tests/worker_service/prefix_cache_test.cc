// The worker's side of the prefix cache (worker/prefix/prefix_store.h through StepEngine): a
// sequence that starts from cached blocks gives the tokens and log-probabilities of computing
// its whole prompt, whether the blocks stayed in memory or came back from host memory or disk;
// a bounded policy works on its own copy, so the cached blocks stay intact; a corrupt or
// missing disk copy is reported and forgotten, never served; the pool returns to its baseline.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "kernels/backend.h"
#include "tests/comm/tp_util.h"
#include "tests/common/sim_device.h"
#include "tests/worker_service/step_util.h"
#include "worker/service/step_engine.h"

namespace deja::worker::service {
namespace {

using deja::v1::PrefixOp;
using deja::v1::StepRequest;
using deja::v1::StepResponse;
using test_util::FirstChunk;
using test_util::NextChunk;

constexpr int32_t kBlock = 32;  // model::LoadOptions::kv_block_slots
constexpr int32_t kPrefixBlocks = 3;
constexpr int32_t kNewTokens = 6;
// The files' checksum chunks: small, so that ranged reads read close to what they ask for.
constexpr uint32_t kChunk = 1024;

class PrefixCacheTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto b = GetParam() == "cpu_paged"
                 ? StatusOr<std::unique_ptr<kernels::Backend>>(kernels::MakeCpuBackend(1))
                 : test_util::MakeTestBackend(GetParam());
    if (!b.ok()) GTEST_SKIP() << GetParam() << ": " << b.status().ToString();
    backend_ = std::move(*b);
    model::LoadOptions options;
    options.kv_memory_bytes = 32ll << 20;
    options.kv_paged = true;
    auto m = model::LoadModel(test_util::ModelDir(test_util::TpModelName()), backend_.get(),
                              nullptr, options);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    model_ = std::move(*m);
    ASSERT_EQ(model_->kv_block_slots(), kBlock);
    char tmpl[] = "/tmp/deja_prefix_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    const uint64_t layout = 42;
    auto files =
        prefix::BlockFiles::Open(dir_, layout, prefix::BlockFilesOptions{.chunk_bytes = kChunk});
    ASSERT_TRUE(files.ok()) << files.status().ToString();
    files_ = files->get();
    auto store = std::make_unique<prefix::PrefixStore>(model_->kv_pool(), std::move(*files));
    auto engine = StepEngine::Create(model_.get(), model_->kv_pool_bytes(), std::move(store));
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    engine_ = std::move(*engine);
    ASSERT_TRUE(engine_->WarmUp().ok());
    baseline_ = engine_->Usage().free_bytes();
    // A shared prefix of three whole blocks, then two different questions.
    std::mt19937 rng(7);
    std::uniform_int_distribution<int32_t> tok(
        4, static_cast<int32_t>(model_->config().vocab_size) - 1);
    prefix_.push_back(2);
    while (static_cast<int32_t>(prefix_.size()) < kPrefixBlocks * kBlock)
      prefix_.push_back(tok(rng));
    for (int q = 0; q < 2; ++q) {
      std::vector<int32_t> p = prefix_;
      for (int i = 0; i < 13 + 4 * q; ++i) p.push_back(tok(rng));
      prompts_.push_back(p);
    }
  }
  void TearDown() override {
    engine_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  StepResponse Run(const StepRequest& req) {
    StepResponse resp;
    req_id_ = std::max(req_id_, req.step_id());
    Status fatal = engine_->Run(req, &resp);
    EXPECT_TRUE(fatal.ok()) << fatal.ToString();
    return resp;
  }
  StepRequest Step() {
    StepRequest r;
    r.set_step_id(++req_id_);
    return r;
  }
  static PrefixOp Op(PrefixOp::Kind kind, uint64_t id, uint64_t seq = 0, uint32_t index = 0) {
    PrefixOp op;
    op.set_kind(kind);
    op.set_block_id(id);
    op.set_seq_id(seq);
    op.set_block_index(index);
    return op;
  }

  struct Outcome {
    std::vector<float> logprobs;  // the rows of the tokens after the prefix
    std::vector<int32_t> tokens;  // greedy continuation
  };
  // Runs `prompt` as sequence `id` (from cached blocks `blocks` when given) and decodes; the
  // sequence is left on the engine.
  Outcome Generate(uint64_t id, const std::vector<int32_t>& prompt,
                   const std::vector<uint64_t>& blocks, deja::v1::WorkerCachePolicy cache = {},
                   bool important = false, StepResponse* first_step = nullptr) {
    const size_t skip = blocks.size() * kBlock;
    StepRequest req = Step();
    deja::v1::SequenceWork w = FirstChunk(id, prompt, prompt.size(), kNewTokens);
    *w.mutable_config()->mutable_cache() = cache;
    if (!blocks.empty()) {
      w.clear_tokens();
      for (size_t i = skip; i < prompt.size(); ++i) w.add_tokens(prompt[i]);
      w.set_start_position(static_cast<uint32_t>(skip));
      for (uint64_t b : blocks) w.mutable_config()->add_prefix_blocks(b);
      w.mutable_config()->set_prefix_important(important);
    }
    w.set_want_all_logits(true);
    *req.add_sequences() = w;
    StepResponse resp = Run(req);
    if (first_step != nullptr) *first_step = resp;
    Outcome out;
    EXPECT_EQ(resp.results_size(), 1);
    if (resp.results_size() != 1 || resp.results(0).error_code() != 0) {
      ADD_FAILURE() << (resp.results_size() ? resp.results(0).error_message() : "no result");
      return out;
    }
    const int64_t vocab = model_->config().vocab_size;
    const auto& lp = resp.results(0).all_logprobs();
    // The rows after the shared prefix (a cached sequence returns rows from `skip` on).
    out.logprobs.assign(lp.begin() + static_cast<int64_t>(prefix_.size() - skip) * vocab, lp.end());
    uint32_t len = static_cast<uint32_t>(prompt.size());
    int32_t t = resp.results(0).token_id();
    out.tokens.push_back(t);
    for (int i = 1; i < kNewTokens; ++i) {
      StepRequest next = Step();
      *next.add_sequences() = NextChunk(id, {t}, len++, true);
      StepResponse r = Run(next);
      EXPECT_EQ(r.results(0).error_code(), 0) << r.results(0).error_message();
      t = r.results(0).token_id();
      out.tokens.push_back(t);
    }
    return out;
  }
  void Release(uint64_t id) {
    StepRequest r = Step();
    r.add_release_seq_ids(id);
    Run(r);
  }
  // The first prompt, computed as sequence 1, leaves its prefix in the cache as blocks 1, 2, 3
  // (their files written).
  void CacheFirstPrompt() {
    Generate(1, prompts_[0], {});
    Insert(1);
    Release(1);
    files_->Flush();
  }
  // Sequence `seq`'s prefix blocks join the cache as ids 1, 2, 3.
  StepResponse Insert(uint64_t seq) {
    StepRequest r = Step();
    for (int32_t b = 0; b < kPrefixBlocks; ++b) {
      *r.add_prefix_ops() = Op(PrefixOp::KIND_INSERT, b + 1, seq, static_cast<uint32_t>(b));
    }
    return Run(r);
  }
  StepResponse All(PrefixOp::Kind kind) {
    StepRequest r = Step();
    for (int32_t b = 0; b < kPrefixBlocks; ++b) *r.add_prefix_ops() = Op(kind, b + 1);
    return Run(r);
  }
  prefix::OrderedLayout FileLayout() const { return prefix::OrderedLayout::Of(*model_->kv_pool()); }
  static void ExpectSame(const Outcome& got, const Outcome& want) {
    EXPECT_EQ(got.tokens, want.tokens);
    ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
    double worst = 0;
    for (size_t i = 0; i < got.logprobs.size(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(got.logprobs[i]) - want.logprobs[i]));
    }
    // The same K/V and the same kernels; only the batch shape of the suffix differs.
    EXPECT_LT(worst, 2e-3) << "largest log-probability difference";
  }

  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<StepEngine> engine_;
  prefix::BlockFiles* files_ = nullptr;
  std::string dir_;
  uint64_t req_id_ = 0;
  uint64_t baseline_ = 0;
  std::vector<int32_t> prefix_;
  std::vector<std::vector<int32_t>> prompts_;
};

TEST_P(PrefixCacheTest, ReuseFromEveryTierEqualsRecomputation) {
  const Outcome first = Generate(1, prompts_[0], {});
  StepResponse ins = Insert(1);
  EXPECT_EQ(ins.prefix_failed_size(), 0);
  EXPECT_EQ(ins.prefix_io().memory_blocks(), 3u);
  Release(1);
  const Outcome want = Generate(2, prompts_[1], {});
  Release(2);

  // Memory: shared blocks.
  ExpectSame(Generate(3, prompts_[1], {1, 2, 3}), want);
  Release(3);
  // Host.
  StepResponse host = All(PrefixOp::KIND_TO_HOST);
  EXPECT_EQ(host.prefix_io().host_blocks(), 3u);
  EXPECT_EQ(host.prefix_io().memory_blocks(), 0u);
  StepResponse back = All(PrefixOp::KIND_TO_MEMORY);
  EXPECT_EQ(back.prefix_failed_size(), 0);
  EXPECT_GT(back.prefix_io().host_bytes_read(), 0u);
  EXPECT_EQ(back.prefix_io().host_blocks(), 0u);
  ExpectSame(Generate(4, prompts_[1], {1, 2, 3}), want);
  Release(4);
  // Disk (written when the blocks were inserted).
  files_->Flush();
  StepResponse disk = All(PrefixOp::KIND_TO_DISK);
  EXPECT_EQ(disk.prefix_io().disk_blocks(), 3u);
  StepResponse load = All(PrefixOp::KIND_TO_MEMORY);
  EXPECT_EQ(load.prefix_failed_size(), 0);
  // Each whole file: its 48-byte header, a CRC per chunk, the payload (the block's bytes and its
  // order table).
  const uint64_t payload = static_cast<uint64_t>(FileLayout().file_bytes());
  EXPECT_EQ(load.prefix_io().disk_bytes_read(),
            3 * (48 + 4 * ((payload + kChunk - 1) / kChunk) + payload));
  ExpectSame(Generate(5, prompts_[1], {1, 2, 3}), want);
  // The first prompt again, from the cache, while sequence 5 still shares the blocks.
  ExpectSame(Generate(6, prompts_[0], {1, 2, 3}), first);
  Release(5);
  Release(6);
  All(PrefixOp::KIND_DROP);
  EXPECT_EQ(engine_->Usage().free_bytes(), baseline_);
}

// A bounded cache evicts in place, so it copies the blocks; they stay intact for the next
// sequence, and the window sequence equals its recomputation.
TEST_P(PrefixCacheTest, ABoundedPolicyWorksOnACopy) {
  Generate(1, prompts_[0], {});
  Insert(1);
  Release(1);
  deja::v1::WorkerCachePolicy window;
  window.set_kind(deja::v1::WorkerCachePolicy::KIND_WINDOW);
  window.set_recent_tokens(40);
  const Outcome want_window = Generate(2, prompts_[1], {}, window);
  Release(2);
  ExpectSame(Generate(3, prompts_[1], {1, 2, 3}, window), want_window);
  Release(3);
  const Outcome want = Generate(4, prompts_[1], {});
  Release(4);
  ExpectSame(Generate(5, prompts_[1], {1, 2, 3}), want);
  Release(5);
  All(PrefixOp::KIND_DROP);
  EXPECT_EQ(engine_->Usage().free_bytes(), baseline_);
}

TEST_P(PrefixCacheTest, ACorruptOrMissingDiskCopyIsReportedNeverServed) {
  CacheFirstPrompt();
  All(PrefixOp::KIND_TO_DISK);
  // Block 2's file gets a flipped byte in the middle, block 3's file is deleted.
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir_)) files.push_back(e.path());
  ASSERT_EQ(files.size(), 3u);
  for (const auto& f : files) {
    const std::string name = f.filename().string();
    if (name.rfind("2.", 0) == 0) {
      std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
      io.seekg(static_cast<std::streamoff>(std::filesystem::file_size(f) / 2));
      char c = 0;
      io.read(&c, 1);
      c = static_cast<char>(c ^ 0x5a);
      io.seekp(static_cast<std::streamoff>(std::filesystem::file_size(f) / 2));
      io.write(&c, 1);
    } else if (name.rfind("3.", 0) == 0) {
      std::filesystem::remove(f);
    }
  }
  StepResponse load = All(PrefixOp::KIND_TO_MEMORY);
  ASSERT_EQ(load.prefix_failed_size(), 2);
  EXPECT_EQ(load.prefix_failed(0), 2u);
  EXPECT_EQ(load.prefix_failed(1), 3u);
  EXPECT_EQ(load.prefix_io().memory_blocks(), 1u);
  // Block 2 is forgotten: a sequence that names it is refused by field, and block 1 still works.
  StepRequest req = Step();
  deja::v1::SequenceWork w = FirstChunk(9, prompts_[1], prompts_[1].size(), 4);
  w.clear_tokens();
  for (size_t i = 2 * kBlock; i < prompts_[1].size(); ++i) w.add_tokens(prompts_[1][i]);
  w.set_start_position(2 * kBlock);
  w.mutable_config()->add_prefix_blocks(1);
  w.mutable_config()->add_prefix_blocks(2);
  *req.add_sequences() = w;
  StepResponse refused = Run(req);
  ASSERT_EQ(refused.results_size(), 1);
  EXPECT_EQ(refused.results(0).error_code(), static_cast<int>(StatusCode::kFailedPrecondition));
  EXPECT_NE(refused.results(0).error_message().find("config.prefix_blocks"), std::string::npos);
  const Outcome want = Generate(10, prompts_[1], {});
  Release(10);
  const std::vector<int32_t>& p = prompts_[1];
  Outcome got = Generate(11, p, {1});
  EXPECT_EQ(got.tokens, want.tokens);
  Release(11);
  All(PrefixOp::KIND_DROP);
  EXPECT_EQ(engine_->Usage().free_bytes(), baseline_);
}

// Important-token loading: a sequence reads its prefix's blocks where they are (host memory,
// disk), layer by layer. Keeping every token it equals recomputation; keeping half, it equals
// the same choice made on blocks copied from memory (the chosen tokens' K/V are loaded exactly,
// the others never), and it reads less than the whole blocks.
TEST_P(PrefixCacheTest, ImportantLoadingReadsOnlyTheChosenTokens) {
  const bool host = backend_->device().is_host();
  CacheFirstPrompt();
  const Outcome want = Generate(2, prompts_[1], {});
  Release(2);
  const int32_t layers = static_cast<int32_t>(model_->config().num_hidden_layers);
  const uint64_t block_bytes = static_cast<uint64_t>(model_->kv_pool()->block_bytes());

  prefix::ImportanceOptions all;
  all.kept_fraction = 1.0f;
  ASSERT_TRUE(model_->SetPrefixImportance(all).ok());
  All(PrefixOp::KIND_TO_HOST);
  StepResponse step;
  ExpectSame(Generate(3, prompts_[1], {1, 2, 3}, {}, true, &step), want);
  Release(3);
  EXPECT_EQ(step.prefix_failed_size(), 0);
  EXPECT_GT(step.prefix_io().host_bytes_read(), 0u);
  EXPECT_EQ(step.prefix_io().important_layers() + step.prefix_io().fallback_layers(),
            static_cast<uint64_t>(layers - all.dense_layers));
  // Nothing moved: the blocks are still on host only.
  EXPECT_EQ(step.prefix_io().host_blocks(), 3u);
  EXPECT_EQ(step.prefix_io().memory_blocks(), 0u);

  prefix::ImportanceOptions half;
  half.kept_fraction = 0.5f;
  half.alpha = 16.0f;  // a threshold of (1/3)^16: every layer chooses
  ASSERT_TRUE(model_->SetPrefixImportance(half).ok());
  const Outcome from_host = Generate(4, prompts_[1], {1, 2, 3}, {}, true, &step);
  Release(4);
  const StepResponse host_step = step;
  if (host) {
    // Probe heads that never agree (a threshold of (1/3)^1e-6): every layer reads everything,
    // each byte once.
    prefix::ImportanceOptions strict = half;
    strict.alpha = 1e-6f;
    ASSERT_TRUE(model_->SetPrefixImportance(strict).ok());
    ExpectSame(Generate(7, prompts_[1], {1, 2, 3}, {}, true, &step), want);
    Release(7);
    EXPECT_EQ(step.prefix_io().fallback_layers(), static_cast<uint64_t>(layers - 1));
    EXPECT_EQ(step.prefix_io().important_layers(), 0u);
    const kv::KvGeometry g = model_->kv_geometry();
    EXPECT_EQ(step.prefix_io().host_bytes_read(), static_cast<uint64_t>(layers) * 2 * g.heads *
                                                      kPrefixBlocks * kBlock * g.head_dim *
                                                      DTypeSize(g.kv_dtype));
    ASSERT_TRUE(model_->SetPrefixImportance(half).ok());
  }
  All(PrefixOp::KIND_TO_DISK);
  const Outcome from_disk = Generate(5, prompts_[1], {1, 2, 3}, {}, true, &step);
  Release(5);
  const StepResponse disk_step = step;
  All(PrefixOp::KIND_TO_MEMORY);
  const Outcome from_memory = Generate(6, prompts_[1], {1, 2, 3}, {}, true);
  Release(6);
  ExpectSame(from_disk, from_host);
  ExpectSame(from_memory, from_host);
  EXPECT_EQ(disk_step.prefix_failed_size(), 0);
  EXPECT_GT(disk_step.prefix_io().disk_bytes_read(), 0u);
  if (host) {
    // Exactly: layer 0 whole, then per layer three probe heads' keys and 48 of the 96 tokens'
    // K and V in every head (but the probe heads' keys, read already).
    EXPECT_EQ(host_step.prefix_io().important_layers(), static_cast<uint64_t>(layers - 1));
    const kv::KvGeometry g = model_->kv_geometry();
    const uint64_t row = static_cast<uint64_t>(g.head_dim) * DTypeSize(g.kv_dtype);
    const uint64_t n = kPrefixBlocks * kBlock;
    const uint64_t whole = 2 * g.heads * n * row;
    EXPECT_EQ(host_step.prefix_io().host_bytes_read(),
              whole + (layers - 1) * (3 * n * row + (2 * g.heads - 3) * (n / 2) * row));
    EXPECT_LT(host_step.prefix_io().host_bytes_read(), 3 * block_bytes * 7 / 10 + whole);
    // Each block's share of the 48 tokens a layer kept: 48 / 32 over the three blocks.
    ASSERT_EQ(host_step.prefix_io().block_importance_size(), 3);
    double shares = 0;
    for (const auto& b : host_step.prefix_io().block_importance()) {
      EXPECT_GE(b.block_id(), 1u);
      EXPECT_LE(b.block_id(), 3u);
      EXPECT_GE(b.important_fraction(), 0.0);
      EXPECT_LE(b.important_fraction(), 1.0);
      shares += b.important_fraction();
    }
    EXPECT_NEAR(shares, 1.5, 1e-9);
    // Not what recomputing gives: half the prefix is gone from every layer but the first.
    double diff = 0;
    for (size_t i = 0; i < want.logprobs.size(); ++i) {
      diff =
          std::max(diff, std::abs(static_cast<double>(from_host.logprobs[i]) - want.logprobs[i]));
    }
    EXPECT_GT(diff, 1e-3);
  } else {
    // A device keeps the whole prefix: exact.
    ExpectSame(from_host, want);
  }
  All(PrefixOp::KIND_DROP);
  EXPECT_EQ(engine_->Usage().free_bytes(), baseline_);
}

// Loads count which tokens each layer chose; the files are rewritten in the background with
// those first (grouped over every head), so the same question then reads the few groups that
// hold its choice, and gets the same log-probabilities. A whole load of a reordered file equals
// recomputation.
TEST_P(PrefixCacheTest, ReorderedFilesReadTheChosenTokensContiguously) {
  if (!backend_->device().is_host()) GTEST_SKIP() << "a device keeps the whole prefix";
  CacheFirstPrompt();
  const Outcome want = Generate(2, prompts_[1], {});
  Release(2);
  // Every layer chooses half, by two probe heads: all but their keys follow the choice.
  prefix::ImportanceOptions half;
  half.kept_fraction = 0.5f;
  half.alpha = 16.0f;
  half.dense_layers = 0;
  half.probe_heads = {0, 1};
  ASSERT_TRUE(model_->SetPrefixImportance(half).ok());
  All(PrefixOp::KIND_TO_DISK);
  prefix::PrefixStore* store = engine_->prefix_store();
  ASSERT_NE(store, nullptr);
  StepResponse first_step, second_step;
  const Outcome first = Generate(3, prompts_[1], {1, 2, 3}, {}, true, &first_step);
  Release(3);
  store->FinishReorders();
  EXPECT_EQ(store->reordered_files(), kPrefixBlocks);
  files_->Flush();  // a queued file is read from its buffer, which counts no bytes
  const Outcome second = Generate(4, prompts_[1], {1, 2, 3}, {}, true, &second_step);
  Release(4);
  ExpectSame(second, first);
  EXPECT_EQ(second_step.prefix_failed_size(), 0);
  // In position order a layer's 48 chosen tokens of 96 touch nearly every group of 8; in their
  // own order they fill 6 to 9 of the 12 groups. Every layer reads the probe heads' keys (1/8
  // of its K and V) and the chosen groups of the rest (7/8).
  const uint64_t a = first_step.prefix_io().disk_bytes_read();
  const uint64_t b = second_step.prefix_io().disk_bytes_read();
  const int32_t layers = static_cast<int32_t>(model_->config().num_hidden_layers);
  const prefix::OrderedLayout l = FileLayout();
  const double all = 2.0 * layers * l.heads() * l.block_slots() * l.row_bytes() * kPrefixBlocks;
  EXPECT_GT(static_cast<double>(a), all * (1.0 / 8 + 7.0 / 8 * 0.9)) << "first";
  EXPECT_GE(static_cast<double>(b), all * (1.0 / 8 + 7.0 / 8 * 6 / 12)) << "second";
  // 9 groups at most, and the headers (a CRC per chunk) of two reads per layer and block.
  EXPECT_LT(static_cast<double>(b), all * (1.0 / 8 + 7.0 / 8 * 9 / 12) * 1.06) << "second";
  // The same choice again counts the same tokens: no new order, no rewrite.
  store->FinishReorders();
  EXPECT_EQ(store->reordered_files(), kPrefixBlocks);
  // Back into memory whole, from the reordered files: exact.
  StepResponse load = All(PrefixOp::KIND_TO_MEMORY);
  EXPECT_EQ(load.prefix_failed_size(), 0);
  ExpectSame(Generate(5, prompts_[1], {1, 2, 3}), want);
  Release(5);
  All(PrefixOp::KIND_DROP);
  EXPECT_EQ(engine_->Usage().free_bytes(), baseline_);
}

// A block that cannot be read while a sequence loads it is reported and forgotten; that
// sequence's step still completes (the coordinator recomputes it), and the other sequence of the
// step is untouched.
TEST_P(PrefixCacheTest, ImportantLoadingOfACorruptBlockFailsOnlyItsSequence) {
  CacheFirstPrompt();
  const Outcome want = Generate(2, prompts_[1], {});
  Release(2);
  All(PrefixOp::KIND_TO_DISK);
  for (const auto& e : std::filesystem::directory_iterator(dir_)) {
    if (e.path().filename().string().rfind("2.", 0) == 0) std::filesystem::remove(e.path());
  }
  StepRequest req = Step();
  deja::v1::SequenceWork lazy = FirstChunk(7, prompts_[1], prompts_[1].size(), 4);
  lazy.clear_tokens();
  for (size_t i = 3 * kBlock; i < prompts_[1].size(); ++i) lazy.add_tokens(prompts_[1][i]);
  lazy.set_start_position(3 * kBlock);
  for (uint64_t b : {1, 2, 3}) lazy.mutable_config()->add_prefix_blocks(b);
  lazy.mutable_config()->set_prefix_important(true);
  *req.add_sequences() = lazy;
  deja::v1::SequenceWork plain = FirstChunk(8, prompts_[1], prompts_[1].size(), kNewTokens);
  *req.add_sequences() = plain;
  StepResponse resp = Run(req);
  ASSERT_EQ(resp.prefix_failed_size(), 1);
  EXPECT_EQ(resp.prefix_failed(0), 2u);
  ASSERT_EQ(resp.results_size(), 2);
  EXPECT_EQ(resp.results(0).error_code(), 0) << resp.results(0).error_message();
  EXPECT_EQ(resp.results(1).error_code(), 0) << resp.results(1).error_message();
  EXPECT_EQ(resp.results(1).token_id(), want.tokens[0]);
  Release(7);
  Release(8);
  // Block 2 is gone; a FULL-policy request is the only kind that may ask for important loading.
  StepRequest again = Step();
  *again.add_sequences() = lazy;
  StepResponse refused = Run(again);
  ASSERT_EQ(refused.results_size(), 1);
  EXPECT_NE(refused.results(0).error_message().find("config.prefix_blocks"), std::string::npos);
  lazy.mutable_config()->mutable_cache()->set_kind(deja::v1::WorkerCachePolicy::KIND_WINDOW);
  lazy.mutable_config()->mutable_cache()->set_recent_tokens(40);
  StepRequest window = Step();
  *window.add_sequences() = lazy;
  StepResponse bad = Run(window);
  ASSERT_EQ(bad.results_size(), 1);
  EXPECT_EQ(bad.results(0).error_code(), static_cast<int>(StatusCode::kInvalidArgument));
  EXPECT_NE(bad.results(0).error_message().find("config.prefix_important"), std::string::npos);
  All(PrefixOp::KIND_DROP);
  EXPECT_EQ(engine_->Usage().free_bytes(), baseline_);
}

std::vector<std::string> Devices() {
  std::vector<std::string> d = test_util::TestDevices();
  d[0] = "cpu_paged";  // the CPU pages its KV for the prefix cache
  return d;
}

INSTANTIATE_TEST_SUITE_P(Devices, PrefixCacheTest, ::testing::ValuesIn(Devices()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace deja::worker::service
