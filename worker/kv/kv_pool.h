// A device's KV memory, or a host worker's when it pages its KV (docs/architecture.md#kv-cache):
// one allocation per part (keys, values, scores, slot positions) cut into blocks of `block_slots`
// slots for every (layer, head). A sequence takes blocks as its slots grow and gives them back
// when it ends, so it holds the memory it has used rather than its maximum length. Blocks are
// laid out
//   k, v:            [block][layer][head][block_slots][row]  (kv_dtype rows: common/kv_row.h)
//   score, slot_pos: [block][layer][head][block_slots]            (f32, int32)
// so one block table per sequence serves every layer and head (kernels/op_table.h KvSlotIndex).
// The host keeps only the free list; the parts are touched by the backend's ops alone.
// Thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"
#include "kernels/backend.h"
#include "kernels/op_table.h"

namespace deja::worker::kv {

struct KvGeometry;

class KvBlockPool {
 public:
  // Bytes one block costs (all four parts).
  static int64_t BlockBytes(const KvGeometry& g, int32_t block_slots);
  // `blocks` blocks on `backend`'s device; ResourceExhausted naming the bytes when they do not
  // fit.
  static StatusOr<std::shared_ptr<KvBlockPool>> Create(kernels::Backend* backend,
                                                       const KvGeometry& g, int32_t block_slots,
                                                       int64_t blocks);

  kernels::Backend& backend() const { return *backend_; }
  int32_t block_slots() const { return block_slots_; }
  int32_t layers() const { return layers_; }
  int32_t heads() const { return heads_; }
  int64_t total_blocks() const { return total_; }
  int64_t free_blocks() const;
  int64_t block_bytes() const { return block_bytes_; }

  // Appends n blocks to *out, each with every slot empty (position -1) and one holder;
  // ResourceExhausted when fewer are free (nothing taken).
  Status Take(int32_t n, std::vector<int32_t>* out);
  // A block can have several holders (sequences sharing a cached prefix, and the prefix cache
  // itself): Retain adds one, Give drops one per block, and a block is free again when its last
  // holder gives it back.
  void Retain(int32_t block);
  void Give(const std::vector<int32_t>& blocks);
  int32_t holders(int32_t block) const;

  // A block's bytes as one host buffer of block_bytes(): its K, V, score and position parts in
  // that order (the prefix cache's host and disk copies). CopyIn writes all four parts back.
  Status CopyOut(int32_t block, char* host) const;
  Status CopyIn(int32_t block, const char* host);
  // Block `from`'s K, V and positions into block `to`, with every score 0 (through host memory).
  Status CopyBlock(int32_t from, int32_t to);
  // Where (layer, head, slot) of part `part` (0 K, 1 V, 2 score, 3 position) starts in
  // CopyOut's layout, and the bytes one slot takes in that part.
  int64_t PartOffset(int32_t part, int32_t layer, int32_t head, int32_t slot) const;
  int64_t SlotBytes(int32_t part) const;
  // Writes byte ranges (offset, length) of CopyOut's layout into `block` from `packed`, the
  // ranges end to end (a part of a block, as CopyIn writes it whole). InvalidArgument for a
  // range past block_bytes(), before anything is written.
  Status WriteRanges(int32_t block, const std::vector<std::pair<size_t, size_t>>& ranges,
                     const char* packed);

  // The paged view of one layer (blocks, capacity, used and score are the sequence's to set).
  kernels::KvView LayerView(int32_t layer) const;

 private:
  KvBlockPool() = default;

  kernels::Backend* backend_ = nullptr;
  int32_t layers_ = 0, heads_ = 0, head_dim_ = 0;
  DType kv_dtype_ = DType::kF32;
  int32_t block_slots_ = 0;
  int64_t total_ = 0;
  int64_t block_bytes_ = 0;
  int64_t block_stride_ = 0;  // slots per block: layers * heads * block_slots
  Tensor k_, v_, score_, pos_;
  // The four parts' bytes per block, in CopyOut's order.
  std::vector<std::pair<char*, int64_t>> Parts(int32_t block) const;

  mutable std::mutex mu_;
  std::vector<int32_t> free_;     // next at the back
  std::vector<int32_t> holders_;  // per block; 0 when free
};

}  // namespace deja::worker::kv
