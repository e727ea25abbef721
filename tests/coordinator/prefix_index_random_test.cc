// PrefixIndex, randomized: a run of inserts, lookups, promotions, pins and losses whose every
// emitted op is replayed on a simulated worker and checked against the index.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "coordinator/prefix_index.h"
#include "tests/coordinator/prefix_index_test_util.h"

namespace deja::coordinator {
namespace {

using namespace prefix_index_test;  // NOLINT

// ---- Randomized: the index against a simulated worker and a model of scores and pins. ----

struct RandomCase {
  PrefixIndexOptions options;
  uint32_t seed;
  bool collide = false;
};

void PrintTo(const RandomCase& c, std::ostream* os) {
  *os << "block_tokens " << c.options.block_tokens << " memory " << c.options.memory_blocks
      << " host " << c.options.host_blocks << " disk " << c.options.disk_blocks << " seed "
      << c.seed << (c.collide ? " colliding" : "");
}

class PrefixIndexRandomTest : public ::testing::TestWithParam<RandomCase> {
 protected:
  struct Block {
    bool memory = false, host = false, disk = false;
    uint64_t parent = 0;
    Tokens tokens;
    int64_t hits = 1;
    double importance = 0;
  };

  bool disk_on() const { return GetParam().options.disk_blocks > 0; }

  // Executes ops as a worker would, refusing anything a worker could not do.
  void Replay(const Ops& ops) {
    for (const PrefixOp& op : ops) {
      SCOPED_TRACE(::testing::Message() << op);
      auto it = worker_.find(op.block_id);
      ASSERT_NE(it, worker_.end()) << "op on an unknown or dropped block";
      Block& b = it->second;
      switch (op.kind) {
        case Kind::kToHost:
          ASSERT_TRUE(b.memory);
          b.memory = false;
          b.host = true;
          break;
        case Kind::kToDisk:
          ASSERT_TRUE(b.disk && (b.memory || b.host));
          b.memory = b.host = false;
          break;
        case Kind::kToMemory:
          ASSERT_TRUE(!b.memory && (b.host || b.disk));
          b.memory = true;
          b.host = false;
          break;
        case Kind::kDrop:
          ASSERT_EQ(pins_.count(op.block_id), 0u) << "dropped a pinned block";
          worker_.erase(it);
          break;
      }
      int64_t memory = 0, host = 0;
      for (const auto& [id, w] : worker_) {
        memory += w.memory;
        host += w.host;
      }
      // Budgets hold at every step of the replay, not only after it.
      ASSERT_LE(memory, GetParam().options.memory_blocks);
      ASSERT_LE(host, GetParam().options.host_blocks);
    }
  }

  void Check() {
    const PrefixIndexOptions& o = GetParam().options;
    int64_t count[3] = {0, 0, 0};
    for (const auto& [id, b] : worker_) {
      ASSERT_FALSE(b.memory && b.host);
      ASSERT_EQ(b.disk, disk_on());
      const PrefixTier want = b.memory ? kMem : b.host ? kHost : kDisk;
      ASSERT_EQ(index_->TierOf(id), want) << "block " << id;
      ++count[static_cast<int>(want)];
      ASSERT_DOUBLE_EQ(index_->Score(id), b.hits * (1 + b.importance));
      ASSERT_TRUE(b.parent == 0 || worker_.count(b.parent)) << "orphan " << id;
    }
    ASSERT_EQ(index_->size(), static_cast<int64_t>(worker_.size()));
    for (PrefixTier t : {kMem, kHost, kDisk}) {
      ASSERT_EQ(index_->blocks(t), count[static_cast<int>(t)]);
    }
    ASSERT_LE(index_->blocks(kMem), o.memory_blocks);
    ASSERT_LE(index_->blocks(kHost), o.host_blocks);
    if (disk_on()) {
      ASSERT_LE(index_->size(), o.disk_blocks);
      ASSERT_EQ(index_->disk_replicas(), index_->size());
    } else {
      ASSERT_EQ(index_->blocks(kDisk), 0);
    }
    for (uint64_t id = 1; id < next_id_; ++id) {
      if (!worker_.count(id)) {
        ASSERT_EQ(index_->TierOf(id), std::nullopt);
      }
    }
    for (const auto& [id, n] : pins_) {
      ASSERT_EQ(index_->PinCount(id), n);
      ASSERT_EQ(index_->TierOf(id), kMem) << "pinned block " << id;
    }
  }

