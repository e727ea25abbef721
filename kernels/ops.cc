#include "kernels/ops.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>
#include <tuple>
#include <vector>

namespace deja::kernels {

namespace {

enum DTypeSet { kWeightDTypes, kFloatDTypes, kKvDTypes, kF32Only };

bool InSet(DTypeSet set, DType d) {
  switch (set) {
    case kWeightDTypes:
      return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16 || d == DType::kI8;
    case kFloatDTypes:
      return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16;
    case kKvDTypes:
      return d == DType::kF32 || d == DType::kF16;
    case kF32Only:
      return d == DType::kF32;
  }
  return false;
}

}  // namespace

bool SupportedByFullBackend(OpId op, DType dtype) {
  switch (op) {
#define DEJA_OP_DTYPES(id, member, fn, dtypes) \
  case OpId::id:                               \
    return InSet(dtypes, dtype);
    DEJA_KERNEL_OPS(DEJA_OP_DTYPES)
#undef DEJA_OP_DTYPES
    case OpId::kCount:
      break;
  }
  return false;
}

bool HasSlot(const OpTable& table, OpId op) {
  switch (op) {
#define DEJA_OP_HAS(id, member, fn, dtypes) \
  case OpId::id:                            \
    return table.member != nullptr;
    DEJA_KERNEL_OPS(DEJA_OP_HAS)
#undef DEJA_OP_HAS
    case OpId::kCount:
      break;
  }
  return false;
}

const char* OpName(OpId op) {
  switch (op) {
#define DEJA_OP_NAME(id, member, fn, dtypes) \
  case OpId::id:                             \
    return #member;
    DEJA_KERNEL_OPS(DEJA_OP_NAME)
#undef DEJA_OP_NAME
    case OpId::kCount:
      break;
  }
  return "?";
}

namespace {

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
// `id`. Matrices (rank 2) may be int8 with their scales; vectors (biases, LayerNorm) are floats.
Status CheckWeight(const char* op, const char* arg, const TensorView& v, int rank,
                   const Backend* backend = nullptr, OpId id = OpId::kCount) {
  DEJA_RETURN_IF_ERROR(CheckView(op, arg, v, rank, rank));
  if (v.dtype == DType::kI8 && rank == 2) {
    if (v.scale == nullptr) return Bad(op, arg, "is int8 without its scales (TensorView::scale)");
  } else if (!IsFloat(v.dtype)) {
    return Bad(op, arg,
               std::string("must be f32, f16 or bf16") +
                   (rank == 2 ? " (or int8 with scales)" : "") + ", is " + DTypeName(v.dtype));
  } else if (v.scale != nullptr) {
    return Bad(op, arg,
               std::string("has scales, which only int8 takes, but is ") + DTypeName(v.dtype));
  }
  if (v.numel() == 0) return Bad(op, arg, "is empty");
  if (v.layout == Layout::kTiled16) {
    if (backend == nullptr || !backend->SupportsTiled(id)) {
      return Bad(op, arg, "is tiled (kTiled16), which this op on this backend does not read");
    }
    if ((v.dtype != DType::kBF16 && v.dtype != DType::kI8) || rank != 2) {
      return Bad(
          op, arg,
          std::string("is tiled, which needs a 2-D bf16 or int8 matrix, is ") + DTypeName(v.dtype));
    }
  } else if (v.layout != Layout::kRowMajor) {
    return Bad(op, arg, "has an unknown layout");
  }
  return Status::Ok();
}

bool Overlap(const TensorView& a, const TensorView& b) {
  auto* a0 = static_cast<const char*>(a.data);
  auto* b0 = static_cast<const char*>(b.data);
  return a.bytes() > 0 && b.bytes() > 0 && a0 < b0 + b.bytes() && b0 < a0 + a.bytes();
}

Status CheckNoOverlap(const char* op, const char* out_arg, const TensorView& out,
                      const char* in_arg, const TensorView& in) {
  if (Overlap(out, in)) return Bad(op, out_arg, std::string("overlaps '") + in_arg + "'");
  return Status::Ok();
}

std::string MemoryOf(const Device& d) {
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

struct NamedView {
  const char* name;
  const TensorView& view;
};

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
                         (op == OpId::kAttention || op == OpId::kDecodeAttention ? "KV cache"
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
    TensorView cache{nullptr, kv.dtype, Shape{heads * kv.capacity, head_dim}};
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

}  // namespace

Status Embedding(Backend& backend, TensorView table, const int32_t* ids, int64_t n, bool accumulate,
                 TensorView out) {
  constexpr const char* kOp = "embedding";
  DEJA_RETURN_IF_ERROR(CheckDevices(backend, kOp, {{"table", table}, {"out", out}}));
  DEJA_RETURN_IF_ERROR(CheckWeight(kOp, "table", table, 2, &backend, OpId::kEmbedding));
  DEJA_RETURN_IF_ERROR(CheckActivation(kOp, "out", out));
  if (n < 0) return Bad(kOp, "n", "is negative");
  if (n > 0 && ids == nullptr) return Bad(kOp, "ids", "is null");
  if (out.rows() != n || out.cols() != table.cols()) {
    return Bad(kOp, "out", "has shape " + out.shape.ToString() + ", want " + Dims(n, table.cols()));
  }
  DEJA_RETURN_IF_ERROR(CheckNoOverlap(kOp, "out", out, "table", table));
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= table.rows()) {
      return Bad(kOp, "ids",
                 "holds " + std::to_string(ids[i]) + " at " + std::to_string(i) + ", outside [0, " +
                     std::to_string(table.rows()) + ")");
    }
  }
  DEJA_RETURN_IF_ERROR(CheckSupport(backend, OpId::kEmbedding, table.dtype,
                                    reinterpret_cast<const void*>(backend.ops().embedding)));
  if (n == 0) return Status::Ok();
  return backend.ops().embedding(backend, table, ids, n, accumulate, out);
}

Status LayerNorm(Backend& backend, TensorView x, TensorView gamma, TensorView beta, float eps,
                 TensorView out) {
  constexpr const char* kOp = "layer_norm";
  DEJA_RETURN_IF_ERROR(
      CheckDevices(backend, kOp, {{"x", x}, {"gamma", gamma}, {"beta", beta}, {"out", out}}));
  DEJA_RETURN_IF_ERROR(CheckActivation(kOp, "x", x));
  DEJA_RETURN_IF_ERROR(CheckActivation(kOp, "out", out));
  DEJA_RETURN_IF_ERROR(CheckWeight(kOp, "gamma", gamma, 1));
  DEJA_RETURN_IF_ERROR(CheckWeight(kOp, "beta", beta, 1));
  if (gamma.numel() != x.cols()) {
    return Bad(
        kOp, "gamma",
        "has " + std::to_string(gamma.numel()) + " elements, want " + std::to_string(x.cols()));
  }
  if (!(beta.shape == gamma.shape) || beta.dtype != gamma.dtype) {
    return Bad(kOp, "beta", "must match gamma's shape and dtype");
  }
  if (!(out.shape == x.shape)) {
    return Bad(kOp, "out", "has shape " + out.shape.ToString() + ", want " + x.shape.ToString());
  }
  if (out.data != x.data) DEJA_RETURN_IF_ERROR(CheckNoOverlap(kOp, "out", out, "x", x));
  if (!(eps > 0.f) || eps > 1.f) return Bad(kOp, "eps", "must be in (0, 1]");
  DEJA_RETURN_IF_ERROR(CheckSupport(backend, OpId::kLayerNorm, gamma.dtype,
                                    reinterpret_cast<const void*>(backend.ops().layer_norm)));
  if (x.numel() == 0) return Status::Ok();
  return backend.ops().layer_norm(backend, x, gamma, beta, eps, out);
}

Status Linear(Backend& backend, TensorView x, TensorView w, TensorView bias, Activation act,
              bool accumulate, TensorView out) {
  constexpr const char* kOp = "linear";
  DEJA_RETURN_IF_ERROR(
      CheckDevices(backend, kOp, {{"x", x}, {"w", w}, {"bias", bias}, {"out", out}}));
  DEJA_RETURN_IF_ERROR(CheckActivation(kOp, "x", x));
  DEJA_RETURN_IF_ERROR(CheckActivation(kOp, "out", out));
  DEJA_RETURN_IF_ERROR(CheckWeight(kOp, "w", w, 2, &backend, OpId::kLinear));
  int64_t n = w.shape[0], k = w.shape[1];
  if (x.cols() != k) {
    return Bad(kOp, "x",
               "has " + std::to_string(x.cols()) + " columns, w has K = " + std::to_string(k));
  }
  if (out.rows() != x.rows() || out.cols() != n) {
    return Bad(kOp, "out", "has shape " + out.shape.ToString() + ", want " + Dims(x.rows(), n));
  }
  if (bias.data != nullptr) {
    DEJA_RETURN_IF_ERROR(CheckWeight(kOp, "bias", bias, 1));
    if (bias.numel() != n) {
      return Bad(kOp, "bias",
                 "has " + std::to_string(bias.numel()) + " elements, want " + std::to_string(n));
    }
    DEJA_RETURN_IF_ERROR(CheckNoOverlap(kOp, "out", out, "bias", bias));
  }
  if (act != Activation::kNone && act != Activation::kRelu) {
    return Bad(kOp, "act", "is not a known activation");
  }
  DEJA_RETURN_IF_ERROR(CheckNoOverlap(kOp, "out", out, "x", x));
  DEJA_RETURN_IF_ERROR(CheckNoOverlap(kOp, "out", out, "w", w));
  DEJA_RETURN_IF_ERROR(CheckSupport(backend, OpId::kLinear, w.dtype,
                                    reinterpret_cast<const void*>(backend.ops().linear)));
  if (x.numel() == 0) return Status::Ok();
  return backend.ops().linear(backend, x, w, bias, act, accumulate, out);
}

Status GatherLinear(Backend& backend, TensorView x, TensorView w, TensorView bias,
                    const int32_t* rows, int64_t n_rows, Activation act, bool accumulate,
                    TensorView out) {
  constexpr const char* kOp = "gather_linear";
  DEJA_RETURN_IF_ERROR(
      CheckDevices(backend, kOp, {{"x", x}, {"w", w}, {"bias", bias}, {"out", out}}));
  DEJA_RETURN_IF_ERROR(CheckActivation(kOp, "x", x));
  DEJA_RETURN_IF_ERROR(CheckActivation(kOp, "out", out));
  DEJA_RETURN_IF_ERROR(CheckWeight(kOp, "w", w, 2));
  const int64_t r = w.shape[0], k = w.shape[1];
  if (x.cols() != k) {
    return Bad(kOp, "x",
               "has " + std::to_string(x.cols()) + " columns, w has K = " + std::to_string(k));
  }
  DEJA_RETURN_IF_ERROR(CheckRowIds(kOp, rows, n_rows, r, "w rows"));
  if (out.rows() != x.rows() || out.cols() != n_rows) {
    return Bad(kOp, "out",
               "has shape " + out.shape.ToString() + ", want " + Dims(x.rows(), n_rows));
  }
  if (bias.data != nullptr) {
    DEJA_RETURN_IF_ERROR(CheckWeight(kOp, "bias", bias, 1));
    if (bias.numel() != r) {
      return Bad(kOp, "bias",
                 "has " + std::to_string(bias.numel()) + " elements, want w's " +
                     std::to_string(r) + " rows");
    }
    DEJA_RETURN_IF_ERROR(CheckNoOverlap(kOp, "out", out, "bias", bias));
  }
  if (act != Activation::kNone && act != Activation::kRelu) {
    return Bad(kOp, "act", "is not a known activation");
  }
  DEJA_RETURN_IF_ERROR(CheckNoOverlap(kOp, "out", out, "x", x));
  DEJA_RETURN_IF_ERROR(CheckNoOverlap(kOp, "out", out, "w", w));
  DEJA_RETURN_IF_ERROR(CheckSupport(backend, OpId::kGatherLinear, w.dtype,
                                    reinterpret_cast<const void*>(backend.ops().gather_linear)));
  if (x.rows() == 0) return Status::Ok();
  return backend.ops().gather_linear(backend, x, w, bias, rows, n_rows, act, accumulate, out);
}

Status GatherLinearT(Backend& backend, TensorView x, TensorView wt, const int32_t* rows,
                     int64_t n_rows, bool accumulate, TensorView out) {
  constexpr const char* kOp = "gather_linear_t";
  DEJA_RETURN_IF_ERROR(CheckDevices(backend, kOp, {{"x", x}, {"wt", wt}, {"out", out}}));
  DEJA_RETURN_IF_ERROR(CheckActivation(kOp, "x", x));
  DEJA_RETURN_IF_ERROR(CheckActivation(kOp, "out", out));
  DEJA_RETURN_IF_ERROR(CheckWeight(kOp, "wt", wt, 2));
  const int64_t r = wt.shape[0], n = wt.shape[1];
  DEJA_RETURN_IF_ERROR(CheckRowIds(kOp, rows, n_rows, r, "wt rows"));
  if (x.cols() != n_rows) {
    return Bad(
        kOp, "x",
        "has " + std::to_string(x.cols()) + " columns, want n_rows = " + std::to_string(n_rows));
  }
  if (out.rows() != x.rows() || out.cols() != n) {
    return Bad(kOp, "out", "has shape " + out.shape.ToString() + ", want " + Dims(x.rows(), n));
  }
  DEJA_RETURN_IF_ERROR(CheckNoOverlap(kOp, "out", out, "x", x));
  DEJA_RETURN_IF_ERROR(CheckNoOverlap(kOp, "out", out, "wt", wt));
  DEJA_RETURN_IF_ERROR(CheckSupport(backend, OpId::kGatherLinearT, wt.dtype,
                                    reinterpret_cast<const void*>(backend.ops().gather_linear_t)));
  if (x.rows() == 0) return Status::Ok();
  return backend.ops().gather_linear_t(backend, x, wt, rows, n_rows, accumulate, out);
}

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

Status Add(Backend& backend, TensorView x, TensorView bias, TensorView out) {
  constexpr const char* kOp = "add";
  DEJA_RETURN_IF_ERROR(CheckDevices(backend, kOp, {{"x", x}, {"bias", bias}, {"out", out}}));
  DEJA_RETURN_IF_ERROR(CheckActivation(kOp, "x", x));
  DEJA_RETURN_IF_ERROR(CheckActivation(kOp, "out", out));
  if (!(out.shape == x.shape)) {
    return Bad(kOp, "out", "has shape " + out.shape.ToString() + ", want " + x.shape.ToString());
  }
  DEJA_RETURN_IF_ERROR(CheckNoOverlap(kOp, "out", out, "x", x));
  DType dtype = DType::kF32;
  if (bias.data != nullptr) {
    DEJA_RETURN_IF_ERROR(CheckWeight(kOp, "bias", bias, 1));
    if (bias.numel() != x.cols()) {
      return Bad(
          kOp, "bias",
          "has " + std::to_string(bias.numel()) + " elements, want " + std::to_string(x.cols()));
    }
    DEJA_RETURN_IF_ERROR(CheckNoOverlap(kOp, "out", out, "bias", bias));
    dtype = bias.dtype;
  }
  DEJA_RETURN_IF_ERROR(
      CheckSupport(backend, OpId::kAdd, dtype, reinterpret_cast<const void*>(backend.ops().add)));
  if (x.numel() == 0) return Status::Ok();
  return backend.ops().add(backend, x, bias, out);
}

Status LogSoftmax(Backend& backend, TensorView x, TensorView out) {
  constexpr const char* kOp = "log_softmax";
  DEJA_RETURN_IF_ERROR(CheckDevices(backend, kOp, {{"x", x}, {"out", out}}));
  DEJA_RETURN_IF_ERROR(CheckActivation(kOp, "x", x));
  DEJA_RETURN_IF_ERROR(CheckActivation(kOp, "out", out));
  if (!(out.shape == x.shape)) {
    return Bad(kOp, "out", "has shape " + out.shape.ToString() + ", want " + x.shape.ToString());
  }
  if (out.data != x.data) DEJA_RETURN_IF_ERROR(CheckNoOverlap(kOp, "out", out, "x", x));
  DEJA_RETURN_IF_ERROR(CheckSupport(backend, OpId::kLogSoftmax, DType::kF32,
                                    reinterpret_cast<const void*>(backend.ops().log_softmax)));
  if (x.numel() == 0) return Status::Ok();
  return backend.ops().log_softmax(backend, x, out);
}

Status TopK(Backend& backend, TensorView x, int32_t k, float* values, int32_t* indices) {
  constexpr const char* kOp = "top_k";
  DEJA_RETURN_IF_ERROR(CheckDevices(backend, kOp, {{"x", x}}));
  DEJA_RETURN_IF_ERROR(CheckActivation(kOp, "x", x));
  if (k < 1 || k > x.cols()) {
    return Bad(kOp, "k", std::to_string(k) + " is outside [1, " + std::to_string(x.cols()) + "]");
  }
  if (x.rows() > 0 && values == nullptr) return Bad(kOp, "values", "is null");
  if (x.rows() > 0 && indices == nullptr) return Bad(kOp, "indices", "is null");
  TensorView vals{values, DType::kF32, Shape{x.rows(), k}};
  TensorView idx{indices, DType::kI32, Shape{x.rows(), k}};
  DEJA_RETURN_IF_ERROR(CheckNoOverlap(kOp, "values", vals, "x", x));
  DEJA_RETURN_IF_ERROR(CheckNoOverlap(kOp, "indices", idx, "x", x));
  DEJA_RETURN_IF_ERROR(CheckNoOverlap(kOp, "indices", idx, "values", vals));
  DEJA_RETURN_IF_ERROR(CheckSupport(backend, OpId::kTopK, DType::kF32,
                                    reinterpret_cast<const void*>(backend.ops().top_k)));
  if (x.rows() == 0) return Status::Ok();
  return backend.ops().top_k(backend, x, k, values, indices);
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
  if (kv.k == nullptr) return Bad(kOp, "kv.k", "is null");
  if (kv.v == nullptr) return Bad(kOp, "kv.v", "is null");
  if (kv.slot_pos == nullptr) return Bad(kOp, "kv.slot_pos", "is null");
  if (!backend.SupportsPagedKv()) {
    return Bad(kOp, "kv", "is paged, but backend " + backend.name() +
                              " reads contiguous KV caches only");
  }
  if (kv.block_slots <= 0) return Bad(kOp, "kv.block_slots", "must be positive");
  if (kv.block_stride < static_cast<int64_t>(a.heads) * kv.block_slots) {
    return Bad(kOp, "kv.block_stride",
               std::to_string(kv.block_stride) + " is less than heads * block_slots = " +
                   std::to_string(static_cast<int64_t>(a.heads) * kv.block_slots));
  }
  if (a.max_blocks <= 0) return Bad(kOp, "max_blocks", "must be positive");
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

Status Convert(Backend& backend, TensorView src, TensorView dst) {
  constexpr const char* kOp = "convert";
  DEJA_RETURN_IF_ERROR(CheckDevices(backend, kOp, {{"src", src}, {"dst", dst}}));
  DEJA_RETURN_IF_ERROR(CheckView(kOp, "src", src, 1, 4));
  DEJA_RETURN_IF_ERROR(CheckView(kOp, "dst", dst, 1, 4));
  if (!IsFloat(src.dtype)) return Bad(kOp, "src", std::string("is ") + DTypeName(src.dtype));
  if (!IsFloat(dst.dtype)) return Bad(kOp, "dst", std::string("is ") + DTypeName(dst.dtype));
  if (src.layout != Layout::kRowMajor || dst.layout != Layout::kRowMajor) {
    return Bad(kOp, "src", "must be row-major, as dst");
  }
  if (src.numel() != dst.numel()) {
    return Bad(
        kOp, "dst",
        "has " + std::to_string(dst.numel()) + " elements, src " + std::to_string(src.numel()));
  }
  DEJA_RETURN_IF_ERROR(CheckNoOverlap(kOp, "dst", dst, "src", src));
  DEJA_RETURN_IF_ERROR(CheckSupport(backend, OpId::kConvert, dst.dtype,
                                    reinterpret_cast<const void*>(backend.ops().convert)));
  if (src.numel() == 0) return Status::Ok();
  return backend.ops().convert(backend, src, dst);
}

Status MaskUnits(Backend& backend, TensorView x, const uint8_t* keep, int32_t unit_width) {
  constexpr const char* kOp = "mask_units";
  DEJA_RETURN_IF_ERROR(CheckDevices(backend, kOp, {{"x", x}}));
  DEJA_RETURN_IF_ERROR(CheckView(kOp, "x", x, 2, 2));
  if (x.dtype != DType::kF32) return Bad(kOp, "x", std::string("is ") + DTypeName(x.dtype));
  if (x.layout != Layout::kRowMajor) return Bad(kOp, "x", "must be row-major");
  if (unit_width < 1 || x.cols() % unit_width != 0) {
    return Bad(kOp, "unit_width",
               std::to_string(unit_width) + " does not divide the " + std::to_string(x.cols()) +
                   " columns");
  }
  if (keep == nullptr && x.numel() > 0) return Bad(kOp, "keep", "is null");
  DEJA_RETURN_IF_ERROR(CheckSupport(backend, OpId::kMaskUnits, x.dtype,
                                    reinterpret_cast<const void*>(backend.ops().mask_units)));
  if (x.numel() == 0) return Status::Ok();
  return backend.ops().mask_units(backend, x, keep, unit_width);
}

}  // namespace deja::kernels
