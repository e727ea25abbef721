#include "worker/comm/in_process_communicator.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>

#include "worker/comm/timed_communicator.h"

namespace deja::worker::comm {
namespace {

// What one rank posts for a collective before the first barrier.
struct Post {
  const void* data = nullptr;
  int64_t count = 0;  // floats for all-reduce/all-gather, bytes for broadcast
  int root = 0;
};

class Hub {
 public:
  Hub(int world, std::chrono::milliseconds timeout)
      : world_(world), timeout_(timeout), posts_(world) {}

  int world() const { return world_; }
  Post& post(int rank) { return posts_[rank]; }
  const Post& post(int rank) const { return posts_[rank]; }
  std::vector<float>& scratch() { return scratch_; }

  // A generation barrier that gives up after the timeout or when the group has failed.
  Status Arrive(int rank) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!failure_.ok()) return failure_;
    const uint64_t generation = generation_;
    if (++arrived_ == world_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return Status::Ok();
    }
    const bool woke =
        cv_.wait_for(lock, timeout_, [&] { return generation_ != generation || !failure_.ok(); });
    if (generation_ != generation) return Status::Ok();
    if (!woke) {
      failure_ = Status(StatusCode::kDeadlineExceeded,
                        "in-process group: rank " + std::to_string(rank) + " waited over " +
                            std::to_string(timeout_.count()) + " ms for its peers");
      cv_.notify_all();
    }
    return failure_;
  }

  void Fail(Status why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_.ok()) failure_ = std::move(why);
    cv_.notify_all();
  }

 private:
  const int world_;
  const std::chrono::milliseconds timeout_;
  std::vector<Post> posts_;
  std::vector<float> scratch_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  Status failure_;
};

class InProcessCommunicator final : public TimedCommunicator {
 public:
  InProcessCommunicator(std::shared_ptr<Hub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}
  ~InProcessCommunicator() override {
    hub_->Fail(Unavailable("in-process group: rank " + std::to_string(rank_) + " has left"));
  }

  int rank() const override { return rank_; }
  int world_size() const override { return hub_->world(); }

  Status AllGather(const float* in, int64_t n, float* out) override {
    DEJA_RETURN_IF_ERROR(Publish(in, n, 0));
    DEJA_RETURN_IF_ERROR(CheckSameCount("all-gather"));
    // n == 0 may come with null pointers, which memcpy must not be given even for no bytes.
    for (int r = 0; n > 0 && r < hub_->world(); ++r) {
      std::memcpy(out + r * n, hub_->post(r).data, static_cast<size_t>(n) * sizeof(float));
    }
    return hub_->Arrive(rank_);
  }

  Status Broadcast(void* data, size_t bytes, int root) override {
    DEJA_RETURN_IF_ERROR(Publish(data, static_cast<int64_t>(bytes), root));
    DEJA_RETURN_IF_ERROR(CheckSameCount("broadcast"));
    const Post& from = hub_->post(root_);
    if (rank_ != root_ && bytes > 0) std::memcpy(data, from.data, bytes);
    return hub_->Arrive(rank_);
  }

  Status Barrier() override { return hub_->Arrive(rank_); }

 protected:
  Status DoAllReduceSum(float* data, int64_t n) override {
    // Phase 1: post. Phase 2: each rank sums its slice of the elements into the shared scratch,
    // over the ranks in order. Phase 3: everyone copies the scratch out; the final barrier keeps
    // the scratch and the posted buffers alive until all have.
    if (rank_ == 0 && static_cast<int64_t>(hub_->scratch().size()) < n) {
      hub_->scratch().resize(static_cast<size_t>(n));
    }
    DEJA_RETURN_IF_ERROR(Publish(data, n, 0));
    DEJA_RETURN_IF_ERROR(CheckSameCount("all-reduce"));
    const int world = hub_->world();
    const int64_t begin = n * rank_ / world, end = n * (rank_ + 1) / world;
    float* sum = hub_->scratch().data();
    for (int64_t i = begin; i < end; ++i) {
      float acc = static_cast<const float*>(hub_->post(0).data)[i];
      for (int r = 1; r < world; ++r) acc += static_cast<const float*>(hub_->post(r).data)[i];
      sum[i] = acc;
    }
    DEJA_RETURN_IF_ERROR(hub_->Arrive(rank_));
    if (n > 0) std::memcpy(data, sum, static_cast<size_t>(n) * sizeof(float));
    return hub_->Arrive(rank_);
  }

 private:
  Status Publish(const void* data, int64_t count, int root) {
    hub_->post(rank_) = Post{data, count, root};
    return hub_->Arrive(rank_);
  }

  // Every rank sees the same posts, so every rank takes the same branch here; a rejected call
  // still meets the others once more so no rank re-posts before all have read the posts.
  Status CheckSameCount(const char* op) {
    Status s = Validate(op);
    if (!s.ok()) {
      Status met = hub_->Arrive(rank_);
      return met.ok() ? s : met;
    }
    return s;
  }

  Status Validate(const char* op) {
    const Post& first = hub_->post(0);
    for (int r = 0; r < hub_->world(); ++r) {
      const Post& p = hub_->post(r);
      if (p.count != first.count || p.root != first.root) {
        return InvalidArgument(std::string(op) + ": ranks disagree on the size or root (rank 0: " +
                               std::to_string(first.count) + "/" + std::to_string(first.root) +
                               ", rank " + std::to_string(r) + ": " + std::to_string(p.count) +
                               "/" + std::to_string(p.root) + ")");
      }
    }
    if (first.root < 0 || first.root >= hub_->world()) {
      return InvalidArgument(std::string(op) + ": root " + std::to_string(first.root) +
                             " is outside world size " + std::to_string(hub_->world()));
    }
    root_ = first.root;
    return Status::Ok();
  }

  std::shared_ptr<Hub> hub_;
  const int rank_;
  int root_ = 0;
};

}  // namespace

StatusOr<std::vector<std::unique_ptr<comm::Communicator>>> MakeInProcessGroup(
    int world, std::chrono::milliseconds timeout) {
  if (world < 1) return InvalidArgument("world size must be >= 1, got " + std::to_string(world));
  if (timeout.count() <= 0) return InvalidArgument("timeout must be positive");
  auto hub = std::make_shared<Hub>(world, timeout);
  std::vector<std::unique_ptr<comm::Communicator>> group;
  for (int r = 0; r < world; ++r) group.push_back(std::make_unique<InProcessCommunicator>(hub, r));
  return group;
}

}  // namespace deja::worker::comm
