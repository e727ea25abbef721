#include "worker/model/opt_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include <glog/logging.h>

#include "common/int4.h"
#include "common/quantize.h"
#include "common/vec_math.h"
#include "worker/model/quantize_checkpoint.h"

namespace deja::worker::model {
namespace {

TensorView Slice1D(TensorView v, int64_t begin, int64_t end) {
  if (v.data == nullptr) return v;
  v.data = static_cast<char*>(v.data) + begin * DTypeSize(v.dtype);
  v.shape = Shape{end - begin};
  return v;
}

// Copies columns [begin, end) of a [rows, cols] matrix (row-parallel shard).
Tensor CopyColumns(TensorView w, int64_t begin, int64_t end) {
  const int64_t rows = w.shape[0], cols = w.shape[1], n = end - begin;
  const size_t es = DTypeSize(w.dtype);
  Tensor t = Tensor::Empty(w.dtype, {rows, n});
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(static_cast<char*>(t.data()) + r * n * es,
                static_cast<const char*>(w.data) + (r * cols + begin) * es, n * es);
  }
  return t;
}

// A vector (bias, LayerNorm, positions): a float dtype.
StatusOr<TensorView> GetVector(const Checkpoint& ckpt, const std::string& name,
                               const Shape& shape) {
  DEJA_ASSIGN_OR_RETURN(TensorView v, ckpt.Get(name, shape));
  if (v.dtype == DType::kI8 || v.dtype == DType::kU8) {
    return InvalidArgument("tensor '" + name + "' is " +
                           (v.dtype == DType::kI8 ? "int8" : "packed int4 (U8)") +
                           "; only matrices may be quantized");
  }
  return v;
}

StatusOr<TensorView> GetOptional(const Checkpoint& ckpt, const std::string& name,
                                 const Shape& shape) {
  if (name.empty()) return TensorView{};
  return GetVector(ckpt, name, shape);
}

// int4 (deja quantize --bits 4): u8 [rows, cols / 2] and f32 scales [rows, cols / group], the
// checkpoint's form (common/quantize.h); the view returned has dtype kI4, layout kRowMajor, the
// scales and the group attached: a source for TileInt4Rows, which no kernel reads.
StatusOr<TensorView> GetInt4Matrix(const Checkpoint& ckpt, const std::string& name,
                                   const Shape& shape) {
  if (shape[1] % 2 != 0) {
    return InvalidArgument("tensor '" + name + "' is packed int4 (U8) but has an odd number of "
                           "columns, " + std::to_string(shape[1]));
  }
  DEJA_ASSIGN_OR_RETURN(TensorView w, ckpt.Get(name, Shape{shape[0], shape[1] / 2}));
  const std::string scale_name = ScaleTensorName(name);
  const TensorInfo* s = ckpt.Find(scale_name);
  if (s == nullptr) {
    return InvalidArgument("int4 tensor '" + name + "' has no '" + scale_name + "'");
  }
  const int64_t groups = s->shape.rank == 2 ? s->shape[1] : 0;
  if (s->shape.rank != 2 || s->shape[0] != shape[0] || groups <= 0 || shape[1] % groups != 0 ||
      (shape[1] / groups) % 8 != 0) {
    return InvalidArgument("tensor '" + scale_name + "' has shape " + s->shape.ToString() +
                           "; the scales of int4 tensor '" + name + "' [" +
                           std::to_string(shape[0]) + ", " + std::to_string(shape[1]) +
                           "] are [rows, groups], groups of a multiple of 8 columns");
  }
  DEJA_ASSIGN_OR_RETURN(TensorView scale, ckpt.Get(scale_name, s->shape));
  if (scale.dtype != DType::kF32) {
    return InvalidArgument("tensor '" + scale_name + "' must be F32, is " + DTypeName(scale.dtype));
  }
  const float* sv = scale.as<float>();
  for (int64_t i = 0; i < scale.numel(); ++i) {
    if (!std::isfinite(sv[i])) {
      return InvalidArgument("tensor '" + scale_name + "' holds " + std::to_string(sv[i]) +
                             " at " + std::to_string(i) + "; scales are finite");
    }
  }
  TensorView v{w.data, DType::kI4, shape, Layout::kRowMajor};
  v.scale = sv;
  v.scale_group = static_cast<int32_t>(shape[1] / groups);
  return v;
}

// A matrix: any float dtype; int8 (deja quantize) with its f32 scales, one per row, finite and
// not negative, attached to the view; or int4 (GetInt4Matrix).
StatusOr<TensorView> GetMatrix(const Checkpoint& ckpt, const std::string& name,
                               const Shape& shape) {
  const TensorInfo* info = ckpt.Find(name);
  if (info != nullptr && info->dtype == DType::kU8) return GetInt4Matrix(ckpt, name, shape);
  DEJA_ASSIGN_OR_RETURN(TensorView w, ckpt.Get(name, shape));
  if (w.dtype != DType::kI8) return w;
  const std::string scale_name = ScaleTensorName(name);
  if (ckpt.Find(scale_name) == nullptr) {
    return InvalidArgument("int8 tensor '" + name + "' has no '" + scale_name + "'");
  }
  DEJA_ASSIGN_OR_RETURN(TensorView scale, ckpt.Get(scale_name, {shape[0]}));
  if (scale.dtype != DType::kF32) {
    return InvalidArgument("tensor '" + scale_name + "' must be F32, is " + DTypeName(scale.dtype));
  }
  for (int64_t r = 0; r < shape[0]; ++r) {
    const float v = LoadAsFloat(scale.data, DType::kF32, static_cast<size_t>(r));
    if (!(v >= 0.f) || !std::isfinite(v)) {
      return InvalidArgument("tensor '" + scale_name + "' holds " + std::to_string(v) + " at row " +
                             std::to_string(r) + "; scales are finite and >= 0");
    }
  }
  // -128 has no positive counterpart: the quantizer never writes it, and the CPU kernels widen
  // |q| through a 128-entry table.
  const auto* q = static_cast<const int8_t*>(w.data);
  if (std::find(q, q + w.numel(), int8_t{-128}) != q + w.numel()) {
    return InvalidArgument("int8 tensor '" + name +
                           "' holds -128; int8 weights are in [-127, 127]");
  }
  w.scale = scale.as<float>();
  return w;
}

// The embeddings, the lm head and the projections: float or int8, not int4.
StatusOr<TensorView> GetOuterMatrix(const Checkpoint& ckpt, const std::string& name,
                                    const Shape& shape) {
  DEJA_ASSIGN_OR_RETURN(TensorView w, GetMatrix(ckpt, name, shape));
  if (w.dtype == DType::kI4) {
    return InvalidArgument("tensor '" + name + "' is int4; int4 is for the layers' matrices "
                           "(the embeddings, the lm head and the projections are int8)");
  }
  return w;
}

StatusOr<NormWeights> LoadNorm(const Checkpoint& ckpt, const std::string& w, const std::string& b,
                               int64_t dim) {
  NormWeights n;
  DEJA_ASSIGN_OR_RETURN(n.gamma, GetOptional(ckpt, w, {dim}));
  DEJA_ASSIGN_OR_RETURN(n.beta, GetOptional(ckpt, b, {dim}));
  // The LayerNorm op takes its scale and shift in one dtype; refused here, a checkpoint that
  // mixes them would load and then fail every forward step.
  if (!w.empty() && !b.empty() && n.gamma.dtype != n.beta.dtype) {
    return InvalidArgument("LayerNorm tensors '" + w + "' (" + DTypeName(n.gamma.dtype) +
                           ") and '" + b + "' (" + DTypeName(n.beta.dtype) +
                           ") must have the same dtype");
  }
  return n;
}

// Columns [begin, end) of rows [row_begin, row_end) of a checkpoint's int4 matrix (GetInt4Matrix),
// tiled into `store`.
StatusOr<TensorView> TileInt4(const TensorView& full, const std::string& name, int64_t row_begin,
                              int64_t row_end, int64_t begin, int64_t end,
                              std::vector<Tensor>* store) {
  const int32_t group = full.scale_group;
  if (begin % group != 0 || end % group != 0) {
    return InvalidArgument("int4 tensor '" + name + "': this rank's columns [" +
                           std::to_string(begin) + ", " + std::to_string(end) +
                           ") are not whole groups of " + std::to_string(group) +
                           "; quantize with a group that divides each rank's share");
  }
  const int64_t cols = full.cols(), groups = cols / group;
  Int4Matrix m = TileInt4Rows(static_cast<const uint8_t*>(full.data) + row_begin * (cols / 2),
                              full.scale + row_begin * groups, Shape{row_end - row_begin, cols},
                              group, begin, end);
  TensorView v = m.view();
  store->push_back(std::move(m.packed));
  store->push_back(std::move(m.scale));
  return v;
}

// Column-parallel: rows [begin, end) of w [out, in] and of its bias.
StatusOr<LinearWeights> LoadColumnParallel(const Checkpoint& ckpt, const std::string& w,
                                           const std::string& b, int64_t out, int64_t in,
                                           int64_t begin, int64_t end,
                                           std::vector<Tensor>* store) {
  LinearWeights lw;
  DEJA_ASSIGN_OR_RETURN(TensorView full, GetMatrix(ckpt, w, {out, in}));
  if (full.dtype == DType::kI4) {
    DEJA_ASSIGN_OR_RETURN(lw.w, TileInt4(full, w, begin, end, 0, in, store));
  } else {
    lw.w = full.RowSlice(begin, end);
  }
  DEJA_ASSIGN_OR_RETURN(TensorView bias, GetOptional(ckpt, b, {out}));
  lw.bias = Slice1D(bias, begin, end);
  return lw;
}

// Row-parallel: columns [begin, end) of w [out, in]; the full bias, added after the reduction.
StatusOr<LinearWeights> LoadRowParallel(const Checkpoint& ckpt, const std::string& w,
                                        const std::string& b, int64_t out, int64_t in,
                                        int64_t begin, int64_t end, bool copy,
                                        std::vector<Tensor>* store) {
  LinearWeights lw;
  DEJA_ASSIGN_OR_RETURN(TensorView full, GetMatrix(ckpt, w, {out, in}));
  if (full.dtype == DType::kI4) {
    DEJA_ASSIGN_OR_RETURN(lw.w, TileInt4(full, w, 0, out, begin, end, store));
  } else if (begin == 0 && end == in) {
    lw.w = full;
  } else if (!copy) {
    lw.columns = {full, begin, end};
    lw.w = TensorView{nullptr, full.dtype, Shape{out, end - begin}};
  } else {
    lw.owned = CopyColumns(full, begin, end);
    lw.w = lw.owned.view();
    lw.w.scale = full.scale;  // whole rows: int8 scales stay the rows' own
  }
  DEJA_ASSIGN_OR_RETURN(lw.bias, GetOptional(ckpt, b, {out}));
  return lw;
}

// Every float this rank holds, each matrix's own part only: a NaN or Inf in a checkpoint is
// DATA_LOSS at load (a ReLU would otherwise turn it into zeros and the model answer wrongly).
Status CheckFinite(const OptWeights& w) {
  auto check = [](const TensorView& v, const std::string& what, int64_t c0 = 0,
                  int64_t c1 = -1) -> Status {
    if (v.data == nullptr) return Status::Ok();
    if (!AllFinite(v, c0, c1 < 0 ? v.cols() : c1)) {
      return DataLoss("the checkpoint's " + what + " holds NaN or Inf values");
    }
    if (v.scale != nullptr && v.dtype == DType::kI8) {
      const TensorView scales{const_cast<float*>(v.scale), DType::kF32, Shape{v.rows()}};
      if (!AllFinite(scales, 0, v.rows())) {
        return DataLoss("the checkpoint's " + what + " scales hold NaN or Inf values");
      }
    }
    return Status::Ok();
  };
  auto linear = [&](const LinearWeights& lw, const std::string& what) -> Status {
    if (lw.columns.full.data != nullptr) {
      DEJA_RETURN_IF_ERROR(check(lw.columns.full, what + " weight", lw.columns.begin,
                                 lw.columns.end));
    } else {
      DEJA_RETURN_IF_ERROR(check(lw.w, what + " weight"));
    }
    return check(lw.bias, what + " bias");
  };
  auto norm = [&](const NormWeights& n, const std::string& what) -> Status {
    DEJA_RETURN_IF_ERROR(check(n.gamma, what + " weight"));
    return check(n.beta, what + " bias");
  };
  DEJA_RETURN_IF_ERROR(check(w.embed_tokens, "token embedding"));
  DEJA_RETURN_IF_ERROR(check(w.embed_positions, "position embedding"));
  DEJA_RETURN_IF_ERROR(linear(w.project_in, "project_in"));
  DEJA_RETURN_IF_ERROR(linear(w.project_out, "project_out"));
  DEJA_RETURN_IF_ERROR(norm(w.final_ln, "final layer norm"));
  DEJA_RETURN_IF_ERROR(linear(w.lm_head, "lm head"));
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const OptLayerWeights& lw = w.layers[l];
    const std::string layer = "layer " + std::to_string(l) + " ";
    DEJA_RETURN_IF_ERROR(norm(lw.attn_ln, layer + "attention layer norm"));
    DEJA_RETURN_IF_ERROR(norm(lw.ffn_ln, layer + "MLP layer norm"));
    const std::pair<const LinearWeights*, const char*> ms[] = {
        {&lw.q, "q_proj"}, {&lw.k, "k_proj"}, {&lw.v, "v_proj"},
        {&lw.out, "out_proj"}, {&lw.fc1, "fc1"}, {&lw.fc2, "fc2"}};
    for (const auto& [m, name] : ms) DEJA_RETURN_IF_ERROR(linear(*m, layer + name));
  }
  return Status::Ok();
}

}  // namespace

