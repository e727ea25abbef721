#include "worker/kv/kv_pool.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "worker/kv/kv_cache.h"

namespace deja::worker::kv {

int64_t KvBlockPool::BlockBytes(const KvGeometry& g, int32_t block_slots) {
  return static_cast<int64_t>(g.layers) * g.heads * block_slots *
         (2 * static_cast<int64_t>(g.RowBytes()) + 8);
}

StatusOr<std::shared_ptr<KvBlockPool>> KvBlockPool::Create(kernels::Backend* backend,
                                                           const KvGeometry& g, int32_t block_slots,
                                                           int64_t blocks) {
  if (backend == nullptr) return InvalidArgument("kv pool needs a backend");
  if (g.layers <= 0 || g.heads <= 0 || g.head_dim <= 0) {
    return InvalidArgument("kv pool geometry must be positive");
  }
  if (block_slots <= 0) return InvalidArgument("kv block size must be positive");
  if (blocks <= 0 || blocks > (int64_t{1} << 31) - 1) {
    return InvalidArgument("kv pool needs between 1 and 2^31 - 1 blocks, not " +
                           std::to_string(blocks));
  }
  std::shared_ptr<KvBlockPool> p(new KvBlockPool());
  p->backend_ = backend;
  p->layers_ = g.layers;
  p->heads_ = g.heads;
  p->head_dim_ = g.head_dim;
  p->kv_dtype_ = g.kv_dtype;
  p->block_slots_ = block_slots;
  p->total_ = blocks;
  p->block_bytes_ = BlockBytes(g, block_slots);
  p->block_stride_ = static_cast<int64_t>(g.layers) * g.heads * block_slots;
  const int64_t slots = p->block_stride_ * blocks;
  // Attention kernels index slots from the layer's base with int32 (the CPU's slot lists).
  if (slots > (int64_t{1} << 31) - 1) {
    return InvalidArgument("a KV pool of " + std::to_string(blocks) + " blocks has " +
                           std::to_string(slots) + " slots, more than 2^31 - 1");
  }
  auto fail = [&](const Status& st) {
    return ResourceExhausted("cannot allocate a KV pool of " + std::to_string(blocks) +
                             " blocks (" + std::to_string(p->block_bytes_ * blocks >> 20) +
                             " MiB) on " + backend->device().ToString() + ": " + st.ToString());
  };
  const int64_t row = KvRowElems(g.kv_dtype, g.head_dim);
  for (auto [t, dtype, cols] : {std::tuple{&p->k_, g.kv_dtype, row},
                                std::tuple{&p->v_, g.kv_dtype, row},
                                std::tuple{&p->score_, DType::kF32, int64_t{1}},
                                std::tuple{&p->pos_, DType::kI32, int64_t{1}}}) {
    StatusOr<Tensor> a = backend->Allocate(dtype, Shape{slots, cols});
    if (!a.ok()) return fail(a.status());
    *t = std::move(*a);
  }
  p->holders_.assign(static_cast<size_t>(blocks), 0);
  p->free_.reserve(static_cast<size_t>(blocks));
  for (int64_t b = blocks - 1; b >= 0; --b) p->free_.push_back(static_cast<int32_t>(b));
  return p;
}

int64_t KvBlockPool::free_blocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(free_.size());
}

Status KvBlockPool::Take(int32_t n, std::vector<int32_t>* out) {
  std::vector<int32_t> taken;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (n > static_cast<int32_t>(free_.size())) {
      return ResourceExhausted("the KV pool has " + std::to_string(free_.size()) + " of " +
                               std::to_string(total_) + " blocks free, " + std::to_string(n) +
                               " needed");
    }
    taken.assign(free_.end() - n, free_.end());
    free_.resize(free_.size() - n);
    for (int32_t b : taken) holders_[b] = 1;
  }
  // Every slot of a fresh block is empty: positions -1 (all bytes 0xff), in stream order after
  // the work that last read the block.
  const size_t pos_bytes = static_cast<size_t>(block_stride_) * sizeof(int32_t);
  for (int32_t b : taken) {
    Status st = backend_->Memset(pos_.as<int32_t>() + static_cast<int64_t>(b) * block_stride_, 0xff,
                                 pos_bytes);
    if (!st.ok()) {
      Give(taken);
      return st;
    }
  }
  out->insert(out->end(), taken.begin(), taken.end());
  return Status::Ok();
}

void KvBlockPool::Retain(int32_t block) {
  std::lock_guard<std::mutex> lock(mu_);
  CHECK(block >= 0 && block < total_ && holders_[block] > 0) << "retaining free block " << block;
  ++holders_[block];
}

void KvBlockPool::Give(const std::vector<int32_t>& blocks) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int32_t b : blocks) {
    CHECK(b >= 0 && b < total_ && holders_[b] > 0) << "giving back free block " << b;
    if (--holders_[b] == 0) free_.push_back(b);
  }
}

