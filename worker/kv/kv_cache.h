// Per-sequence KV cache storage (docs/architecture.md#kv-cache): for each layer and each local
// head, `capacity` slots of key and value (rows of f32, f16 or int8: common/kv_row.h), a slot -> position
// table and an accumulated attention score per slot. Slots are reused in place (a free list per
// head), never compacted during a step. The eviction policy plans which slots go; this class
// applies the plan. With the full policy, slot == position.
//
// With a KvBlockPool given to Create (every device cache; a host cache when the worker pages its
// KV memory) the slot bookkeeping stays on the host and the data
// stays on the device: K, V, scores and the slot -> position table live in the pool's blocks,
// taken as the sequence's slots grow; WriteLayer and EvictLayer run the backend's KvWrite and
// KvEvict ops. The device picks each head's eviction victims (a lowest-(score, position)
// kernel); their slot numbers (not K, V or scores) reach the host's free lists at the next
// AppendPositions, after the step's results were read. Eviction counts are the same for every
// head, so occupancy is known at once.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/kv_row.h"
#include "common/status.h"
#include "common/tensor.h"
#include "kernels/backend.h"
#include "kernels/op_table.h"
#include "worker/kv/eviction_policy.h"
#include "worker/kv/kv_pool.h"

namespace deja::worker::kv {

struct KvGeometry {
  int32_t layers = 0;
  int32_t heads = 0;  // heads held by this rank
  int32_t head_dim = 0;
  DType kv_dtype = DType::kF32;  // how K and V are stored: f32, f16 or int8 (common/kv_row.h)

  // Bytes of one K (or V) row of one head.
  size_t RowBytes() const { return KvRowBytes(kv_dtype, head_dim); }
  // Bytes one slot of one head costs across all layers (K, V, score, position).
  size_t SlotBytes() const {
    return static_cast<size_t>(layers) * heads * (2 * RowBytes() + sizeof(float) + 4);
  }
};

// Freed sequences' K/V/score tensors are kept (up to a limit, 1 GiB unless set) and handed to
// the next sequence of the same shape: memory already mapped, so decode does not page-fault it
// in. The worker sets the limit to its KV memory budget.
void SetKvTensorPoolLimit(size_t bytes);
size_t KvTensorPoolBytes();

class SequenceKv;

// Where a sequence reads a cached prefix that is not in the KV pool (host memory or disk),
// layer by layer as its first step needs it (worker/prefix/lazy_prefix.h).
class PrefixLoader {
 public:
  virtual ~PrefixLoader() = default;
  // Copies into `kv`'s slots of `layer`, for each of `heads`, the keys (and the values unless
  // keys_only) of prefix positions `positions` (sorted; every prefix position when null), and
  // gives those slots their positions. A block that cannot be read (a missing or corrupt file)
  // leaves its slots empty and is reported by the loader's owner: never an error here, so one
  // sequence's lost block fails no other sequence of the step.
  virtual Status Load(const SequenceKv& kv, int32_t layer, const std::vector<int32_t>& heads,
                      bool keys_only, const std::vector<int32_t>* positions) = 0;
};

class SequenceKv {
 public:
  ~SequenceKv();
  // `capacity` slots per head: the sequence's length for `full`; the policy's budget plus the
  // largest chunk appended in one step otherwise. ResourceExhausted when it cannot be allocated.
  static StatusOr<std::unique_ptr<SequenceKv>> Create(
      const KvGeometry& geometry, int32_t capacity,
      std::unique_ptr<EvictionPolicy> policy = MakeFullPolicy(),
      std::shared_ptr<KvBlockPool> pool = nullptr);

  const KvGeometry& geometry() const { return geometry_; }
  const EvictionPolicy& policy() const { return *policy_; }
  int32_t capacity() const { return capacity_; }
  // Tokens appended so far (the next token's position).
  int32_t length() const { return length_; }
  // The most this cache can hold (admission reserves it); on a device, in whole pool blocks.
  size_t bytes() const;
  // What it holds now: bytes() on the host; its pool blocks on a device.
  size_t held_bytes() const;
  bool on_device() const { return pool_ != nullptr; }
  // Occupied slots summed over layers and heads, and evictions so far.
  int64_t cached_slots() const;
  int64_t evictions() const { return evictions_; }

