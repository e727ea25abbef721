// Writes the seed corpora of the fuzz targets into <out>/<target>/: small valid inputs (and a few
// near misses) for each. Deterministic; tests/fuzz/make_seeds.sh rebuilds tests/fuzz/corpus with
// it. Usage: fuzz_make_seeds <source dir> <out dir>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "deja/v1/text_generation.pb.h"
#include "deja/v1/worker.pb.h"
#include "tests/fuzz/tiny_opt.h"

namespace deja::fuzz {
namespace {

namespace fs = std::filesystem;

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void Write(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

// A safetensors file from a header text and a data section.
std::string Safetensors(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(uint64_t{header.size()} >> (8 * i));
  return out + header + data;
}

void SafetensorsSeeds(const fs::path& out) {
  const fs::path tmp = out / "tmp";
  fs::create_directories(tmp);
  struct Variant {
    const char* name;
    std::vector<DType> dtypes;
  };
  for (const Variant& v :
       {Variant{"tiny_opt_f32", {DType::kF32}}, Variant{"tiny_opt_f16", {DType::kF16}},
        Variant{"tiny_opt_bf16", {DType::kBF16}},
        Variant{"tiny_opt_mixed", {DType::kF16, DType::kF32, DType::kBF16}}}) {
    if (Status s = WriteTinyOpt(tmp.string(), 1, kTinyOpt, v.dtypes); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      std::exit(1);
    }
    Write(out / (std::string(v.name) + ".safetensors"), ReadFile(tmp / "model.safetensors"));
  }
  fs::remove_all(tmp);
  Write(out / "empty_header.safetensors", Safetensors("{}      ", ""));
  Write(out / "metadata.safetensors",
        Safetensors(R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],)"
                    R"("data_offsets":[0,8]}})",
                    std::string(8, '\x01')));
  Write(out / "shapes.safetensors",
        Safetensors(R"({"scalar":{"dtype":"F16","shape":[],"data_offsets":[0,2]},)"
                    R"("empty":{"dtype":"BF16","shape":[3,0],"data_offsets":[2,2]},)"
                    R"("rank4":{"dtype":"F32","shape":[1,2,1,1],"data_offsets":[2,10]}})",
                    std::string(10, '\x02')));
  Write(out / "lm_head.safetensors",
        Safetensors(R"({"lm_head.weight":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]},)"
                    R"("decoder.embed_tokens.weight":{"dtype":"F32","shape":[1,2],)"
                    R"("data_offsets":[8,16]}})",
                    std::string(16, '\x03')));
}

void ConfigSeeds(const fs::path& src, const fs::path& out) {
  Write(out / "opt_mini.json", ReadFile(src / "models/opt-mini/config.json"));
  Write(out / "opt_tiny_postln.json", ReadFile(src / "models/opt-tiny-postln/config.json"));
  Write(out / "tiny.json", TinyOptConfigJson());
  Write(out / "required_only.json",
        R"({"vocab_size":50272,"hidden_size":768,"num_hidden_layers":12,"ffn_dim":3072,)"
        R"("num_attention_heads":12,"max_position_embeddings":2048})");
  Write(out / "nulls.json",
        R"({"model_type":"opt","vocab_size":16,"hidden_size":8,"num_hidden_layers":1,)"
        R"("ffn_dim":8,"num_attention_heads":2,"max_position_embeddings":8,)"
        R"("word_embed_proj_dim":null,"pad_token_id":null,"bos_token_id":0,"eos_token_id":15,)"
        R"("torch_dtype":"bfloat16","enable_bias":false,"layer_norm_elementwise_affine":false,)"
        R"("_remove_final_layer_norm":true,"tie_word_embeddings":false})");
}

void TokenizerSeeds(const fs::path& src, const fs::path& out) {
  const std::vector<std::pair<const char*, std::string>> texts = {
      {"sentence", "Hello, world! The quick brown fox jumps over the lazy dog."},
      {"specials", "a</s>b <pad>c</s></s> <pad>"},
      {"contractions", "I'll say it's what we've done; they're, I'm, he'd"},
      {"numbers", "3.14159 and 2024-11-23, 100000 items"},
      {"whitespace",
       "a  b\n\n\tc   \r\n  d \xC2\xA0"
       "e\xE3\x80\x80"
       "f  "},
      {"unicode",
       "na\xC3\xAFve caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E "
       "\xF0\x9F\x98\x80 \xD8\xB9\xD8\xB1\xD8\xA8\xD9\x8A e\xCC\x81"},
      {"new_letters", "\xE1\xB2\x89\xF0\x91\x8E\x80 \xF0\x9E\x97\xB1"},
      {"invalid_utf8", "ok \xC3\x28 then \xED\xA0\x80 and \xF4\x90\x80\x80"},
  };
  for (const auto& [name, text] : texts) Write(out / (std::string(name) + ".txt"), text);
  for (const char* file : {"kjv.txt", "tinyshakespeare.txt"}) {
    const std::string text = ReadFile(src / "tests/data/heldout" / file);
    Write(out / (fs::path(file).stem().string() + "_head.txt"), text.substr(0, 400));
  }
}

void RequestSeeds(const fs::path& out) {
  std::vector<std::pair<const char*, v1::GenerateRequest>> requests;
  {
    v1::GenerateRequest r;
    r.set_text("Once upon a time");
    requests.emplace_back("text", r);
  }
  {
    v1::GenerateRequest r;
    for (int id : {2, 100, 200, 8191}) r.mutable_token_ids()->add_ids(id);
    r.mutable_stopping()->set_max_new_tokens(8);
    requests.emplace_back("token_ids", r);
  }
  {
    v1::GenerateRequest r;
    r.set_request_id("req-1.a:b_c");
    r.set_text("The </s> king said");
    v1::SamplingParams* s = r.mutable_sampling();
    s->set_do_sample(true);
    s->set_temperature(0.7f);
    s->set_top_k(40);
    s->set_top_p(0.9f);
    s->set_repetition_penalty(1.2f);
    s->set_seed(42);
    v1::StoppingCriteria* st = r.mutable_stopping();
    st->set_max_new_tokens(32);
    st->add_stop_sequences("\n\n");
    st->add_stop_sequences("The end");
    st->add_stop_token_ids(2);
    st->set_ignore_eos(true);
    st->set_time_limit_ms(1000);
    r.mutable_response()->set_logprobs(true);
    r.mutable_response()->set_top_n_tokens(3);
    r.mutable_response()->set_return_tokens(true);
    requests.emplace_back("sampling_stopping", r);
  }
  {
    v1::GenerateRequest r;
    r.set_text("a b c d e f g h i j k l m n o p q r s t u v w x y z");
    r.mutable_cache()->set_kind(v1::CachePolicy::KIND_H2O);
    r.mutable_cache()->set_heavy_ratio(0.25f);
    r.mutable_cache()->set_recent_tokens(4);
    r.mutable_stopping()->set_max_new_tokens(20);
    requests.emplace_back("h2o", r);
  }
  {  // Decayed H2O whose budgets exceed the prompt, with a cache_salt.
    v1::GenerateRequest r;
    r.set_text("And God said");
    r.mutable_cache()->set_kind(v1::CachePolicy::KIND_H2O);
    r.mutable_cache()->set_heavy_tokens(4);
    r.mutable_cache()->set_recent_tokens(20);
    r.mutable_cache()->set_score_decay(0.6f);
    r.mutable_stopping()->set_max_new_tokens(40);  // the budgets stay below the length
    r.set_cache_salt("tenant-a");
    requests.emplace_back("h2o_decay_big_budget", r);
  }
  {  // Locret over a prompt longer than one chunk, prefix cache on.
    v1::GenerateRequest r;
    r.set_text("In the beginning God created the heaven and the earth and the earth was without form");
    r.mutable_cache()->set_kind(v1::CachePolicy::KIND_LOCRET);
    r.mutable_cache()->set_heavy_tokens(3);
    r.mutable_cache()->set_recent_tokens(2);
    r.mutable_prefix_cache()->set_mode(v1::PrefixCache::MODE_ON);
    r.mutable_stopping()->set_max_new_tokens(6);
    requests.emplace_back("locret", r);
  }
  {
    v1::GenerateRequest r;
    r.set_text("window");
    r.mutable_cache()->set_kind(v1::CachePolicy::KIND_WINDOW);
    r.mutable_cache()->set_recent_ratio(0.5f);
    requests.emplace_back("window", r);
  }
  {
    v1::GenerateRequest r;
    r.set_text("sparse please");
    r.mutable_sparsity()->set_mode(v1::Sparsity::MODE_ON);
    r.mutable_sparsity()->set_schedule("default");
    r.mutable_cache()->set_kind(v1::CachePolicy::KIND_FULL);
    requests.emplace_back("sparsity", r);
  }
  for (const auto& [name, r] : requests) {
    Write(out / (std::string(name) + ".pb"), r.SerializeAsString());
  }
  v1::TokenizeRequest t;
  t.set_text("tokenize me</s>");
  t.set_add_bos(true);
  Write(out / "tokenize.pb", t.SerializeAsString());
}

// Steps framed as the step target reads them: a varint length, then the message.
std::string Frame(const std::vector<v1::StepRequest>& steps) {
  std::string out;
  for (const v1::StepRequest& s : steps) {
    const std::string bytes = s.SerializeAsString();
    uint64_t n = bytes.size();
    do {
      out.push_back(static_cast<char>((n & 0x7F) | (n >= 0x80 ? 0x80 : 0)));
      n >>= 7;
    } while (n != 0);
    out += bytes;
  }
  return out;
}

v1::SequenceWork Work(uint64_t id, std::vector<int32_t> tokens, uint32_t start, bool sample) {
  v1::SequenceWork w;
  w.set_seq_id(id);
  for (int32_t t : tokens) w.add_tokens(t);
  w.set_start_position(start);
  w.set_sample(sample);
  return w;
}

v1::SequenceConfig Config(uint32_t prompt, uint32_t max_new) {
  v1::SequenceConfig c;
  c.set_prompt_tokens(prompt);
  c.set_max_new_tokens(max_new);
  c.mutable_sampling()->set_top_p(1.f);
  c.mutable_sampling()->set_repetition_penalty(1.f);
  return c;
}

v1::StepRequest Step(uint64_t id, std::vector<v1::SequenceWork> work,
                     std::vector<uint64_t> release = {}) {
  v1::StepRequest s;
  s.set_step_id(id);
  for (v1::SequenceWork& w : work) *s.add_sequences() = std::move(w);
  for (uint64_t r : release) s.add_release_seq_ids(r);
  return s;
}

void StepSeeds(const fs::path& out) {
  {  // Prefill, then decode two tokens, then release.
    v1::SequenceWork first = Work(1, {2, 10, 20, 30}, 0, true);
    *first.mutable_config() = Config(4, 4);
    first.mutable_config()->set_top_n(2);
    Write(out / "prefill_decode.bin", Frame({Step(1, {first}), Step(2, {Work(1, {5}, 4, true)}),
                                             Step(3, {Work(1, {6}, 5, true)}), Step(4, {}, {1})}));
  }
  {  // Chunked prefill with all logits, sampling settings.
    v1::SequenceWork first = Work(7, {2, 3, 4}, 0, false);
    *first.mutable_config() = Config(6, 3);
    v1::WorkerSampling* s = first.mutable_config()->mutable_sampling();
    s->set_do_sample(true);
    s->set_temperature(0.8f);
    s->set_top_k(5);
    s->set_top_p(0.9f);
    s->set_repetition_penalty(1.3f);
    s->set_seed(9);
    v1::SequenceWork second = Work(7, {5, 6, 7}, 3, true);
    second.set_want_all_logits(true);
    Write(out / "chunked_prefill.bin",
          Frame({Step(1, {first}), Step(2, {second}), Step(3, {Work(7, {8}, 6, true)})}));
  }
  {  // Two sequences in a batch, H2O and window caches, one sparse.
    v1::SequenceWork a = Work(1, {2, 11, 12, 13, 14, 15, 16, 17}, 0, true);
    *a.mutable_config() = Config(8, 8);
    a.mutable_config()->mutable_cache()->set_kind(v1::WorkerCachePolicy::KIND_H2O);
    a.mutable_config()->mutable_cache()->set_heavy_tokens(2);
    a.mutable_config()->mutable_cache()->set_recent_tokens(2);
    v1::SequenceWork b = Work(2, {2, 40, 41}, 0, true);
    *b.mutable_config() = Config(3, 10);
    b.mutable_config()->mutable_cache()->set_kind(v1::WorkerCachePolicy::KIND_WINDOW);
    b.mutable_config()->mutable_cache()->set_recent_tokens(3);
    b.mutable_config()->set_sparse(true);
    Write(out / "batch_policies.bin",
          Frame({Step(1, {a, b}), Step(2, {Work(1, {18}, 8, true), Work(2, {42}, 3, true)}),
                 Step(3, {Work(2, {43}, 4, true)}, {1})}));
  }
  {  // Decayed H2O whose budgets exceed the prompt: decode steps that decay and evict nothing
     // (no victim buffer on a paged cache), then one that evicts.
    v1::SequenceWork a = Work(11, {2, 21, 22}, 0, true);
    *a.mutable_config() = Config(3, 8);
    v1::WorkerCachePolicy* c = a.mutable_config()->mutable_cache();
    c->set_kind(v1::WorkerCachePolicy::KIND_H2O);
    c->set_heavy_tokens(2);
    c->set_recent_tokens(3);
    c->set_score_decay(0.6f);
    std::vector<v1::StepRequest> steps = {Step(1, {a})};
    for (uint32_t i = 0; i < 6; ++i) {
      steps.push_back(Step(2 + i, {Work(11, {static_cast<int32_t>(30 + i)}, 3 + i, true)}));
    }
    Write(out / "h2o_decay_within_budget.bin", Frame(steps));
  }
  {  // Every bounded policy with its prompt split across steps where it does not evict: window
     // and H2O in three pieces, locret (chunks of 4) split inside a chunk.
    std::vector<v1::SequenceWork> first, second, third;
    const v1::WorkerCachePolicy::Kind kinds[] = {v1::WorkerCachePolicy::KIND_WINDOW,
                                                 v1::WorkerCachePolicy::KIND_H2O,
                                                 v1::WorkerCachePolicy::KIND_LOCRET};
    for (uint64_t k = 0; k < 3; ++k) {
      v1::SequenceWork w = Work(20 + k, {2, 3, 4}, 0, false);
      *w.mutable_config() = Config(9, 4);
      v1::WorkerCachePolicy* c = w.mutable_config()->mutable_cache();
      c->set_kind(kinds[k]);
      c->set_heavy_tokens(kinds[k] == v1::WorkerCachePolicy::KIND_WINDOW ? 0 : 2);
      c->set_recent_tokens(2);
      if (kinds[k] == v1::WorkerCachePolicy::KIND_LOCRET) c->set_chunk_tokens(4);
      first.push_back(w);
      second.push_back(Work(20 + k, {5}, 3, false));
      third.push_back(Work(20 + k, {6, 7, 8, 9, 10}, 4, true));
    }
    // locret's third piece may not cross its chunk boundary at 8: positions 4..7 only.
    third[2] = Work(22, {6, 7, 8, 9}, 4, false);
    Write(out / "split_prefills.bin",
          Frame({Step(1, first), Step(2, second), Step(3, third),
                 Step(4, {Work(22, {10}, 8, true)})}));
  }
  {  // Refusals: unknown sequence, wrong position, a token outside the vocabulary, over budget.
    v1::SequenceWork first = Work(3, {2, 9}, 0, true);
    *first.mutable_config() = Config(2, 30);
    v1::SequenceWork bad_token = Work(4, {2, 64}, 0, true);
    *bad_token.mutable_config() = Config(2, 2);
    v1::SequenceWork big = Work(5, {2}, 0, true);
    *big.mutable_config() = Config(1, 31);
    Write(out / "refusals.bin",
          Frame({Step(1, {first}), Step(2, {Work(9, {1}, 5, true)}),
                 Step(3, {Work(3, {1}, 7, true)}), Step(4, {bad_token}),
                 Step(5, {big, Work(3, {1}, 2, true)}), Step(6, {Work(3, {1}, 2, true)})}));
  }
}

}  // namespace
}  // namespace deja::fuzz

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s <source dir> <out dir>\n", argv[0]);
    return 2;
  }
  const fs::path src = argv[1], out = argv[2];
  for (const char* target : {"safetensors", "opt_config", "tokenizer", "request", "step"}) {
    fs::remove_all(out / target);
    fs::create_directories(out / target);
  }
  deja::fuzz::SafetensorsSeeds(out / "safetensors");
  deja::fuzz::ConfigSeeds(src, out / "opt_config");
  deja::fuzz::TokenizerSeeds(src, out / "tokenizer");
  deja::fuzz::RequestSeeds(out / "request");
  deja::fuzz::StepSeeds(out / "step");
  return 0;
}
