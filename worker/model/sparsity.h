// Contextual sparsity as the model sees it: the options, the plan of each block and the runtime
// interface the model calls. Deja Vu's runtime (worker/dejavu/sparse_runtime.h) implements it
// and plugs in through LoadOptions::sparsity, so the model depends on this interface only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/opt_config.h"
#include "common/status.h"
#include "common/tensor.h"
#include "kernels/backend.h"

namespace deja::worker::model {

struct OptWeights;
struct SequenceStep;

// Deja Vu contextual sparsity (docs/architecture.md#deja-vu) for Model::EnableSparsity.
struct SparsityOptions {
  std::string predictors;  // predictor safetensors (its .json beside it); "" = none
  // > 0 (and no predictors): oracle mode for speed runs on random-weight checkpoints, which
  // keeps this fraction of heads and neurons (pseudo-random, per token) in every sparse layer.
  float oracle_fraction = 0.0f;
  // Overrides of the predictors' schedule (or of oracle_fraction): fractions of neurons / heads
  // kept in sparse layers (0 = the schedule's top-k) and how many first layers stay dense (-1 =
  // the schedule's).
  float mlp_fraction = 0.0f;
  float head_fraction = 0.0f;
  int32_t dense_layers = -1;
  // A batched step computes the union of its sequences' active sets; above this fraction of a
  // block's units it runs that block dense.
  float dense_fallback = 0.8f;
  // Top-k is taken within this many equal groups of each block's units across the model (a
  // multiple of the world size; 0 = one group per rank, as the design's per-rank top-(k/N)).
  // Lets a single process reproduce exactly what N ranks select (tests).
  int32_t selection_groups = 0;
  // Where the predictors run: kOwnThread overlaps them with the block compute (the design);
  // kInline runs them on the forward thread with all the model's threads; kAuto takes its own
  // thread only when the machine has a core that the model's thread pool leaves free. Measured on
  // 2 cores with a 2-thread pool (OPT-1.3B shape, batch 1): own thread 53.9 ms per sparse step,
  // predictor 5.2 ms; inline 52.1 ms, predictor 3.9 ms.
  enum class PredictorThread { kAuto, kOwnThread, kInline };
  PredictorThread predictor_thread = PredictorThread::kAuto;
};

// What one block computes in a step (the runtime's plan; see worker/dejavu/sparse_runtime.h):
//  - dense: nothing skipped;
//  - gather: every row is a sparse decode token; the block computes only the union of the rows'
//    active units with the gather kernels, and each row keeps only its own (keep);
//  - masked: the dense kernels, then each row's skipped units zeroed.
struct BlockPlan {
  enum class Mode { kDense, kGather, kMasked };
  Mode mode = Mode::kDense;
  std::vector<int32_t> units;  // kGather: the union of active local units, ascending
  // kMasked: [rows, local_units], 1 = computed for that row. kGather with several rows:
  // [rows, units.size()], 1 where that row selected the unit (the others computed the union;
  // each row keeps only its own, so its result does not depend on the batch); empty for one row.
  std::vector<uint8_t> keep;
  // kMasked: [rows], 1 for a row that skips units. Such a row's reduction (out_proj, fc2) takes
  // the gather path's transposed kernel over every unit, its skipped ones zero, so its bits are
  // those of any gather plan whose union holds its units; a row that skips nothing keeps the
  // dense Linear. Either way a row's result does not depend on the rows beside it.
  std::vector<uint8_t> sparse_rows;
  float active_fraction = 1.0f;
};

// The sparsity runtime of one rank, driven by the model layer by layer. Pairing: the
// attention-block input of layer L predicts MLP L; the MLP-block input of layer L predicts the
// heads of layer L + 1.
class BlockSparsity {
 public:
  virtual ~BlockSparsity() = default;
  // Sets up a step; false when no row is sparse (the step runs dense).
  virtual bool BeginStep(const std::vector<SequenceStep>& batch, int64_t rows) = 0;
  // Starts the prediction for MLP `layer` from its attention-block input (copied).
  virtual void StartMlp(int32_t layer, const TensorView& xa) = 0;
  // Starts the prediction for the heads of `layer` from the MLP-block input of layer - 1.
  virtual void StartHeads(int32_t layer, const TensorView& xm) = 0;
  // Joins the prediction started for that block and turns it into a plan.
  virtual Status FinishMlp(int32_t layer, BlockPlan* plan) = 0;
  virtual Status FinishHeads(int32_t layer, BlockPlan* plan) = 0;
  // The transposed fc2 / out_proj of a layer, for the gather-transposed kernels.
  virtual TensorView fc2_t(int32_t layer) const = 0;
  virtual TensorView out_t(int32_t layer) const = 0;
  // This step so far: seconds in the predictors, mean active fractions (1 where dense).
  virtual double predictor_seconds() const = 0;
  virtual float head_fraction() const = 0;
  virtual float neuron_fraction() const = 0;
};

using SparsityFactory = std::function<StatusOr<std::unique_ptr<BlockSparsity>>(
    const SparsityOptions& options, const OptConfig& config, const OptWeights& weights,
    kernels::Backend& backend, int rank, int world)>;

}  // namespace deja::worker::model
