// Training the Locret retaining heads (retaining_heads.h) from retaining_data.h data: per layer
// and head an independent MLP 3 * head_dim -> hidden -> 1 (relu), trained on
//   SmoothL1(pred, label) (beta 1, PyTorch's definition), mean over (rows, heads)
//   + alpha * (pred_i - pred_{i-1})^2 for rows whose previous row is the previous token of the
//     same window (same segment), mean over (neighbour pairs, heads)
// with AdamW on minibatches of contiguous runs of rows (so that neighbour pairs exist inside a
// batch), a split by window (a seeded ~10% of the segments are validation, so no neighbour pair
// straddles the split), early stopping on the validation loss, and the best epoch's weights of
// each head kept. Heads are spread over threads; each head's matmuls are OpenBLAS sgemm on one
// thread, so the result does not depend on the thread count.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "predictors/retaining_data.h"
#include "predictors/retaining_heads.h"

namespace deja::predictors {

struct RetainingTrainOptions {
  int32_t hidden = 64;
  float alpha = 0.0025f;  // weight of the neighbour term
  float lr = 1e-3f;
  float weight_decay = 0.01f;  // AdamW, decoupled; on W1 and w2, not on the biases
  int32_t epochs = 10;
  int32_t patience = 2;  // epochs without a better validation loss (of the layer)
  int32_t batch = 256;   // rows per minibatch (whole runs; a single run may exceed it)
  int32_t run = 32;      // rows per contiguous run the batches are cut from
  int32_t threads = 2;   // heads trained concurrently
  uint64_t seed = 0;
  int64_t max_rows = 0;  // use only the first max_rows rows of each layer (0: all)
};

// The same alias as trainer.h's: one progress line at a time.
using LogFn = std::function<void(const std::string&)>;

// The split by window: the distinct segment ids are shuffled with `seed`; the first
// ceil(n / 10) are validation windows. Rows are listed in increasing order. Every layer uses the
// same seed, so the validation windows are the same tokens in every layer.
struct RetainingSplit {
  std::vector<int64_t> train, val;
  std::vector<int32_t> val_segments;  // sorted
};
RetainingSplit SplitBySegment(const std::vector<int32_t>& segment, uint64_t seed);

// The loss of `rows` (increasing row indices) with the heads held in `r` (data head
// r.first_head + h for local head h), computed with RetainingScore: smooth_l1 is the mean over
// (rows, heads), neighbour the mean over (pairs, heads) of (pred_i - pred_{i-1})^2, where a pair
// is row i and row i - 1 both in `rows` with the same segment; total = smooth_l1 + alpha *
// neighbour (neighbour 0 when there is no pair).
struct RetainingLoss {
  double total = 0, smooth_l1 = 0, neighbour = 0;
  int64_t rows = 0, pairs = 0;
};
RetainingLoss EvaluateRetainingLoss(const RetainingHeads& r, int32_t layer,
                                    const RetainingLayerData& data,
                                    const std::vector<int64_t>& rows, float alpha);

// Per window and head, the fraction of the window's top ceil(fraction * n) rows by label (n:
// its rows among `rows`) that are also among its top ceil(fraction * n) by `pred`, averaged
// over (window, head); ties go to the lower row. `pred` is [rows.size(), heads], in the order of
// `rows`. A random ranking scores about `fraction`. The Locret cache keeps the top-scored
// tokens, so this is what decides which tokens survive, where the loss also weighs the order
// among the tokens that are evicted anyway.
double TopFractionRecall(const std::vector<float>& pred, const RetainingLayerData& data,
                         const std::vector<int64_t>& rows, double fraction);

constexpr double kRankingFraction = 0.2;

struct RetainingLayerResult {
  // All heads, f32 values already rounded to f16 (exactly what is saved).
  std::vector<float> w1, b1, w2, b2;
  int64_t rows = 0, train_rows = 0, val_rows = 0, val_pairs = 0;
  int32_t val_windows = 0;
  std::vector<double> label_mean;            // per head, on the training rows (b2's initial value)
  int32_t epochs_run = 0, best_epoch = 0;    // best_epoch: 1-based, of the layer's mean val loss
  std::vector<int32_t> head_best_epoch;      // per head (each head keeps its own best epoch)
  std::vector<double> train_loss, val_loss;  // per epoch, mean over heads
  // With the saved (f16) weights, through RetainingScore, on the validation rows:
  RetainingLoss val;
  double val_top_recall = 0;      // TopFractionRecall at kRankingFraction
  double val_loss_mean_pred = 0;  // smooth-L1 of predicting each head's training mean label
  double seconds = 0;
};

// Trains every head of one layer. `layer` only picks the seeds (initialisation, batch order).
StatusOr<RetainingLayerResult> TrainRetainingLayer(const RetainingLayerData& data,
                                                   const RetainingTrainOptions& options,
                                                   int32_t layer, const LogFn& log);

// Trains every layer in `data_dir` and writes `out_path` plus its JSON (retaining_heads.h).
Status TrainRetainingHeads(const std::string& data_dir, const std::string& out_path,
                           const RetainingTrainOptions& options, const LogFn& log);

}  // namespace deja::predictors
