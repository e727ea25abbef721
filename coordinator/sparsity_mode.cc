#include "coordinator/sparsity_mode.h"

#include <vector>

#include "common/enum_table.h"

namespace deja::coordinator {
namespace {

const SparsityModeRow kSparsityModes[] = {
    {v1::Sparsity::MODE_UNSPECIFIED, "", std::nullopt},
    {v1::Sparsity::MODE_ON, "on", true},
    {v1::Sparsity::MODE_OFF, "off", false},
};

const SparsityModeRow& RowOf(std::optional<bool> on) {
  const SparsityModeRow* row = FindRow(kSparsityModes, &SparsityModeRow::on, on);
  CHECK(row != nullptr);
  return *row;
}

}  // namespace

std::span<const SparsityModeRow> SparsityModeTable() { return kSparsityModes; }

StatusOr<std::optional<bool>> SparsityFromProto(v1::Sparsity::Mode mode, const std::string& field) {
  if (const SparsityModeRow* row = FindRow(kSparsityModes, &SparsityModeRow::mode, mode)) {
    return row->on;
  }
  std::vector<std::string> names;
  for (const SparsityModeRow& row : kSparsityModes) {
    names.emplace_back(v1::Sparsity::Mode_Name(row.mode));
  }
  return InvalidArgument(field + " must be " + OneOf(names) + ", got " +
                         std::to_string(static_cast<int>(mode)));
}

v1::Sparsity::Mode SparsityToProto(std::optional<bool> on) { return RowOf(on).mode; }

StatusOr<bool> ParseSparsity(std::string_view name, const std::string& what) {
  DEJA_ASSIGN_OR_RETURN(const SparsityModeRow* row, ParseRow(kSparsityModes, name, what));
  return *row->on;
}

const char* SparsityName(bool on) { return RowOf(on).name; }

}  // namespace deja::coordinator
