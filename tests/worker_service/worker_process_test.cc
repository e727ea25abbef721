// Real `deja worker` processes (TP 2) driven over gRPC as the coordinator drives them: the test
// hosts the Rendezvous, the workers register, build their Gloo group through it, warm up and
// answer Step streams. Greedy tokens equal the single-process model::Generate; bad requests are
// per-step errors and the group keeps serving; release and stream close return KV usage to its
// baseline; a shutdown step or SIGTERM ends the workers with code 0; kill -9 of one rank makes
// the other report a fatal step error and exit non-zero within 3 s. The group secret: the workers
// read it from a file, send it on their Rendezvous calls, and refuse Step and GetStatus calls
// without it; a worker with a wrong one cannot register, one without any does not start.
#include <grpcpp/client_context.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "deja/v1/worker.grpc.pb.h"
#include "kernels/backend.h"
#include "proto/internal_plane.h"
#include "tests/comm/process_util.h"
#include "tests/comm/tp_util.h"
#include "tests/common/temp_dir.h"
#include "tests/worker_service/grpc_rendezvous.h"
#include "tests/worker_service/step_util.h"

namespace deja::worker::service {
namespace {

using namespace std::chrono_literals;
using deja::v1::StepRequest;
using deja::v1::StepResponse;
using Clock = std::chrono::steady_clock;
using Stream = grpc::ClientReaderWriter<StepRequest, StepResponse>;

constexpr int kWorld = 2;
constexpr int32_t kNewTokens = 6;
constexpr uint32_t kKvMb = 64;

std::string NewSecret() {
  StatusOr<std::string> s = proto::GenerateGroupSecret();
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? *s : std::string(64, 'x');
}

class WorkerGroup {
 public:
  WorkerGroup() : secret_(NewSecret()), rv_(kWorld, secret_) {
    model_dir_ = test_util::ModelDir(test_util::TpModelName());
    test_util::WriteBytes(SecretFile(), secret_ + "\n");
    for (int r = 0; r < kWorld; ++r) {
      procs_.push_back(std::make_unique<test_util::ChildProcess>(
          WorkerArgs(r, {"--group-secret-file", SecretFile()}),
          tmp_.File("worker" + std::to_string(r) + ".log")));
    }
  }

  std::vector<std::string> WorkerArgs(int rank, const std::vector<std::string>& extra) const {
    std::vector<std::string> args = {DEJA_BINARY, "worker", "--model",
                                     model_dir_,  "--rank", std::to_string(rank)};
    args.insert(args.end(), {"--world", std::to_string(kWorld), "--coordinator", rv_.address(),
                             "--threads", "1", "--kv-memory-mb", std::to_string(kKvMb)});
    args.insert(args.end(), {"--collective-timeout-ms", "20000"});
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
  std::string SecretFile() const { return tmp_.File("group-secret"); }
  const std::string& secret() const { return secret_; }
  test_util::GrpcRendezvous& rendezvous() { return rv_; }
  deja::v1::Worker::Stub& stub(int r) { return *stubs_[r]; }
  const std::string& address(int r) const { return addresses_[r]; }

  // Waits for both ranks to register and warm up; opens their stubs.
  void WaitReady() {
    auto members = rv_.service().WaitForMembers(60s);
    ASSERT_TRUE(members.ok()) << members.status().ToString() << Logs();
    for (const auto& m : *members) {
      addresses_.push_back(m.address);
      stubs_.push_back(deja::v1::Worker::NewStub(
          grpc::CreateChannel(m.address, grpc::InsecureChannelCredentials())));
    }
    const Clock::time_point deadline = Clock::now() + 90s;
    for (int r = 0; r < kWorld; ++r) {
      for (;;) {
        deja::v1::WorkerStatus st = Status(r);
        if (st.warmed_up()) break;
        ASSERT_LT(Clock::now(), deadline) << "rank " << r << " not ready" << Logs();
        std::this_thread::sleep_for(50ms);
      }
    }
  }

  deja::v1::WorkerStatus Status(int r) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 5s);
    proto::AttachGroupSecret(&ctx, secret_);
    deja::v1::WorkerStatus st;
    grpc::Status s = stubs_[r]->GetStatus(&ctx, {}, &st);
    EXPECT_TRUE(s.ok()) << "rank " << r << ": " << s.error_message();
    return st;
  }

  void OpenStreams() {
    ctxs_.clear();
    streams_.clear();
    for (int r = 0; r < kWorld; ++r) {
      ctxs_.push_back(std::make_unique<grpc::ClientContext>());
      proto::AttachGroupSecret(ctxs_.back().get(), secret_);
      streams_.push_back(stubs_[r]->Step(ctxs_.back().get()));
    }
  }

