#include "worker/kv/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <iterator>
#include <mutex>
#include <new>

#include "common/vec_math.h"
#include "kernels/ops.h"

namespace deja::worker::kv {
namespace {

// Freed K, V and score tensors, kept for the next sequence that asks for the same dtype and shape
// (a worker serving the same max_tokens sees the same shapes again), so a long-running worker
// decodes into pages that are already mapped. Fresh memory is first touched during decode, one
// page fault per head every 4 KiB of K or V (`perf` of the 1.3B shape at batch 16: 2-5% of the
// step in the kernel's page clearing), and glibc hands freed caches back to the kernel when it
// trims the heap. Holds at most the set limit (oldest dropped first), and a fresh allocation
// first releases as many pooled bytes, so pooled + live never exceeds the live peak. Thread-safe.
class KvTensorPool {
 public:
  static KvTensorPool& Get() {
    static KvTensorPool* pool = new KvTensorPool;  // never destroyed: sequences may outlive main
    return *pool;
  }
  Tensor Take(DType dtype, const Shape& shape) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = free_.rbegin(); it != free_.rend(); ++it) {
        if (it->dtype() == dtype && it->shape() == shape) {
          Tensor t = std::move(*it);
          free_.erase(std::next(it).base());
          bytes_ -= t.bytes();
          return t;
        }
      }
      // A miss allocates: first release at least as many pooled bytes (oldest first), so cached
      // plus live caches never exceed the most the live ones ever held (which admission bounds
      // by the KV budget).
      Drop(static_cast<size_t>(shape.numel()) * DTypeSize(dtype));
    }
    return Tensor::Empty(dtype, shape);
  }
  void Give(Tensor t) {
    if (t.empty()) return;
    std::lock_guard<std::mutex> lock(mu_);
    bytes_ += t.bytes();
    free_.push_back(std::move(t));
    Trim();
  }
  void SetLimit(size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    limit_ = bytes;
    Trim();
  }
  size_t bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    return bytes_;
  }

 private:
  // Frees pooled tensors, oldest first, until `bytes` are released or none is left.
  void Drop(size_t bytes) {
    size_t released = 0;
    while (released < bytes && !free_.empty()) {
      released += free_.front().bytes();
      bytes_ -= free_.front().bytes();
      free_.pop_front();
    }
  }
  void Trim() {
    if (bytes_ > limit_) Drop(bytes_ - limit_);
  }
  std::mutex mu_;
  std::deque<Tensor> free_;  // most recently freed at the back
  size_t bytes_ = 0;
  size_t limit_ = size_t{1} << 30;
};

void GiveAll(std::vector<Tensor>* tensors) {
  for (Tensor& t : *tensors) KvTensorPool::Get().Give(std::move(t));
  tensors->clear();
}

}  // namespace

void SetKvTensorPoolLimit(size_t bytes) { KvTensorPool::Get().SetLimit(bytes); }
size_t KvTensorPoolBytes() { return KvTensorPool::Get().bytes(); }

SequenceKv::~SequenceKv() {
  if (pool_ != nullptr) pool_->Give(blocks_);
  GiveAll(&k_);
  GiveAll(&v_);
  GiveAll(&score_);
}

SequenceKv::SequenceKv(const KvGeometry& g, int32_t capacity,
                       std::unique_ptr<EvictionPolicy> policy)
    : geometry_(g), capacity_(capacity), policy_(std::move(policy)) {}

StatusOr<std::unique_ptr<SequenceKv>> SequenceKv::Create(const KvGeometry& g, int32_t capacity,
                                                         std::unique_ptr<EvictionPolicy> policy,
                                                         std::shared_ptr<KvBlockPool> pool) {
  if (g.layers <= 0 || g.heads <= 0 || g.head_dim <= 0 || capacity <= 0) {
    return InvalidArgument("kv cache geometry and capacity must be positive");
  }
  if (!IsKvDType(g.kv_dtype)) {
    return InvalidArgument(std::string("kv cache dtype must be f32 or f16, not ") +
                           DTypeName(g.kv_dtype));
  }
  if (policy == nullptr) return InvalidArgument("kv cache needs an eviction policy");
  std::unique_ptr<SequenceKv> kv(new SequenceKv(g, capacity, std::move(policy)));
  if (pool != nullptr) {
    kv->pool_ = std::move(pool);
    const int32_t bs = kv->pool_->block_slots();
    DEJA_ASSIGN_OR_RETURN(kv->blocks_dev_,
                          kv->pool_->backend().Allocate(DType::kI32, {(capacity + bs - 1) / bs}));
    kv->layer_excess_.assign(g.layers, 0);
  } else {
    DEJA_RETURN_IF_ERROR(kv->Allocate());
  }
  const size_t heads = static_cast<size_t>(g.layers) * g.heads;
  kv->slot_pos_.assign(heads * capacity, -1);
  kv->used_.assign(g.layers, 0);
  kv->occupied_.assign(heads, 0);
  kv->free_.resize(heads);
  for (auto& f : kv->free_) {
    f.resize(capacity);
    for (int32_t s = 0; s < capacity; ++s) f[s] = capacity - 1 - s;  // pop gives 0, 1, 2, ...
  }
  return kv;
}

