// MappedFile: an RAII read-only memory mapping of a whole file. Checkpoints are mapped rather than
// read so each tensor-parallel rank only pages in the slices it uses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace deja {

class MappedFile {
 public:
  // NotFound if the path does not exist, PermissionDenied if it cannot be read, InvalidArgument
  // if it is not a regular file. An empty file maps to data() == nullptr, size() == 0.
  static StatusOr<MappedFile> Open(const std::string& path);

  MappedFile() = default;
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // The mapping is PROT_READ: writing through data() faults.
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void Reset();

  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

// Asks the kernel to read [data, data + bytes) ahead and touches one byte per page so the range
// is resident afterwards; returns `bytes` so callers can sum it for progress logging. Works on
// any readable memory, including sub-ranges of a mapping.
size_t PrefetchMemory(const void* data, size_t bytes);
// Drops the pages wholly inside [data, data + bytes) of a read-only file mapping from this
// process's memory (they are read again from the file if touched). Only for file mappings:
// anonymous memory would read back as zeros.
void ReleaseFileMemory(const void* data, size_t bytes);

}  // namespace deja