bool AllFinite(const TensorView& v, int64_t c0, int64_t c1) {
  const int64_t rows = v.rows(), cols = v.cols();
  auto scan = [&](auto element, uint32_t exponent) {
    using T = decltype(element);
    const T* p = static_cast<const T*>(v.data);
    uint32_t bad = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = p + r * cols;
      for (int64_t c = c0; c < c1; ++c) bad |= (row[c] & exponent) == exponent;
    }
    return bad == 0;
  };
  switch (v.dtype) {
    case DType::kF32:
      return scan(uint32_t{}, 0x7F800000u);
    case DType::kF16:
      return scan(uint16_t{}, 0x7C00u);
    case DType::kBF16:
      return scan(uint16_t{}, 0x7F80u);
    default:
      return true;
  }
}

void ShardRange(int64_t total, int rank, int world, int64_t* begin, int64_t* end) {
  const int64_t base = total / world, extra = total % world;
  *begin = rank * base + std::min<int64_t>(rank, extra);
  *end = *begin + base + (rank < extra ? 1 : 0);
}

StatusOr<OptWeights> LoadOptWeights(const Checkpoint& ckpt, const OptConfig& c,
                                    const OptTensorNames& names, const ShardSpec& shard) {
  if (shard.world < 1 || shard.rank < 0 || shard.rank >= shard.world) {
    return InvalidArgument("rank " + std::to_string(shard.rank) + " is outside world size " +
                           std::to_string(shard.world));
  }
  if (c.num_attention_heads % shard.world != 0) {
    return InvalidArgument("num_attention_heads " + std::to_string(c.num_attention_heads) +
                           " is not divisible by the tensor-parallel size " +
                           std::to_string(shard.world));
  }
  if (c.ffn_dim % shard.world != 0) {
    return InvalidArgument("ffn_dim " + std::to_string(c.ffn_dim) +
                           " is not divisible by the tensor-parallel size " +
                           std::to_string(shard.world));
  }
  const int64_t d = c.hidden_size, p = c.word_embed_proj_dim, f = c.ffn_dim;
  OptWeights w;
  w.local_heads = c.num_attention_heads / shard.world;
  w.local_ffn = f / shard.world;
  DEJA_ASSIGN_OR_RETURN(w.embed_tokens,
                        GetOuterMatrix(ckpt, names.embed_tokens, {c.vocab_size, p}));
  DEJA_ASSIGN_OR_RETURN(w.embed_positions,
                        GetVector(ckpt, names.embed_positions, {c.max_position_embeddings + 2, d}));
  if (!names.project_in.empty()) {
    DEJA_ASSIGN_OR_RETURN(w.project_in.w, GetOuterMatrix(ckpt, names.project_in, {d, p}));
    DEJA_ASSIGN_OR_RETURN(w.project_out.w, GetOuterMatrix(ckpt, names.project_out, {p, d}));
  }
  DEJA_ASSIGN_OR_RETURN(w.final_ln, LoadNorm(ckpt, names.final_ln_weight, names.final_ln_bias, d));

  const int64_t hb = shard.rank * (d / shard.world), he = hb + d / shard.world;
  const int64_t fb = shard.rank * w.local_ffn, fe = fb + w.local_ffn;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    OptLayerNames n = names.Layer(l);
    OptLayerWeights lw;
    DEJA_ASSIGN_OR_RETURN(lw.attn_ln, LoadNorm(ckpt, n.attn_ln_weight, n.attn_ln_bias, d));
    DEJA_ASSIGN_OR_RETURN(lw.ffn_ln, LoadNorm(ckpt, n.ffn_ln_weight, n.ffn_ln_bias, d));
    std::vector<Tensor>* store = &w.converted;
    DEJA_ASSIGN_OR_RETURN(lw.q,
                          LoadColumnParallel(ckpt, n.q_weight, n.q_bias, d, d, hb, he, store));
    DEJA_ASSIGN_OR_RETURN(lw.k,
                          LoadColumnParallel(ckpt, n.k_weight, n.k_bias, d, d, hb, he, store));
    DEJA_ASSIGN_OR_RETURN(lw.v,
                          LoadColumnParallel(ckpt, n.v_weight, n.v_bias, d, d, hb, he, store));
    DEJA_ASSIGN_OR_RETURN(lw.out, LoadRowParallel(ckpt, n.out_weight, n.out_bias, d, d, hb, he,
                                                  shard.copy_columns, store));
    DEJA_ASSIGN_OR_RETURN(lw.fc1,
                          LoadColumnParallel(ckpt, n.fc1_weight, n.fc1_bias, f, d, fb, fe, store));
    DEJA_ASSIGN_OR_RETURN(lw.fc2, LoadRowParallel(ckpt, n.fc2_weight, n.fc2_bias, d, f, fb, fe,
                                                  shard.copy_columns, store));
    for (const LinearWeights* m : {&lw.q, &lw.k, &lw.v, &lw.out, &lw.fc1, &lw.fc2}) {
      if (m->w.dtype == DType::kI4) ++w.int4_matrices;
    }
    w.layers.push_back(std::move(lw));
  }
  ShardRange(c.vocab_size, shard.rank, shard.world, &w.vocab_begin, &w.vocab_end);
  DEJA_ASSIGN_OR_RETURN(TensorView head, GetOuterMatrix(ckpt, names.lm_head, {c.vocab_size, p}));
  w.lm_head.w = head.RowSlice(w.vocab_begin, w.vocab_end);
  // A device load streams the mapping to the device (UploadWeights checks each chunk it stages).
  if (shard.copy_columns) DEJA_RETURN_IF_ERROR(CheckFinite(w));
  return w;
}

