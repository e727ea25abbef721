// Tiny OPT checkpoints for the fuzz targets and their seeds, with seeded random weights: small
// enough that a forward step costs microseconds, so the targets spend their time in the code
// around the model. kTinyOpt (64 tokens, width 16, 2 heads, 2 layers, 32 positions) serves the
// step and checkpoint targets; kWideOpt has opt-mini's vocabulary and positions on a width of 8,
// so the request target can run what the coordinator resolves for opt-mini on a worker.
#pragma once

#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/safetensors.h"
#include "common/tensor.h"
#include "common/vec_math.h"

namespace deja::fuzz {

struct TinyOptSpec {
  int64_t vocab;
  int64_t hidden;
  int64_t layers;
  int64_t ffn;
  int64_t heads;
  int64_t positions;
};

inline constexpr TinyOptSpec kTinyOpt{64, 16, 2, 32, 2, 32};
inline constexpr TinyOptSpec kWideOpt{8192, 8, 1, 16, 2, 1024};

inline std::string TinyOptConfigJson(const TinyOptSpec& s = kTinyOpt) {
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                R"({"model_type": "opt", "vocab_size": %lld, "hidden_size": %lld,
  "num_hidden_layers": %lld, "ffn_dim": %lld, "num_attention_heads": %lld,
  "max_position_embeddings": %lld, "word_embed_proj_dim": %lld, "do_layer_norm_before": true,
  "activation_function": "relu", "pad_token_id": 1, "bos_token_id": 2, "eos_token_id": 2,
  "tie_word_embeddings": true}
)",
                static_cast<long long>(s.vocab), static_cast<long long>(s.hidden),
                static_cast<long long>(s.layers), static_cast<long long>(s.ffn),
                static_cast<long long>(s.heads), static_cast<long long>(s.positions),
                static_cast<long long>(s.hidden));
  return buf;
}

// Every tensor of the model with its shape, in checkpoint order.
inline std::vector<std::pair<std::string, Shape>> TinyOptTensorShapes(
    const TinyOptSpec& s = kTinyOpt) {
  const int64_t d = s.hidden, f = s.ffn;
  const std::string p = "model.decoder.";
  std::vector<std::pair<std::string, Shape>> specs = {
      {p + "embed_tokens.weight", {s.vocab, d}},
      {p + "embed_positions.weight", {s.positions + 2, d}},
      {p + "final_layer_norm.weight", {d}},
      {p + "final_layer_norm.bias", {d}}};
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string lp = p + "layers." + std::to_string(l) + ".";
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
      specs.push_back({lp + "self_attn." + proj + ".weight", {d, d}});
      specs.push_back({lp + "self_attn." + proj + ".bias", {d}});
    }
    for (const char* ln : {"self_attn_layer_norm", "final_layer_norm"}) {
      specs.push_back({lp + ln + ".weight", {d}});
      specs.push_back({lp + ln + ".bias", {d}});
    }
    specs.push_back({lp + "fc1.weight", {f, d}});
    specs.push_back({lp + "fc1.bias", {f}});
    specs.push_back({lp + "fc2.weight", {d, f}});
    specs.push_back({lp + "fc2.bias", {d}});
  }
  return specs;
}

// Writes `dir`/config.json and `dir`/model.safetensors: normal(0, 0.5) weights, LayerNorm
// weights near 1; tensor i in dtypes[i % dtypes.size()] (F32, F16 or BF16).
inline Status WriteTinyOpt(const std::string& dir, uint64_t seed,
                           const TinyOptSpec& spec = kTinyOpt,
                           const std::vector<DType>& dtypes = {DType::kF32}) {
  {
    const std::string config = TinyOptConfigJson(spec);
    std::FILE* f = std::fopen((dir + "/config.json").c_str(), "wb");
    if (f == nullptr) return Internal("cannot write " + dir + "/config.json");
    const bool written = std::fwrite(config.data(), 1, config.size(), f) == config.size();
    if (std::fclose(f) != 0 || !written) return Internal("cannot write " + dir + "/config.json");
  }
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 0.5f);
  std::vector<Tensor> tensors;
  std::vector<std::pair<std::string, TensorView>> views;
  const auto specs = TinyOptTensorShapes(spec);
  tensors.reserve(specs.size());
  for (const auto& [name, shape] : specs) {
    const DType dtype = dtypes[tensors.size() % dtypes.size()];
    const bool ln_weight = name.find("layer_norm.weight") != std::string::npos;
    std::vector<float> values(static_cast<size_t>(shape.numel()));
    for (float& v : values) v = ln_weight ? 1.f + 0.1f * normal(rng) : normal(rng);
    tensors.push_back(Tensor::Empty(dtype, shape));
    ConvertFromF32(values.data(), shape.numel(), dtype, tensors.back().data());
    views.emplace_back(name, tensors.back().view());
  }
  return WriteSafetensors(dir + "/model.safetensors", views);
}

}  // namespace deja::fuzz
