// A tiny OPT model loaded once per fuzzing process (single rank, CPU backend on one thread), with
// Deja Vu sparsity in oracle mode so sequences may ask for it, its KV paged or not.
#pragma once

#include <filesystem>
#include <memory>
#include <random>
#include <string>

#include "kernels/backend.h"
#include "predictors/retaining_heads.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/tiny_opt.h"
#include "worker/model/model.h"

namespace deja::fuzz {

struct TinyModel {
  std::unique_ptr<kernels::Backend> backend;
  std::unique_ptr<worker::model::Model> model;
};

// kv_pool_bytes > 0: the KV caches come from a block pool of that size (paged, as a worker's).
inline TinyModel LoadTinyModel(const TinyOptSpec& spec, const std::string& name,
                               int64_t kv_pool_bytes = 0) {
  TinyModel m;
  const std::string dir = ScratchDir() + "/" + name;
  std::filesystem::create_directories(dir);
  if (Status s = WriteTinyOpt(dir, /*seed=*/7, spec); !s.ok()) {
    Fail("WriteTinyOpt", __FILE__, __LINE__, s.ToString());
  }
  m.backend = kernels::MakeCpuBackend(1);
  worker::model::LoadOptions options;
  options.kv_paged = kv_pool_bytes > 0;
  options.kv_memory_bytes = kv_pool_bytes;
  auto model = worker::model::LoadModel(dir, m.backend.get(), nullptr, options);
  if (!model.ok()) Fail("LoadModel", __FILE__, __LINE__, model.status().ToString());
  m.model = std::move(*model);
  worker::model::SparsityOptions sparsity;
  sparsity.oracle_fraction = 0.5f;
  sparsity.predictor_thread = worker::model::SparsityOptions::PredictorThread::kInline;
  if (Status s = m.model->EnableSparsity(sparsity); !s.ok()) {
    Fail("EnableSparsity", __FILE__, __LINE__, s.ToString());
  }
  // Seeded random retaining heads, so the locret policy runs too.
  const OptConfig& c = m.model->config();
  predictors::RetainingHeads heads;
  heads.layers = static_cast<int32_t>(c.num_hidden_layers);
  heads.heads = static_cast<int32_t>(c.num_attention_heads);
  heads.head_dim = static_cast<int32_t>(c.head_dim());
  heads.hidden = 4;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 0.3f);
  auto random = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng);
    return v;
  };
  const size_t units = static_cast<size_t>(heads.heads) * heads.hidden;
  for (int32_t l = 0; l < heads.layers; ++l) {
    heads.w1.push_back(random(units * 3 * heads.head_dim));
    heads.b1.push_back(random(units));
    heads.w2.push_back(random(units));
    heads.b2.push_back(random(heads.heads));
  }
  const std::string heads_path = dir + "/retaining.safetensors";
  if (Status s = predictors::SaveRetainingHeads(heads_path, heads, nlohmann::json::object());
      !s.ok()) {
    Fail("SaveRetainingHeads", __FILE__, __LINE__, s.ToString());
  }
  if (Status s = m.model->EnableRetaining(heads_path); !s.ok()) {
    Fail("EnableRetaining", __FILE__, __LINE__, s.ToString());
  }
  return m;
}

}  // namespace deja::fuzz
