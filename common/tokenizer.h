// The coordinator's tokenizer: GPT-2 byte-level BPE read from a Hugging Face model directory
// (vocab.json, merges.txt, tokenizer_config.json, special_tokens_map.json), producing the same
// ids and text as HF's GPT2Tokenizer / AutoTokenizer for OPT. Also the streaming detokenizer.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/bpe.h"
#include "common/pretokenizer.h"
#include "common/status.h"

namespace deja {

// A token matched verbatim in the text before pre-tokenization (HF's "added tokens": for OPT
// the special tokens </s> and <pad>, so "a</s>b" encodes </s> as id 2, not as characters).
struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;     // dropped by Decode(..., skip_special=true)
  bool lstrip = false;      // also swallows whitespace on its left
  bool rstrip = false;      // and on its right
  bool normalized = false;  // matched in a second pass, as HF does for normalized tokens
};

class Tokenizer {
 public:
  // Reads the tokenizer files of `model_dir`. NotFound if vocab.json or merges.txt is missing,
  // DataLoss if a file is malformed, Unimplemented for options OPT never uses.
  static StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& model_dir);

  // Token ids of `text`, which must be valid UTF-8 (InvalidArgument names the byte offset of
  // the first bad byte). add_bos prepends the BOS id; pass add_bos_token() to match HF's
  // add_special_tokens=True.
  StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_bos) const;

  // Text of `ids`. Byte sequences that are not valid UTF-8 become U+FFFD as in HF
  // (errors="replace"); ids outside the vocabulary are ignored, as HF does.
  std::string Decode(std::span<const int32_t> ids, bool skip_special) const;

  // The bytes token `id` stands for (empty for an unknown id).
  std::string_view TokenBytes(int32_t id) const;
  bool IsSpecial(int32_t id) const;

  // Ids of the named special tokens, -1 if the model has none.
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  int32_t pad_id() const { return pad_id_; }
  int32_t unk_id() const { return unk_id_; }
  // Whether the model's tokenizer prepends BOS by default (OPT: yes, </s> = 2).
  bool add_bos_token() const { return add_bos_token_; }
  // One past the largest id, like len(tokenizer) in HF.
  int32_t vocab_size() const { return static_cast<int32_t>(token_bytes_.size()); }
  const std::vector<AddedToken>& added_tokens() const { return added_tokens_; }

 private:
  friend class TokenizerLoader;
  struct Segment {
    std::string_view text;
    int32_t added_id;  // -1: plain text to pre-tokenize and merge
  };
  Tokenizer() = default;
  void SplitAddedTokens(std::string_view text, std::vector<Segment>* segments) const;
  void SplitOn(bool normalized, std::string_view text, std::vector<Segment>* out) const;

  std::unique_ptr<BpeModel> bpe_;
  Gpt2PreTokenizer pre_tokenizer_;
  std::vector<AddedToken> added_tokens_;
  std::vector<std::string> token_bytes_;
  std::vector<uint8_t> is_special_;
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  int32_t pad_id_ = -1;
  int32_t unk_id_ = -1;
  bool add_bos_token_ = false;
};

// Streaming detokenization: feed ids one at a time and get the text they complete. A UTF-8
// character split across tokens is held back until its last byte arrives, so no piece ends
// inside a character; the concatenated pieces plus Flush() equal Decode(all ids).
class IncrementalDecoder {
 public:
  IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special)
      : tokenizer_(tokenizer), skip_special_(skip_special) {}

  std::string Add(int32_t id);
  // The held-back bytes, each incomplete character as U+FFFD, and resets the decoder.
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace deja
