#include "tests/common/sim_device.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>

#include "kernels/op_table.h"

namespace deja::test_util {
namespace {

using kernels::Backend;
using kernels::OpTable;

// All simulated device memory: one reserved range of address space (no access until opened),
// handed out first-fit in whole pages, so opening and closing it is one mprotect each (and one
// per gap between allocations). Shared by
// every simulated backend of the process, never destroyed.
class Arena {
 public:
  static constexpr size_t kBytes = size_t{4} << 30;

  Arena() {
    page_ = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    base_ = static_cast<char*>(
        ::mmap(nullptr, kBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    if (base_ == MAP_FAILED) base_ = nullptr;
    if (base_ != nullptr) free_[0] = kBytes;
  }
  // nullptr when it does not fit.
  void* Take(size_t bytes) {
    const size_t len = (std::max<size_t>(bytes, 1) + page_ - 1) / page_ * page_;
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < len) continue;
      const size_t off = it->first, rest = it->second - len;
      free_.erase(it);
      if (rest > 0) free_[off + len] = rest;
      used_[off] = len;
      if (open_depth_ > 0) ::mprotect(base_ + off, len, PROT_READ | PROT_WRITE);
      return base_ + off;
    }
    return nullptr;
  }
  // Freed memory is not handed out again at once: it waits closed in a quarantine of up to
  // kQuarantineBytes (address space only: its pages are dropped), so a stale pointer into it
  // faults rather than reading whatever took its place.
  static constexpr size_t kQuarantineBytes = size_t{512} << 20;
  void Give(void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = used_.find(static_cast<char*>(p) - base_);
    if (it == used_.end()) return;
    const size_t freed_off = it->first, freed_len = it->second;
    used_.erase(it);
    ::madvise(base_ + freed_off, freed_len, MADV_DONTNEED);  // no old data for the next user
    if (open_depth_ > 0) ::mprotect(base_ + freed_off, freed_len, PROT_NONE);
    quarantine_.push_back({freed_off, freed_len});
    quarantined_ += freed_len;
    while (quarantined_ > kQuarantineBytes) {
      const auto [off, len] = quarantine_.front();
      quarantine_.pop_front();
      quarantined_ -= len;
      Release(off, len);
    }
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    if (open_depth_++ == 0) Protect(PROT_READ | PROT_WRITE);
  }
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--open_depth_ == 0) Protect(PROT_NONE);
  }

 private:
  // Back to the free list, merged with its free neighbours.
  void Release(size_t off, size_t len) {
    auto next = free_.lower_bound(off);          // merge with the neighbours
    if (next != free_.end() && next->first == off + len) {
      len += next->second;
      free_.erase(next);
    }
    auto prev = free_.lower_bound(off);
    if (prev != free_.begin()) {
      --prev;
      if (prev->first + prev->second == off) {
        off = prev->first;
        len += prev->second;
        free_.erase(prev);
      }
    }
    free_[off] = len;
  }

  // Only the span that holds allocations. Opening leaves the gaps between allocations (free or
  // quarantined memory) closed, so an op that reads or writes memory freed since its pointer was
  // taken (a stale pointer, as a replayed graph's after a reallocation) dies there too.
  void Protect(int prot) {
    if (used_.empty()) return;
    const size_t end = used_.rbegin()->first + used_.rbegin()->second;
    ::mprotect(base_, end, prot);
    if (prot == PROT_NONE) return;
    size_t at = 0;
    for (const auto& [off, len] : used_) {
      if (off > at) ::mprotect(base_ + at, off - at, PROT_NONE);
      at = off + len;
    }
  }

  std::mutex mu_;
  size_t page_ = 4096;
  char* base_ = nullptr;
  std::map<size_t, size_t> free_, used_;  // offset -> length
  std::deque<std::pair<size_t, size_t>> quarantine_;  // (offset, length), oldest first
  size_t quarantined_ = 0;
  int open_depth_ = 0;
};

Arena& TheArena() {
  static Arena* a = new Arena;
  return *a;
}

// Opens device memory for one scope (an op or a copy).
struct Opened {
  Opened() { TheArena().Open(); }
  ~Opened() { TheArena().Close(); }
};

void FreeRegion(void* p) { TheArena().Give(p); }

