// The CUDA backend: MakeCudaBackend (Unavailable with the runtime's reason when there is no
// usable device) and the backend object owning the per-device context, its op table and its
// memory (cudaMalloc'd tensors, pinned host staging memory, copies and memsets on its stream).
#include "kernels/cuda/cuda_backend.h"

#include <algorithm>
#include <string>
#include <utility>
#include <cuda_profiler_api.h>

#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/launch.h"

namespace deja::kernels {
namespace cuda {
namespace {

// cuBLAS's recommended workspace for Hopper; ample for Ampere.
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

// A failing free (a dead context) leaves nothing to recover; the memory goes with the context.
void FreeDevice(void* data) { cudaFree(data); }
void FreePinned(void* data) { cudaFreeHost(data); }

// A captured stream's graph and its executable form.
class CudaGraph final : public OpGraph {
 public:
  CudaGraph(cudaGraph_t graph, cudaGraphExec_t exec) : graph_(graph), exec_(exec) {}
  ~CudaGraph() override {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
    if (graph_ != nullptr) cudaGraphDestroy(graph_);
  }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  cudaGraphExec_t exec() const { return exec_; }

 private:
  cudaGraph_t graph_;
  cudaGraphExec_t exec_;
};

class CudaBackendImpl final : public CudaBackend {
 public:
  CudaBackendImpl(CudaContext ctx, std::string device_name)
      : ctx_(std::move(ctx)),
        name_("cuda:" + std::to_string(ctx_.device) + " (" + device_name + ")") {
    table_.embedding = CudaEmbedding;
    table_.layer_norm = CudaLayerNorm;
    table_.linear = CudaLinear;
    table_.attention = CudaAttention;
    table_.add = CudaAdd;
    table_.log_softmax = CudaLogSoftmax;
    table_.top_k = CudaTopK;
    table_.gather_linear = CudaGatherLinear;
    table_.gather_linear_t = CudaGatherLinearT;
    table_.kv_write = CudaKvWrite;
    table_.kv_evict = CudaKvEvict;
    table_.convert = CudaConvert;
    table_.mask_units = CudaMaskUnits;
    table_.retain_scores = CudaRetainScores;
    table_.decode_attention = CudaDecodeAttention;
    table_.decode_evict = CudaDecodeEvict;
  }

  BackendKind kind() const override { return BackendKind::kCuda; }
  std::string name() const override { return name_; }
  const OpTable& ops() const override { return table_; }
  bool Supports(OpId op, DType dtype) const override {
    // int4 weights only in Linear (linear_i4.cu; the model does not upload int4 yet, so a
    // model refuses --dtype int4 on a GPU at load); int8 KV caches have no CUDA kernels yet
    // (--kv-dtype int8 is refused there at load).
    const bool kv_op = op == OpId::kAttention || op == OpId::kKvWrite ||
                       op == OpId::kKvEvict || op == OpId::kDecodeAttention ||
                       op == OpId::kDecodeEvict;
    if ((dtype == DType::kI4 && op != OpId::kLinear) || (kv_op && dtype == DType::kI8)) {
      return false;
    }
    return SupportedByFullBackend(op, dtype) && HasSlot(table_, op);
  }
  bool SupportsPagedKv() const override { return true; }
  void* native_stream() const override { return ctx_.stream.get(); }

  // Another backend of this device, with its own stream, handles and workspaces.
  std::unique_ptr<Backend> MakeSideBackend() const override {
    StatusOr<std::unique_ptr<Backend>> side = MakeCudaBackend(ctx_.device);
    return side.ok() ? std::move(*side) : nullptr;
  }

  void SetProfiling(bool on) override {
    if (Enter().ok()) {
      const cudaError_t e = on ? cudaProfilerStart() : cudaProfilerStop();
      if (e != cudaSuccess) LOG(WARNING) << name_ << ": profiler range: " << cudaGetErrorString(e);
    }
  }

