// OptModel's last stage: the final LayerNorm of the rows whose logits are wanted, the LM head
// (a rank's slice of the vocabulary) and the gather of the slices; on a device, the top
// candidates per row computed there (DeviceLogits) or over the ranks' shards
// (ShardedDeviceLogits).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels/ops.h"
#include "worker/model/opt_model.h"
#include "worker/model/opt_model_internal.h"

namespace deja::worker::model {

using opt_internal::kLayerNormEps;
using opt_internal::Rows;

Status OptModel::Logits(const std::vector<SequenceStep>& batch, int64_t rows, StepResult* result) {
  const int64_t d = config_.hidden_size;
  kernels::Backend& be = *backend_;
  // Gather the rows that need logits into a_ (contiguous): on the host by copies, on a device by
  // an embedding lookup with h_ as the table.
  result->row_seq.clear();
  logit_rows_.clear();
  int64_t out_rows = 0, row = 0;
  for (size_t b = 0; b < batch.size(); ++b) {
    const SequenceStep& s = batch[b];
    int32_t first = s.all_logits ? 0 : s.n - 1;
    for (int32_t i = first; i < s.n; ++i) {
      logit_rows_.push_back(static_cast<int32_t>(row + i));
      result->row_seq.push_back(static_cast<int32_t>(b));
      ++out_rows;
    }
    row += s.n;
  }
  if (on_device_) {
    DEJA_RETURN_IF_ERROR(kernels::Embedding(be, Rows(h_, row, d), logit_rows_.data(), out_rows,
                                            false, Rows(a_, out_rows, d)));
  } else {
    const float* hs = h_.as<float>();
    float* dst = a_.as<float>();
    for (int64_t r = 0; r < out_rows; ++r) {
      std::memcpy(dst + r * d, hs + static_cast<int64_t>(logit_rows_[r]) * d, d * sizeof(float));
    }
  }
  DEJA_ASSIGN_OR_RETURN(const TensorView x, HeadInput(Rows(a_, out_rows, d)));
  const int64_t vocab = config_.vocab_size, local_vocab = w_.vocab_end - w_.vocab_begin;
  if (result->logits.empty() || result->logits.shape()[0] < out_rows ||
      result->logits.shape()[1] != vocab) {
    result->logits = Tensor::Empty(DType::kF32, {out_rows, vocab});
  }
  result->top_k = 0;
  if (on_device_) return DeviceLogits(batch, x, out_rows, result);
  if (comm_->world_size() == 1) {
    TensorView out = Rows(result->logits, out_rows, vocab);
    return kernels::Linear(be, x, w_.lm_head.w, {}, kernels::Activation::kNone, false, out);
  }
  // Vocab-parallel head: each rank computes its slice into a padded [rows, chunk] block, the
  // blocks are gathered, and the slices are laid side by side.
  const int world = comm_->world_size();
  const int64_t chunk = (vocab + world - 1) / world;
  const int64_t block = out_rows * chunk;
  if (static_cast<int64_t>(gather_.size()) < block * (world + 1)) {
    gather_.resize(block * (world + 1));
  }
  TensorView local_out{gather_.data(), DType::kF32, Shape{out_rows, local_vocab}};
  DEJA_RETURN_IF_ERROR(
      kernels::Linear(be, x, w_.lm_head.w, {}, kernels::Activation::kNone, false, local_out));
  // Re-stride the local [rows, local_vocab] result to [rows, chunk] (in place, back to front).
  for (int64_t r = out_rows - 1; r >= 0; --r) {
    std::memmove(gather_.data() + r * chunk, gather_.data() + r * local_vocab,
                 local_vocab * sizeof(float));
  }
  float* all = gather_.data() + block;
  DEJA_RETURN_IF_ERROR(comm_->AllGather(gather_.data(), block, all));
  float* logits = result->logits.as<float>();
  for (int rk = 0; rk < world; ++rk) {
    int64_t vb, ve;
    ShardRange(vocab, rk, world, &vb, &ve);
    for (int64_t r = 0; r < out_rows; ++r) {
      std::memcpy(logits + r * vocab + vb, all + rk * block + r * chunk, (ve - vb) * sizeof(float));
    }
  }
  return Status::Ok();
}

StatusOr<TensorView> OptModel::HeadInput(const TensorView& rows) {
  kernels::Backend& be = *backend_;
  const int64_t d = config_.hidden_size, p = config_.word_embed_proj_dim, n = rows.rows();
  TensorView x = rows;
  if (w_.final_ln.present()) {
    x = Rows(a_, n, d);  // in place when `rows` is a_ already
    DEJA_RETURN_IF_ERROR(
        kernels::LayerNorm(be, rows, w_.final_ln.gamma, w_.final_ln.beta, kLayerNormEps, x));
  }
  if (w_.project_out.w.data != nullptr) {
    TensorView e = Rows(emb_, n, p);
    DEJA_RETURN_IF_ERROR(
        kernels::Linear(be, x, w_.project_out.w, {}, kernels::Activation::kNone, false, e));
    x = e;
  }
  return x;
}

// One rank on a device (LoadToDevice): the logits stay on the device. Rows of sequences that want
// them are copied to the host; every row's top candidates (log_softmax, then top-k, on the
// device) come back for token selection.
Status OptModel::DeviceLogits(const std::vector<SequenceStep>& batch, const TensorView& x,
                              int64_t out_rows, StepResult* result) {
  if (comm_->world_size() > 1) return ShardedDeviceLogits(batch, x, out_rows, result);
  kernels::Backend& be = *backend_;
  const int64_t vocab = config_.vocab_size;
  constexpr int32_t k = kDeviceTopCandidates;
  if (logits_dev_.empty() || logits_dev_.shape()[0] < out_rows) {
    const int64_t rows = std::max(out_rows, ws_rows_);
    DEJA_ASSIGN_OR_RETURN(logits_dev_, Alloc(DType::kF32, {rows, vocab}));
    DEJA_ASSIGN_OR_RETURN(top_dev_, Alloc(DType::kF32, {rows, 2 * k}));
  }
  TensorView out = Rows(logits_dev_, out_rows, vocab);
  DEJA_RETURN_IF_ERROR(
      kernels::Linear(be, x, w_.lm_head.w, {}, kernels::Activation::kNone, false, out));
  // The rows of sequences that read logits, in runs of consecutive rows.
  int64_t r = 0;
  for (size_t b = 0; b < batch.size(); ++b) {
    int64_t n = 0;
    while (r + n < out_rows && result->row_seq[r + n] == static_cast<int32_t>(b)) ++n;
    if (batch[b].full_logits && n > 0) {
      const size_t bytes = static_cast<size_t>(n * vocab) * sizeof(float);
      DEJA_RETURN_IF_ERROR(be.CopyDeviceToHost(result->logits.as<float>() + r * vocab,
                                               out.as<float>() + r * vocab, bytes));
    }
    r += n;
  }
  const int32_t kk = static_cast<int32_t>(std::min<int64_t>(k, vocab));
  DEJA_RETURN_IF_ERROR(kernels::LogSoftmax(be, out, out));
  float* values = top_dev_.as<float>();
  int32_t* ids = reinterpret_cast<int32_t*>(values + out_rows * kk);
  DEJA_RETURN_IF_ERROR(kernels::TopK(be, out, kk, values, ids));
  result->top_k = kk;
  result->top_logprobs.resize(static_cast<size_t>(out_rows * kk));
  result->top_ids.resize(static_cast<size_t>(out_rows * kk));
  DEJA_RETURN_IF_ERROR(be.CopyDeviceToHost(result->top_logprobs.data(), values,
                                           result->top_logprobs.size() * sizeof(float)));
  return be.CopyDeviceToHost(result->top_ids.data(), ids, result->top_ids.size() * sizeof(int32_t));
}

// A rank of a tensor-parallel group on devices: each rank holds its vocab slice of the logits.
// Sequences that read the full logits get them gathered (each rank's [rows, local] block padded to
// the largest slice, laid side by side on the host). Token choice needs only each rank's top
// candidates and the log of its slice's softmax denominator: those few numbers are gathered, and
// the global top-k (a subset of the union of the local ones) and its log-probabilities follow
// exactly on the host.
Status OptModel::ShardedDeviceLogits(const std::vector<SequenceStep>& batch, const TensorView& x,
                                     int64_t out_rows, StepResult* result) {
  kernels::Backend& be = *backend_;
  const int world = comm_->world_size(), rank = comm_->rank();
  const int64_t vocab = config_.vocab_size, local = w_.vocab_end - w_.vocab_begin;
  const int64_t chunk = (vocab + world - 1) / world;
  const int32_t kk = static_cast<int32_t>(std::min<int64_t>(kDeviceTopCandidates, vocab));
  const int32_t kl = static_cast<int32_t>(std::min<int64_t>(kk, local));
  // Per rank and row: kl raw logits, their ids (int32 bits), and the top log-probability and its
  // id (the log denominator is the top logit minus it).
  const int64_t cand = out_rows * (2 * static_cast<int64_t>(kl) + 2);
  const int64_t block = std::max(out_rows * chunk, cand);
  if (gather_dev_.empty() || gather_dev_.numel() < block * world) {
    DEJA_ASSIGN_OR_RETURN(gather_dev_,
                          Alloc(DType::kF32, {std::max<int64_t>(block, ws_rows_ * chunk) * world}));
  }
  float* all = gather_dev_.as<float>();
  float* mine = all + rank * block;
  TensorView out{mine, DType::kF32, Shape{out_rows, local}};
  out.device = be.device();
  DEJA_RETURN_IF_ERROR(
      kernels::Linear(be, x, w_.lm_head.w, {}, kernels::Activation::kNone, false, out));
  const bool any_full =
      std::any_of(batch.begin(), batch.end(), [](const SequenceStep& s) { return s.full_logits; });
  if (any_full) {
    // In place: NCCL allows it and the staged communicator copies `in` out first.
    DEJA_RETURN_IF_ERROR(comm_->AllGather(mine, block, all));
    host_gather_.resize(static_cast<size_t>(block * world));
    DEJA_RETURN_IF_ERROR(
        be.CopyDeviceToHost(host_gather_.data(), all, host_gather_.size() * sizeof(float)));
    float* logits = result->logits.as<float>();
    for (int rk = 0; rk < world; ++rk) {
      int64_t vb, ve;
      ShardRange(vocab, rk, world, &vb, &ve);
      const float* src = host_gather_.data() + rk * block;
      for (int64_t r = 0; r < out_rows; ++r) {
        std::memcpy(logits + r * vocab + vb, src + r * (ve - vb), (ve - vb) * sizeof(float));
      }
    }
  }
  // Log-probabilities of the slice (for the denominator) beside the raw logits.
  if (logits_dev_.empty() || logits_dev_.numel() < out_rows * local) {
    DEJA_ASSIGN_OR_RETURN(logits_dev_, Alloc(DType::kF32, {std::max(out_rows, ws_rows_), local}));
  }
  if (top_dev_.empty() || top_dev_.numel() < cand) {
    DEJA_ASSIGN_OR_RETURN(top_dev_, Alloc(DType::kF32, {cand}));
  }
  TensorView lp = Rows(logits_dev_, out_rows, local);
  float* values = top_dev_.as<float>();
  int32_t* ids = reinterpret_cast<int32_t*>(values + out_rows * kl);
  float* top_lp = values + 2 * out_rows * kl;
  int32_t* top_id = reinterpret_cast<int32_t*>(top_lp + out_rows);
  DEJA_RETURN_IF_ERROR(kernels::TopK(be, out, kl, values, ids));
  DEJA_RETURN_IF_ERROR(kernels::LogSoftmax(be, out, lp));
  DEJA_RETURN_IF_ERROR(kernels::TopK(be, lp, 1, top_lp, top_id));
  DEJA_RETURN_IF_ERROR(comm_->AllGather(values, cand, all));
  host_gather_.resize(static_cast<size_t>(cand * world));
  DEJA_RETURN_IF_ERROR(
      be.CopyDeviceToHost(host_gather_.data(), all, host_gather_.size() * sizeof(float)));

  result->top_k = kk;
  result->top_logprobs.resize(static_cast<size_t>(out_rows * kk));
  result->top_ids.resize(static_cast<size_t>(out_rows * kk));
  std::vector<std::pair<float, int32_t>> merged;
  merged.reserve(static_cast<size_t>(world) * kl);
  std::vector<double> lse(world);  // each rank's log softmax denominator of the row
  for (int64_t r = 0; r < out_rows; ++r) {
    merged.clear();
    double max_lse = -INFINITY;
    for (int rk = 0; rk < world; ++rk) {
      int64_t vb, ve;
      ShardRange(vocab, rk, world, &vb, &ve);
      const float* b = host_gather_.data() + rk * cand;
      const float* v = b + r * kl;
      const int32_t* id = reinterpret_cast<const int32_t*>(b + out_rows * kl) + r * kl;
      lse[rk] = static_cast<double>(v[0]) - b[2 * out_rows * kl + r];
      max_lse = std::max(max_lse, lse[rk]);
      for (int32_t j = 0; j < kl; ++j) {
        merged.emplace_back(v[j], static_cast<int32_t>(vb + id[j]));
      }
    }
    double sum = 0;
    for (double l : lse) sum += std::exp(l - max_lse);
    const double global_lse = max_lse + std::log(sum);
    // Descending value, ties to the lower id (as TopK); NaN below every number.
    std::partial_sort(merged.begin(), merged.begin() + kk, merged.end(),
                      [](const auto& a, const auto& b) {
                        const bool an = std::isnan(a.first), bn = std::isnan(b.first);
                        if (an != bn) return bn;
                        if (!an && a.first != b.first) return a.first > b.first;
                        return a.second < b.second;
                      });
    for (int32_t j = 0; j < kk; ++j) {
      result->top_logprobs[r * kk + j] =
          static_cast<float>(static_cast<double>(merged[j].first) - global_lse);
      result->top_ids[r * kk + j] = merged[j].second;
    }
  }
  return Status::Ok();
}

}  // namespace deja::worker::model
