// Tokenizer::Load: reads and checks a Hugging Face model directory's tokenizer files. Every
// malformed input becomes a Status naming the file; nothing here aborts.
#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "common/tokenizer.h"

namespace deja {
namespace {

using nlohmann::json;
using Vocab = std::unordered_map<std::string, int32_t>;
namespace fs = std::filesystem;

// Ids are dense in real vocabularies; a huge id means a corrupt file, not a real token, and
// would otherwise size the id tables.
constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;

StatusOr<std::string> ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::error_code ec;
    if (!fs::exists(path, ec)) return NotFound(path.string() + ": no such file");
    return DataLoss(path.string() + ": cannot be read");
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return DataLoss(path.string() + ": read error");
  return ss.str();
}

StatusOr<json> ReadJson(const fs::path& path) {
  DEJA_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  json parsed = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return DataLoss(path.string() + ": not valid JSON");
  if (!parsed.is_object()) return DataLoss(path.string() + ": expected a JSON object");
  return parsed;
}

StatusOr<Vocab> ParseVocab(const fs::path& path) {
  DEJA_ASSIGN_OR_RETURN(json doc, ReadJson(path));
  Vocab vocab;
  std::unordered_map<int32_t, std::string> by_id;
  for (const auto& [token, value] : doc.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() > kMaxTokenId) {
      return DataLoss(path.string() + ": token \"" + token + "\" has id " + value.dump() +
                      ", expected an integer in [0, " + std::to_string(kMaxTokenId) + "]");
    }
    const auto id = static_cast<int32_t>(value.get<int64_t>());
    auto [it, inserted] = by_id.emplace(id, token);
    if (!inserted) {
      return DataLoss(path.string() + ": tokens \"" + it->second + "\" and \"" + token +
                      "\" share id " + std::to_string(id));
    }
    vocab.emplace(token, id);
  }
  if (vocab.empty()) return DataLoss(path.string() + ": empty vocabulary");
  return vocab;
}

StatusOr<std::vector<std::pair<std::string, std::string>>> ParseMerges(const fs::path& path) {
  DEJA_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  std::vector<std::pair<std::string, std::string>> merges;
  std::istringstream in(text);
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    size_t space = line.find(' ');
    if (space == 0 || space == std::string::npos || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string::npos) {
      return DataLoss(path.string() + ":" + std::to_string(line_no) +
                      ": expected two tokens separated by one space, got \"" + line + "\"");
    }
    merges.emplace_back(line.substr(0, space), line.substr(space + 1));
  }
  return merges;
}

// A special token is written either as a string or as a serialized AddedToken object.
StatusOr<std::optional<AddedToken>> ParseTokenSpec(const json& value, const std::string& where) {
  AddedToken token;
  token.special = true;
  if (value.is_null()) return std::optional<AddedToken>();
  if (value.is_string()) {
    token.content = value.get<std::string>();
  } else if (value.is_object() && value.contains("content") && value["content"].is_string()) {
    token.content = value["content"].get<std::string>();
    auto flag = [&](const char* key, bool fallback) {
      return value.contains(key) && value[key].is_boolean() ? value[key].get<bool>() : fallback;
    };
    token.lstrip = flag("lstrip", false);
    token.rstrip = flag("rstrip", false);
    token.normalized = flag("normalized", false);
    token.special = flag("special", true);
    if (flag("single_word", false)) {
      return Unimplemented(where + ": single_word added tokens are not supported");
    }
  } else {
    return DataLoss(where + ": expected a token string or an AddedToken object");
  }
  if (token.content.empty()) return DataLoss(where + ": empty token");
  return std::optional<AddedToken>(std::move(token));
}

}  // namespace

// Builds a Tokenizer field by field; a friend so Tokenizer keeps no public setters.
class TokenizerLoader {
 public:
  static StatusOr<std::unique_ptr<Tokenizer>> Load(const fs::path& dir);

 private:
  static Status AddNamedToken(Tokenizer* tok, const Vocab& vocab, const json& config,
                              const std::string& key, const std::string& file, int32_t* id_out);
  static int32_t AddToken(Tokenizer* tok, const Vocab& vocab, AddedToken token);
};

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& model_dir) {
  const std::string context = "loading tokenizer from " + model_dir;
  // The loader checks types before every access; this only guards against a json call that
  // throws on some input nobody thought of, so a bad file can never take the process down.
  try {
    auto result = TokenizerLoader::Load(fs::path(model_dir));
    if (!result.ok()) return result.status().WithContext(context);
    return result;
  } catch (const json::exception& e) {
    return DataLoss(context + ": " + e.what());
  }
}

