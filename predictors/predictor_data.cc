// Collected predictor training data (F16 inputs, U8 labels) through the small safetensors reader
// and writer of raw_safetensors.h.
#include "predictors/predictor_data.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "predictors/json_fields.h"
#include "predictors/raw_safetensors.h"

namespace deja::predictors {

using nlohmann::json;

int32_t HeadTopCount(int32_t num_heads) {
  // ceil, with a guard against 0.3 * 10 = 3.0000000000000004.
  return static_cast<int32_t>(std::ceil(kHeadTopFraction * num_heads - 1e-9));
}

const char* BlockKindName(BlockKind kind) { return kind == BlockKind::kMlp ? "mlp" : "heads"; }

std::string LayerDataPath(const std::string& dir, int32_t layer) {
  return dir + "/layer_" + std::to_string(layer) + ".safetensors";
}

StatusOr<DataMeta> ReadDataMeta(const std::string& dir) {
  const std::string path = dir + "/meta.json";
  std::ifstream in(path);
  if (!in) {
    return FailedPrecondition(dir + " is not `deja-lab collect` output (no readable meta.json)");
  }
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("format", "") != kDataFormat) {
    return FailedPrecondition(path + " is not `deja-lab collect` metadata (format must be \"" +
                              std::string(kDataFormat) + "\")");
  }
  DataMeta m;
  m.json = ss.str();
  const std::pair<const char*, int32_t*> fields[] = {{"hidden_size", &m.hidden_size},
                                                     {"ffn_dim", &m.ffn_dim},
                                                     {"num_heads", &m.num_heads},
                                                     {"num_layers", &m.num_layers}};
  for (const auto& [key, dst] : fields) {
    DEJA_ASSIGN_OR_RETURN(*dst, JsonPositiveInt(j, key, path));
  }
  DEJA_ASSIGN_OR_RETURN(m.rows, JsonCount(j, "rows", path));
  return m;
}

StatusOr<BlockData> ReadBlockData(const std::string& dir, const DataMeta& meta, int32_t layer,
                                  BlockKind kind) {
  if (layer < 0 || layer >= meta.num_layers || (kind == BlockKind::kHeads && layer == 0)) {
    return InvalidArgument("no " + std::string(BlockKindName(kind)) + " data for layer " +
                           std::to_string(layer));
  }
  DEJA_ASSIGN_OR_RETURN(RawSafetensorsFile file,
                        RawSafetensorsFile::Open(LayerDataPath(dir, layer)));
  BlockData b;
  b.rows = meta.rows;
  b.dim = meta.hidden_size;
  b.units = kind == BlockKind::kMlp ? meta.ffn_dim : meta.num_heads;
  b.x.resize(static_cast<size_t>(b.rows * b.dim));
  b.y.resize(static_cast<size_t>(b.rows * b.label_bytes()));
  const std::string k = BlockKindName(kind);
  DEJA_RETURN_IF_ERROR(file.Read(k + ".x", "F16", {b.rows, b.dim}, b.x.data(), b.x.size() * 2));
  DEJA_RETURN_IF_ERROR(
      file.Read(k + ".y", "U8", {b.rows, b.label_bytes()}, b.y.data(), b.y.size()));
  return b;
}

Status WriteLayerData(const std::string& dir, int32_t layer, const BlockData& mlp,
                      const BlockData& heads) {
  std::vector<std::pair<std::string, RawTensor>> ts;
  for (const auto& [kind, b] : {std::pair<const char*, const BlockData*>{"mlp", &mlp},
                                std::pair<const char*, const BlockData*>{"heads", &heads}}) {
    if (b->rows == 0 && b->x.empty()) continue;
    ts.push_back({std::string(kind) + ".x", {"F16", {b->rows, b->dim}, b->x.data(), b->x.size() * 2}});
    ts.push_back({std::string(kind) + ".y",
                  {"U8", {b->rows, b->label_bytes()}, b->y.data(), b->y.size()}});
  }
  return WriteRawSafetensors(LayerDataPath(dir, layer), ts);
}

}  // namespace deja::predictors