Status SequenceKv::Allocate() {
  const KvGeometry& g = geometry_;
  try {
    k_.clear();
    v_.clear();
    score_.clear();
    KvTensorPool& pool = KvTensorPool::Get();
    for (int32_t l = 0; l < g.layers; ++l) {
      // Slots are read only once written (slot_pos), so recycled K and V need no clearing.
      const int64_t row = KvRowElems(g.kv_dtype, g.head_dim);
      k_.push_back(pool.Take(g.kv_dtype, {g.heads, capacity_, row}));
      v_.push_back(pool.Take(g.kv_dtype, {g.heads, capacity_, row}));
      score_.push_back(pool.Take(DType::kF32, {g.heads, capacity_}));
      std::memset(score_.back().data(), 0, score_.back().bytes());
    }
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("cannot allocate a KV cache of " + std::to_string(capacity_) +
                             " slots per head");
  }
  return Status::Ok();
}

int64_t SequenceKv::cached_slots() const {
  int64_t n = 0;
  for (int32_t o : occupied_) n += o;
  return n;
}

size_t SequenceKv::bytes() const {
  if (pool_ == nullptr) return geometry_.SlotBytes() * capacity_;
  const size_t bs = static_cast<size_t>(pool_->block_slots());
  return (static_cast<size_t>(capacity_) + bs - 1) / bs * static_cast<size_t>(pool_->block_bytes());
}

size_t SequenceKv::held_bytes() const {
  if (pool_ == nullptr) return bytes();
  return blocks_.size() * static_cast<size_t>(pool_->block_bytes());
}

// From the occupancy: on a device the free lists wait for the last victims (FetchVictims).
int32_t SequenceKv::free_slots() const {
  int32_t most = 0;
  for (int32_t o : occupied_) most = std::max(most, o);
  return capacity_ - most;
}

Status SequenceKv::AppendPositions(int32_t n) {
  if (n < 0) return InvalidArgument("cannot append a negative number of tokens");
  if (pool_ != nullptr) DEJA_RETURN_IF_ERROR(FetchVictims());
  for (const auto& f : free_) {
    if (static_cast<int32_t>(f.size()) < n) {
      return OutOfRange("appending " + std::to_string(n) + " tokens to a sequence of " +
                        std::to_string(length_) + " exceeds its KV capacity of " +
                        std::to_string(capacity_) + " slots per head");
    }
  }
  const int32_t heads = geometry_.heads;
  new_slots_.resize(static_cast<size_t>(geometry_.layers) * heads * n);
  for (int32_t l = 0; l < geometry_.layers; ++l) {
    float* score = pool_ == nullptr ? score_[l].as<float>() : nullptr;  // device: KvWrite zeroes
    for (int32_t h = 0; h < heads; ++h) {
      const size_t hi = HeadIndex(l, h);
      auto& f = free_[hi];
      int32_t* table = slot_pos_.data() + hi * capacity_;
      for (int32_t i = 0; i < n; ++i) {
        int32_t slot = f.back();
        f.pop_back();
        table[slot] = length_ + i;
        if (score != nullptr) score[static_cast<size_t>(h) * capacity_ + slot] = 0.f;
        new_slots_[hi * n + i] = slot;
        used_[l] = std::max(used_[l], slot + 1);
      }
      occupied_[hi] += n;
    }
  }
  last_n_ = n;
  length_ += n;
  if (pool_ == nullptr) return Status::Ok();
  int32_t used = 0;
  for (int32_t u : used_) used = std::max(used, u);
  DEJA_RETURN_IF_ERROR(EnsureBlocks(used));
  // Room for this step's victims: the same number for every head of every layer.
  int32_t most = 0;
  for (int32_t o : occupied_) most = std::max(most, o);
  const int32_t excess = policy_->budget() > 0 ? most - policy_->budget() : 0;
  if (excess > victim_cap_) {
    victim_cap_ = excess;
    DEJA_ASSIGN_OR_RETURN(victims_dev_, pool_->backend().Allocate(
                                            DType::kI32, {static_cast<int64_t>(geometry_.layers) *
                                                          geometry_.heads * victim_cap_}));
  }
  return Status::Ok();
}

