// Test helpers for quantized checkpoints: a checkpoint copied with its tensors edited, and a
// model's logits for one prompt in one step.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/safetensors.h"
#include "worker/model/model.h"

namespace deja::test_util {

// Copies `src` to `dst`, its model.safetensors through `edit` (name -> view; it may add, drop or
// change tensors); the tensors' storage goes to `keep`, which must outlive the write.
inline void RewriteCheckpoint(
    const std::string& src, const std::string& dst,
    const std::function<void(std::vector<std::pair<std::string, TensorView>>*)>& edit,
    std::vector<Tensor>* keep) {
  namespace fs = std::filesystem;
  fs::create_directories(dst);
  for (const auto& e : fs::directory_iterator(src)) {
    if (e.path().filename() != "model.safetensors") {
      fs::copy_file(e.path(), dst + "/" + e.path().filename().string(),
                    fs::copy_options::overwrite_existing);
    }
  }
  auto ckpt = OpenCheckpoint(src);
  ASSERT_TRUE(ckpt.ok());
  std::vector<std::pair<std::string, TensorView>> tensors;
  for (const std::string& n : (*ckpt)->names()) {
    Tensor copy = Tensor::Empty((*ckpt)->Find(n)->dtype, (*ckpt)->Find(n)->shape);
    std::memcpy(copy.data(), (*ckpt)->Find(n)->data, copy.bytes());
    tensors.emplace_back(n, copy.view());
    keep->push_back(std::move(copy));
  }
  edit(&tensors);
  ASSERT_TRUE(WriteSafetensors(dst + "/model.safetensors", tensors).ok());
}

// The logits of every position of `ids`, prefilled in one step of a new sequence.
inline std::vector<float> PrefillLogits(worker::model::Model& m, const std::vector<int32_t>& ids) {
  auto kv = m.NewSequence(static_cast<int32_t>(ids.size()));
  EXPECT_TRUE(kv.ok());
  if (!kv.ok()) return {};
  worker::model::StepResult r;
  EXPECT_TRUE(m.Forward({{kv->get(), ids.data(), static_cast<int32_t>(ids.size())}}, &r).ok());
  return {r.logits.as<float>(), r.logits.as<float>() + r.logits.numel()};
}

}  // namespace deja::test_util