namespace {

// v in `dtype`, in a tensor appended to `store`; chunked through f32 (SIMD on the host).
TensorView Converted(const TensorView& v, DType dtype, std::vector<Tensor>* store) {
  Tensor t = Tensor::Empty(dtype, v.shape);
  constexpr int64_t kChunk = 1 << 16;
  std::vector<float> f32(kChunk);
  const int64_t n = v.numel();
  const size_t es = DTypeSize(v.dtype);
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t len = std::min(kChunk, n - i);
    ConvertToF32(static_cast<const char*>(v.data) + i * es, v.dtype, len, f32.data(), false);
    ConvertFromF32(f32.data(), len, DType::kBF16, t.as<uint16_t>() + i);
  }
  store->push_back(std::move(t));
  return store->back().view();
}

}  // namespace

Status ConvertMatrices(OptWeights* w, DType dtype, ThreadPool* pool, const Int4Options& int4) {
  if (dtype != DType::kBF16 && dtype != DType::kI8 && dtype != DType::kI4) {
    return InvalidArgument(std::string("weights can be converted to bf16, int8 or int4 only, not ") +
                           DTypeName(dtype));
  }
  if (dtype == DType::kI4 && (int4.group <= 0 || int4.group % 8 != 0)) {
    return InvalidArgument("the int4 group must be a positive multiple of 8, not " +
                           std::to_string(int4.group));
  }
  Status failed;
  // A layer matrix under int4: int4 when its group fits and its error is low enough, else int8.
  auto to_int4 = [&](TensorView* v, const std::string& what) {
    // A quantized checkpoint's matrices stay as they are (int4 here, int8 below).
    if (v->data == nullptr || v->dtype == DType::kI8 || v->dtype == DType::kI4 || !failed.ok()) {
      return false;
    }
    if (v->cols() % int4.group == 0) {
      StatusOr<Int4Matrix> q = QuantizeInt4(*v, int4.group, what.c_str(), pool);
      if (!q.ok()) {
        failed = q.status();
        return false;
      }
      if (q->relative_error <= int4.max_error) {
        *v = q->view();
        w->converted.push_back(std::move(q->packed));
        w->converted.push_back(std::move(q->scale));
        ++w->int4_matrices;
        return true;
      }
      LOG(INFO) << what << ": int4 relative error " << q->relative_error << " > "
                << int4.max_error << ", kept int8";
    } else {
      LOG(INFO) << what << ": " << v->cols() << " columns are not whole int4 groups of "
                << int4.group << ", kept int8";
    }
    ++w->int4_fallbacks;
    return false;  // int8 below
  };
  auto convert = [&](TensorView* v, const std::string& what) {
    // An int8 checkpoint's matrices stay int8: bf16 would only double their bytes.
    if (v->data == nullptr || v->dtype == dtype || v->dtype == DType::kI8 ||
        v->dtype == DType::kI4 || !failed.ok()) {
      return false;
    }
    if (dtype == DType::kBF16) {
      *v = Converted(*v, dtype, &w->converted);
      return true;
    }
    StatusOr<QuantizedMatrix> q = QuantizeRowsInt8(*v, what.c_str(), pool);
    if (!q.ok()) {
      failed = q.status();
      return false;
    }
    *v = q->view();
    w->converted.push_back(std::move(q->q));
    w->converted.push_back(std::move(q->scale));
    return true;
  };
  // The lm head is tied when it points into the embedding table: it becomes the same rows of the
  // converted table.
  const char* table = static_cast<const char*>(w->embed_tokens.data);
  const char* head = static_cast<const char*>(w->lm_head.w.data);
  const bool tied = head >= table && head < table + w->embed_tokens.bytes() &&
                    w->lm_head.w.dtype == w->embed_tokens.dtype;
  convert(&w->embed_tokens, "embed_tokens");
  if (tied) {
    w->lm_head.w = w->embed_tokens.RowSlice(w->vocab_begin, w->vocab_end);
  } else {
    convert(&w->lm_head.w, "lm_head");
  }
  // Position embeddings are added, not multiplied: int8 and int4 leave them in their dtype.
  if (dtype == DType::kBF16) convert(&w->embed_positions, "embed_positions");
  convert(&w->project_in.w, "project_in");
  convert(&w->project_out.w, "project_out");
  for (size_t i = 0; i < w->layers.size(); ++i) {
    OptLayerWeights& l = w->layers[i];
    const std::pair<LinearWeights*, const char*> parts[] = {{&l.q, "q_proj"}, {&l.k, "k_proj"},
                                                            {&l.v, "v_proj"}, {&l.out, "out_proj"},
                                                            {&l.fc1, "fc1"},  {&l.fc2, "fc2"}};
    for (auto [lw, name] : parts) {
      // A copied column slice, now converted, frees its copy.
      const std::string what = "layer " + std::to_string(i) + " " + name;
      if ((dtype == DType::kI4 && to_int4(&lw->w, what)) || convert(&lw->w, what)) {
        lw->owned = Tensor();
      }
    }
  }
  return failed;
}

