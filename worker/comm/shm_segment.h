// SharedSegment: an RAII read-write mapping of a POSIX shared-memory object (shm_open), the
// memory the same-host communicator's ranks share. The name only serves the rendezvous: the
// owner unlinks it as soon as every rank has mapped the segment, so the memory goes away with
// the last mapping, whichever way the processes end.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace deja::worker::comm {

class SharedSegment {
 public:
  // Creates `name` (which must not exist yet; mode 0600, so only this user can open it) of
  // `bytes`, all of it reserved up front: a /dev/shm too small for it is ResourceExhausted here
  // rather than a SIGBUS at the first touch of a page the tmpfs cannot supply. The name is
  // unlinked again if any step fails.
  static StatusOr<SharedSegment> Create(const std::string& name, size_t bytes);
  // Maps the whole of an existing `name`; NotFound if there is none.
  static StatusOr<SharedSegment> Open(const std::string& name);
  // Removes the name (the mappings stay valid). NotFound-tolerant: OK if it is already gone.
  static Status Unlink(const std::string& name);

  SharedSegment() = default;
  ~SharedSegment();
  SharedSegment(SharedSegment&& other) noexcept;
  SharedSegment& operator=(SharedSegment&& other) noexcept;
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  void Reset();

  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string name_;
};

}  // namespace deja::worker::comm
