// NCCL implementation of the Communicator (compiled when DEJA_HAVE_NCCL). It has been compiled
// and linked on machines without a GPU; see README.md#gpus for where it has run.
#include "worker/comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <glog/logging.h>
#include <nccl.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "worker/comm/timed_communicator.h"

namespace deja::worker::comm {
namespace {

using Clock = std::chrono::steady_clock;

Status CudaError(cudaError_t e, const char* what) {
  return Unavailable(std::string(what) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

Status Timeout(std::string m) { return Status(StatusCode::kDeadlineExceeded, std::move(m)); }

Status NcclError(ncclResult_t r, const char* what) {
  return Unavailable(std::string(what) + ": " + ncclGetErrorString(r));
}

// A non-blocking communicator's state after a call: polls until it leaves ncclInProgress, or
// until the deadline (then Aborted is returned and the caller aborts the communicator).
ncclResult_t Settle(ncclComm_t comm, ncclResult_t r, Clock::time_point deadline) {
  while (r == ncclInProgress) {
    if (Clock::now() > deadline) return ncclInProgress;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) return ncclInternalError;
  }
  return r;
}

// Owns the NCCL communicator, the stream it enqueues on when it was given none, the events that
// time and watch its collectives, and the watchdog thread.
class NcclCommunicator final : public TimedCommunicator {
 public:
  NcclCommunicator(const NcclOptions& o, ncclComm_t comm, cudaStream_t stream, bool own_stream,
                   float* scratch)
      : TimedCommunicator(/*wall_time=*/false),
        rank_(o.rank),
        world_(o.world_size),
        device_(o.device),
        timeout_(o.timeout),
        comm_(comm),
        stream_(stream),
        own_stream_(own_stream),
        scratch_(scratch) {
    watchdog_ = std::thread([this] { Watch(); });
  }
  ~NcclCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
    if (!aborted_ && failure_.ok()) {
      cudaStreamSynchronize(stream_);
      ncclCommDestroy(comm_);
    } else if (!aborted_) {
      ncclCommAbort(comm_);  // a failed group: its peers may never answer a destroy
    }
    for (const Pending& p : pending_) Free(p);
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (own_stream_) cudaStreamDestroy(stream_);
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  bool device_memory() const override { return true; }

  Status AllGather(const float* in, int64_t n, float* out) override {
    if (n == 0) return Status::Ok();
    return Enqueue(false, "ncclAllGather", [&] {
      return ncclAllGather(in, out, static_cast<size_t>(n), ncclFloat, comm_, stream_);
    });
  }
  Status Broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= world_) {
      return InvalidArgument("broadcast root " + std::to_string(root) + " is outside world " +
                             std::to_string(world_));
    }
    if (bytes == 0) return Status::Ok();
    return Enqueue(false, "ncclBroadcast", [&] {
      return ncclBroadcast(data, data, bytes, ncclChar, root, comm_, stream_);
    });
  }
  // Every rank has reached the barrier when its all-reduce completes: waits for it (never longer
  // than the timeout: the watchdog aborts).
  Status Barrier() override {
    DEJA_RETURN_IF_ERROR(AllReduceSum(scratch_, 1));
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return pending_.empty() || !failure_.ok(); });
    return failure_;
  }
  Status CheckHealth() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_.ok()) return failure_;
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess &&
        async != ncclInProgress) {
      failure_ = NcclError(async, "NCCL peer");
    }
    return failure_;
  }

 protected:
  Status DoAllReduceSum(float* data, int64_t n) override {
    if (n == 0) return Status::Ok();
    return Enqueue(true, "ncclAllReduce", [&] {
      return ncclAllReduce(data, data, static_cast<size_t>(n), ncclFloat, ncclSum, comm_, stream_);
    });
  }

 private:
  struct Pending {
    cudaEvent_t start, end;
    bool timed;  // an all-reduce: its device time is accounted
    Clock::time_point enqueued;
  };

  // Records an event pair around the collective that `call` enqueues, for the watchdog.
  template <typename Call>
  Status Enqueue(bool timed, const char* what, Call&& call) {
    Pending p{};
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failure_.ok()) return failure_;
      p.start = TakeEvent();
      p.end = TakeEvent();
    }
    if (p.start == nullptr || p.end == nullptr) {
      return Fail(Unavailable(std::string("cudaEventCreate failed before ") + what));
    }
    cudaEventRecord(p.start, stream_);
    const ncclResult_t r = Settle(comm_, call(), Clock::now() + timeout_);
    if (r != ncclSuccess) {
      Free(p);
      return Fail(r == ncclInProgress ? Timeout(std::string(what) + " did not start in " +
                                                std::to_string(timeout_.count()) + " ms")
                                      : NcclError(r, what));
    }
    if (cudaError_t e = cudaEventRecord(p.end, stream_); e != cudaSuccess) {
      Free(p);
      return Fail(CudaError(e, "cudaEventRecord"));
    }
    p.timed = timed;
    p.enqueued = Clock::now();
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.push_back(p);
    }
    cv_.notify_all();
    return Status::Ok();
  }

  // The watchdog: retires completed collectives (accounting their device time) and aborts the
  // communicator when the oldest has run past the timeout.
  void Watch() {
    cudaSetDevice(device_);
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      if (pending_.empty() || !failure_.ok()) {
        cv_.wait(lock, [&] { return stop_ || (!pending_.empty() && failure_.ok()); });
        continue;
      }
      const Pending p = pending_.front();
      const cudaError_t q = cudaEventQuery(p.end);
      if (q == cudaSuccess) {
        float ms = 0;
        if (p.timed && cudaEventElapsedTime(&ms, p.start, p.end) == cudaSuccess) {
          AddSeconds(ms * 1e-3);
        }
        pending_.pop_front();
        free_events_.push_back(p.start);
        free_events_.push_back(p.end);
        cv_.notify_all();
        continue;
      }
      if (q != cudaErrorNotReady) {
        failure_ = CudaError(q, "a collective's stream");
        cv_.notify_all();
        continue;
      }
      if (Clock::now() - p.enqueued > timeout_) {
        failure_ = Timeout("an NCCL collective of rank " + std::to_string(rank_) +
                           " did not complete within " + std::to_string(timeout_.count()) +
                           " ms: a peer is dead or hung");
        LOG(ERROR) << failure_.ToString() << "; aborting the NCCL communicator";
        lock.unlock();
        ncclCommAbort(comm_);  // the stream's NCCL kernels exit: the step can finish and fail
        lock.lock();
        aborted_ = true;
        cv_.notify_all();
        continue;
      }
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      lock.lock();
    }
  }

  Status Fail(Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_.ok()) failure_ = s;
    cv_.notify_all();
    return s;
  }
  cudaEvent_t TakeEvent() {
    if (!free_events_.empty()) {
      cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    if (cudaEventCreate(&e) != cudaSuccess) return nullptr;
    return e;
  }
  void Free(const Pending& p) {
    if (p.start != nullptr) cudaEventDestroy(p.start);
    if (p.end != nullptr) cudaEventDestroy(p.end);
  }

  const int rank_, world_, device_;
  const std::chrono::milliseconds timeout_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  const bool own_stream_;
  float* scratch_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  std::vector<cudaEvent_t> free_events_;
  Status failure_;
  bool stop_ = false;
  bool aborted_ = false;
  std::thread watchdog_;
};

}  // namespace