  // A prompt from a small alphabet, so that prefixes overlap often.
  Tokens RandomPrompt() {
    Tokens t(std::uniform_int_distribution<int>(0, 5 * GetParam().options.block_tokens)(rng_));
    for (int32_t& x : t) x = std::uniform_int_distribution<int32_t>(0, 2)(rng_);
    return t;
  }

  // Checks a Lookup against the model: a chain of the prompt's blocks that cannot be extended.
  PrefixMatch CheckedLookup(const Tokens& t) {
    const int32_t bt = GetParam().options.block_tokens;
    PrefixMatch m = index_->Lookup(t.data(), static_cast<int32_t>(t.size()));
    EXPECT_EQ(m.blocks.size(), m.tiers.size());
    EXPECT_EQ(m.tokens, static_cast<int32_t>(m.blocks.size()) * bt);
    uint64_t parent = 0;
    for (size_t i = 0; i <= m.blocks.size(); ++i) {
      const bool whole = static_cast<int64_t>(i + 1) * bt <= static_cast<int64_t>(t.size());
      const Tokens block = whole ? Tokens(t.begin() + i * bt, t.begin() + (i + 1) * bt) : Tokens();
      if (i == m.blocks.size()) {  // Maximal: no block the model knows continues the match.
        for (const auto& [id, b] : worker_) {
          EXPECT_FALSE(whole && b.parent == parent && b.tokens == block) << "missed " << id;
        }
        break;
      }
      const Block& b = worker_.at(m.blocks[i]);
      EXPECT_EQ(b.parent, parent);
      EXPECT_EQ(b.tokens, block);
      EXPECT_EQ(m.tiers[i], index_->TierOf(m.blocks[i]));
      parent = m.blocks[i];
    }
    return m;
  }

  void DoInsert() {
    const Tokens t = RandomPrompt();
    const PrefixMatch before = CheckedLookup(t);
    Ops ops;
    std::vector<size_t> created_at;
    const auto added = index_->Insert(t.data(), static_cast<int32_t>(t.size()), &ops, &created_at);
    ASSERT_EQ(created_at.size(), added.size());
    for (uint64_t id : before.blocks) ++worker_.at(id).hits;
    const int32_t bt = GetParam().options.block_tokens;
    uint64_t parent = before.blocks.empty() ? 0 : before.blocks.back();
    int32_t expect_block = static_cast<int32_t>(before.blocks.size());
    size_t replayed = 0;
    // The ops before each new block's creation never name it; the worker then holds it, and
    // later ops may move it down a tier (a long prompt spilling its first blocks).
    for (size_t k = 0; k < added.size(); ++k) {
      const auto& [block, id] = added[k];
      ASSERT_LE(created_at[k], ops.size());
      ASSERT_GE(created_at[k], replayed);
      const Ops head(ops.begin() + static_cast<std::ptrdiff_t>(replayed),
                     ops.begin() + static_cast<std::ptrdiff_t>(created_at[k]));
      for (const PrefixOp& op : head) ASSERT_NE(op.block_id, id);
      ASSERT_NO_FATAL_FAILURE(Replay(head));
      replayed = created_at[k];
      ASSERT_EQ(block, expect_block++);
      ASSERT_EQ(id, next_id_++);
      Block& b = worker_[id];
      b.memory = true;
      b.disk = disk_on();
      b.parent = parent;
      b.tokens.assign(t.begin() + block * bt, t.begin() + (block + 1) * bt);
      parent = id;
    }
    ASSERT_NO_FATAL_FAILURE(
        Replay(Ops(ops.begin() + static_cast<std::ptrdiff_t>(replayed), ops.end())));
  }

  void DoPromoteAndPin() {
    const PrefixMatch m = CheckedLookup(RandomPrompt());
    Ops ops;
    const int32_t k = index_->Promote(m.blocks, &ops);
    ASSERT_NO_FATAL_FAILURE(Replay(ops));
    ASSERT_GE(k, 0);
    ASSERT_LE(k, static_cast<int32_t>(m.blocks.size()));
    std::vector<uint64_t> run(m.blocks.begin(), m.blocks.begin() + k);
    for (uint64_t id : run) ASSERT_TRUE(worker_.at(id).memory);
    // When memory had room, the whole run must have come in.
    if (k < static_cast<int32_t>(m.blocks.size())) {
      ASSERT_EQ(index_->blocks(kMem), GetParam().options.memory_blocks);
    }
    index_->Pin(run);
    for (uint64_t id : run) ++pins_[id];
    held_.push_back(run);
  }

