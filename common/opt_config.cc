#include "common/opt_config.h"

#include <filesystem>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <system_error>
#include <vector>

#include "common/mmap_file.h"

namespace deja {
namespace {

using nlohmann::json;

// Reads an optional integer field; null counts as absent, as transformers writes null for unset
// token ids.
Status ReadInt(const json& j, const char* field, const std::string& source, bool required,
               int64_t* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) {
    if (required) return InvalidArgument(source + ": missing required field '" + field + "'");
    return Status::Ok();
  }
  if (it->is_number_unsigned()) {
    if (it->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return InvalidArgument(source + ": field '" + field + "' is out of range");
    }
    *out = static_cast<int64_t>(it->get<uint64_t>());
    return Status::Ok();
  }
  if (!it->is_number_integer()) {
    return InvalidArgument(source + ": field '" + field + "' must be an integer, got " +
                           it->type_name());
  }
  *out = it->get<int64_t>();
  return Status::Ok();
}

Status ReadBool(const json& j, const char* field, const std::string& source, bool* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_boolean()) {
    return InvalidArgument(source + ": field '" + field + "' must be a boolean, got " +
                           it->type_name());
  }
  *out = it->get<bool>();
  return Status::Ok();
}

Status ReadString(const json& j, const char* field, const std::string& source, std::string* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return Status::Ok();
  if (!it->is_string()) {
    return InvalidArgument(source + ": field '" + field + "' must be a string, got " +
                           it->type_name());
  }
  *out = it->get<std::string>();
  return Status::Ok();
}

Status Positive(int64_t v, const char* field) {
  if (v <= 0) {
    return InvalidArgument(std::string("config field '") + field + "' must be > 0, got " +
                           std::to_string(v));
  }
  return Status::Ok();
}

Status AtMost(int64_t v, int64_t max, const char* field, const char* why) {
  if (v > max) {
    return InvalidArgument(std::string("config field '") + field + "' must be at most " +
                           std::to_string(max) + " (" + why + "), got " + std::to_string(v));
  }
  return Status::Ok();
}

Status TokenId(int64_t id, int64_t vocab, const char* field) {
  if (id < 0 || id >= vocab) {
    return InvalidArgument(std::string("config field '") + field + "' = " + std::to_string(id) +
                           " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
  }
  return Status::Ok();
}

// Calls `visit` with every tensor name and its expected shape, in load order, and stops at the
// first error it returns. One at a time: a config may declare more layers than any checkpoint
// holds (or than memory could list), and the first missing tensor ends the walk.
Status ForEachExpectedTensor(
    const OptConfig& c, const OptTensorNames& n,
    const std::function<Status(const std::string& name, const Shape& shape)>& visit) {
  const int64_t h = c.hidden_size, p = c.word_embed_proj_dim, f = c.ffn_dim;
  auto add = [&visit](const std::string& name, Shape shape) {
    return name.empty() ? Status::Ok() : visit(name, shape);
  };
  DEJA_RETURN_IF_ERROR(add(n.embed_tokens, {c.vocab_size, p}));
  DEJA_RETURN_IF_ERROR(add(n.embed_positions, {c.max_position_embeddings + 2, h}));  // position + 2
  DEJA_RETURN_IF_ERROR(add(n.project_in, {h, p}));
  DEJA_RETURN_IF_ERROR(add(n.project_out, {p, h}));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const OptLayerNames ln = n.Layer(l);
    for (const std::string* w : {&ln.q_weight, &ln.k_weight, &ln.v_weight, &ln.out_weight}) {
      DEJA_RETURN_IF_ERROR(add(*w, {h, h}));
    }
    for (const std::string* b :
         {&ln.q_bias, &ln.k_bias, &ln.v_bias, &ln.out_bias, &ln.fc2_bias, &ln.attn_ln_weight,
          &ln.attn_ln_bias, &ln.ffn_ln_weight, &ln.ffn_ln_bias}) {
      DEJA_RETURN_IF_ERROR(add(*b, {h}));
    }
    DEJA_RETURN_IF_ERROR(add(ln.fc1_weight, {f, h}));
    DEJA_RETURN_IF_ERROR(add(ln.fc1_bias, {f}));
    DEJA_RETURN_IF_ERROR(add(ln.fc2_weight, {h, f}));
  }
  DEJA_RETURN_IF_ERROR(add(n.final_ln_weight, {h}));
  DEJA_RETURN_IF_ERROR(add(n.final_ln_bias, {h}));
  if (!n.tied_lm_head) DEJA_RETURN_IF_ERROR(add(n.lm_head, {c.vocab_size, p}));
  return Status::Ok();
}

}  // namespace

