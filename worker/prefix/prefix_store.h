// PrefixStore: one rank's share of the prefix KV cache (docs/architecture.md#prefix-cache). The
// coordinator keeps the index (which token blocks are cached, in which tier, what to move) and
// sends operations; the store holds the data of this rank's heads:
//   memory  a block of the KV pool, held like a sequence's (sequences that reuse the prefix
//           share it: KvBlockPool counts holders);
//   host    a host buffer of the block's bytes (KvBlockPool::CopyOut);
//   disk    a file per block with checksums (BlockFiles), written once when the block enters
//           the cache, so demotion from host writes nothing. Its tokens are stored in importance
//           order (OrderedLayout): position order at first; the choices important-token loads
//           make are counted per (layer, slot), and a background thread rewrites a file whose
//           order they change (the new file replaces the old one once no sequence is about to
//           read the old order).
// A block is in memory or on host, never both; with a disk tier every block also has its file.
// Blocks are identified by the coordinator's ids. Not thread-safe: the step thread calls it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "worker/kv/kv_cache.h"
#include "worker/kv/kv_pool.h"
#include "worker/prefix/block_files.h"
#include "worker/prefix/block_layout.h"
#include "worker/prefix/lazy_prefix.h"

namespace deja::worker::prefix {

// What loads into memory cost in one step.
struct PrefixIo {
  int64_t host_bytes = 0;
  int64_t disk_bytes = 0;
  double seconds = 0;
};

class PrefixStore {
 public:
  // `files` null: no disk tier. `reorder_files` false keeps every file in position order.
  PrefixStore(std::shared_ptr<kv::KvBlockPool> pool, std::unique_ptr<BlockFiles> files,
              bool reorder_files = true);
  ~PrefixStore();
  PrefixStore(const PrefixStore&) = delete;
  PrefixStore& operator=(const PrefixStore&) = delete;

  bool has_disk() const { return files_ != nullptr; }
  int32_t block_tokens() const { return pool_->block_slots(); }

  // Keeps pool block `pool_block` (a sequence's, holding the final K/V of `tokens`) as cache
  // block `id` in memory, and queues its disk copy. AlreadyExists for a known id.
  Status Insert(uint64_t id, int32_t pool_block, std::vector<int32_t> tokens);
  // Memory -> host (the pool block is given back).
  Status ToHost(uint64_t id);
  // Memory or host -> disk only (the fast copy is released; FailedPrecondition without a disk
  // copy).
  Status ToDisk(uint64_t id);
  // Host or disk -> memory. A missing or corrupt file is NotFound / DataLoss, and the block is
  // then gone from this store (the coordinator forgets it and recomputes).
  Status ToMemory(uint64_t id, PrefixIo* io);
  // Forgets the block everywhere (its file too). Unknown ids are ignored.
  void Drop(uint64_t id);

  // The pool blocks of cache blocks `ids` and their tokens, in order; FailedPrecondition naming
  // the first that is not in memory.
  Status MemoryBlocks(const std::vector<uint64_t>& ids, std::vector<int32_t>* blocks,
                      std::vector<int32_t>* tokens) const;

  // Starts `kv` (an empty pooled cache) from cache blocks `ids` without loading them first:
  // those in memory are copied into blocks of its own now, the others are read during its next
  // step, layer by layer, as the model asks (LazyPrefix; important-token loading). Their tokens
  // are appended to *tokens. NotFound naming the first id this store does not hold.
  Status SeedLazy(const std::vector<uint64_t>& ids, kv::SequenceKv* kv,
                  std::vector<int32_t>* tokens);
  // What lazy loads read since the last call, and the blocks they could not read (dropped from
  // this store: the coordinator forgets them and recomputes). Their choices count toward the
  // blocks' file orders: files to reorder are queued, and files reordered since are published.
  LazyCounters TakeLazy();
  // Waits until no file is being reordered, then publishes what was (tests).
  void FinishReorders();
  // Files rewritten in a new order so far.
  int64_t reordered_files() const { return reordered_; }

  int64_t memory_blocks() const { return in_memory_; }
  int64_t host_blocks() const { return on_host_; }
  int64_t size() const { return static_cast<int64_t>(blocks_.size()); }

 private:
  struct Block {
    int32_t pool_block = -1;                  // memory tier
    std::shared_ptr<std::vector<char>> host;  // host tier
    bool on_disk = false;
    // The file's order (OrderedLayout; its own object: a sequence seeded from the file holds it
    // until its loads are done), and how often loads chose each (layer, slot).
    std::shared_ptr<const std::vector<int32_t>> order;
    std::vector<float> chosen;
    bool reordering = false;
    std::vector<int32_t> tokens;
  };
  // A file to rewrite in order `to`, from the host copy when there is one, else from the file.
  struct Reorder {
    uint64_t id;
    std::shared_ptr<const std::vector<char>> host;
    std::shared_ptr<const std::vector<int32_t>> from, to;
    std::shared_ptr<std::vector<char>> file;  // the new payload, once made
    Status status;
  };
  StatusOr<Block*> Find(uint64_t id);
  void ReleaseMemory(Block* b);
  // The order `b`'s counts give (each layer that has any by count, most chosen first; the
  // others as they are), or null when it moves too few slots to another group to pay a rewrite.
  std::shared_ptr<const std::vector<int32_t>> NewOrder(const Block& b) const;
  void ReorderLoop();
  void PublishReorders();

  std::shared_ptr<kv::KvBlockPool> pool_;
  std::shared_ptr<BlockFiles> files_;
  const OrderedLayout layout_;
  const bool reorder_files_;
  int64_t reordered_ = 0;
  std::mutex reorder_mu_;
  std::condition_variable reorder_cv_;  // the thread: a job or stop; FinishReorders: a job done
  std::deque<Reorder> queued_, done_;
  int32_t reordering_ = 0;  // jobs queued or being made
  bool stop_ = false;
  std::vector<Reorder> waiting_;  // made, their old order still held by a sequence
  std::thread reorderer_;
  std::shared_ptr<LazyCounters> lazy_ = std::make_shared<LazyCounters>();
  std::unordered_map<uint64_t, Block> blocks_;
  int64_t in_memory_ = 0;
  int64_t on_host_ = 0;
};

}  // namespace deja::worker::prefix
