#include "worker/comm/staged_communicator.h"

#include <vector>

#include "worker/comm/timed_communicator.h"

namespace deja::worker::comm {
namespace {

class StagedCommunicator final : public TimedCommunicator {
 public:
  StagedCommunicator(kernels::Backend* backend, std::unique_ptr<Communicator> host)
      : backend_(backend), host_(std::move(host)) {}

  int rank() const override { return host_->rank(); }
  int world_size() const override { return host_->world_size(); }
  bool device_memory() const override { return true; }

  Status AllGather(const float* in, int64_t n, float* out) override {
    if (n == 0) return Status::Ok();
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    Grow(static_cast<size_t>(n) * (1 + world_size()));
    DEJA_RETURN_IF_ERROR(backend_->CopyDeviceToHost(buf_.data(), in, bytes));
    DEJA_RETURN_IF_ERROR(host_->AllGather(buf_.data(), n, buf_.data() + n));
    return backend_->CopyHostToDevice(out, buf_.data() + n, bytes * world_size());
  }
  Status Broadcast(void* data, size_t bytes, int root) override {
    if (bytes == 0) return host_->Broadcast(data, 0, root);
    Grow((bytes + sizeof(float) - 1) / sizeof(float));
    DEJA_RETURN_IF_ERROR(backend_->CopyDeviceToHost(buf_.data(), data, bytes));
    DEJA_RETURN_IF_ERROR(host_->Broadcast(buf_.data(), bytes, root));
    return backend_->CopyHostToDevice(data, buf_.data(), bytes);
  }
  Status Barrier() override { return host_->Barrier(); }

 protected:
  Status DoAllReduceSum(float* data, int64_t n) override {
    if (n == 0 || world_size() == 1) return Status::Ok();
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    Grow(static_cast<size_t>(n));
    DEJA_RETURN_IF_ERROR(backend_->CopyDeviceToHost(buf_.data(), data, bytes));
    DEJA_RETURN_IF_ERROR(host_->AllReduceSum(buf_.data(), n));
    return backend_->CopyHostToDevice(data, buf_.data(), bytes);
  }

 private:
  void Grow(size_t floats) {
    if (buf_.size() < floats) buf_.resize(floats);
  }

  kernels::Backend* backend_;
  std::unique_ptr<Communicator> host_;
  std::vector<float> buf_;  // grown to the largest call, reused
};

}  // namespace

std::unique_ptr<Communicator> MakeStagedCommunicator(kernels::Backend* backend,
                                                     std::unique_ptr<Communicator> host) {
  return std::make_unique<StagedCommunicator>(backend, std::move(host));
}

}  // namespace deja::worker::comm
