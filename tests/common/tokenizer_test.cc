// Tokenizer tests: every golden case written by tools/fixture/golden_tokenizer.py from Hugging
// Face's tokenizer must match exactly (ids, decoded text, streaming decode); the pre-tokenizer's
// character classes must match HF's on every code point; bad input and bad files must give
// clear errors.
#include "common/tokenizer.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "common/utf8.h"
#include "tests/common/tokenizer_fixture.h"

namespace deja {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using tokenizer_fixture::ReadGolden;

const json& Golden() {
  static const json golden = ReadGolden("cases.json");
  return golden;
}

// The fixture tokenizer, or nullptr (with the reason in *error) so tests fail, not crash.
const Tokenizer* Fixture(std::string* error) {
  static std::string load_error;
  static const std::unique_ptr<Tokenizer> tokenizer = []() -> std::unique_ptr<Tokenizer> {
    if (Golden().is_discarded()) {
      load_error = "no tests/golden/tokenizer/cases.json: run tools/fixture/golden_tokenizer.py";
      return nullptr;
    }
    const fs::path dir = tokenizer_fixture::TokenizerDir(Golden());
    if (dir.empty()) {
      load_error = "no fixture tokenizer (models/opt-mini or the goldens' model_dir)";
      return nullptr;
    }
    auto loaded = Tokenizer::Load(dir.string());
    if (!loaded.ok()) {
      load_error = loaded.status().ToString();
      return nullptr;
    }
    return std::move(loaded).value();
  }();
  *error = load_error;
  return tokenizer.get();
}

class TokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    tok_ = Fixture(&error);
    ASSERT_NE(tok_, nullptr) << error;
  }
  const Tokenizer* tok_ = nullptr;
};

std::string Printable(const std::string& s) { return json(s).dump(); }

TEST_F(TokenizerTest, SpecialTokensMatchHf) {
  const Tokenizer& tok = *tok_;
  EXPECT_EQ(tok.vocab_size(), Golden()["vocab_size"].get<int32_t>());
  EXPECT_EQ(tok.bos_id(), Golden()["bos_id"].get<int32_t>());
  EXPECT_EQ(tok.eos_id(), Golden()["eos_id"].get<int32_t>());
  EXPECT_EQ(tok.pad_id(), Golden()["pad_id"].get<int32_t>());
  EXPECT_TRUE(tok.add_bos_token());
  std::vector<int32_t> special;
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    if (tok.IsSpecial(id)) special.push_back(id);
  }
  EXPECT_EQ(special, Golden()["special_ids"].get<std::vector<int32_t>>());
  // OPT's layout: <s>=0, <pad>=1, </s>=2 (BOS and EOS), <unk>=3.
  EXPECT_EQ(tok.TokenBytes(0), "<s>");
  EXPECT_EQ(tok.TokenBytes(1), "<pad>");
  EXPECT_EQ(tok.TokenBytes(2), "</s>");
  EXPECT_EQ(tok.TokenBytes(3), "<unk>");
  EXPECT_EQ(tok.TokenBytes(-1), "");
  EXPECT_EQ(tok.TokenBytes(tok.vocab_size()), "");
}

TEST_F(TokenizerTest, GoldenTextsMatchHf) {
  const Tokenizer& tok = *tok_;
  const json& cases = Golden()["cases"];
  ASSERT_GE(cases.size(), 200u);
  int failures = 0;
  for (const json& c : cases) {
    const std::string text = c["text"];
    const auto want = c["ids"].get<std::vector<int32_t>>();
    auto ids = tok.Encode(text, tok.add_bos_token());
    ASSERT_TRUE(ids.ok()) << Printable(text) << ": " << ids.status().ToString();
    bool ok = *ids == want && tok.Decode(want, true) == c["decoded"].get<std::string>() &&
              tok.Decode(want, false) == c["decoded_with_special"].get<std::string>();
    if (!ok && ++failures <= 5) {
      ADD_FAILURE() << "text " << Printable(text) << "\n  ids  " << json(*ids).dump() << "\n  want "
                    << json(want).dump() << "\n  decoded " << Printable(tok.Decode(want, true))
                    << " want " << c["decoded"].dump();
    }
  }
  EXPECT_EQ(failures, 0) << "of " << cases.size() << " golden texts";
}

