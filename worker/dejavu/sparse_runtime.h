// Deja Vu contextual sparsity at run time (docs/architecture.md#deja-vu-lookahead), for one
// tensor-parallel rank: the lookahead predictors (or the oracle used for speed runs on random
// weights), run on their own thread while the current block computes, and the per-block plans
// OptModel::Layer follows. On a device backend the predictors run on the device: on a second
// stream where the backend has one (CUDA), after a copy of the block's input made on the model's
// stream and ordered before theirs by an event, so they overlap the block; joined when Finish
// reads the selected ids back (only the ids come to the host, where the plans are made).
// Elsewhere (the simulated device) in the model's order.
//
// Pairing (as in training): the attention-block input of layer L predicts MLP L (started when
// layer L begins, joined before its fc1); the MLP-block input of layer L predicts the heads of
// layer L+1 (started when L's MLP begins, joined before L+1's attention). Layer 0's heads and
// the schedule's first layers run dense. Each rank keeps its own top-(k/N) of its own units.
//
// A block plan is one of:
//  - dense: nothing skipped (no sparse row, or a dense layer of the schedule);
//  - gather: every row is a sparse decode token; the block computes only the union of the
//    rows' active units with the gather kernels, and each row keeps only its own (keep), so a
//    token's result does not depend on the batch;
//  - masked: the block computes with the dense kernels and zeroes, per row, the units that row
//    skips. Prefill chunks and batches mixing dense and sparse sequences use it so every token
//    sees its own selection (the result a batch-1 decode of that token gives, up to summation
//    order); so does a decode batch whose union passes SparsityOptions::dense_fallback (the
//    dense kernels are then cheaper).
// Heads: a sequence whose cache accumulates attention scores (H2O) skips none (its scores would
// otherwise depend on the plan, that is on the batch).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/opt_config.h"
#include "common/status.h"
#include "common/tensor.h"
#include "kernels/backend.h"
#include "predictors/predictors.h"
#include "worker/model/model.h"
#include "worker/model/opt_weights.h"

namespace deja::worker::dejavu {

// Runs one job at a time on a dedicated thread.
class AsyncRunner {
 public:
  AsyncRunner();
  ~AsyncRunner();
  AsyncRunner(const AsyncRunner&) = delete;
  AsyncRunner& operator=(const AsyncRunner&) = delete;

  // Waits for the previous job, then starts `job`.
  void Post(std::function<void()> job);
  // Waits for the current job (if any).
  void Wait();

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread thread_;
};

using BlockPlan = model::BlockPlan;

class SparseRuntime final : public model::BlockSparsity {
 public:
  static StatusOr<std::unique_ptr<SparseRuntime>> Create(const model::SparsityOptions& options,
                                                         const OptConfig& config,
                                                         const model::OptWeights& weights,
                                                         kernels::Backend& backend, int rank,
                                                         int world);
  // Create as a LoadOptions::sparsity factory.
  static model::SparsityFactory Factory();
  ~SparseRuntime() override;

  const model::SparsityOptions& options() const { return options_; }
  // Transposed copies of the row-parallel weights, for the gather-transposed kernels.
  // The transposed fc2 / out_proj of a layer; int8 ones carry the original rows' scales, which
  // are the transposed matrix's column scales (GatherLinearT).
  TensorView fc2_t(int32_t layer) const override {
    return Transposed(fc2_t_[layer], fc2_scale_[layer]);
  }
  TensorView out_t(int32_t layer) const override {
    return Transposed(out_t_[layer], out_scale_[layer]);
  }
  // Per-layer top-k of this rank (0 = the block runs dense).
  int32_t mlp_k(int32_t layer) const { return mlp_k_[layer]; }
  int32_t head_k(int32_t layer) const { return head_k_[layer]; }