// The backends whose ops do the work: the CPU backend's for the dense ops (fast; they get the CPU
// backend itself, with its thread pool), the reference for the ones that read paged KV views and
// for conversions. Shared by every simulated backend of the process, never destroyed.
enum class Inner { kCpu, kReference };
Backend& InnerBackend(Inner which) {
  static Backend* cpu = kernels::MakeCpuBackend(2).release();
  static Backend* ref = kernels::MakeReferenceBackend().release();
  return which == Inner::kCpu ? *cpu : *ref;
}

// Which backend runs an op on the simulated device: the reference for attention (one sequence
// or a decode step's), the KV ops,
// conversions and unit masks (their paged-view code is the reference's), the CPU backend (fast)
// for the rest.
constexpr Inner InnerFor(kernels::OpId op) {
  using kernels::OpId;
  return op == OpId::kAttention || op == OpId::kKvWrite || op == OpId::kKvEvict ||
                 op == OpId::kDecodeAttention || op == OpId::kDecodeEvict || op == OpId::kConvert ||
                 op == OpId::kMaskUnits
             ? Inner::kReference
             : Inner::kCpu;
}

// Graph capture on the simulated device (SimDeviceBackend below): while a backend captures, its
// ops are recorded as closures over their arguments (pointers and sizes, as a CUDA graph's kernel
// nodes hold them) and run again by Replay, reading the memory as it is then.
struct Capture {
  bool on = false;
  Status error;  // the first call that cannot be captured
  std::vector<std::function<Status()>> ops;
};
Capture& CaptureOf(Backend& b);

// Whether an op's call stages host arrays (as the CUDA backend copies them to the device when the
// op is called): such a call cannot be captured, since a replay would read the array of the
// capture, long gone.
template <auto A, auto B>
constexpr bool Same() {
  if constexpr (std::is_same_v<decltype(A), decltype(B)>) {
    return A == B;
  } else {
    return false;
  }
}
template <auto Member, typename... A>
bool StagesHostArrays(const A&... args) {
  if constexpr (Same<Member, &OpTable::embedding>()) {
    return !std::get<2>(std::tie(args...));  // (table, ids, ids_on_device, ...)
  } else {
    return Same<Member, &OpTable::attention>() || Same<Member, &OpTable::gather_linear>() ||
           Same<Member, &OpTable::gather_linear_t>() || Same<Member, &OpTable::kv_write>() ||
           Same<Member, &OpTable::mask_units>();
  }
}

// One trampoline per op: the inner backend's function with device memory opened around it, or
// its recording while the backend captures.
template <typename Fn, Fn OpTable::*Member, Inner Which>
struct Wrap;
template <typename R, typename... A, R (*OpTable::*Member)(Backend&, A...), Inner Which>
struct Wrap<R (*)(Backend&, A...), Member, Which> {
  static R Run(A... args) {
    Opened open;
    Backend& inner = InnerBackend(Which);
    return (inner.ops().*Member)(inner, args...);
  }
  static R Call(Backend& self, A... args) {
    Capture& capture = CaptureOf(self);
    if (!capture.on) return Run(args...);
    if (StagesHostArrays<Member>(args...)) {
      Status refused = FailedPrecondition(std::string("sim device: ") + self.name() +
                                          " cannot capture an op given host index arrays");
      if (capture.error.ok()) capture.error = refused;
      return refused;
    }
    capture.ops.push_back([=]() { return Run(args...); });
    return Status::Ok();
  }
};

// A recording: the closures, run in order.
class SimGraph final : public kernels::OpGraph {
 public:
  explicit SimGraph(std::vector<std::function<Status()>> ops) : ops_(std::move(ops)) {}
  Status Run() const {
    for (const auto& op : ops_) DEJA_RETURN_IF_ERROR(op());
    return Status::Ok();
  }

 private:
  std::vector<std::function<Status()>> ops_;
};

class SimDeviceBackend final : public Backend {
 public:
  explicit SimDeviceBackend(size_t memory) : memory_(memory) {
#define DEJA_SIM_INSTALL(id, member, fn, dtypes) \
  Install<kernels::fn, &OpTable::member, InnerFor(kernels::OpId::id)>();
    DEJA_KERNEL_OPS(DEJA_SIM_INSTALL)
#undef DEJA_SIM_INSTALL
  }
  kernels::BackendKind kind() const override { return kernels::BackendKind::kReference; }
  std::string name() const override { return "sim"; }
  Device device() const override { return Device{DeviceKind::kSim, 0}; }
  const OpTable& ops() const override { return table_; }
  bool Supports(kernels::OpId op, DType dtype) const override {
    return kernels::SupportedByFullBackend(op, dtype);
  }
  bool SupportsPagedKv() const override { return true; }

