#include "worker/model/weight_upload.h"

#include <glog/logging.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "common/quantize.h"
#include "kernels/ops.h"

namespace deja::worker::model {
namespace {

using Clock = std::chrono::steady_clock;

// What a view is: a matrix (converted to matrix_dtype when set), a bias (f32 on the device, so
// the GEMM epilogue can add it: cuBLASLt takes the output's dtype; N floats per layer) or a
// LayerNorm parameter (as stored).
enum class Kind { kMatrix, kBias, kNorm };

// A weight view of `w`, its kind and, for a row-parallel slice left uncopied, its source.
struct Entry {
  TensorView* v;
  Kind kind;
  const ColumnSlice* cols = nullptr;
  // A matrix matrix_dtype int8 quantizes (not the position embeddings), and its name in errors.
  bool quantizable = false;
  std::string name;
  bool present() const { return v->data != nullptr || (cols != nullptr && cols->pending()); }
};

// Every weight view of `w` with its kind. The lm head is listed only when it is not tied to the
// embedding table.
std::vector<Entry> Views(OptWeights* w, bool* tied) {
  const char* table = static_cast<const char*>(w->embed_tokens.data);
  const char* head = static_cast<const char*>(w->lm_head.w.data);
  *tied = table != nullptr && head >= table && head < table + w->embed_tokens.bytes() &&
          w->lm_head.w.dtype == w->embed_tokens.dtype;
  std::vector<Entry> v;
  auto linear = [&](LinearWeights* l, std::string name) {
    v.push_back({&l->w, Kind::kMatrix, &l->columns, true, std::move(name)});
    v.push_back({&l->bias, Kind::kBias});
  };
  v.push_back({&w->embed_tokens, Kind::kMatrix, nullptr, true, "embed_tokens"});
  v.push_back({&w->embed_positions, Kind::kMatrix});
  linear(&w->project_in, "project_in");
  linear(&w->project_out, "project_out");
  v.push_back({&w->final_ln.gamma, Kind::kNorm});
  v.push_back({&w->final_ln.beta, Kind::kNorm});
  for (size_t i = 0; i < w->layers.size(); ++i) {
    OptLayerWeights& l = w->layers[i];
    for (NormWeights* n : {&l.attn_ln, &l.ffn_ln}) {
      v.push_back({&n->gamma, Kind::kNorm});
      v.push_back({&n->beta, Kind::kNorm});
    }
    const std::string layer = "layers." + std::to_string(i) + ".";
    linear(&l.q, layer + "q_proj");
    linear(&l.k, layer + "k_proj");
    linear(&l.v, layer + "v_proj");
    linear(&l.out, layer + "out_proj");
    linear(&l.fc1, layer + "fc1");
    linear(&l.fc2, layer + "fc2");
  }
  if (!*tied) {
    linear(&w->lm_head, "lm_head");
  } else {
    v.push_back({&w->lm_head.bias, Kind::kBias});
  }
  return v;
}

// An int8 matrix (a `deja quantize` checkpoint) stays int8: its scales go with it. Under int8
// the position embeddings keep their dtype (as on the CPU).
DType Target(const Entry& e, std::optional<DType> matrix_dtype) {
  const TensorView& v = *e.v;
  if (e.kind == Kind::kBias) return DType::kF32;
  if (v.dtype == DType::kI8) return DType::kI8;
  if (e.kind != Kind::kMatrix || !matrix_dtype.has_value()) return v.dtype;
  if (*matrix_dtype == DType::kI8 && !e.quantizable) return v.dtype;
  return *matrix_dtype;
}

// Whether the upload quantizes e (a float matrix under int8).
bool Quantizes(const Entry& e, std::optional<DType> matrix_dtype) {
  return Target(e, matrix_dtype) == DType::kI8 && e.v->dtype != DType::kI8;
}

// An int8 matrix's scales: one f32 per row (of the full matrix for a column slice).
const float* ScalesOf(const Entry& e) {
  if (e.cols != nullptr && e.cols->pending()) return e.cols->full.scale;
  return e.v->scale;
}

std::string Mib(int64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

}  // namespace

int64_t DeviceWeightBytes(const OptWeights& w, std::optional<DType> matrix_dtype) {
  bool tied = false;
  int64_t bytes = 0;
  for (const Entry& e : Views(const_cast<OptWeights*>(&w), &tied)) {
    if (!e.present()) continue;
    bytes += e.v->numel() * static_cast<int64_t>(DTypeSize(Target(e, matrix_dtype)));
    if (ScalesOf(e) != nullptr || Quantizes(e, matrix_dtype)) {
      bytes += e.v->rows() * int64_t{sizeof(float)};
    }
  }
  return bytes;
}

Status UploadWeights(OptWeights* w, const Checkpoint& ckpt, kernels::Backend& be,
                     const UploadOptions& options, UploadStats* stats) {
  if (w->layers.empty() || w->embed_tokens.data == nullptr) {
    return InvalidArgument("no weights to upload");
  }
  for (const OptLayerWeights& l : w->layers) {
    if (l.qkv.w.data != nullptr || l.q.w.layout != Layout::kRowMajor) {
      return InvalidArgument("tiled weights cannot be uploaded; load them row-major");
    }
  }
  const int64_t need = DeviceWeightBytes(*w, options.matrix_dtype);
  size_t free_bytes = 0, total_bytes = 0;
  Status mem = be.MemoryInfo(&free_bytes, &total_bytes);
  if (mem.ok() && static_cast<int64_t>(free_bytes) < need) {
    return ResourceExhausted("the weights need " + Mib(need) + " of " + be.device().ToString() +
                             " memory, " + Mib(static_cast<int64_t>(free_bytes)) + " of " +
                             Mib(static_cast<int64_t>(total_bytes)) + " are free");
  }
  const size_t staging = std::max<size_t>(options.staging_bytes, size_t{1} << 20);
  DEJA_ASSIGN_OR_RETURN(Tensor pinned, be.AllocatePinned(staging));
  Tensor dev_stage;  // the source dtype on the device, before Convert
  bool tied = false;
  const auto views = Views(w, &tied);
  const int64_t vocab_begin = w->vocab_begin, vocab_end = w->vocab_end;
  std::vector<Tensor> storage;
  UploadStats st;
  const auto start = Clock::now();
  auto last_log = start;
  int64_t total_host = 0;
  for (const Entry& e : views) total_host += e.present() ? e.v->bytes() : 0;

  for (const Entry& e : views) {
    if (!e.present()) continue;
    TensorView* v = e.v;
    const TensorView src = *v;
    const DType to = Target(e, options.matrix_dtype);
    DEJA_ASSIGN_OR_RETURN(Tensor dst, be.Allocate(to, src.shape));
    const size_t src_es = DTypeSize(src.dtype), dst_es = DTypeSize(to);
    const int64_t n = src.numel();
    // A float matrix under int8 is quantized on the host, row by row as the CPU does at load
    // (each rank's slice of a row-parallel matrix gets its own row scales), and its int8 values
    // and scales are uploaded.
    const bool quantize = Quantizes(e, options.matrix_dtype);
    std::vector<float> row_scales;
    // A column slice moves in whole rows: each row's segment is gathered from the mapping.
    const ColumnSlice* cols = e.cols != nullptr && e.cols->pending() ? e.cols : nullptr;
    const int64_t row = cols || quantize ? src.shape[1] : 1;
    if (cols && static_cast<size_t>(row) * src_es > staging) {
      return InvalidArgument("a row of " + std::to_string(row * src_es) +
                             " bytes does not fit the staging buffer");
    }
    const int64_t chunk = static_cast<int64_t>(staging / src_es) / row * row;
    if (to != src.dtype && !quantize && dev_stage.empty()) {
      DEJA_ASSIGN_OR_RETURN(dev_stage,
                            be.Allocate(DType::kF32, {static_cast<int64_t>(staging / 4)}));
    }
    auto read = [&](const char* from, size_t len, char* into) {
      std::memcpy(into, from, len);
      if (options.read_log != nullptr) options.read_log->emplace_back(from, len);
    };
    for (int64_t i0 = 0; i0 < n; i0 += chunk) {
      const int64_t m = std::min(chunk, n - i0);
      const size_t len = static_cast<size_t>(m) * src_es;
      if (cols) {
        const int64_t full_cols = cols->full.shape[1];
        const char* base = static_cast<const char*>(cols->full.data);
        for (int64_t r = i0 / row; r < (i0 + m) / row; ++r) {
          read(base + (r * full_cols + cols->begin) * src_es, row * src_es,
               static_cast<char*>(pinned.data()) + (r * row - i0) * src_es);
        }
      } else {
        read(static_cast<const char*>(src.data) + i0 * src_es, len,
             static_cast<char*>(pinned.data()));
      }
      if (!AllFinite(TensorView{pinned.data(), src.dtype, Shape{m}}, 0, m)) {
        return DataLoss("the checkpoint's " + e.name + " holds NaN or Inf values");
      }
      char* out = static_cast<char*>(dst.data()) + i0 * dst_es;
      if (quantize) {
        const TensorView rows{pinned.data(), src.dtype, Shape{m / row, row}};
        DEJA_ASSIGN_OR_RETURN(QuantizedMatrix q, QuantizeRowsInt8(rows, e.name.c_str()));
        DEJA_RETURN_IF_ERROR(be.CopyHostToDevice(out, q.q.data(), static_cast<size_t>(m)));
        row_scales.insert(row_scales.end(), q.scale.as<float>(), q.scale.as<float>() + m / row);
        continue;
      }
      if (to == src.dtype) {
        DEJA_RETURN_IF_ERROR(be.CopyHostToDevice(out, pinned.data(), len));
        continue;
      }
      DEJA_RETURN_IF_ERROR(be.CopyHostToDevice(dev_stage.data(), pinned.data(), len));
      TensorView from{dev_stage.data(), src.dtype, Shape{m}};
      from.device = be.device();
      TensorView into{out, to, Shape{m}};
      into.device = be.device();
      DEJA_RETURN_IF_ERROR(kernels::Convert(be, from, into));
    }
    ckpt.Release(cols ? cols->full : src);
    const float* host_scale = quantize ? row_scales.data() : ScalesOf(e);
    *v = dst.view();
    v->shape = src.shape;
    st.device_bytes += static_cast<int64_t>(dst.bytes());
    storage.push_back(std::move(dst));
    if (host_scale != nullptr) {  // the rows' scales, after the values
      DEJA_ASSIGN_OR_RETURN(Tensor scale, be.Allocate(DType::kF32, {src.rows()}));
      DEJA_RETURN_IF_ERROR(
          be.CopyHostToDevice(scale.data(), host_scale, src.rows() * sizeof(float)));
      v->scale = scale.as<float>();
      st.device_bytes += static_cast<int64_t>(scale.bytes());
      storage.push_back(std::move(scale));
    }
    ++st.tensors;
    st.host_bytes += static_cast<int64_t>(src.bytes());
    const auto now = Clock::now();
    if (std::chrono::duration<double>(now - last_log).count() >= options.log_every_seconds) {
      const double s = std::chrono::duration<double>(now - start).count();
      LOG(INFO) << "loading to " << be.device().ToString() << ": " << Mib(st.host_bytes) << " of "
                << Mib(total_host) << ", " << st.tensors << " tensors, " << st.host_bytes / s / 1e9
                << " GB/s";
      last_log = now;
    }
  }
  DEJA_RETURN_IF_ERROR(be.Synchronize());
  if (tied) w->lm_head.w = w->embed_tokens.RowSlice(vocab_begin, vocab_end);
  // The host copies (sliced or converted matrices) are no longer referenced.
  for (OptLayerWeights& l : w->layers) {
    for (LinearWeights* lw : {&l.q, &l.k, &l.v, &l.out, &l.fc1, &l.fc2}) {
      lw->owned = Tensor();
      lw->columns = {};
    }
  }
  for (LinearWeights* lw : {&w->project_in, &w->project_out, &w->lm_head}) {
    lw->owned = Tensor();
    lw->columns = {};
  }
  w->converted = std::move(storage);
  st.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  LOG(INFO) << "loaded " << Mib(st.host_bytes) << " (" << st.tensors << " tensors) to "
            << be.device().ToString() << " in " << st.seconds << " s, "
            << st.host_bytes / std::max(st.seconds, 1e-9) / 1e9 << " GB/s; " << Mib(st.device_bytes)
            << " on the device";
  if (stats != nullptr) *stats = st;
  return Status::Ok();
}

}  // namespace deja::worker::model
