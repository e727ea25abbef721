// GPT-2's pre-tokenizer: splits text into the pieces BPE runs on, exactly as Hugging Face's
// ByteLevel(use_regex=True) pre-tokenizer does with the pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace re2 {
class RE2;
}

namespace deja {

// \s as HF's tokenizers (Oniguruma) and Rust's char::is_whitespace see it: the Unicode
// White_Space property. Not Python's str.isspace, which adds U+001C..U+001F.
bool IsUnicodeWhitespace(uint32_t code_point);

class Gpt2PreTokenizer {
 public:
  Gpt2PreTokenizer();
  ~Gpt2PreTokenizer();
  Gpt2PreTokenizer(const Gpt2PreTokenizer&) = delete;
  Gpt2PreTokenizer& operator=(const Gpt2PreTokenizer&) = delete;

  // Appends the pieces of `text` (which must be valid UTF-8) as views into it. The pieces
  // tile the text: their concatenation is `text`. Thread-safe.
  void Split(std::string_view text, std::vector<std::string_view>* pieces) const;

 private:
  std::unique_ptr<re2::RE2> re_;
};

}  // namespace deja
