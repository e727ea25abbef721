// Lookups over the tables that spell out an enumerated concept once. Each concept (a KV-cache
// policy kind, a dtype flag, an on/off switch) is one constant array of rows, one row per value,
// holding every spelling of the value: its `name` on the command line and in logs, its proto
// values, a factory. Parsing, printing and the "must be a, b or c" of error messages are all read
// from the rows, so a row added to a table is accepted everywhere and listed in every message.
#pragma once

#include <iterator>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "common/status.h"

namespace deja {

// "a", "a or b", "a, b or c".
inline std::string OneOf(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? " or " : ", ";
    out += names[i];
  }
  return out;
}

// The rows' names, in table order. A row with an empty name has no spelling (a proto value such
// as UNSPECIFIED that the command line expresses by leaving the flag out) and is skipped.
template <typename Rows>
std::vector<std::string> RowNames(const Rows& rows) {
  std::vector<std::string> names;
  for (const auto& row : rows) {
    if (row.name[0] != '\0') names.emplace_back(row.name);
  }
  return names;
}

// The first row whose `field` equals `value`; nullptr when none does.
template <typename Rows, typename Row, typename Field, typename Value>
const Row* FindRow(const Rows& rows, Field Row::*field, const Value& value) {
  for (const Row& row : rows) {
    if (row.*field == value) return &row;
  }
  return nullptr;
}

// The row named `name`; otherwise InvalidArgument "<what> must be a, b or c, got 'x'", where
// `what` names the flag or field ("--kv-policy").
template <typename Rows>
auto ParseRow(const Rows& rows, std::string_view name, const std::string& what)
    -> StatusOr<const std::remove_reference_t<decltype(*std::begin(rows))>*> {
  for (const auto& row : rows) {
    if (row.name[0] != '\0' && name == row.name) return &row;
  }
  return InvalidArgument(what + " must be " + OneOf(RowNames(rows)) + ", got '" +
                         std::string(name) + "'");
}

// --help text for a flag whose rows carry a `help` phrase: "a (what a does), b (...) or c".
template <typename Rows>
std::string RowsHelp(const Rows& rows) {
  std::vector<std::string> parts;
  for (const auto& row : rows) {
    if (row.name[0] == '\0') continue;
    std::string part = row.name;
    if (row.help[0] != '\0') part += std::string(" (") + row.help + ")";
    parts.push_back(std::move(part));
  }
  return OneOf(parts);
}

}  // namespace deja
