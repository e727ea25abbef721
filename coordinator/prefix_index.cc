#include "coordinator/prefix_index.h"

#include <glog/logging.h>

#include <algorithm>
#include <cmath>
#include <string>

namespace deja::coordinator {
namespace {

// A splitmix64-style mix of the ids. Only spreads children over buckets: a hit is always
// confirmed by comparing the ids, so collisions cost time, never correctness.
uint64_t HashBlock(const int32_t* tokens, int32_t n) {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ static_cast<uint64_t>(n);
  for (int32_t i = 0; i < n; ++i) {
    h = (h ^ static_cast<uint32_t>(tokens[i])) * 0xbf58476d1ce4e5b9ull;
    h ^= h >> 31;
  }
  return h;
}

}  // namespace

const char* PrefixTierName(PrefixTier tier) {
  switch (tier) {
    case PrefixTier::kMemory:
      return "memory";
    case PrefixTier::kHost:
      return "host";
    case PrefixTier::kDisk:
      return "disk";
  }
  return "unknown";
}

Status ValidatePrefixIndexOptions(const PrefixIndexOptions& options) {
  if (options.block_tokens < 1) {
    return InvalidArgument("prefix cache block_tokens must be >= 1, got " +
                           std::to_string(options.block_tokens));
  }
  if (options.memory_blocks < 0 || options.host_blocks < 0 || options.disk_blocks < 0) {
    return InvalidArgument("prefix cache budgets must be >= 0, got memory " +
                           std::to_string(options.memory_blocks) + ", host " +
                           std::to_string(options.host_blocks) + ", disk " +
                           std::to_string(options.disk_blocks));
  }
  return Status::Ok();
}

PrefixIndex::PrefixIndex(const PrefixIndexOptions& options) : options_(options), hash_(&HashBlock) {
  const Status status = ValidatePrefixIndexOptions(options);
  CHECK(status.ok()) << status.ToString();
}

PrefixIndex::Node* PrefixIndex::Find(uint64_t id) {
  auto it = nodes_.find(id);
  return it == nodes_.end() ? nullptr : &it->second;
}

const PrefixIndex::Node* PrefixIndex::Find(uint64_t id) const {
  auto it = nodes_.find(id);
  return it == nodes_.end() ? nullptr : &it->second;
}

uint64_t PrefixIndex::FindChild(const Node& parent, const int32_t* block) const {
  auto [lo, hi] = parent.children.equal_range(hash_(block, options_.block_tokens));
  for (auto it = lo; it != hi; ++it) {
    const Node& child = nodes_.at(it->second);
    if (std::equal(child.tokens.begin(), child.tokens.end(), block)) return child.id;
  }
  return 0;
}

PrefixMatch PrefixIndex::Lookup(const std::string& key, const int32_t* tokens, int32_t n) const {
  PrefixMatch match;
  const int64_t bt = options_.block_tokens;
  auto root = roots_.find(key);
  if (root == roots_.end()) return match;
  const Node* cur = &root->second;
  for (int64_t start = 0; start + bt <= n; start += bt) {
    const uint64_t child = FindChild(*cur, tokens + start);
    if (child == 0) break;
    cur = &nodes_.at(child);
    match.blocks.push_back(cur->id);
    match.tiers.push_back(cur->tier);
  }
  match.tokens = static_cast<int32_t>(match.blocks.size() * bt);
  return match;
}

template <typename F>
void PrefixIndex::Rekey(Node& n, F change) {
  tiers_[Index(n.tier)].erase(KeyOf(n));
  change(n);
  tiers_[Index(n.tier)].insert(KeyOf(n));
}

void PrefixIndex::Move(Node& n, PrefixTier to, PrefixOp::Kind kind, std::vector<PrefixOp>* ops) {
  Rekey(n, [to](Node& m) { m.tier = to; });
  ops->push_back({kind, n.id});
}

void PrefixIndex::TouchNode(Node& n, int64_t hits) {
  Rekey(n, [&](Node& m) {
    m.access_count += hits;
    m.last_touch = ++clock_;
  });
}

void PrefixIndex::AddPins(Node& n, int32_t delta) {
  n.pins += delta;
  for (Node* p = &n; p != nullptr; p = p->parent) p->pins_below += delta;
}

void PrefixIndex::Touch(const std::vector<uint64_t>& ids) {
  // Deepest first, so the blocks nearer the root end up the more recently touched.
  for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
    if (Node* n = Find(*it)) TouchNode(*n, 1);
  }
}

