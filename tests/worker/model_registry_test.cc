// LoadModel builds the implementation registered for a checkpoint's model_type and refuses the
// others by name, listing what this build serves.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>

#include "kernels/backend.h"
#include "tests/common/temp_dir.h"
#include "tests/worker/golden_util.h"
#include "worker/model/model.h"

namespace deja::worker::model {
namespace {

using test_util::ModelDir;
using test_util::TempDir;
using test_util::WriteBytes;

TEST(ModelRegistryTest, OptCheckpointLoadsAsTheOptImplementation) {
  auto backend = kernels::MakeCpuBackend(1);
  auto m = LoadModel(ModelDir("opt-mini"), backend.get());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_GT((*m)->config().vocab_size, 0);
  EXPECT_EQ((*m)->comm().world_size(), 1);
}

TEST(ModelRegistryTest, UnknownModelTypeIsRefusedByName) {
  TempDir dir;
  WriteBytes(dir.File("config.json"), R"({"model_type": "llama", "hidden_size": 8})");
  auto backend = kernels::MakeCpuBackend(1);
  auto m = LoadModel(dir.path(), backend.get());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("'model_type' is 'llama'"), std::string::npos)
      << m.status().ToString();
  EXPECT_NE(m.status().message().find(RegisteredModelTypes()), std::string::npos);
  EXPECT_EQ(RegisteredModelTypes(), "opt");
}

TEST(ModelRegistryTest, MalformedOrMissingConfigIsAnError) {
  TempDir dir;
  auto backend = kernels::MakeCpuBackend(1);
  auto missing = LoadModel(dir.path(), backend.get());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status().ToString();
  WriteBytes(dir.File("config.json"), "{not json");
  auto bad = LoadModel(dir.path(), backend.get());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status().ToString();
  WriteBytes(dir.File("config.json"), R"({"model_type": 7})");
  auto typed = LoadModel(dir.path(), backend.get());
  EXPECT_EQ(typed.status().code(), StatusCode::kInvalidArgument) << typed.status().ToString();
  EXPECT_NE(typed.status().message().find("model_type"), std::string::npos);
}

}  // namespace
}  // namespace deja::worker::model
