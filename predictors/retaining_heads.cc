// The retaining heads file pair (f16 safetensors + JSON): strict loading of one rank's heads,
// the writer the trainer uses, and the plain reference score.
#include "predictors/retaining_heads.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "common/dtype.h"
#include "common/safetensors.h"
#include "common/tensor.h"
#include "predictors/json_fields.h"

namespace deja::predictors {
namespace {

using nlohmann::json;

constexpr const char* kActivation = "relu";
constexpr const char* kInput = "[q, k, v] of the head, q unscaled";

std::string TensorName(int32_t layer, const char* part) {
  return "layers." + std::to_string(layer) + "." + part;
}

// The four tensors of a layer with their per-head element counts.
struct Part {
  const char* name;
  int64_t per_head;
};

std::vector<Part> Parts(int64_t hidden, int64_t in) {
  return {{"w1", hidden * in}, {"b1", hidden}, {"w2", hidden}, {"b2", 1}};
}

Shape PartShape(const Part& p, int64_t heads, int64_t hidden, int64_t in) {
  const std::string n = p.name;
  if (n == "w1") return Shape{heads, hidden, in};
  if (n == "b2") return Shape{heads};
  return Shape{heads, hidden};
}

std::vector<float>& PartVector(RetainingHeads& r, const Part& p, int32_t layer) {
  const std::string n = p.name;
  if (n == "w1") return r.w1[layer];
  if (n == "b1") return r.b1[layer];
  if (n == "w2") return r.w2[layer];
  return r.b2[layer];
}

const std::vector<float>& PartVector(const RetainingHeads& r, const Part& p, int32_t layer) {
  return PartVector(const_cast<RetainingHeads&>(r), p, layer);
}

Status WriteTextAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    out.close();
    if (!out.good()) {
      std::remove(tmp.c_str());
      return Unavailable("cannot write " + tmp);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return Unavailable("cannot rename " + tmp + " to " + path);
  }
  return Status::Ok();
}

}  // namespace

std::string RetainingMetaPathFor(const std::string& safetensors_path) {
  const std::string ext = ".safetensors";
  const std::string& p = safetensors_path;
  if (p.size() > ext.size() && p.compare(p.size() - ext.size(), ext.size(), ext) == 0) {
    return p.substr(0, p.size() - ext.size()) + ".json";
  }
  return p + ".json";
}

StatusOr<RetainingHeads> LoadRetainingHeads(const std::string& safetensors_path, int32_t layers,
                                            int32_t heads, int32_t head_dim, int rank, int world) {
  if (world < 1 || rank < 0 || rank >= world) {
    return InvalidArgument("retaining heads: rank " + std::to_string(rank) +
                           " is outside world size " + std::to_string(world));
  }
  if (heads < 1 || heads % world != 0) {
    return InvalidArgument("retaining heads: world size " + std::to_string(world) +
                           " does not divide the model's " + std::to_string(heads) + " heads");
  }
  const std::string json_path = RetainingMetaPathFor(safetensors_path);
  DEJA_ASSIGN_OR_RETURN(std::string text, ReadTextFile(json_path));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgument(json_path + ": not a JSON object");
  }
  auto fmt = j.find("format");
  if (fmt == j.end() || !fmt->is_string() || fmt->get<std::string>() != kRetainingHeadsFormat) {
    return InvalidArgument(json_path + ": 'format' must be \"" +
                           std::string(kRetainingHeadsFormat) + "\"");
  }
  RetainingHeads r;
  r.json = text;
  int32_t file_heads = 0;
  DEJA_ASSIGN_OR_RETURN(r.layers, JsonPositiveInt(j, "layers", json_path));
  DEJA_ASSIGN_OR_RETURN(file_heads, JsonPositiveInt(j, "heads", json_path));
  DEJA_ASSIGN_OR_RETURN(r.head_dim, JsonPositiveInt(j, "head_dim", json_path));
  DEJA_ASSIGN_OR_RETURN(r.hidden, JsonPositiveInt(j, "hidden", json_path));
  // The score is only defined for the activation and input the runtime computes; a file trained
  // for another form must not load as if it were this one.
  auto act = j.find("activation");
  if (act == j.end() || !act->is_string() || act->get<std::string>() != kActivation) {
    return InvalidArgument(json_path + ": 'activation' must be \"" + std::string(kActivation) +
                           "\"");
  }
  const std::pair<const char*, std::pair<int32_t, int32_t>> dims[] = {
      {"layers", {r.layers, layers}},
      {"heads", {file_heads, heads}},
      {"head_dim", {r.head_dim, head_dim}}};
  for (const auto& [name, v] : dims) {
    if (v.first != v.second) {
      return FailedPrecondition(json_path + ": '" + name + "' " + std::to_string(v.first) +
                                " does not match the model's " + std::to_string(v.second));
    }
  }
  r.heads = heads / world;
  r.first_head = rank * r.heads;

  StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::OpenFile(safetensors_path);
  if (!ckpt.ok()) return ckpt.status().WithContext("retaining heads");
  const int64_t in = r.input_dim();
  const std::vector<Part> parts = Parts(r.hidden, in);
  // Every tensor must be one this format names: anything else means a wrong or damaged file.
  std::set<std::string> known;
  for (int32_t l = 0; l < r.layers; ++l) {
    for (const Part& p : parts) known.insert(TensorName(l, p.name));
  }
  for (const std::string& name : (*ckpt)->names()) {
    if (!known.count(name)) {
      return InvalidArgument(safetensors_path + ": unexpected tensor '" + name + "'");
    }
  }
  r.w1.resize(r.layers);
  r.b1.resize(r.layers);
  r.w2.resize(r.layers);
  r.b2.resize(r.layers);
  for (int32_t l = 0; l < r.layers; ++l) {
    for (const Part& p : parts) {
      const std::string name = TensorName(l, p.name);
      const TensorInfo* info = (*ckpt)->Find(name);
      if (info == nullptr) {
        return InvalidArgument(safetensors_path + ": tensor '" + name + "' is missing");
      }
      const Shape want = PartShape(p, heads, r.hidden, in);
      if (info->dtype != DType::kF16) {
        return InvalidArgument(safetensors_path + ": tensor '" + name + "' has dtype " +
                               DTypeName(info->dtype) + ", expected F16");
      }
      if (!(info->shape == want)) {
        return InvalidArgument(safetensors_path + ": tensor '" + name + "' has shape " +
                               info->shape.ToString() + ", expected " + want.ToString());
      }
      // Every rank checks all heads, so that all ranks agree on whether a file loads.
      const uint16_t* src = static_cast<const uint16_t*>(info->data);
      const int64_t n = heads * p.per_head;
      for (int64_t i = 0; i < n; ++i) {
        if ((src[i] & 0x7c00u) == 0x7c00u) {
          return InvalidArgument(safetensors_path + ": tensor '" + name +
                                 "' has a non-finite value (head " +
                                 std::to_string(i / p.per_head) + ")");
        }
      }
      std::vector<float>& dst = PartVector(r, p, l);
      dst.resize(static_cast<size_t>(r.heads * p.per_head));
      const uint16_t* mine = src + r.first_head * p.per_head;
      for (size_t i = 0; i < dst.size(); ++i) dst[i] = HalfToFloat(mine[i]);
    }
  }
  return r;
}