namespace {

// Frees the tensor of `store` that backs `data`, if one does (a matrix converted at load that was
// copied again, tiled).
void Release(std::vector<Tensor>* store, const void* data) {
  for (Tensor& t : *store) {
    if (t.data() == data) t = Tensor();
  }
}

// Tiles lw's bf16 row-major matrix into storage lw owns, releasing the row-major copy.
bool Tileable(const TensorView& v) {
  return (v.dtype == DType::kBF16 || v.dtype == DType::kI8) && v.layout == Layout::kRowMajor;
}

void TileOwned(LinearWeights* lw, std::vector<Tensor>* store) {
  if (!Tileable(lw->w)) return;
  const void* old = lw->w.data;
  lw->owned = Tile16(lw->w, &lw->w);
  Release(store, old);
}

// q, k and v's biases (when they have them) stacked into qkv's.
void StackQkvBiases(OptLayerWeights* l, std::vector<Tensor>* store) {
  if (l->q.bias.data == nullptr) return;
  const LinearWeights* parts[3] = {&l->q, &l->k, &l->v};
  const int64_t local = l->q.w.rows();
  const size_t bias_bytes = static_cast<size_t>(local) * DTypeSize(l->q.bias.dtype);
  Tensor bias = Tensor::Empty(l->q.bias.dtype, {3 * local});
  for (int i = 0; i < 3; ++i) {
    std::memcpy(static_cast<char*>(bias.data()) + i * bias_bytes, parts[i]->bias.data,
                bias_bytes);
  }
  l->qkv.bias = bias.view();
  store->push_back(std::move(bias));
}

// q, k and v's int4 matrices (whole tiles, one group size) and biases stacked: the packed values
// and the tiled scales are each the three parts one after the other.
bool StackQkvInt4(OptLayerWeights* l, std::vector<Tensor>* store) {
  LinearWeights* parts[3] = {&l->q, &l->k, &l->v};
  const int64_t local = l->q.w.rows(), d = l->q.w.cols();
  const int32_t group = l->q.w.scale_group;
  const int64_t part_bytes = Int4Bytes(local, d), part_scales = Int4Scales(local, d, group);
  Tensor packed = Tensor::Empty(DType::kI8, {3 * part_bytes});
  Tensor scale = Tensor::Empty(DType::kF32, {3 * part_scales});
  for (int i = 0; i < 3; ++i) {
    std::memcpy(packed.as<char>() + i * part_bytes, parts[i]->w.data, part_bytes);
    std::memcpy(scale.as<float>() + i * part_scales, parts[i]->w.scale,
                part_scales * sizeof(float));
  }
  TensorView view{packed.data(), DType::kI4, Shape{3 * local, d}, Layout::kTiled16};
  view.scale = scale.as<float>();
  view.scale_group = group;
  for (int i = 0; i < 3; ++i) {
    const void* old = parts[i]->w.data;
    const float* old_scale = parts[i]->w.scale;
    parts[i]->w = view.RowSlice(i * local, (i + 1) * local);
    parts[i]->owned = Tensor();
    Release(store, old);
    Release(store, old_scale);
  }
  l->qkv.w = view;
  l->qkv.owned = std::move(packed);
  store->push_back(std::move(scale));
  StackQkvBiases(l, store);
  return true;
}

// Stacks a layer's bf16 q, k and v into one tiled matrix (and their biases into one vector) and
// makes q, k and v its row slices; false (nothing changed) when their shapes, biases or row
// counts do not allow it.
bool StackQkv(OptLayerWeights* l, std::vector<Tensor>* store) {
  LinearWeights* parts[3] = {&l->q, &l->k, &l->v};
  const Shape shape = l->q.w.shape;
  if (shape.rank != 2 || shape[0] % kTileRows != 0) return false;
  const bool biased = l->q.bias.data != nullptr;
  const DType dtype = l->q.w.dtype;
  const bool int4 = dtype == DType::kI4;
  for (const LinearWeights* p : parts) {
    if (!(Tileable(p->w) || int4) || p->w.dtype != dtype || !(p->w.shape == shape)) return false;
    if (int4 && p->w.scale_group != l->q.w.scale_group) return false;
    if ((p->bias.data != nullptr) != biased) return false;
    if (biased && (p->bias.dtype != l->q.bias.dtype || p->bias.numel() != shape[0])) return false;
  }
  const int64_t local = shape[0], d = shape[1];
  if (int4) return StackQkvInt4(l, store);
  Tensor stacked = Tensor::Empty(dtype, {3 * local, TiledCols(d)});
  TensorView view{stacked.data(), dtype, Shape{3 * local, d}, Layout::kTiled16};
  const size_t part_bytes = static_cast<size_t>(local * TiledCols(d)) * DTypeSize(dtype);
  if (dtype == DType::kI8) {  // the three parts' scales, stacked the same way
    Tensor scale = Tensor::Empty(DType::kF32, {3 * local});
    for (int i = 0; i < 3; ++i) {
      std::memcpy(scale.as<float>() + i * local, parts[i]->w.scale, local * sizeof(float));
    }
    view.scale = scale.as<float>();
    store->push_back(std::move(scale));
  }
  for (int i = 0; i < 3; ++i) {
    TensorView tiled;
    Tensor tiles = Tile16(parts[i]->w, &tiled);
    std::memcpy(static_cast<char*>(stacked.data()) + i * part_bytes, tiles.data(), part_bytes);
    const void* old = parts[i]->w.data;
    parts[i]->w = view.RowSlice(i * local, (i + 1) * local);
    parts[i]->owned = Tensor();
    Release(store, old);
  }
  l->qkv.w = view;
  l->qkv.owned = std::move(stacked);
  if (biased) StackQkvBiases(l, store);
  return true;
}

}  // namespace