void PrefixIndex::Pin(const std::vector<uint64_t>& ids) {
  for (uint64_t id : ids) {
    if (Node* n = Find(id)) AddPins(*n, 1);
  }
}

void PrefixIndex::Unpin(const std::vector<uint64_t>& ids) {
  for (uint64_t id : ids) {
    Node* n = Find(id);
    if (n != nullptr && n->pins > 0) AddPins(*n, -1);
  }
}

bool PrefixIndex::MakeRoom(Budget budget, std::vector<PrefixOp>* ops) {
  auto used = [&] {
    switch (budget) {
      case Budget::kMemory:
        return blocks(PrefixTier::kMemory);
      case Budget::kHost:
        return blocks(PrefixTier::kHost);
      case Budget::kDisk:
        return size();
    }
    return int64_t{0};
  };
  const int64_t limit = budget == Budget::kMemory ? options_.memory_blocks
                        : budget == Budget::kHost ? options_.host_blocks
                                                  : options_.disk_blocks;
  while (used() >= limit) {
    if (!EvictOne(budget, ops)) return false;
  }
  return true;
}

// Each branch mutates the index only on its way to returning true, so a failed candidate leaves
// the tier sets (and the iterators over them) intact.
bool PrefixIndex::EvictOne(Budget budget, std::vector<PrefixOp>* ops) {
  if (budget == Budget::kDisk) {
    for (PrefixTier tier : {PrefixTier::kDisk, PrefixTier::kHost, PrefixTier::kMemory}) {
      for (const Key& key : tiers_[Index(tier)]) {
        Node& n = nodes_.at(key.id);
        if (n.pins_below > 0) continue;
        DropSubtree(n, ops);
        return true;
      }
    }
    return false;
  }
  const PrefixTier tier = budget == Budget::kMemory ? PrefixTier::kMemory : PrefixTier::kHost;
  for (const Key& key : tiers_[Index(tier)]) {
    Node& n = nodes_.at(key.id);
    if (n.pins == 0 && Demote(n, ops)) return true;
  }
  return false;
}

bool PrefixIndex::Demote(Node& n, std::vector<PrefixOp>* ops) {
  if (n.tier == PrefixTier::kMemory && options_.host_blocks > 0) {
    // Pinned for the moment so that making room in host cannot drop n's own ancestors.
    AddPins(n, 1);
    const bool room = MakeRoom(Budget::kHost, ops);
    AddPins(n, -1);
    if (room) {
      Move(n, PrefixTier::kHost, PrefixOp::Kind::kToHost, ops);
      return true;
    }
  }
  if (disk_on()) {
    Move(n, PrefixTier::kDisk, PrefixOp::Kind::kToDisk, ops);
    return true;
  }
  if (n.pins_below > 0) return false;
  DropSubtree(n, ops);
  return true;
}

void PrefixIndex::DropSubtree(Node& n, std::vector<PrefixOp>* ops) {
  // Pins below n leave with it (Lost may drop pinned blocks); the ancestors forget them.
  for (Node* p = n.parent; p != nullptr; p = p->parent) p->pins_below -= n.pins_below;
  auto [lo, hi] = n.parent->children.equal_range(hash_(n.tokens.data(), options_.block_tokens));
  for (auto it = lo; it != hi; ++it) {
    if (it->second == n.id) {
      n.parent->children.erase(it);
      break;
    }
  }
  // Its tree's last block: the key goes, unless Insert is adding to that tree right now.
  if (n.parent->parent == nullptr && n.parent->children.empty() && n.parent != inserting_) {
    roots_.erase(n.parent->key);
  }
  std::vector<uint64_t> order = {n.id};  // Breadth first: every parent before its children.
  for (size_t i = 0; i < order.size(); ++i) {
    for (const auto& [hash, child] : nodes_.at(order[i]).children) order.push_back(child);
  }
  for (uint64_t id : order) {
    const Node& d = nodes_.at(id);
    tiers_[Index(d.tier)].erase(KeyOf(d));
    ops->push_back({PrefixOp::Kind::kDrop, id});
    nodes_.erase(id);
  }
}