Status OptConfig::Validate() const {
  DEJA_RETURN_IF_ERROR(Positive(vocab_size, "vocab_size"));
  DEJA_RETURN_IF_ERROR(Positive(hidden_size, "hidden_size"));
  DEJA_RETURN_IF_ERROR(Positive(num_hidden_layers, "num_hidden_layers"));
  DEJA_RETURN_IF_ERROR(Positive(ffn_dim, "ffn_dim"));
  DEJA_RETURN_IF_ERROR(Positive(num_attention_heads, "num_attention_heads"));
  DEJA_RETURN_IF_ERROR(Positive(max_position_embeddings, "max_position_embeddings"));
  DEJA_RETURN_IF_ERROR(Positive(word_embed_proj_dim, "word_embed_proj_dim"));
  // Token ids and positions are 32-bit everywhere past the config (KV cache, protocol, the
  // coordinator's limits), and the position table has two rows more than positions.
  constexpr int64_t kMax32 = std::numeric_limits<int32_t>::max();
  DEJA_RETURN_IF_ERROR(AtMost(vocab_size, kMax32, "vocab_size", "token ids are 32-bit"));
  DEJA_RETURN_IF_ERROR(AtMost(max_position_embeddings, kMax32 - 2, "max_position_embeddings",
                              "positions are 32-bit"));
  if (hidden_size % num_attention_heads != 0) {
    return InvalidArgument("config field 'hidden_size' (" + std::to_string(hidden_size) +
                           ") is not divisible by 'num_attention_heads' (" +
                           std::to_string(num_attention_heads) + ")");
  }
  if (activation_function != "relu") {
    return InvalidArgument("config field 'activation_function' is '" + activation_function +
                           "'; only 'relu' is supported (Deja Vu MLP sparsity relies on ReLU)");
  }
  DEJA_RETURN_IF_ERROR(TokenId(pad_token_id, vocab_size, "pad_token_id"));
  DEJA_RETURN_IF_ERROR(TokenId(bos_token_id, vocab_size, "bos_token_id"));
  DEJA_RETURN_IF_ERROR(TokenId(eos_token_id, vocab_size, "eos_token_id"));
  return Status::Ok();
}

StatusOr<OptConfig> ParseOptConfig(std::string_view json_text, const std::string& source) {
  json j = json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument(source + ": invalid JSON");
  if (!j.is_object()) return InvalidArgument(source + ": not a JSON object");
  std::string model_type;
  DEJA_RETURN_IF_ERROR(ReadString(j, "model_type", source, &model_type));
  if (!model_type.empty() && model_type != "opt") {
    return InvalidArgument(source + ": field 'model_type' is '" + model_type + "', expected 'opt'");
  }
  OptConfig c;
  DEJA_RETURN_IF_ERROR(ReadInt(j, "vocab_size", source, true, &c.vocab_size));
  DEJA_RETURN_IF_ERROR(ReadInt(j, "hidden_size", source, true, &c.hidden_size));
  DEJA_RETURN_IF_ERROR(ReadInt(j, "num_hidden_layers", source, true, &c.num_hidden_layers));
  DEJA_RETURN_IF_ERROR(ReadInt(j, "ffn_dim", source, true, &c.ffn_dim));
  DEJA_RETURN_IF_ERROR(ReadInt(j, "num_attention_heads", source, true, &c.num_attention_heads));
  DEJA_RETURN_IF_ERROR(
      ReadInt(j, "max_position_embeddings", source, true, &c.max_position_embeddings));
  c.word_embed_proj_dim = c.hidden_size;
  DEJA_RETURN_IF_ERROR(ReadInt(j, "word_embed_proj_dim", source, false, &c.word_embed_proj_dim));
  DEJA_RETURN_IF_ERROR(ReadBool(j, "do_layer_norm_before", source, &c.do_layer_norm_before));
  DEJA_RETURN_IF_ERROR(ReadBool(j, "_remove_final_layer_norm", source, &c.remove_final_layer_norm));
  DEJA_RETURN_IF_ERROR(ReadString(j, "activation_function", source, &c.activation_function));
  DEJA_RETURN_IF_ERROR(ReadBool(j, "enable_bias", source, &c.enable_bias));
  DEJA_RETURN_IF_ERROR(
      ReadBool(j, "layer_norm_elementwise_affine", source, &c.layer_norm_elementwise_affine));
  DEJA_RETURN_IF_ERROR(ReadInt(j, "pad_token_id", source, false, &c.pad_token_id));
  DEJA_RETURN_IF_ERROR(ReadInt(j, "bos_token_id", source, false, &c.bos_token_id));
  DEJA_RETURN_IF_ERROR(ReadInt(j, "eos_token_id", source, false, &c.eos_token_id));
  DEJA_RETURN_IF_ERROR(ReadBool(j, "tie_word_embeddings", source, &c.tie_word_embeddings));
  DEJA_RETURN_IF_ERROR(ReadString(j, "torch_dtype", source, &c.torch_dtype));
  Status valid = c.Validate();
  if (!valid.ok()) return valid.WithContext(source);
  return c;
}

std::string ConfigJsonPath(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return path;
  return (std::filesystem::path(path) / "config.json").string();
}

