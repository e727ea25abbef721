// OptModel's decode steps as captured op graphs (CUDA graphs on a GPU; the simulated device
// records and replays closures): a step whose sequences each decode one token runs one fixed
// program whose every per-step value (token ids, positions, block tables, slots, lengths) is read
// from one device buffer uploaded before it, over the batch padded to a power of two. The program
// of each (padded batch, block-table width) is run eagerly the first time (so the backend's
// scratch reaches its size), captured the second and replayed from then on.
#include <algorithm>
#include <array>
#include <utility>
#include <vector>

#include <glog/logging.h>

#include "kernels/ops.h"
#include "worker/model/opt_model.h"
#include "worker/model/opt_model_internal.h"

namespace deja::worker::model {

using opt_internal::Rows;

namespace {

// Above this many sequences a decode step runs eagerly.
constexpr int32_t kMaxGraphBatch = 256;

int32_t PaddedBatch(int32_t seqs) {
  int32_t b = 1;
  while (b < seqs) b *= 2;
  return b;
}

}  // namespace

bool OptModel::GraphableStep(const std::vector<SequenceStep>& batch) const {
  if (!decode_graphs_ || !on_device_ || !backend_->SupportsGraphs() || observer_ != nullptr ||
      comm_->world_size() != 1 || batch.empty() ||
      static_cast<int32_t>(batch.size()) > kMaxGraphBatch) {
    return false;
  }
  for (const SequenceStep& s : batch) {
    // Full logits are copied to the host mid-step; sparse rows plan per step on the host.
    if (s.n != 1 || s.full_logits || (s.sparse && sparse_ != nullptr)) return false;
  }
  return true;
}

std::array<uint64_t, 3> OptModel::GraphEpoch() const {
  return {alloc_epoch_, kv_attention_.buffers_epoch(), backend_->graph_epoch()};
}

StatusOr<bool> OptModel::ForwardGraph(const std::vector<SequenceStep>& batch, StepResult* result) {
  const int32_t seqs = static_cast<int32_t>(batch.size());
  const int32_t padded = PaddedBatch(seqs);
  const int64_t vocab = config_.vocab_size;
  const int32_t kk = static_cast<int32_t>(std::min<int64_t>(kDeviceTopCandidates, vocab));
  // Everything the program points at, allocated before it runs or is captured.
  DEJA_RETURN_IF_ERROR(EnsureWorkspace(padded));
  if (logits_dev_.empty() || logits_dev_.shape()[0] < padded) {
    const int64_t rows = std::max<int64_t>(padded, ws_rows_);
    DEJA_ASSIGN_OR_RETURN(logits_dev_, Alloc(DType::kF32, {rows, vocab}));
    DEJA_ASSIGN_OR_RETURN(top_dev_, Alloc(DType::kF32, {rows, 2 * kDeviceTopCandidates}));
  }
  // Token ids, then position rows; padding rows read token 0 at position 0.
  graph_extra_.assign(static_cast<size_t>(2 * padded), 0);
  for (int32_t i = 0; i < padded; ++i) {
    graph_extra_[padded + i] = i < seqs ? pos_rows_[i] : opt_internal::kPositionOffset;
    if (i < seqs) graph_extra_[i] = ids_[i];
  }
  DEJA_ASSIGN_OR_RETURN(bool ok,
                        kv_attention_.PrepareGraphStep(batch, tok_pos_.data(), padded, graph_extra_));
  if (!ok) return false;
  step_sparse_ = false;
  const GraphKey key{padded, kv_attention_.graph_max_blocks()};
  if (const std::array<uint64_t, 3> epoch = GraphEpoch(); epoch != graphs_epoch_) {
    graphs_.clear();  // captured over buffers since reallocated
    graphs_epoch_ = epoch;
  }
  Status run;
  auto it = graphs_.find(key);
  if (it != graphs_.end()) {
    run = backend_->Replay(*it->second);
    ++graph_stats_.replays;
  } else if (!graph_replay_ || warmed_.count(key) == 0 || uncapturable_.count(key) != 0) {
    run = GraphStepOps(batch, padded);  // eagerly: the backend's scratch grows to this shape
    warmed_.insert(key);
    ++graph_stats_.eager;
  } else {
    DEJA_RETURN_IF_ERROR(backend_->BeginCapture());
    const Status ops = GraphStepOps(batch, padded);
    StatusOr<std::unique_ptr<kernels::OpGraph>> graph = backend_->EndCapture();
    if (ops.ok() && graph.ok()) {
      ++graph_stats_.captures;
      run = backend_->Replay(**graph);
      ++graph_stats_.replays;
      graphs_.emplace(key, std::move(*graph));
    } else {
      const Status why = !ops.ok() ? ops : graph.status();
      LOG(WARNING) << "decode step of " << padded << " sequences could not be captured (" << why.ToString()
                   << "); it runs eagerly";
      uncapturable_.insert(key);
      ++graph_stats_.capture_failures;
      run = GraphStepOps(batch, padded);
      ++graph_stats_.eager;
    }
  }
  kv_attention_.EndGraphStep();
  DEJA_RETURN_IF_ERROR(run);

  result->row_seq.resize(static_cast<size_t>(seqs));
  for (int32_t i = 0; i < seqs; ++i) result->row_seq[i] = i;
  if (result->logits.empty() || result->logits.shape()[0] < seqs ||
      result->logits.shape()[1] != vocab) {
    result->logits = Tensor::Empty(DType::kF32, {seqs, vocab});
  }
  result->active_head_fraction = result->active_neuron_fraction = 1.0f;
  result->predictor_seconds = 0.0;
  result->top_k = kk;
  result->top_logprobs.resize(static_cast<size_t>(seqs) * kk);
  result->top_ids.resize(static_cast<size_t>(seqs) * kk);
  const float* values = top_dev_.as<float>();
  const int32_t* ids = reinterpret_cast<const int32_t*>(values + static_cast<int64_t>(padded) * kk);
  DEJA_RETURN_IF_ERROR(backend_->CopyDeviceToHost(result->top_logprobs.data(), values,
                                                  result->top_logprobs.size() * sizeof(float)));
  DEJA_RETURN_IF_ERROR(backend_->CopyDeviceToHost(result->top_ids.data(), ids,
                                                  result->top_ids.size() * sizeof(int32_t)));
  return true;
}

// The step's program over `rows` (the padded batch): no host array, no copy, no allocation.
Status OptModel::GraphStepOps(const std::vector<SequenceStep>& batch, int64_t rows) {
  kernels::Backend& be = *backend_;
  const int64_t d = config_.hidden_size, p = config_.word_embed_proj_dim;
  const int64_t vocab = config_.vocab_size;
  const int32_t kk = static_cast<int32_t>(std::min<int64_t>(kDeviceTopCandidates, vocab));
  TensorView ids{const_cast<int32_t*>(kv_attention_.graph_extra()), DType::kI32, Shape{rows}};
  ids.device = be.device();
  TensorView pos = ids;
  pos.data = const_cast<int32_t*>(kv_attention_.graph_extra()) + rows;
  TensorView h = Rows(h_, rows, d);
  if (w_.project_in.w.data != nullptr) {
    TensorView e = Rows(emb_, rows, p);
    DEJA_RETURN_IF_ERROR(kernels::EmbeddingDeviceIds(be, w_.embed_tokens, ids, false, e));
    DEJA_RETURN_IF_ERROR(
        kernels::Linear(be, e, w_.project_in.w, {}, kernels::Activation::kNone, false, h));
  } else {
    DEJA_RETURN_IF_ERROR(kernels::EmbeddingDeviceIds(be, w_.embed_tokens, ids, false, h));
  }
  DEJA_RETURN_IF_ERROR(kernels::EmbeddingDeviceIds(be, w_.embed_positions, pos, true, h));
  for (int32_t l = 0; l < config_.num_hidden_layers; ++l) {
    DEJA_RETURN_IF_ERROR(Layer(l, batch, rows));
  }
  // Row i is sequence i's one token: no gather.
  DEJA_ASSIGN_OR_RETURN(const TensorView x, HeadInput(h));
  TensorView out = Rows(logits_dev_, rows, vocab);
  DEJA_RETURN_IF_ERROR(
      kernels::Linear(be, x, w_.lm_head.w, {}, kernels::Activation::kNone, false, out));
  DEJA_RETURN_IF_ERROR(kernels::LogSoftmax(be, out, out));
  float* values = top_dev_.as<float>();
  int32_t* top_ids = reinterpret_cast<int32_t*>(values + rows * kk);
  return kernels::TopK(be, out, kk, values, top_ids);
}

}  // namespace deja::worker::model
