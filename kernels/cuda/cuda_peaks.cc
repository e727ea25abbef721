// MeasureDevicePeaks for the CUDA backend: the two ceilings a benchmark's floor divides by,
// measured on the device the backend drives (never taken from a datasheet).
//   copy: cudaMemcpyAsync of 1 GiB device to device, best of 10 after 3 warm-ups, counting the
//         bytes read plus the bytes written.
//   gemm: an 8192 x 8192 x 8192 bf16 cublasGemmEx with f32 accumulation on random inputs (zeros
//         run faster than real data), best of 10 after 3 warm-ups.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <random>
#include <vector>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_context.h"

namespace deja::kernels {

StatusOr<DevicePeaks> MeasureDevicePeaks(Backend& backend) {
  if (cuda::AsCuda(backend) == nullptr) {
    return Unimplemented("backend " + backend.name() + " has no device peaks to measure");
  }
  cuda::CudaContext& ctx = cuda::ContextOf(backend);
  DEJA_CUDA_RETURN_IF_ERROR(cudaSetDevice(ctx.device), "cudaSetDevice");
  cudaStream_t stream = ctx.stream.get();
  DEJA_RETURN_IF_ERROR(backend.Synchronize());
  DEJA_ASSIGN_OR_RETURN(cuda::Event start, cuda::Event::Create());
  DEJA_ASSIGN_OR_RETURN(cuda::Event stop, cuda::Event::Create());
  auto best_ms = [&](auto&& enqueue) -> StatusOr<float> {
    float best = 1e30f;
    for (int rep = 0; rep < 13; ++rep) {
      DEJA_RETURN_IF_ERROR(start.Record(stream));
      DEJA_RETURN_IF_ERROR(enqueue());
      DEJA_RETURN_IF_ERROR(stop.Record(stream));
      DEJA_RETURN_IF_ERROR(stop.Synchronize());
      DEJA_ASSIGN_OR_RETURN(float ms, stop.MillisecondsSince(start));
      if (rep >= 3) best = std::min(best, ms);
    }
    return best;
  };
  DevicePeaks peaks;
  {
    const size_t bytes = size_t{1} << 30;
    DEJA_ASSIGN_OR_RETURN(cuda::DeviceBuffer a, cuda::DeviceBuffer::Allocate(bytes));
    DEJA_ASSIGN_OR_RETURN(cuda::DeviceBuffer b, cuda::DeviceBuffer::Allocate(bytes));
    DEJA_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(a.data(), 0x5a, bytes, stream), "cudaMemsetAsync");
    DEJA_ASSIGN_OR_RETURN(
        float ms, best_ms([&]() -> Status {
          return cuda::CudaStatus(
              cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, stream),
              "cudaMemcpyAsync");
        }));
    peaks.copy_bytes_per_s = 2.0 * static_cast<double>(bytes) / (ms * 1e-3);
  }
  {
    constexpr int kN = 8192;
    const size_t elems = static_cast<size_t>(kN) * kN;
    std::vector<__nv_bfloat16> host(elems);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (auto& x : host) x = __float2bfloat16(u(rng));
    DEJA_ASSIGN_OR_RETURN(cuda::DeviceBuffer a, cuda::DeviceBuffer::Allocate(elems * 2));
    DEJA_ASSIGN_OR_RETURN(cuda::DeviceBuffer b, cuda::DeviceBuffer::Allocate(elems * 2));
    DEJA_ASSIGN_OR_RETURN(cuda::DeviceBuffer c, cuda::DeviceBuffer::Allocate(elems * 4));
    DEJA_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(a.data(), host.data(), elems * 2, cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync");
    DEJA_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(b.data(), host.data(), elems * 2, cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync");
    DEJA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const float alpha = 1.f, beta = 0.f;
    DEJA_ASSIGN_OR_RETURN(
        float ms, best_ms([&]() -> Status {
          return cuda::CublasStatus(
              cublasGemmEx(ctx.cublas.get(), CUBLAS_OP_T, CUBLAS_OP_N, kN, kN, kN, &alpha, a.data(),
                           CUDA_R_16BF, kN, b.data(), CUDA_R_16BF, kN, &beta, c.data(), CUDA_R_32F,
                           kN, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              "cublasGemmEx");
        }));
    peaks.bf16_gemm_flops_per_s = 2.0 * kN * static_cast<double>(kN) * kN / (ms * 1e-3);
  }
  return peaks;
}

}  // namespace deja::kernels