  void CloseStreams() {
    for (int r = 0; r < kWorld; ++r) {
      streams_[r]->WritesDone();
      grpc::Status s = streams_[r]->Finish();
      EXPECT_TRUE(s.ok()) << s.error_message();
    }
    streams_.clear();
    ctxs_.clear();
  }

  // Sends `req` to every rank; returns each rank's answer.
  std::vector<StepResponse> Step(const StepRequest& req) {
    for (auto& s : streams_) EXPECT_TRUE(s->Write(req));
    std::vector<StepResponse> out(kWorld);
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_TRUE(streams_[r]->Read(&out[r])) << "rank " << r << Logs();
      EXPECT_EQ(out[r].step_id(), req.step_id());
      EXPECT_EQ(out[r].rank(), static_cast<uint32_t>(r));
    }
    return out;
  }

  std::string Logs() const {
    std::string s;
    for (size_t r = 0; r < procs_.size(); ++r) {
      s += "\n--- rank " + std::to_string(r) + " ---\n" + procs_[r]->Log();
    }
    return s;
  }

  test_util::ChildProcess& proc(int r) { return *procs_[r]; }
  Stream& stream(int r) { return *streams_[r]; }
  const std::string& model_dir() const { return model_dir_; }

 private:
  test_util::TempDir tmp_;
  const std::string secret_;
  test_util::GrpcRendezvous rv_;
  std::string model_dir_;
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<test_util::ChildProcess>> procs_;
  std::vector<std::unique_ptr<deja::v1::Worker::Stub>> stubs_;
  std::vector<std::unique_ptr<grpc::ClientContext>> ctxs_;
  std::vector<std::unique_ptr<Stream>> streams_;
};

std::vector<std::vector<int32_t>> Prompts() {
  return test_util::TpPrompts(test_util::LoadGolden(test_util::TpModelName()));
}

