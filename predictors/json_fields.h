// The small readers the predictor and retaining-head files share: a whole text file, and the
// integer fields of their JSON, each refused with InvalidArgument naming the file and the key.
#pragma once

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "common/status.h"

namespace deja::predictors {

inline StatusOr<std::string> ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return DataLoss("cannot read " + path);
  return ss.str();
}

// j[key] as an integer in [1, max].
inline StatusOr<int32_t> JsonPositiveInt(const nlohmann::json& j, const char* key,
                                         const std::string& file, int64_t max = int64_t{1} << 20) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() <= 0 ||
      it->get<int64_t>() > max) {
    return InvalidArgument(file + ": '" + key + "' must be a positive integer");
  }
  return static_cast<int32_t>(it->get<int64_t>());
}

// j[key] as an integer >= 0.
inline StatusOr<int64_t> JsonCount(const nlohmann::json& j, const char* key,
                                   const std::string& file) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() < 0) {
    return InvalidArgument(file + ": '" + key + "' must be a non-negative integer");
  }
  return it->get<int64_t>();
}

}  // namespace deja::predictors
