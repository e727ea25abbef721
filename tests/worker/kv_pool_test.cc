// The device KV block pool (worker/kv/kv_pool.h) and the device mode of SequenceKv on the
// simulated device: a sequence takes blocks as its slots grow and returns them when it ends,
// refuses to grow past an exhausted pool (naming it) without losing what it holds, and reports
// its reservation in whole blocks.
#include "worker/kv/kv_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "tests/common/sim_device.h"
#include "worker/kv/kv_cache.h"

namespace deja::worker::kv {
namespace {

constexpr KvGeometry kGeometry{2, 3, 8, DType::kF16};

TEST(KvPoolTest, ASequenceHoldsTheBlocksItHasUsedAndGivesThemBack) {
  auto sim = test_util::MakeSimDeviceBackend();
  auto pool = KvBlockPool::Create(sim.get(), kGeometry, 32, 4);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  EXPECT_EQ((*pool)->block_bytes(), static_cast<int64_t>(kGeometry.SlotBytes()) * 32);
  {
    auto seq = SequenceKv::Create(kGeometry, 200, MakeFullPolicy(), *pool);
    ASSERT_TRUE(seq.ok()) << seq.status().ToString();
    SequenceKv& kv = **seq;
    EXPECT_EQ(kv.held_bytes(), 0u);
    EXPECT_EQ(kv.bytes(), 7 * static_cast<size_t>((*pool)->block_bytes()));  // 200 -> 7 blocks
    ASSERT_TRUE(kv.AppendPositions(40).ok());
    EXPECT_EQ(kv.held_bytes(), 2 * static_cast<size_t>((*pool)->block_bytes()));
    EXPECT_EQ((*pool)->free_blocks(), 2);
    ASSERT_TRUE(kv.AppendPositions(60).ok());  // 100 slots: 4 blocks
    EXPECT_EQ((*pool)->free_blocks(), 0);
    Status st = kv.AppendPositions(40);
    EXPECT_EQ(st.code(), StatusCode::kResourceExhausted);
    EXPECT_NE(st.message().find("KV pool has 0 of 4 blocks free"), std::string::npos)
        << st.ToString();
    EXPECT_EQ(kv.held_bytes(), 4 * static_cast<size_t>((*pool)->block_bytes()));
  }
  EXPECT_EQ((*pool)->free_blocks(), 4);
}

// WriteRanges writes byte ranges of CopyOut's layout (K, V, score, position parts), a range
// spanning two parts included, and PartOffset names where each (layer, head, slot) is; a range
// past the block is refused and writes nothing.
TEST(KvPoolTest, WriteRangesPatchesCopyOutsLayout) {
  auto sim = test_util::MakeSimDeviceBackend();
  auto pool = KvBlockPool::Create(sim.get(), kGeometry, 32, 2);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  KvBlockPool& p = **pool;
  std::vector<int32_t> taken;
  ASSERT_TRUE(p.Take(1, &taken).ok());
  const size_t bytes = static_cast<size_t>(p.block_bytes());
  std::vector<char> before(bytes), after(bytes);
  ASSERT_TRUE(p.CopyOut(taken[0], before.data()).ok());
  // K of (layer 1, head 2, slots 3-4), and a range from the last V slot into the scores.
  const size_t k_at = static_cast<size_t>(p.PartOffset(0, 1, 2, 3));
  const size_t k_len = 2 * static_cast<size_t>(p.SlotBytes(0));
  EXPECT_EQ(k_at, ((1 * 3 + 2) * 32 + 3) * 8 * 2u);
  const size_t v_last = static_cast<size_t>(p.PartOffset(1, 1, 2, 31));
  EXPECT_EQ(static_cast<size_t>(p.PartOffset(2, 0, 0, 0)), v_last + p.SlotBytes(1));
  EXPECT_EQ(p.PartOffset(3, 0, 0, 1) - p.PartOffset(3, 0, 0, 0), 4);
  const size_t span_len = static_cast<size_t>(p.SlotBytes(1)) + 8;
  std::vector<char> packed(k_len + span_len);
  for (size_t i = 0; i < packed.size(); ++i) packed[i] = static_cast<char>(i * 7 + 1);
  ASSERT_TRUE(p.WriteRanges(taken[0], {{k_at, k_len}, {v_last, span_len}}, packed.data()).ok());
  ASSERT_TRUE(p.CopyOut(taken[0], after.data()).ok());
  std::vector<char> want = before;
  std::copy(packed.begin(), packed.begin() + k_len, want.begin() + k_at);
  std::copy(packed.begin() + k_len, packed.end(), want.begin() + v_last);
  EXPECT_EQ(after, want);
  Status st = p.WriteRanges(taken[0], {{bytes - 4, 8}}, packed.data());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  ASSERT_TRUE(p.CopyOut(taken[0], after.data()).ok());
  EXPECT_EQ(after, want);
  p.Give(taken);
}

// A bounded cache on the device: eviction keeps every head at its budget, and the victims the
// device chose come back to the free lists, so slots are reused and the blocks stop growing.
TEST(KvPoolTest, EvictionOnTheDeviceKeepsTheBudgetAndReusesSlots) {
  auto sim = test_util::MakeSimDeviceBackend();
  auto pool = KvBlockPool::Create(sim.get(), kGeometry, 32, 8);
  ASSERT_TRUE(pool.ok());
  auto seq = SequenceKv::Create(kGeometry, 20 + 16, MakeWindowPolicy(20), *pool);
  ASSERT_TRUE(seq.ok());
  SequenceKv& kv = **seq;
  const int64_t width = kGeometry.heads * kGeometry.head_dim;
  auto rows = sim->Allocate(DType::kF32, {16, width});
  ASSERT_TRUE(rows.ok());
  std::vector<float> host(16 * width, 0.5f);
  ASSERT_TRUE(sim->CopyHostToDevice(rows->data(), host.data(), host.size() * 4).ok());
  for (int step = 0; step < 100; ++step) {
    const int32_t n = step == 0 ? 16 : 1;
    ASSERT_TRUE(kv.AppendPositions(n).ok()) << "step " << step;
    for (int32_t l = 0; l < kGeometry.layers; ++l) {
      ASSERT_TRUE(kv.WriteLayer(l, n, rows->as<float>(), rows->as<float>()).ok());
      ASSERT_TRUE(kv.EvictLayer(l).ok());
    }
    EXPECT_LE(kv.cached_slots(), int64_t{20} * kGeometry.layers * kGeometry.heads);
  }
  EXPECT_EQ(kv.length(), 115);
  EXPECT_EQ(kv.evictions(), int64_t{95} * kGeometry.layers * kGeometry.heads);
  // Capacity 36, but freed slots are reused: only 21 were ever occupied, in one block.
  EXPECT_EQ(kv.held_bytes(), static_cast<size_t>((*pool)->block_bytes()));
}

}  // namespace
}  // namespace deja::worker::kv