TEST(WorkerProcessTest, ServesStepsLikeOneProcess) {
  WorkerGroup g;
  ASSERT_NO_FATAL_FAILURE(g.WaitReady());
  const deja::v1::WorkerStatus st0 = g.Status(0);
  EXPECT_EQ(st0.rank(), 0u);
  EXPECT_EQ(st0.world_size(), 2u);
  EXPECT_TRUE(st0.loaded());
  EXPECT_EQ(st0.group_epoch(), 1u);
  // The KV pool (--kv-paging on, the default): whole blocks of 32 positions of the budget.
  EXPECT_GT(st0.kv_bytes_per_token(), 0u);
  EXPECT_EQ(st0.kv_block_tokens(), 32u);
  EXPECT_LE(st0.kv().total_bytes(), uint64_t{kKvMb} << 20);
  EXPECT_GT(st0.kv().total_bytes(), (uint64_t{kKvMb} << 20) - 32 * st0.kv_bytes_per_token());
  const uint64_t baseline = st0.kv().free_bytes();
  EXPECT_EQ(baseline, st0.kv().total_bytes());

  auto backend = kernels::MakeCpuBackend(1);
  auto model = model::LoadModel(g.model_dir(), backend.get());
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  const auto prompts = Prompts();
  const std::vector<int32_t>& a = prompts.back();
  const std::vector<int32_t>& b = prompts[prompts.size() - 2];

  g.OpenStreams();
  // Step 1: all of a; then b joins while a decodes.
  StepRequest req;
  req.set_step_id(1);
  *req.add_sequences() = test_util::FirstChunk(11, a, a.size(), kNewTokens, 2);
  std::vector<StepResponse> resp = g.Step(req);
  std::vector<int32_t> got_a, got_b;
  uint32_t len_a = a.size(), len_b = b.size();
  for (uint64_t step = 2; got_a.size() < kNewTokens; ++step) {
    for (int r = 0; r < kWorld; ++r) ASSERT_EQ(resp[r].error_code(), 0) << resp[r].error_message();
    EXPECT_EQ(resp[1].results_size(), 0);  // only rank 0 returns results
    EXPECT_GT(resp[1].timings().allreduce_calls(), 0u);
    EXPECT_GT(resp[0].timings().compute_seconds(), 0.0);
    StepRequest next;
    next.set_step_id(step);
    for (const deja::v1::SequenceResult& res : resp[0].results()) {
      if (res.seq_id() == 11) {
        EXPECT_EQ(res.top_size(), 2);
        got_a.push_back(res.token_id());
        if (got_a.size() < kNewTokens) {
          *next.add_sequences() = test_util::NextChunk(11, {res.token_id()}, len_a++, true);
        }
      } else {
        got_b.push_back(res.token_id());
        *next.add_sequences() = test_util::NextChunk(12, {res.token_id()}, len_b++, true);
      }
    }
    if (step == 2) *next.add_sequences() = test_util::FirstChunk(12, b, b.size(), kNewTokens);
    if (next.sequences_size() == 0) break;
    resp = g.Step(next);
  }
  EXPECT_EQ(got_a, test_util::ReferenceGreedy(**model, a, kNewTokens));
  ASSERT_FALSE(got_b.empty());
  std::vector<int32_t> ref_b = test_util::ReferenceGreedy(**model, b, kNewTokens);
  ref_b.resize(got_b.size());
  EXPECT_EQ(got_b, ref_b);

  // Bad sequences: refused by every rank in their results, the group keeps serving.
  const int32_t vocab = static_cast<int32_t>((*model)->config().vocab_size);
  StepRequest bad;
  bad.set_step_id(100);
  *bad.add_sequences() = test_util::NextChunk(12, {vocab + 5}, len_b, true);
  for (const StepResponse& r : g.Step(bad)) {
    EXPECT_EQ(r.error_code(), 0);
    ASSERT_EQ(r.results_size(), 1);
    EXPECT_EQ(r.results(0).error_code(), static_cast<int>(StatusCode::kInvalidArgument));
    EXPECT_NE(r.results(0).error_message().find("seq_id 12"), std::string::npos)
        << r.results(0).error_message();
    EXPECT_FALSE(r.fatal());
  }
  bad.set_step_id(101);
  *bad.mutable_sequences(0) = test_util::NextChunk(777, {5}, 3, true);
  for (const StepResponse& r : g.Step(bad)) {
    ASSERT_EQ(r.results_size(), 1);
    EXPECT_EQ(r.results(0).error_code(), static_cast<int>(StatusCode::kNotFound));
  }
  StepRequest good;
  good.set_step_id(102);
  *good.add_sequences() = test_util::NextChunk(12, {got_b.back()}, len_b++, true);
  resp = g.Step(good);
  ASSERT_EQ(resp[0].error_code(), 0) << resp[0].error_message();
  EXPECT_EQ(resp[0].kv().sequences(), 2u);
  EXPECT_LT(g.Status(1).kv().free_bytes(), baseline);

  // Release: usage back to baseline on every rank.
  StepRequest release;
  release.set_step_id(103);
  release.add_release_seq_ids(11);
  release.add_release_seq_ids(12);
  for (const StepResponse& r : g.Step(release)) {
    EXPECT_EQ(r.error_code(), 0);
    EXPECT_EQ(r.kv().free_bytes(), baseline);
    EXPECT_EQ(r.kv().sequences(), 0u);
    EXPECT_EQ(r.kv().cached_tokens(), 0u);
  }

  // The stream goes away with a live sequence: GetStatus still answers, the sequence is gone,
  // and a new stream serves.
  StepRequest again;
  again.set_step_id(104);
  *again.add_sequences() = test_util::FirstChunk(13, a, a.size(), kNewTokens);
  g.Step(again);
  g.CloseStreams();
  for (int r = 0; r < kWorld; ++r) {
    const Clock::time_point deadline = Clock::now() + 5s;
    while (g.Status(r).kv().sequences() != 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(20ms);
    }
    EXPECT_EQ(g.Status(r).kv().free_bytes(), baseline);
  }
  g.OpenStreams();
  again.set_step_id(1);
  resp = g.Step(again);
  ASSERT_EQ(resp[0].error_code(), 0) << resp[0].error_message();
  ASSERT_EQ(resp[0].results_size(), 1);
  EXPECT_EQ(resp[0].results(0).token_id(), got_a[0]);

  // Shutdown step: both answer, then exit 0.
  StepRequest bye;
  bye.set_step_id(2);
  bye.set_shutdown(true);
  g.Step(bye);
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(g.proc(r).ExitCode(10s), 0) << g.Logs();
}

TEST(WorkerProcessTest, SigtermStopsGracefully) {
  WorkerGroup g;
  ASSERT_NO_FATAL_FAILURE(g.WaitReady());
  g.OpenStreams();
  for (int r = 0; r < kWorld; ++r) g.proc(r).Kill(SIGTERM);
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(g.proc(r).ExitCode(10s), 0) << g.Logs();
}