Status SequenceKv::SeedPrefix(const std::vector<int32_t>& blocks, bool share) {
  if (pool_ == nullptr) return FailedPrecondition("a cached prefix needs a pooled KV cache");
  if (length_ != 0 || !blocks_.empty()) {
    return FailedPrecondition("a cached prefix starts only an empty KV cache");
  }
  const int64_t n = static_cast<int64_t>(blocks.size()) * pool_->block_slots();
  if (n > capacity_) {
    return OutOfRange("a cached prefix of " + std::to_string(n) +
                      " tokens exceeds the KV capacity of " + std::to_string(capacity_));
  }
  std::vector<int32_t> mine;
  if (share) {
    for (int32_t b : blocks) pool_->Retain(b);
    mine = blocks;
  } else {
    DEJA_RETURN_IF_ERROR(pool_->Take(static_cast<int32_t>(blocks.size()), &mine));
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (blocks[i] < 0) continue;  // SeedLoadedPrefix: the loader's
      if (Status st = pool_->CopyBlock(blocks[i], mine[i]); !st.ok()) {
        pool_->Give(mine);
        return st;
      }
    }
  }
  blocks_ = std::move(mine);
  if (Status st = pool_->backend().CopyHostToDevice(blocks_dev_.as<int32_t>(), blocks_.data(),
                                                    blocks_.size() * sizeof(int32_t));
      !st.ok()) {
    pool_->Give(blocks_);
    blocks_.clear();
    return st;
  }
  const int32_t len = static_cast<int32_t>(n);
  for (size_t hi = 0; hi < free_.size(); ++hi) {
    int32_t* table = slot_pos_.data() + hi * capacity_;
    for (int32_t s = 0; s < len; ++s) table[s] = s;
    free_[hi].resize(static_cast<size_t>(capacity_ - len));  // pops len, len + 1, ...
    occupied_[hi] = len;
  }
  used_.assign(geometry_.layers, len);
  length_ = len;
  return Status::Ok();
}

Status SequenceKv::SeedLoadedPrefix(const std::vector<int32_t>& blocks,
                                    std::unique_ptr<PrefixLoader> loader) {
  if (loader == nullptr) return InvalidArgument("a loaded prefix needs a loader");
  DEJA_RETURN_IF_ERROR(SeedPrefix(blocks, false));
  loader_ = std::move(loader);
  SetImportantPrefix(length_);
  return Status::Ok();
}

StatusOr<int64_t> SequenceKv::BytesToAppend(int32_t n) {
  if (pool_ == nullptr || n <= 0) return int64_t{0};
  DEJA_RETURN_IF_ERROR(FetchVictims());
  // The slots AppendPositions pops: the last n of each free list.
  int32_t used = 0;
  for (int32_t l = 0; l < geometry_.layers; ++l) {
    used = std::max(used, used_[l]);
    for (int32_t h = 0; h < geometry_.heads; ++h) {
      const auto& f = free_[HeadIndex(l, h)];
      if (static_cast<int32_t>(f.size()) < n) {
        return OutOfRange("appending " + std::to_string(n) + " tokens to a sequence of " +
                          std::to_string(length_) + " exceeds its KV capacity of " +
                          std::to_string(capacity_) + " slots per head");
      }
      for (auto it = f.end() - n; it != f.end(); ++it) used = std::max(used, *it + 1);
    }
  }
  const int64_t bs = pool_->block_slots();
  const int64_t need = (used + bs - 1) / bs - static_cast<int64_t>(blocks_.size());
  return std::max<int64_t>(0, need) * pool_->block_bytes();
}

Status SequenceKv::EnsureBlocks(int32_t slots) {
  const int32_t bs = pool_->block_slots();
  const size_t need = static_cast<size_t>((slots + bs - 1) / bs);
  const size_t have = blocks_.size();
  if (need <= have) return Status::Ok();
  DEJA_RETURN_IF_ERROR(pool_->Take(static_cast<int32_t>(need - have), &blocks_));
  return pool_->backend().CopyHostToDevice(blocks_dev_.as<int32_t>() + have, blocks_.data() + have,
                                           (need - have) * sizeof(int32_t));
}

