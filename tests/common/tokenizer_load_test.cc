// Tokenizer::Load on missing, corrupt and unusual tokenizer files: always a Status that names
// the file, never a crash. Each test copies the fixture tokenizer into a temporary directory
// and breaks one thing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "common/tokenizer.h"
#include "tests/common/tokenizer_fixture.h"

namespace deja {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using tokenizer_fixture::ReadText;

void WriteText(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

class TokenizerLoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "deja_tokenizer_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    const fs::path fixture =
        tokenizer_fixture::TokenizerDir(tokenizer_fixture::ReadGolden("cases.json"));
    ASSERT_FALSE(fixture.empty()) << "no fixture tokenizer: see tests/common/tokenizer_fixture.h";
    for (const char* name :
         {"vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"}) {
      fs::copy_file(fixture / name, dir_ / name);
    }
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Loads dir_ and expects failure with `code` and a message containing `needle`.
  void ExpectError(StatusCode code, const std::string& needle) {
    auto tok = Tokenizer::Load(dir_.string());
    ASSERT_FALSE(tok.ok());
    EXPECT_EQ(tok.status().code(), code) << tok.status().ToString();
    EXPECT_NE(tok.status().message().find(needle), std::string::npos) << tok.status().ToString();
  }

  json Vocab() { return json::parse(ReadText(dir_ / "vocab.json")); }

  fs::path dir_;
};

TEST_F(TokenizerLoadTest, IntactCopyLoads) {
  auto tok = Tokenizer::Load(dir_.string());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->bos_id(), 2);
  EXPECT_EQ((*tok)->Decode(*(*tok)->Encode("Hello there", false), false), "Hello there");
}

TEST_F(TokenizerLoadTest, MissingFiles) {
  fs::remove(dir_ / "vocab.json");
  ExpectError(StatusCode::kNotFound, "vocab.json");
  TearDown();
  SetUp();
  fs::remove(dir_ / "merges.txt");
  ExpectError(StatusCode::kNotFound, "merges.txt");
  auto tok = Tokenizer::Load((dir_ / "no_such_dir").string());
  EXPECT_EQ(tok.status().code(), StatusCode::kNotFound);
}

TEST_F(TokenizerLoadTest, ConfigFilesAreOptional) {
  fs::remove(dir_ / "tokenizer_config.json");
  fs::remove(dir_ / "special_tokens_map.json");
  auto tok = Tokenizer::Load(dir_.string());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->bos_id(), -1);
  EXPECT_FALSE((*tok)->add_bos_token());
  EXPECT_EQ((*tok)->Encode("x", true).status().code(), StatusCode::kFailedPrecondition);
  // Without added tokens "</s>" is plain text.
  EXPECT_GT((*tok)->Encode("</s>", false)->size(), 1u);
}

TEST_F(TokenizerLoadTest, CorruptVocab) {
  const std::string text = ReadText(dir_ / "vocab.json");
  WriteText(dir_ / "vocab.json", text.substr(0, text.size() / 2));
  ExpectError(StatusCode::kDataLoss, "vocab.json: not valid JSON");
  WriteText(dir_ / "vocab.json", "[1, 2, 3]");
  ExpectError(StatusCode::kDataLoss, "expected a JSON object");
  WriteText(dir_ / "vocab.json", "{}");
  ExpectError(StatusCode::kDataLoss, "empty vocabulary");
  WriteText(dir_ / "vocab.json", "");
  ExpectError(StatusCode::kDataLoss, "vocab.json");
  WriteText(dir_ / "vocab.json", "{\"a\": 0, \"b\": 0}");
  ExpectError(StatusCode::kDataLoss, "share id 0");
  WriteText(dir_ / "vocab.json", "{\"a\": \"zero\"}");
  ExpectError(StatusCode::kDataLoss, "expected an integer");
  WriteText(dir_ / "vocab.json", "{\"a\": -1}");
  ExpectError(StatusCode::kDataLoss, "expected an integer");
  WriteText(dir_ / "vocab.json", "{\"a\": 4000000000}");
  ExpectError(StatusCode::kDataLoss, "expected an integer");
}

TEST_F(TokenizerLoadTest, VocabWithoutAllBytes) {
  json vocab = Vocab();
  vocab.erase("\xC4\xA0");  // "Ġ", the character standing for the space byte
  WriteText(dir_ / "vocab.json", vocab.dump());
  ExpectError(StatusCode::kDataLoss, "no token for byte 0x20");
}

