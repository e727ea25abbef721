#include "kernels/ops.h"
#include "kernels/ops_check.h"

#include "common/kv_row.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>
#include <vector>

namespace deja::kernels {

namespace {

enum DTypeSet { kLinearDTypes, kWeightDTypes, kFloatDTypes, kKvDTypes, kF32Only };

bool InSet(DTypeSet set, DType d) {
  switch (set) {
    case kLinearDTypes:
      return d == DType::kI4 || InSet(kWeightDTypes, d);
    case kWeightDTypes:
      return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16 || d == DType::kI8;
    case kFloatDTypes:
      return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16;
    case kKvDTypes:
      return IsKvDType(d);
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

using namespace check;


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
  return backend.ops().embedding(backend, table, ids, false, n, accumulate, out);
}

Status EmbeddingDeviceIds(Backend& backend, TensorView table, TensorView ids, bool accumulate,
                          TensorView out) {
  constexpr const char* kOp = "embedding";
  DEJA_RETURN_IF_ERROR(
      CheckDevices(backend, kOp, {{"table", table}, {"ids", ids}, {"out", out}}));
  DEJA_RETURN_IF_ERROR(CheckWeight(kOp, "table", table, 2, &backend, OpId::kEmbedding));
  DEJA_RETURN_IF_ERROR(CheckActivation(kOp, "out", out));
  if (ids.dtype != DType::kI32 || ids.shape.rank != 1) {
    return Bad(kOp, "ids", "must be i32 [n], got " + std::string(DTypeName(ids.dtype)) + " " +
                               ids.shape.ToString());
  }
  const int64_t n = ids.shape[0];
  if (n > 0 && ids.data == nullptr) return Bad(kOp, "ids", "is null");
  if (out.rows() != n || out.cols() != table.cols()) {
    return Bad(kOp, "out", "has shape " + out.shape.ToString() + ", want " + Dims(n, table.cols()));
  }
  DEJA_RETURN_IF_ERROR(CheckNoOverlap(kOp, "out", out, "table", table));
  DEJA_RETURN_IF_ERROR(CheckSupport(backend, OpId::kEmbedding, table.dtype,
                                    reinterpret_cast<const void*>(backend.ops().embedding)));
  if (n == 0) return Status::Ok();
  return backend.ops().embedding(backend, table, ids.as<int32_t>(), true, n, accumulate, out);
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
