// PrefixIndex: longest-prefix lookup, score-ordered eviction down the memory -> host -> disk ->
// drop cascade with exact op sequences, pins, subtree drops, Promote, Lost and keys (the
// randomized run is prefix_index_random_test.cc).
#include "coordinator/prefix_index.h"

#include <gtest/gtest.h>

#include <memory>

#include "tests/coordinator/prefix_index_test_util.h"

namespace deja::coordinator {
namespace {

using namespace prefix_index_test;  // NOLINT

// Block size 2 throughout the scripted tests.
class PrefixIndexTest : public ::testing::Test {
 protected:
  void Make(int64_t memory, int64_t host, int64_t disk) {
    index_ = std::make_unique<PrefixIndex>(Options(2, memory, host, disk));
  }
  // Inserts, expecting exactly `want_ops`; returns the new ids.
  std::vector<uint64_t> Insert(const Tokens& t, const Ops& want_ops = {}) {
    Ops ops;
    std::vector<uint64_t> ids;
    for (const auto& [block, id] : index_->Insert(t.data(), static_cast<int32_t>(t.size()), &ops)) {
      ids.push_back(id);
    }
    EXPECT_EQ(ops, want_ops);
    return ids;
  }
  // Inserts a one-block prompt, expecting `want_ops`; returns its id.
  uint64_t Insert1(int32_t token, const Ops& want_ops = {}) {
    std::vector<uint64_t> ids = Insert({token, token}, want_ops);
    EXPECT_EQ(ids.size(), 1u);
    return ids.empty() ? 0 : ids[0];
  }
  PrefixMatch Lookup(const Tokens& t) const {
    return index_->Lookup(t.data(), static_cast<int32_t>(t.size()));
  }
  void ExpectCounts(int64_t memory, int64_t host, int64_t disk_only) const {
    EXPECT_EQ(index_->blocks(kMem), memory);
    EXPECT_EQ(index_->blocks(kHost), host);
    EXPECT_EQ(index_->blocks(kDisk), disk_only);
  }

