// Encoding (added tokens, then the GPT-2 split, then BPE) and decoding. Loading lives in
// tokenizer_load.cc.
#include "common/tokenizer.h"

#include "common/utf8.h"

namespace deja {
namespace {

// Start of the character that ends just before `pos` in valid UTF-8 `text` (pos > 0).
size_t PrevCharStart(std::string_view text, size_t pos) {
  size_t i = pos - 1;
  while (i > 0 && (static_cast<uint8_t>(text[i]) & 0xC0) == 0x80) --i;
  return i;
}

bool WhitespaceAt(std::string_view text, size_t pos, size_t* length) {
  uint32_t cp;
  *length = DecodeUtf8Char(text, pos, &cp);
  return *length > 0 && IsUnicodeWhitespace(cp);
}

}  // namespace

StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text, bool add_bos) const {
  if (size_t bad = FindInvalidUtf8(text); bad != kUtf8Valid) {
    static constexpr char kHex[] = "0123456789ABCDEF";
    const auto b = static_cast<uint8_t>(text[bad]);
    return InvalidArgument(std::string("text is not valid UTF-8: byte 0x") + kHex[b >> 4] +
                           kHex[b & 15] + " at byte offset " + std::to_string(bad));
  }
  std::vector<int32_t> ids;
  if (add_bos) {
    if (bos_id_ < 0) return FailedPrecondition("this tokenizer has no BOS token");
    ids.push_back(bos_id_);
  }
  std::vector<Segment> segments;
  SplitAddedTokens(text, &segments);
  std::vector<std::string_view> pieces;
  for (const Segment& segment : segments) {
    if (segment.added_id >= 0) {
      ids.push_back(segment.added_id);
      continue;
    }
    pieces.clear();
    pre_tokenizer_.Split(segment.text, &pieces);
    for (std::string_view piece : pieces) bpe_->EncodePiece(piece, &ids);
  }
  return ids;
}

void Tokenizer::SplitAddedTokens(std::string_view text, std::vector<Segment>* segments) const {
  // HF matches tokens that skip normalization on the raw text first, then the others in what
  // is left. Without a normalizer the text is the same; only the order of the passes matters.
  std::vector<Segment> first;
  SplitOn(/*normalized=*/false, text, &first);
  for (const Segment& segment : first) {
    if (segment.added_id >= 0) {
      segments->push_back(segment);
    } else {
      SplitOn(/*normalized=*/true, segment.text, segments);
    }
  }
}

// Leftmost-longest, non-overlapping matches of the added tokens of one pass (HF uses an
// Aho-Corasick automaton with the same match kind; OPT has two tokens, so a scan suffices).
void Tokenizer::SplitOn(bool normalized, std::string_view text, std::vector<Segment>* out) const {
  size_t plain_start = 0;  // start of the text not yet emitted
  size_t pos = 0;
  while (pos < text.size()) {
    const AddedToken* best = nullptr;
    for (const AddedToken& token : added_tokens_) {
      if (token.normalized != normalized) continue;
      if (text.compare(pos, token.content.size(), token.content) == 0 &&
          (best == nullptr || token.content.size() > best->content.size())) {
        best = &token;
      }
    }
    if (best == nullptr) {
      ++pos;
      continue;
    }
    size_t start = pos;
    size_t stop = pos + best->content.size();
    size_t n;
    if (best->lstrip) {
      while (start > plain_start && WhitespaceAt(text, PrevCharStart(text, start), &n)) {
        start = PrevCharStart(text, start);
      }
    }
    if (best->rstrip) {
      while (stop < text.size() && WhitespaceAt(text, stop, &n)) stop += n;
    }
    if (start > plain_start) out->push_back({text.substr(plain_start, start - plain_start), -1});
    out->push_back({text.substr(start, stop - start), best->id});
    plain_start = pos = stop;
  }
  if (plain_start < text.size()) out->push_back({text.substr(plain_start), -1});
}

std::string_view Tokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return token_bytes_[id];
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && is_special_[id] != 0;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool skip_special) const {
  // Bytes of all tokens first, then one lossy conversion: a character split across tokens
  // must come out whole, exactly as HF's ByteLevel decoder does it.
  std::string bytes;
  for (int32_t id : ids) {
    if (skip_special && IsSpecial(id)) continue;
    bytes.append(TokenBytes(id));
  }
  return Utf8Lossy(bytes);
}

std::string IncrementalDecoder::Add(int32_t id) {
  if (skip_special_ && tokenizer_.IsSpecial(id)) return {};
  pending_.append(tokenizer_.TokenBytes(id));
  // Everything before a trailing incomplete character is final: a later byte can complete
  // that character but cannot change how the bytes before it decode.
  const size_t ready = pending_.size() - IncompleteUtf8Suffix(pending_);
  std::string text = Utf8Lossy(std::string_view(pending_).substr(0, ready));
  pending_.erase(0, ready);
  return text;
}

std::string IncrementalDecoder::Flush() {
  std::string text = Utf8Lossy(pending_);
  pending_.clear();
  return text;
}

}  // namespace deja
