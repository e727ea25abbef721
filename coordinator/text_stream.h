// TextStream: the generated text a client sees, built token by token. Decoding is incremental
// and never splits a UTF-8 character (IncrementalDecoder); stop sequences are matched on the
// text, and any tail that could still grow into a stop sequence is held back, so neither a
// matched stop sequence nor anything after it is ever emitted.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/tokenizer.h"

namespace deja::coordinator {

class TextStream {
 public:
  struct Piece {
    // Text that is now safe to emit.
    std::string text;
    // A stop sequence matched; `text` ends right before it and the stream is over.
    bool stopped = false;
  };

  // `stops` are non-empty UTF-8 strings.
  TextStream(const Tokenizer& tokenizer, std::vector<std::string> stops);

  // Appends one token (special tokens add no text).
  Piece Add(int32_t id);
  // Generation ended without a stop match: the held-back text and the decoder's remainder
  // (an incomplete trailing character becomes U+FFFD). A stop sequence can still match here.
  Piece Finish();

 private:
  // Emits the safe prefix of held_; the caller has appended new text to it.
  Piece Drain(bool final);

  IncrementalDecoder decoder_;
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace deja::coordinator
