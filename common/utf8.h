// UTF-8 helpers for the tokenizer: validation with the offending byte offset, lossy decoding
// with the same U+FFFD substitution as Python's errors="replace" and Rust's from_utf8_lossy
// (one replacement per maximal invalid subpart), and detection of a trailing incomplete
// character for streaming detokenization.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace deja {

inline constexpr size_t kUtf8Valid = static_cast<size_t>(-1);

// Byte offset of the first byte of the first ill-formed sequence (overlong forms, surrogates
// and code points above U+10FFFF included), or kUtf8Valid.
size_t FindInvalidUtf8(std::string_view bytes);

// Decodes the well-formed character starting at bytes[pos] into *code_point and returns its
// length, or returns 0 if no well-formed character starts there.
size_t DecodeUtf8Char(std::string_view bytes, size_t pos, uint32_t* code_point);

void AppendUtf8(uint32_t code_point, std::string* out);

// `bytes` with every maximal invalid subpart replaced by U+FFFD.
std::string Utf8Lossy(std::string_view bytes);

// Length (0-3) of the trailing bytes that start a well-formed character but stop before its
// end, i.e. bytes a later chunk could still complete.
size_t IncompleteUtf8Suffix(std::string_view bytes);

}  // namespace deja
