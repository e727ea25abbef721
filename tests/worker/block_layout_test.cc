// The prefix cache's file layout (worker/prefix/block_layout.h): the pool's offsets are the
// pool's own, a file holds every row of the block at the rank its layer's order gives it (each
// group of ranks holding every head), Decode gives back the pool's bytes and the order, and a
// file whose order table is not a permutation is refused.
#include "worker/prefix/block_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "tests/common/sim_device.h"
#include "worker/kv/kv_cache.h"

namespace deja::worker::prefix {
namespace {

constexpr kv::KvGeometry kGeometry{3, 4, 8, DType::kF16};

TEST(OrderedLayoutTest, GroupsDivideTheBlock) {
  EXPECT_EQ(OrderedLayout(1, 1, 32, 2).group_rows(), 8);
  EXPECT_EQ(OrderedLayout(1, 1, 32, 2).groups(), 4);
  EXPECT_EQ(OrderedLayout(1, 1, 12, 2).group_rows(), 6);
  EXPECT_EQ(OrderedLayout(1, 1, 7, 2).group_rows(), 7);
  EXPECT_EQ(OrderedLayout(1, 1, 11, 2).group_rows(), 1);
}

TEST(OrderedLayoutTest, PoolOffsetsAreThePools) {
  auto sim = test_util::MakeSimDeviceBackend();
  auto pool = kv::KvBlockPool::Create(sim.get(), kGeometry, 32, 2);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  const OrderedLayout l = OrderedLayout::Of(**pool);
  EXPECT_EQ(l.pool_bytes(), (*pool)->block_bytes());
  EXPECT_EQ(l.file_bytes(), (*pool)->block_bytes() + 3 * 32 * 4);
  EXPECT_EQ(l.row_bytes(), 8 * 2);
  for (int32_t part = 0; part < 2; ++part) {
    for (int32_t layer = 0; layer < 3; ++layer) {
      for (int32_t head = 0; head < 4; ++head) {
        for (int32_t slot = 0; slot < 32; ++slot) {
          ASSERT_EQ(l.PoolOffset(part, layer, head, slot),
                    (*pool)->PartOffset(part, layer, head, slot));
        }
      }
    }
  }
}

TEST(OrderedLayoutTest, EncodeStoresEachRowAtItsRankAndDecodeUndoesIt) {
  const OrderedLayout l(3, 4, 32, 16);
  std::mt19937 rng(11);
  std::vector<char> pool(static_cast<size_t>(l.pool_bytes()));
  for (char& c : pool) c = static_cast<char>(rng());
  std::vector<int32_t> order = l.PositionOrder();
  for (int32_t layer = 1; layer < 3; ++layer) {  // layer 0 stays in position order
    std::shuffle(order.begin() + layer * 32, order.begin() + (layer + 1) * 32, rng);
  }
  ASSERT_TRUE(l.CheckOrder(order).ok());
  std::vector<char> file(static_cast<size_t>(l.file_bytes()));
  l.Encode(pool.data(), order, file.data());
  for (int32_t part = 0; part < 2; ++part) {
    for (int32_t layer = 0; layer < 3; ++layer) {
      for (int32_t rank = 0; rank < 32; ++rank) {
        for (int32_t head = 0; head < 4; ++head) {
          const int32_t slot = order[static_cast<size_t>(layer) * 32 + rank];
          const char* stored =
              file.data() + l.RowsOffset(part, layer, rank / 8, head) + (rank % 8) * l.row_bytes();
          ASSERT_EQ(std::memcmp(stored, pool.data() + l.PoolOffset(part, layer, head, slot), 16), 0)
              << part << " " << layer << " " << rank << " " << head;
        }
      }
    }
  }
  // A layer's first group is every head's rows of its first 8 ranks, keys then values apart.
  EXPECT_EQ(l.RowsOffset(0, 1, 1, 0) - l.RowsOffset(0, 1, 0, 0), 4 * 8 * 16);
  EXPECT_EQ(l.RowsOffset(1, 1, 0, 0) - l.RowsOffset(0, 1, 0, 0), 4 * 4 * 8 * 16);
  std::vector<char> back(pool.size());
  std::vector<int32_t> got;
  ASSERT_TRUE(l.Decode(file.data(), back.data(), &got).ok());
  EXPECT_EQ(back, pool);
  EXPECT_EQ(got, order);
}

TEST(OrderedLayoutTest, AnOrderThatIsNotAPermutationIsRefused) {
  const OrderedLayout l(2, 2, 8, 4);
  std::vector<int32_t> order = l.PositionOrder();
  EXPECT_TRUE(l.CheckOrder(order).ok());
  EXPECT_EQ(l.CheckOrder(std::vector<int32_t>(order.begin(), order.end() - 1)).code(),
            StatusCode::kInvalidArgument);
  std::vector<char> pool(static_cast<size_t>(l.pool_bytes()), 1);
  std::vector<char> file(static_cast<size_t>(l.file_bytes()));
  l.Encode(pool.data(), order, file.data());
  std::vector<int32_t> bad = order;
  bad[9] = bad[10];  // layer 1 names slot 2 twice
  EXPECT_EQ(l.CheckOrder(bad).code(), StatusCode::kInvalidArgument);
  std::memcpy(file.data() + l.pool_bytes(), bad.data(), bad.size() * 4);
  std::vector<char> out(pool.size());
  Status st = l.Decode(file.data(), out.data());
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("layer 1"), std::string::npos) << st.ToString();
  bad[9] = 8;  // out of range
  std::memcpy(file.data() + l.pool_bytes(), bad.data(), bad.size() * 4);
  EXPECT_EQ(l.Decode(file.data(), out.data()).code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace deja::worker::prefix
