// LazyPrefix: a cached prefix that a sequence reads from the prefix cache's host or disk tier
// layer by layer, during its first step, instead of loading every block into the KV pool first
// (important-token loading, docs/architecture.md#prefix-cache). For each layer the model asks
// for the keys of its probe heads, then for the keys and values of the tokens it chose (or of
// all of them when the probe heads disagree); only those byte ranges are copied from host
// memory or read (and checksummed) from the block files, and keys already read are not read
// again. A file stores its tokens in importance order (OrderedLayout), so a block's chosen tokens
// are read as the few groups of rows that hold them, for every head at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"
#include "worker/kv/kv_cache.h"
#include "worker/kv/kv_pool.h"
#include "worker/prefix/block_files.h"
#include "worker/prefix/block_layout.h"

namespace deja::worker::prefix {

// What loads cost, and the blocks that could not be read.
struct LazyCounters {
  int64_t host_bytes = 0;
  int64_t disk_bytes = 0;
  double seconds = 0;
  std::vector<uint64_t> failed;
  // Per block id: tokens the layers that chose kept, and tokens those layers considered.
  std::unordered_map<uint64_t, std::pair<int64_t, int64_t>> chosen;
  // Per block id: how often each (layer, slot) was chosen, layers x block_slots.
  std::unordered_map<uint64_t, std::vector<int32_t>> chosen_slots;
};

// One block outside the pool: its host copy, or else its file, whose tokens are stored in
// `order` (OrderedLayout: rank -> slot for every layer).
struct LazySource {
  uint64_t id = 0;
  std::shared_ptr<const std::vector<char>> host;
  std::shared_ptr<const std::vector<int32_t>> order;
};

class LazyPrefix : public kv::PrefixLoader {
 public:
  // ids[i]: block i of the prefix; sources[i]: where it is read from, or nullopt for one the
  // sequence copied from the pool. `files` may be null when every source has a host copy.
  LazyPrefix(std::shared_ptr<kv::KvBlockPool> pool, std::shared_ptr<BlockFiles> files,
             std::vector<uint64_t> ids, std::vector<std::optional<LazySource>> sources,
             std::shared_ptr<LazyCounters> counters);

  Status Load(const kv::SequenceKv& kv, int32_t layer, const std::vector<int32_t>& heads,
              bool keys_only, const std::vector<int32_t>* positions) override;

 private:
  Status Read(const LazySource& s, const std::vector<std::pair<size_t, size_t>>& ranges, char* out);
  // The slots marked in want_ of `s` from its file, rows of `heads` (keys only, or keys and
  // values), into pool block `block`. Returns the read's status (an error: the block is lost);
  // *write gets the pool's.
  Status ReadFromFile(const LazySource& s, int32_t layer, const std::vector<int32_t>& heads,
                      bool keys_only, int32_t block, Status* write);

  std::shared_ptr<kv::KvBlockPool> pool_;
  std::shared_ptr<BlockFiles> files_;
  OrderedLayout layout_;
  std::vector<uint64_t> ids_;
  std::vector<std::optional<LazySource>> sources_;
  std::vector<bool> lost_;
  // Heads whose keys of every prefix token layer keys_layer_ has read already (the probe heads):
  // later reads of that layer skip them.
  int32_t keys_layer_ = -1;
  std::vector<bool> keys_done_;
  std::shared_ptr<LazyCounters> counters_;
  // Scratch.
  std::vector<std::pair<size_t, size_t>> ranges_, pos_ranges_;
  std::vector<int32_t> pos_values_;
  std::vector<char> data_, packed_, want_;
  std::vector<std::pair<size_t, size_t>> file_ranges_;
  struct Piece {
    int32_t part, group, head;
    size_t at;  // in data_
  };
  std::vector<Piece> pieces_;
};

}  // namespace deja::worker::prefix
