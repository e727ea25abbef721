// What `deja collect` (Deja Vu's training rows) and `deja collect --locret` (the retaining heads')
// share: one window through the model with a fresh full cache while an observer records it,
// progress lines, and the meta.json beside the rows.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/model/model.h"

namespace deja::worker::model {

// `tokens` through `model` in one step with a cache of exactly their length.
Status ForwardWindow(Model& model, const std::vector<int32_t>& tokens, StepResult* step);

// A progress line every 5 seconds, and when the rows reach their cap.
class CollectProgress {
 public:
  CollectProgress(std::function<void(const std::string&)> sink, std::string name);
  // `tokens`: what the windows so far computed, for the rate.
  void Update(int64_t windows, int64_t windows_total, int64_t rows, int64_t cap, double tokens);
  double seconds() const;

 private:
  std::function<void(const std::string&)> sink_;
  std::string name_;
  std::chrono::steady_clock::time_point t0_, last_;
};

// Writes `j` (indented) to `path`; Unavailable naming it when that fails.
Status WriteJsonFile(const std::string& path, const nlohmann::json& j);

}  // namespace deja::worker::model