Status SequenceKv::FetchVictims() {
  if (std::all_of(layer_excess_.begin(), layer_excess_.end(), [](int32_t e) { return e == 0; })) {
    return Status::Ok();
  }
  const int32_t heads = geometry_.heads;
  victims_.resize(static_cast<size_t>(geometry_.layers) * heads * victim_cap_);
  DEJA_RETURN_IF_ERROR(pool_->backend().CopyDeviceToHost(victims_.data(), victims_dev_.data(),
                                                         victims_.size() * sizeof(int32_t)));
  for (int32_t l = 0; l < geometry_.layers; ++l) {
    const int32_t e = layer_excess_[l];
    const int32_t* vl = victims_.data() + static_cast<size_t>(l) * heads * victim_cap_;
    for (int32_t h = 0; h < heads && e > 0; ++h) {
      const size_t hi = HeadIndex(l, h);
      for (int32_t j = 0; j < e; ++j) {
        const int32_t s = vl[h * e + j];
        if (s >= 0) {
          slot_pos_[hi * capacity_ + s] = -1;
          free_[hi].push_back(s);
        } else {  // fewer candidates than counted: the slot stayed
          ++occupied_[hi];
          --evictions_;
        }
      }
    }
    layer_excess_[l] = 0;
  }
  return Status::Ok();
}

Status SequenceKv::WriteLayer(int32_t layer, int32_t n, const float* k, const float* v,
                              const float* scores) {
  if (pool_ != nullptr) {
    if (n != last_n_) {
      return InvalidArgument("WriteLayer of " + std::to_string(n) + " tokens after appending " +
                             std::to_string(last_n_));
    }
    positions_.resize(n);
    for (int32_t i = 0; i < n; ++i) positions_[i] = length_ - n + i;
    const int64_t width = static_cast<int64_t>(geometry_.heads) * geometry_.head_dim;
    const Device dev = pool_->backend().device();
    TensorView kv{const_cast<float*>(k), DType::kF32, Shape{n, width}};
    kv.device = dev;
    TensorView vv{const_cast<float*>(v), DType::kF32, Shape{n, width}};
    vv.device = dev;
    return kernels::KvWrite(pool_->backend(), StoreView(layer), geometry_.heads, geometry_.head_dim,
                            new_slots_.data() + HeadIndex(layer, 0) * n, positions_.data(), n, kv,
                            vv, policy_->needs_scores() ? scores : nullptr);
  }
  const int32_t hd = geometry_.head_dim;
  const int64_t row = static_cast<int64_t>(geometry_.heads) * hd;
  const DType dt = geometry_.kv_dtype;
  const size_t row_bytes = geometry_.RowBytes();
  char* kc = static_cast<char*>(k_[layer].data());
  char* vc = static_cast<char*>(v_[layer].data());
  for (int32_t h = 0; h < geometry_.heads; ++h) {
    const int32_t* slots = new_slots_.data() + HeadIndex(layer, h) * last_n_;
    for (int32_t i = 0; i < n; ++i) {
      const int64_t dst = static_cast<int64_t>(h) * capacity_ + slots[i];
      KvRowFromF32(k + i * row + h * hd, hd, dt, kc + dst * row_bytes);
      KvRowFromF32(v + i * row + h * hd, hd, dt, vc + dst * row_bytes);
    }
  }
  if (scores != nullptr && policy_->needs_scores()) {
    float* sc = score_[layer].as<float>();
    for (int32_t h = 0; h < geometry_.heads; ++h) {
      const int32_t* slots = new_slots_.data() + HeadIndex(layer, h) * last_n_;
      for (int32_t i = 0; i < n; ++i) {
        sc[static_cast<int64_t>(h) * capacity_ + slots[i]] = scores[i * geometry_.heads + h];
      }
    }
  }
  return Status::Ok();
}

kernels::KvView SequenceKv::StoreView(int32_t layer) {
  if (pool_ != nullptr) {
    kernels::KvView view = pool_->LayerView(layer);
    view.blocks = blocks_dev_.as<int32_t>();
    view.capacity = capacity_;
    view.used = used_[layer];
    if (!policy_->needs_scores()) view.score = nullptr;
    return view;
  }
  kernels::KvView view;
  view.k = k_[layer].data();
  view.v = v_[layer].data();
  view.dtype = geometry_.kv_dtype;
  view.slot_pos = slot_pos_.data() + HeadIndex(layer, 0) * capacity_;
  view.capacity = capacity_;
  view.used = used_[layer];
  view.score = policy_->needs_scores() ? score_[layer].as<float>() : nullptr;
  return view;
}

