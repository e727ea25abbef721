// GPT-2 byte-level BPE: the reversible byte <-> printable-character table and the merge loop
// over one pre-tokenized piece, with a per-piece cache.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"

namespace deja {

// GPT-2's bytes_to_unicode(): the code point that stands for each byte in vocab.json.
const std::array<uint32_t, 256>& ByteToCodePoint();

// The bytes a vocab.json token stands for. A token with a character outside the byte table
// (an added token such as "<pad> ") stands for its own UTF-8, as in HF's ByteLevel decoder.
std::string ByteLevelTokenBytes(std::string_view token);

class BpeModel {
 public:
  // `merges` in rank order. Every byte's character and both sides and the result of every
  // merge must be in `vocab`.
  static StatusOr<std::unique_ptr<BpeModel>> Create(
      const std::unordered_map<std::string, int32_t>& vocab,
      const std::vector<std::pair<std::string, std::string>>& merges);

  // Appends the ids of one pre-tokenized piece (raw bytes). Thread-safe.
  void EncodePiece(std::string_view piece, std::vector<int32_t>* ids) const;

 private:
  struct MergeRule {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t PairKey(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  void MergeBytes(std::string_view piece, std::vector<int32_t>* ids) const;

  std::array<int32_t, 256> byte_ids_{};
  std::unordered_map<uint64_t, MergeRule> merges_;

  // Pieces repeat a lot in natural text; HF caches them the same way. The cache stops growing
  // at kCacheCapacity entries rather than evicting, so a hit never takes a write lock.
  static constexpr size_t kCacheCapacity = 1 << 16;
  static constexpr size_t kMaxCachedPieceBytes = 256;
  mutable std::shared_mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace deja
