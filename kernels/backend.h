// Backend: owns memory, threads/streams and the op table of one device kind. Ops are free
// functions (ops.h) that dispatch through the table of the backend they are given. A backend
// declares which (op, weight dtype) pairs it supports; the test harness runs every supported
// pair against the reference backend.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "kernels/op_table.h"

namespace deja {
class ThreadPool;
}

namespace deja::kernels {

enum class BackendKind { kReference, kCpu, kCuda };

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
  // matrices at load (worker/opt_weights.h TileMatrices).
  virtual bool PrefersTiled(DType) const { return false; }
  // Worker threads for CPU backends (nullptr elsewhere).
  virtual ThreadPool* pool() const { return nullptr; }
};

// The plain, single-threaded reference implementations: the ground truth in tests.
std::unique_ptr<Backend> MakeReferenceBackend();
// The fast CPU backend (SIMD with runtime dispatch, a thread pool, OpenBLAS for large GEMMs).
// threads <= 0 means one per available core.
std::unique_ptr<Backend> MakeCpuBackend(int threads = 0);
// The CUDA backend, or Unavailable with the reason (not built, no device).
StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device);

}  // namespace deja::kernels