  // Stream capture in thread-local mode: only this thread's calls on the stream are recorded, and
  // an illegal call during capture (a synchronous copy, a synchronize, a cudaMalloc) fails there
  // and invalidates the capture, which EndCapture then reports.
  bool SupportsGraphs() const override { return true; }
  Status BeginCapture() override {
    DEJA_RETURN_IF_ERROR(Enter());
    return CudaStatus(cudaStreamBeginCapture(ctx_.stream.get(), cudaStreamCaptureModeThreadLocal),
                      "cudaStreamBeginCapture");
  }
  StatusOr<std::unique_ptr<OpGraph>> EndCapture() override {
    DEJA_RETURN_IF_ERROR(Enter());
    cudaGraph_t graph = nullptr;
    const cudaError_t e = cudaStreamEndCapture(ctx_.stream.get(), &graph);
    if (e != cudaSuccess) {
      if (graph != nullptr) cudaGraphDestroy(graph);
      cudaGetLastError();  // the capture's failure is reported here, not by the next call
      return CudaStatus(e, "cudaStreamEndCapture");
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t ie = cudaGraphInstantiate(&exec, graph, 0);
    if (ie != cudaSuccess) {
      cudaGraphDestroy(graph);
      return CudaStatus(ie, "cudaGraphInstantiate");
    }
    return std::unique_ptr<OpGraph>(std::make_unique<CudaGraph>(graph, exec));
  }
  Status Replay(OpGraph& graph) override {
    DEJA_RETURN_IF_ERROR(Enter());
    auto* g = dynamic_cast<CudaGraph*>(&graph);
    if (g == nullptr) return InvalidArgument(name_ + ": the graph was not captured on CUDA");
    return CudaStatus(cudaGraphLaunch(g->exec(), ctx_.stream.get()), "cudaGraphLaunch");
  }
  uint64_t graph_epoch() const override { return Workspace::Reallocations(); }

  Status OrderBefore(Backend& other) override {
    if (other.native_stream() == nullptr) return Synchronize();  // a host backend: wait here
    DEJA_RETURN_IF_ERROR(Enter());
    if (order_.get() == nullptr) {
      DEJA_ASSIGN_OR_RETURN(order_, Event::Create());
    }
    DEJA_RETURN_IF_ERROR(order_.Record(ctx_.stream.get()));
    return CudaStatus(
        cudaStreamWaitEvent(static_cast<cudaStream_t>(other.native_stream()), order_.get(), 0),
        "cudaStreamWaitEvent");
  }

  Device device() const override { return Device::Cuda(ctx_.device); }

  StatusOr<Tensor> Allocate(DType dtype, Shape shape) override {
    DEJA_RETURN_IF_ERROR(Enter());
    // At least a byte, so an empty tensor still owns a distinct (non-null) allocation, as host
    // tensors do.
    const size_t bytes = std::max<size_t>(1, static_cast<size_t>(shape.numel()) * DTypeSize(dtype));
    void* data = nullptr;
    DEJA_CUDA_RETURN_IF_ERROR(cudaMalloc(&data, bytes),
                              ("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str());
    return Tensor::Adopt(data, dtype, shape, device(), &FreeDevice);
  }

  Status CopyHostToDevice(void* dst, const void* host_src, size_t bytes) override {
    return Copy(dst, host_src, bytes, cudaMemcpyHostToDevice, "copy to device");
  }

  Status CopyDeviceToHost(void* host_dst, const void* src, size_t bytes) override {
    return Copy(host_dst, src, bytes, cudaMemcpyDeviceToHost, "copy to host");
  }

  Status Synchronize() override {
    DEJA_RETURN_IF_ERROR(Enter());
    return CudaStatus(cudaStreamSynchronize(ctx_.stream.get()), "cudaStreamSynchronize");
  }

  Status Memset(void* dst, int value, size_t bytes) override {
    if (bytes == 0) return Status::Ok();
    DEJA_RETURN_IF_ERROR(Enter());
    return CudaStatus(cudaMemsetAsync(dst, value, bytes, ctx_.stream.get()), "cudaMemsetAsync");
  }

  // Page-locked host memory as f32 elements (rounded up, at least one), as the host default.
  StatusOr<Tensor> AllocatePinned(size_t bytes) override {
    DEJA_RETURN_IF_ERROR(Enter());
    const int64_t elems = std::max<int64_t>(1, static_cast<int64_t>((bytes + 3) / 4));
    void* data = nullptr;
    DEJA_CUDA_RETURN_IF_ERROR(cudaMallocHost(&data, static_cast<size_t>(elems) * sizeof(float)),
                              ("cudaMallocHost of " + std::to_string(bytes) + " bytes").c_str());
    return Tensor::Adopt(data, DType::kF32, Shape{elems}, Device::Host(), &FreePinned);
  }

  Status MemoryInfo(size_t* free_bytes, size_t* total_bytes) override {
    DEJA_RETURN_IF_ERROR(Enter());
    return CudaStatus(cudaMemGetInfo(free_bytes, total_bytes), "cudaMemGetInfo");
  }

  StatusOr<float> TimeMs(const std::function<Status()>& enqueue) override {
    DEJA_RETURN_IF_ERROR(Enter());
    DEJA_ASSIGN_OR_RETURN(Event start, Event::Create());
    DEJA_ASSIGN_OR_RETURN(Event stop, Event::Create());
    DEJA_RETURN_IF_ERROR(start.Record(ctx_.stream.get()));
    DEJA_RETURN_IF_ERROR(enqueue());
    DEJA_RETURN_IF_ERROR(stop.Record(ctx_.stream.get()));
    DEJA_RETURN_IF_ERROR(stop.Synchronize());
    return stop.MillisecondsSince(start);
  }

  CudaContext& context() { return ctx_; }

 private:
  Status Enter() { return CudaStatus(cudaSetDevice(ctx_.device), "cudaSetDevice"); }

  Status Copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, const char* what) {
    if (bytes == 0) return Status::Ok();
    DEJA_RETURN_IF_ERROR(Enter());
    DEJA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, kind, ctx_.stream.get()), what);
    return CudaStatus(cudaStreamSynchronize(ctx_.stream.get()), what);
  }