  // Sets up a step: which rows are sparse and whether the step is decode-shaped. Returns false
  // when no row is sparse (the step runs dense and no predictor runs).
  bool BeginStep(const std::vector<model::SequenceStep>& batch, int64_t rows) override;
  // Lookahead: predicts MLP `layer` from its attention-block input on the predictor thread.
  // `xa` is copied before returning.
  void StartMlp(int32_t layer, const TensorView& xa) override;
  // Predicts the heads of `layer` from the MLP-block input of layer - 1 (copied).
  void StartHeads(int32_t layer, const TensorView& xm) override;
  // Joins the prediction started for that block and turns it into a plan.
  Status FinishMlp(int32_t layer, BlockPlan* plan) override;
  Status FinishHeads(int32_t layer, BlockPlan* plan) override;
  // Seconds the predictor thread spent in this step so far, and the step's mean active
  // fractions (1 where dense).
  double predictor_seconds() const override { return predictor_seconds_; }
  float head_fraction() const override;
  float neuron_fraction() const override;

 private:
  SparseRuntime() = default;
  enum class Kind { kMlp, kHeads };
  struct Prediction {
    bool pending = false;
    bool ran = false;
    Status status;
    Tensor input;                   // [rows, d] copy of the block input (host backends)
    Tensor hidden;                  // [rows, r]
    Tensor scores;                  // [rows, local_units]
    Tensor top_values, top_ids;     // device backends: TopK's outputs [rows * groups, k / groups]
    bool ids_on_device = false;     // top_ids hold this prediction's ids, not yet read back
    std::vector<int32_t> selected;  // [rows, k] local unit indices
  };
  void Start(Kind kind, int32_t layer, const TensorView& x);
  Status Finish(Kind kind, int32_t layer, BlockPlan* plan);
  // On the predictor thread (host backends): fills p.selected for `rows` rows from `input`
  // [rows, d].
  Status Predict(Kind kind, int32_t layer, int64_t rows, const TensorView& input, Prediction& p);
  // Memory for `p`'s buffers: the backend's device, or the host.
  StatusOr<Tensor> Alloc(DType dtype, Shape shape) const;

  model::SparsityOptions options_;
  OptConfig config_;
  int rank_ = 0, world_ = 1;
  int64_t local_heads_ = 0, local_ffn_ = 0, head_dim_ = 0;
  int32_t groups_ = 1;  // selection groups on this rank (top-k taken within each)
  predictors::PredictorSet set_;
  bool have_predictors_ = false;
  bool async_ = false;  // predictors on their own thread (resolved from predictor_thread)
  bool on_device_ = false;  // the model's tensors (and the predictors) are device memory
  std::vector<int32_t> mlp_k_, head_k_;
  std::vector<Tensor> fc2_t_, out_t_;
  std::vector<const float*> fc2_scale_, out_scale_;  // int8 only: the weights' own scales
  static TensorView Transposed(const Tensor& t, const float* scale) {
    TensorView v = t.view();
    v.scale = scale;
    return v;
  }
  std::unique_ptr<kernels::Backend> predictor_backend_;  // single-threaded CPU, or a side stream
  kernels::Backend* backend_ = nullptr;                  // predictor_backend_ or the model's
  // Device backends with a side stream: the model's backend (the predictors' input is copied on
  // its stream, then ordered before theirs); null otherwise.
  kernels::Backend* model_backend_ = nullptr;

  // Per step.
  int64_t rows_ = 0;
  std::vector<uint8_t> row_sparse_;
  bool all_sparse_decode_ = false;
  // Heads: a sequence whose cache accumulates attention scores (H2O) attends with every head, so
  // its scores (and what it evicts) never depend on the batch; only its MLP is sparse.
  std::vector<uint8_t> row_heads_sparse_;
  bool all_sparse_decode_heads_ = false;
  std::vector<int32_t> union_slot_;  // Finish's scratch: a unit's place in a gather plan's union
  uint64_t step_ = 0;
  double predictor_seconds_ = 0;
  double head_sum_ = 0, neuron_sum_ = 0;
  int32_t head_blocks_ = 0, neuron_blocks_ = 0;

  Prediction mlp_pred_, head_pred_;
  AsyncRunner runner_;
};

}  // namespace deja::worker::dejavu
