// Fuzzes the tokenizer of models/opt-mini (GPT-2 byte-level BPE with the added tokens </s> and
// <pad>): the input as text to encode, and the same bytes as token ids to decode.
//
// Invariants:
// - Text that is not UTF-8 is INVALID_ARGUMENT naming the offset of its first bad byte.
// - Round trip: for valid UTF-8 text x, Decode(Encode(x), skip_special=false) == x. It holds
//   because byte-level BPE maps every byte to a token and back, the GPT-2 split tiles the text,
//   and OPT's added tokens strip no whitespace and decode to their own text.
// - Encode gives ids inside the vocabulary, the same ids every time (the piece cache changes
//   nothing), and the same ids after BOS when add_bos is set; the split tiles the text with no
//   empty piece.
// - Decode of any ids (out-of-range and special ones included) is valid UTF-8, and streaming
//   the ids through IncrementalDecoder gives the same text in valid UTF-8 pieces.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "common/pretokenizer.h"
#include "common/tokenizer.h"
#include "common/utf8.h"
#include "tests/fuzz/fuzz_util.h"

namespace deja::fuzz {
namespace {

bool ValidUtf8(std::string_view s) { return FindInvalidUtf8(s) == kUtf8Valid; }

// Decode and the streaming decoder agree, in valid UTF-8.
void CheckDecode(const std::vector<int32_t>& ids, bool skip_special) {
  const Tokenizer& tok = Tok();
  const std::string text = tok.Decode(ids, skip_special);
  FUZZ_CHECK(ValidUtf8(text));
  IncrementalDecoder stream(tok, skip_special);
  std::string streamed;
  for (int32_t id : ids) {
    const std::string piece = stream.Add(id);
    FUZZ_CHECK(ValidUtf8(piece));
    streamed += piece;
  }
  const std::string rest = stream.Flush();
  FUZZ_CHECK(ValidUtf8(rest));
  streamed += rest;
  FUZZ_CHECK(streamed == text);
}

void CheckText(std::string_view text) {
  const Tokenizer& tok = Tok();
  StatusOr<std::vector<int32_t>> ids = tok.Encode(text, /*add_bos=*/false);
  const size_t bad = FindInvalidUtf8(text);
  if (bad != kUtf8Valid) {
    FUZZ_CHECK(!ids.ok() && ids.status().code() == StatusCode::kInvalidArgument);
    FUZZ_CHECK_MSG(
        ids.status().message().find("offset " + std::to_string(bad)) != std::string::npos,
        ids.status().ToString());
    FUZZ_CHECK(Utf8Lossy(text) != text && ValidUtf8(Utf8Lossy(text)));
    return;
  }
  FUZZ_CHECK_MSG(ids.ok(), ids.status().ToString());
  FUZZ_CHECK(Utf8Lossy(text) == text);
  for (int32_t id : *ids) FUZZ_CHECK(id >= 0 && id < tok.vocab_size());
  FUZZ_CHECK(text.empty() == ids->empty());
  const std::string decoded = tok.Decode(*ids, /*skip_special=*/false);
  FUZZ_CHECK_MSG(decoded == text, "decoded to '" + decoded + "'");
  StatusOr<std::vector<int32_t>> again = tok.Encode(text, /*add_bos=*/false);
  FUZZ_CHECK(again.ok() && *again == *ids);
  StatusOr<std::vector<int32_t>> with_bos = tok.Encode(text, /*add_bos=*/true);
  FUZZ_CHECK(with_bos.ok() && with_bos->size() == ids->size() + 1 &&
             (*with_bos)[0] == tok.bos_id() &&
             std::equal(ids->begin(), ids->end(), with_bos->begin() + 1));
  CheckDecode(*ids, /*skip_special=*/false);
  CheckDecode(*ids, /*skip_special=*/true);

  static const Gpt2PreTokenizer split;
  std::vector<std::string_view> pieces;
  split.Split(text, &pieces);
  size_t pos = 0;
  for (std::string_view piece : pieces) {
    FUZZ_CHECK(!piece.empty() && piece.data() == text.data() + pos);
    pos += piece.size();
  }
  FUZZ_CHECK(pos == text.size());
}

// The bytes as little-endian 16-bit ids, spread a little past both ends of the vocabulary.
std::vector<int32_t> IdsOf(const uint8_t* data, size_t size) {
  const int32_t span = Tok().vocab_size() + 16;
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 1 < size; i += 2) {
    ids.push_back(static_cast<int32_t>(data[i] | (data[i + 1] << 8)) % span - 8);
  }
  return ids;
}

}  // namespace
}  // namespace deja::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  deja::fuzz::QuietLogging();
  (void)deja::fuzz::Tok();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace deja::fuzz;
  CheckText(std::string_view(reinterpret_cast<const char*>(data), size));
  const std::vector<int32_t> ids = IdsOf(data, size);
  CheckDecode(ids, /*skip_special=*/false);
  CheckDecode(ids, /*skip_special=*/true);
  return 0;
}
