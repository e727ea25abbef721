// PrefixIndex: the coordinator's index of the prefix KV cache shared across requests (after
// IMPRESS: prefix KV blocks kept in memory, host and disk tiers and managed by score). The workers
// hold the data; this single-threaded index decides where each block lives and emits the
// operations that move it there. No I/O, no locking: the engine loop owns it.
//
// A prompt is cut into blocks of block_tokens token ids; the index is a radix tree of whole
// blocks (a node's prefix is its ancestors' blocks followed by its own), one tree per key:
// whatever besides the tokens decides a block's keys and values (the request's sparsity, its
// cache_salt) is the key, so blocks computed one way are never read by a request computing
// another, and requests with different salts never share a block. Each block is in exactly
// one of memory, host, or neither (disk only). With the disk tier on (disk_blocks > 0) every
// block also has a disk replica, written by the worker when the block is inserted, so leaving
// host costs no write; without it, a block leaving host is dropped.
//
// Budgets hold after every public call and, stronger, at every step of replaying the emitted
// ops in order: room is made in a tier before anything moves into it. So swapping a memory block
// with a host block when both tiers are full first pushes some other host block down (or drops
// it) instead of overfilling either tier for a moment.
//
// Victims: the lowest score (access_count * (1 + important_fraction)), then the least recently
// touched, then the lowest id. Within one Touch or Insert, blocks nearer the root count as
// touched later, so among equal scores deeper blocks (shared by fewer prompts) go first.
// Pinned blocks are never demoted or dropped, and a subtree holding a pinned block is never
// dropped; dropping a block drops its whole subtree, which is unreachable without it.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"

namespace deja::coordinator {

enum class PrefixTier : int { kMemory = 0, kHost = 1, kDisk = 2 };
// "memory", "host", "disk".
const char* PrefixTierName(PrefixTier tier);

// What a worker does with one block. Workers handle each op on its own, in the order emitted.
struct PrefixOp {
  enum class Kind : int {
    kToHost = 0,    // Move the memory copy to host.
    kToDisk = 1,    // Release the fast copy (host, or memory when host is off); the disk replica
                    // remains.
    kToMemory = 2,  // Load into memory from host (releasing the host copy) or from disk.
    kDrop = 3,      // Forget the block everywhere, its disk file included.
  };
  Kind kind;
  uint64_t block_id;

  bool operator==(const PrefixOp&) const = default;
};

struct PrefixIndexOptions {
  int32_t block_tokens = 16;
  // Budgets in blocks. 0 disables the tier: with memory_blocks 0 nothing is ever inserted or
  // promoted. disk_blocks counts every block in the index (all have a replica).
  int64_t memory_blocks = 0;
  int64_t host_blocks = 0;
  int64_t disk_blocks = 0;  // 0: no disk tier.
};

// InvalidArgument unless block_tokens >= 1 and every budget >= 0. For the config layer: the
// constructor CHECKs the same.
Status ValidatePrefixIndexOptions(const PrefixIndexOptions& options);

struct PrefixMatch {
  std::vector<uint64_t> blocks;   // Matched block ids, in prefix order.
  std::vector<PrefixTier> tiers;  // Tier of each: kMemory, kHost, or kDisk (disk only).
  int32_t tokens = 0;             // blocks.size() * block_tokens.
};

class PrefixIndex {
 public:
  // CHECK-fails on options ValidatePrefixIndexOptions rejects (a programmer error by then).
  explicit PrefixIndex(const PrefixIndexOptions& options);
  PrefixIndex(const PrefixIndex&) = delete;
  PrefixIndex& operator=(const PrefixIndex&) = delete;

  const PrefixIndexOptions& options() const { return options_; }

  // Longest run of whole blocks of tokens[0, n) in the index under `key`; a partial last block
  // never matches.
  PrefixMatch Lookup(const std::string& key, const int32_t* tokens, int32_t n) const;
  PrefixMatch Lookup(const int32_t* tokens, int32_t n) const { return Lookup({}, tokens, n); }

  // Records a hit on these blocks: access_count += 1, touched now. Unknown ids are ignored.
  void Touch(const std::vector<uint64_t>& ids);

  // Counted pins: a running sequence reads these blocks from memory, so they stay there. Callers
  // pin what Promote brought to memory. Unknown ids are ignored, as is Unpin of an unpinned block
  // or of one Lost dropped.
  void Pin(const std::vector<uint64_t>& ids);
  void Unpin(const std::vector<uint64_t>& ids);

  // Brings the leading blocks of `ids` (a Lookup result, prefix order) into memory. For each
  // block not in memory: make room by demoting the lowest unpinned memory blocks not in `ids`
  // (to host, pushing host's lowest to disk or dropping them; straight to disk, or dropped, when
  // host has no room), then emit kToMemory. Stops at the first block that cannot get room (or is
  // unknown). Returns how many leading blocks of `ids` are in memory afterwards.
  int32_t Promote(const std::vector<uint64_t>& ids, std::vector<PrefixOp>* ops);

