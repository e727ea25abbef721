// `deja quantize`: an OPT checkpoint rewritten with weight-only int8 matrices, which deja loads
// without quantizing again (and in half of bf16's bytes on disk).
#pragma once

#include <string>

#include "common/status.h"

namespace deja {
class ThreadPool;
}

namespace deja::worker::model {

struct QuantizeReport {
  int64_t matrices = 0;                 // quantized (each with a "<name>.scale" f32 tensor)
  int64_t copied = 0;                   // other tensors, written as they were
  int64_t bytes_in = 0, bytes_out = 0;  // tensor bytes of both checkpoints
};

// Writes `out_dir`/model.safetensors: every matrix a Linear or the embedding reads (q, k, v,
// out_proj, fc1, fc2, embed_tokens, an untied lm_head, project_in/out) as int8 quantized per
// output row (common/quantize.h) plus its scales under "<name>.scale", every other tensor as it
// was; and copies the directory's other files (config, tokenizer, generation config, Deja Vu
// predictors). out_dir is created; AlreadyExists when it holds a model.safetensors; a NaN or
// infinite weight is InvalidArgument naming the tensor; an already quantized checkpoint is
// InvalidArgument.
StatusOr<QuantizeReport> QuantizeCheckpoint(const std::string& model_dir,
                                            const std::string& out_dir, ThreadPool* pool);

// The name of the scales of int8 matrix `name` in a checkpoint.
std::string ScaleTensorName(const std::string& name);

}  // namespace deja::worker::model