StatusOr<std::unique_ptr<comm::Communicator>> MakeNcclCommunicator(KeyValueStore* store,
                                                                   const NcclOptions& o) {
  if (store == nullptr) return InvalidArgument("NCCL rendezvous needs a store");
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    return InvalidArgument("rank " + std::to_string(o.rank) + " is outside world size " +
                           std::to_string(o.world_size));
  }
  int devices = 0;
  if (cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess) {
    return CudaError(e, "cudaGetDeviceCount");
  }
  if (o.device < 0 || o.device >= devices) {
    return Unavailable("CUDA device " + std::to_string(o.device) + " does not exist (" +
                       std::to_string(devices) + " visible)");
  }
  if (cudaError_t e = cudaSetDevice(o.device); e != cudaSuccess) {
    return CudaError(e, "cudaSetDevice");
  }
  const std::string key = o.key_prefix + "/nccl_unique_id";
  ncclUniqueId id;
  if (o.rank == 0) {
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
      return NcclError(r, "ncclGetUniqueId");
    }
    DEJA_RETURN_IF_ERROR(store->Set(key, std::string_view(id.internal, sizeof(id.internal))));
  } else {
    DEJA_ASSIGN_OR_RETURN(std::string bytes, store->Get(key, o.rendezvous_timeout));
    if (bytes.size() != sizeof(id.internal)) {
      return DataLoss("the rendezvous store holds a malformed ncclUniqueId under " + key);
    }
    std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
  }
  cudaStream_t stream = static_cast<cudaStream_t>(o.stream);
  const bool own_stream = stream == nullptr;
  if (own_stream) {
    if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        e != cudaSuccess) {
      return CudaError(e, "cudaStreamCreate");
    }
  }
  auto release_stream = [&] {
    if (own_stream) cudaStreamDestroy(stream);
  };
  float* scratch = nullptr;
  if (cudaError_t e = cudaMalloc(&scratch, sizeof(float)); e != cudaSuccess) {
    release_stream();
    return CudaError(e, "cudaMalloc");
  }
  // Non-blocking initialisation, so a rank whose peers never come is abandoned in time.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, o.world_size, id, o.rank, &config);
  if (comm != nullptr) r = Settle(comm, r, Clock::now() + o.rendezvous_timeout);
  if (r != ncclSuccess) {
    if (comm != nullptr) ncclCommAbort(comm);
    cudaFree(scratch);
    release_stream();
    if (r == ncclInProgress) {
      return Timeout("NCCL group of " + std::to_string(o.world_size) + " did not form within " +
                     std::to_string(o.rendezvous_timeout.count()) + " ms");
    }
    return NcclError(r, "ncclCommInitRankConfig");
  }
  LOG(INFO) << "rank " << o.rank << ": NCCL group of " << o.world_size << " on cuda:" << o.device
            << (own_stream ? " (own stream)" : " (compute stream)");
  return std::unique_ptr<comm::Communicator>(
      new NcclCommunicator(o, comm, stream, own_stream, scratch));
}

}  // namespace deja::worker::comm