int32_t KvBlockPool::holders(int32_t block) const {
  std::lock_guard<std::mutex> lock(mu_);
  return block >= 0 && block < total_ ? holders_[block] : 0;
}

std::vector<std::pair<char*, int64_t>> KvBlockPool::Parts(int32_t block) const {
  const int64_t kv_row = SlotBytes(0);
  const int64_t b = block;
  return {{static_cast<char*>(k_.data()) + b * block_stride_ * kv_row, block_stride_ * kv_row},
          {static_cast<char*>(v_.data()) + b * block_stride_ * kv_row, block_stride_ * kv_row},
          {static_cast<char*>(score_.data()) + b * block_stride_ * 4, block_stride_ * 4},
          {static_cast<char*>(pos_.data()) + b * block_stride_ * 4, block_stride_ * 4}};
}

Status KvBlockPool::CopyOut(int32_t block, char* host) const {
  if (block < 0 || block >= total_) return InvalidArgument("no KV block " + std::to_string(block));
  for (const auto& [part, bytes] : Parts(block)) {
    DEJA_RETURN_IF_ERROR(backend_->CopyDeviceToHost(host, part, static_cast<size_t>(bytes)));
    host += bytes;
  }
  return Status::Ok();
}

Status KvBlockPool::CopyIn(int32_t block, const char* host) {
  if (block < 0 || block >= total_) return InvalidArgument("no KV block " + std::to_string(block));
  for (const auto& [part, bytes] : Parts(block)) {
    DEJA_RETURN_IF_ERROR(backend_->CopyHostToDevice(part, host, static_cast<size_t>(bytes)));
    host += bytes;
  }
  return Status::Ok();
}

Status KvBlockPool::CopyBlock(int32_t from, int32_t to) {
  std::vector<char> staging(static_cast<size_t>(block_bytes_));
  DEJA_RETURN_IF_ERROR(CopyOut(from, staging.data()));
  const auto parts = Parts(from);
  std::memset(staging.data() + parts[0].second + parts[1].second, 0,
              static_cast<size_t>(parts[2].second));
  return CopyIn(to, staging.data());
}

int64_t KvBlockPool::SlotBytes(int32_t part) const {
  return part < 2 ? static_cast<int64_t>(KvRowBytes(kv_dtype_, head_dim_)) : 4;
}

int64_t KvBlockPool::PartOffset(int32_t part, int32_t layer, int32_t head, int32_t slot) const {
  const int64_t kv_part = block_stride_ * SlotBytes(0);
  const int64_t starts[4] = {0, kv_part, 2 * kv_part, 2 * kv_part + block_stride_ * 4};
  const int64_t index = (static_cast<int64_t>(layer) * heads_ + head) * block_slots_ + slot;
  return starts[part] + index * SlotBytes(part);
}

Status KvBlockPool::WriteRanges(int32_t block, const std::vector<std::pair<size_t, size_t>>& ranges,
                                const char* packed) {
  if (block < 0 || block >= total_) return InvalidArgument("no KV block " + std::to_string(block));
  for (const auto& [offset, length] : ranges) {
    if (offset > static_cast<size_t>(block_bytes_) ||
        length > static_cast<size_t>(block_bytes_) - offset) {
      return InvalidArgument("KV block range [" + std::to_string(offset) + ", +" +
                             std::to_string(length) + ") is past its " +
                             std::to_string(block_bytes_) + " bytes");
    }
  }
  const auto parts = Parts(block);
  for (const auto& [offset, length] : ranges) {
    // A range may span parts: each piece goes to its part.
    size_t at = offset, left = length, part_start = 0;
    for (const auto& [part, bytes] : parts) {
      const size_t part_end = part_start + static_cast<size_t>(bytes);
      if (left > 0 && at < part_end) {
        const size_t n = std::min(left, part_end - at);
        DEJA_RETURN_IF_ERROR(backend_->CopyHostToDevice(part + (at - part_start), packed, n));
        packed += n;
        at += n;
        left -= n;
      }
      part_start = part_end;
    }
  }
  return Status::Ok();
}

kernels::KvView KvBlockPool::LayerView(int32_t layer) const {
  const int64_t offset = static_cast<int64_t>(layer) * heads_ * block_slots_;  // slots
  const int64_t row_bytes = SlotBytes(0);
  kernels::KvView v;
  v.k = static_cast<char*>(k_.data()) + offset * row_bytes;
  v.v = static_cast<char*>(v_.data()) + offset * row_bytes;
  v.slot_pos = pos_.as<int32_t>() + offset;
  v.score = score_.as<float>() + offset;
  v.dtype = kv_dtype_;
  v.device = backend_->device();
  v.block_slots = block_slots_;
  v.block_stride = block_stride_;
  return v;
}

}  // namespace deja::worker::kv
