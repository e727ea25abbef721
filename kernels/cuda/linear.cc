// CUDA Linear: out = act(x · wᵀ + bias) (+ out when accumulating; the ReLU acts before the
// accumulation, kernels/op_table.h).
//
// GEMMs. f32 weights: cublasGemmEx with CUBLAS_COMPUTE_32F (no TF32), so only summation order
// differs from the reference. f16/bf16 weights: cublasLtMatmul with A/B in the weight dtype, C/D
// f32, CUBLAS_COMPUTE_32F and an f32 scale type. Neither cuBLAS nor cuBLASLt multiplies f32 by
// f16, and widening the weights would double their memory and bandwidth, so the activations are
// first rounded to the weight dtype (one conversion kernel). The rounding of x dominates the
// error: a relative error of about the dtype's unit roundoff (f16 2^-11, bf16 2^-8), which
// tests/kernels bounds per dtype on CUDA.
//
// Epilogue. What cuBLASLt can fuse it does; the rest is one kernel after the GEMM (LaunchBiasAct):
// bias, ReLU and accumulation in one pass. cuBLASLt's bias vector must have the type of D
// (cublasLt.h, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: the exceptions are integer and fp8 GEMMs
// only), so with f32 output only an f32 bias is fused; an f16/bf16 bias (the checkpoint's dtype)
// goes to the kernel. cuBLASLt applies bias and ReLU to alpha·AB + beta·C, so ReLU and
// accumulation cannot share a call: relu(AB + bias + out) is not relu(AB + bias) + out.
//
//   weights   bias       relu  accumulate  GEMM (C = D = out unless noted)          then kernel
//   f16/bf16  none/f32   no    no          Lt DEFAULT / BIAS, beta 0                 -
//   f16/bf16  none/f32   no    yes         Lt DEFAULT / BIAS, beta 1                 -
//   f16/bf16  none/f32   yes   no          Lt RELU / RELU_BIAS, beta 0               -
//   f16/bf16  f16/bf16   any   no          Lt DEFAULT, beta 0                        bias (+ReLU)
//   f16/bf16  f16/bf16   no    yes         Lt DEFAULT, beta 1                        bias
//   f16/bf16  any        yes   yes         Lt DEFAULT, beta 0, into scratch          bias, ReLU, +=
//   f32       any        any   any         cublasGemmEx, beta 1 iff accumulate, !relu  as needed
//
// Should the heuristic offer no algorithm for a fused epilogue, the GEMM runs without it and the
// kernel does the rest; should it offer none at all, cublasGemmEx does the GEMM.
//
// cuBLASLt descriptors, layouts and the heuristic's algorithm are made once per (M, N, K, dtype,
// epilogue, accumulate, pointer alignments) and kept in CudaContext::lt_plans; a repeated shape
// only sets the bias pointer and calls cublasLtMatmul with the context's fixed workspace.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <utility>

#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/launch.h"

namespace deja::kernels::cuda {
namespace {

// Distinct (shape, epilogue, alignment) plans kept; reaching it clears them all (every prefill
// length is a shape, so the count is bounded only by the server's limits).
constexpr size_t kMaxLtPlans = 4096;

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

// The largest power of two up to 256 dividing the address (256 for null).
uint32_t Alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (a == 0) return 256;
  return static_cast<uint32_t>(std::min<uintptr_t>(a & (~a + 1), 256));
}

bool FusesBias(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_RELU_BIAS;
}

template <typename V>
Status SetDesc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const V& value,
               const char* what) {
  return CublasLtStatus(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)), what);
}

template <typename V>
Status SetPref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
               const V& value, const char* what) {
  return CublasLtStatus(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)),
                        what);
}

