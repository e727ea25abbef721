// Collected predictor training data: a minimal safetensors writer/reader for F16 and U8 tensors.
#include "predictors/predictor_data.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

namespace deja::predictors {
namespace {

using nlohmann::json;

struct RawTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t bytes = 0;
};

Status WriteRaw(const std::string& path, const std::vector<std::pair<std::string, RawTensor>>& ts) {
  json header = json::object();
  size_t offset = 0;
  for (const auto& [name, t] : ts) {
    header[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes}}};
    offset += t.bytes;
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8 != 0) h.push_back(' ');
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    uint64_t n = h.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(h.data(), static_cast<std::streamsize>(h.size()));
    for (const auto& [name, t] : ts) {
      out.write(static_cast<const char*>(t.data), static_cast<std::streamsize>(t.bytes));
    }
    if (!out.good()) return Unavailable("cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return Unavailable("cannot rename " + tmp + " to " + path);
  }
  return Status::Ok();
}

// Reads one tensor's bytes after validating dtype and shape against the header.
Status ReadTensor(std::ifstream& in, const std::string& path, const json& header,
                  uint64_t data_start, uint64_t file_size, const std::string& name,
                  const std::string& dtype, const std::vector<int64_t>& shape, void* dst,
                  size_t bytes) {
  auto it = header.find(name);
  if (it == header.end()) return InvalidArgument(path + ": tensor '" + name + "' is missing");
  const json& t = *it;
  if (!t.is_object() || !t.contains("dtype") || t["dtype"] != dtype) {
    return InvalidArgument(path + ": tensor '" + name + "' must have dtype " + dtype);
  }
  if (!t.contains("shape") || t["shape"] != json(shape)) {
    return InvalidArgument(path + ": tensor '" + name + "' has shape " +
                           (t.contains("shape") ? t["shape"].dump() : "?") + ", expected " +
                           json(shape).dump());
  }
  const json& off = t.value("data_offsets", json());
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
      !off[1].is_number_unsigned() || off[1].get<uint64_t>() < off[0].get<uint64_t>() ||
      off[1].get<uint64_t>() - off[0].get<uint64_t>() != bytes ||
      data_start + off[1].get<uint64_t>() > file_size) {
    return InvalidArgument(path + ": tensor '" + name + "' has bad data_offsets");
  }
  in.seekg(static_cast<std::streamoff>(data_start + off[0].get<uint64_t>()));
  in.read(static_cast<char*>(dst), static_cast<std::streamsize>(bytes));
  if (!in.good()) return DataLoss(path + ": cannot read tensor '" + name + "'");
  return Status::Ok();
}

}  // namespace

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
    return FailedPrecondition(dir + " is not `deja collect` output (no readable meta.json)");
  }
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("format", "") != kDataFormat) {
    return FailedPrecondition(path + " is not `deja collect` metadata (format must be \"" +
                              std::string(kDataFormat) + "\")");
  }
  DataMeta m;
  m.json = ss.str();
  const std::pair<const char*, int32_t*> fields[] = {{"hidden_size", &m.hidden_size},
                                                     {"ffn_dim", &m.ffn_dim},
                                                     {"num_heads", &m.num_heads},
                                                     {"num_layers", &m.num_layers}};
  for (const auto& [key, dst] : fields) {
    if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() <= 0 ||
        j[key].get<int64_t>() > (1 << 20)) {
      return InvalidArgument(path + ": '" + key + "' must be a positive integer");
    }
    *dst = j[key].get<int32_t>();
  }
  if (!j.contains("rows") || !j["rows"].is_number_integer() || j["rows"].get<int64_t>() < 0) {
    return InvalidArgument(path + ": 'rows' must be a non-negative integer");
  }
  m.rows = j["rows"].get<int64_t>();
  return m;
}

StatusOr<BlockData> ReadBlockData(const std::string& dir, const DataMeta& meta, int32_t layer,
                                  BlockKind kind) {
  if (layer < 0 || layer >= meta.num_layers || (kind == BlockKind::kHeads && layer == 0)) {
    return InvalidArgument("no " + std::string(BlockKindName(kind)) + " data for layer " +
                           std::to_string(layer));
  }
  const std::string path = LayerDataPath(dir, layer);
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open " + path);
  in.seekg(0, std::ios::end);
  const uint64_t file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  if (!in.good() || n > (100ull << 20) || 8 + n > file_size) {
    return InvalidArgument(path + ": bad safetensors header length");
  }
  std::string h(n, '\0');
  in.read(h.data(), static_cast<std::streamsize>(n));
  json header = json::parse(h, nullptr, false);
  if (!in.good() || header.is_discarded() || !header.is_object()) {
    return InvalidArgument(path + ": bad safetensors header");
  }
  BlockData b;
  b.rows = meta.rows;
  b.dim = meta.hidden_size;
  b.units = kind == BlockKind::kMlp ? meta.ffn_dim : meta.num_heads;
  b.x.resize(static_cast<size_t>(b.rows * b.dim));
  b.y.resize(static_cast<size_t>(b.rows * b.label_bytes()));
  const std::string k = BlockKindName(kind);
  DEJA_RETURN_IF_ERROR(ReadTensor(in, path, header, 8 + n, file_size, k + ".x", "F16",
                                  {b.rows, b.dim}, b.x.data(), b.x.size() * 2));
  DEJA_RETURN_IF_ERROR(ReadTensor(in, path, header, 8 + n, file_size, k + ".y", "U8",
                                  {b.rows, b.label_bytes()}, b.y.data(), b.y.size()));
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
  return WriteRaw(LayerDataPath(dir, layer), ts);
}

}  // namespace deja::predictors
