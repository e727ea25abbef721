#include "worker/prefix/block_layout.h"

#include <cstring>
#include <numeric>
#include <string>

namespace deja::worker::prefix {

OrderedLayout::OrderedLayout(int32_t layers, int32_t heads, int32_t block_slots, int64_t row_bytes)
    : layers_(layers), heads_(heads), slots_(block_slots), group_rows_(1), row_bytes_(row_bytes) {
  for (int32_t g = kMaxGroupRows; g > 1; --g) {
    if (slots_ % g == 0) {
      group_rows_ = g;
      break;
    }
  }
  // K and V rows, then a score (f32) and a position (int32) per slot.
  pool_bytes_ = 2 * KvBytes() + int64_t{layers_} * heads_ * slots_ * 8;
}

OrderedLayout OrderedLayout::Of(const kv::KvBlockPool& pool) {
  return OrderedLayout(pool.layers(), pool.heads(), pool.block_slots(), pool.SlotBytes(0));
}

int64_t OrderedLayout::RowsOffset(int32_t part, int32_t layer, int32_t group, int32_t head) const {
  const int64_t index = ((int64_t{layer} * 2 + part) * groups() + group) * heads_ + head;
  return index * group_rows_ * row_bytes_;
}

int64_t OrderedLayout::PoolOffset(int32_t part, int32_t layer, int32_t head, int32_t slot) const {
  return part * KvBytes() + ((int64_t{layer} * heads_ + head) * slots_ + slot) * row_bytes_;
}

std::vector<int32_t> OrderedLayout::PositionOrder() const {
  std::vector<int32_t> order(static_cast<size_t>(layers_) * slots_);
  for (int32_t l = 0; l < layers_; ++l) {
    std::iota(order.begin() + int64_t{l} * slots_, order.begin() + int64_t{l + 1} * slots_, 0);
  }
  return order;
}

Status OrderedLayout::CheckOrder(const std::vector<int32_t>& order) const {
  if (order.size() != static_cast<size_t>(layers_) * slots_) {
    return InvalidArgument("block order has " + std::to_string(order.size()) + " entries, not " +
                           std::to_string(int64_t{layers_} * slots_));
  }
  std::vector<char> seen(static_cast<size_t>(slots_));
  for (int32_t l = 0; l < layers_; ++l) {
    std::fill(seen.begin(), seen.end(), 0);
    for (int32_t r = 0; r < slots_; ++r) {
      const int32_t s = order[static_cast<size_t>(l) * slots_ + r];
      if (s < 0 || s >= slots_ || seen[static_cast<size_t>(s)]) {
        return InvalidArgument("block order of layer " + std::to_string(l) +
                               " is not a permutation of its " + std::to_string(slots_) + " slots");
      }
      seen[static_cast<size_t>(s)] = 1;
    }
  }
  return Status::Ok();
}

void OrderedLayout::Encode(const char* pool, const std::vector<int32_t>& order, char* file) const {
  for (int32_t l = 0; l < layers_; ++l) {
    const int32_t* rank_slot = order.data() + int64_t{l} * slots_;
    for (int32_t part = 0; part < 2; ++part) {
      for (int32_t g = 0; g < groups(); ++g) {
        for (int32_t h = 0; h < heads_; ++h) {
          char* out = file + RowsOffset(part, l, g, h);
          for (int32_t i = 0; i < group_rows_; ++i, out += row_bytes_) {
            std::memcpy(out, pool + PoolOffset(part, l, h, rank_slot[g * group_rows_ + i]),
                        static_cast<size_t>(row_bytes_));
          }
        }
      }
    }
  }
  std::memcpy(file + 2 * KvBytes(), pool + 2 * KvBytes(),
              static_cast<size_t>(pool_bytes_ - 2 * KvBytes()));
  std::memcpy(file + pool_bytes_, order.data(), static_cast<size_t>(OrderBytes()));
}

Status OrderedLayout::Decode(const char* file, char* pool, std::vector<int32_t>* order) const {
  std::vector<int32_t> table(static_cast<size_t>(layers_) * slots_);
  std::memcpy(table.data(), file + pool_bytes_, static_cast<size_t>(OrderBytes()));
  if (Status st = CheckOrder(table); !st.ok()) return DataLoss(st.message());
  for (int32_t l = 0; l < layers_; ++l) {
    const int32_t* rank_slot = table.data() + int64_t{l} * slots_;
    for (int32_t part = 0; part < 2; ++part) {
      for (int32_t g = 0; g < groups(); ++g) {
        for (int32_t h = 0; h < heads_; ++h) {
          const char* in = file + RowsOffset(part, l, g, h);
          for (int32_t i = 0; i < group_rows_; ++i, in += row_bytes_) {
            std::memcpy(pool + PoolOffset(part, l, h, rank_slot[g * group_rows_ + i]), in,
                        static_cast<size_t>(row_bytes_));
          }
        }
      }
    }
  }
  std::memcpy(pool + 2 * KvBytes(), file + 2 * KvBytes(),
              static_cast<size_t>(pool_bytes_ - 2 * KvBytes()));
  if (order != nullptr) *order = std::move(table);
  return Status::Ok();
}

}  // namespace deja::worker::prefix