  // Positions [length, length + n) take a free slot in every (layer, head). OutOfRange when a
  // head has fewer than n free slots.
  Status AppendPositions(int32_t n);
  // Starts an empty pooled cache from a cached prefix: pool blocks holding positions
  // [0, blocks.size() * block_slots) of every layer and head in slot order. `share`: the cache
  // holds those blocks themselves (a full-policy cache never writes a slot it did not append,
  // so sharers never see each other's tokens); otherwise it copies them into blocks of its own
  // with every score 0 (a bounded policy evicts and rewrites slots in place). FailedPrecondition
  // without a pool or on a non-empty cache; OutOfRange past the capacity.
  Status SeedPrefix(const std::vector<int32_t>& blocks, bool share);
  // As SeedPrefix without sharing, for a prefix partly outside the pool: blocks[i] is a pool
  // block to copy, or -1 for one that `loader` fills layer by layer during the next step
  // (important-token loading: SetImportantPrefix on the whole prefix). The loader is released
  // after the last layer.
  Status SeedLoadedPrefix(const std::vector<int32_t>& blocks, std::unique_ptr<PrefixLoader> loader);
  PrefixLoader* prefix_loader() const { return loader_.get(); }
  void ReleaseLoader() { loader_.reset(); }
  // Important-token loading (worker/prefix/importance.h): the next step's queries choose, layer
  // by layer, which of the first `prefix_tokens` positions (a cached prefix the cache holds in
  // its own slots, slot == position) stay; the rest are emptied for every later step too.
  void SetImportantPrefix(int32_t prefix_tokens) {
    important_prefix_ = prefix_tokens;
    important_pending_.assign(geometry_.layers, prefix_tokens > 0);
  }
  int32_t important_prefix() const { return important_prefix_; }
  bool important_pending(int32_t layer) const {
    return layer < static_cast<int32_t>(important_pending_.size()) && important_pending_[layer];
  }
  void ImportantDone(int32_t layer) { important_pending_[layer] = false; }
  // The pool block holding slots [i * block_slots, (i + 1) * block_slots); -1 when none.
  int32_t pool_block(int32_t i) const {
    return i >= 0 && i < static_cast<int32_t>(blocks_.size()) ? blocks_[i] : -1;
  }
  // Pool bytes AppendPositions(n) would take now (the blocks its new slots reach past those held;
  // 0 without a pool). OutOfRange as AppendPositions.
  StatusOr<int64_t> BytesToAppend(int32_t n);
  // The free slots of the fullest head: the most tokens AppendPositions takes now.
  int32_t free_slots() const;
  // Writes the keys/values of the last-appended `n` tokens of one layer, rounded to the cache's
  // dtype. k and v are f32 [n, heads * head_dim] (the projection's layout); scores, when given,
  // f32 [n, heads]: each new slot's score (locret's retaining-head scores; else zero).
  // On a device, k, v and scores are in its memory (contiguous rows).
  Status WriteLayer(int32_t layer, int32_t n, const float* k, const float* v,
                    const float* scores = nullptr);
  // The attention view of one layer (scores only when attention accumulates them: h2o).
  kernels::KvView View(int32_t layer);
  // Where a bounded policy may evict (and decay its scores): once the sequence holds
  // `prompt_tokens` tokens, and before that only where its length is a multiple of `every`
  // (locret's chunk_tokens; 0: nowhere). So however a prompt is split into steps (the
  // scheduler's prefill budget, other sequences in the batch), its tokens meet the same cache:
  // an H2O or window prompt is attended in full and evicted once, a locret one at its chunks.
  // Unset: every step is a boundary.
  void SetEvictionBoundaries(int32_t prompt_tokens, int32_t every) {
    evict_from_ = prompt_tokens;
    evict_every_ = every;
  }
  bool AtEvictionBoundary() const;
  // Applies the policy to every head of `layer` (after that layer's attention of the step) at
  // an eviction boundary; elsewhere nothing.
  Status EvictLayer(int32_t layer);
  // Whether EvictLayer(layer) would launch anything on a pooled cache now (an eviction or a
  // score decay); false means it is a no-op this step.
  bool EvictsLayer(int32_t layer) const;
  // A pooled cache's EvictLayer(layer) without the launch: the host's accounting done, and the
  // KvEvict arguments and victims array (device memory) for a caller that launches it (a graph
  // step's DecodeEvict). false: nothing to launch.
  bool PlanEviction(int32_t layer, kernels::KvEvictArgs* args, int32_t** victims);
  // What a decode step over many caches reads of this one (KvAttention's DecodeAttention):
  // its pool (null without one), the slots the last AppendPositions gave `layer`'s heads
  // ([heads, appended()], head-major), `layer`'s slot count (slots [0, used) may be occupied)
  // and its block table on the host (slot s in blocks()[s / block_slots]).
  const KvBlockPool* pool() const { return pool_.get(); }
  int32_t appended() const { return last_n_; }
  const int32_t* appended_slots(int32_t layer) const {
    return new_slots_.data() + HeadIndex(layer, 0) * last_n_;
  }
  int32_t used(int32_t layer) const { return used_[layer]; }
  const std::vector<int32_t>& blocks() const { return blocks_; }
  // Moves occupied slots to the front and reallocates to `capacity` slots (after a prefill, a
  // bounded policy needs only budget + 1). OutOfRange when a head holds more than that. A cache
  // in a host pool compacts in place and gives back the blocks past its last slot; on a device
  // the cache keeps its slots (it holds only the blocks it has used).
  Status Resize(int32_t capacity);