int32_t PrefixIndex::Promote(const std::vector<uint64_t>& ids, std::vector<PrefixOp>* ops) {
  // The whole run is pinned while room is made, so making room for one of its blocks never
  // evicts another (nor drops a subtree holding one).
  std::vector<Node*> guarded;
  for (uint64_t id : ids) {
    if (Node* n = Find(id)) {
      AddPins(*n, 1);
      guarded.push_back(n);
    }
  }
  int32_t in_memory = 0;
  for (uint64_t id : ids) {
    Node* n = Find(id);
    if (n == nullptr) break;
    if (n->tier != PrefixTier::kMemory) {
      if (!MakeRoom(Budget::kMemory, ops)) break;
      Move(*n, PrefixTier::kMemory, PrefixOp::Kind::kToMemory, ops);
    }
    ++in_memory;
  }
  for (Node* n : guarded) AddPins(*n, -1);
  return in_memory;
}

std::vector<std::pair<int32_t, uint64_t>> PrefixIndex::Insert(const std::string& key,
                                                              const int32_t* tokens, int32_t n,
                                                              std::vector<PrefixOp>* ops,
                                                              std::vector<size_t>* created_at) {
  std::vector<std::pair<int32_t, uint64_t>> added;
  std::vector<Node*> path;
  const uint64_t first_new = next_id_;
  const int32_t bt = options_.block_tokens;
  // Only the deepest block of the path is pinned while room is made: its ancestors may move
  // down a tier (a prompt longer than the memory tier spills its first blocks to host), but a
  // pin below them keeps them from being dropped.
  if (n < bt) return added;
  Node* const root = &roots_[key];
  root->key = key;
  inserting_ = root;
  Node* cur = root;
  for (int32_t b = 0; static_cast<int64_t>(b + 1) * bt <= n; ++b) {
    const int32_t* block = tokens + static_cast<int64_t>(b) * bt;
    Node* next = Find(FindChild(*cur, block));
    if (next == nullptr) {
      if (!MakeRoom(Budget::kMemory, ops) || (disk_on() && !MakeRoom(Budget::kDisk, ops))) break;
      const uint64_t id = next_id_++;
      next = &nodes_[id];
      next->id = id;
      next->parent = cur;
      next->tokens.assign(block, block + bt);
      next->last_touch = clock_;
      cur->children.emplace(hash_(block, bt), id);
      tiers_[Index(PrefixTier::kMemory)].insert(KeyOf(*next));
      added.emplace_back(b, id);
      if (created_at != nullptr) created_at->push_back(ops->size());
    }
    AddPins(*next, 1);
    if (cur != root) AddPins(*cur, -1);
    path.push_back(next);
    cur = next;
  }
  if (cur != root) AddPins(*cur, -1);
  inserting_ = nullptr;
  if (root->children.empty()) roots_.erase(key);  // nothing could be inserted (or all dropped)
  // Deepest first, as in Touch; the blocks that were already there count a hit.
  for (auto it = path.rbegin(); it != path.rend(); ++it) {
    TouchNode(**it, (*it)->id >= first_new ? 0 : 1);
  }
  return added;
}

int64_t PrefixIndex::SetMemoryBlocks(int64_t blocks, std::vector<PrefixOp>* ops) {
  options_.memory_blocks = std::max<int64_t>(0, blocks);
  while (this->blocks(PrefixTier::kMemory) > options_.memory_blocks) {
    if (!EvictOne(Budget::kMemory, ops)) break;
  }
  return this->blocks(PrefixTier::kMemory);
}

void PrefixIndex::Lost(uint64_t id, std::vector<PrefixOp>* ops) {
  if (Node* n = Find(id)) DropSubtree(*n, ops);
}

void PrefixIndex::SetImportance(uint64_t id, double important_fraction) {
  Node* n = Find(id);
  if (n == nullptr) return;
  const double f = std::isnan(important_fraction) ? 0 : std::clamp(important_fraction, 0.0, 1.0);
  Rekey(*n, [f](Node& m) { m.important_fraction = f; });
}

double PrefixIndex::Score(uint64_t id) const {
  const Node* n = Find(id);
  return n == nullptr ? -1 : ScoreOf(*n);
}

std::optional<PrefixTier> PrefixIndex::TierOf(uint64_t id) const {
  const Node* n = Find(id);
  if (n == nullptr) return std::nullopt;
  return n->tier;
}

int32_t PrefixIndex::PinCount(uint64_t id) const {
  const Node* n = Find(id);
  return n == nullptr ? 0 : n->pins;
}

}  // namespace deja::coordinator