// Row-major out[M, N] is column-major outᵀ[N, M] = op(A)·B with A = w stored column-major K x N
// (lda = K) read transposed, B = x stored column-major K x M (ldb = K), C = D = out column-major
// N x M (ldc = N): the same arrangement as the cublasGemmEx call below.
Status MakePlan(CudaContext& ctx, const LtMatmulKey& key, const void* bias, LtMatmulPlan* plan) {
  const cudaDataType_t type = CudaType(key.dtype);
  const uint64_t m = static_cast<uint64_t>(key.m), n = static_cast<uint64_t>(key.n),
                 k = static_cast<uint64_t>(key.k);
  DEJA_CUBLASLT_RETURN_IF_ERROR(
      cublasLtMatmulDescCreate(plan->desc.out(), CUBLAS_COMPUTE_32F, CUDA_R_32F),
      "linear: cublasLtMatmulDescCreate");
  cublasLtMatmulDesc_t desc = plan->desc.get();
  DEJA_RETURN_IF_ERROR(SetDesc(desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T, "linear: TRANSA"));
  DEJA_RETURN_IF_ERROR(SetDesc(desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N, "linear: TRANSB"));
  DEJA_RETURN_IF_ERROR(
      SetDesc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, key.epilogue, "linear: EPILOGUE"));
  if (FusesBias(key.epilogue)) {
    const int32_t bias_type = CUDA_R_32F;
    DEJA_RETURN_IF_ERROR(
        SetDesc(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type, "linear: BIAS_DATA_TYPE"));
    // The heuristic reads the pointer's alignment; each call sets the pointer again.
    DEJA_RETURN_IF_ERROR(
        SetDesc(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, "linear: BIAS_POINTER"));
  }
  DEJA_CUBLASLT_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(plan->w_layout.out(), type, k, n, static_cast<int64_t>(k)),
      "linear: cublasLtMatrixLayoutCreate (w)");
  DEJA_CUBLASLT_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(plan->x_layout.out(), type, k, m, static_cast<int64_t>(k)),
      "linear: cublasLtMatrixLayoutCreate (x)");
  DEJA_CUBLASLT_RETURN_IF_ERROR(
      cublasLtMatrixLayoutCreate(plan->out_layout.out(), CUDA_R_32F, n, m, static_cast<int64_t>(n)),
      "linear: cublasLtMatrixLayoutCreate (out)");

  LtMatmulPreference pref;
  DEJA_CUBLASLT_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(pref.out()),
                                "linear: cublasLtMatmulPreferenceCreate");
  const uint64_t workspace = ctx.cublas_workspace.bytes();
  DEJA_RETURN_IF_ERROR(SetPref(pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace,
                               "linear: MAX_WORKSPACE_BYTES"));
  DEJA_RETURN_IF_ERROR(SetPref(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_w,
                               "linear: MIN_ALIGNMENT_A_BYTES"));
  DEJA_RETURN_IF_ERROR(SetPref(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_x,
                               "linear: MIN_ALIGNMENT_B_BYTES"));
  DEJA_RETURN_IF_ERROR(SetPref(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                               key.align_out, "linear: MIN_ALIGNMENT_C_BYTES"));
  DEJA_RETURN_IF_ERROR(SetPref(pref.get(), CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                               key.align_out, "linear: MIN_ALIGNMENT_D_BYTES"));

  cublasLtMatmulHeuristicResult_t result{};
  int count = 0;
  const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(
      ctx.cublas_lt.get(), desc, plan->w_layout.get(), plan->x_layout.get(), plan->out_layout.get(),
      plan->out_layout.get(), pref.get(), 1, &result, &count);
  if (s == CUBLAS_STATUS_NOT_SUPPORTED || (s == CUBLAS_STATUS_SUCCESS && count == 0)) {
    plan->found = false;  // no algorithm for this configuration: the caller falls back
    return Status::Ok();
  }
  DEJA_CUBLASLT_RETURN_IF_ERROR(s, "linear: cublasLtMatmulAlgoGetHeuristic");
  plan->found = result.state == CUBLAS_STATUS_SUCCESS;
  plan->algo = result.algo;
  plan->workspace_bytes = result.workspaceSize;
  return Status::Ok();
}

// The cached plan of `key`, made on first use. `bias` (fused epilogues only) is a pointer of the
// alignment key.align_bias.
StatusOr<LtMatmulPlan*> PlanFor(CudaContext& ctx, const LtMatmulKey& key, const void* bias) {
  auto it = ctx.lt_plans.find(key);
  if (it != ctx.lt_plans.end()) return &it->second;
  LtMatmulPlan plan;
  DEJA_RETURN_IF_ERROR(MakePlan(ctx, key, bias, &plan));  // a failure caches nothing
  if (ctx.lt_plans.size() >= kMaxLtPlans) ctx.lt_plans.clear();
  return &ctx.lt_plans.emplace(key, std::move(plan)).first->second;
}

// out = w·x (+ bias, ReLU as key.epilogue says) (+ out when key.accumulate) through cuBLASLt.
// False (nothing enqueued) when the heuristic has no algorithm for the key.
StatusOr<bool> LtGemm(CudaContext& ctx, const LtMatmulKey& key, const void* w, const void* x,
                      const void* bias, float* out) {
  DEJA_ASSIGN_OR_RETURN(LtMatmulPlan * plan, PlanFor(ctx, key, bias));
  if (!plan->found) return false;
  if (FusesBias(key.epilogue)) {
    DEJA_RETURN_IF_ERROR(
        SetDesc(plan->desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, "linear: BIAS_POINTER"));
  }
  const float alpha = 1.f, beta = key.accumulate ? 1.f : 0.f;
  DEJA_CUBLASLT_RETURN_IF_ERROR(
      cublasLtMatmul(ctx.cublas_lt.get(), plan->desc.get(), &alpha, w, plan->w_layout.get(), x,
                     plan->x_layout.get(), &beta, out, plan->out_layout.get(), out,
                     plan->out_layout.get(), &plan->algo, ctx.cublas_workspace.data(),
                     ctx.cublas_workspace.bytes(), ctx.stream.get()),
      "linear: cublasLtMatmul");
  return true;
}

