// The Deja Vu sparsity modes of the public API (deja.v1.Sparsity.Mode), spelled out once: each
// mode's command-line name (`deja client --sparsity`, `deja serve --sparsity-default`) and what
// it asks for. Validation, the client and the serving flags all translate through these rows.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "common/status.h"
#include "deja/v1/text_generation.pb.h"

namespace deja::coordinator {

struct SparsityModeRow {
  v1::Sparsity::Mode mode;
  // "on", "off"; empty for MODE_UNSPECIFIED, which the command line expresses by leaving the
  // flag out.
  const char* name;
  // Sparsity on or off; nullopt: the server's default decides.
  std::optional<bool> on;
};

// Every mode, one row each.
std::span<const SparsityModeRow> SparsityModeTable();

// What `mode` asks for (nullopt: the server's default); InvalidArgument "<field> must be
// MODE_UNSPECIFIED, MODE_ON or MODE_OFF, got 7" for a value without a row.
StatusOr<std::optional<bool>> SparsityFromProto(v1::Sparsity::Mode mode, const std::string& field);
v1::Sparsity::Mode SparsityToProto(std::optional<bool> on);

// "on" or "off"; InvalidArgument "<what> must be on or off, got 'x'" otherwise.
StatusOr<bool> ParseSparsity(std::string_view name, const std::string& what);
// The inverse, for logs and flags passed on.
const char* SparsityName(bool on);

}  // namespace deja::coordinator