StatusOr<OptConfig> LoadOptConfig(const std::string& path) {
  const std::string file = ConfigJsonPath(path);
  DEJA_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::Open(file));
  std::string_view text(reinterpret_cast<const char*>(mapped.data()), mapped.size());
  return ParseOptConfig(text, file);
}

OptLayerNames OptTensorNames::Layer(int64_t layer) const {
  const std::string p = prefix + "layers." + std::to_string(layer) + ".";
  auto bias = [this](const std::string& base) { return enable_bias ? base + ".bias" : ""; };
  auto ln_w = [this](const std::string& base) { return layer_norm_affine ? base + ".weight" : ""; };
  auto ln_b = [this](const std::string& base) { return layer_norm_affine ? base + ".bias" : ""; };
  OptLayerNames n;
  n.q_weight = p + "self_attn.q_proj.weight";
  n.q_bias = bias(p + "self_attn.q_proj");
  n.k_weight = p + "self_attn.k_proj.weight";
  n.k_bias = bias(p + "self_attn.k_proj");
  n.v_weight = p + "self_attn.v_proj.weight";
  n.v_bias = bias(p + "self_attn.v_proj");
  n.out_weight = p + "self_attn.out_proj.weight";
  n.out_bias = bias(p + "self_attn.out_proj");
  n.attn_ln_weight = ln_w(p + "self_attn_layer_norm");
  n.attn_ln_bias = ln_b(p + "self_attn_layer_norm");
  n.fc1_weight = p + "fc1.weight";
  n.fc1_bias = bias(p + "fc1");
  n.fc2_weight = p + "fc2.weight";
  n.fc2_bias = bias(p + "fc2");
  n.ffn_ln_weight = ln_w(p + "final_layer_norm");
  n.ffn_ln_bias = ln_b(p + "final_layer_norm");
  return n;
}

StatusOr<OptTensorNames> ResolveOptTensorNames(const Checkpoint& ckpt, const OptConfig& config) {
  OptTensorNames n;
  bool found = false;
  for (const char* prefix : {"model.decoder.", "decoder.", ""}) {
    if (ckpt.Find(std::string(prefix) + "embed_tokens.weight") != nullptr) {
      n.prefix = prefix;
      found = true;
      break;
    }
  }
  if (!found) {
    return NotFound("checkpoint " + ckpt.source() +
                    " has no embed_tokens.weight under 'model.decoder.', 'decoder.' or no prefix;"
                    " not an OPT checkpoint?");
  }
  n.enable_bias = config.enable_bias;
  n.layer_norm_affine = config.layer_norm_elementwise_affine;
  n.embed_tokens = n.prefix + "embed_tokens.weight";
  n.embed_positions = n.prefix + "embed_positions.weight";
  if (config.has_final_layer_norm() && config.layer_norm_elementwise_affine) {
    n.final_ln_weight = n.prefix + "final_layer_norm.weight";
    n.final_ln_bias = n.prefix + "final_layer_norm.bias";
  }
  if (config.has_projections()) {
    n.project_in = n.prefix + "project_in.weight";
    n.project_out = n.prefix + "project_out.weight";
  }
  n.tied_lm_head = ckpt.Find("lm_head.weight") == nullptr;
  if (n.tied_lm_head && !config.tie_word_embeddings) {
    return InvalidArgument("checkpoint " + ckpt.source() +
                           " has no lm_head.weight but config sets tie_word_embeddings=false");
  }
  n.lm_head = n.tied_lm_head ? n.embed_tokens : "lm_head.weight";

  DEJA_RETURN_IF_ERROR(
      ForEachExpectedTensor(config, n, [&ckpt](const std::string& name, const Shape&) {
        if (ckpt.Find(name) != nullptr) return Status::Ok();
        return NotFound("checkpoint " + ckpt.source() + " lacks tensor '" + name + "'");
      }));
  // More layers on disk than the config declares means config and weights do not belong together.
  const std::string extra = n.Layer(config.num_hidden_layers).q_weight;
  if (ckpt.Find(extra) != nullptr) {
    return InvalidArgument(
        "checkpoint " + ckpt.source() + " has tensor '" + extra +
        "' beyond num_hidden_layers=" + std::to_string(config.num_hidden_layers));
  }
  return n;
}

Status CheckOptTensorShapes(const Checkpoint& ckpt, const OptConfig& config,
                            const OptTensorNames& names) {
  return ForEachExpectedTensor(config, names, [&ckpt](const std::string& name, const Shape& shape) {
    // A matrix `deja quantize --bits 4` wrote: two int4 values per byte of each row.
    const TensorInfo* t = ckpt.Find(name);
    if (t != nullptr && t->dtype == DType::kU8 && shape.rank == 2) {
      if (shape[1] % 2 != 0) {
        return InvalidArgument("tensor '" + name + "' is packed int4 (U8) but has " +
                               std::to_string(shape[1]) + " columns, an odd number");
      }
      return ckpt.Get(name, Shape{shape[0], shape[1] / 2}).status();
    }
    return ckpt.Get(name, shape).status();
  });
}

}  // namespace deja
