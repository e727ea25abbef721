#include "worker/kv_cache.h"

#include <cstring>
#include <new>

namespace deja::worker {

SequenceKv::SequenceKv(const KvGeometry& g, int32_t capacity) : geometry_(g), capacity_(capacity) {}

StatusOr<std::unique_ptr<SequenceKv>> SequenceKv::Create(const KvGeometry& g, int32_t capacity) {
  if (g.layers <= 0 || g.heads <= 0 || g.head_dim <= 0 || capacity <= 0) {
    return InvalidArgument("kv cache geometry and capacity must be positive");
  }
  std::unique_ptr<SequenceKv> kv(new SequenceKv(g, capacity));
  try {
    for (int32_t l = 0; l < g.layers; ++l) {
      kv->k_.push_back(Tensor::Empty(DType::kF32, {g.heads, capacity, g.head_dim}));
      kv->v_.push_back(Tensor::Empty(DType::kF32, {g.heads, capacity, g.head_dim}));
      kv->score_.push_back(Tensor::Zeros(DType::kF32, {g.heads, capacity}));
    }
    kv->slot_pos_.assign(static_cast<size_t>(g.heads) * capacity, -1);
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("cannot allocate a KV cache of " + std::to_string(capacity) +
                             " slots");
  }
  return kv;
}

size_t SequenceKv::bytes() const {
  size_t per_layer = static_cast<size_t>(geometry_.heads) * capacity_ *
                     (2 * geometry_.head_dim + 1) * sizeof(float);
  return per_layer * geometry_.layers + slot_pos_.size() * sizeof(int32_t);
}

Status SequenceKv::AppendPositions(int32_t n) {
  if (n < 0 || length_ + n > capacity_) {
    return OutOfRange("sequence of " + std::to_string(length_ + n) +
                      " tokens exceeds its KV capacity of " + std::to_string(capacity_));
  }
  new_slots_.resize(static_cast<size_t>(geometry_.heads) * n);
  for (int32_t h = 0; h < geometry_.heads; ++h) {
    for (int32_t i = 0; i < n; ++i) {
      int32_t slot = length_ + i;
      slot_pos_[static_cast<size_t>(h) * capacity_ + slot] = length_ + i;
      new_slots_[static_cast<size_t>(h) * n + i] = slot;
    }
  }
  length_ += n;
  used_ = length_;
  return Status::Ok();
}

void SequenceKv::WriteLayer(int32_t layer, int32_t n, const float* k, const float* v) {
  const int32_t hd = geometry_.head_dim;
  const int64_t row = static_cast<int64_t>(geometry_.heads) * hd;
  float* kc = k_[layer].as<float>();
  float* vc = v_[layer].as<float>();
  for (int32_t h = 0; h < geometry_.heads; ++h) {
    for (int32_t i = 0; i < n; ++i) {
      int64_t slot = new_slots_[static_cast<size_t>(h) * n + i];
      int64_t dst = (static_cast<int64_t>(h) * capacity_ + slot) * hd;
      std::memcpy(kc + dst, k + i * row + h * hd, hd * sizeof(float));
      std::memcpy(vc + dst, v + i * row + h * hd, hd * sizeof(float));
    }
  }
}

kernels::KvView SequenceKv::View(int32_t layer) {
  kernels::KvView view;
  view.k = k_[layer].as<float>();
  view.v = v_[layer].as<float>();
  view.slot_pos = slot_pos_.data();
  view.capacity = capacity_;
  view.used = used_;
  view.score = score_[layer].as<float>();
  return view;
}

}  // namespace deja::worker