TEST_F(TokenizerLoadTest, CorruptMerges) {
  const std::string text = ReadText(dir_ / "merges.txt");
  WriteText(dir_ / "merges.txt", text + "a b c\n");
  ExpectError(StatusCode::kDataLoss, "expected two tokens");
  WriteText(dir_ / "merges.txt", "#version: 0.2\nnotasplit\n");
  ExpectError(StatusCode::kDataLoss, "merges.txt:2");
  WriteText(dir_ / "merges.txt", "#version: 0.2\nqqq zzz\n");
  ExpectError(StatusCode::kDataLoss, "which is not in vocab.json");
  // A missing #version line and CRLF line ends are accepted, as HF accepts them.
  std::string crlf;
  for (char c : text.substr(text.find('\n') + 1)) {
    crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  }
  WriteText(dir_ / "merges.txt", crlf);
  EXPECT_TRUE(Tokenizer::Load(dir_.string()).ok());
}

TEST_F(TokenizerLoadTest, CorruptConfigs) {
  WriteText(dir_ / "tokenizer_config.json", "{\"add_bos_token\": ");
  ExpectError(StatusCode::kDataLoss, "tokenizer_config.json");
  WriteText(dir_ / "tokenizer_config.json", "{\"add_bos_token\": \"yes\"}");
  ExpectError(StatusCode::kDataLoss, "add_bos_token is not a bool");
  WriteText(dir_ / "tokenizer_config.json", "{\"add_prefix_space\": true}");
  ExpectError(StatusCode::kUnimplemented, "add_prefix_space");
  WriteText(dir_ / "tokenizer_config.json", "{}");
  WriteText(dir_ / "special_tokens_map.json", "{\"eos_token\": 5}");
  ExpectError(StatusCode::kDataLoss, "eos_token");
  WriteText(dir_ / "special_tokens_map.json", "{\"eos_token\": \"\"}");
  ExpectError(StatusCode::kDataLoss, "empty token");
  WriteText(dir_ / "special_tokens_map.json",
            R"({"eos_token": {"content": "</s>", "single_word": true}})");
  ExpectError(StatusCode::kUnimplemented, "single_word");
  WriteText(dir_ / "special_tokens_map.json", "{}");
  WriteText(dir_ / "tokenizer_config.json", R"({"added_tokens_decoder": {"x": {}}})");
  ExpectError(StatusCode::kDataLoss, "not a valid id");
}

TEST_F(TokenizerLoadTest, AddedTokensDecoderAndNewTokens) {
  // The layout of recent facebook/opt-* uploads, plus a token that is not in vocab.json.
  WriteText(dir_ / "tokenizer_config.json", R"({
    "add_bos_token": true,
    "added_tokens_decoder": {
      "1": {"content": "<pad>", "lstrip": false, "normalized": true, "rstrip": false,
            "single_word": false, "special": true},
      "2": {"content": "</s>", "lstrip": false, "normalized": true, "rstrip": false,
            "single_word": false, "special": true}},
    "bos_token": "</s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "</s>",
    "additional_special_tokens": [{"content": "<|sep|>", "rstrip": true}]})");
  fs::remove(dir_ / "special_tokens_map.json");
  auto tok = Tokenizer::Load(dir_.string());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const Tokenizer& t = **tok;
  const int32_t sep = t.vocab_size() - 1;
  EXPECT_EQ(t.TokenBytes(sep), "<|sep|>");
  EXPECT_TRUE(t.IsSpecial(sep));
  auto ids = t.Encode("a</s><|sep|>  b", true);
  ASSERT_TRUE(ids.ok());
  ASSERT_EQ(ids->size(), 5u) << json(*ids).dump();  // rstrip swallows the spaces
  EXPECT_EQ((*ids)[0], 2);
  EXPECT_EQ((*ids)[2], 2);
  EXPECT_EQ((*ids)[3], sep);
  EXPECT_EQ(t.Decode(*ids, true), "ab");
}

TEST_F(TokenizerLoadTest, RandomGarbageNeverCrashes) {
  std::mt19937 rng(1234);
  const std::string vocab = ReadText(dir_ / "vocab.json");
  const std::string merges = ReadText(dir_ / "merges.txt");
  for (int trial = 0; trial < 40; ++trial) {
    // Flip a few bytes of one file; the load may or may not succeed but must return.
    const bool in_vocab = trial % 2 == 0;
    std::string text = in_vocab ? vocab : merges;
    for (int k = 0; k < 1 + trial % 4; ++k) {
      text[rng() % text.size()] = static_cast<char>(rng() % 256);
    }
    WriteText(dir_ / (in_vocab ? "vocab.json" : "merges.txt"), text);
    auto tok = Tokenizer::Load(dir_.string());
    if (tok.ok()) {
      EXPECT_TRUE((*tok)->Encode("some text", true).ok());
    }
    WriteText(dir_ / "vocab.json", vocab);
    WriteText(dir_ / "merges.txt", merges);
  }
}

}  // namespace
}  // namespace deja
