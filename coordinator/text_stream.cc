#include "coordinator/text_stream.h"

#include <algorithm>

namespace deja::coordinator {

TextStream::TextStream(const Tokenizer& tokenizer, std::vector<std::string> stops)
    : decoder_(tokenizer, /*skip_special=*/true), stops_(std::move(stops)) {}

TextStream::Piece TextStream::Add(int32_t id) {
  if (stopped_) return {"", true};
  held_ += decoder_.Add(id);
  return Drain(/*final=*/false);
}

TextStream::Piece TextStream::Finish() {
  if (stopped_) return {"", true};
  held_ += decoder_.Flush();
  return Drain(/*final=*/true);
}

TextStream::Piece TextStream::Drain(bool final) {
  Piece out;
  // Earliest match wins; at equal starts the longer stop sequence would only cut the same text.
  size_t match = std::string::npos;
  for (const std::string& stop : stops_) match = std::min(match, held_.find(stop));
  if (match != std::string::npos) {
    out.text = held_.substr(0, match);
    out.stopped = stopped_ = true;
    held_.clear();
    return out;
  }
  // Hold back the longest tail of held_ that is a proper prefix of some stop sequence. A stop
  // sequence starts with a lead byte, and a lead byte in valid UTF-8 starts a character, so
  // the emitted part never ends inside a character.
  size_t hold = 0;
  if (!final) {
    for (const std::string& stop : stops_) {
      const size_t longest = std::min(stop.size() - 1, held_.size());
      for (size_t k = longest; k > hold; --k) {
        if (held_.compare(held_.size() - k, k, stop, 0, k) == 0) {
          hold = k;
          break;
        }
      }
    }
  }
  out.text = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

}  // namespace deja::coordinator