TEST_F(TokenizerTest, GoldenIdSequencesDecodeLikeHf) {
  const Tokenizer& tok = *tok_;
  for (const json& c : Golden()["decode_cases"]) {
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.Decode(ids, true), c["decoded"].get<std::string>()) << c["ids"].dump();
    EXPECT_EQ(tok.Decode(ids, false), c["decoded_with_special"].get<std::string>())
        << c["ids"].dump();
  }
}

// Streams `ids` through an IncrementalDecoder; checks each piece is whole UTF-8.
std::string StreamDecode(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip) {
  IncrementalDecoder decoder(tok, skip);
  std::string text;
  for (int32_t id : ids) {
    std::string piece = decoder.Add(id);
    EXPECT_EQ(FindInvalidUtf8(piece), kUtf8Valid) << Printable(piece);
    EXPECT_EQ(IncompleteUtf8Suffix(piece), 0u) << Printable(piece);
    text += piece;
  }
  std::string rest = decoder.Flush();
  EXPECT_EQ(FindInvalidUtf8(rest), kUtf8Valid);
  return text + rest;
}

TEST_F(TokenizerTest, IncrementalDecodeEqualsFullDecode) {
  const Tokenizer& tok = *tok_;
  int sequences = 0;
  for (const char* key : {"cases", "decode_cases"}) {
    for (const json& c : Golden()[key]) {
      const auto ids = c["ids"].get<std::vector<int32_t>>();
      for (bool skip : {true, false}) {
        EXPECT_EQ(StreamDecode(tok, ids, skip), tok.Decode(ids, skip)) << c["ids"].dump();
      }
      ++sequences;
    }
  }
  EXPECT_GT(sequences, 300);
}

TEST_F(TokenizerTest, IncrementalDecoderHoldsSplitCharacters) {
  const Tokenizer& tok = *tok_;
  // U+1F600 as four single-byte tokens: nothing is emitted until the last byte arrives.
  std::vector<int32_t> bytes;
  for (char b : std::string("\xF0\x9F\x98\x80")) {
    int32_t found = -1;
    for (int32_t id = 0; id < tok.vocab_size() && found < 0; ++id) {
      if (tok.TokenBytes(id) == std::string(1, b)) found = id;
    }
    ASSERT_GE(found, 0);
    bytes.push_back(found);
  }
  IncrementalDecoder decoder(tok, true);
  EXPECT_EQ(decoder.Add(bytes[0]), "");
  EXPECT_EQ(decoder.Add(bytes[1]), "");
  EXPECT_EQ(decoder.Add(bytes[2]), "");
  EXPECT_EQ(decoder.Add(bytes[3]), "\xF0\x9F\x98\x80");
  // A character cut short by the end of the stream becomes one U+FFFD, as in HF.
  EXPECT_EQ(decoder.Add(bytes[0]), "");
  EXPECT_EQ(decoder.Add(bytes[1]), "");
  EXPECT_EQ(decoder.Flush(), "\xEF\xBF\xBD");
  // A new lead byte ends the previous incomplete character.
  EXPECT_EQ(decoder.Add(bytes[0]), "");
  EXPECT_EQ(decoder.Add(bytes[0]), "\xEF\xBF\xBD");
  EXPECT_EQ(decoder.Flush(), "\xEF\xBF\xBD");
}

TEST(Gpt2PreTokenizerTest, ClassesMatchHfOnEveryCodePoint) {
  json classes = ReadGolden("classes.json");
  ASSERT_FALSE(classes.is_discarded());
  std::vector<char> want(0x110000, 'O');
  for (const char* kind : {"L", "N", "S"}) {
    for (const json& range : classes[kind]) {
      for (uint32_t cp = range[0]; cp <= range[1].get<uint32_t>(); ++cp) want[cp] = kind[0];
    }
  }
  Gpt2PreTokenizer pre;
  std::vector<std::string_view> pieces;
  auto count = [&](const std::string& s) {
    pieces.clear();
    pre.Split(s, &pieces);
    return pieces.size();
  };
  int mismatches = 0;
  for (uint32_t cp = 0; cp < 0x110000; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    std::string c;
    AppendUtf8(cp, &c);
    // Same probes as the golden script: a letter, digit or punctuation mark absorbs `c` into
    // its piece exactly when `c` is in the same class.
    char got = count("a" + c) == 1   ? 'L'
               : count("1" + c) == 1 ? 'N'
               : count("!" + c) == 1 ? 'O'
                                     : 'S';
    if (got != want[cp] && ++mismatches <= 10) {
      ADD_FAILURE() << "U+" << std::hex << cp << ": got " << got << ", HF " << want[cp];
    }
  }
  EXPECT_EQ(mismatches, 0);
}

