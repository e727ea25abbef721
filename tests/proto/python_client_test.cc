// The public proto with Python's grpcio-tools, and examples/python_client.py against a live
// canned server. The interpreter is $DEJA_PYTHON or python3; without grpc_tools the tests that
// need it skip and say why.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "tests/common/run_shell.h"
#include "tests/common/temp_dir.h"
#include "tests/proto/fake_text_generation.h"

namespace deja {
namespace {

std::string SourceDir() {
  const char* dir = std::getenv("DEJA_SOURCE_DIR");
  return dir ? dir : ".";
}

std::string Python() {
  const char* py = std::getenv("DEJA_PYTHON");
  return py ? py : "python3";
}

bool PythonHas(const std::string& module) {
  std::string out;
  return test_util::RunShell(Python() + " -c 'import " + module + "'", &out) == 0;
}

// Compiles the public proto into `out_dir` with grpc_tools; returns protoc's exit status.
int CompileProto(const std::string& out_dir, std::string* output) {
  return test_util::RunShell(Python() + " -m grpc_tools.protoc -I " + SourceDir() +
                                 "/proto --python_out=" + out_dir +
                                 " --grpc_python_out=" + out_dir + " " + SourceDir() +
                                 "/proto/deja/v1/text_generation.proto",
                             output);
}

TEST(PythonProtoTest, ExampleClientIsValidPython) {
  std::string out;
  if (test_util::RunShell(Python() + " --version", &out) != 0)
    GTEST_SKIP() << Python() << " not found";
  // Compiles to bytecode in memory: no grpc needed, nothing written to the source tree.
  EXPECT_EQ(
      test_util::RunShell(Python() +
                              " -c \"import sys; compile(open(sys.argv[1]).read(), sys.argv[1], "
                              "'exec')\" " +
                              SourceDir() + "/examples/python_client.py",
                          &out),
      0)
      << out;
}

TEST(PythonProtoTest, GrpcToolsCompilesAndImportsThePublicProto) {
  if (!PythonHas("grpc_tools")) {
    GTEST_SKIP() << "grpc_tools not importable by " << Python()
                 << " (pip install grpcio-tools, or set DEJA_PYTHON to a venv's python)";
  }
  test_util::TempDir dir;
  std::string out;
  ASSERT_EQ(CompileProto(dir.path(), &out), 0) << out;
  const std::string script =
      "import sys; sys.path.insert(0, sys.argv[1]);"
      "from deja.v1 import text_generation_pb2 as pb, text_generation_pb2_grpc as g;"
      "r = pb.GenerateRequest(text='hi'); r.sampling.temperature = 0.0;"
      "assert r.sampling.HasField('temperature') and not r.sampling.HasField('top_p');"
      "assert r.WhichOneof('input') == 'text';"
      "m = [x.name for x in pb.DESCRIPTOR.services_by_name['TextGeneration'].methods];"
      "print(sorted(m)); g.TextGenerationStub";
  ASSERT_EQ(test_util::RunShell(Python() + " -c \"" + script + "\" " + dir.path(), &out), 0) << out;
  EXPECT_EQ(out, "['Cancel', 'Generate', 'GenerateStream', 'GetModelInfo', 'Tokenize']\n");
}

TEST(PythonProtoTest, ExampleClientTalksToALiveServer) {
  if (!PythonHas("grpc_tools") || !PythonHas("grpc")) {
    GTEST_SKIP() << "grpcio/grpcio-tools not importable by " << Python()
                 << " (pip install grpcio grpcio-tools, or set DEJA_PYTHON)";
  }
  test_util::TempDir dir;
  std::string out;
  ASSERT_EQ(CompileProto(dir.path(), &out), 0) << out;
  test_util::FakeServer server;
  ASSERT_TRUE(server.ok());
  const std::string client = Python() + " " + SourceDir() +
                             "/examples/python_client.py --timeout 20 --gen-dir " + dir.path() +
                             " --target " + server.target() + " ";

  ASSERT_EQ(test_util::RunShell(
                client + "generate hello --max-new-tokens 4 --temperature 0.7 --seed 3", &out),
            0)
      << out;
  EXPECT_NE(out.find("echo: hello\n"), std::string::npos) << out;
  EXPECT_NE(out.find("finish=length"), std::string::npos) << out;

  ASSERT_EQ(test_util::RunShell(client + "generate hello --sparsity off", &out), 0) << out;
  EXPECT_NE(out.find("echo: hello\n"), std::string::npos) << out;

  ASSERT_EQ(
      test_util::RunShell(
          client + "stream hello --cache h2o --sparsity on --sparsity-schedule default", &out),
      0)
      << out;
  EXPECT_NE(out.find("echo: stream\n"), std::string::npos) << out;
  EXPECT_NE(out.find("finish=eos"), std::string::npos) << out;

  ASSERT_EQ(test_util::RunShell(client + "tokenize ab", &out), 0) << out;
  EXPECT_EQ(out, "97\t'a'\n98\t'b'\n");

  ASSERT_EQ(test_util::RunShell(client + "info", &out), 0) << out;
  EXPECT_NE(out.find("model_name: \"fake-opt\""), std::string::npos) << out;
  EXPECT_NE(out.find("tensor_parallel_size: 2"), std::string::npos) << out;
}

}  // namespace
}  // namespace deja