 private:
  // Device mode: the victims of the last evictions into the host's free lists; blocks covering
  // slots [0, slots).
  Status FetchVictims();
  // View with the scores whenever the policy keeps them (writes and evictions).
  kernels::KvView StoreView(int32_t layer);
  Status EnsureBlocks(int32_t slots);
  // Host pool mode's Resize: occupied slots to the front of each head, blocks past the last
  // one back to the pool.
  Status CompactPooled(int32_t capacity);
  SequenceKv(const KvGeometry& g, int32_t capacity, std::unique_ptr<EvictionPolicy> policy);
  Status Allocate();
  size_t HeadIndex(int32_t layer, int32_t head) const {
    return static_cast<size_t>(layer) * geometry_.heads + head;
  }

  KvGeometry geometry_;
  int32_t capacity_;
  std::unique_ptr<EvictionPolicy> policy_;
  int32_t length_ = 0;
  int32_t evict_from_ = 0;
  int32_t evict_every_ = 0;
  int64_t evictions_ = 0;
  int32_t important_prefix_ = 0;
  std::unique_ptr<PrefixLoader> loader_;
  std::vector<bool> important_pending_;
  std::vector<Tensor> k_, v_;               // per layer: [heads, capacity, row elements]
  std::vector<Tensor> score_;               // per layer: [heads, capacity]
  std::vector<int32_t> slot_pos_;           // [layers, heads, capacity]
  std::vector<int32_t> used_;               // per layer: slots [0, used) may be occupied
  std::vector<int32_t> occupied_;           // per (layer, head)
  std::vector<std::vector<int32_t>> free_;  // per (layer, head): free slots, next at back
  std::vector<int32_t> new_slots_;          // [layers, heads, n] of the last append
  int32_t last_n_ = 0;
  std::vector<int32_t> plan_;  // scratch for eviction plans

  // Device mode.
  std::shared_ptr<KvBlockPool> pool_;
  std::vector<int32_t> blocks_;  // the sequence's blocks, slot s in blocks_[s / block_slots]
  Tensor blocks_dev_;            // the same table on the device
  Tensor victims_dev_;           // [layers, heads, victim_cap_] of the last evictions
  int32_t victim_cap_ = 0;
  std::vector<int32_t> layer_excess_;  // per layer: victims per head waiting for FetchVictims
  std::vector<int32_t> victims_;       // host copy
  std::vector<int32_t> positions_;     // scratch: the positions WriteLayer writes
};

}  // namespace deja::worker::kv
