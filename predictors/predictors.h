// Deja Vu lookahead predictors (docs/architecture.md#deja-vu-lookahead): per layer, an MLP
// predictor d -> r -> ffn and a head predictor d -> r -> n_heads, each two bias-free linear maps.
// On disk a predictor set is
// `<stem>.safetensors` (f16 tensors) plus `<stem>.json` (rank r, the per-layer top-k schedule,
// the trainer's per-layer recall and precision).
//
// Tensor names (L = layer index):
//   mlp.L.fc1  [r, d]       mlp.L.fc2  [ffn, r]      predict MLP L from the attention-block input
//                                                     of layer L
//   heads.L.fc1 [r, d]      heads.L.fc2 [n_heads, r] predict the heads of layer L from the
//                                                     MLP-block input of layer L-1 (L >= 1)
// A layer's predictor may be absent (that block runs dense); layer 0's heads always are.
//
// JSON: {"format": "deja-predictors-v1", "rank": r, "hidden_size": d, "ffn_dim": ffn,
//        "num_heads": h, "num_layers": n, "layers": [{"layer": L,
//          "mlp":   {"top_k": k, "recall": x, "precision": y},     // top_k 0 = dense
//          "heads": {"top_k": k, "recall": x, "precision": y}}, ...], ...extra training info}
// Tensors are f16 on disk and stay f16 in memory after loading. SavePredictors below writes the
// pair; predictors/trainer.h trains it from `deja-lab collect` data (predictors/collect.h,
// predictors/predictor_data.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/opt_config.h"
#include "common/status.h"
#include "common/tensor.h"

namespace deja::predictors {

struct BlockSchedule {
  int32_t top_k = 0;          // units kept for the whole model (not per rank); 0 = dense
  float recall = -1.0f;       // measured by the trainer on validation rows at top_k (-1: none)
  float precision = -1.0f;
};

struct LayerSchedule {
  BlockSchedule mlp;
  BlockSchedule heads;
};

struct PredictorMeta {
  int32_t rank = 0;
  int32_t hidden_size = 0, ffn_dim = 0, num_heads = 0, num_layers = 0;
  std::vector<LayerSchedule> layers;  // num_layers entries
};

// One tensor-parallel rank's predictors: the first maps replicated, the second maps split by
// rank (this rank's rows: its neurons / its heads, ShardRange order). Empty tensors where a
// layer has no predictor.
struct LayerPredictors {
  Tensor mlp_fc1, mlp_fc2;    // [r, d], [local_ffn, r]
  Tensor head_fc1, head_fc2;  // [r, d], [local_heads, r]
};

struct PredictorSet {
  PredictorMeta meta;
  std::vector<LayerPredictors> layers;
};

// The JSON path that goes with a predictor safetensors path (stem + ".json").
std::string MetaPathFor(const std::string& safetensors_path);

// Loads and validates a predictor set for `config` (dimensions must match; a clear error naming
// the file and tensor otherwise) and keeps rank `rank` of `world`'s part.
StatusOr<PredictorSet> LoadPredictors(const std::string& safetensors_path,
                                      const OptConfig& config, int rank, int world);

// Reads and validates only the JSON half (dimensions not checked against a model).
StatusOr<PredictorMeta> LoadPredictorMeta(const std::string& json_path);

// Writes `<path>` (f16, whatever dtype the tensors have) and MetaPathFor(path). `layers` holds
// the full (world 1) predictors, meta.num_layers entries; empty tensors = no predictor. The
// JSON object `extra_json` ("" for none) is merged into the JSON's top level (training info).
Status SavePredictors(const std::string& path, const PredictorMeta& meta,
                      const std::vector<LayerPredictors>& layers,
                      const std::string& extra_json = "");

// Rows [*begin, *end) of `total` that rank `rank` of `world` owns (worker::model::ShardRange
// order).
void PredictorShardRange(int64_t total, int rank, int world, int64_t* begin, int64_t* end);

}  // namespace deja::predictors