  void DoUnpin() {
    if (held_.empty()) return;
    const size_t i = std::uniform_int_distribution<size_t>(0, held_.size() - 1)(rng_);
    index_->Unpin(held_[i]);
    for (uint64_t id : held_[i]) {
      if (--pins_[id] == 0) pins_.erase(id);
    }
    held_.erase(held_.begin() + i);
  }

  uint64_t RandomId() { return std::uniform_int_distribution<uint64_t>(1, next_id_)(rng_); }

  void DoLost() {
    std::vector<uint64_t> candidates;  // Lost is only reported for blocks outside memory.
    for (const auto& [id, b] : worker_) {
      if (!b.memory) candidates.push_back(id);
    }
    if (candidates.empty()) return;
    const uint64_t id =
        candidates[std::uniform_int_distribution<size_t>(0, candidates.size() - 1)(rng_)];
    Ops ops;
    index_->Lost(id, &ops);
    ASSERT_FALSE(ops.empty());
    ASSERT_EQ(ops[0], Drop(id));
    for (const PrefixOp& op : ops) ASSERT_EQ(op.kind, Kind::kDrop);
    ASSERT_NO_FATAL_FAILURE(Replay(ops));
  }

  void Run() {
    rng_.seed(GetParam().seed);
    index_ = std::make_unique<PrefixIndex>(GetParam().options);
    if (GetParam().collide) PrefixIndexTestPeer::CollideAllHashes(index_.get());
    for (int step = 0; step < 3000; ++step) {
      SCOPED_TRACE(::testing::Message() << "step " << step);
      const int what = std::uniform_int_distribution<int>(0, 99)(rng_);
      if (what < 35) {
        ASSERT_NO_FATAL_FAILURE(DoInsert());
      } else if (what < 50) {
        CheckedLookup(RandomPrompt());
      } else if (what < 65) {
        ASSERT_NO_FATAL_FAILURE(DoPromoteAndPin());
      } else if (what < 80) {
        DoUnpin();
      } else if (what < 88) {
        const PrefixMatch m = CheckedLookup(RandomPrompt());
        index_->Touch(m.blocks);
        for (uint64_t id : m.blocks) ++worker_.at(id).hits;
      } else if (what < 92) {
        ASSERT_NO_FATAL_FAILURE(DoLost());
      } else if (what < 98) {
        const uint64_t id = RandomId();
        const double f = std::uniform_real_distribution<double>(-0.5, 1.5)(rng_);
        index_->SetImportance(id, f);
        if (worker_.count(id)) worker_[id].importance = std::clamp(f, 0.0, 1.0);
      } else {
        index_->Unpin({RandomId() + 1000});  // Unknown ids are ignored.
      }
      ASSERT_FALSE(HasFailure());
      ASSERT_NO_FATAL_FAILURE(Check());
    }
    // The run must have exercised the tiers, not idled in an empty index.
    if (GetParam().options.memory_blocks > 0) {
      EXPECT_GT(next_id_, 100u);
    }
  }

  std::mt19937 rng_;
  std::unique_ptr<PrefixIndex> index_;
  std::map<uint64_t, Block> worker_;
  std::map<uint64_t, int32_t> pins_;
  std::vector<std::vector<uint64_t>> held_;
  uint64_t next_id_ = 1;
};

TEST_P(PrefixIndexRandomTest, MatchesSimulatedWorker) { Run(); }

INSTANTIATE_TEST_SUITE_P(
    Configs, PrefixIndexRandomTest,
    ::testing::Values(RandomCase{Options(2, 6, 4, 14), 1}, RandomCase{Options(2, 6, 4, 14), 2},
                      RandomCase{Options(1, 5, 0, 0), 3}, RandomCase{Options(2, 4, 3, 0), 4},
                      RandomCase{Options(3, 3, 0, 8), 5}, RandomCase{Options(2, 8, 8, 10), 6},
                      RandomCase{Options(1, 4, 2, 9), 7, /*collide=*/true},
                      RandomCase{Options(2, 0, 3, 5), 8}));

}  // namespace
}  // namespace deja::coordinator
