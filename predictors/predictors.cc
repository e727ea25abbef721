// The predictor set file pair (safetensors + JSON schedule): strict loading with per-rank
// sharding of the second maps, and the writer the trainer uses.
#include "predictors/predictors.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>

#include "common/safetensors.h"
#include "predictors/json_fields.h"

namespace deja::predictors {
namespace {

using nlohmann::json;

constexpr const char* kFormat = "deja-predictors-v1";

StatusOr<BlockSchedule> ParseBlock(const json& layer, const char* kind, int32_t units, int64_t l,
                                   const std::string& file) {
  BlockSchedule b;
  const std::string where = file + ": layers[" + std::to_string(l) + "]." + kind;
  auto it = layer.find(kind);
  if (it == layer.end()) return b;  // absent: dense
  if (!it->is_object()) return InvalidArgument(where + " must be an object");
  auto k = it->find("top_k");
  if (k == it->end() || !k->is_number_integer() || k->get<int64_t>() < 0 ||
      k->get<int64_t>() > units) {
    return InvalidArgument(where + ".top_k must be an integer in [0, " + std::to_string(units) +
                           "]");
  }
  b.top_k = static_cast<int32_t>(k->get<int64_t>());
  for (const char* key : {"recall", "precision"}) {
    auto v = it->find(key);
    if (v == it->end()) continue;
    if (!v->is_number()) return InvalidArgument(where + "." + key + " must be a number");
    (std::strcmp(key, "recall") == 0 ? b.recall : b.precision) = v->get<float>();
  }
  return b;
}

json BlockJson(const BlockSchedule& b) {
  return json{{"top_k", b.top_k}, {"recall", b.recall}, {"precision", b.precision}};
}

// An owning copy of rows [begin, end) of an f16 [rows, cols] view.
Tensor CopyRows(const TensorView& v, int64_t begin, int64_t end) {
  Tensor t = Tensor::Empty(DType::kF16, {end - begin, v.cols()});
  std::memcpy(t.data(), v.as<uint16_t>() + begin * v.cols(), t.bytes());
  return t;
}

Tensor ToF16(const Tensor& t) {
  if (t.dtype() == DType::kF16) return CopyRows(t.view(), 0, t.view().rows());
  Tensor out = Tensor::Empty(DType::kF16, t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) {
    out.as<uint16_t>()[i] = FloatToHalf(LoadAsFloat(t.data(), t.dtype(), static_cast<size_t>(i)));
  }
  return out;
}

// Validates and copies one predictor (fc1 [r, d], fc2 [units, r]); both present or both absent.
Status LoadPair(const Checkpoint& ckpt, const std::string& prefix, int64_t r, int64_t d,
                int64_t units, int rank, int world, const std::string& file, Tensor* fc1,
                Tensor* fc2) {
  const TensorInfo* a = ckpt.Find(prefix + "fc1");
  const TensorInfo* b = ckpt.Find(prefix + "fc2");
  if (a == nullptr && b == nullptr) return Status::Ok();
  if (a == nullptr || b == nullptr) {
    return InvalidArgument(file + ": tensor '" + prefix + (a == nullptr ? "fc1" : "fc2") +
                           "' is missing (its pair '" + prefix + (a == nullptr ? "fc2" : "fc1") +
                           "' is present)");
  }
  const std::pair<const TensorInfo*, Shape> want[] = {{a, Shape{r, d}}, {b, Shape{units, r}}};
  for (const auto& [info, shape] : want) {
    if (info->dtype != DType::kF16) {
      return InvalidArgument(file + ": tensor '" + info->name + "' has dtype " +
                             DTypeName(info->dtype) + ", expected F16");
    }
    if (!(info->shape == shape)) {
      return InvalidArgument(file + ": tensor '" + info->name + "' has shape " +
                             info->shape.ToString() + ", expected " + shape.ToString());
    }
  }
  *fc1 = CopyRows(a->view(), 0, r);
  int64_t begin = 0, end = 0;
  PredictorShardRange(units, rank, world, &begin, &end);
  *fc2 = CopyRows(b->view(), begin, end);
  return Status::Ok();
}

}  // namespace

void PredictorShardRange(int64_t total, int rank, int world, int64_t* begin, int64_t* end) {
  const int64_t base = total / world, extra = total % world;
  *begin = rank * base + std::min<int64_t>(rank, extra);
  *end = *begin + base + (rank < extra ? 1 : 0);
}

std::string MetaPathFor(const std::string& safetensors_path) {
  const std::string ext = ".safetensors";
  const std::string& p = safetensors_path;
  if (p.size() > ext.size() && p.compare(p.size() - ext.size(), ext.size(), ext) == 0) {
    return p.substr(0, p.size() - ext.size()) + ".json";
  }
  return p + ".json";
}

StatusOr<PredictorMeta> LoadPredictorMeta(const std::string& json_path) {
  DEJA_ASSIGN_OR_RETURN(std::string text, ReadTextFile(json_path));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgument(json_path + ": not a JSON object");
  }
  auto fmt = j.find("format");
  if (fmt == j.end() || !fmt->is_string() || fmt->get<std::string>() != kFormat) {
    return InvalidArgument(json_path + ": 'format' must be \"" + kFormat + "\"");
  }
  PredictorMeta m;
  DEJA_ASSIGN_OR_RETURN(m.rank, JsonPositiveInt(j, "rank", json_path, int64_t{1} << 30));
  DEJA_ASSIGN_OR_RETURN(m.hidden_size,
                        JsonPositiveInt(j, "hidden_size", json_path, int64_t{1} << 30));
  DEJA_ASSIGN_OR_RETURN(m.ffn_dim, JsonPositiveInt(j, "ffn_dim", json_path, int64_t{1} << 30));
  DEJA_ASSIGN_OR_RETURN(m.num_heads, JsonPositiveInt(j, "num_heads", json_path, int64_t{1} << 30));
  DEJA_ASSIGN_OR_RETURN(m.num_layers,
                        JsonPositiveInt(j, "num_layers", json_path, int64_t{1} << 30));
  auto layers = j.find("layers");
  if (layers == j.end() || !layers->is_array() ||
      layers->size() != static_cast<size_t>(m.num_layers)) {
    return InvalidArgument(json_path + ": 'layers' must be an array of num_layers (" +
                           std::to_string(m.num_layers) + ") entries");
  }
  for (size_t l = 0; l < layers->size(); ++l) {
    const json& e = (*layers)[l];
    auto idx = e.is_object() ? e.find("layer") : e.end();
    if (idx == e.end() || !idx->is_number_integer() || idx->get<int64_t>() != int64_t(l)) {
      return InvalidArgument(json_path + ": layers[" + std::to_string(l) +
                             "] must be an object with \"layer\": " + std::to_string(l));
    }
    LayerSchedule s;
    DEJA_ASSIGN_OR_RETURN(s.mlp, ParseBlock(e, "mlp", m.ffn_dim, l, json_path));
    DEJA_ASSIGN_OR_RETURN(s.heads, ParseBlock(e, "heads", m.num_heads, l, json_path));
    if (l == 0 && s.heads.top_k != 0) {
      return InvalidArgument(json_path + ": layers[0].heads.top_k must be 0 (layer 0's heads "
                             "are dense)");
    }
    m.layers.push_back(s);
  }
  return m;
}