  // A sequence computed tokens[0, n): its full blocks the index lacks become memory blocks (the
  // worker keeps the sequence's own KV for them and writes their disk replicas when the disk tier
  // is on); blocks already present are touched, not duplicated, and stay in their tier. Makes
  // room like Promote and keeps disk_blocks by dropping the lowest unpinned disk-only subtrees,
  // then host, then memory ones; never drops a block of this path, but may move its earlier
  // blocks down a tier (a prompt longer than the memory tier spills its first blocks to host).
  // Stops at the first block that cannot be inserted. Returns (block index within tokens, new id)
  // for each new block, in order; `created_at` (optional) gets, for each, the number of ops
  // emitted before it was created: a worker must hold block k after applying that many ops, as
  // later ops may name it.
  std::vector<std::pair<int32_t, uint64_t>> Insert(const std::string& key, const int32_t* tokens,
                                                   int32_t n, std::vector<PrefixOp>* ops,
                                                   std::vector<size_t>* created_at = nullptr);
  std::vector<std::pair<int32_t, uint64_t>> Insert(const int32_t* tokens, int32_t n,
                                                   std::vector<PrefixOp>* ops,
                                                   std::vector<size_t>* created_at = nullptr) {
    return Insert({}, tokens, n, ops, created_at);
  }
  // Trees (keys) that hold at least one block.
  int64_t keys() const { return static_cast<int64_t>(roots_.size()); }

  // Changes the memory tier's budget (the scheduler gives it what running sequences leave free
  // of the KV memory): lowering it moves the lowest unpinned memory blocks down a tier (or drops
  // them) until the tier fits, as far as pins allow. Returns the blocks in memory afterwards.
  int64_t SetMemoryBlocks(int64_t blocks, std::vector<PrefixOp>* ops);

  // A worker could not produce block `id` (its disk file was corrupt or missing): forget it and
  // its subtree, emitting kDrop for each block, parent before children. Meant for blocks not in
  // memory; pins in the subtree are forgotten with it. Unknown ids are ignored.
  void Lost(uint64_t id, std::vector<PrefixOp>* ops);

  // Clamped to [0, 1]; NaN counts as 0. Unknown ids are ignored.
  void SetImportance(uint64_t id, double important_fraction);

  double Score(uint64_t id) const;  // -1 for an unknown id.
  std::optional<PrefixTier> TierOf(uint64_t id) const;
  int32_t PinCount(uint64_t id) const;  // 0 for an unknown id.
  // Blocks whose fast copy is in `tier`; kDisk counts the disk-only ones.
  int64_t blocks(PrefixTier tier) const { return static_cast<int64_t>(tiers_[Index(tier)].size()); }
  // Blocks with a disk replica: all of them with the disk tier on, else 0.
  int64_t disk_replicas() const { return disk_on() ? size() : 0; }
  int64_t size() const { return static_cast<int64_t>(nodes_.size()); }

 private:
  friend class PrefixIndexTestPeer;  // Swaps the block hash to force collisions.
  using BlockHash = uint64_t (*)(const int32_t* tokens, int32_t n);

  struct Node {
    uint64_t id = 0;
    Node* parent = nullptr;  // null for a tree's root
    std::string key;         // a root's key
    std::vector<int32_t> tokens;
    // Child ids by block hash; a hit is confirmed by comparing the tokens.
    std::unordered_multimap<uint64_t, uint64_t> children;
    PrefixTier tier = PrefixTier::kMemory;
    int64_t access_count = 1;
    double important_fraction = 0;
    uint64_t last_touch = 0;
    int32_t pins = 0;
    // Pins of this node and all its descendants: > 0 means the subtree must not be dropped.
    int64_t pins_below = 0;
  };
  // Victim order within a tier: lowest first.
  struct Key {
    double score;
    uint64_t last_touch;
    uint64_t id;
    auto operator<=>(const Key&) const = default;
  };
  // What must get room: one of the fast tiers, or the disk tier's count of all blocks.
  enum class Budget { kMemory, kHost, kDisk };

  static int Index(PrefixTier tier) { return static_cast<int>(tier); }
  static double ScoreOf(const Node& n) { return n.access_count * (1 + n.important_fraction); }
  static Key KeyOf(const Node& n) { return {ScoreOf(n), n.last_touch, n.id}; }
  bool disk_on() const { return options_.disk_blocks > 0; }

  Node* Find(uint64_t id);
  const Node* Find(uint64_t id) const;
  // The child of `parent` holding exactly this block, or 0.
  uint64_t FindChild(const Node& parent, const int32_t* block) const;
  // Applies `change` to n's ordering fields, keeping n's tier set in order.
  template <typename F>
  void Rekey(Node& n, F change);
  void Move(Node& n, PrefixTier to, PrefixOp::Kind kind, std::vector<PrefixOp>* ops);
  void AddPins(Node& n, int32_t delta);
  // Adds `hits` to n's access count and stamps it as touched now.
  void TouchNode(Node& n, int64_t hits);

  // Frees budget until one more block fits; false when only pinned blocks could be evicted.
  bool MakeRoom(Budget budget, std::vector<PrefixOp>* ops);
  bool EvictOne(Budget budget, std::vector<PrefixOp>* ops);
  // Moves an unpinned fast block one step down (memory -> host -> disk) or drops its subtree;
  // false when none of that is possible.
  bool Demote(Node& n, std::vector<PrefixOp>* ops);
  void DropSubtree(Node& n, std::vector<PrefixOp>* ops);

  PrefixIndexOptions options_;
  BlockHash hash_;
  // Each key's root (holding no block); a root goes with its last block.
  std::unordered_map<std::string, Node> roots_;
  const Node* inserting_ = nullptr;  // the root Insert adds to: never erased meanwhile
  std::unordered_map<uint64_t, Node> nodes_;  // Node addresses are stable across rehashing.
  std::set<Key> tiers_[3];                    // By PrefixTier.
  uint64_t next_id_ = 1;
  uint64_t clock_ = 0;
};

}  // namespace deja::coordinator
