// UTF-8 per the Unicode standard's table of well-formed byte sequences (Table 3-7).
#include "common/utf8.h"

namespace deja {
namespace {

// For a lead byte: the sequence length and the allowed range of the second byte, which is
// narrower than 80..BF after E0, ED, F0 and F4 (to exclude overlong forms, surrogates and
// code points past U+10FFFF). Length 0 means the byte cannot start a sequence.
struct LeadInfo {
  int length;
  uint8_t second_lo;
  uint8_t second_hi;
};

LeadInfo Lead(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// Number of bytes from `pos` that belong to a well-formed prefix of one character: equals
// Lead().length for a complete character; smaller for a truncated or broken one (at least 1
// for any byte, so an invalid byte is a subpart of its own).
size_t WellFormedPrefix(std::string_view bytes, size_t pos, LeadInfo* info) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  *info = Lead(p[pos]);
  if (info->length <= 1) return 1;
  size_t n = 1;
  while (n < static_cast<size_t>(info->length) && pos + n < bytes.size()) {
    uint8_t b = p[pos + n];
    uint8_t lo = n == 1 ? info->second_lo : 0x80;
    uint8_t hi = n == 1 ? info->second_hi : 0xBF;
    if (b < lo || b > hi) break;
    ++n;
  }
  return n;
}

}  // namespace

size_t DecodeUtf8Char(std::string_view bytes, size_t pos, uint32_t* code_point) {
  if (pos >= bytes.size()) return 0;
  LeadInfo info;
  size_t n = WellFormedPrefix(bytes, pos, &info);
  if (info.length == 0 || n != static_cast<size_t>(info.length)) return 0;
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data()) + pos;
  static constexpr uint8_t kLeadMask[5] = {0, 0x7F, 0x1F, 0x0F, 0x07};
  uint32_t cp = p[0] & kLeadMask[n];
  for (size_t i = 1; i < n; ++i) cp = (cp << 6) | (p[i] & 0x3F);
  *code_point = cp;
  return n;
}

size_t FindInvalidUtf8(std::string_view bytes) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    uint32_t cp;
    size_t n = DecodeUtf8Char(bytes, pos, &cp);
    if (n == 0) return pos;
    pos += n;
  }
  return kUtf8Valid;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    LeadInfo info;
    size_t n = WellFormedPrefix(bytes, pos, &info);
    if (info.length != 0 && n == static_cast<size_t>(info.length)) {
      out.append(bytes.substr(pos, n));
    } else {
      out.append("\xEF\xBF\xBD");  // U+FFFD
    }
    pos += n;
  }
  return out;
}

size_t IncompleteUtf8Suffix(std::string_view bytes) {
  for (size_t k = 1; k <= 3 && k <= bytes.size(); ++k) {
    size_t pos = bytes.size() - k;
    LeadInfo info;
    size_t n = WellFormedPrefix(bytes, pos, &info);
    if (info.length > 1) {
      // A lead byte: incomplete only if everything after it is a valid continuation.
      return n == k && k < static_cast<size_t>(info.length) ? k : 0;
    }
    if (info.length == 1) return 0;
  }
  return 0;
}

}  // namespace deja
