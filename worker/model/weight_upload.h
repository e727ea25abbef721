// Moves a rank's weights to its backend's device without holding the checkpoint in host memory:
// each tensor streams from its host view (the mmapped checkpoint; for row-parallel matrices of a
// tensor-parallel rank, the rows' column segments, gathered from the mapping) through one reusable
// pinned staging buffer, is converted on the device
// when its dtype changes (kernels::Convert), and its mapped pages are dropped once copied, so the
// host's resident memory stays near the staging buffer whatever the checkpoint's size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "common/safetensors.h"
#include "common/status.h"
#include "common/tensor.h"
#include "kernels/backend.h"
#include "worker/model/opt_weights.h"

namespace deja::worker::model {

struct UploadOptions {
  // The matrices' dtype on the device (Linear weights, embeddings, lm head); unset: as stored.
  // Biases become f32 (the GEMM epilogue adds them in the output's dtype); LayerNorms keep
  // theirs. int8 quantizes float matrices on the host, per row, as they stream (the position
  // embeddings keep their dtype); int8 matrices of a `deja quantize` checkpoint stay as they are.
  std::optional<DType> matrix_dtype;
  size_t staging_bytes = size_t{64} << 20;
  // Progress is logged at most this often (and at the end).
  double log_every_seconds = 5.0;
  // When set, every host byte range read from the checkpoint (address, length), in order: tests
  // check that a rank reads only its slices.
  std::vector<std::pair<const void*, size_t>>* read_log = nullptr;
};

struct UploadStats {
  int64_t tensors = 0;
  int64_t host_bytes = 0;    // read from the checkpoint
  int64_t device_bytes = 0;  // held on the device
  double seconds = 0;
};

// Bytes the weights will take on the device (after the dtype change).
int64_t DeviceWeightBytes(const OptWeights& w, std::optional<DType> matrix_dtype);

// Replaces every view of `w` with one in device memory that `w->converted` owns (the host copies
// w owned are freed); a tied lm head stays rows of the embedding table. Checks the device's free
// memory first: ResourceExhausted with the bytes needed and free when the weights do not fit.
Status UploadWeights(OptWeights* w, const Checkpoint& ckpt, kernels::Backend& backend,
                     const UploadOptions& options, UploadStats* stats);

}  // namespace deja::worker::model
