// Backend: owns memory, threads/streams and the op table of one device kind. Ops are free
// functions (ops.h) that dispatch through the table of the backend they are given. A backend
// declares which (op, weight dtype) pairs it supports; the test harness runs every supported
// pair against the reference backend.
//
// Memory. Every tensor an op takes is in the memory of the backend's device(): the views say so
// (TensorView::device, KvView::device) and the ops refuse others by name. Host backends (the
// reference and the CPU backend) take host memory; the CUDA backend takes its device's memory,
// which Allocate and ToBackend hand out. The index arrays the ops validate on the host (Embedding
// ids, Attention q_pos and head_ids, the gathers' rows, KvWrite's slots and positions) are host
// pointers on every backend.
//
// Ordering. A device backend may enqueue an op and return before it has run; the copies to the
// host below wait for it, and Synchronize waits for everything enqueued and reports the first
// asynchronous error. Host backends run each op to completion before returning.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "common/device.h"
#include "common/status.h"
#include "common/tensor.h"
#include "kernels/op_table.h"

namespace deja {
class ThreadPool;
}

namespace deja::kernels {

enum class BackendKind { kReference, kCpu, kCuda };

// Ops recorded on a backend by BeginCapture / EndCapture (a CUDA graph), replayed by Replay with
// the arguments they were given: the same pointers and sizes, reading whatever the memory they
// point at holds at replay time.
class OpGraph {
 public:
  virtual ~OpGraph() = default;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const = 0;
  virtual std::string name() const = 0;
  virtual const OpTable& ops() const = 0;
  virtual bool Supports(OpId op, DType weight_dtype) const = 0;
  // Whether `op` accepts weights in Layout::kTiled16 (bf16 only; Linear and Embedding at most).
  virtual bool SupportsTiled(OpId) const { return false; }
  // Whether Linear reads weights of this dtype fastest tiled: the model then tiles its layers'
  // matrices at load (worker/model/opt_weights.h TileMatrices).
  virtual bool PrefersTiled(DType) const { return false; }
  // Worker threads for CPU backends (nullptr elsewhere).
  virtual ThreadPool* pool() const { return nullptr; }
  // A backend on the same device for work overlapped with this one's (the Deja Vu predictors run
  // on it while the model computes a block): the CPU backend gives one with a thread of its own,
  // the CUDA backend gives one on a second stream of the same device (ordered with OrderBefore).
  // nullptr when there is none: the side work then runs inline on this backend.
  virtual std::unique_ptr<Backend> MakeSideBackend() const { return nullptr; }

  // Where this backend's ops read and write tensors.
  virtual Device device() const = 0;
  // Uninitialised memory for a row-major `dtype` x `shape` tensor on device(). The defaults here
  // are the host backends' (aligned host memory, memcpy); a device backend overrides all four.
  virtual StatusOr<Tensor> Allocate(DType dtype, Shape shape);
  // `bytes` from host memory to memory on device(), and back. Both wait for the work enqueued
  // before them and for the copy itself, so the host side may be reused or read at once.
  virtual Status CopyHostToDevice(void* dst, const void* host_src, size_t bytes);
  virtual Status CopyDeviceToHost(void* host_dst, const void* src, size_t bytes);
  // Waits for all enqueued work; reports the first asynchronous error.
  virtual Status Synchronize();
  // Sets `bytes` bytes at dst (on device()) to `value`, in stream order.
  virtual Status Memset(void* dst, int value, size_t bytes);
  // Host memory the device copies from fastest (page-locked on CUDA), for staging uploads.
  virtual StatusOr<Tensor> AllocatePinned(size_t bytes);
  // Free and total bytes of device() memory; Unimplemented on host backends.
  virtual Status MemoryInfo(size_t* free_bytes, size_t* total_bytes);
  // Whether Attention, KvWrite and KvEvict read paged KvViews (KvView::blocks).
  virtual bool SupportsPagedKv() const { return false; }
  // The stream the ops run on (a cudaStream_t on CUDA), for libraries that enqueue work in the
  // same order (NCCL's collectives); nullptr on host backends.
  virtual void* native_stream() const { return nullptr; }
  // Orders the work `other` enqueues from now on after the work this backend has enqueued so far
  // (two streams of one device: an event recorded on this stream, waited for on the other's).
  // Host backends run their ops synchronously: nothing to order.
  virtual Status OrderBefore(Backend& other) { return Status::Ok(); }
  // Opens (on) or closes a profiler's capture range: cudaProfilerStart/Stop on CUDA, which
  // `ncu --profile-from-start off` and `nsys --capture-range cudaProfilerApi` follow; nothing on
  // host backends.
  virtual void SetProfiling(bool on) { (void)on; }

