// Reading (and, for tests and tools, writing) safetensors checkpoints: a single
// `model.safetensors` or the sharded `model.safetensors.index.json` form. Every file is mmapped
// once; tensors are views into the mappings. Headers are validated strictly so a malformed
// checkpoint yields a Status naming the file and the tensor, never a crash.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "common/mmap_file.h"
#include "common/status.h"
#include "common/tensor.h"

namespace deja {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  const void* data = nullptr;  // into the read-only mapping of `file`
  size_t bytes = 0;
  std::string file;  // path of the safetensors file holding it

  // A view for ops. TensorView has no const variant; the memory is mapped PROT_READ, so the
  // data must be treated as const (a write faults).
  TensorView view() const { return {const_cast<void*>(data), dtype, shape}; }
};

class Checkpoint {
 public:
  // `dir` holds model.safetensors or model.safetensors.index.json (the single file wins when
  // both exist, as in transformers). NotFound when neither exists.
  static StatusOr<std::unique_ptr<Checkpoint>> OpenDir(const std::string& dir);
  // One safetensors file.
  static StatusOr<std::unique_ptr<Checkpoint>> OpenFile(const std::string& path);

  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  // nullptr when absent.
  const TensorInfo* Find(std::string_view name) const;
  // Sorted tensor names.
  const std::vector<std::string>& names() const { return names_; }
  // The tensor as a view; NotFound when absent, InvalidArgument naming the tensor, its shape and
  // the expected one on mismatch.
  StatusOr<TensorView> Get(std::string_view name, const Shape& expected) const;

  // Total tensor bytes, for "loaded X of Y" progress logging.
  size_t Bytes() const { return total_bytes_; }
  // Pages in a view (or a row slice of one) ahead of use; returns its byte count.
  static size_t Prefetch(const TensorView& view) { return PrefetchMemory(view.data, view.bytes()); }
  // Drops a view's pages from memory once it was copied elsewhere (a device); a no-op for views
  // outside this checkpoint's files.
  void Release(const TensorView& view) const;

  // The files backing the checkpoint and the merged `__metadata__` of every file.
  std::vector<std::string> files() const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // What the checkpoint was opened from (directory or file), for error messages.
  const std::string& source() const { return source_; }

 private:
  Checkpoint() = default;
  Status AddFile(const std::string& path);
  Status OpenIndex(const std::string& dir, const std::string& index_path);
  void Finish();

  std::string source_;
  std::vector<MappedFile> mappings_;
  std::unordered_map<std::string, TensorInfo> tensors_;
  std::vector<std::string> names_;
  std::map<std::string, std::string> metadata_;
  size_t total_bytes_ = 0;
};

inline StatusOr<std::unique_ptr<Checkpoint>> OpenCheckpoint(const std::string& dir) {
  return Checkpoint::OpenDir(dir);
}

// Writes tensors (F32, F16 or BF16) in the given order, header padded to 8 bytes so the data
// is aligned. The file is written to a temporary name and renamed, so readers never see a
// partial file. Duplicate or empty names are InvalidArgument.
Status WriteSafetensors(const std::string& path,
                        const std::vector<std::pair<std::string, TensorView>>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

// The safetensors spelling of a dtype ("F32", "F16", "BF16", "I32").
const char* SafetensorsDTypeName(DType dtype);

}  // namespace deja
