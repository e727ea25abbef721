// The validating wrappers of the KV-cache ops (op_table.h): Attention, KvWrite, RetainScores,
// DecodeAttention and KvEvict.
#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/ops.h"
#include "kernels/ops_check.h"

namespace deja::kernels {

using namespace check;

Status Attention(Backend& backend, const AttentionArgs& args) {
  constexpr const char* kOp = "attention";
  DEJA_RETURN_IF_ERROR(CheckDevices(backend, kOp, {{"q", args.q}, {"out", args.out}}));
  DEJA_RETURN_IF_ERROR(
      CheckDevice(backend, backend.device(), kOp, "kv", args.kv.k, args.kv.device));
  DEJA_RETURN_IF_ERROR(CheckActivation(kOp, "q", args.q));
  DEJA_RETURN_IF_ERROR(CheckActivation(kOp, "out", args.out));
  if (args.heads <= 0) return Bad(kOp, "heads", "must be positive");
  // Heads the cache holds: with head_ids, cache_heads (the selected heads index into them, each
  // at most once so no two (token, head) workers share a score row); otherwise `heads`.
  int64_t cache_heads = args.heads;
  if (args.head_ids != nullptr) {
    if (args.cache_heads <= 0) return Bad(kOp, "cache_heads", "must be positive with head_ids");
    cache_heads = args.cache_heads;
    std::vector<bool> seen(static_cast<size_t>(cache_heads), false);
    for (int32_t i = 0; i < args.heads; ++i) {
      const int32_t id = args.head_ids[i];
      if (id < 0 || id >= cache_heads) {
        return Bad(kOp, "head_ids",
                   "holds " + std::to_string(id) + " at " + std::to_string(i) +
                       ", outside [0, cache_heads = " + std::to_string(cache_heads) + ")");
      }
      if (seen[id]) {
        return Bad(kOp, "head_ids", "holds " + std::to_string(id) + " twice");
      }
      seen[id] = true;
    }
  } else if (args.cache_heads != 0 && args.cache_heads != args.heads) {
    return Bad(kOp, "cache_heads",
               "is " + std::to_string(args.cache_heads) +
                   " without head_ids; want 0 or heads = " + std::to_string(args.heads));
  }
  if (args.head_dim <= 0) return Bad(kOp, "head_dim", "must be positive");
  if (!std::isfinite(args.scale)) return Bad(kOp, "scale", "must be finite");
  int64_t width = static_cast<int64_t>(args.heads) * args.head_dim;
  if (args.q.cols() != width) {
    return Bad(kOp, "q",
               "has " + std::to_string(args.q.cols()) + " columns, want heads * " +
                   "head_dim = " + std::to_string(width));
  }
  int64_t tokens = args.q.rows();
  if (!(args.out.shape == args.q.shape)) {
    return Bad(kOp, "out",
               "has shape " + args.out.shape.ToString() + ", want " + args.q.shape.ToString());
  }
  DEJA_RETURN_IF_ERROR(CheckNoOverlap(kOp, "out", args.out, "q", args.q));
  const KvView& kv = args.kv;
  if (tokens > 0 && args.q_pos == nullptr) return Bad(kOp, "q_pos", "is null");
  for (int64_t t = 0; t < tokens; ++t) {
    if (args.q_pos[t] < 0) {
      return Bad(kOp, "q_pos",
                 "holds " + std::to_string(args.q_pos[t]) + " at " + std::to_string(t));
    }
  }
  DEJA_RETURN_IF_ERROR(CheckKvLayout(backend, kOp, kv, args.head_dim, cache_heads, &args.out));
  DEJA_RETURN_IF_ERROR(CheckSupport(backend, OpId::kAttention, kv.dtype,
                                    reinterpret_cast<const void*>(backend.ops().attention)));
  if (tokens == 0) return Status::Ok();
  return backend.ops().attention(backend, args);
}

Status KvWrite(Backend& backend, const KvView& kv, int32_t heads, int32_t head_dim,
               const int32_t* slots, const int32_t* positions, int32_t n, TensorView k,
               TensorView v, const float* scores) {
  constexpr const char* kOp = "kv_write";
  DEJA_RETURN_IF_ERROR(CheckDevices(backend, kOp, {{"k", k}, {"v", v}}));
  DEJA_RETURN_IF_ERROR(CheckDevice(backend, backend.device(), kOp, "scores", scores, k.device));
  DEJA_RETURN_IF_ERROR(CheckDevice(backend, backend.device(), kOp, "kv", kv.k, kv.device));
  if (heads <= 0) return Bad(kOp, "heads", "must be positive");
  if (head_dim <= 0) return Bad(kOp, "head_dim", "must be positive");
  if (n < 0) return Bad(kOp, "n", "must not be negative");
  DEJA_RETURN_IF_ERROR(CheckKvLayout(backend, kOp, kv, head_dim, heads, nullptr));
  DEJA_RETURN_IF_ERROR(CheckActivation(kOp, "k", k));
  DEJA_RETURN_IF_ERROR(CheckActivation(kOp, "v", v));
  const int64_t width = static_cast<int64_t>(heads) * head_dim;
  for (const NamedView& a : {NamedView{"k", k}, NamedView{"v", v}}) {
    if (a.view.rows() != n || a.view.cols() != width) {
      return Bad(kOp, a.name, "has shape " + a.view.shape.ToString() + ", want " + Dims(n, width));
    }
  }
  if (n == 0) return Status::Ok();
  if (slots == nullptr) return Bad(kOp, "slots", "is null");
  if (positions == nullptr) return Bad(kOp, "positions", "is null");
  for (int64_t i = 0; i < static_cast<int64_t>(heads) * n; ++i) {
    if (slots[i] < 0 || slots[i] >= kv.used) {
      return Bad(kOp, "slots",
                 "holds " + std::to_string(slots[i]) + " at " + std::to_string(i) +
                     ", outside [0, used = " + std::to_string(kv.used) + ")");
    }
  }
  // Each head's slots distinct: two tokens in one slot would leave which one stays undefined.
  // O(n log n) per head, nothing for a decode step's single token (this runs every layer).
  if (n > 1) {
    thread_local std::vector<int32_t> sorted;
    for (int32_t h = 0; h < heads; ++h) {
      const int32_t* head_slots = slots + static_cast<int64_t>(h) * n;
      sorted.assign(head_slots, head_slots + n);
      std::sort(sorted.begin(), sorted.end());
      const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
      if (dup != sorted.end()) {
        return Bad(kOp, "slots",
                   "holds " + std::to_string(*dup) + " twice for head " + std::to_string(h));
      }
    }
  }
  for (int32_t i = 0; i < n; ++i) {
    if (positions[i] < 0) {
      return Bad(kOp, "positions",
                 "holds " + std::to_string(positions[i]) + " at " + std::to_string(i));
    }
  }
  DEJA_RETURN_IF_ERROR(CheckSupport(backend, OpId::kKvWrite, kv.dtype,
                                    reinterpret_cast<const void*>(backend.ops().kv_write)));
  return backend.ops().kv_write(backend, kv, heads, head_dim, slots, positions, n, k, v, scores);
}

Status RetainScores(Backend& backend, const RetainArgs& a) {
  constexpr const char* kOp = "retain_scores";
  if (a.n < 0) return Bad(kOp, "n", "must not be negative");
  if (a.heads <= 0) return Bad(kOp, "heads", "must be positive");
  if (a.head_dim <= 0) return Bad(kOp, "head_dim", "must be positive");
  if (a.hidden <= 0) return Bad(kOp, "hidden", "must be positive");
  const int64_t width = static_cast<int64_t>(a.heads) * a.head_dim;
  if (a.row_stride < width) {
    return Bad(kOp, "row_stride",
               "is " + std::to_string(a.row_stride) +
                   ", less than heads * head_dim = " + std::to_string(width));
  }
  const std::pair<const char*, const void*> ptrs[] = {{"q", a.q},   {"k", a.k},    {"v", a.v},
                                                      {"w1", a.w1}, {"b1", a.b1},  {"w2", a.w2},
                                                      {"b2", a.b2}, {"out", a.out}};
  for (const auto& [name, ptr] : ptrs) {
    if (ptr == nullptr) return Bad(kOp, name, "is null");
    DEJA_RETURN_IF_ERROR(CheckDevice(backend, backend.device(), kOp, name, ptr, a.device));
  }
  DEJA_RETURN_IF_ERROR(CheckSupport(backend, OpId::kRetainScores, DType::kF32,
                                    reinterpret_cast<const void*>(backend.ops().retain_scores)));
  if (a.n == 0) return Status::Ok();
  return backend.ops().retain_scores(backend, a);
}

// A decode step's pool layer: its pointers (kv.v only where the op reads values), the backend's
// paged reads, the block geometry and the block-table width.
static Status CheckDecodePool(const Backend& backend, const char* kOp, const KvView& kv,
                              int32_t heads, int32_t max_blocks, bool values) {
  if (kv.k == nullptr) return Bad(kOp, "kv.k", "is null");
  if (values && kv.v == nullptr) return Bad(kOp, "kv.v", "is null");
  if (kv.slot_pos == nullptr) return Bad(kOp, "kv.slot_pos", "is null");
  if (!backend.SupportsPagedKv()) {
    return Bad(kOp, "kv", "is paged, but backend " + backend.name() +
                              " reads contiguous KV caches only");
  }
  if (kv.block_slots <= 0) return Bad(kOp, "kv.block_slots", "must be positive");
  if (kv.block_stride < static_cast<int64_t>(heads) * kv.block_slots) {
    return Bad(kOp, "kv.block_stride",
               std::to_string(kv.block_stride) + " is less than heads * block_slots = " +
                   std::to_string(static_cast<int64_t>(heads) * kv.block_slots));
  }
  if (max_blocks <= 0) return Bad(kOp, "max_blocks", "must be positive");
  return Status::Ok();
}

Status DecodeAttention(Backend& backend, const DecodeAttentionArgs& a) {
  constexpr const char* kOp = "decode_attention";
  if (a.seqs < 0) return Bad(kOp, "seqs", "must not be negative");
  if (a.heads <= 0) return Bad(kOp, "heads", "must be positive");
  if (a.head_dim <= 0) return Bad(kOp, "head_dim", "must be positive");
  if (!std::isfinite(a.scale)) return Bad(kOp, "scale", "must be finite");
  const int64_t width = static_cast<int64_t>(a.heads) * a.head_dim;
  if (a.q_stride < width) {
    return Bad(kOp, "q_stride",
               std::to_string(a.q_stride) + " is less than heads * head_dim = " +
                   std::to_string(width));
  }
  if (a.kv_stride < width) {
    return Bad(kOp, "kv_stride",
               std::to_string(a.kv_stride) + " is less than heads * head_dim = " +
                   std::to_string(width));
  }
  const KvView& kv = a.kv;
  DEJA_RETURN_IF_ERROR(CheckDecodePool(backend, kOp, kv, a.heads, a.max_blocks, true));
  const int64_t most = static_cast<int64_t>(a.max_blocks) * kv.block_slots;
  if (a.max_used < 0 || a.max_used > most) {
    return Bad(kOp, "max_used",
               std::to_string(a.max_used) + " is outside [0, max_blocks * block_slots = " +
                   std::to_string(most) + "]");
  }
  const Device want = backend.device();
  const std::pair<const char*, const void*> ptrs[] = {
      {"q", a.q},         {"k", a.k},           {"v", a.v},         {"out", a.out},
      {"q_pos", a.q_pos}, {"used", a.used},     {"slots", a.slots}, {"flags", a.flags},
      {"blocks", a.blocks}};
  for (const auto& [name, ptr] : ptrs) {
    if (a.seqs > 0 && ptr == nullptr) return Bad(kOp, name, "is null");
    DEJA_RETURN_IF_ERROR(CheckDevice(backend, want, kOp, name, ptr, a.device));
  }
  DEJA_RETURN_IF_ERROR(CheckDevice(backend, want, kOp, "kv", kv.k, kv.device));
  // The floats each strided input spans: (seqs - 1) strides and one row.
  const auto span = [&](int64_t stride) { return a.seqs > 0 ? (a.seqs - 1) * stride + width : 0; };
  const TensorView out{a.out, DType::kF32, Shape{a.seqs * width}};
  for (const auto& [name, ptr, stride] : {std::tuple{"q", a.q, a.q_stride},
                                          std::tuple{"k", a.k, a.kv_stride},
                                          std::tuple{"v", a.v, a.kv_stride}}) {
    const TensorView x{const_cast<float*>(ptr), DType::kF32, Shape{span(stride)}};
    DEJA_RETURN_IF_ERROR(CheckNoOverlap(kOp, "out", out, name, x));
  }
  DEJA_RETURN_IF_ERROR(CheckSupport(backend, OpId::kDecodeAttention, kv.dtype,
                                    reinterpret_cast<const void*>(backend.ops().decode_attention)));
  if (a.seqs == 0) return Status::Ok();
  return backend.ops().decode_attention(backend, a);
}

Status KvEvict(Backend& backend, const KvView& kv, int32_t heads, const KvEvictArgs& args,
               int32_t* victims) {
  constexpr const char* kOp = "kv_evict";
  DEJA_RETURN_IF_ERROR(CheckDevice(backend, backend.device(), kOp, "kv", kv.k, kv.device));
  if (heads <= 0) return Bad(kOp, "heads", "must be positive");
  DEJA_RETURN_IF_ERROR(CheckKvLayout(backend, kOp, kv, 1, heads, nullptr));
  if (!(args.decay > 0.f && args.decay <= 1.f)) return Bad(kOp, "decay", "must be in (0, 1]");
  if (args.excess < (args.decay != 1.f ? 0 : 1)) {
    return Bad(kOp, "excess", "must be at least 1 (0 only with a decay)");
  }
  if (args.decay != 1.f && kv.score == nullptr) {
    return Bad(kOp, "kv.score", "is null, but decay multiplies scores");
  }
  if (args.length < 0 || args.oldest_recent > args.length) {
    return Bad(
        kOp, "oldest_recent",
        std::to_string(args.oldest_recent) + " is past the length " + std::to_string(args.length));
  }
  if (args.rank != KvRank::kPosition && kv.score == nullptr) {
    return Bad(kOp, "kv.score", "is null, but the rank reads scores");
  }
  // With nothing to evict (a decay alone) no victim is written: a cache that never evicted
  // has no victim buffer.
  if (victims == nullptr && args.excess > 0) return Bad(kOp, "victims", "is null");
  DEJA_RETURN_IF_ERROR(CheckSupport(backend, OpId::kKvEvict, kv.dtype,
                                    reinterpret_cast<const void*>(backend.ops().kv_evict)));
  return backend.ops().kv_evict(backend, kv, heads, args, victims);
}

Status DecodeEvict(Backend& backend, const DecodeEvictArgs& a) {
  constexpr const char* kOp = "decode_evict";
  if (a.seqs < 0) return Bad(kOp, "seqs", "must not be negative");
  if (a.heads <= 0) return Bad(kOp, "heads", "must be positive");
  const KvView& kv = a.kv;
  DEJA_RETURN_IF_ERROR(CheckDecodePool(backend, kOp, kv, a.heads, a.max_blocks, false));
  const Device want = backend.device();
  const std::pair<const char*, const void*> ptrs[] = {
      {"used", a.used}, {"blocks", a.blocks}, {"params", a.params}};
  for (const auto& [name, ptr] : ptrs) {
    if (a.seqs > 0 && ptr == nullptr) return Bad(kOp, name, "is null");
    DEJA_RETURN_IF_ERROR(CheckDevice(backend, want, kOp, name, ptr, a.device));
  }
  DEJA_RETURN_IF_ERROR(CheckDevice(backend, want, kOp, "kv", kv.k, kv.device));
  DEJA_RETURN_IF_ERROR(CheckSupport(backend, OpId::kDecodeEvict, kv.dtype,
                                    reinterpret_cast<const void*>(backend.ops().decode_evict)));
  if (a.seqs == 0) return Status::Ok();
  return backend.ops().decode_evict(backend, a);
}

}  // namespace deja::kernels