TEST(WorkerProcessTest, KilledPeerTakesTheOtherRankDown) {
  WorkerGroup g;
  ASSERT_NO_FATAL_FAILURE(g.WaitReady());
  const auto prompts = Prompts();
  const std::vector<int32_t>& a = prompts.back();
  g.OpenStreams();
  StepRequest req;
  req.set_step_id(1);
  *req.add_sequences() = test_util::FirstChunk(1, a, a.size(), kNewTokens);
  std::vector<StepResponse> resp = g.Step(req);
  ASSERT_EQ(resp[0].error_code(), 0) << resp[0].error_message();

  g.proc(1).Kill(SIGKILL);
  const Clock::time_point killed = Clock::now();
  StepRequest next;
  next.set_step_id(2);
  *next.add_sequences() = test_util::NextChunk(1, {resp[0].results(0).token_id()}, a.size(), true);
  ASSERT_TRUE(g.stream(0).Write(next));
  StepResponse r0;
  ASSERT_TRUE(g.stream(0).Read(&r0)) << g.Logs();
  EXPECT_NE(r0.error_code(), 0);
  EXPECT_TRUE(r0.fatal()) << r0.error_message();
  EXPECT_NE(r0.error_message().find("rank 0"), std::string::npos) << r0.error_message();
  const int code = g.proc(0).ExitCode(3s);
  EXPECT_LT(Clock::now() - killed, 3s);
  EXPECT_NE(code, 0) << g.Logs();
  EXPECT_NE(code, -1) << "rank 0 still running 3 s after its peer died" << g.Logs();
}

// The Worker service answers only callers with the group secret, and a worker's Rendezvous calls
// carry it: a worker with a wrong secret cannot register, one without any does not start.
TEST(WorkerProcessTest, WorkerCallsNeedTheGroupSecret) {
  WorkerGroup g;
  ASSERT_NO_FATAL_FAILURE(g.WaitReady());
  const std::vector<int32_t> prompt = Prompts().back();
  for (const std::string& wrong : {std::string(), std::string(64, '0'), g.secret() + "0"}) {
    for (int r = 0; r < kWorld; ++r) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + 5s);
      proto::AttachGroupSecret(&ctx, wrong);
      deja::v1::WorkerStatus st;
      grpc::Status s = g.stub(r).GetStatus(&ctx, {}, &st);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
      EXPECT_FALSE(st.warmed_up());

      grpc::ClientContext step_ctx;
      step_ctx.set_deadline(std::chrono::system_clock::now() + 5s);
      proto::AttachGroupSecret(&step_ctx, wrong);
      auto stream = g.stub(r).Step(&step_ctx);
      StepRequest req;
      req.set_step_id(1);
      *req.add_sequences() = test_util::FirstChunk(7, prompt, prompt.size(), kNewTokens);
      stream->Write(req);
      stream->WritesDone();
      StepResponse resp;
      EXPECT_FALSE(stream->Read(&resp)) << "rank " << r << " answered a step without the secret";
      s = stream->Finish();
      EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
    }
  }
  // With the secret both ranks still serve, and the refused step left nothing behind.
  g.OpenStreams();
  StepRequest req;
  req.set_step_id(1);
  *req.add_sequences() = test_util::FirstChunk(7, prompt, prompt.size(), kNewTokens);
  std::vector<StepResponse> resp = g.Step(req);
  ASSERT_EQ(resp[0].error_code(), 0) << resp[0].error_message();
  EXPECT_EQ(resp[0].kv().sequences(), 1u);
  g.CloseStreams();

  test_util::TempDir tmp;
  const std::string wrong_file = tmp.File("wrong-secret");
  test_util::WriteBytes(wrong_file, std::string(64, '0'));
  const uint64_t refused_before = g.rendezvous().service().refused_calls();
  test_util::ChildProcess intruder(g.WorkerArgs(0, {"--group-secret-file", wrong_file}),
                                   tmp.File("intruder.log"));
  EXPECT_EQ(intruder.ExitCode(30s), 1) << intruder.Log();
  EXPECT_NE(intruder.Log().find("UNAUTHENTICATED"), std::string::npos) << intruder.Log();
  EXPECT_GT(g.rendezvous().service().refused_calls(), refused_before);
  ASSERT_EQ(g.rendezvous().service().Members().size(), 2u);
  EXPECT_NE(g.rendezvous().service().Members()[0].pid, static_cast<uint32_t>(intruder.pid()));

  test_util::ChildProcess bare(g.WorkerArgs(1, {}), tmp.File("bare.log"));
  EXPECT_EQ(bare.ExitCode(30s), 2) << bare.Log();
  EXPECT_NE(bare.Log().find("--group-secret-file"), std::string::npos) << bare.Log();
  EXPECT_NE(bare.Log().find("--insecure-internal"), std::string::npos) << bare.Log();
}

}  // namespace
}  // namespace deja::worker::service
