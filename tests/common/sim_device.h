// A simulated device for tests on machines without a GPU: a Backend whose memory is host memory
// that the host may not touch. Allocate maps fresh pages with no access (PROT_NONE), filled with
// garbage; the backend's ops (the CPU backend's dense ops, the reference's paged-KV ops and
// conversions) and its copies open every region for their duration and close them again. Code that
// reads or writes device memory outside the backend, as a device path must never do, dies with
// SIGSEGV at the offending access. It lets the model's device path (weights streamed in, workspace,
// paged KV, device-side eviction, logits read back) run and be checked against the CPU here, with
// the CPU and reference ops standing in for the CUDA ones. All simulated memory is one reserved
// range, opened and closed by one mprotect each; opening nests, so ops may run on several
// threads.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "kernels/backend.h"

namespace deja::test_util {

// `memory_bytes` is what MemoryInfo reports as free and total.
std::unique_ptr<kernels::Backend> MakeSimDeviceBackend(size_t memory_bytes = size_t{16} << 20);

// The devices a device-parameterised model test runs on: "cpu" (2 threads), "sim" and "cuda"
// (cuda:0; Unavailable with the CUDA reason where there is none: the test skips with it). Tests
// whose parameter names contain "cuda" carry the ctest label gpu (tests/CMakeLists.txt).
inline std::vector<std::string> TestDevices() { return {"cpu", "sim", "cuda"}; }
StatusOr<std::unique_ptr<kernels::Backend>> MakeTestBackend(const std::string& device);

// The weight dtype a model test loads on `device` (LoadOptions::weight_dtype) to compare with the
// CPU's arithmetic at f32 tolerances: on CUDA the matrices are widened to f32 at load (cuBLAS in
// f32, no TF32), so only the summation order differs. With f16/bf16 weights CUDA rounds the
// activations to the weight dtype before each GEMM (kernels/cuda/linear.cc): a relative error of
// about that dtype's unit roundoff, which the kernel comparisons bound per dtype and which moved
// opt-mini's log-probs by up to 5e-3 on an H100. Unset elsewhere: the checkpoint's dtype.
inline std::optional<DType> ExactWeightDType(const std::string& device) {
  if (device == "cuda") return DType::kF32;
  return std::nullopt;
}

}  // namespace deja::test_util
