// StepEngine on a tensor-parallel group of 2 ranks (threads over the in-process communicator):
// a sequence that the ranks refuse fails alone. The good sequences of the same steps give the
// tokens they give when the group runs them without it, and every rank reports the refusal.
#include <gtest/gtest.h>

#include <condition_variable>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kernels/backend.h"
#include "tests/comm/tp_util.h"
#include "tests/worker_service/step_util.h"
#include "worker/comm/in_process_communicator.h"
#include "worker/service/step_engine.h"

namespace deja::worker::service {
namespace {

using deja::v1::StepRequest;
using deja::v1::StepResponse;
using test_util::FirstChunk;
using test_util::NextChunk;

constexpr int kWorld = 2;
constexpr int32_t kNewTokens = 6;

// One thread per rank, each with its model and StepEngine; Step() hands every rank the same
// request and returns their responses by rank.
class TpGroup {
 public:
  explicit TpGroup(const std::string& dir) {
    auto comms = comm::MakeInProcessGroup(kWorld, std::chrono::seconds(60));
    EXPECT_TRUE(comms.ok()) << comms.status().ToString();
    if (!comms.ok()) return;
    comms_ = std::move(*comms);
    responses_.resize(kWorld);
    status_.resize(kWorld);
    for (int r = 0; r < kWorld; ++r) threads_.emplace_back([this, r, dir] { RankMain(r, dir); });
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return loaded_ == kWorld; });
  }
  ~TpGroup() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  bool ok() const {
    for (const Status& s : status_) {
      if (!s.ok()) return false;
    }
    return loaded_ == kWorld;
  }

  std::vector<StepResponse> Step(const StepRequest& req) {
    std::unique_lock<std::mutex> lock(mu_);
    request_ = req;
    done_ = 0;
    ++generation_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return done_ == kWorld; });
    return responses_;
  }

 private:
  void RankMain(int rank, const std::string& dir) {
    auto backend = kernels::MakeCpuBackend(1);
    std::unique_ptr<model::Model> model;
    std::unique_ptr<StepEngine> engine;
    Status s = [&]() -> Status {
      DEJA_ASSIGN_OR_RETURN(model, model::LoadModel(dir, backend.get(), std::move(comms_[rank])));
      DEJA_ASSIGN_OR_RETURN(engine, StepEngine::Create(model.get(), 64ull << 20));
      return engine->WarmUp();
    }();
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mu_);
    status_[rank] = s;
    ++loaded_;
    cv_.notify_all();
    if (!s.ok()) return;
    while (true) {
      cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      const StepRequest req = request_;
      lock.unlock();
      StepResponse resp;
      Status fatal = engine->Run(req, &resp);
      EXPECT_TRUE(fatal.ok()) << "rank " << rank << ": " << fatal.ToString();
      lock.lock();
      responses_[rank] = std::move(resp);
      ++done_;
      cv_.notify_all();
    }
  }

  std::vector<std::unique_ptr<comm::Communicator>> comms_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  int loaded_ = 0;
  bool stop_ = false;
  uint64_t generation_ = 0;
  int done_ = 0;
  StepRequest request_;
  std::vector<StepResponse> responses_;
  std::vector<Status> status_;
};

// Greedy tokens of `prompts` (seq ids base, base + 1, ...) decoded together in one batch, with
// `bad` (when set) inserted after the first sequence of every step.
std::vector<std::vector<int32_t>> DecodeBatch(TpGroup& group,
                                              const std::vector<std::vector<int32_t>>& prompts,
                                              uint64_t base, const deja::v1::SequenceWork* bad) {
  std::vector<std::vector<int32_t>> got(prompts.size());
  std::vector<uint32_t> lengths;
  std::vector<deja::v1::SequenceWork> works;
  for (size_t i = 0; i < prompts.size(); ++i) {
    works.push_back(FirstChunk(base + i, prompts[i], prompts[i].size(), kNewTokens));
    lengths.push_back(static_cast<uint32_t>(prompts[i].size()));
  }
  for (int32_t step = 0; step < kNewTokens; ++step) {
    StepRequest req;
    req.set_step_id(static_cast<uint64_t>(step + 1));
    for (size_t i = 0; i < works.size(); ++i) {
      *req.add_sequences() = works[i];
      if (i == 0 && bad != nullptr) *req.add_sequences() = *bad;
    }
    std::vector<StepResponse> resp = group.Step(req);
    const size_t expected = works.size() + (bad != nullptr ? 1 : 0);
    EXPECT_EQ(resp[0].results_size(), static_cast<int>(expected));
    if (resp[0].results_size() != static_cast<int>(expected)) return got;
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_EQ(resp[r].error_code(), 0) << resp[r].error_message();
      if (bad == nullptr) continue;
      // Rank 0 answers the refused sequence among the others; rank 1 only that one.
      const deja::v1::SequenceResult& refused = r == 0 ? resp[r].results(1) : resp[r].results(0);
      EXPECT_EQ(refused.seq_id(), bad->seq_id()) << "rank " << r;
      EXPECT_EQ(refused.error_code(), static_cast<int>(StatusCode::kInvalidArgument))
          << "rank " << r << ": " << refused.error_message();
      if (r > 0) {
        EXPECT_EQ(resp[r].results_size(), 1) << "rank " << r;
      }
    }
    for (size_t i = 0; i < works.size(); ++i) {
      const deja::v1::SequenceResult& res =
          resp[0].results(static_cast<int>(i == 0 || bad == nullptr ? i : i + 1));
      EXPECT_EQ(res.seq_id(), base + i);
      EXPECT_EQ(res.error_code(), 0) << res.error_message();
      got[i].push_back(res.token_id());
      works[i] = NextChunk(base + i, {res.token_id()}, lengths[i]++, true);
    }
  }
  return got;
}

TEST(StepEngineTpTest, AFailingSequenceLeavesTheOthersTokensUnchanged) {
  const std::string name = test_util::TpModelName();
  TpGroup group(test_util::ModelDir(name));
  ASSERT_TRUE(group.ok());
  std::vector<std::vector<int32_t>> prompts = test_util::TpPrompts(test_util::LoadGolden(name));
  ASSERT_GE(prompts.size(), 3u);
  prompts.resize(3);
  // Alone: each prompt by itself, then all three together without the bad one.
  std::vector<std::vector<int32_t>> alone;
  for (size_t i = 0; i < prompts.size(); ++i) {
    alone.push_back(DecodeBatch(group, {prompts[i]}, 100 + i * 10, nullptr)[0]);
  }
  // A new sequence whose second token is outside any vocabulary.
  deja::v1::SequenceWork bad =
      FirstChunk(999, {2, std::numeric_limits<int32_t>::max()}, 2, kNewTokens);
  std::vector<std::vector<int32_t>> with_bad = DecodeBatch(group, prompts, 200, &bad);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(with_bad[i], alone[i]) << "prompt " << i;
  }
}

}  // namespace
}  // namespace deja::worker::service