StatusOr<PredictorSet> LoadPredictors(const std::string& safetensors_path,
                                      const OptConfig& config, int rank, int world) {
  if (world < 1 || rank < 0 || rank >= world) {
    return InvalidArgument("predictors: rank " + std::to_string(rank) + " is outside world size " +
                           std::to_string(world));
  }
  const std::string json_path = MetaPathFor(safetensors_path);
  PredictorSet set;
  DEJA_ASSIGN_OR_RETURN(set.meta, LoadPredictorMeta(json_path));
  const PredictorMeta& m = set.meta;
  const std::pair<const char*, std::pair<int64_t, int64_t>> dims[] = {
      {"hidden_size", {m.hidden_size, config.hidden_size}},
      {"ffn_dim", {m.ffn_dim, config.ffn_dim}},
      {"num_heads", {m.num_heads, config.num_attention_heads}},
      {"num_layers", {m.num_layers, config.num_hidden_layers}}};
  for (const auto& [name, v] : dims) {
    if (v.first != v.second) {
      return InvalidArgument(json_path + ": " + name + " " + std::to_string(v.first) +
                             " does not match the model's " + std::to_string(v.second));
    }
  }
  StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::OpenFile(safetensors_path);
  if (!ckpt.ok()) return ckpt.status().WithContext("predictors");
  // Every tensor must be one this format names; anything else means a wrong or damaged file.
  std::set<std::string> known;
  for (int64_t l = 0; l < m.num_layers; ++l) {
    for (const char* kind : {"mlp.", "heads."}) {
      for (const char* fc : {".fc1", ".fc2"}) known.insert(kind + std::to_string(l) + fc);
    }
  }
  for (const std::string& name : (*ckpt)->names()) {
    if (!known.count(name)) {
      return InvalidArgument(safetensors_path + ": unexpected tensor '" + name + "'");
    }
  }
  if ((*ckpt)->Find("heads.0.fc1") || (*ckpt)->Find("heads.0.fc2")) {
    return InvalidArgument(safetensors_path + ": tensor 'heads.0.*' present, but layer 0's heads "
                           "have no predictor");
  }
  set.layers.resize(m.num_layers);
  for (int64_t l = 0; l < m.num_layers; ++l) {
    LayerPredictors& lp = set.layers[l];
    const std::string ls = std::to_string(l);
    DEJA_RETURN_IF_ERROR(LoadPair(**ckpt, "mlp." + ls + ".", m.rank, m.hidden_size, m.ffn_dim,
                                  rank, world, safetensors_path, &lp.mlp_fc1, &lp.mlp_fc2));
    DEJA_RETURN_IF_ERROR(LoadPair(**ckpt, "heads." + ls + ".", m.rank, m.hidden_size,
                                  m.num_heads, rank, world, safetensors_path, &lp.head_fc1,
                                  &lp.head_fc2));
    if (m.layers[l].mlp.top_k > 0 && lp.mlp_fc1.empty()) {
      return InvalidArgument(safetensors_path + ": tensor 'mlp." + ls + ".fc1' is missing but " +
                             json_path + " schedules layer " + ls + "'s MLP as sparse");
    }
    if (m.layers[l].heads.top_k > 0 && lp.head_fc1.empty()) {
      return InvalidArgument(safetensors_path + ": tensor 'heads." + ls + ".fc1' is missing but " +
                             json_path + " schedules layer " + ls + "'s heads as sparse");
    }
  }
  return set;
}