kernels::KvView SequenceKv::View(int32_t layer) {
  kernels::KvView view = StoreView(layer);
  if (!policy_->accumulates_scores()) view.score = nullptr;
  return view;
}

bool SequenceKv::AtEvictionBoundary() const {
  return length_ >= evict_from_ || (evict_every_ > 0 && length_ % evict_every_ == 0);
}

bool SequenceKv::EvictsLayer(int32_t layer) const {
  if (policy_->budget() == 0 || !AtEvictionBoundary()) return false;
  const int32_t excess = std::max(0, occupied_[HeadIndex(layer, 0)] - policy_->budget());
  // Decayed scores (h2o's alternative) decay every step, evicting or not.
  const float decay = policy_->accumulates_scores() ? policy_->score_decay() : 1.0f;
  return excess > 0 || decay != 1.0f;
}

bool SequenceKv::PlanEviction(int32_t layer, kernels::KvEvictArgs* args, int32_t** victims) {
  if (pool_ == nullptr || !EvictsLayer(layer)) return false;
  const int32_t excess = std::max(0, occupied_[HeadIndex(layer, 0)] - policy_->budget());
  args->rank = policy_->kind() == CachePolicyKind::kWindow ? kernels::KvRank::kPosition
               : policy_->mean_score()                     ? kernels::KvRank::kMeanScore
                                                           : kernels::KvRank::kScore;
  args->excess = excess;
  args->oldest_recent = std::max(0, length_ - policy_->recent());
  args->length = length_;
  args->decay = policy_->accumulates_scores() ? policy_->score_decay() : 1.0f;
  *victims =
      victims_dev_.as<int32_t>() + static_cast<int64_t>(layer) * geometry_.heads * victim_cap_;
  for (int32_t h = 0; h < geometry_.heads; ++h) occupied_[HeadIndex(layer, h)] -= excess;
  evictions_ += static_cast<int64_t>(excess) * geometry_.heads;
  layer_excess_[layer] = excess;
  return true;
}

Status SequenceKv::EvictLayer(int32_t layer) {
  if (policy_->budget() == 0 || !AtEvictionBoundary()) return Status::Ok();
  if (pool_ != nullptr) {
    kernels::KvEvictArgs args;
    int32_t* victims = nullptr;
    if (!PlanEviction(layer, &args, &victims)) return Status::Ok();
    return kernels::KvEvict(pool_->backend(), StoreView(layer), geometry_.heads, args, victims);
  }
  float* score = score_[layer].as<float>();
  if (const float decay = policy_->score_decay(); decay != 1.0f) {
    // Older attention counts for less: the next step's probabilities add to decayed sums.
    for (int32_t h = 0; h < geometry_.heads; ++h) {
      float* row = score + static_cast<size_t>(h) * capacity_;
      for (int32_t s = 0; s < used_[layer]; ++s) row[s] *= decay;
    }
  }
  for (int32_t h = 0; h < geometry_.heads; ++h) {
    const size_t hi = HeadIndex(layer, h);
    if (occupied_[hi] <= policy_->budget()) continue;
    int32_t* table = slot_pos_.data() + hi * capacity_;
    float* head_score = score + static_cast<size_t>(h) * capacity_;
    HeadSlots head;
    head.slot_pos = {table, static_cast<size_t>(used_[layer])};
    head.score = {head_score, static_cast<size_t>(used_[layer])};
    head.occupied = occupied_[hi];
    head.length = length_;
    plan_.clear();
    policy_->Plan(head, &plan_);
    for (int32_t s : plan_) {
      table[s] = -1;
      head_score[s] = 0.f;
      free_[hi].push_back(s);
    }
    occupied_[hi] -= static_cast<int32_t>(plan_.size());
    evictions_ += static_cast<int64_t>(plan_.size());
  }
  return Status::Ok();
}

