// The GPT-2 split on RE2. Two differences from the regex engines HF uses are bridged here:
// - RE2 has no lookahead, so `\s+(?!\S)|\s+` becomes `\s+` plus a fix-up (see Split).
// - Debian's RE2 has older Unicode tables than tokenizers' Oniguruma (Unicode 16), so letters
//   and numbers added since are listed explicitly. tests/common/tokenizer_test.cc checks every
//   code point against tests/golden/tokenizer/classes.json, written by HF's own pre-tokenizer.
#include "common/pretokenizer.h"

#include <glog/logging.h>
#include <re2/re2.h>

#include <cstdio>
#include <string>

#include "common/utf8.h"

namespace deja {
namespace {

// The Unicode White_Space property.
constexpr uint32_t kWhitespace[] = {
    0x09,   0x0A,   0x0B,   0x0C,   0x0D,   0x20,   0x85,   0xA0,   0x1680,
    0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008,
    0x2009, 0x200A, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000,
};

// Letters (\p{L}) and numbers (\p{N}) of Unicode 15.1-16.0 that RE2 2022-06-01 lacks.
constexpr const char* kExtraLetters =
    R"(\x{1C89}-\x{1C8A}\x{A7CB}-\x{A7CD}\x{A7DA}-\x{A7DC}\x{105C0}-\x{105F3})"
    R"(\x{10D4A}-\x{10D65}\x{10D6F}-\x{10D85}\x{10EC2}-\x{10EC4}\x{11380}-\x{11389})"
    R"(\x{1138B}\x{1138E}\x{11390}-\x{113B5}\x{113B7}\x{113D1}\x{113D3})"
    R"(\x{11BC0}-\x{11BE0}\x{13460}-\x{143FA}\x{16100}-\x{1611D}\x{16D40}-\x{16D6C})"
    R"(\x{18CFF}\x{1E5D0}-\x{1E5ED}\x{1E5F0}\x{2EBF0}-\x{2EE5D})";
constexpr const char* kExtraNumbers =
    R"(\x{10D40}-\x{10D49}\x{116D0}-\x{116E3}\x{11BF0}-\x{11BF9}\x{16130}-\x{16139})"
    R"(\x{16D70}-\x{16D79}\x{1CCF0}-\x{1CCF9}\x{1E5F1}-\x{1E5FA})";

std::string WhitespaceClassBody() {
  std::string body;
  for (uint32_t cp : kWhitespace) {
    char buf[16];
    snprintf(buf, sizeof(buf), "\\x{%X}", cp);
    body += buf;
  }
  return body;
}

std::string Gpt2Pattern() {
  const std::string letters = std::string(R"(\p{L})") + kExtraLetters;
  const std::string numbers = std::string(R"(\p{N})") + kExtraNumbers;
  const std::string space = WhitespaceClassBody();
  std::string pattern = "'s|'t|'re|'ve|'m|'ll|'d";
  pattern += "| ?[" + letters + "]+";
  pattern += "| ?[" + numbers + "]+";
  pattern += "| ?[^" + space + letters + numbers + "]+";
  pattern += "|[" + space + "]+";
  return pattern;
}

// Start of the last character of the non-empty, valid UTF-8 `s`.
size_t LastCharStart(std::string_view s) {
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<uint8_t>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

}  // namespace

bool IsUnicodeWhitespace(uint32_t cp) {
  for (uint32_t w : kWhitespace) {
    if (cp == w) return true;
  }
  return false;
}

Gpt2PreTokenizer::Gpt2PreTokenizer() {
  RE2::Options options;
  options.set_encoding(RE2::Options::EncodingUTF8);
  // The Unicode classes make a large DFA; with the default budget RE2 falls back to the NFA.
  options.set_max_mem(64 << 20);
  re_ = std::make_unique<RE2>(Gpt2Pattern(), options);
  CHECK(re_->ok()) << "GPT-2 pattern does not compile: " << re_->error();
}

Gpt2PreTokenizer::~Gpt2PreTokenizer() = default;

void Gpt2PreTokenizer::Split(std::string_view text, std::vector<std::string_view>* pieces) const {
  const re2::StringPiece input(text.data(), text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    re2::StringPiece match;
    // Every character is a letter, a number, whitespace or "other", so an anchored match
    // always exists; the fallback keeps the loop finite whatever RE2 does.
    if (!re_->Match(input, pos, text.size(), RE2::ANCHOR_START, &match, 1) || match.empty()) {
      uint32_t cp;
      size_t n = DecodeUtf8Char(text, pos, &cp);
      pieces->push_back(text.substr(pos, n == 0 ? 1 : n));
      pos += pieces->back().size();
      continue;
    }
    std::string_view piece(match.data(), match.size());
    size_t last = LastCharStart(piece);
    uint32_t last_cp = 0;
    DecodeUtf8Char(piece, last, &last_cp);
    // Only the whitespace alternative ends in whitespace. Python's `\s+(?!\S)` stops one
    // character short of a run followed by a non-space, leaving that character to prefix the
    // next piece (" word"); a run of one such character falls to the plain `\s+`.
    if (IsUnicodeWhitespace(last_cp) && pos + piece.size() < text.size() && last > 0) {
      piece = piece.substr(0, last);
    }
    pieces->push_back(piece);
    pos += piece.size();
  }
}

}  // namespace deja