cublasLtEpilogue_t Epilogue(bool bias, bool relu) {
  if (bias) return relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
  return relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT;
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
  if (n == 0) return Status::Ok();  // an empty out (kernels/ops.cc returned already for empty x)
  cudaStream_t stream = ctx.stream.get();
  const bool relu = act == Activation::kRelu;
  const bool has_bias = bias.data != nullptr;
  if (w.dtype == DType::kI4) {
    DEJA_ASSIGN_OR_RETURN(void* scratch,
                          ctx.narrow_x.Get(LinearI4ScratchBytes(m, k), stream));
    return CudaStatus(LaunchLinearI4(x.as<float>(), m, k, w.data, w.scale, w.scale_group, n,
                                     bias.data, bias.dtype, relu, accumulate, scratch,
                                     out.as<float>(), stream),
                      "linear: int4 kernel");
  }
  if (w.dtype == DType::kI8) {
    // No cuBLAS GEMM multiplies bf16 activations by int8 weights: the gather kernel over every
    // row in order (one warp per output column, int8 widened in registers, scale, bias, ReLU and
    // accumulation fused). Decode-sized; a dequantize-into-tensor-cores path for prefill is not
    // written yet.
    return CudaStatus(
        LaunchGatherLinear(x.as<float>(), m, k, w.data, w.dtype, w.scale, bias.data, bias.dtype,
                           nullptr, n, relu, accumulate, out.as<float>(), stream),
        "linear: int8 kernel");
  }

  const void* xa = x.data;
  if (w.dtype != DType::kF32) {
    DEJA_ASSIGN_OR_RETURN(void* narrow, ctx.narrow_x.Get(x.numel() * DTypeSize(w.dtype), stream));
    DEJA_CUDA_RETURN_IF_ERROR(LaunchConvertF32(x.as<float>(), x.numel(), w.dtype, narrow, stream),
                              "linear: activation conversion kernel");
    xa = narrow;
  }
  // Where the GEMM writes, and whether it adds into `out` itself (beta = 1): possible unless a
  // ReLU has to act on the product before the accumulation; then the GEMM writes scratch and the
  // kernel accumulates.
  const bool via_scratch = accumulate && relu;
  const bool gemm_accumulates = accumulate && !relu;
  float* gemm_out = out.as<float>();
  if (via_scratch) {
    DEJA_ASSIGN_OR_RETURN(void* scratch, ctx.linear_out.Get(out.bytes(), stream));
    gemm_out = static_cast<float*>(scratch);
  }

  bool fused_bias = false, fused_relu = false, done = false;
  if (w.dtype != DType::kF32) {
    LtMatmulKey key;
    key.m = m;
    key.n = n;
    key.k = k;
    key.dtype = w.dtype;
    key.accumulate = gemm_accumulates;
    key.align_w = Alignment(w.data);
    key.align_x = Alignment(xa);
    key.align_out = Alignment(gemm_out);
    if (!via_scratch) {
      // cuBLASLt's bias must be f32 here (the type of D); ReLU fuses only after a fused bias.
      fused_bias = has_bias && bias.dtype == DType::kF32;
      fused_relu = relu && (!has_bias || fused_bias);
    }
    if (fused_bias || fused_relu) {
      key.epilogue = Epilogue(fused_bias, fused_relu);
      key.align_bias = fused_bias ? Alignment(bias.data) : 0;
      DEJA_ASSIGN_OR_RETURN(done, LtGemm(ctx, key, w.data, xa, bias.data, gemm_out));
      if (!done) {  // no algorithm with that epilogue: a plain GEMM and the kernel
        fused_bias = fused_relu = false;
        key.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
        key.align_bias = 0;
      }
    }
    if (!done) {
      DEJA_ASSIGN_OR_RETURN(done, LtGemm(ctx, key, w.data, xa, nullptr, gemm_out));
    }
  }
  if (!done) {
    // f32 weights (or no cuBLASLt algorithm): cublasGemmEx, arranged as in MakePlan.
    const float alpha = 1.f, beta = gemm_accumulates ? 1.f : 0.f;
    const cudaDataType_t type = CudaType(w.dtype);
    DEJA_CUBLAS_RETURN_IF_ERROR(
        cublasGemmEx(ctx.cublas.get(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n),
                     static_cast<int>(m), static_cast<int>(k), &alpha, w.data, type,
                     static_cast<int>(k), xa, type, static_cast<int>(k), &beta, gemm_out,
                     CUDA_R_32F, static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "linear: cublasGemmEx");
  }

  const bool bias_left = has_bias && !fused_bias, relu_left = relu && !fused_relu;
  if (!bias_left && !relu_left && !via_scratch) return Status::Ok();  // the GEMM wrote it all
  // In place on `out` unless the GEMM wrote scratch, which the kernel then adds to out.
  return CudaStatus(LaunchBiasAct(gemm_out, bias_left ? bias.data : nullptr, bias.dtype, m, n,
                                  relu_left, via_scratch, out.as<float>(), stream),
                    "linear: epilogue kernel");
}

}  // namespace deja::kernels::cuda
