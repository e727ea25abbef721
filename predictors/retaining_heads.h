// Locret retaining heads: per layer L and attention head h, a small MLP that scores each cached
// token, s = w2_h . relu(W1_h x + b1_h) + b2_h, where x = [q_h, k_h, v_h] is the concatenation of
// that head's query (the q_proj output with its bias, NOT multiplied by head_dim^-0.5), key and
// value vectors for the token (3 * head_dim floats). The KV cache keeps the tokens with the
// highest scores.
//
// The heads are independent: this is a block-diagonal form of the paper's retaining head (one
// MLP over all heads' q, k, v), chosen so that tensor-parallel rank r, which holds the model's
// heads [r * H / world, (r + 1) * H / world), can load just its heads' MLPs and compute exactly
// the scores one process would.
//
// On disk a set is `<stem>.safetensors` with, per layer L (heads = the model's heads),
//   layers.L.w1 F16 [heads, hidden, 3 * head_dim]
//   layers.L.b1 F16 [heads, hidden]
//   layers.L.w2 F16 [heads, hidden]
//   layers.L.b2 F16 [heads]
// (f16 like the Deja Vu predictors; the trainer reports everything with the f16-rounded weights)
// plus `<stem>.json` beside it:
//   {"format": "deja-retaining-heads-v1", "layers", "heads", "head_dim", "hidden",
//    "activation": "relu", "input": "[q, k, v] of the head, q unscaled",
//    "label": <the training data's description of the target>, "training": {...}}
// retaining_trainer.h trains a set from retaining_data.h data.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace deja::predictors {

constexpr const char* kRetainingHeadsFormat = "deja-retaining-heads-v1";

struct RetainingHeads {
  int32_t layers = 0, heads = 0 /* held here */, head_dim = 0, hidden = 0;
  int32_t first_head = 0;  // of the model's heads
  // Per layer, f32, the layouts as on disk but only the heads held here:
  // w1 [heads, hidden, 3 * head_dim], b1 [heads, hidden], w2 [heads, hidden], b2 [heads].
  std::vector<std::vector<float>> w1, b1, w2, b2;
  std::string json;  // the whole JSON (empty when built in memory)

  int32_t input_dim() const { return 3 * head_dim; }
};

// Loads the heads [rank * H / world, (rank + 1) * H / world) of every layer (H = `heads`, the
// model's head count), from `safetensors_path` and the JSON beside it (stem + ".json").
// InvalidArgument when world does not divide the heads, or when a file is malformed (wrong
// format, dtype or shape, a missing or unexpected tensor, a non-finite value), naming the file
// and the field or tensor; FailedPrecondition when the JSON's layers, heads or head_dim differ
// from the model's (the set was trained for another model), naming what differs.
StatusOr<RetainingHeads> LoadRetainingHeads(const std::string& safetensors_path, int32_t layers,
                                            int32_t heads, int32_t head_dim, int rank = 0,
                                            int world = 1);

// Writes `safetensors_path` (the weights rounded to f16) and the JSON beside it, both through a
// temporary file renamed into place. `all_heads` must hold every head (first_head 0). The JSON
// object `training_info` is stored as "training", except its "label" entry, which describes
// the target and so goes to the JSON's top level (absent: "label" is null). InvalidArgument when
// the vectors' sizes disagree with the dimensions, or a weight is not finite once rounded to f16.
Status SaveRetainingHeads(const std::string& safetensors_path, const RetainingHeads& all_heads,
                          const nlohmann::json& training_info);

// The plain score of one token for (layer, local head `head`) given x = [q_h, k_h, v_h]
// (3 * head_dim floats), accumulated in f32 in index order: the reference that tests and the
// trainer's reported losses use.
float RetainingScore(const RetainingHeads& r, int32_t layer, int32_t head, const float* x);

// The JSON path that goes with a retaining heads safetensors path (stem + ".json").
std::string RetainingMetaPathFor(const std::string& safetensors_path);

}  // namespace deja::predictors
