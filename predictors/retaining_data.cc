// The retaining heads' training data: meta.json checks and the per-layer x / label / segment
// tensors.
#include "predictors/retaining_data.h"

#include <cmath>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <sstream>

#include "predictors/json_fields.h"
#include "predictors/raw_safetensors.h"

namespace deja::predictors {
namespace {

using nlohmann::json;

// The per-layer element counts as the checked product of the dimensions (a hostile meta.json
// must not make rows * heads * 3 * head_dim wrap around and allocate a small buffer).
StatusOr<size_t> Elements(const std::string& where, std::initializer_list<int64_t> dims) {
  unsigned __int128 n = 1;
  for (int64_t d : dims) {
    if (d < 0) return InvalidArgument(where + ": negative dimension");
    n *= static_cast<unsigned __int128>(d);
    if (n > (static_cast<unsigned __int128>(1) << 40)) {
      return InvalidArgument(where + ": too many elements (over 2^40)");
    }
  }
  return static_cast<size_t>(n);
}

}  // namespace

std::string RetainingLayerDataPath(const std::string& dir, int32_t layer) {
  return dir + "/layer_" + std::to_string(layer) + ".safetensors";
}

StatusOr<RetainingDataMeta> ReadRetainingDataMeta(const std::string& dir) {
  const std::string path = dir + "/meta.json";
  std::ifstream in(path);
  if (!in) {
    return FailedPrecondition(dir +
                              " is not retaining-head training data (no readable "
                              "meta.json)");
  }
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return FailedPrecondition(path + " is not a JSON object");
  }
  auto fmt = j.find("format");
  if (fmt == j.end() || !fmt->is_string() || fmt->get<std::string>() != kRetainingDataFormat) {
    return FailedPrecondition(path + " is not retaining-head training data ('format' must be \"" +
                              std::string(kRetainingDataFormat) + "\", it is " +
                              (fmt == j.end() ? std::string("absent") : fmt->dump()) + ")");
  }
  RetainingDataMeta m;
  m.json = ss.str();
  const std::pair<const char*, int32_t*> fields[] = {
      {"layers", &m.layers}, {"heads", &m.heads}, {"head_dim", &m.head_dim}};
  for (const auto& [key, dst] : fields) {
    DEJA_ASSIGN_OR_RETURN(*dst, JsonPositiveInt(j, key, path));
  }
  DEJA_ASSIGN_OR_RETURN(m.rows, JsonCount(j, "rows", path));
  DEJA_RETURN_IF_ERROR(Elements(path, {m.rows, m.heads, 3, m.head_dim}).status());
  return m;
}

Status WriteRetainingLayerData(const std::string& dir, int32_t layer, const RetainingLayerData& d) {
  const std::string path = RetainingLayerDataPath(dir, layer);
  if (d.heads <= 0 || d.head_dim <= 0 || d.rows < 0) {
    return InvalidArgument(path + ": heads and head_dim must be positive and rows >= 0");
  }
  DEJA_ASSIGN_OR_RETURN(size_t nx, Elements(path, {d.rows, d.heads, 3, d.head_dim}));
  if (d.x.size() != nx || d.label.size() != static_cast<size_t>(d.rows * d.heads) ||
      d.segment.size() != static_cast<size_t>(d.rows)) {
    return InvalidArgument(path + ": x, label and segment must hold rows * heads * 3 * head_dim (" +
                           std::to_string(nx) + "), rows * heads (" +
                           std::to_string(d.rows * d.heads) + ") and rows (" +
                           std::to_string(d.rows) + ") values; they hold " +
                           std::to_string(d.x.size()) + ", " + std::to_string(d.label.size()) +
                           " and " + std::to_string(d.segment.size()));
  }
  const int64_t in = 3 * int64_t{d.head_dim};
  return WriteRawSafetensors(
      path, {{"x", {"F16", {d.rows, d.heads, in}, d.x.data(), d.x.size() * 2}},
             {"label", {"F32", {d.rows, d.heads}, d.label.data(), d.label.size() * 4}},
             {"segment", {"I32", {d.rows}, d.segment.data(), d.segment.size() * 4}}});
}

StatusOr<RetainingLayerData> ReadRetainingLayerData(const std::string& dir,
                                                    const RetainingDataMeta& meta, int32_t layer) {
  if (layer < 0 || layer >= meta.layers) {
    return InvalidArgument("retaining data " + dir + ": no layer " + std::to_string(layer) +
                           " (meta.json has " + std::to_string(meta.layers) + " layers)");
  }
  const std::string path = RetainingLayerDataPath(dir, layer);
  DEJA_ASSIGN_OR_RETURN(size_t nx, Elements(path, {meta.rows, meta.heads, 3, meta.head_dim}));
  DEJA_ASSIGN_OR_RETURN(RawSafetensorsFile file, RawSafetensorsFile::Open(path));
  RetainingLayerData d;
  d.heads = meta.heads;
  d.head_dim = meta.head_dim;
  d.rows = meta.rows;
  const int64_t in = 3 * int64_t{d.head_dim};
  d.x.resize(nx);
  d.label.resize(static_cast<size_t>(d.rows * d.heads));
  d.segment.resize(static_cast<size_t>(d.rows));
  DEJA_RETURN_IF_ERROR(file.Read("x", "F16", {d.rows, d.heads, in}, d.x.data(), d.x.size() * 2));
  DEJA_RETURN_IF_ERROR(
      file.Read("label", "F32", {d.rows, d.heads}, d.label.data(), d.label.size() * 4));
  DEJA_RETURN_IF_ERROR(
      file.Read("segment", "I32", {d.rows}, d.segment.data(), d.segment.size() * 4));
  // An f16 is infinite or NaN exactly when its exponent bits are all ones.
  for (size_t i = 0; i < d.x.size(); ++i) {
    if ((d.x[i] & 0x7c00u) == 0x7c00u) {
      const int64_t row = static_cast<int64_t>(i / (d.heads * in));
      const int64_t head = static_cast<int64_t>(i / in % d.heads);
      return InvalidArgument(path + ": tensor 'x' has a non-finite value at row " +
                             std::to_string(row) + ", head " + std::to_string(head));
    }
  }
  for (size_t i = 0; i < d.label.size(); ++i) {
    if (!std::isfinite(d.label[i])) {
      return InvalidArgument(path + ": tensor 'label' has a non-finite value at row " +
                             std::to_string(i / d.heads) + ", head " + std::to_string(i % d.heads));
    }
  }
  return d;
}

}  // namespace deja::predictors