  CudaContext ctx_;
  std::string name_;
  OpTable table_;
  Event order_;  // OrderBefore's event, reused (a wait captures its state when it is made)
};

StatusOr<std::unique_ptr<Backend>> Create(int device) {
  int count = 0;
  Status s = CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (!s.ok()) return Unavailable(s.message());
  if (count == 0) return Unavailable("cudaGetDeviceCount: no CUDA device");
  if (device < 0 || device >= count) {
    return InvalidArgument("CUDA device " + std::to_string(device) + " is outside [0, " +
                           std::to_string(count) + ")");
  }
  DEJA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device), "cudaSetDevice");
  cudaDeviceProp prop{};
  DEJA_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");

  CudaContext ctx;
  ctx.device = device;
  DEJA_ASSIGN_OR_RETURN(ctx.stream, Stream::Create());
  DEJA_ASSIGN_OR_RETURN(ctx.cublas_workspace, DeviceBuffer::Allocate(kCublasWorkspaceBytes));
  DEJA_ASSIGN_OR_RETURN(ctx.cublas, CublasHandle::Create(ctx.stream.get(), ctx.cublas_workspace));
  DEJA_ASSIGN_OR_RETURN(ctx.cublas_lt, CublasLtHandle::Create());
  ctx.sm_count = prop.multiProcessorCount;
  LOG(INFO) << "CUDA backend on device " << device << ": " << prop.name << ", sm_" << prop.major
            << prop.minor << ", " << (prop.totalGlobalMem >> 20) << " MiB";
  return std::unique_ptr<Backend>(std::make_unique<CudaBackendImpl>(std::move(ctx), prop.name));
}

}  // namespace

CudaContext& ContextOf(Backend& backend) {
  return static_cast<CudaBackendImpl&>(backend).context();
}

CudaBackend* AsCuda(Backend& backend) {
  return backend.kind() == BackendKind::kCuda ? static_cast<CudaBackend*>(&backend) : nullptr;
}

}  // namespace cuda

StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device) { return cuda::Create(device); }

}  // namespace deja::kernels
