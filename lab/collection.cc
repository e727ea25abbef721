#include "lab/collection.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <utility>

namespace deja::worker::model {

Status ForwardWindow(Model& model, const std::vector<int32_t>& tokens, StepResult* step) {
  const int32_t n = static_cast<int32_t>(tokens.size());
  DEJA_ASSIGN_OR_RETURN(std::unique_ptr<kv::SequenceKv> kv, model.NewSequence(n));
  return model.Forward({{kv.get(), tokens.data(), n, false}}, step);
}

CollectProgress::CollectProgress(std::function<void(const std::string&)> sink, std::string name)
    : sink_(std::move(sink)),
      name_(std::move(name)),
      t0_(std::chrono::steady_clock::now()),
      last_(t0_) {}

double CollectProgress::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

void CollectProgress::Update(int64_t windows, int64_t windows_total, int64_t rows, int64_t cap,
                             double tokens) {
  const auto now = std::chrono::steady_clock::now();
  if (!sink_ || (std::chrono::duration<double>(now - last_).count() <= 5 && rows < cap)) return;
  last_ = now;
  char buf[200];
  std::snprintf(buf, sizeof buf, "%s: window %lld of %lld, rows %lld of %lld, %.0f tok/s",
                name_.c_str(), static_cast<long long>(windows),
                static_cast<long long>(windows_total), static_cast<long long>(rows),
                static_cast<long long>(cap), tokens / std::max(seconds(), 1e-9));
  sink_(buf);
}

Status WriteJsonFile(const std::string& path, const nlohmann::json& j) {
  std::ofstream out(path, std::ios::trunc);
  out << j.dump(2) << "\n";
  if (!out.good()) return Unavailable("cannot write " + path);
  return Status::Ok();
}

}  // namespace deja::worker::model
