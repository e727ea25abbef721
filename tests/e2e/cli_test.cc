// The deja binary as a user runs it: real processes, checked exit codes and messages. Bad input
// (missing or corrupted checkpoints, wrong shapes, over-long or invalid prompts, bad flags)
// must give a clear message and a non-zero exit, never a crash (a signal).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/common/temp_dir.h"
#include "tests/worker/golden_util.h"

namespace deja {
namespace {

namespace fs = std::filesystem;

struct CliRun {
  int exit_code = -1;
  bool signaled = false;
  std::string out;  // stdout and stderr together
};

CliRun RunBinary(const std::string& binary, const std::string& args) {
  std::string cmd = binary + " " + args + " 2>&1";
  CliRun r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int status = pclose(p);
  r.signaled = WIFSIGNALED(status);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

CliRun RunDeja(const std::string& args) { return RunBinary(DEJA_BINARY, args); }
// Training and studies: the deja-lab binary.
CliRun RunLab(const std::string& args) { return RunBinary(DEJA_LAB_BINARY, args); }

std::string Mini() { return test_util::ModelDir("opt-mini"); }

// Copies the model to a temp dir so a test can damage it.
std::string CopyModel(const test_util::TempDir& dir) {
  std::string dst = dir.File("model");
  fs::copy(Mini(), dst, fs::copy_options::recursive);
  return dst;
}

void ExpectCleanFailure(const CliRun& r, const std::string& needle) {
  EXPECT_FALSE(r.signaled) << r.out;
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find(needle), std::string::npos) << "expected '" << needle << "' in:\n" << r.out;
}

nlohmann::json LastJsonLine(const std::string& out) {
  auto end = out.find_last_not_of('\n');
  auto begin = out.rfind('\n', end);
  return nlohmann::json::parse(out.substr(begin == std::string::npos ? 0 : begin + 1));
}

TEST(CliTest, GenerateJsonMatchesGoldenGreedy) {
  auto golden = test_util::LoadGolden("opt-mini");
  const auto& c = golden["cases"][2];
  std::string prompt = c["prompt"].get<std::string>();
  test_util::TempDir dir;
  std::ofstream(dir.File("prompt.txt")) << prompt;
  // The prompt goes through a file to keep shell quoting out of the way.
  CliRun r = RunDeja("generate --model " + Mini() + " --prompt \"$(cat " + dir.File("prompt.txt") +
                     ")\" --max-new-tokens 32 --ignore-eos --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto j = LastJsonLine(r.out);
  EXPECT_EQ(j["token_ids"].get<std::vector<int32_t>>(),
            c["greedy_ids"].get<std::vector<int32_t>>());
  EXPECT_EQ(j["text"].get<std::string>(), c["greedy_text"].get<std::string>());
}

TEST(CliTest, PerplexityJson) {
  CliRun r = RunLab("ppl --model " + Mini() + " --text " + test_util::SourceDir() +
                     "/tests/data/heldout/tinyshakespeare.txt --context 256 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto j = LastJsonLine(r.out);
  EXPECT_GT(j["perplexity"].get<double>(), 1.0);
  EXPECT_GT(j["tokens"].get<int64_t>(), 1000);
}

// `deja quantize --bits 4` as a user runs it: the report, then `generate` on the written
// checkpoint gives the tokens of `--dtype int4` on the original; bad flags name the flag.
TEST(CliTest, QuantizeInt4ThenGenerate) {
  test_util::TempDir dir;
  const std::string out = dir.File("int4");
  CliRun q = RunDeja("quantize --model " + Mini() + " --out " + out + " --bits 4 --group 64");
  ASSERT_EQ(q.exit_code, 0) << q.out;
  EXPECT_NE(q.out.find("(24 int4 in groups of 64, 0 left int8"), std::string::npos) << q.out;
  const std::string gen = " --prompt \"The quick brown fox\" --max-new-tokens 16 --ignore-eos --json";
  CliRun file = RunDeja("generate --model " + out + gen);
  CliRun load = RunDeja("generate --model " + Mini() + " --dtype int4 --int4-group 64" + gen);
  ASSERT_EQ(file.exit_code, 0) << file.out;
  ASSERT_EQ(load.exit_code, 0) << load.out;
  EXPECT_EQ(LastJsonLine(file.out)["token_ids"], LastJsonLine(load.out)["token_ids"]);
  ExpectCleanFailure(RunDeja("quantize --model " + Mini() + " --out " + dir.File("b") +
                             " --bits 3"),
                     "--bits");
  ExpectCleanFailure(RunDeja("quantize --model " + Mini() + " --out " + dir.File("g") +
                             " --bits 4 --group 12"),
                     "--group");
  ExpectCleanFailure(RunDeja("quantize --model " + Mini() + " --out " + out + " --bits 4"),
                     "already holds");
}

TEST(CliTest, MissingModelDirectory) {
  ExpectCleanFailure(RunDeja("generate --model /nonexistent/model --prompt hi"),
                     "/nonexistent/model");
}

TEST(CliTest, TruncatedSafetensors) {
  test_util::TempDir dir;
  std::string m = CopyModel(dir);
  fs::resize_file(m + "/model.safetensors", fs::file_size(m + "/model.safetensors") / 2);
  ExpectCleanFailure(RunDeja("generate --model " + m + " --prompt hi"), "model.safetensors");
}

TEST(CliTest, CorruptedSafetensorsHeader) {
  test_util::TempDir dir;
  std::string m = CopyModel(dir);
  std::fstream f(m + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(9);
  f.write("#garbage#garbage#", 17);
  f.close();
  ExpectCleanFailure(RunDeja("generate --model " + m + " --prompt hi"), "model.safetensors");
}

TEST(CliTest, WrongTensorShapes) {
  test_util::TempDir dir;
  std::string m = CopyModel(dir);
  std::ifstream in(m + "/config.json");
  auto cfg = nlohmann::json::parse(in);
  cfg["ffn_dim"] = cfg["ffn_dim"].get<int>() * 2;
  std::ofstream(m + "/config.json") << cfg.dump();
  ExpectCleanFailure(RunDeja("generate --model " + m + " --prompt hi"), "fc1.weight");
}

TEST(CliTest, PromptLongerThanPositionLimit) {
  test_util::TempDir dir;
  std::string big;
  for (int i = 0; i < 1500; ++i) big += "word ";
  std::ofstream(dir.File("p.txt")) << big;
  ExpectCleanFailure(
      RunDeja("generate --model " + Mini() + " --prompt \"$(cat " + dir.File("p.txt") + ")\""),
      "position limit");
}

TEST(CliTest, InvalidUtf8Prompt) {
  ExpectCleanFailure(
      RunDeja("generate --model " + Mini() + " --prompt \"$(printf 'ab\\377\\376')\""), "UTF-8");
}

TEST(CliTest, BadFlagsNameTheFlag) {
  ExpectCleanFailure(RunDeja("generate --model " + Mini() + " --prompt hi --top-p 2"), "top_p");
  ExpectCleanFailure(RunDeja("generate --model " + Mini() + " --prompt hi --max-new-tokens x"),
                     "--max-new-tokens");
  ExpectCleanFailure(RunDeja("generate --prompt hi"), "--model");
  ExpectCleanFailure(RunDeja("frobnicate"), "unknown command");
  ExpectCleanFailure(RunDeja("generate --model " + Mini() + " --prompt hi --dtype f8"),
                     "--dtype must be auto, checkpoint, bf16, int8 or int4, got 'f8'");
  ExpectCleanFailure(RunDeja("serve --model " + Mini() + " --dtype half"), "--dtype");
  // The logging flags every command takes (cli/log_setup.h).
  ExpectCleanFailure(RunDeja("generate --model " + Mini() + " --prompt hi -v x"),
                     "-v must be a verbosity level 0..99, not 'x'");
  ExpectCleanFailure(RunDeja("generate --model " + Mini() + " --prompt hi --log-dir="),
                     "--log-dir needs a directory");
  ExpectCleanFailure(RunDeja("generate --model " + Mini() + " --prompt hi --kv-dtype bf16"),
                     "--kv-dtype must be auto, f32, f16 or int8, got 'bf16'");
  // Enumerated flags list the accepted values from their tables.
  ExpectCleanFailure(RunDeja("serve --model " + Mini() + " --kv-policy lru"),
                     "--kv-policy must be full, window, h2o or locret, got 'lru'");
  ExpectCleanFailure(RunDeja("serve --model " + Mini() + " --cpu-comm tcp"),
                     "--cpu-comm must be auto, shm or gloo, got 'tcp'");
  ExpectCleanFailure(RunDeja("worker --model " + Mini() +
                             " --rank 0 --world 2 --coordinator 127.0.0.1:1 --cpu-comm tcp"),
                     "--cpu-comm must be auto, shm or gloo, got 'tcp'");
  ExpectCleanFailure(RunDeja("generate --model " + Mini() +
                             " --prompt hi --sparsity-oracle 0.5 --async-predictors maybe"),
                     "--async-predictors must be on, off or auto, got 'maybe'");
  ExpectCleanFailure(RunDeja("client generate --prompt hi --sparsity maybe"),
                     "--sparsity must be on or off, got 'maybe'");
  ExpectCleanFailure(RunDeja("client generate --prompt hi --kv-policy lru"),
                     "--kv-policy must be full, window, h2o or locret, got 'lru'");
  ExpectCleanFailure(RunLab("ppl --model " + Mini() + " --text /nonexistent.txt"),
                     "/nonexistent.txt");
}

// --device on every command that loads a model: a bad value names the flag; where no GPU is
// usable (this CI machine), `--device cuda` fails at start with the CUDA reason, never a crash
// and never a silent CPU run; where one is, it runs.
TEST(CliTest, DeviceFlag) {
  ExpectCleanFailure(RunDeja("generate --model " + Mini() + " --prompt hi --device gpu"),
                     "--device must be cpu, cuda or cuda:N, not 'gpu'");
  ExpectCleanFailure(RunDeja("serve --model " + Mini() + " --device cuda:x"), "--device");
  ExpectCleanFailure(RunDeja("generate --model " + Mini() +
                             " --prompt hi --device cuda "
                             "--kv-memory-fraction 1.5"),
                     "--kv-memory-fraction must be in (0, 1)");
  // --gpus: one distinct GPU per rank.
  ExpectCleanFailure(RunDeja("serve --model " + Mini() + " --device cuda --tp 2 --gpus 0"),
                     "--gpus names 1 GPUs for --tp 2 ranks");
  ExpectCleanFailure(RunDeja("serve --model " + Mini() + " --device cuda --tp 2 --gpus 1,1"),
                     "--gpus names GPU 1 twice");
  ExpectCleanFailure(RunDeja("serve --model " + Mini() + " --device cuda --tp 2 --gpus 0,x"),
                     "--gpus must be comma-separated GPU numbers");
  ExpectCleanFailure(RunDeja("serve --model " + Mini() + " --gpus 0"),
                     "--gpus needs --device cuda");
  ExpectCleanFailure(RunDeja("serve --model " + Mini() + " --device cuda:1 --tp 2"),
                     "name each rank's GPU with --gpus");
  const CliRun probe = RunDeja("generate --model " + Mini() +
                               " --prompt hi --max-new-tokens 2 --device cuda --json");
  ASSERT_FALSE(probe.signaled) << probe.out;
  if (probe.exit_code == 0) GTEST_SKIP() << "a GPU is usable here: the refusals do not apply";
  for (const std::string cmd :
       {"generate --model " + Mini() + " --prompt hi --device cuda",
        "bench decode --model " + Mini() + " --device cuda:0",
        "bench kv --model " + Mini() + " --device cuda",
        "serve --model " + Mini() + " --device cuda --port 0",
        "serve --model " + Mini() + " --device cuda --tp 2 --gpus 1,0 --port 0",
        "worker --model " + Mini() +
            " --device cuda --rank 0 --world 1 --coordinator 127.0.0.1:1"}) {
    const CliRun r = RunDeja(cmd);
    EXPECT_FALSE(r.signaled) << cmd << "\n" << r.out;
    EXPECT_NE(r.exit_code, 0) << cmd << "\n" << r.out;
    EXPECT_NE(r.out.find("is not usable"), std::string::npos) << cmd << "\n" << r.out;
    EXPECT_NE(r.out.find("cuda"), std::string::npos) << cmd << "\n" << r.out;
  }
}

// `deja bench decode` end to end on a small run: every figure the issue names is in the JSON
// and positive (the 1.3B numbers come from docs/performance.md runs, not from this test); the
// floor's bandwidth is the probe beside batch 1 (one per step); bad counts are refused by name.
TEST(CliTest, BenchDecodeReportsEveryFigure) {
  CliRun r =
      RunDeja("bench decode --model " + Mini() +
              " --prefill-tokens 16 --prompt-tokens 4 --decode-steps 3 --batches 1,2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  nlohmann::json j = LastJsonLine(r.out);
  for (const char* key : {"prefill_tokens_per_s", "bandwidth_gb_per_s", "bandwidth_start_gb_per_s",
                          "floor_ms_per_token", "batch1_fraction_of_floor"}) {
    ASSERT_TRUE(j.contains(key)) << key << " missing in " << j.dump();
    EXPECT_GT(j[key].get<double>(), 0.0) << key;
  }
  EXPECT_EQ(j["warmup_rounds"].get<int>(), 1);
  ASSERT_EQ(j["decode"].size(), 2u);
  EXPECT_EQ(j["decode"][0]["batch"].get<int>(), 1);
  EXPECT_EQ(j["decode"][1]["batch"].get<int>(), 2);
  for (const auto& d : j["decode"]) {
    EXPECT_GT(d["ms_per_step"].get<double>(), 0.0);
    EXPECT_GT(d["speedup_vs_batch1"].get<double>(), 0.0);
    // The roofline: the weights' floor (bytes or FLOPs) plus the K/V bytes, at the bandwidth
    // probed beside this batch's steps.
    EXPECT_GT(d["bandwidth_gb_per_s"].get<double>(), 0.0);
    EXPECT_GT(d["compute_floor_ms_per_step"].get<double>(), 0.0);
    EXPECT_GT(d["attention_floor_ms_per_step"].get<double>(), 0.0);
    EXPECT_NEAR(d["attention_floor_ms_per_step"].get<double>(),
                d["kv_read_bytes_per_step"].get<double>() / d["bandwidth_gb_per_s"].get<double>() /
                    1e6,
                1e-9 * d["attention_floor_ms_per_step"].get<double>());
    EXPECT_GT(d["floor_ms_per_step"].get<double>(),
              d["attention_floor_ms_per_step"].get<double>());
    EXPECT_GE(d["floor_ms_per_step"].get<double>(),
              d["compute_floor_ms_per_step"].get<double>() +
                  d["attention_floor_ms_per_step"].get<double>() - 1e-9);
    EXPECT_DOUBLE_EQ(d["fraction_of_roofline"].get<double>(),
                     d["floor_ms_per_step"].get<double>() / d["ms_per_step"].get<double>());
  }
  // K and V of every layer and head over prompt + s + 1 slots at step s (mean over 3 steps:
  // prompt + 2), per sequence; f16 rows (--kv-dtype auto).
  const nlohmann::json c = nlohmann::json::parse(std::ifstream(Mini() + "/config.json"));
  const double layers = c["num_hidden_layers"].get<double>();
  const double heads = c["num_attention_heads"].get<double>();
  const double head_dim = c["hidden_size"].get<double>() / heads;
  EXPECT_EQ(j["kv_dtype"].get<std::string>(), "f16");
  EXPECT_DOUBLE_EQ(j["decode"][0]["kv_read_bytes_per_step"].get<double>(),
                   2 * layers * heads * head_dim * 2 * (4 + 2));
  EXPECT_DOUBLE_EQ(j["decode"][1]["kv_read_bytes_per_step"].get<double>(),
                   2 * j["decode"][0]["kv_read_bytes_per_step"].get<double>());
  // int8 rows: head_dim values and a 4-byte scale.
  r = RunDeja("bench decode --model " + Mini() +
              " --kv-dtype int8 --prefill-tokens 16 --prompt-tokens 4 --decode-steps 3 --batches 1"
              " --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const nlohmann::json j8 = LastJsonLine(r.out);
  EXPECT_EQ(j8["kv_dtype"].get<std::string>(), "int8");
  EXPECT_DOUBLE_EQ(j8["decode"][0]["kv_read_bytes_per_step"].get<double>(),
                   2 * layers * heads * (head_dim + 4) * (4 + 2));
  EXPECT_DOUBLE_EQ(
      j["batch1_fraction_of_floor"].get<double>(),
      j["floor_ms_per_token"].get<double>() / j["decode"][0]["ms_per_step"].get<double>());
  ExpectCleanFailure(RunDeja("bench decode --model " + Mini() + " --warmup-rounds -1"),
                     "--warmup-rounds");
  ExpectCleanFailure(RunDeja("bench decode --model " + Mini() + " --decode-steps 0"),
                     "--decode-steps");
}

TEST(CliTest, HelpForEverySubcommand) {
  for (const char* cmd : {"generate", "bench decode", "serve", "client", "quantize"}) {
    CliRun r = RunDeja(std::string(cmd) + " --help");
    EXPECT_EQ(r.exit_code, 0) << cmd;
    EXPECT_NE(r.out.find("usage: deja "), std::string::npos) << r.out;
  }
  for (const char* cmd : {"ppl", "prefix-eval", "collect", "train-predictors", "train-retaining"}) {
    CliRun r = RunLab(std::string(cmd) + " --help");
    EXPECT_EQ(r.exit_code, 0) << cmd;
    EXPECT_NE(r.out.find("usage: deja-lab " + std::string(cmd)), std::string::npos) << r.out;
  }
}

TEST(CliTest, LabCommandsPointToDejaLab) {
  // The serving binary does not train or study; it says where those commands are.
  for (const char* cmd : {"ppl", "collect", "train-predictors", "train-retaining", "prefix-eval"}) {
    CliRun r = RunDeja(std::string(cmd) + " --help");
    EXPECT_EQ(r.exit_code, 2) << cmd;
    EXPECT_NE(r.out.find("deja-lab " + std::string(cmd) + " --help"), std::string::npos) << r.out;
  }
}

}  // namespace
}  // namespace deja
