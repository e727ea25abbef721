// `deja quantize`: an OPT checkpoint rewritten with weight-only int8 or int4 matrices, which deja
// loads without quantizing again (in half or a quarter of bf16's bytes on disk).
#pragma once

#include <string>

#include "common/status.h"

namespace deja {
class ThreadPool;
}

namespace deja::worker::model {

struct QuantizeOptions {
  int32_t bits = 8;  // 8, or 4: the layers' matrices int4 in groups (common/int4.h)
  // int4: K per scale (a positive multiple of 8), and the relative error above which a layer
  // matrix stays int8, as `--dtype int4` decides at load (--int4-group, --int4-max-error).
  int32_t group = 128;
  double max_error = 0.15;
};

struct QuantizeReport {
  int64_t matrices = 0;                 // quantized (each with a "<name>.scale" f32 tensor)
  int64_t int4 = 0, int4_fallbacks = 0;  // of them, int4; and layer matrices int4 left int8
  int64_t copied = 0;                   // other tensors, written as they were
  int64_t bytes_in = 0, bytes_out = 0;  // tensor bytes of both checkpoints
};

// Writes `out_dir`/model.safetensors: every matrix a Linear or the embedding reads (q, k, v,
// out_proj, fc1, fc2, embed_tokens, an untied lm_head, project_in/out) as int8 quantized per
// output row (common/quantize.h) plus its scales under "<name>.scale", every other tensor as it
// was; and copies the directory's other files (config, tokenizer, generation config, Deja Vu
// predictors). With bits 4 each layer matrix whose columns are whole groups and whose relative
// error is at most max_error is int4 instead, in the checkpoint's form (Int4Rows: packed U8
// [rows, cols / 2], scales f32 [rows, groups]), exactly what `--dtype int4` makes at load.
// out_dir is created; AlreadyExists when it holds a model.safetensors; a NaN or infinite weight
// is InvalidArgument naming the tensor; an already quantized checkpoint, bits other than 8 and
// 4, or a group that is not a positive multiple of 8 is InvalidArgument.
StatusOr<QuantizeReport> QuantizeCheckpoint(const std::string& model_dir,
                                            const std::string& out_dir, ThreadPool* pool,
                                            const QuantizeOptions& options = {});

// The name of the scales of int8 matrix `name` in a checkpoint.
std::string ScaleTensorName(const std::string& name);

}  // namespace deja::worker::model
