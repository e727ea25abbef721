// OptConfig parsing and validation, and OPT tensor-name resolution against small checkpoints.
#include "common/opt_config.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "tests/common/temp_dir.h"

namespace {
// Bytes operator new may still hand out in this test binary; negative: no limit. A test that sets
// it fails with std::bad_alloc where the code under test would otherwise take the machine's memory.
std::atomic<int64_t> g_new_budget{-1};
}  // namespace

void* operator new(std::size_t n) {
  const auto bytes = static_cast<int64_t>(n);
  if (g_new_budget.load() >= 0 && g_new_budget.fetch_sub(bytes) < bytes) throw std::bad_alloc();
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace deja {
namespace {

using test_util::TempDir;
using test_util::WriteBytes;

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// opt-125m's config.json, trimmed of fields the server ignores.
const char* kOpt125m = R"({
  "_name_or_path": "facebook/opt-125m", "activation_function": "relu",
  "architectures": ["OPTForCausalLM"], "bos_token_id": 2, "do_layer_norm_before": true,
  "dropout": 0.1, "eos_token_id": 2, "ffn_dim": 3072, "hidden_size": 768,
  "max_position_embeddings": 2048, "model_type": "opt", "num_attention_heads": 12,
  "num_hidden_layers": 12, "pad_token_id": 1, "torch_dtype": "float16",
  "vocab_size": 50272, "word_embed_proj_dim": 768})";

// opt-350m: post-LN, 512-wide embeddings projected to 1024.
const char* kOpt350m = R"({
  "activation_function": "relu", "bos_token_id": 2, "do_layer_norm_before": false,
  "eos_token_id": 2, "ffn_dim": 4096, "hidden_size": 1024, "max_position_embeddings": 2048,
  "model_type": "opt", "num_attention_heads": 16, "num_hidden_layers": 24, "pad_token_id": 1,
  "torch_dtype": "float16", "vocab_size": 50272, "word_embed_proj_dim": 512})";

TEST(OptConfigTest, ParsesOpt125m) {
  StatusOr<OptConfig> c = ParseOptConfig(kOpt125m);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->vocab_size, 50272);
  EXPECT_EQ(c->hidden_size, 768);
  EXPECT_EQ(c->num_hidden_layers, 12);
  EXPECT_EQ(c->ffn_dim, 3072);
  EXPECT_EQ(c->num_attention_heads, 12);
  EXPECT_EQ(c->head_dim(), 64);
  EXPECT_EQ(c->max_position_embeddings, 2048);
  EXPECT_EQ(c->word_embed_proj_dim, 768);
  EXPECT_TRUE(c->do_layer_norm_before);
  EXPECT_TRUE(c->has_final_layer_norm());
  EXPECT_FALSE(c->has_projections());
  EXPECT_TRUE(c->enable_bias);
  EXPECT_TRUE(c->layer_norm_elementwise_affine);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->pad_token_id, 1);
  EXPECT_EQ(c->bos_token_id, 2);
  EXPECT_EQ(c->eos_token_id, 2);
  EXPECT_EQ(c->torch_dtype, "float16");
}

TEST(OptConfigTest, Parses350mVariant) {
  StatusOr<OptConfig> c = ParseOptConfig(kOpt350m);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->hidden_size, 1024);
  EXPECT_EQ(c->word_embed_proj_dim, 512);
  EXPECT_FALSE(c->do_layer_norm_before);
  EXPECT_FALSE(c->has_final_layer_norm());
  EXPECT_TRUE(c->has_projections());
  EXPECT_EQ(c->head_dim(), 64);
}

TEST(OptConfigTest, DefaultsWordEmbedProjDimToHidden) {
  std::string text = R"({"vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
      "ffn_dim": 16, "num_attention_heads": 2, "max_position_embeddings": 4})";
  StatusOr<OptConfig> c = ParseOptConfig(text);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->word_embed_proj_dim, 8);
  EXPECT_EQ(c->activation_function, "relu");
  EXPECT_TRUE(c->torch_dtype.empty());
}

struct BadConfig {
  const char* test_name;
  std::string from;  // replaced in kOpt125m ...
  std::string to;    // ... by this
  std::string field;
};

class BadConfigTest : public ::testing::TestWithParam<BadConfig> {};

