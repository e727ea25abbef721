// Paged copies of contiguous KV caches for the comparison tests: a case is written once as a
// contiguous [heads][capacity] cache (the reference's ground truth) and scattered into a pool of
// blocks through a randomly permuted block table, in layer 1 of 2 (so the view's pointers are
// offset into the pool and the block stride spans layers). The pool's other layer and spare
// blocks hold garbage that an op must leave alone. Also the views themselves.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "common/tensor.h"
#include "kernels/op_table.h"
#include "tests/kernels/kernel_test_util.h"

namespace deja::kernels::testing {

struct PagedLayout {
  int32_t heads = 0, capacity = 0, block_slots = 0;
  int32_t layers = 2, layer = 1;
  std::vector<int32_t> blocks;  // the table: ceil(capacity / block_slots) distinct pool blocks
  int32_t pool_blocks = 0;

  int64_t block_stride() const { return static_cast<int64_t>(layers) * heads * block_slots; }
  // Slots from the pool's start to this layer's part of a block.
  int64_t layer_offset() const { return static_cast<int64_t>(layer) * heads * block_slots; }
  int64_t pool_slots() const { return pool_blocks * block_stride(); }
  // Slot s of head h, counted from the pool's start (KvSlotIndex plus the layer's offset).
  int64_t At(int64_t h, int64_t s) const {
    return blocks[s / block_slots] * block_stride() + layer_offset() + h * block_slots +
           s % block_slots;
  }
};

// A table over `spare` more pool blocks than it needs, in random order.
inline PagedLayout RandomPagedLayout(std::mt19937& rng, int32_t heads, int32_t capacity,
                                     int32_t block_slots, int32_t spare = 3) {
  PagedLayout l;
  l.heads = heads;
  l.capacity = capacity;
  l.block_slots = block_slots;
  const int32_t table = (capacity + block_slots - 1) / block_slots;
  l.pool_blocks = table + spare;
  std::vector<int32_t> ids(l.pool_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  l.blocks.assign(ids.begin(), ids.begin() + table);
  return l;
}

// Head-sparse attention's head_ids: `heads` distinct cache heads of `cache_heads`, in random order.
inline std::vector<int32_t> RandomHeadIds(std::mt19937& rng, int32_t cache_heads, int32_t heads) {
  std::vector<int32_t> ids(cache_heads);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(heads);
  return ids;
}

// The pool copy of `contiguous` ([heads * capacity, per_slot] elements of its dtype): `pool`
// (garbage of the pool's size and the same dtype) with the cache's slots scattered in.
inline Tensor Scatter(const PagedLayout& l, const Tensor& contiguous, const Tensor& pool) {
  Tensor out = CopyOf(pool);
  const int64_t per_slot = contiguous.numel() / (static_cast<int64_t>(l.heads) * l.capacity);
  const size_t row = static_cast<size_t>(per_slot) * DTypeSize(contiguous.dtype());
  for (int64_t h = 0; h < l.heads; ++h) {
    for (int64_t s = 0; s < l.capacity; ++s) {
      std::memcpy(static_cast<char*>(out.data()) + l.At(h, s) * row,
                  static_cast<const char*>(contiguous.data()) + (h * l.capacity + s) * row, row);
    }
  }
  return out;
}

// The contiguous cache read back out of a pool (the inverse of Scatter), shaped as `like`.
inline Tensor Gather(const PagedLayout& l, const Tensor& pool, const Tensor& like) {
  Tensor out = Tensor::Empty(like.dtype(), like.shape());
  const int64_t per_slot = like.numel() / (static_cast<int64_t>(l.heads) * l.capacity);
  const size_t row = static_cast<size_t>(per_slot) * DTypeSize(like.dtype());
  for (int64_t h = 0; h < l.heads; ++h) {
    for (int64_t s = 0; s < l.capacity; ++s) {
      std::memcpy(static_cast<char*>(out.data()) + (h * l.capacity + s) * row,
                  static_cast<const char*>(pool.data()) + l.At(h, s) * row, row);
    }
  }
  return out;
}

// Garbage of a pool's size for a cache tensor shaped as `like` (random bits of the dtype's range:
// random floats, or random ints for slot positions).
inline Tensor GarbagePool(std::mt19937& rng, const PagedLayout& l, const Tensor& like) {
  const int64_t per_slot = like.numel() / (static_cast<int64_t>(l.heads) * l.capacity);
  if (like.dtype() == DType::kI32) {
    Tensor t = Tensor::Empty(DType::kI32, {l.pool_slots() * per_slot});
    for (int64_t i = 0; i < t.numel(); ++i) t.as<int32_t>()[i] = static_cast<int32_t>(rng() % 97);
    return t;
  }
  const Shape shape =
      like.shape().rank == 1 ? Shape{l.pool_slots() * per_slot} : Shape{l.pool_slots(), per_slot};
  return RandomTensor(rng, like.dtype(), shape, 40.f, 50.f);
}

// The tensors of one cache on a backend: k, v, slot_pos, score (each may be empty) and, when
// paged, the block table.
struct KvOnBackend {
  Tensor k, v, slot_pos, score, blocks;
};

// A view of `t` (copies made by the caller on the backend): contiguous when `paged` is null, else
// the pool layout's layer, with `t.blocks` as the table.
inline KvView ViewOf(const KvOnBackend& t, int32_t capacity, int32_t used, DType dtype,
                     int64_t head_dim, const PagedLayout* paged) {
  KvView kv;
  kv.capacity = capacity;
  kv.used = used;
  kv.dtype = dtype;
  kv.device = t.slot_pos.device();
  const int64_t offset = paged != nullptr ? paged->layer_offset() : 0;
  auto at = [offset](const Tensor& x, int64_t per_slot) -> void* {
    if (x.data() == nullptr) return nullptr;
    return static_cast<char*>(x.data()) +
           offset * per_slot * static_cast<int64_t>(DTypeSize(x.dtype()));
  };
  kv.k = at(t.k, KvRowElems(dtype, head_dim));
  kv.v = at(t.v, KvRowElems(dtype, head_dim));
  kv.slot_pos = static_cast<const int32_t*>(at(t.slot_pos, 1));
  kv.score = static_cast<float*>(at(t.score, 1));
  if (paged != nullptr) {
    kv.blocks = t.blocks.as<int32_t>();
    kv.block_slots = paged->block_slots;
    kv.block_stride = paged->block_stride();
  }
  return kv;
}

// Copies a case's host tensors to `b`, scattered into pools when `paged` is set (garbage drawn
// from `rng`); an empty input stays empty. `pools`, when given, receives the four host copies
// (what an op that writes nothing would leave).
inline StatusOr<KvOnBackend> KvToBackend(Backend& b, std::mt19937& rng, const PagedLayout* paged,
                                         const Tensor& k, const Tensor& v, const Tensor& slot_pos,
                                         const Tensor& score, Tensor* pools = nullptr) {
  KvOnBackend out;
  const Tensor* in[4] = {&k, &v, &slot_pos, &score};
  Tensor* dst[4] = {&out.k, &out.v, &out.slot_pos, &out.score};
  for (int i = 0; i < 4; ++i) {
    if (in[i]->data() == nullptr) continue;
    Tensor host = paged != nullptr ? Scatter(*paged, *in[i], GarbagePool(rng, *paged, *in[i]))
                                   : CopyOf(*in[i]);
    DEJA_ASSIGN_OR_RETURN(*dst[i], b.ToBackend(host));
    if (pools != nullptr) pools[i] = std::move(host);
  }
  if (paged != nullptr) {
    Tensor table = Tensor::Empty(DType::kI32, {static_cast<int64_t>(paged->blocks.size())});
    std::copy(paged->blocks.begin(), paged->blocks.end(), table.as<int32_t>());
    DEJA_ASSIGN_OR_RETURN(out.blocks, b.ToBackend(table));
  }
  return out;
}

}  // namespace deja::kernels::testing
