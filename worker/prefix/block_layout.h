// OrderedLayout: how a prefix block is laid out in its file (the disk tier), so that the tokens
// important-token loading keeps are read contiguously (IMPRESS's importance-ordered storage,
// docs/architecture.md#prefix-cache). The pool's layout (KvBlockPool::CopyOut) keeps each head's
// slots together, so half of a block's tokens are scattered over every page of it. A file keeps,
// for each layer, the block's tokens in that layer's importance order ("ranks": rank 0 the most
// often chosen), in groups of group_rows() tokens that hold every head of the rank:
//   k, v          [layer][k | v][group][head][group_rows][head_dim]   (rank order)
//   score, pos    as in the pool layout                                (slot order)
//   order         [layer][rank] int32: the slot stored at each rank
// so the first groups of a layer are one contiguous range of keys and one of values, and a
// probe head's keys are one short range per group. Every head of a layer shares its order (a
// layer's choice is the same set of tokens for every head).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "worker/kv/kv_pool.h"

namespace deja::worker::prefix {

class OrderedLayout {
 public:
  // The largest group size: 8 rows of one head are 1 KiB of f16 keys for a 64-wide head.
  static constexpr int32_t kMaxGroupRows = 8;

  OrderedLayout(int32_t layers, int32_t heads, int32_t block_slots, int64_t row_bytes);
  static OrderedLayout Of(const kv::KvBlockPool& pool);

  int32_t layers() const { return layers_; }
  int32_t heads() const { return heads_; }
  int32_t block_slots() const { return slots_; }
  // Rows per group: the largest divisor of block_slots() up to kMaxGroupRows.
  int32_t group_rows() const { return group_rows_; }
  int32_t groups() const { return slots_ / group_rows_; }
  int64_t row_bytes() const { return row_bytes_; }
  // The pool's bytes of one block (KvBlockPool::block_bytes) and a file's payload: those plus the
  // order table.
  int64_t pool_bytes() const { return pool_bytes_; }
  int64_t file_bytes() const { return pool_bytes_ + OrderBytes(); }

  // Where the group_rows() rows of (part 0 K / 1 V, layer, group, head) start in a file.
  int64_t RowsOffset(int32_t part, int32_t layer, int32_t group, int32_t head) const;
  // Where (part, layer, head, slot) starts in the pool's layout (KvBlockPool::PartOffset).
  int64_t PoolOffset(int32_t part, int32_t layer, int32_t head, int32_t slot) const;

  // Every layer in slot order (rank r holds slot r).
  std::vector<int32_t> PositionOrder() const;
  // InvalidArgument unless `order` has layers() x block_slots() entries, each layer's a
  // permutation of the slots.
  Status CheckOrder(const std::vector<int32_t>& order) const;
  // A block's pool bytes (pool_bytes() of them) stored in `order` (layers() x block_slots(),
  // checked by the caller) as a file's payload (file_bytes() of them).
  void Encode(const char* pool, const std::vector<int32_t>& order, char* file) const;
  // A file's payload back in the pool's layout, and its order when `order` is not null.
  // DataLoss when its order table is not a permutation in every layer.
  Status Decode(const char* file, char* pool, std::vector<int32_t>* order = nullptr) const;

 private:
  int64_t OrderBytes() const { return int64_t{layers_} * slots_ * 4; }
  int64_t KvBytes() const { return int64_t{layers_} * heads_ * slots_ * row_bytes_; }

  int32_t layers_, heads_, slots_, group_rows_;
  int64_t row_bytes_, pool_bytes_;
};

}  // namespace deja::worker::prefix
