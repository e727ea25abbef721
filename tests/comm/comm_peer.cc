// comm_peer: one rank of a Gloo (default) or shared-memory group in its own process, started by
// the multi-process tests.
//   comm_peer [--shm [--spin-us N]] <mode> <rank> <world> <store_dir> <out_file> <timeout_ms>
//             [model_dir golden_file]
// Modes: check (collective grid), loop (all-reduce until an error), bench (all-reduce timing),
// model (tensor-parallel OPT cases). Results go to <out_file> as JSON; exit code 0 = success,
// 1 = wrong results, 2 = setup failed, 3 = a collective failed (expected in the kill test).
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "tests/comm/collective_check.h"
#include "tests/comm/tp_util.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/key_value_store.h"
#include "worker/comm/shm_communicator.h"
#include "worker/comm/timed_communicator.h"
#include "worker/model/model.h"

namespace deja::test_util {
namespace {

void WriteJson(const std::string& path, const nlohmann::json& j) {
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << j.dump();
  std::rename(tmp.c_str(), path.c_str());
}

int Check(worker::comm::Communicator& comm, const std::string& out) {
  CheckResult r = CheckCollectives(comm);
  WriteJson(out, {{"problems", r.problems}, {"digest", std::to_string(r.digest)}});
  for (const std::string& p : r.problems) std::cerr << p << "\n";
  return r.problems.empty() ? 0 : 1;
}

int Loop(worker::comm::Communicator& comm, const std::string& out) {
  std::vector<float> v(2048, 1.0f);
  for (int64_t i = 0;; ++i) {
    if (i == 20) std::ofstream(out + ".ready") << "ready";
    const auto start = std::chrono::steady_clock::now();
    Status s = comm.AllReduceSum(v.data(), static_cast<int64_t>(v.size()));
    if (!s.ok()) {
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      WriteJson(out, {{"error", s.ToString()},
                      {"code", static_cast<int>(s.code())},
                      {"seconds_in_failed_call", waited}});
      return 3;
    }
    std::fill(v.begin(), v.end(), 1.0f);
  }
}

// All-reduce latency per length: mean (from the communicator's own stats), median and p90.
int Bench(worker::comm::Communicator& comm, const std::string& out) {
  nlohmann::json j = nlohmann::json::array();
  // 2048 floats: a decode step of one sequence at hidden size 2048; 32768 and 65536: 16 and 32.
  for (int64_t n : {256, 2048, 8192, 32768, 65536}) {
    std::vector<float> v(static_cast<size_t>(n));
    for (int i = 0; i < 100; ++i) {
      if (!comm.AllReduceSum(v.data(), n).ok()) return 3;
    }
    if (!comm.Barrier().ok()) return 3;
    auto* timed = dynamic_cast<worker::comm::TimedCommunicator*>(&comm);
    if (timed != nullptr) timed->ResetStats();
    const int iters = 1000;
    std::vector<double> us(iters);
    for (int i = 0; i < iters; ++i) {
      std::fill(v.begin(), v.end(), 0.5f);
      const auto start = std::chrono::steady_clock::now();
      if (!comm.AllReduceSum(v.data(), n).ok()) return 3;
      us[i] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                  .count();
    }
    std::optional<worker::comm::CollectiveStats> st = worker::comm::StatsOf(comm);
    if (!st || st->all_reduce_calls != iters) return 1;
    std::sort(us.begin(), us.end());
    j.push_back({{"floats", n},
                 {"mean_us", 1e6 * st->all_reduce_seconds / iters},
                 {"p50_us", us[iters / 2]},
                 {"p90_us", us[iters * 9 / 10]}});
  }
  WriteJson(out, j);
  return 0;
}

int Model(std::unique_ptr<worker::comm::Communicator> comm, const std::string& model_dir,
          const std::string& golden_file, const std::string& out) {
  std::ifstream in(golden_file);
  std::stringstream ss;
  ss << in.rdbuf();
  const nlohmann::json golden = nlohmann::json::parse(ss.str(), nullptr, false);
  if (golden.is_discarded()) {
    std::cerr << "cannot parse " << golden_file << "\n";
    return 2;
  }
  auto backend = kernels::MakeCpuBackend(1);
  const int rank = comm->rank();
  auto model = worker::model::LoadModel(model_dir, backend.get(), std::move(comm));
  if (!model.ok()) {
    WriteJson(out, {{"error", model.status().ToString()}});
    return 2;
  }
  StatusOr<std::vector<TpCase>> cases = RunTpCases(**model, TpPrompts(golden));
  if (!cases.ok()) {
    std::cerr << cases.status().ToString() << "\n";
    return 3;
  }
  // Every rank holds the gathered logits; each writes them so the test can compare ranks too.
  nlohmann::json j = {{"rank", rank}, {"cases", TpCasesToJson(*cases)}};
  WriteJson(out, j);
  return 0;
}

int Main(int argc, char** argv) {
  const bool shm = argc > 1 && std::string(argv[1]) == "--shm";
  if (shm) {
    --argc;
    ++argv;
  }
  // --spin-us N: the shared-memory ranks' polling time (ShmOptions::spin).
  long spin_us = -1;
  if (argc > 2 && std::string(argv[1]) == "--spin-us") {
    spin_us = std::atol(argv[2]);
    argc -= 2;
    argv += 2;
  }
  if (argc < 7) {
    std::cerr << "usage: comm_peer [--shm [--spin-us N]] <check|loop|bench|model> <rank> <world> "
                 "<store_dir> <out> <timeout_ms> [model_dir golden_file]\n";
    return 2;
  }
  const std::string mode = argv[1], out = argv[5];
  const int rank = std::atoi(argv[2]), world = std::atoi(argv[3]);
  const auto timeout = std::chrono::milliseconds(std::atoll(argv[6]));
  auto store = worker::comm::MakeFileStore(argv[4]);
  if (!store.ok()) {
    std::cerr << store.status().ToString() << "\n";
    return 2;
  }
  StatusOr<std::unique_ptr<worker::comm::Communicator>> comm = Internal("unset");
  if (shm) {
    worker::comm::ShmOptions opt;
    opt.rank = rank;
    opt.world_size = world;
    opt.timeout = timeout;
    if (spin_us >= 0) opt.spin = std::chrono::microseconds(spin_us);
    comm = worker::comm::MakeShmCommunicator(**store, opt);
  } else {
    worker::comm::GlooOptions opt;
    opt.rank = rank;
    opt.world_size = world;
    opt.timeout = timeout;
    comm = worker::comm::MakeGlooCommunicator(**store, opt);
  }
  if (!comm.ok()) {
    std::cerr << comm.status().ToString() << "\n";
    WriteJson(out, {{"error", comm.status().ToString()}});
    return 2;
  }
  if (mode == "check") return Check(**comm, out);
  if (mode == "loop") return Loop(**comm, out);
  if (mode == "bench") return Bench(**comm, out);
  if (mode == "model" && argc >= 9) return Model(std::move(*comm), argv[7], argv[8], out);
  std::cerr << "unknown mode " << mode << "\n";
  return 2;
}

}  // namespace
}  // namespace deja::test_util

int main(int argc, char** argv) { return deja::test_util::Main(argc, argv); }