  std::unique_ptr<PrefixIndex> index_;
};

// A prompt longer than the memory tier: its first blocks move down as the later ones come in,
// each after it was created (created_at), and the whole prompt stays findable.
TEST_F(PrefixIndexTest, ALongPromptSpillsItsFirstBlocksDownATier) {
  Make(2, 1, 8);
  const Tokens t = {1, 1, 2, 2, 3, 3, 4, 4};
  Ops ops;
  std::vector<size_t> created_at;
  const auto added = index_->Insert(t.data(), 8, &ops, &created_at);
  ASSERT_EQ(added.size(), 4u);
  const uint64_t a = added[0].second, b = added[1].second, c = added[2].second, d = added[3].second;
  EXPECT_EQ(ops, (Ops{ToHost(a), ToDisk(a), ToHost(b)}));
  EXPECT_EQ(created_at, (std::vector<size_t>{0, 0, 1, 3}));
  ExpectCounts(2, 1, 1);
  EXPECT_EQ(index_->TierOf(c), kMem);
  EXPECT_EQ(index_->TierOf(d), kMem);
  EXPECT_EQ(Lookup(t).blocks, (std::vector<uint64_t>{a, b, c, d}));
}

// The scheduler lowers the memory budget when sequences need the KV memory: the lowest unpinned
// blocks move down (pinned ones stay, even past the budget), and raising it lets blocks in again.
TEST_F(PrefixIndexTest, LoweringTheMemoryBudgetDemotesUnpinnedBlocks) {
  Make(3, 4, 0);
  const uint64_t a = Insert1(1);
  const uint64_t b = Insert1(2);
  const uint64_t c = Insert1(3);
  index_->Pin({c});
  Ops ops;
  EXPECT_EQ(index_->SetMemoryBlocks(1, &ops), 1);
  EXPECT_EQ(ops, (Ops{ToHost(a), ToHost(b)}));
  ops.clear();
  EXPECT_EQ(index_->SetMemoryBlocks(0, &ops), 1);  // c is pinned
  EXPECT_TRUE(ops.empty());
  EXPECT_EQ(index_->TierOf(c), kMem);
  index_->Unpin({c});
  ops.clear();
  EXPECT_EQ(index_->SetMemoryBlocks(2, &ops), 1);
  EXPECT_TRUE(ops.empty());
  EXPECT_EQ(index_->Promote({a}, &ops), 1);
  ExpectCounts(2, 1, 0);
}

TEST_F(PrefixIndexTest, LookupMatchesWholeBlocksOnly) {
  Make(10, 0, 0);
  const std::vector<uint64_t> ids = Insert({1, 2, 3, 4, 5});  // The partial block is not kept.
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(index_->size(), 2);

  PrefixMatch m = Lookup({1, 2, 3, 4, 5, 6});
  EXPECT_EQ(m.blocks, ids);
  EXPECT_EQ(m.tiers, (std::vector<PrefixTier>{kMem, kMem}));
  EXPECT_EQ(m.tokens, 4);
  EXPECT_EQ(Lookup({1, 2, 3}).blocks, std::vector<uint64_t>{ids[0]});
  EXPECT_EQ(Lookup({1, 2, 3}).tokens, 2);
  EXPECT_EQ(Lookup({1}).tokens, 0);
  EXPECT_EQ(Lookup({}).tokens, 0);
  EXPECT_TRUE(Lookup({2, 1, 3, 4}).blocks.empty());  // Same ids, other order.
  EXPECT_TRUE(Lookup({3, 4}).blocks.empty());        // A block matches only under its prefix.
  EXPECT_EQ(index_->Lookup(nullptr, 0).tokens, 0);
}

TEST_F(PrefixIndexTest, DivergingPromptsShareCommonBlocks) {
  Make(10, 0, 0);
  const std::vector<uint64_t> a = Insert({1, 2, 3, 4});
  const std::vector<int32_t> b_prompt = {1, 2, 5, 6, 7, 8};
  Ops ops;
  auto added = index_->Insert(b_prompt.data(), 6, &ops);
  ASSERT_EQ(added.size(), 2u);
  EXPECT_EQ(added[0].first, 1);  // Block 0 is shared.
  EXPECT_EQ(added[1].first, 2);
  EXPECT_TRUE(ops.empty());
  EXPECT_EQ(index_->size(), 4);
  EXPECT_EQ(Lookup(b_prompt).blocks,
            (std::vector<uint64_t>{a[0], added[0].second, added[1].second}));
  EXPECT_EQ(Lookup({1, 2, 3, 4}).blocks, a);
  EXPECT_EQ(Lookup({1, 2, 5, 6, 3, 4}).blocks.size(), 2u);
}

TEST_F(PrefixIndexTest, CollidingHashesNeverMatchFalsely) {
  Make(10, 0, 0);
  PrefixIndexTestPeer::CollideAllHashes(index_.get());
  const std::vector<uint64_t> a = Insert({1, 2, 3, 4});
  const std::vector<uint64_t> b = Insert({1, 2, 3, 5});
  const std::vector<uint64_t> c = Insert({7, 8});
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 1u);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(Lookup({1, 2, 3, 4}).blocks, a);
  EXPECT_EQ(Lookup({1, 2, 3, 5}).blocks, (std::vector<uint64_t>{a[0], b[0]}));
  EXPECT_EQ(Lookup({7, 8, 3, 4}).blocks, c);
  EXPECT_EQ(Lookup({1, 2, 3, 6}).blocks, std::vector<uint64_t>{a[0]});
  EXPECT_TRUE(Lookup({1, 3}).blocks.empty());
  // Dropping one of the colliding siblings leaves the other reachable.
  Ops ops;
  index_->Lost(a[1], &ops);
  EXPECT_EQ(ops, Ops{Drop(a[1])});
  EXPECT_EQ(Lookup({1, 2, 3, 5}).blocks, (std::vector<uint64_t>{a[0], b[0]}));
  EXPECT_EQ(Lookup({1, 2, 3, 4}).blocks, std::vector<uint64_t>{a[0]});
}

// Blocks are shared only within one key (how the K/V were computed, the request's cache_salt):
// the same tokens under another key miss, get blocks of their own, and one key's blocks going
// (evicted or lost) leaves the other key's untouched; a key whose last block goes is forgotten.
TEST_F(PrefixIndexTest, KeysNeverShareBlocks) {
  Make(3, 0, 0);
  const Tokens t = {1, 2, 3, 4};
  Ops ops;
  auto dense = index_->Insert("dense", t.data(), 4, &ops);
  ASSERT_EQ(dense.size(), 2u);
  EXPECT_EQ(index_->Lookup("dense", t.data(), 4).blocks.size(), 2u);
  EXPECT_TRUE(index_->Lookup("sparse", t.data(), 4).blocks.empty());
  EXPECT_TRUE(index_->Lookup(t.data(), 4).blocks.empty());  // the unkeyed tree is a key too
  EXPECT_EQ(index_->keys(), 1);
  // The same tokens under another key: new blocks (the memory tier of 3 evicts the lowest,
  // a dense one), never the dense ones reused.
  auto sparse = index_->Insert("sparse", t.data(), 4, &ops);
  ASSERT_EQ(sparse.size(), 2u);
  EXPECT_NE(sparse[0].second, dense[0].second);
  EXPECT_NE(sparse[1].second, dense[1].second);
  EXPECT_EQ(index_->keys(), 2);
  const PrefixMatch s = index_->Lookup("sparse", t.data(), 4);
  EXPECT_EQ(s.blocks, (std::vector<uint64_t>{sparse[0].second, sparse[1].second}));
  for (uint64_t id : index_->Lookup("dense", t.data(), 4).blocks) {
    EXPECT_NE(id, sparse[0].second);
    EXPECT_NE(id, sparse[1].second);
  }
  // Losing a key's first block forgets its tree, and the key with it.
  index_->Lost(sparse[0].second, &ops);
  EXPECT_TRUE(index_->Lookup("sparse", t.data(), 4).blocks.empty());
  EXPECT_EQ(index_->keys(), index_->Lookup("dense", t.data(), 4).blocks.empty() ? 0 : 1);
}

// Inserting under a key whose only other blocks must make room for the new ones keeps the tree
// (the insert's own root is never forgotten while it adds to it).
TEST_F(PrefixIndexTest, InsertEvictingItsOwnKeysBlocksKeepsTheTree) {
  Make(1, 0, 0);  // room for one block: inserting b drops a, the key's only block, first
  const Tokens a = {1, 1}, b = {3, 3};
  Ops ops;
  const auto first = index_->Insert("k", a.data(), 2, &ops);
  ASSERT_EQ(first.size(), 1u);
  ops.clear();
  const auto added = index_->Insert("k", b.data(), 2, &ops);
  ASSERT_EQ(added.size(), 1u);
  EXPECT_EQ(ops, Ops{Drop(first[0].second)});
  EXPECT_EQ(index_->Lookup("k", b.data(), 2).blocks, std::vector<uint64_t>{added[0].second});
  EXPECT_TRUE(index_->Lookup("k", a.data(), 2).blocks.empty());
  EXPECT_EQ(index_->keys(), 1);
}

TEST_F(PrefixIndexTest, InsertReturnsOnlyNewBlocksAndNeedsNoOpsWithRoom) {
  Make(4, 0, 0);
  const std::vector<uint64_t> ids = Insert({1, 1, 2, 2});
  EXPECT_EQ(ids, (std::vector<uint64_t>{1, 2}));  // Ids start at 1.
  EXPECT_TRUE(Insert({1, 1, 2, 2}).empty());
  EXPECT_EQ(index_->Score(ids[0]), 2);  // Inserting again counts as a hit.
  EXPECT_EQ(index_->Score(ids[1]), 2);
  const std::vector<uint64_t> more = Insert({1, 1, 2, 2, 3, 3});
  EXPECT_EQ(more, std::vector<uint64_t>{3});
  EXPECT_EQ(index_->Score(3), 1);
  EXPECT_EQ(index_->Score(99), -1);
  ExpectCounts(3, 0, 0);
  EXPECT_EQ(index_->disk_replicas(), 0);
}

TEST_F(PrefixIndexTest, MemoryBudgetZeroStoresNothing) {
  Make(0, 4, 4);
  EXPECT_TRUE(Insert({1, 1, 2, 2}).empty());
  EXPECT_EQ(index_->size(), 0);
  Ops ops;
  EXPECT_EQ(index_->Promote({1}, &ops), 0);
  EXPECT_TRUE(ops.empty());
}

TEST_F(PrefixIndexTest, TouchedBlockOutlivesUntouchedOne) {
  Make(2, 0, 0);
  const uint64_t a = Insert1(1);
  const uint64_t b = Insert1(2);
  index_->Touch({a});
  EXPECT_EQ(index_->Score(a), 2);
  const uint64_t c = Insert1(3, {Drop(b)});
  EXPECT_EQ(index_->TierOf(a), kMem);
  EXPECT_EQ(index_->TierOf(b), std::nullopt);
  EXPECT_EQ(index_->TierOf(c), kMem);
}

TEST_F(PrefixIndexTest, ImportanceRaisesScore) {
  Make(2, 0, 0);
  const uint64_t a = Insert1(1);
  const uint64_t b = Insert1(2);
  index_->SetImportance(a, 0.5);
  EXPECT_DOUBLE_EQ(index_->Score(a), 1.5);
  Insert1(3, {Drop(b)});        // Without importance the older a would go.
  index_->SetImportance(a, 7);  // Clamped to 1.
  EXPECT_DOUBLE_EQ(index_->Score(a), 2);
  index_->SetImportance(a, -1);
  EXPECT_DOUBLE_EQ(index_->Score(a), 1);
}

TEST_F(PrefixIndexTest, TiesGoToTheLeastRecentlyTouched) {
  Make(2, 0, 0);
  const uint64_t a = Insert1(1);
  const uint64_t b = Insert1(2);
  index_->Touch({b});
  index_->Touch({a});  // Both score 2; b was touched longer ago.
  Insert1(3, {Drop(b)});
}

TEST_F(PrefixIndexTest, TiesWithinOnePromptGoDeepestFirst) {
  Make(2, 0, 0);
  std::vector<uint64_t> p = Insert({1, 1, 2, 2});
  Insert1(3, {Drop(p[1])});  // Insert stamps the root-most block last.

  Make(2, 0, 0);
  p = Insert({1, 1, 2, 2});
  index_->Touch({p[0], p[1]});  // Both score 2; so does Touch.
  Insert1(3, {Drop(p[1])});
  EXPECT_EQ(index_->TierOf(p[0]), kMem);
}

TEST_F(PrefixIndexTest, CascadeMemoryHostDiskDrop) {
  Make(1, 1, 3);
  const uint64_t a = Insert1(1);
  const uint64_t b = Insert1(2, {ToHost(a)});
  const uint64_t c = Insert1(3, {ToDisk(a), ToHost(b)});
  ExpectCounts(1, 1, 1);
  EXPECT_EQ(index_->disk_replicas(), 3);
  // The disk tier is full too: the lowest disk-only block goes for good.
  const uint64_t d = Insert1(4, {ToDisk(b), ToHost(c), Drop(a)});
  ExpectCounts(1, 1, 1);
  EXPECT_EQ(index_->TierOf(b), kDisk);
  EXPECT_EQ(index_->TierOf(c), kHost);
  EXPECT_EQ(index_->TierOf(d), kMem);
  EXPECT_EQ(index_->size(), 3);
  EXPECT_EQ(Lookup({2, 2}).tiers, std::vector<PrefixTier>{kDisk});
}

TEST_F(PrefixIndexTest, CascadeWithoutDiskDropsWhatLeavesHost) {
  Make(1, 1, 0);
  const uint64_t a = Insert1(1);
  const uint64_t b = Insert1(2, {ToHost(a)});
  Insert1(3, {Drop(a), ToHost(b)});
  ExpectCounts(1, 1, 0);
  EXPECT_EQ(index_->disk_replicas(), 0);
}

TEST_F(PrefixIndexTest, WithoutHostMemoryGoesToDiskOrIsDropped) {
  Make(1, 0, 4);
  uint64_t a = Insert1(1);
  Insert1(2, {ToDisk(a)});
  ExpectCounts(1, 0, 1);

  Make(1, 0, 0);
  a = Insert1(1);
  Insert1(2, {Drop(a)});
  ExpectCounts(1, 0, 0);
}

TEST_F(PrefixIndexTest, PinnedBlocksAreNeverDemotedOrDropped) {
  Make(2, 0, 0);
  const uint64_t a = Insert1(1);
  const uint64_t b = Insert1(2);
  index_->Pin({a});
  EXPECT_EQ(index_->PinCount(a), 1);
  const uint64_t c = Insert1(3, {Drop(b)});  // a is lower but pinned.
  index_->Pin({c});
  index_->Pin({c});
  EXPECT_TRUE(Insert({4, 4}).empty());  // Memory holds only pinned blocks.
  index_->Unpin({c, 777});
  EXPECT_TRUE(Insert({4, 4}).empty());  // Still pinned once.
  index_->Unpin({c});
  index_->Unpin({c});  // Extra unpins are ignored.
  EXPECT_EQ(index_->PinCount(c), 0);
  Insert1(4, {Drop(c)});
  EXPECT_EQ(index_->TierOf(a), kMem);
}

TEST_F(PrefixIndexTest, PinnedHostBlockStaysInHost) {
  Make(1, 1, 0);
  const uint64_t a = Insert1(1);
  const uint64_t b = Insert1(2, {ToHost(a)});
  index_->Pin({a});       // Not what callers do, but the pin still protects it.
  Insert1(3, {Drop(b)});  // b cannot go to host, nor a leave it.
  EXPECT_EQ(index_->TierOf(a), kHost);
}

TEST_F(PrefixIndexTest, DroppingABlockDropsItsSubtree) {
  Make(3, 0, 0);
  const std::vector<uint64_t> p = Insert({1, 1, 2, 2, 3, 3});
  ASSERT_EQ(p.size(), 3u);
  index_->SetImportance(p[1], 1);
  index_->SetImportance(p[2], 1);  // The root-most block is now the lowest.
  Insert1(9, {Drop(p[0]), Drop(p[1]), Drop(p[2])});
  EXPECT_EQ(index_->size(), 1);
  EXPECT_TRUE(Lookup({1, 1}).blocks.empty());
}

TEST_F(PrefixIndexTest, SubtreeHoldingAPinIsNotAVictim) {
  Make(3, 0, 0);
  const std::vector<uint64_t> p = Insert({1, 1, 2, 2});
  index_->SetImportance(p[1], 1);
  const uint64_t c = Insert1(5);
  index_->Pin({p[1]});  // p[0], the lowest, holds a pinned child.
  Insert1(6, {Drop(c)});
  EXPECT_EQ(Lookup({1, 1, 2, 2}).blocks, p);
}

TEST_F(PrefixIndexTest, PromoteFromHostAndDisk) {
  Make(1, 1, 4);
  const uint64_t a = Insert1(1);
  const uint64_t b = Insert1(2, {ToHost(a)});
  const uint64_t c = Insert1(3, {ToDisk(a), ToHost(b)});
  EXPECT_EQ(Lookup({1, 1}).tiers, std::vector<PrefixTier>{kDisk});

  Ops ops;
  EXPECT_EQ(index_->Promote({a}, &ops), 1);
  EXPECT_EQ(ops, (Ops{ToDisk(b), ToHost(c), ToMemory(a)}));
  ExpectCounts(1, 1, 1);
  ops.clear();
  EXPECT_EQ(index_->Promote({a}, &ops), 1);  // Already in memory.
  EXPECT_TRUE(ops.empty());
  // From host: host has room only once c has left it, so a goes straight to disk.
  EXPECT_EQ(index_->Promote({c}, &ops), 1);
  EXPECT_EQ(ops, (Ops{ToDisk(a), ToMemory(c)}));
  ExpectCounts(1, 0, 2);
}

TEST_F(PrefixIndexTest, PromoteRunMakesRoomOutsideTheRun) {
  Make(2, 2, 0);
  const std::vector<uint64_t> p = Insert({1, 1, 2, 2});
  const std::vector<uint64_t> q = Insert({3, 3, 4, 4}, {ToHost(p[1]), ToHost(p[0])});
  PrefixMatch m = Lookup({1, 1, 2, 2});
  EXPECT_EQ(m.tiers, (std::vector<PrefixTier>{kHost, kHost}));
  Ops ops;
  EXPECT_EQ(index_->Promote(m.blocks, &ops), 2);
  // Host is full of the run until p[0] leaves it, so q[1] has nowhere to go but away.
  EXPECT_EQ(ops, (Ops{Drop(q[1]), ToMemory(p[0]), ToHost(q[0]), ToMemory(p[1])}));
  ExpectCounts(2, 1, 0);
}

TEST_F(PrefixIndexTest, PromoteStopsWhenMemoryIsPinned) {
  Make(1, 2, 0);
  const uint64_t a = Insert1(1);
  const uint64_t b = Insert1(2, {ToHost(a)});
  index_->Pin({b});
  Ops ops;
  EXPECT_EQ(index_->Promote({a}, &ops), 0);
  EXPECT_TRUE(ops.empty());
  EXPECT_EQ(index_->Promote({b, a}, &ops), 1);  // b needs nothing; a gets no room.
  EXPECT_TRUE(ops.empty());
  EXPECT_EQ(index_->Promote({777}, &ops), 0);
}

TEST_F(PrefixIndexTest, PromoteNeverEvictsItsOwnRun) {
  Make(1, 2, 0);
  const uint64_t x = Insert1(5);
  const uint64_t z = Insert1(7, {ToHost(x)});
  const std::vector<uint64_t> y = Insert({5, 5, 6, 6}, {ToHost(z)});
  ASSERT_EQ(y.size(), 1u);
  EXPECT_TRUE(Insert({5, 5, 6, 6, 8, 8}).empty());  // Memory holds only the path's own block.
  EXPECT_EQ(Lookup({5, 5, 6, 6}).tiers, (std::vector<PrefixTier>{kHost, kMem}));
  Ops ops;
  EXPECT_EQ(index_->Promote({x, y[0]}, &ops), 0);  // y holds memory and is in the run.
  EXPECT_TRUE(ops.empty());
}

TEST_F(PrefixIndexTest, LostDropsTheSubtree) {
  Make(2, 0, 10);
  const std::vector<uint64_t> p = Insert({1, 1, 2, 2});
  const std::vector<uint64_t> r = Insert({7, 7, 8, 8}, {ToDisk(p[1]), ToDisk(p[0])});
  const std::vector<uint64_t> p2 = Insert({1, 1, 2, 2, 3, 3}, {ToDisk(r[1])});
  const std::vector<uint64_t> q = Insert({1, 1, 4, 4}, {ToDisk(r[0])});
  ASSERT_EQ(p2.size(), 1u);
  ASSERT_EQ(q.size(), 1u);
  index_->Pin({q[0]});
  Ops ops;
  index_->Lost(p[0], &ops);  // Parents before children; siblings in the map's order.
  ASSERT_EQ(ops.size(), 4u);
  EXPECT_EQ(ops[0], Drop(p[0]));
  EXPECT_EQ(std::set<uint64_t>({ops[1].block_id, ops[2].block_id}),
            std::set<uint64_t>({p[1], q[0]}));
  EXPECT_EQ(ops[3], Drop(p2[0]));
  EXPECT_EQ(index_->size(), 2);
  ExpectCounts(0, 0, 2);
  index_->Unpin({q[0]});  // Forgotten with its block.
  EXPECT_EQ(index_->PinCount(q[0]), 0);
  ops.clear();
  index_->Lost(p[0], &ops);
  EXPECT_TRUE(ops.empty());
  EXPECT_EQ(Insert({1, 1}), std::vector<uint64_t>{7});  // Ids are never reused.
}

TEST_F(PrefixIndexTest, LostForgetsThePinsItDrops) {
  Make(2, 0, 0);
  const std::vector<uint64_t> p = Insert({1, 1, 2, 2});
  index_->Pin({p[1]});
  Ops ops;
  index_->Lost(p[1], &ops);
  EXPECT_EQ(ops, Ops{Drop(p[1])});
  const uint64_t c = Insert1(3);
  index_->Touch({c});
  Insert1(4, {Drop(p[0])});  // No longer holds a pinned block, so it is a victim again.
}

TEST(PrefixIndexOptionsTest, Validation) {
  EXPECT_TRUE(ValidatePrefixIndexOptions(Options(16, 0, 0, 0)).ok());
  EXPECT_EQ(ValidatePrefixIndexOptions(Options(0, 1, 1, 1)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidatePrefixIndexOptions(Options(1, -1, 1, 1)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidatePrefixIndexOptions(Options(1, 1, 1, -1)).code(), StatusCode::kInvalidArgument);
  EXPECT_STREQ(PrefixTierName(kHost), "host");
}

}  // namespace
}  // namespace deja::coordinator