TEST_P(BadConfigTest, ErrorNamesField) {
  std::string text = kOpt125m;
  const size_t at = text.find(GetParam().from);
  ASSERT_NE(at, std::string::npos);
  text.replace(at, GetParam().from.size(), GetParam().to);
  StatusOr<OptConfig> c = ParseOptConfig(text, "my/config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(c.status().message(), GetParam().field)) << c.status().ToString();
  EXPECT_TRUE(Contains(c.status().message(), "my/config.json")) << c.status().ToString();
}

INSTANTIATE_TEST_SUITE_P(
    Fields, BadConfigTest,
    ::testing::Values(
        BadConfig{"MissingField", R"("ffn_dim": 3072,)", "", "ffn_dim"},
        BadConfig{"BadActivation", R"("activation_function": "relu")",
                  R"("activation_function": "gelu")", "activation_function"},
        BadConfig{"ZeroHidden", R"("hidden_size": 768)", R"("hidden_size": 0)", "hidden_size"},
        BadConfig{"HeadsDoNotDivide", R"("num_attention_heads": 12)", R"("num_attention_heads": 7)",
                  "num_attention_heads"},
        BadConfig{"WrongType", R"("num_hidden_layers": 12)", R"("num_hidden_layers": "12")",
                  "num_hidden_layers"},
        BadConfig{"FloatSize", R"("vocab_size": 50272)", R"("vocab_size": 50272.5)", "vocab_size"},
        BadConfig{"BoolAsInt", R"("do_layer_norm_before": true)", R"("do_layer_norm_before": 1)",
                  "do_layer_norm_before"},
        BadConfig{"TokenOutsideVocab", R"("eos_token_id": 2)", R"("eos_token_id": 60000)",
                  "eos_token_id"},
        BadConfig{"NegativeProj", R"("word_embed_proj_dim": 768)", R"("word_embed_proj_dim": -1)",
                  "word_embed_proj_dim"},
        BadConfig{"OtherModel", R"("model_type": "opt")", R"("model_type": "llama")", "model_type"},
        // Sizes kept in 32 bits past the config; the largest position count used to overflow
        // int64 when the loader added the position table's two extra rows (fuzz_opt_config).
        BadConfig{"HugePositions", R"("max_position_embeddings": 2048)",
                  R"("max_position_embeddings": 9223372036854775807)", "max_position_embeddings"},
        BadConfig{"PositionsPastInt32", R"("max_position_embeddings": 2048)",
                  R"("max_position_embeddings": 2147483646)", "max_position_embeddings"},
        BadConfig{"VocabPastInt32", R"("vocab_size": 50272)", R"("vocab_size": 2147483648)",
                  "vocab_size"}),
    [](const ::testing::TestParamInfo<BadConfig>& info) { return info.param.test_name; });

TEST(OptConfigTest, InvalidJson) {
  EXPECT_EQ(ParseOptConfig("{").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseOptConfig("[]").status().code(), StatusCode::kInvalidArgument);
}

TEST(OptConfigTest, LoadsFromDirectoryOrFile) {
  TempDir dir;
  WriteBytes(dir.File("config.json"), kOpt350m);
  ASSERT_TRUE(LoadOptConfig(dir.path()).ok());
  ASSERT_TRUE(LoadOptConfig(dir.File("config.json")).ok());
  EXPECT_EQ(LoadOptConfig(dir.File("absent")).status().code(), StatusCode::kNotFound);
}

// A tiny OPT config: vocab 11, hidden 8, 2 layers, ffn 16, 2 heads, 6 positions.
OptConfig TinyConfig(int64_t proj_dim, bool pre_ln) {
  OptConfig c;
  c.vocab_size = 11;
  c.hidden_size = 8;
  c.num_hidden_layers = 2;
  c.ffn_dim = 16;
  c.num_attention_heads = 2;
  c.max_position_embeddings = 6;
  c.word_embed_proj_dim = proj_dim;
  c.do_layer_norm_before = pre_ln;
  c.pad_token_id = 1;
  c.bos_token_id = 2;
  c.eos_token_id = 2;
  return c;
}

// Writes a checkpoint with every tensor `c` implies, named under `prefix`, into `dir`.
void WriteTinyCheckpoint(const std::string& dir, const OptConfig& c, const std::string& prefix,
                         bool with_lm_head, const std::string& skip = "") {
  const int64_t h = c.hidden_size, p = c.word_embed_proj_dim, f = c.ffn_dim;
  std::vector<std::pair<std::string, Shape>> specs = {
      {"embed_tokens.weight", {c.vocab_size, p}},
      {"embed_positions.weight", {c.max_position_embeddings + 2, h}}};
  if (p != h) {
    specs.push_back({"project_in.weight", {h, p}});
    specs.push_back({"project_out.weight", {p, h}});
  }
  if (c.do_layer_norm_before) {
    specs.push_back({"final_layer_norm.weight", {h}});
    specs.push_back({"final_layer_norm.bias", {h}});
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string L = "layers." + std::to_string(l) + ".";
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
      specs.push_back({L + "self_attn." + proj + ".weight", {h, h}});
      specs.push_back({L + "self_attn." + proj + ".bias", {h}});
    }
    for (const char* ln : {"self_attn_layer_norm", "final_layer_norm"}) {
      specs.push_back({L + ln + ".weight", {h}});
      specs.push_back({L + ln + ".bias", {h}});
    }
    specs.push_back({L + "fc1.weight", {f, h}});
    specs.push_back({L + "fc1.bias", {f}});
    specs.push_back({L + "fc2.weight", {h, f}});
    specs.push_back({L + "fc2.bias", {h}});
  }
  std::vector<Tensor> tensors;
  std::vector<std::pair<std::string, TensorView>> views;
  for (const auto& [name, shape] : specs) {
    if (name == skip) continue;
    tensors.push_back(Tensor::Zeros(DType::kF16, shape));
    views.emplace_back(prefix + name, tensors.back().view());
  }
  if (with_lm_head) {
    tensors.push_back(Tensor::Zeros(DType::kF16, {c.vocab_size, p}));
    views.emplace_back("lm_head.weight", tensors.back().view());
  }
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", views).ok());
}

