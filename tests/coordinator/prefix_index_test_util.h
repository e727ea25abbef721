// Shared by the PrefixIndex tests: a peer that forces hash collisions, printers for failure
// messages, op constructors and options.
#pragma once

#include <ostream>
#include <vector>

#include "coordinator/prefix_index.h"

namespace deja::coordinator {

// Makes every block hash the same, so every child lookup goes through a collision.
class PrefixIndexTestPeer {
 public:
  static void CollideAllHashes(PrefixIndex* index) {
    index->hash_ = [](const int32_t*, int32_t) -> uint64_t { return 42; };
  }
};

// For failure messages; here rather than in the anonymous namespace so that lookup by argument
// finds it.
inline std::ostream& operator<<(std::ostream& os, const PrefixOp& op) {
  static const char* const kNames[] = {"ToHost", "ToDisk", "ToMemory", "Drop"};
  return os << kNames[static_cast<int>(op.kind)] << "(" << op.block_id << ")";
}
inline std::ostream& operator<<(std::ostream& os, PrefixTier tier) {
  return os << PrefixTierName(tier);
}

namespace prefix_index_test {

using Kind = PrefixOp::Kind;
using Tokens = std::vector<int32_t>;
using Ops = std::vector<PrefixOp>;
constexpr PrefixTier kMem = PrefixTier::kMemory;
constexpr PrefixTier kHost = PrefixTier::kHost;
constexpr PrefixTier kDisk = PrefixTier::kDisk;

inline PrefixOp ToHost(uint64_t id) { return {Kind::kToHost, id}; }
inline PrefixOp ToDisk(uint64_t id) { return {Kind::kToDisk, id}; }
inline PrefixOp ToMemory(uint64_t id) { return {Kind::kToMemory, id}; }
inline PrefixOp Drop(uint64_t id) { return {Kind::kDrop, id}; }

inline PrefixIndexOptions Options(int32_t block_tokens, int64_t memory, int64_t host,
                                  int64_t disk) {
  PrefixIndexOptions o;
  o.block_tokens = block_tokens;
  o.memory_blocks = memory;
  o.host_blocks = host;
  o.disk_blocks = disk;
  return o;
}

}  // namespace prefix_index_test
}  // namespace deja::coordinator
