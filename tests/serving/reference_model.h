// The single-process run the serving tests compare the service with: ModelDir() loaded in the
// test on one CPU thread, and generation through worker::model::Generate.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/tokenizer.h"
#include "kernels/backend.h"
#include "serving_util.h"
#include "worker/model/generation.h"
#include "worker/model/model.h"

namespace deja::serving_test {

struct ReferenceModel {
  // Declared before the model, destroyed after it.
  std::unique_ptr<kernels::Backend> backend;
  std::unique_ptr<worker::model::Model> model;
  std::unique_ptr<Tokenizer> tokenizer;

  // Null members on failure (tests assert ok()).
  static std::unique_ptr<ReferenceModel> Load() {
    auto r = std::make_unique<ReferenceModel>();
    r->backend = kernels::MakeCpuBackend(1);
    StatusOr<std::unique_ptr<worker::model::Model>> m =
        worker::model::LoadModel(ModelDir(), r->backend.get());
    if (m.ok()) r->model = std::move(*m);
    StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Load(ModelDir());
    if (t.ok()) r->tokenizer = std::move(*t);
    return r;
  }
  bool ok() const { return model != nullptr && tokenizer != nullptr; }

  // The tokens generated for `prompt` (BOS prepended) under `options`.
  std::vector<int32_t> Generate(const std::string& prompt,
                                const worker::model::GenerationOptions& options) {
    StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(prompt, true);
    EXPECT_TRUE(ids.ok());
    std::vector<int32_t> out;
    if (!ids.ok()) return out;
    StatusOr<worker::model::GenerationResult> r = worker::model::Generate(*model, *ids, options);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (r.ok()) {
      for (const auto& c : r->tokens) out.push_back(c.id);
    }
    return out;
  }
};

// A suite with one server process (started by the derived suite's SetUpTestSuite through
// StartSuite) and the reference model; every test waits for the server to be ready.
class ServerSuite : public ::testing::Test {
 protected:
  static void StartSuite(const std::string& name, std::vector<std::string> args) {
    server_ = new Server(name, std::move(args));
    ref_ = ReferenceModel::Load().release();
  }
  static void TearDownTestSuite() {
    delete server_;
    delete ref_;
    server_ = nullptr;
    ref_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(ref_ != nullptr && ref_->ok());
    ASSERT_TRUE(server_->WaitListening()) << server_->Log();
    ASSERT_TRUE(WaitHealth(server_->channel(), kServing)) << server_->Log();
  }

  static inline Server* server_ = nullptr;
  static inline ReferenceModel* ref_ = nullptr;
};

}  // namespace deja::serving_test