void TileMatrices(OptWeights* w) {
  // The embedding table (Embedding reads it tiled too) with the tied lm head as its slice, when
  // the slice starts on a tile; an untied head on its own.
  const char* table = static_cast<const char*>(w->embed_tokens.data);
  const char* head = static_cast<const char*>(w->lm_head.w.data);
  const bool tied = head >= table && head < table + w->embed_tokens.bytes();
  auto tile_table = [&] {
    Tensor tiles = Tile16(w->embed_tokens, &w->embed_tokens);
    Release(&w->converted, table);
    w->converted.push_back(std::move(tiles));
  };
  if (Tileable(w->embed_tokens)) {
    if (!tied) {
      tile_table();
    } else if (w->vocab_begin % kTileRows == 0) {
      tile_table();
      w->lm_head.w = w->embed_tokens.RowSlice(w->vocab_begin, w->vocab_end);
    }
  }
  if (!tied) TileOwned(&w->lm_head, &w->converted);
  for (OptLayerWeights& l : w->layers) {
    StackQkv(&l, &w->converted);  // else q, k and v are tiled one by one below
    for (LinearWeights* lw : {&l.q, &l.k, &l.v, &l.out, &l.fc1, &l.fc2}) {
      TileOwned(lw, &w->converted);
    }
  }
}

void UntileMatrices(OptWeights* w) {
  for (OptLayerWeights& l : w->layers) {
    // q leaves the stack, so decode steps no longer run the stacked Linear: a row-major q and the
    // tiled stack need not compute the same function (int8 on AVX512-VNNI quantizes x only over
    // tiles), and a token's q must not depend on whether its step also held a prefill chunk. k
    // and v stay slices of the stack's storage.
    if (l.qkv.w.data != nullptr && l.q.w.layout == Layout::kTiled16) l.qkv.w = TensorView{};
    for (LinearWeights* lw : {&l.q, &l.out, &l.fc1, &l.fc2}) {  // k and v stay dense
      if (lw->w.layout != Layout::kTiled16) continue;
      Tensor rows = Untile16(lw->w);
      const float* scale = lw->w.scale;
      lw->w = rows.view();
      lw->w.scale = scale;
      lw->owned = std::move(rows);
    }
  }
}

}  // namespace deja::worker::model