Status SequenceKv::Resize(int32_t capacity) {
  if (capacity <= 0) return InvalidArgument("kv capacity must be positive");
  for (int32_t o : occupied_) {
    if (o > capacity) {
      return OutOfRange("cannot shrink a KV cache holding " + std::to_string(o) +
                        " tokens per head to " + std::to_string(capacity) + " slots");
    }
  }
  if (pool_ != nullptr) {
    // A device cache keeps its slots (it holds only the blocks it has used); a host pool's cache
    // compacts in place and gives back the blocks it no longer reaches.
    if (!pool_->backend().device().is_host()) return Status::Ok();
    return CompactPooled(capacity);
  }
  const KvGeometry g = geometry_;
  std::vector<Tensor> old_k = std::move(k_), old_v = std::move(v_), old_score = std::move(score_);
  std::vector<int32_t> old_pos = std::move(slot_pos_);
  const int32_t old_cap = capacity_;
  capacity_ = capacity;
  DEJA_RETURN_IF_ERROR(Allocate());
  slot_pos_.assign(static_cast<size_t>(g.layers) * g.heads * capacity, -1);
  const size_t row = g.RowBytes();
  for (int32_t l = 0; l < g.layers; ++l) {
    int32_t used = 0;
    for (int32_t h = 0; h < g.heads; ++h) {
      const size_t hi = HeadIndex(l, h);
      int32_t dst = 0;
      for (int32_t s = 0; s < used_[l]; ++s) {
        int32_t pos = old_pos[hi * old_cap + s];
        if (pos < 0) continue;
        const size_t from = static_cast<size_t>(h) * old_cap + s;
        const size_t to = static_cast<size_t>(h) * capacity + dst;
        std::memcpy(static_cast<char*>(k_[l].data()) + to * row,
                    static_cast<const char*>(old_k[l].data()) + from * row, row);
        std::memcpy(static_cast<char*>(v_[l].data()) + to * row,
                    static_cast<const char*>(old_v[l].data()) + from * row, row);
        score_[l].as<float>()[to] = old_score[l].as<float>()[from];
        slot_pos_[hi * capacity + dst] = pos;
        ++dst;
      }
      auto& f = free_[hi];
      f.clear();
      for (int32_t s = capacity - 1; s >= dst; --s) f.push_back(s);
      used = std::max(used, dst);
    }
    used_[l] = used;
  }
  GiveAll(&old_k);
  GiveAll(&old_v);
  GiveAll(&old_score);
  return Status::Ok();
}

Status SequenceKv::CompactPooled(int32_t capacity) {
  DEJA_RETURN_IF_ERROR(FetchVictims());
  const KvGeometry& g = geometry_;
  const size_t row = g.RowBytes();
  std::vector<int32_t> table(static_cast<size_t>(g.layers) * g.heads * capacity, -1);
  int32_t most = 0;
  for (int32_t l = 0; l < g.layers; ++l) {
    const kernels::KvView view = View(l);
    char* k = static_cast<char*>(view.k);
    char* v = static_cast<char*>(view.v);
    int32_t* pos = const_cast<int32_t*>(view.slot_pos);
    float* score = pool_->LayerView(l).score;  // the pool's, whether or not the policy reads it
    int32_t used = 0;
    for (int32_t h = 0; h < g.heads; ++h) {
      const size_t hi = HeadIndex(l, h);
      // Occupied slots move down in slot order (to <= from, so in place), the rest empty.
      int32_t dst = 0;
      for (int32_t s = 0; s < used_[l]; ++s) {
        const int32_t p = slot_pos_[hi * capacity_ + s];
        if (p < 0) continue;
        if (s != dst) {
          const int64_t from = kernels::KvSlotIndex(view, h, s);
          const int64_t to = kernels::KvSlotIndex(view, h, dst);
          std::memcpy(k + to * row, k + from * row, row);
          std::memcpy(v + to * row, v + from * row, row);
          pos[to] = p;
          score[to] = score[from];
        }
        table[hi * capacity + dst] = p;
        ++dst;
      }
      for (int32_t s = dst; s < used_[l]; ++s) pos[kernels::KvSlotIndex(view, h, s)] = -1;
      auto& f = free_[hi];
      f.clear();
      for (int32_t s = capacity - 1; s >= dst; --s) f.push_back(s);
      used = std::max(used, dst);
    }
    used_[l] = used;
    most = std::max(most, used);
  }
  slot_pos_ = std::move(table);
  capacity_ = capacity;
  const size_t bs = static_cast<size_t>(pool_->block_slots());
  const size_t keep = (static_cast<size_t>(most) + bs - 1) / bs;
  if (keep < blocks_.size()) {
    pool_->Give(
        std::vector<int32_t>(blocks_.begin() + static_cast<std::ptrdiff_t>(keep), blocks_.end()));
    blocks_.resize(keep);
  }
  return Status::Ok();
}

}  // namespace deja::worker::kv
