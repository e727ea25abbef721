// The OPT model description: HF `config.json` parsed into OptConfig, and the tensor names of an
// OPT checkpoint (prefix, tied or separate lm_head, optional biases / LayerNorms / projections)
// resolved once so the model code never spells a checkpoint name itself.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/safetensors.h"
#include "common/status.h"

namespace deja {

struct OptConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t ffn_dim = 0;
  int64_t num_attention_heads = 0;
  int64_t max_position_embeddings = 0;
  int64_t word_embed_proj_dim = 0;   // defaults to hidden_size
  bool do_layer_norm_before = true;  // false = post-LN (OPT-350m)
  // transformers drops the final LayerNorm when this is set or the model is post-LN.
  bool remove_final_layer_norm = false;
  std::string activation_function = "relu";
  bool enable_bias = true;
  bool layer_norm_elementwise_affine = true;
  int64_t pad_token_id = 1;
  int64_t bos_token_id = 2;
  int64_t eos_token_id = 2;
  bool tie_word_embeddings = true;
  std::string torch_dtype;  // empty when config.json does not say

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  bool has_final_layer_norm() const { return do_layer_norm_before && !remove_final_layer_norm; }
  bool has_projections() const { return word_embed_proj_dim != hidden_size; }
  // InvalidArgument naming the first offending field.
  Status Validate() const;
};

// `source` names the text in error messages. The result is validated.
StatusOr<OptConfig> ParseOptConfig(std::string_view json_text,
                                   const std::string& source = "config.json");
// Reads `dir/config.json`, or `path` itself when it names a file.
StatusOr<OptConfig> LoadOptConfig(const std::string& path);
// The config file LoadOptConfig reads for `path`: `path/config.json` for a directory, else path.
std::string ConfigJsonPath(const std::string& path);

// Names for one decoder layer. An empty string means the tensor does not exist in this model
// (biases when !enable_bias, LayerNorm parameters when !layer_norm_elementwise_affine).
struct OptLayerNames {
  std::string q_weight, q_bias, k_weight, k_bias, v_weight, v_bias, out_weight, out_bias;
  std::string attn_ln_weight, attn_ln_bias;  // self_attn_layer_norm
  std::string fc1_weight, fc1_bias, fc2_weight, fc2_bias;
  std::string ffn_ln_weight, ffn_ln_bias;  // final_layer_norm of the layer
};

struct OptTensorNames {
  std::string prefix;  // "model.decoder.", "decoder." or ""
  std::string embed_tokens;
  std::string embed_positions;
  std::string final_ln_weight, final_ln_bias;  // empty without a final LayerNorm
  std::string project_in, project_out;         // empty when word_embed_proj_dim == hidden_size
  // lm_head.weight when stored, otherwise embed_tokens (tied_lm_head).
  std::string lm_head;
  bool tied_lm_head = true;
  bool enable_bias = true;
  bool layer_norm_affine = true;

  OptLayerNames Layer(int64_t layer) const;
};

// Detects the name prefix and whether lm_head is stored, then checks that every tensor the
// config implies is present (NotFound naming the first missing one). InvalidArgument when the
// config says the head is untied but lm_head.weight is absent.
StatusOr<OptTensorNames> ResolveOptTensorNames(const Checkpoint& ckpt, const OptConfig& config);

// Checks the shape of every tensor named for `config`, so a mismatched checkpoint fails at load
// with the tensor's name rather than deep in a layer. Dtypes may differ between tensors.
Status CheckOptTensorShapes(const Checkpoint& ckpt, const OptConfig& config,
                            const OptTensorNames& names);

}  // namespace deja