  bool SupportsGraphs() const override { return true; }
  Status BeginCapture() override {
    if (capture_.on) return FailedPrecondition("sim device: already capturing");
    capture_ = Capture{};
    capture_.on = true;
    return Status::Ok();
  }
  StatusOr<std::unique_ptr<kernels::OpGraph>> EndCapture() override {
    if (!capture_.on) return FailedPrecondition("sim device: not capturing");
    Capture done = std::move(capture_);
    capture_ = Capture{};
    if (!done.error.ok()) return done.error;
    return std::unique_ptr<kernels::OpGraph>(std::make_unique<SimGraph>(std::move(done.ops)));
  }
  Status Replay(kernels::OpGraph& graph) override {
    if (capture_.on) return Refuse("Replay");
    auto* g = dynamic_cast<SimGraph*>(&graph);
    if (g == nullptr) return InvalidArgument("sim device: the graph was not captured here");
    return g->Run();
  }
  Capture& capture() { return capture_; }

  StatusOr<Tensor> Allocate(DType dtype, Shape shape) override {
    if (capture_.on) return Refuse("Allocate");
    const size_t bytes = static_cast<size_t>(shape.numel()) * DTypeSize(dtype);
    void* p = TheArena().Take(bytes);
    if (p == nullptr) {
      return ResourceExhausted("sim device: no room for " + std::to_string(bytes) + " bytes");
    }
    {
      // Fresh device memory is garbage, never zeros: floats read as NaN, int32 (positions, block
      // tables) as 0, a valid-looking slot position or block, so a missing initialisation shows.
      Opened open;
      std::memset(p, dtype == DType::kI32 ? 0 : 0xff, bytes);
    }
    return Tensor::Adopt(p, dtype, shape, device(), &FreeRegion);
  }
  Status CopyHostToDevice(void* dst, const void* src, size_t bytes) override {
    if (capture_.on) return Refuse("CopyHostToDevice");
    Opened open;
    if (bytes > 0) std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
  Status CopyDeviceToHost(void* dst, const void* src, size_t bytes) override {
    if (capture_.on) return Refuse("CopyDeviceToHost");
    Opened open;
    if (bytes > 0) std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
  Status Memset(void* dst, int value, size_t bytes) override {
    auto set = [dst, value, bytes]() {
      Opened open;
      if (bytes > 0) std::memset(dst, value, bytes);
      return Status::Ok();
    };
    if (!capture_.on) return set();
    capture_.ops.push_back(set);  // cudaMemsetAsync is captured
    return Status::Ok();
  }
  Status Synchronize() override { return capture_.on ? Refuse("Synchronize") : Status::Ok(); }
  Status MemoryInfo(size_t* free_bytes, size_t* total_bytes) override {
    *free_bytes = memory_;
    *total_bytes = memory_;
    return Status::Ok();
  }

 private:
  template <typename Fn, Fn OpTable::*Member, Inner Which>
  void Install() {
    table_.*Member = &Wrap<Fn, Member, Which>::Call;
  }

  // What CUDA refuses during stream capture; the capture fails with it.
  Status Refuse(const char* what) {
    Status refused = FailedPrecondition(std::string("sim device: ") + what +
                                        " during graph capture");
    if (capture_.on && capture_.error.ok()) capture_.error = refused;
    return refused;
  }

  size_t memory_;
  OpTable table_;
  Capture capture_;
};

Capture& CaptureOf(Backend& b) { return static_cast<SimDeviceBackend&>(b).capture(); }

}  // namespace

std::unique_ptr<kernels::Backend> MakeSimDeviceBackend(size_t memory_bytes) {
  return std::make_unique<SimDeviceBackend>(memory_bytes);
}

StatusOr<std::unique_ptr<kernels::Backend>> MakeTestBackend(const std::string& device) {
  if (device == "cpu") return kernels::MakeCpuBackend(2);
  if (device == "sim") return MakeSimDeviceBackend();
  if (device == "cuda") return kernels::MakeCudaBackend(0);
  return InvalidArgument("unknown test device " + device);
}

}  // namespace deja::test_util