std::vector<std::string> SplitText(const std::string& text) {
  Gpt2PreTokenizer pre;
  std::vector<std::string_view> pieces;
  pre.Split(text, &pieces);
  return {pieces.begin(), pieces.end()};
}

TEST(Gpt2PreTokenizerTest, WhitespaceRunsSplitLikePythonLookahead) {
  // Expected pieces from Python's regex module with GPT-2's pattern.
  using V = std::vector<std::string>;
  EXPECT_EQ(SplitText("a  b"), (V{"a", " ", " b"}));
  EXPECT_EQ(SplitText("a\t b"), (V{"a", "\t", " b"}));
  EXPECT_EQ(SplitText("a \tb"), (V{"a", " ", "\t", "b"}));
  EXPECT_EQ(SplitText("a\n\nb"), (V{"a", "\n", "\n", "b"}));
  EXPECT_EQ(SplitText("Hello  "), (V{"Hello", "  "}));
  EXPECT_EQ(SplitText(" \n "), (V{" \n "}));
  EXPECT_EQ(SplitText("   x"), (V{"  ", " x"}));
  EXPECT_EQ(SplitText("x\xE3\x80\x80\xE3\x80\x80y"), (V{"x", "\xE3\x80\x80", "\xE3\x80\x80", "y"}));
  EXPECT_EQ(SplitText("it's 'S we'll"), (V{"it", "'s", " '", "S", " we", "'ll"}));
  EXPECT_EQ(SplitText("x \xE2\x80\x99s 12ab"), (V{"x", " \xE2\x80\x99", "s", " 12", "ab"}));
}

TEST_F(TokenizerTest, LiteralSpecialTokensInTextAreSpecial) {
  const Tokenizer& tok = *tok_;
  auto ids = tok.Encode("a</s>b<pad>", false);
  ASSERT_TRUE(ids.ok());
  ASSERT_EQ(ids->size(), 4u);
  EXPECT_EQ((*ids)[1], tok.eos_id());
  EXPECT_EQ((*ids)[3], tok.pad_id());
  EXPECT_EQ(tok.Decode(*ids, true), "ab");
  EXPECT_EQ(tok.Decode(*ids, false), "a</s>b<pad>");
}

TEST_F(TokenizerTest, InvalidUtf8IsRejectedWithOffset) {
  const Tokenizer& tok = *tok_;
  const std::pair<std::string, size_t> bad[] = {
      {"ab\xFF", 2},                   // never valid
      {"\xC0\xAF", 0},                 // overlong '/'
      {"ok \xED\xA0\x80", 3},          // UTF-16 surrogate
      {"\xF4\x90\x80\x80", 0},         // above U+10FFFF
      {"abc\xE2\x82", 3},              // truncated at the end
      {"\xE2\x82x", 0},                // truncated in the middle
      {std::string("a\0\x80", 3), 2},  // stray continuation byte after NUL
  };
  for (const auto& [text, offset] : bad) {
    auto ids = tok.Encode(text, true);
    ASSERT_FALSE(ids.ok()) << Printable(Utf8Lossy(text));
    EXPECT_EQ(ids.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(ids.status().message().find("byte offset " + std::to_string(offset)),
              std::string::npos)
        << ids.status().message();
  }
  EXPECT_TRUE(tok.Encode(std::string("a\0b", 3), false).ok());
}

TEST_F(TokenizerTest, ConcurrentEncodingIsConsistent) {
  const Tokenizer& tok = *tok_;
  const json& cases = Golden()["cases"];
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < cases.size() * 2; i += 3) {
        const json& c = cases[i % cases.size()];
        auto ids = tok.Encode(c["text"].get<std::string>(), true);
        if (!ids.ok() || *ids != c["ids"].get<std::vector<int32_t>>()) ++failures[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures, std::vector<int>(4, 0));
}

}  // namespace
}  // namespace deja
