// The element types' spellings, once: deja's own name (flags, logs: "f32"), the safetensors name
// ("F32"), and whether a checkpoint may hold the type. DTypeName (dtype.h), the safetensors reader
// and writer, and the command line's dtype flags all read these rows.
#pragma once

#include <span>

#include "common/dtype.h"

namespace deja {

struct DTypeRow {
  DType dtype;
  const char* name;
  const char* safetensors;
  // Weights and activations: the checkpoint reader and writer take these, nothing else.
  bool in_checkpoints;
};

// Every DType, one row each, in enum order.
std::span<const DTypeRow> DTypeTable();
const DTypeRow& DTypeOf(DType dtype);

}  // namespace deja
