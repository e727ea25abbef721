// A tiny OPT model loaded once per fuzzing process (single rank, CPU backend on one thread), with
// Deja Vu sparsity in oracle mode so sequences may ask for it, its KV paged or not.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "kernels/backend.h"
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
  return m;
}

}  // namespace deja::fuzz
