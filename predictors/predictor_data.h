// The training data `deja-lab collect` writes and `deja-lab train-predictors` reads: a directory with
// `meta.json` and one `layer_<L>.safetensors` per layer holding
//   mlp.x   F16 [rows, d]                 the attention-block input of layer L (pre-LN residual)
//   mlp.y   U8  [rows, ceil(ffn / 8)]     labels relu(fc1) > 0, bit-packed
//   heads.x F16 [rows, d]                 the MLP-block input of layer L-1      (L >= 1 only)
//   heads.y U8  [rows, ceil(heads / 8)]   labels "head among the top ceil(0.3 * heads) attention-
//                                          output L2 norms of its token", bit-packed
// Bit packing: unit j of a row is bit (j % 8) (least significant first) of byte j / 8. Row i of
// every tensor of every layer is the same token. The common checkpoint reader has no U8, so this
// file has its own small, strict safetensors reader and writer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace deja::predictors {

constexpr const char* kDataFormat = "deja-predictor-data-v1";
// Heads labelled important per token: ceil(kHeadTopFraction * heads)
// (docs/architecture.md#deja-vu-lookahead: top 30%).
constexpr double kHeadTopFraction = 0.3;
int32_t HeadTopCount(int32_t num_heads);

// One predictor's rows: inputs (f16 bits) and bit-packed labels.
struct BlockData {
  int64_t rows = 0, dim = 0, units = 0;
  std::vector<uint16_t> x;  // [rows, dim] f16
  std::vector<uint8_t> y;   // [rows, LabelBytes(units)]
  int64_t label_bytes() const { return (units + 7) / 8; }
  bool Label(int64_t row, int64_t unit) const {
    return (y[row * label_bytes() + unit / 8] >> (unit % 8)) & 1;
  }
};

struct DataMeta {
  int32_t hidden_size = 0, ffn_dim = 0, num_heads = 0, num_layers = 0;
  int64_t rows = 0;  // per layer (mlp and heads alike)
  std::string json;  // the whole meta.json, for reporting
};

enum class BlockKind { kMlp, kHeads };
const char* BlockKindName(BlockKind kind);  // "mlp" / "heads"

// Reads `dir/meta.json`; FailedPrecondition when `dir` is not collect output.
StatusOr<DataMeta> ReadDataMeta(const std::string& dir);
// Reads one predictor's rows, checking every shape against `meta`.
StatusOr<BlockData> ReadBlockData(const std::string& dir, const DataMeta& meta, int32_t layer,
                                  BlockKind kind);
// Writes layer_<layer>.safetensors (heads may be empty for layer 0) atomically.
Status WriteLayerData(const std::string& dir, int32_t layer, const BlockData& mlp,
                      const BlockData& heads);
std::string LayerDataPath(const std::string& dir, int32_t layer);

}  // namespace deja::predictors
