// Per-sequence KV cache storage: for each layer and each local head, `capacity` slots of key and
// value (f32), a slot -> position table and an accumulated attention score per slot. Slot
// assignment belongs to the eviction policy; this class only stores and exposes views. With the
// full policy, slot == position.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"
#include "kernels/op_table.h"

namespace deja::worker {

struct KvGeometry {
  int32_t layers = 0;
  int32_t heads = 0;  // heads held by this rank
  int32_t head_dim = 0;
};

class SequenceKv {
 public:
  // Slots per head; fails with ResourceExhausted when the allocation is impossible.
  static StatusOr<std::unique_ptr<SequenceKv>> Create(const KvGeometry& geometry,
                                                       int32_t capacity);

  const KvGeometry& geometry() const { return geometry_; }
  int32_t capacity() const { return capacity_; }
  // Tokens appended so far (the next token's position).
  int32_t length() const { return length_; }
  size_t bytes() const;

  // Full policy: positions [length, length + n) take slots of the same index. OutOfRange when
  // the capacity would be exceeded.
  Status AppendPositions(int32_t n);
  // Writes the keys/values of the last-appended `n` tokens of one layer. k and v are f32
  // [n, heads * head_dim] (the projection's layout); they go to the tokens' slots per head.
  void WriteLayer(int32_t layer, int32_t n, const float* k, const float* v);
  kernels::KvView View(int32_t layer);

 private:
  SequenceKv(const KvGeometry& g, int32_t capacity);

  KvGeometry geometry_;
  int32_t capacity_;
  int32_t length_ = 0;
  int32_t used_ = 0;                 // slots [0, used_) are occupied
  std::vector<Tensor> k_, v_;        // per layer: [heads, capacity, head_dim]
  std::vector<Tensor> score_;        // per layer: [heads, capacity]
  std::vector<int32_t> slot_pos_;    // [heads, capacity], shared by layers under `full`
  std::vector<int32_t> new_slots_;   // slots of the last-appended tokens (head-major)
};

}  // namespace deja::worker
