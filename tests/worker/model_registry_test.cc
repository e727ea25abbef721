// LoadModel builds the implementation registered for a checkpoint's model_type and refuses the
// others by name, listing what this build serves; a checkpoint it loads runs; a malformed one
// (mismatched LayerNorm dtypes, NaN or Inf weights) is refused by name.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>

#include "kernels/backend.h"
#include "tests/common/sim_device.h"
#include "tests/common/temp_dir.h"
#include "tests/fuzz/tiny_opt.h"
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

// Tensors may differ in dtype, but a LayerNorm's weight and bias go to one op that takes them in
// one dtype: such a checkpoint used to load and then fail every forward step (found by
// fuzz_safetensors). Mixed dtypes that pair up load and run.
TEST(ModelRegistryTest, LayerNormWeightAndBiasInDifferentDtypesAreRefusedAtLoad) {
  auto backend = kernels::MakeCpuBackend(1);
  TempDir mixed;
  ASSERT_TRUE(
      fuzz::WriteTinyOpt(mixed.path(), 1, fuzz::kTinyOpt, {DType::kF16, DType::kF32, DType::kBF16})
          .ok());
  auto refused = LoadModel(mixed.path(), backend.get());
  ASSERT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("'model.decoder.final_layer_norm.weight' (bf16) and "
                                            "'model.decoder.final_layer_norm.bias' (f16)"),
            std::string::npos)
      << refused.status().ToString();

  TempDir paired;
  ASSERT_TRUE(fuzz::WriteTinyOpt(paired.path(), 1, fuzz::kTinyOpt,
                                 {DType::kF32, DType::kF32, DType::kF16, DType::kF16})
                  .ok());
  auto m = LoadModel(paired.path(), backend.get());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  auto kv = (*m)->NewSequence(4);
  ASSERT_TRUE(kv.ok()) << kv.status().ToString();
  const int32_t tokens[3] = {2, 5, 7};
  StepResult result;
  Status s = (*m)->Forward({{kv->get(), tokens, 3, /*all_logits=*/true}}, &result);
  EXPECT_TRUE(s.ok()) << s.ToString();
}

// A NaN or Inf anywhere in the weights is DATA_LOSS at load, naming the tensor (fc1's ReLU once
// turned a NaN row into zeros and the model answered plausibly, and wrongly).
TEST(ModelRegistryTest, NonFiniteWeightsAreRefusedAtLoad) {
  auto backend = kernels::MakeCpuBackend(1);
  for (const auto& [bits, what] : {std::pair{0x7FC00000u, "NaN"}, std::pair{0xFF800000u, "-Inf"}}) {
    TempDir dir;
    ASSERT_TRUE(fuzz::WriteTinyOpt(dir.path(), 1, fuzz::kTinyOpt, {DType::kF32}).ok());
    const std::string file = dir.File("model.safetensors");
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    uint64_t header_bytes = 0;
    f.read(reinterpret_cast<char*>(&header_bytes), 8);
    std::string header(header_bytes, '\0');
    f.read(header.data(), static_cast<std::streamsize>(header_bytes));
    const nlohmann::json h = nlohmann::json::parse(header);
    const auto& t = h.at("model.decoder.layers.0.fc2.weight");
    ASSERT_EQ(t.at("dtype"), "F32");
    // The last element of the tensor: its last row and column.
    const uint64_t end = t.at("data_offsets")[1].get<uint64_t>();
    f.seekp(static_cast<std::streamoff>(8 + header_bytes + end - 4));
    f.write(reinterpret_cast<const char*>(&bits), 4);
    f.close();
    auto m = LoadModel(dir.path(), backend.get());
    ASSERT_EQ(m.status().code(), StatusCode::kDataLoss) << what << ": " << m.status().ToString();
    EXPECT_NE(m.status().message().find("layer 0 fc2 weight holds NaN or Inf"), std::string::npos)
        << m.status().ToString();
    // A device load checks the chunks it streams to the device, and names the tensor.
    auto sim = test_util::MakeSimDeviceBackend(size_t{64} << 20);
    auto on_device = LoadModel(dir.path(), sim.get());
    ASSERT_EQ(on_device.status().code(), StatusCode::kDataLoss) << on_device.status().ToString();
    EXPECT_NE(on_device.status().message().find("layers.0.fc2 holds NaN or Inf"),
              std::string::npos)
        << on_device.status().ToString();
  }
}

}  // namespace
}  // namespace deja::worker::model