Status SavePredictors(const std::string& path, const PredictorMeta& meta,
                      const std::vector<LayerPredictors>& layers, const std::string& extra_json) {
  if (layers.size() != static_cast<size_t>(meta.num_layers) ||
      meta.layers.size() != static_cast<size_t>(meta.num_layers)) {
    return InvalidArgument("SavePredictors: num_layers does not match the layers given");
  }
  json j;
  if (!extra_json.empty()) {
    j = json::parse(extra_json, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      return InvalidArgument("SavePredictors: extra info is not a JSON object");
    }
  }
  j["format"] = kFormat;
  j["rank"] = meta.rank;
  j["hidden_size"] = meta.hidden_size;
  j["ffn_dim"] = meta.ffn_dim;
  j["num_heads"] = meta.num_heads;
  j["num_layers"] = meta.num_layers;
  json jl = json::array();
  std::vector<Tensor> owned;
  std::vector<std::pair<std::string, TensorView>> tensors;
  const std::map<std::string, int64_t> units = {{"mlp", meta.ffn_dim}, {"heads", meta.num_heads}};
  for (int32_t l = 0; l < meta.num_layers; ++l) {
    json e = {{"layer", l}};
    const json* extra_layer = nullptr;
    if (j.contains("layers") && j["layers"].is_array() && j["layers"].size() > size_t(l)) {
      extra_layer = &j["layers"][l];
    }
    e["mlp"] = BlockJson(meta.layers[l].mlp);
    e["heads"] = BlockJson(meta.layers[l].heads);
    if (extra_layer != nullptr && extra_layer->is_object()) {
      for (auto it = extra_layer->begin(); it != extra_layer->end(); ++it) {
        if (e.contains(it.key()) && e[it.key()].is_object() && it.value().is_object()) {
          for (auto f = it.value().begin(); f != it.value().end(); ++f) {
            if (!e[it.key()].contains(f.key())) e[it.key()][f.key()] = f.value();
          }
        } else if (!e.contains(it.key())) {
          e[it.key()] = it.value();
        }
      }
    }
    jl.push_back(e);
    const LayerPredictors& lp = layers[l];
    const std::tuple<const char*, const Tensor*, const Tensor*> pairs[] = {
        {"mlp", &lp.mlp_fc1, &lp.mlp_fc2}, {"heads", &lp.head_fc1, &lp.head_fc2}};
    for (const auto& [kind, fc1, fc2] : pairs) {
      if (fc1->empty() && fc2->empty()) continue;
      const std::string name = std::string(kind) + "." + std::to_string(l);
      const Shape s1{meta.rank, meta.hidden_size}, s2{units.at(kind), meta.rank};
      if (fc1->empty() || fc2->empty() || !(fc1->shape() == s1) || !(fc2->shape() == s2)) {
        return InvalidArgument("SavePredictors: " + name + " must be fc1 " + s1.ToString() +
                               " and fc2 " + s2.ToString());
      }
      owned.push_back(ToF16(*fc1));
      tensors.emplace_back(name + ".fc1", owned.back().view());
      owned.push_back(ToF16(*fc2));
      tensors.emplace_back(name + ".fc2", owned.back().view());
    }
  }
  j["layers"] = jl;
  DEJA_RETURN_IF_ERROR(WriteSafetensors(path, tensors, {{"format", kFormat}}));
  const std::string json_path = MetaPathFor(path);
  const std::string tmp = json_path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump(2) << "\n";
    if (!out.good()) return Unavailable("cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), json_path.c_str()) != 0) {
    return Unavailable("cannot rename " + tmp + " to " + json_path);
  }
  return Status::Ok();
}

}  // namespace deja::predictors
