#include "worker/prefix/lazy_prefix.h"

#include <glog/logging.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

namespace deja::worker::prefix {

LazyPrefix::LazyPrefix(std::shared_ptr<kv::KvBlockPool> pool, std::shared_ptr<BlockFiles> files,
                       std::vector<uint64_t> ids, std::vector<std::optional<LazySource>> sources,
                       std::shared_ptr<LazyCounters> counters)
    : pool_(std::move(pool)),
      files_(std::move(files)),
      layout_(OrderedLayout::Of(*pool_)),
      ids_(std::move(ids)),
      sources_(std::move(sources)),
      lost_(sources_.size(), false),
      counters_(std::move(counters)) {}

Status LazyPrefix::Read(const LazySource& s, const std::vector<std::pair<size_t, size_t>>& ranges,
                        char* out) {
  if (s.host != nullptr) {
    for (const auto& [offset, length] : ranges) {
      if (offset + length > s.host->size()) {
        return DataLoss("prefix block " + std::to_string(s.id) + ": host copy is " +
                        std::to_string(s.host->size()) + " bytes");
      }
      std::memcpy(out, s.host->data() + offset, length);
      out += length;
      counters_->host_bytes += static_cast<int64_t>(length);
    }
    return Status::Ok();
  }
  if (files_ == nullptr) return NotFound("prefix block " + std::to_string(s.id) + " has no copy");
  return files_->ReadRanges(s.id, ranges, out, &counters_->disk_bytes);
}

Status LazyPrefix::ReadFromFile(const LazySource& s, int32_t layer,
                                const std::vector<int32_t>& heads, bool keys_only, int32_t block,
                                Status* write) {
  const int32_t bs = layout_.block_slots();
  const int32_t rows = layout_.group_rows();
  const size_t row = static_cast<size_t>(layout_.row_bytes());
  if (s.order == nullptr || s.order->size() != static_cast<size_t>(layout_.layers()) * bs) {
    return Internal("prefix block " + std::to_string(s.id) + " has no order");
  }
  const int32_t* rank_slot = s.order->data() + static_cast<int64_t>(layer) * bs;
  // The groups holding a wanted slot, every head's rows of them (a probe head's keys read already
  // are not read again).
  file_ranges_.clear();
  pieces_.clear();
  size_t at = 0;
  for (int32_t part = 0; part < (keys_only ? 1 : 2); ++part) {
    for (int32_t g = 0; g < layout_.groups(); ++g) {
      bool wanted = false;
      for (int32_t i = 0; i < rows && !wanted; ++i) wanted = want_[rank_slot[g * rows + i]] != 0;
      if (!wanted) continue;
      for (int32_t h : heads) {
        if (part == 0 && keys_done_[h]) continue;
        const size_t offset = static_cast<size_t>(layout_.RowsOffset(part, layer, g, h));
        if (!file_ranges_.empty() &&
            file_ranges_.back().first + file_ranges_.back().second == offset) {
          file_ranges_.back().second += rows * row;
        } else {
          file_ranges_.emplace_back(offset, rows * row);
        }
        pieces_.push_back({part, g, h, at});
        at += rows * row;
      }
    }
  }
  if (pieces_.empty()) return Status::Ok();
  data_.resize(at);
  DEJA_RETURN_IF_ERROR(Read(s, file_ranges_, data_.data()));
  // The wanted rows to their slots.
  ranges_.clear();
  packed_.clear();
  for (const Piece& p : pieces_) {
    for (int32_t i = 0; i < rows; ++i) {
      const int32_t slot = rank_slot[p.group * rows + i];
      if (!want_[slot]) continue;
      const size_t offset = static_cast<size_t>(pool_->PartOffset(p.part, layer, p.head, slot));
      if (!ranges_.empty() && ranges_.back().first + ranges_.back().second == offset) {
        ranges_.back().second += row;
      } else {
        ranges_.emplace_back(offset, row);
      }
      const char* from = data_.data() + p.at + static_cast<size_t>(i) * row;
      packed_.insert(packed_.end(), from, from + row);
    }
  }
  *write = pool_->WriteRanges(block, ranges_, packed_.data());
  return Status::Ok();
}

Status LazyPrefix::Load(const kv::SequenceKv& kv, int32_t layer, const std::vector<int32_t>& heads,
                        bool keys_only, const std::vector<int32_t>* positions) {
  const auto t0 = std::chrono::steady_clock::now();
  const int32_t bs = pool_->block_slots();
  if (keys_layer_ != layer) {
    keys_layer_ = layer;
    keys_done_.clear();
  }
  int32_t most = 0;
  for (int32_t h : heads) most = std::max(most, h + 1);
  if (static_cast<int32_t>(keys_done_.size()) < most) keys_done_.resize(static_cast<size_t>(most));
  std::vector<std::pair<int32_t, int32_t>> runs;  // [a, b) within a block
  size_t next = 0;                                // into *positions
  Status result;
  for (size_t i = 0; i < sources_.size() && result.ok(); ++i) {
    const int32_t first = static_cast<int32_t>(i) * bs;
    runs.clear();
    if (positions == nullptr) {
      runs.emplace_back(0, bs);
    } else {
      const std::vector<int32_t>& p = *positions;
      while (next < p.size() && p[next] < first + bs) {
        if (p[next] < first) {  // unsorted or negative: nothing to load there
          ++next;
          continue;
        }
        const int32_t a = p[next] - first;
        int32_t b = a + 1;
        for (++next; next < p.size() && p[next] == first + b && b < bs; ++next) ++b;
        runs.emplace_back(a, b);
      }
    }
    // A layer's choice (every head's K and V of chosen tokens) counts toward the block's share
    // of important tokens.
    if (positions != nullptr && !keys_only && i < ids_.size()) {
      auto& [kept, seen] = counters_->chosen[ids_[i]];
      for (const auto& [a, b] : runs) kept += b - a;
      seen += bs;
      std::vector<int32_t>& slots = counters_->chosen_slots[ids_[i]];
      slots.resize(static_cast<size_t>(layout_.layers()) * bs);
      for (const auto& [a, b] : runs) {
        for (int32_t t = a; t < b; ++t) ++slots[static_cast<size_t>(layer) * bs + t];
      }
    }
    if (!sources_[i].has_value() || lost_[i] || runs.empty()) continue;
    const LazySource& source = *sources_[i];
    const int32_t block = kv.pool_block(static_cast<int32_t>(i));
    Status st;
    if (source.host != nullptr) {
      ranges_.clear();
      for (int32_t part = 0; part < (keys_only ? 1 : 2); ++part) {
        for (int32_t h : heads) {
          if (part == 0 && keys_done_[h]) continue;
          for (const auto& [a, b] : runs) {
            ranges_.emplace_back(static_cast<size_t>(pool_->PartOffset(part, layer, h, a)),
                                 static_cast<size_t>((b - a) * pool_->SlotBytes(part)));
          }
        }
      }
      size_t total = 0;
      for (const auto& r : ranges_) total += r.second;
      data_.resize(total);
      st = Read(source, ranges_, data_.data());
      if (st.ok()) result = pool_->WriteRanges(block, ranges_, data_.data());
    } else {
      want_.assign(static_cast<size_t>(bs), 0);
      for (const auto& [a, b] : runs) std::fill(want_.begin() + a, want_.begin() + b, 1);
      st = ReadFromFile(source, layer, heads, keys_only, block, &result);
    }
    if (!st.ok()) {
      // Its slots stay empty; the coordinator recomputes the sequence.
      LOG(WARNING) << "prefix block " << source.id << " lost while loading: " << st.message();
      lost_[i] = true;
      counters_->failed.push_back(source.id);
      continue;
    }
    if (!result.ok()) break;
    pos_ranges_.clear();
    pos_values_.clear();
    for (int32_t h : heads) {
      for (const auto& [a, b] : runs) {
        pos_ranges_.emplace_back(static_cast<size_t>(pool_->PartOffset(3, layer, h, a)),
                                 static_cast<size_t>(b - a) * sizeof(int32_t));
        for (int32_t t = a; t < b; ++t) pos_values_.push_back(first + t);
      }
    }
    result =
        pool_->WriteRanges(block, pos_ranges_, reinterpret_cast<const char*>(pos_values_.data()));
  }
  if (positions == nullptr) {
    for (int32_t h : heads) keys_done_[h] = true;
  }
  counters_->seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace deja::worker::prefix
