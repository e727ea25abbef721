// `deja-lab collect` and `deja-lab train-predictors` as a user runs them: a small run end to end, and
// bad input (missing files, a directory that is not collect output, a wrong model) giving a
// clear message and a non-zero exit, never a signal.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "tests/common/temp_dir.h"
#include "tests/worker/golden_util.h"

namespace deja {
namespace {

struct CliRun {
  int exit_code = -1;
  bool signaled = false;
  std::string out;
};

CliRun RunDeja(const std::string& args) {
  std::string cmd = std::string(DEJA_BINARY) + " " + args + " 2>&1";
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

void ExpectCleanFailure(const CliRun& r, const std::string& needle) {
  EXPECT_FALSE(r.signaled) << r.out;
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find(needle), std::string::npos) << "expected '" << needle << "' in:\n" << r.out;
}

std::string Mini() { return test_util::ModelDir("opt-mini"); }

std::string SmallText(const test_util::TempDir& dir) {
  std::ifstream in(test_util::SourceDir() + "/tests/data/heldout/tinyshakespeare.txt");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string path = dir.File("text.txt");
  std::ofstream(path) << ss.str().substr(0, 3000);
  return path;
}

TEST(PredictorCli, CollectThenTrain) {
  test_util::TempDir dir;
  const std::string text = SmallText(dir), data = dir.File("data");
  CliRun c = RunDeja("collect --model " + Mini() + " --text " + text + " --out " + data +
                     " --context 64 --max-rows 300 --seed 2");
  ASSERT_EQ(c.exit_code, 0) << c.out;
  EXPECT_NE(c.out.find("300 rows per layer"), std::string::npos) << c.out;
  ASSERT_TRUE(std::filesystem::exists(data + "/meta.json"));
  ASSERT_TRUE(std::filesystem::exists(data + "/layer_3.safetensors"));
  const std::string out = dir.File("p.safetensors");
  CliRun t = RunDeja("train-predictors --data " + data + " --out " + out +
                     " --rank 8 --epochs 1 --batch 64");
  ASSERT_EQ(t.exit_code, 0) << t.out;
  EXPECT_NE(t.out.find("layer 3 heads"), std::string::npos) << t.out;
  EXPECT_TRUE(std::filesystem::exists(out));
  EXPECT_TRUE(std::filesystem::exists(dir.File("p.json")));
}

TEST(PredictorCli, CollectBadInput) {
  test_util::TempDir dir;
  const std::string text = SmallText(dir);
  ExpectCleanFailure(RunDeja("collect --model " + Mini() + " --text " + dir.File("none.txt") +
                             " --out " + dir.File("o")),
                     "none.txt");
  ExpectCleanFailure(RunDeja("collect --model " + dir.File("nomodel") + " --text " + text +
                             " --out " + dir.File("o")),
                     "nomodel");
  ExpectCleanFailure(RunDeja("collect --model " + Mini() + " --text " + text + " --out " +
                             dir.File("o") + " --context 5000"),
                     "context");
  ExpectCleanFailure(RunDeja("collect --model " + Mini() + " --text " + text), "--out");
}

TEST(PredictorCli, TrainBadInput) {
  test_util::TempDir dir;
  ExpectCleanFailure(RunDeja("train-predictors --data " + dir.path() + " --out " +
                             dir.File("p.safetensors")),
                     "not `deja-lab collect` output");
  ExpectCleanFailure(RunDeja("train-predictors --data " + dir.File("missing") + " --out " +
                             dir.File("p.safetensors")),
                     "missing");
  ExpectCleanFailure(RunDeja("train-predictors --data " + dir.path() + " --out " +
                             dir.File("p.safetensors") + " --target-recall 2"),
                     "--target-recall");
  ExpectCleanFailure(RunDeja("train-predictors --data " + dir.path() + " --out " +
                             dir.File("p.safetensors") + " --head-target-recall 1.5"),
                     "--head-target-recall");
  std::ofstream(dir.File("meta.json")) << R"({"format": "deja-predictor-data-v1",
    "hidden_size": 4, "ffn_dim": 8, "num_heads": 2, "num_layers": 1, "rows": 100})";
  ExpectCleanFailure(RunDeja("train-predictors --data " + dir.path() + " --out " +
                             dir.File("p.safetensors")),
                     "layer_0.safetensors");
}

}  // namespace
}  // namespace deja
