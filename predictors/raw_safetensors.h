// A minimal, strict safetensors reader and writer for the predictors' training data (Deja Vu:
// predictor_data.h; Locret: retaining_data.h). Those files hold dtypes that the checkpoint reader
// in common/safetensors.h deliberately refuses (U8 labels, I32 segment ids): a model checkpoint
// must never contain them, a training data file does. Model-facing files (the predictor and
// retaining-head weights, all f16) go through common/safetensors.h instead.
//
// Every check names the file and the tensor, and a malformed or truncated file is an error
// Status, never a crash or a read past the end.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace deja::predictors {

// One tensor to write; `dtype` is spelled as safetensors does ("F16", "F32", "U8", "I32").
struct RawTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t bytes = 0;
};

// Writes the tensors in the given order to `path` + ".tmp", then renames it to `path`, so a
// reader never sees a partial file.
Status WriteRawSafetensors(const std::string& path,
                           const std::vector<std::pair<std::string, RawTensor>>& tensors);

// An open safetensors file whose header has been parsed (the data is read on demand, one tensor
// at a time, so a reader needs no more memory than the tensors it asks for).
class RawSafetensorsFile {
 public:
  // NotFound when the file cannot be opened; InvalidArgument when its header is malformed.
  static StatusOr<RawSafetensorsFile> Open(const std::string& path);

  RawSafetensorsFile(RawSafetensorsFile&&) noexcept;
  RawSafetensorsFile& operator=(RawSafetensorsFile&&) noexcept;
  ~RawSafetensorsFile();

  // Reads tensor `name` into `dst` (`bytes` long) after checking that it exists, has exactly
  // `dtype` and `shape`, and that its data lies inside the file. InvalidArgument naming the file
  // and the tensor otherwise (DataLoss when the read itself fails).
  Status Read(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape,
              void* dst, size_t bytes);

  bool Has(const std::string& name) const;
  const std::string& path() const { return path_; }

 private:
  struct Header;  // the parsed JSON header, kept out of this header file
  RawSafetensorsFile() = default;

  std::string path_;
  std::ifstream in_;
  std::unique_ptr<Header> header_;
  uint64_t data_start_ = 0, file_size_ = 0;
};

}  // namespace deja::predictors
