#include "kernels/ops_check.h"

#include <algorithm>
#include <string>

#include "common/kv_row.h"

namespace deja::kernels::check {

Status Bad(const char* op, const char* arg, const std::string& why) {
  return InvalidArgument(std::string(op) + ": argument '" + arg + "' " + why);
}

bool IsFloat(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

// Every dimension positive (zero rows allowed for the leading one) and a data pointer whenever
// there are elements.
Status CheckView(const char* op, const char* arg, const TensorView& v, int min_rank, int max_rank) {
  if (v.shape.rank < min_rank || v.shape.rank > max_rank) {
    return Bad(op, arg,
               "has rank " + std::to_string(v.shape.rank) + ", want " + std::to_string(min_rank) +
                   ".." + std::to_string(max_rank));
  }
  for (int i = 0; i < v.shape.rank; ++i) {
    if (v.shape[i] < 0 || (i > 0 && v.shape[i] == 0)) {
      return Bad(op, arg, "has invalid shape " + v.shape.ToString());
    }
  }
  if (v.numel() > 0 && v.data == nullptr) return Bad(op, arg, "has a null data pointer");
  return Status::Ok();
}

Status CheckActivation(const char* op, const char* arg, const TensorView& v) {
  DEJA_RETURN_IF_ERROR(CheckView(op, arg, v, 1, 4));
  if (v.dtype != DType::kF32) {
    return Bad(op, arg, std::string("must be f32, is ") + DTypeName(v.dtype));
  }
  return Status::Ok();
}

// A weight: row-major, or kTiled16 (a 2-D bf16 or int8 matrix) where `backend` reads it for op
// `id`. Matrices (rank 2) may be int8 or int4 with their scales; vectors (biases, LayerNorm) are floats.
Status CheckWeight(const char* op, const char* arg, const TensorView& v, int rank,
                   const Backend* backend, OpId id) {
  DEJA_RETURN_IF_ERROR(CheckView(op, arg, v, rank, rank));
  if (v.dtype == DType::kI8 && rank == 2) {
    if (v.scale == nullptr) return Bad(op, arg, "is int8 without its scales (TensorView::scale)");
  } else if (v.dtype == DType::kI4 && rank == 2) {
    if (v.scale == nullptr) return Bad(op, arg, "is int4 without its scales (TensorView::scale)");
    if (v.scale_group <= 0 || v.scale_group % 8 != 0 || v.cols() % v.scale_group != 0) {
      return Bad(op, arg,
                 "is int4 with group " + std::to_string(v.scale_group) +
                     ", which must be a positive multiple of 8 dividing its " +
                     std::to_string(v.cols()) + " columns");
    }
    if (v.layout != Layout::kTiled16) return Bad(op, arg, "is int4, which must be tiled");
  } else if (!IsFloat(v.dtype)) {
    return Bad(op, arg,
               std::string("must be f32, f16 or bf16") +
                   (rank == 2 ? " (or int8 or int4 with scales)" : "") + ", is " + DTypeName(v.dtype));
  } else if (v.scale != nullptr) {
    return Bad(op, arg,
               std::string("has scales, which only int8 and int4 take, but is ") + DTypeName(v.dtype));
  }
  if (v.numel() == 0) return Bad(op, arg, "is empty");
  if (v.layout == Layout::kTiled16) {
    // int4 is tiled by definition (common/int4.h): a backend that takes int4 reads that layout.
    if (backend == nullptr || (v.dtype != DType::kI4 && !backend->SupportsTiled(id))) {
      return Bad(op, arg, "is tiled (kTiled16), which this op on this backend does not read");
    }
    if ((v.dtype != DType::kBF16 && v.dtype != DType::kI8 && v.dtype != DType::kI4) ||
        rank != 2) {
      return Bad(op, arg,
                 std::string("is tiled, which needs a 2-D bf16, int8 or int4 matrix, is ") +
                     DTypeName(v.dtype));
    }
  } else if (v.layout != Layout::kRowMajor) {
    return Bad(op, arg, "has an unknown layout");
  }
  return Status::Ok();
}

static bool Overlap(const TensorView& a, const TensorView& b) {
  auto* a0 = static_cast<const char*>(a.data);
  auto* b0 = static_cast<const char*>(b.data);
  return a.bytes() > 0 && b.bytes() > 0 && a0 < b0 + b.bytes() && b0 < a0 + a.bytes();
}

Status CheckNoOverlap(const char* op, const char* out_arg, const TensorView& out,
                      const char* in_arg, const TensorView& in) {
  if (Overlap(out, in)) return Bad(op, out_arg, std::string("overlaps '") + in_arg + "'");
  return Status::Ok();
}

static std::string MemoryOf(const Device& d) {
  return d.is_host() ? "host memory" : d.ToString() + " memory";
}

// Memory `backend` cannot reach is refused before anything reads it. A view without data (an
// absent bias) is in no memory.
Status CheckDevice(const Backend& backend, const Device& want, const char* op, const char* arg,
                   const void* data, const Device& d) {
  if (data == nullptr || d == want) return Status::Ok();
  return Bad(op, arg,
             "is in " + MemoryOf(d) + " but backend " + backend.name() + " takes tensors in " +
                 MemoryOf(want));
}

Status CheckDevices(const Backend& backend, const char* op, std::initializer_list<NamedView> args) {
  const Device want = backend.device();
  for (const NamedView& a : args) {
    DEJA_RETURN_IF_ERROR(CheckDevice(backend, want, op, a.name, a.view.data, a.view.device));
  }
  return Status::Ok();
}

Status CheckSupport(Backend& backend, OpId op, DType dtype, const void* fn) {
  if (fn == nullptr || !backend.Supports(op, dtype)) {
    return Unimplemented(std::string(OpName(op)) + ": backend " + backend.name() +
                         " does not support " +
                         (op == OpId::kAttention || op == OpId::kDecodeAttention || op == OpId::kDecodeEvict ? "KV cache"
                                                                                  : "weight") +
                         " dtype " + DTypeName(dtype));
  }
  return Status::Ok();
}

std::string Dims(int64_t r, int64_t c) { return Shape{r, c}.ToString(); }

// A KvView's pointers, sizes and layout (contiguous, or paged where the backend reads pages); a
// contiguous cache must not overlap `out` when given.
Status CheckKvLayout(const Backend& backend, const char* op, const KvView& kv, int64_t head_dim,
                     int64_t heads, const TensorView* out) {
  if (kv.capacity <= 0) return Bad(op, "kv.capacity", "must be positive");
  if (kv.used < 0 || kv.used > kv.capacity) {
    return Bad(op, "kv.used",
               std::to_string(kv.used) +
                   " is outside [0, capacity = " + std::to_string(kv.capacity) + "]");
  }
  if (kv.k == nullptr) return Bad(op, "kv.k", "is null");
  if (kv.v == nullptr) return Bad(op, "kv.v", "is null");
  if (kv.slot_pos == nullptr) return Bad(op, "kv.slot_pos", "is null");
  if (kv.blocks != nullptr) {
    if (!backend.SupportsPagedKv()) {
      return Bad(op, "kv.blocks",
                 "is set, but backend " + backend.name() + " reads contiguous KV caches only");
    }
    if (kv.block_slots <= 0) return Bad(op, "kv.block_slots", "must be positive when paged");
    if (kv.block_stride < heads * kv.block_slots) {
      return Bad(op, "kv.block_stride",
                 std::to_string(kv.block_stride) + " is less than heads * block_slots = " +
                     std::to_string(heads * kv.block_slots));
    }
    return Status::Ok();
  }
  if (out != nullptr) {
    TensorView cache{nullptr, kv.dtype, Shape{heads * kv.capacity, KvRowElems(kv.dtype, head_dim)}};
    cache.data = kv.k;
    DEJA_RETURN_IF_ERROR(CheckNoOverlap(op, "out", *out, "kv.k", cache));
    cache.data = kv.v;
    DEJA_RETURN_IF_ERROR(CheckNoOverlap(op, "out", *out, "kv.v", cache));
  }
  return Status::Ok();
}

// n_rows >= 1 and every rows[j] in [0, limit).
Status CheckRowIds(const char* op, const int32_t* rows, int64_t n_rows, int64_t limit,
                   const char* limit_name) {
  if (n_rows < 1) return Bad(op, "n_rows", std::to_string(n_rows) + " is below 1");
  if (rows == nullptr) return Bad(op, "rows", "is null");
  for (int64_t j = 0; j < n_rows; ++j) {
    if (rows[j] < 0 || rows[j] >= limit) {
      return Bad(op, "rows",
                 "holds " + std::to_string(rows[j]) + " at " + std::to_string(j) +
                     ", outside [0, " + limit_name + " = " + std::to_string(limit) + ")");
    }
  }
  return Status::Ok();
}

}  // namespace deja::kernels::check