StatusOr<std::unique_ptr<Tokenizer>> TokenizerLoader::Load(const fs::path& dir) {
  DEJA_ASSIGN_OR_RETURN(auto vocab, ParseVocab(dir / "vocab.json"));
  DEJA_ASSIGN_OR_RETURN(auto merges, ParseMerges(dir / "merges.txt"));
  auto tok = std::unique_ptr<Tokenizer>(new Tokenizer());
  DEJA_ASSIGN_OR_RETURN(tok->bpe_, BpeModel::Create(vocab, merges));

  // Token table from vocab.json; added tokens below override their ids' text.
  int32_t max_id = 0;
  for (const auto& [token, id] : vocab) max_id = std::max(max_id, id);
  tok->token_bytes_.resize(max_id + 1);
  tok->is_special_.assign(max_id + 1, 0);
  for (const auto& [token, id] : vocab) tok->token_bytes_[id] = ByteLevelTokenBytes(token);

  // Both config files are optional (a bare GPT-2 directory has neither); when both exist,
  // special_tokens_map.json names the special tokens, as in transformers.
  json config = json::object();
  json special_map = json::object();
  for (auto [name, target] : {std::pair{"tokenizer_config.json", &config},
                              std::pair{"special_tokens_map.json", &special_map}}) {
    auto parsed = ReadJson(dir / name);
    if (parsed.ok()) {
      *target = std::move(parsed).value();
    } else if (parsed.status().code() != StatusCode::kNotFound) {
      return parsed.status();
    }
  }
  const std::string config_file = (dir / "tokenizer_config.json").string();
  auto bool_option = [&](const char* key, bool fallback) -> StatusOr<bool> {
    if (!config.contains(key) || config[key].is_null()) return fallback;
    if (!config[key].is_boolean()) return DataLoss(config_file + ": " + key + " is not a bool");
    return config[key].get<bool>();
  };
  DEJA_ASSIGN_OR_RETURN(tok->add_bos_token_, bool_option("add_bos_token", false));
  DEJA_ASSIGN_OR_RETURN(bool add_prefix_space, bool_option("add_prefix_space", false));
  if (add_prefix_space) {
    return Unimplemented(config_file + ": add_prefix_space=true is not supported (OPT: false)");
  }

  if (config.contains("added_tokens_decoder")) {
    const json& decoder = config["added_tokens_decoder"];
    if (!decoder.is_object()) return DataLoss(config_file + ": bad added_tokens_decoder");
    for (const auto& [key, value] : decoder.items()) {
      int64_t id = -1;
      auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
      if (ec != std::errc() || end != key.data() + key.size() || id < 0 || id > kMaxTokenId) {
        return DataLoss(config_file + ": added token id \"" + key + "\" is not a valid id");
      }
      DEJA_ASSIGN_OR_RETURN(auto token,
                            ParseTokenSpec(value, config_file + ": added token " + key));
      if (!token) continue;
      if (!value.contains("special")) token->special = false;
      token->id = static_cast<int32_t>(id);
      AddToken(tok.get(), vocab, std::move(*token));
    }
  }
  for (const auto& [key, id] :
       {std::pair{"bos_token", &tok->bos_id_}, std::pair{"eos_token", &tok->eos_id_},
        std::pair{"unk_token", &tok->unk_id_}, std::pair{"pad_token", &tok->pad_id_}}) {
    const bool in_map = special_map.contains(key);
    DEJA_RETURN_IF_ERROR(AddNamedToken(tok.get(), vocab, in_map ? special_map : config, key,
                                       in_map ? "special_tokens_map.json" : config_file, id));
  }
  const json& extra_source =
      special_map.contains("additional_special_tokens") ? special_map : config;
  if (extra_source.contains("additional_special_tokens")) {
    const json& extra = extra_source["additional_special_tokens"];
    if (!extra.is_array()) return DataLoss("additional_special_tokens is not a list");
    for (const json& value : extra) {
      DEJA_ASSIGN_OR_RETURN(auto token, ParseTokenSpec(value, "additional_special_tokens"));
      if (token) AddToken(tok.get(), vocab, std::move(*token));
    }
  }
  if (tok->add_bos_token_ && tok->bos_id_ < 0) {
    return DataLoss(config_file + ": add_bos_token is set but no bos_token is named");
  }
  return tok;
}

Status TokenizerLoader::AddNamedToken(Tokenizer* tok, const Vocab& vocab, const json& config,
                                      const std::string& key, const std::string& file,
                                      int32_t* id_out) {
  if (!config.contains(key)) return Status::Ok();
  DEJA_ASSIGN_OR_RETURN(auto token, ParseTokenSpec(config[key], file + ": " + key));
  if (token) *id_out = AddToken(tok, vocab, std::move(*token));
  return Status::Ok();
}

// Registers `token` (or finds it if already added) and returns its id. A token without an id
// takes its vocab.json id, or the next free id as HF's add_special_tokens does.
int32_t TokenizerLoader::AddToken(Tokenizer* tok, const Vocab& vocab, AddedToken token) {
  for (const AddedToken& existing : tok->added_tokens_) {
    if (existing.content == token.content) {
      if (token.special) tok->is_special_[existing.id] = 1;
      return existing.id;
    }
  }
  if (token.id < 0) {
    auto it = vocab.find(token.content);
    token.id = it != vocab.end() ? it->second : static_cast<int32_t>(tok->token_bytes_.size());
  }
  if (static_cast<size_t>(token.id) >= tok->token_bytes_.size()) {
    tok->token_bytes_.resize(token.id + 1);
    tok->is_special_.resize(token.id + 1, 0);
  }
  tok->token_bytes_[token.id] = ByteLevelTokenBytes(token.content);
  tok->is_special_[token.id] = token.special ? 1 : 0;
  tok->added_tokens_.push_back(std::move(token));
  return tok->added_tokens_.back().id;
}

}  // namespace deja