std::unique_ptr<Checkpoint> Open(const std::string& dir) {
  StatusOr<std::unique_ptr<Checkpoint>> c = OpenCheckpoint(dir);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

TEST(OptTensorNamesTest, ModelDecoderPrefixTiedHead) {
  TempDir dir;
  const OptConfig c = TinyConfig(8, true);
  WriteTinyCheckpoint(dir.path(), c, "model.decoder.", false);
  auto ckpt = Open(dir.path());
  ASSERT_NE(ckpt, nullptr);
  StatusOr<OptTensorNames> n = ResolveOptTensorNames(*ckpt, c);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(n->prefix, "model.decoder.");
  EXPECT_TRUE(n->tied_lm_head);
  EXPECT_EQ(n->lm_head, "model.decoder.embed_tokens.weight");
  EXPECT_EQ(n->embed_positions, "model.decoder.embed_positions.weight");
  EXPECT_EQ(n->final_ln_bias, "model.decoder.final_layer_norm.bias");
  EXPECT_TRUE(n->project_in.empty());
  EXPECT_TRUE(n->project_out.empty());
  const OptLayerNames l1 = n->Layer(1);
  EXPECT_EQ(l1.q_weight, "model.decoder.layers.1.self_attn.q_proj.weight");
  EXPECT_EQ(l1.out_bias, "model.decoder.layers.1.self_attn.out_proj.bias");
  EXPECT_EQ(l1.attn_ln_weight, "model.decoder.layers.1.self_attn_layer_norm.weight");
  EXPECT_EQ(l1.fc2_weight, "model.decoder.layers.1.fc2.weight");
  EXPECT_EQ(l1.ffn_ln_bias, "model.decoder.layers.1.final_layer_norm.bias");
  EXPECT_TRUE(CheckOptTensorShapes(*ckpt, c, *n).ok());
}

TEST(OptTensorNamesTest, DecoderPrefixUntiedHeadPostLnWithProjections) {
  TempDir dir;
  const OptConfig c = TinyConfig(4, false);
  WriteTinyCheckpoint(dir.path(), c, "decoder.", true);
  auto ckpt = Open(dir.path());
  ASSERT_NE(ckpt, nullptr);
  StatusOr<OptTensorNames> n = ResolveOptTensorNames(*ckpt, c);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(n->prefix, "decoder.");
  EXPECT_FALSE(n->tied_lm_head);
  EXPECT_EQ(n->lm_head, "lm_head.weight");
  EXPECT_TRUE(n->final_ln_weight.empty());
  EXPECT_EQ(n->project_in, "decoder.project_in.weight");
  EXPECT_EQ(n->project_out, "decoder.project_out.weight");
  EXPECT_EQ(n->Layer(0).fc1_bias, "decoder.layers.0.fc1.bias");
  EXPECT_TRUE(CheckOptTensorShapes(*ckpt, c, *n).ok());
}

TEST(OptTensorNamesTest, MissingTensorIsNamed) {
  TempDir dir;
  const OptConfig c = TinyConfig(8, true);
  WriteTinyCheckpoint(dir.path(), c, "model.decoder.", false, "layers.1.fc2.bias");
  auto ckpt = Open(dir.path());
  ASSERT_NE(ckpt, nullptr);
  StatusOr<OptTensorNames> n = ResolveOptTensorNames(*ckpt, c);
  EXPECT_EQ(n.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(n.status().message(), "model.decoder.layers.1.fc2.bias"));
}

TEST(OptTensorNamesTest, ConfigMismatches) {
  TempDir dir;
  OptConfig c = TinyConfig(8, true);
  WriteTinyCheckpoint(dir.path(), c, "model.decoder.", false);
  auto ckpt = Open(dir.path());
  ASSERT_NE(ckpt, nullptr);
  OptConfig untied = c;
  untied.tie_word_embeddings = false;
  EXPECT_EQ(ResolveOptTensorNames(*ckpt, untied).status().code(), StatusCode::kInvalidArgument);
  OptConfig fewer_layers = c;
  fewer_layers.num_hidden_layers = 1;
  EXPECT_EQ(ResolveOptTensorNames(*ckpt, fewer_layers).status().code(),
            StatusCode::kInvalidArgument);
  OptConfig wider_ffn = c;
  wider_ffn.ffn_dim = 32;
  StatusOr<OptTensorNames> n = ResolveOptTensorNames(*ckpt, wider_ffn);
  ASSERT_TRUE(n.ok());
  Status shapes = CheckOptTensorShapes(*ckpt, wider_ffn, *n);
  EXPECT_EQ(shapes.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(shapes.message(), "fc1.weight"));
}

// A config may declare more layers than any checkpoint holds; the tensors are checked one at a
// time, so the first missing one ends the check. The names of every declared layer used to be
// listed first, and this config (found by fuzz_opt_config) ran the loader out of memory.
TEST(OptTensorNamesTest, HugeLayerCountFailsAtTheFirstMissingLayer) {
  TempDir dir;
  const OptConfig c = TinyConfig(8, true);
  WriteTinyCheckpoint(dir.path(), c, "model.decoder.", false);
  auto ckpt = Open(dir.path());
  ASSERT_NE(ckpt, nullptr);
  OptConfig huge = c;
  huge.num_hidden_layers = 214748364812;
  std::optional<StatusOr<OptTensorNames>> n;
  g_new_budget = 64 << 20;
  try {
    n = ResolveOptTensorNames(*ckpt, huge);
  } catch (const std::bad_alloc&) {
  }
  g_new_budget = -1;
  ASSERT_TRUE(n.has_value()) << "resolving the names took more than 64 MiB";
  EXPECT_EQ(n->status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(n->status().message(), "model.decoder.layers.2.self_attn.q_proj.weight"))
      << n->status().ToString();
}

TEST(OptTensorNamesTest, NotAnOptCheckpoint) {
  TempDir dir;
  const Tensor t = Tensor::Zeros(DType::kF32, {2});
  ASSERT_TRUE(
      WriteSafetensors(dir.File("model.safetensors"), {{"transformer.wte", t.view()}}).ok());
  auto ckpt = Open(dir.path());
  ASSERT_NE(ckpt, nullptr);
  EXPECT_EQ(ResolveOptTensorNames(*ckpt, TinyConfig(8, true)).status().code(),
            StatusCode::kNotFound);
}

}  // namespace
}  // namespace deja
