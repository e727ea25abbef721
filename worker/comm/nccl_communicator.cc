// NCCL implementation of the Communicator (compiled when DEJA_HAVE_NCCL). It has been compiled
// and linked on machines without a GPU; it has never run on one.
#include "worker/comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <utility>

namespace deja::worker::comm {
namespace {

Status CudaError(cudaError_t e, const char* what) {
  return Unavailable(std::string(what) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

Status NcclError(ncclResult_t r, const char* what) {
  return Unavailable(std::string(what) + ": " + ncclGetErrorString(r));
}

// Owns the NCCL communicator, its stream and a one-float scratch buffer for Barrier.
class NcclCommunicator final : public comm::Communicator {
 public:
  NcclCommunicator(int rank, int world, ncclComm_t comm, cudaStream_t stream, float* scratch)
      : rank_(rank), world_(world), comm_(comm), stream_(stream), scratch_(scratch) {}
  ~NcclCommunicator() override {
    if (comm_ != nullptr) ncclCommDestroy(comm_);
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  Status AllReduceSum(float* data, int64_t n) override {
    if (n == 0) return Status::Ok();
    return Finish(ncclAllReduce(data, data, static_cast<size_t>(n), ncclFloat, ncclSum, comm_,
                                stream_),
                  "ncclAllReduce");
  }
  Status AllGather(const float* in, int64_t n, float* out) override {
    if (n == 0) return Status::Ok();
    return Finish(ncclAllGather(in, out, static_cast<size_t>(n), ncclFloat, comm_, stream_),
                  "ncclAllGather");
  }
  Status Broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= world_) {
      return InvalidArgument("broadcast root " + std::to_string(root) + " is outside world " +
                             std::to_string(world_));
    }
    if (bytes == 0) return Status::Ok();
    return Finish(ncclBroadcast(data, data, bytes, ncclChar, root, comm_, stream_),
                  "ncclBroadcast");
  }
  Status Barrier() override { return AllReduceSum(scratch_, 1); }

 private:
  // Collectives are asynchronous; the layers read the result on the host side of the step, so
  // each call waits for its stream. A failed peer surfaces as an async NCCL error.
  Status Finish(ncclResult_t r, const char* what) {
    if (r != ncclSuccess) return NcclError(r, what);
    cudaError_t e = cudaStreamSynchronize(stream_);
    if (e != cudaSuccess) return CudaError(e, "cudaStreamSynchronize");
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess) {
      return NcclError(async, "NCCL peer");
    }
    return Status::Ok();
  }

  int rank_, world_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  float* scratch_;
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
  cudaStream_t stream = nullptr;
  if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
    return CudaError(e, "cudaStreamCreate");
  }
  float* scratch = nullptr;
  if (cudaError_t e = cudaMalloc(&scratch, sizeof(float)); e != cudaSuccess) {
    cudaStreamDestroy(stream);
    return CudaError(e, "cudaMalloc");
  }
  ncclComm_t comm = nullptr;
  if (ncclResult_t r = ncclCommInitRank(&comm, o.world_size, id, o.rank); r != ncclSuccess) {
    cudaFree(scratch);
    cudaStreamDestroy(stream);
    return NcclError(r, "ncclCommInitRank");
  }
  return std::unique_ptr<comm::Communicator>(
      new NcclCommunicator(o.rank, o.world_size, comm, stream, scratch));
}

}  // namespace deja::worker::comm