Status SaveRetainingHeads(const std::string& safetensors_path, const RetainingHeads& r,
                          const nlohmann::json& training_info) {
  const std::string where = "SaveRetainingHeads(" + safetensors_path + ")";
  if (r.layers < 1 || r.heads < 1 || r.head_dim < 1 || r.hidden < 1) {
    return InvalidArgument(where + ": layers, heads, head_dim and hidden must be positive");
  }
  if (r.first_head != 0) {
    return InvalidArgument(where + ": needs every head (first_head is " +
                           std::to_string(r.first_head) + ", not 0)");
  }
  if (!training_info.is_object() && !training_info.is_null()) {
    return InvalidArgument(where + ": training info must be a JSON object");
  }
  const size_t nl = static_cast<size_t>(r.layers);
  if (r.w1.size() != nl || r.b1.size() != nl || r.w2.size() != nl || r.b2.size() != nl) {
    return InvalidArgument(where + ": w1, b1, w2 and b2 must hold " + std::to_string(r.layers) +
                           " layers");
  }
  const int64_t in = r.input_dim();
  const std::vector<Part> parts = Parts(r.hidden, in);
  std::vector<std::vector<uint16_t>> owned;
  owned.reserve(nl * parts.size());
  std::vector<std::pair<std::string, TensorView>> tensors;
  for (int32_t l = 0; l < r.layers; ++l) {
    for (const Part& p : parts) {
      const std::string name = TensorName(l, p.name);
      const std::vector<float>& src = PartVector(r, p, l);
      if (src.size() != static_cast<size_t>(r.heads * p.per_head)) {
        return InvalidArgument(where + ": tensor '" + name + "' has " + std::to_string(src.size()) +
                               " values, expected " + std::to_string(r.heads * p.per_head));
      }
      std::vector<uint16_t> half(src.size());
      for (size_t i = 0; i < src.size(); ++i) {
        half[i] = FloatToHalf(src[i]);
        // A weight beyond the f16 range would save as infinity and then never load.
        if ((half[i] & 0x7c00u) == 0x7c00u) {
          return InvalidArgument(where + ": tensor '" + name + "' value " + std::to_string(src[i]) +
                                 " (head " + std::to_string(i / p.per_head) +
                                 ") is not finite in f16");
        }
      }
      owned.push_back(std::move(half));
      TensorView v;
      v.data = owned.back().data();
      v.dtype = DType::kF16;
      v.shape = PartShape(p, r.heads, r.hidden, in);
      tensors.emplace_back(name, v);
    }
  }
  json j;
  j["format"] = kRetainingHeadsFormat;
  j["layers"] = r.layers;
  j["heads"] = r.heads;
  j["head_dim"] = r.head_dim;
  j["hidden"] = r.hidden;
  j["activation"] = kActivation;
  j["input"] = kInput;
  json training = training_info.is_object() ? training_info : json::object();
  j["label"] = nullptr;
  if (training.contains("label")) {
    j["label"] = training["label"];
    training.erase("label");
  }
  j["training"] = training;
  DEJA_RETURN_IF_ERROR(
      WriteSafetensors(safetensors_path, tensors, {{"format", kRetainingHeadsFormat}}));
  return WriteTextAtomically(RetainingMetaPathFor(safetensors_path), j.dump(2) + "\n");
}

float RetainingScore(const RetainingHeads& r, int32_t layer, int32_t head, const float* x) {
  const int64_t in = r.input_dim(), hidden = r.hidden;
  const float* w1 = r.w1[layer].data() + head * hidden * in;
  const float* b1 = r.b1[layer].data() + head * hidden;
  const float* w2 = r.w2[layer].data() + head * hidden;
  float s = 0.0f;
  for (int64_t j = 0; j < hidden; ++j) {
    float z = b1[j];
    for (int64_t k = 0; k < in; ++k) z += w1[j * in + k] * x[k];
    s += w2[j] * std::max(z, 0.0f);
  }
  return s + r.b2[layer][head];
}

}  // namespace deja::predictors
