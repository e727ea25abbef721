// Fuzzes config.json parsing (ParseOptConfig) with arbitrary text, then what a loader does with a
// config that parsed: the OPT tensor names and shapes it implies, against the tiny checkpoint.
//
// Invariants: a text that does not parse is INVALID_ARGUMENT naming the file; a config that
// parses is valid (Validate: positive sizes, heads divide the width, relu, special tokens inside
// the vocabulary, token ids and positions in 32 bits) and survives a round trip through JSON
// unchanged; resolving and checking its tensors against a checkpoint returns a Status (the tiny
// config's own resolves and checks).
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/opt_config.h"
#include "common/safetensors.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/tiny_opt.h"

namespace deja::fuzz {
namespace {

constexpr const char* kSource = "fuzz/config.json";

std::string ToJson(const OptConfig& c) {
  nlohmann::json j = {{"model_type", "opt"},
                      {"vocab_size", c.vocab_size},
                      {"hidden_size", c.hidden_size},
                      {"num_hidden_layers", c.num_hidden_layers},
                      {"ffn_dim", c.ffn_dim},
                      {"num_attention_heads", c.num_attention_heads},
                      {"max_position_embeddings", c.max_position_embeddings},
                      {"word_embed_proj_dim", c.word_embed_proj_dim},
                      {"do_layer_norm_before", c.do_layer_norm_before},
                      {"_remove_final_layer_norm", c.remove_final_layer_norm},
                      {"activation_function", c.activation_function},
                      {"enable_bias", c.enable_bias},
                      {"layer_norm_elementwise_affine", c.layer_norm_elementwise_affine},
                      {"pad_token_id", c.pad_token_id},
                      {"bos_token_id", c.bos_token_id},
                      {"eos_token_id", c.eos_token_id},
                      {"tie_word_embeddings", c.tie_word_embeddings},
                      {"torch_dtype", c.torch_dtype}};
  return j.dump();
}

bool Same(const OptConfig& a, const OptConfig& b) {
  return a.vocab_size == b.vocab_size && a.hidden_size == b.hidden_size &&
         a.num_hidden_layers == b.num_hidden_layers && a.ffn_dim == b.ffn_dim &&
         a.num_attention_heads == b.num_attention_heads &&
         a.max_position_embeddings == b.max_position_embeddings &&
         a.word_embed_proj_dim == b.word_embed_proj_dim &&
         a.do_layer_norm_before == b.do_layer_norm_before &&
         a.remove_final_layer_norm == b.remove_final_layer_norm &&
         a.activation_function == b.activation_function && a.enable_bias == b.enable_bias &&
         a.layer_norm_elementwise_affine == b.layer_norm_elementwise_affine &&
         a.pad_token_id == b.pad_token_id && a.bos_token_id == b.bos_token_id &&
         a.eos_token_id == b.eos_token_id && a.tie_word_embeddings == b.tie_word_embeddings &&
         a.torch_dtype == b.torch_dtype;
}

const Checkpoint& TinyCheckpoint() {
  static const std::unique_ptr<Checkpoint> ckpt = [] {
    const std::string dir = ScratchDir() + "/tiny";
    std::filesystem::create_directories(dir);
    if (Status s = WriteTinyOpt(dir, 1); !s.ok())
      Fail("tiny model", __FILE__, __LINE__, s.ToString());
    StatusOr<std::unique_ptr<Checkpoint>> c = Checkpoint::OpenDir(dir);
    if (!c.ok()) Fail("tiny checkpoint", __FILE__, __LINE__, c.status().ToString());
    return std::move(*c);
  }();
  return *ckpt;
}

}  // namespace
}  // namespace deja::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  deja::fuzz::QuietLogging();
  (void)deja::fuzz::TinyCheckpoint();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deja;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  StatusOr<OptConfig> config = ParseOptConfig(text, fuzz::kSource);
  if (!config.ok()) {
    const Status& s = config.status();
    FUZZ_CHECK_MSG(s.code() == StatusCode::kInvalidArgument, s.ToString());
    FUZZ_CHECK_MSG(s.message().find(fuzz::kSource) != std::string::npos, s.ToString());
    return 0;
  }
  const OptConfig& c = *config;
  FUZZ_CHECK_MSG(c.Validate().ok(), c.Validate().ToString());
  FUZZ_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.num_hidden_layers > 0 && c.ffn_dim > 0 &&
             c.num_attention_heads > 0 && c.max_position_embeddings > 0 &&
             c.word_embed_proj_dim > 0);
  FUZZ_CHECK(c.head_dim() * c.num_attention_heads == c.hidden_size);
  // Token ids and positions (plus the position table's two extra rows) fit in 32 bits.
  FUZZ_CHECK(c.vocab_size <= INT32_MAX && c.max_position_embeddings + 2 <= INT32_MAX);
  FUZZ_CHECK(c.activation_function == "relu");
  for (int64_t id : {c.pad_token_id, c.bos_token_id, c.eos_token_id}) {
    FUZZ_CHECK(id >= 0 && id < c.vocab_size);
  }
  StatusOr<OptConfig> again = ParseOptConfig(fuzz::ToJson(c), fuzz::kSource);
  FUZZ_CHECK_MSG(again.ok(), again.status().ToString());
  FUZZ_CHECK(fuzz::Same(c, *again));

  static const OptConfig tiny = *ParseOptConfig(fuzz::TinyOptConfigJson());
  const bool is_tiny = fuzz::Same(c, tiny);
  const Checkpoint& ckpt = fuzz::TinyCheckpoint();
  StatusOr<OptTensorNames> names = ResolveOptTensorNames(ckpt, c);
  FUZZ_CHECK_MSG(names.ok() || !is_tiny, names.status().ToString());
  if (!names.ok()) {
    const StatusCode code = names.status().code();
    FUZZ_CHECK_MSG(code == StatusCode::kNotFound || code == StatusCode::kInvalidArgument,
                   names.status().ToString());
    return 0;
  }
  Status shapes = CheckOptTensorShapes(ckpt, c, *names);
  FUZZ_CHECK_MSG(shapes.ok() || (shapes.code() == StatusCode::kInvalidArgument && !is_tiny),
                 shapes.ToString());
  return 0;
}
