// The CUDA backend's extra face beyond kernels::Backend: device timing for benchmarks. Free of
// CUDA types, so callers need no CUDA headers; built only when DEJA_HAVE_CUDA is on.
//
// Memory and ordering follow kernels/backend.h: Allocate and ToBackend hand out memory on the
// backend's device (Tensor::device() cuda:<n>, freed by cudaFree); ops take only views in it,
// except the host index arrays the validating ops read (Embedding ids, Attention q_pos and
// head_ids, the gathers' rows, KvWrite's slots and positions), which the backend copies to the
// device on its stream before the kernel that reads them, so the caller may reuse them as soon as
// the op returns. Ops enqueue on
// the backend's one stream and return; an Ok return means the work was enqueued. Results are
// visible to the host after Synchronize() or a copy to the host; an asynchronous error surfaces
// there.
#pragma once

#include <functional>

#include "common/status.h"
#include "kernels/backend.h"

namespace deja::kernels::cuda {

class CudaBackend : public Backend {
 public:
  // Device milliseconds between events recorded before and after the work `enqueue` adds to the
  // stream (for benchmarks; synchronises).
  virtual StatusOr<float> TimeMs(const std::function<Status()>& enqueue) = 0;
};

// The backend as a CudaBackend, or nullptr when it is of another kind.
CudaBackend* AsCuda(Backend& backend);

}  // namespace deja::kernels::cuda
