// Loading the committed HF goldens (tests/golden/<model>/cases.json) and model paths in tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace deja::test_util {

inline std::string SourceDir() {
  const char* d = std::getenv("DEJA_SOURCE_DIR");
  return d ? d : ".";
}

inline std::string ModelDir(const std::string& name) { return SourceDir() + "/models/" + name; }

inline nlohmann::json LoadGolden(const std::string& model) {
  std::ifstream in(SourceDir() + "/tests/golden/" + model + "/cases.json");
  EXPECT_TRUE(in.good()) << "missing golden file for " << model;
  if (!in.good()) return {};
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

// ||a - b|| / ||b||
inline double RelError(const float* a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace deja::test_util