  // Graph capture (CUDA graphs; the simulated device records closures). Between BeginCapture and
  // EndCapture the ops given to this backend are recorded, not run; Replay runs the recording
  // again on the stream. What may not be captured, on every backend that captures: copies to or
  // from the host, Synchronize, Allocate, and ops given host index arrays (Embedding's host ids,
  // Attention, the gathers, KvWrite, MaskUnits: their arrays are staged when the op is called).
  // Such a call fails, and so does EndCapture after it: the capture is then discarded. EndCapture
  // must follow every BeginCapture, failed ops or not. Host backends do not capture.
  virtual bool SupportsGraphs() const { return false; }
  virtual Status BeginCapture() { return Unimplemented(name() + " does not capture op graphs"); }
  virtual StatusOr<std::unique_ptr<OpGraph>> EndCapture() {
    return Unimplemented(name() + " does not capture op graphs");
  }
  virtual Status Replay(OpGraph& graph) {
    (void)graph;
    return Unimplemented(name() + " does not replay op graphs");
  }
  // Changes whenever the backend reallocates memory its ops use behind the caller's back (its
  // scratch workspaces): graphs captured under an older value may point at freed memory and must
  // be captured again.
  virtual uint64_t graph_epoch() const { return 0; }

  // Batch-invariant kernels: each output row computed as if it were the call's only row (no
  // kernel or summation order chosen by the call's row count; on the CPU the f16 and f32
  // row-major Linears, the transposed gathers and the retaining heads then stay on the
  // streaming kernels instead of BLAS). The other kernels are batch-invariant already, but
  // attention over many queries (AttentionArgs::per_query). The model sets it at load on the
  // CPU, and on any backend with an int8 KV cache. Every later call on this backend sees it.
  void set_batch_invariant(bool on) { batch_invariant_ = on; }
  bool batch_invariant() const { return batch_invariant_; }

  // A copy on device() of the row-major host view `host` (of the tensor).
  StatusOr<Tensor> ToBackend(const TensorView& host);
  StatusOr<Tensor> ToBackend(const Tensor& host) { return ToBackend(host.view()); }
  // A host copy of the row-major view `v`, in device() or host memory.
  StatusOr<Tensor> ToHost(const TensorView& v);

 private:
  bool batch_invariant_ = false;
};

// The plain, single-threaded reference implementations: the ground truth in tests.
std::unique_ptr<Backend> MakeReferenceBackend();
// The reference's op table (host memory): a host backend starts from it and overrides the ops
// it speeds up, so a new op runs on the CPU from its reference on.
const OpTable& ReferenceOpTable();
// The fast CPU backend (SIMD with runtime dispatch, a thread pool, OpenBLAS for large GEMMs).
// threads <= 0 means one per available core.
std::unique_ptr<Backend> MakeCpuBackend(int threads = 0);
// The CUDA backend, or Unavailable with the reason (not built, no device).
StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device);

// A device's two ceilings, measured on it (for benchmarks' floors): a large device-to-device copy
// (bytes read plus bytes written per second) and a large bf16 GEMM with f32 accumulation (FLOP/s,
// random inputs). Unimplemented on host backends (the CPU's are in kernels/cpu/bandwidth.h).
struct DevicePeaks {
  double copy_bytes_per_s = 0;
  double bf16_gemm_flops_per_s = 0;
};
StatusOr<DevicePeaks> MeasureDevicePeaks(Backend& backend);

}  // namespace deja::kernels
