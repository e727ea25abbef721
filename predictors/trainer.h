// Training the Deja Vu predictors (docs/architecture.md#deja-vu-lookahead) from `deja-lab collect`
// data: per layer and kind two bias-free linear maps d -> r -> units (no activation between them),
// class-balanced BCE on the logits (positive weight 1 - w, negative weight w, w = mean training
// label), AdamW, minibatches, a deterministic 90/10 train/validation split, early stopping on
// validation recall (at sigmoid > 0.5), the best epoch kept. Then the per-layer top-k schedule: the
// smallest k whose validation top-k recall reaches the target; dense when only k = all does.
// Matmuls are OpenBLAS sgemm.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"
#include "predictors/predictor_data.h"

namespace deja::predictors {

struct TrainOptions {
  int32_t rank = 128;
  int32_t epochs = 20;
  int32_t batch = 1024;
  float lr = 1e-3f;
  float weight_decay = 0.01f;
  float target_recall = 0.95f;  // for the top-k schedule of the MLP (and heads, see below)
  // The heads' schedule target; <= 0: target_recall. A separate target because dropping a head
  // can cost more than dropping a neuron (the retrained opt-mini: docs/performance.md).
  float head_target_recall = 0.f;
  int32_t patience = 5;         // epochs without a better validation recall
  float stop_recall = 0.99f;    // stop as soon as the validation recall exceeds this
  int32_t threads = 2;          // OpenBLAS threads
  uint64_t seed = 0;

  // The heads' schedule target in effect.
  float HeadTargetRecall() const {
    return head_target_recall > 0 ? head_target_recall : target_recall;
  }
};

using LogFn = std::function<void(const std::string&)>;

// The deterministic split of `rows` rows: a seeded permutation, its first ceil(rows / 10)
// entries are validation rows (sorted), the rest training rows.
struct RowSplit {
  std::vector<int64_t> train, val;
};
RowSplit SplitRows(int64_t rows, uint64_t seed);

// Recall and precision of the top-k sets, averaged over rows, for every k in [1, units]
// (index k - 1). Rows without an active unit are left out of the recall average.
struct TopKCurve {
  std::vector<double> recall, precision;
};
TopKCurve EvaluateTopK(const float* logits, const BlockData& data,
                       const std::vector<int64_t>& rows);

struct BlockResult {
  Tensor fc1, fc2;  // f32 [r, d], [units, r], already rounded to f16 values
  int64_t train_rows = 0, val_rows = 0;
  double label_mean = 0;
  int32_t epochs_run = 0, best_epoch = 0;  // best_epoch is 1-based
  std::vector<double> train_loss, val_loss, val_recall, val_precision;
  // With the saved (f16) weights on the validation rows:
  double recall = 0, precision = 0;            // thresholded, logit > 0, over all unit-rows
  int32_t top_k = 0;                           // 0 = dense
  double topk_recall = 0, topk_precision = 0;  // at top_k (at all units when dense)
  double seconds = 0;
};

// `seed` picks this block's split and initialisation (TrainPredictors uses options.seed +
// 2 * layer + kind).
StatusOr<BlockResult> TrainBlock(const BlockData& data, const TrainOptions& options,
                                 uint64_t seed, const LogFn& log);
uint64_t BlockSeed(uint64_t seed, int32_t layer, BlockKind kind);

// Trains every predictor in `data_dir` layer by layer and writes `out_path` plus its JSON.
Status TrainPredictors(const std::string& data_dir, const std::string& out_path,
                       const TrainOptions& options, const LogFn& log);

}  // namespace deja::predictors
