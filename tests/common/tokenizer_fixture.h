// Shared by the tokenizer tests: the goldens written by tools/fixture/golden_tokenizer.py and
// the directory of the fixture tokenizer they were made from.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace deja::tokenizer_fixture {

inline std::filesystem::path SourceDir() {
  const char* dir = std::getenv("DEJA_SOURCE_DIR");
  return dir != nullptr ? std::filesystem::path(dir) : std::filesystem::path(".");
}

inline std::string ReadText(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// tests/golden/tokenizer/<name>; a discarded value if missing or unreadable.
inline nlohmann::json ReadGolden(const std::string& name) {
  return nlohmann::json::parse(ReadText(SourceDir() / "tests/golden/tokenizer" / name), nullptr,
                               false);
}

// The fixture model's tokenizer (models/opt-mini); before the model is trained, the tokenizer
// the goldens were generated from (its files are what training copies into the model).
// Empty if neither exists.
inline std::filesystem::path TokenizerDir(const nlohmann::json& golden) {
  std::filesystem::path candidates[] = {SourceDir() / "models/opt-mini", {}};
  if (golden.is_object() && golden.contains("model_dir")) {
    candidates[1] = SourceDir() / golden["model_dir"].get<std::string>();
  }
  for (const auto& dir : candidates) {
    if (!dir.empty() && std::filesystem::exists(dir / "vocab.json")) return dir;
  }
  return {};
}

}  // namespace deja::tokenizer_fixture
