// CUDA Linear: cublasGemmEx for out = x · wᵀ, then one fused epilogue kernel for bias, ReLU and
// accumulation.
//
// Precision. f32 weights: an f32 GEMM with CUBLAS_COMPUTE_32F (no TF32), so only summation order
// differs from the reference. f16/bf16 weights: cuBLAS has no f32 x f16 GEMM, and widening the
// weights would double their memory and bandwidth, so the activations are rounded to the weight
// dtype (one conversion kernel) and the GEMM multiplies f16 x f16 (or bf16 x bf16) with f32
// accumulation and f32 output. The rounding of x dominates the error: a relative error of about
// the dtype's unit roundoff (f16 2^-11, bf16 2^-8), which tests/kernels bounds per dtype on CUDA.
#include <climits>
#include <string>

#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/launch.h"

namespace deja::kernels::cuda {
namespace {

cudaDataType_t CudaType(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return CUDA_R_16F;
    case DType::kBF16:
      return CUDA_R_16BF;
    default:
      return CUDA_R_32F;
  }
}

}  // namespace

Status CudaLinear(Backend& b, TensorView x, TensorView w, TensorView bias, Activation act,
                  bool accumulate, TensorView out) {
  CudaContext& ctx = ContextOf(b);
  DEJA_CUDA_RETURN_IF_ERROR(cudaSetDevice(ctx.device), "cudaSetDevice");
  const int64_t m = x.rows(), n = w.rows(), k = w.cols();
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX) {
    return Unimplemented("linear: M = " + std::to_string(m) + ", N = " + std::to_string(n) +
                         ", K = " + std::to_string(k) + " exceed cuBLAS int dimensions");
  }
  cudaStream_t stream = ctx.stream.get();
  const bool relu = act == Activation::kRelu;

  const void* xa = x.data;
  if (w.dtype != DType::kF32) {
    DEJA_ASSIGN_OR_RETURN(void* narrow, ctx.narrow_x.Get(x.numel() * DTypeSize(w.dtype), stream));
    DEJA_CUDA_RETURN_IF_ERROR(LaunchConvertF32(x.as<float>(), x.numel(), w.dtype, narrow, stream),
                              "linear: activation conversion kernel");
    xa = narrow;
  }
  // Where the GEMM writes, and whether it adds into `out` itself (beta = 1): possible unless a
  // ReLU has to act on the product before the accumulation.
  float* gemm_out = out.as<float>();
  float beta = 0.f;
  if (accumulate && !relu) {
    beta = 1.f;
  } else if (accumulate) {
    DEJA_ASSIGN_OR_RETURN(void* scratch, ctx.linear_out.Get(out.bytes(), stream));
    gemm_out = static_cast<float*>(scratch);
  }

  // Row-major out[M, N] is column-major outᵀ[N, M] = (w[N, K]) · (xᵀ[K, M]): w read transposed
  // (column-major K x N with lda = K), x as is (column-major K x M with ldb = K).
  const float alpha = 1.f;
  const cudaDataType_t type = CudaType(w.dtype);
  DEJA_CUBLAS_RETURN_IF_ERROR(
      cublasGemmEx(ctx.cublas.get(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n),
                   static_cast<int>(m), static_cast<int>(k), &alpha, w.data, type,
                   static_cast<int>(k), xa, type, static_cast<int>(k), &beta, gemm_out, CUDA_R_32F,
                   static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "linear: cublasGemmEx");

  if (bias.data == nullptr && !relu) return Status::Ok();  // the GEMM wrote the final result
  // With beta = 1 the GEMM already accumulated, so the epilogue only adds the bias in place.
  const bool epilogue_accumulates = gemm_out != out.as<float>();
  return CudaStatus(LaunchBiasAct(gemm_out, bias.data, bias.dtype, m, n, relu, epilogue_accumulates,
                                  out.as<float>(), stream),
                    "linear: epilogue kernel");
}

}  // namespace deja::kernels::cuda
