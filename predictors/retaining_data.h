// The training data of the Locret retaining heads (retaining_heads.h): a directory with
// `meta.json` (written by the collector) and one `layer_<L>.safetensors` per layer holding
//   x       F16 [rows, heads, 3 * head_dim]  per head [q_h, k_h, v_h] of the token; q is the
//                                            q_proj output with its bias, NOT scaled by
//                                            head_dim^-0.5
//   label   F32 [rows, heads]                the target score of the token for the head (what it
//                                            is exactly is the collector's choice, described by
//                                            meta.json's "label"; for deja-retaining-data-v1 the
//                                            max pre-softmax logit later answer queries give it)
//   segment I32 [rows]                       the window the row comes from; consecutive rows with
//                                            the same segment are consecutive token positions
// meta.json holds at least {"format": "deja-retaining-data-v1", "layers", "heads", "head_dim",
// "rows" (per layer)}; the collector adds "context", "answer_tokens", "texts", "label", ...,
// which are kept verbatim (RetainingDataMeta::json) and copied into the trained heads' JSON.
// The files go through the small reader and writer of raw_safetensors.h, because the checkpoint
// reader of common/safetensors.h refuses I32.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace deja::predictors {

constexpr const char* kRetainingDataFormat = "deja-retaining-data-v1";

// One layer's rows.
struct RetainingLayerData {
  int32_t heads = 0, head_dim = 0;
  int64_t rows = 0;
  std::vector<uint16_t> x;       // f16 bits [rows, heads, 3 * head_dim]
  std::vector<float> label;      // [rows, heads]
  std::vector<int32_t> segment;  // [rows]
};

struct RetainingDataMeta {
  int32_t layers = 0, heads = 0, head_dim = 0;
  int64_t rows = 0;  // per layer
  std::string json;  // the whole meta.json
};

// Reads and checks `dir/meta.json`: FailedPrecondition when `dir` holds no retaining data (no
// meta.json, or another format), InvalidArgument naming the field when a dimension is missing or
// not a positive integer.
StatusOr<RetainingDataMeta> ReadRetainingDataMeta(const std::string& dir);

// Writes `dir/layer_<layer>.safetensors` atomically (a temporary file renamed into place).
// InvalidArgument when the vectors' sizes disagree with d.rows, d.heads and d.head_dim.
Status WriteRetainingLayerData(const std::string& dir, int32_t layer, const RetainingLayerData& d);

// Reads one layer's rows, checking every tensor's dtype and shape against `meta`, and refusing
// non-finite inputs or labels (a NaN would silently poison the training): the errors name the
// file, the tensor and, for values, the row and head.
StatusOr<RetainingLayerData> ReadRetainingLayerData(const std::string& dir,
                                                    const RetainingDataMeta& meta, int32_t layer);

// dir + "/layer_<layer>.safetensors".
std::string RetainingLayerDataPath(const std::string& dir, int32_t layer);

}  // namespace deja::predictors
