#include "worker/comm/gloo_communicator.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <csignal>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "worker/comm/timed_communicator.h"

namespace deja::worker::comm {
namespace {

// Gloo's view of our store. Gloo's interface cannot return errors, so failures are thrown as
// gloo::IoException and caught in MakeGlooCommunicator like Gloo's own.
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  StoreAdapter(KeyValueStore& store, std::string prefix, std::chrono::milliseconds timeout)
      : store_(store), prefix_(std::move(prefix) + "/"), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Throw(store_.Set(prefix_ + key, std::string_view(data.data(), data.size())));
  }

  std::vector<char> get(const std::string& key) override {
    StatusOr<std::string> v = store_.Get(prefix_ + key, timeout_);
    Throw(v.status());
    return std::vector<char>(v->begin(), v->end());
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full;
    for (const std::string& k : keys) full.push_back(prefix_ + k);
    Throw(store_.Wait(full, timeout.count() > 0 ? timeout : timeout_));
  }

 private:
  static void Throw(const Status& s) {
    if (!s.ok()) throw gloo::IoException("rendezvous store: " + s.ToString());
  }

  KeyValueStore& store_;
  const std::string prefix_;
  const std::chrono::milliseconds timeout_;
};

// Runs a Gloo call, turning whatever it throws into a Status.
Status Guard(const char* what, const std::function<void()>& call) {
  try {
    call();
    return Status::Ok();
  } catch (const gloo::IoException& e) {
    // Closed sockets (a dead peer) and Gloo's own timeouts both land here.
    return Unavailable(std::string("gloo ") + what + ": " + e.what());
  } catch (const gloo::Exception& e) {
    return Unavailable(std::string("gloo ") + what + ": " + e.what());
  } catch (const std::exception& e) {
    // GLOO_ENFORCE failures (gloo::EnforceNotMet) and allocation failures.
    return Internal(std::string("gloo ") + what + ": " + e.what());
  }
}

class GlooCommunicator final : public TimedCommunicator {
 public:
  GlooCommunicator(std::shared_ptr<gloo::transport::Device> device,
                   std::shared_ptr<gloo::rendezvous::Context> context)
      : device_(std::move(device)), context_(std::move(context)) {}

  int rank() const override { return context_->rank; }
  int world_size() const override { return context_->size; }

  Status AllGather(const float* in, int64_t n, float* out) override {
    if (n < 0) return InvalidArgument("all-gather of a negative count");
    if (n == 0) return Status::Ok();
    return Run("all-gather", [&] {
      gloo::AllgatherOptions opts(context_);
      opts.setInput(const_cast<float*>(in), static_cast<size_t>(n));
      opts.setOutput(out, static_cast<size_t>(n) * context_->size);
      opts.setTag(NextTag());
      gloo::allgather(opts);
    });
  }

  Status Broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= context_->size) {
      return InvalidArgument("broadcast root " + std::to_string(root) + " is outside world size " +
                             std::to_string(context_->size));
    }
    if (bytes == 0) return Status::Ok();
    return Run("broadcast", [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(static_cast<uint8_t*>(data), bytes);
      opts.setRoot(root);
      opts.setTag(NextTag());
      gloo::broadcast(opts);
    });
  }

  Status Barrier() override {
    return Run("barrier", [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTag(NextTag());
      gloo::barrier(opts);
    });
  }

 protected:
  Status DoAllReduceSum(float* data, int64_t n) override {
    if (n < 0) return InvalidArgument("all-reduce of a negative count");
    if (n == 0) return Status::Ok();
    return Run("all-reduce", [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(data, static_cast<size_t>(n));
      opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      opts.setTag(NextTag());
      gloo::allreduce(opts);
    });
  }

 private:
  // Every rank issues the same collectives in the same order, so a counter gives each one the
  // same tag everywhere and messages of consecutive collectives never match each other.
  uint32_t NextTag() { return tag_++; }

  Status Run(const char* what, const std::function<void()>& call) {
    if (!failure_.ok()) return failure_;
    Status s = Guard(what, call);
    if (!s.ok()) {
      failure_ = Status(s.code(), "rank " + std::to_string(context_->rank) + ": " + s.message() +
                                      " (the group must be rebuilt)");
      return failure_;
    }
    return s;
  }

  // Declared before the context so the context (which holds pairs on the device) goes first.
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  uint32_t tag_ = 0;
  Status failure_;
};

}  // namespace

StatusOr<std::unique_ptr<comm::Communicator>> MakeGlooCommunicator(KeyValueStore& store,
                                                                   const GlooOptions& options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return InvalidArgument("gloo: rank " + std::to_string(options.rank) +
                           " is outside world size " + std::to_string(options.world_size));
  }
  if (options.timeout.count() <= 0) return InvalidArgument("gloo: timeout must be positive");
  // A peer that dies mid-send turns our next write into SIGPIPE, which would kill this process
  // instead of surfacing as an error; the write's EPIPE is what Gloo reports.
  // A handler the process installed itself is left alone.
  struct sigaction current = {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    std::signal(SIGPIPE, SIG_IGN);
  }

  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
  Status s = Guard("rendezvous", [&] {
    gloo::transport::tcp::attr attr;
    if (!options.iface.empty()) {
      attr.iface = options.iface;
    } else {
      attr.hostname = options.hostname;
    }
    device = gloo::transport::tcp::CreateDevice(attr);
    context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.world_size);
    context->setTimeout(options.timeout);
    StoreAdapter adapter(store, options.key_prefix, options.timeout);
    context->connectFullMesh(adapter, device);
  });
  if (!s.ok()) {
    return Status(s.code(), s.message() + " (rank " + std::to_string(options.rank) + " of " +
                                std::to_string(options.world_size) + ")");
  }
  LOG(INFO) << "gloo rank " << options.rank << "/" << options.world_size << " connected on "
            << device->str();
  return std::unique_ptr<comm::Communicator>(
      std::make_unique<GlooCommunicator>(std::move(device), std::move(context)));
}

}  // namespace deja::worker::comm
