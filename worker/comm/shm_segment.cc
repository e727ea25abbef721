#include "worker/comm/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace deja::worker::comm {
namespace {

std::string Errno(const std::string& what, int err) { return what + ": " + std::strerror(err); }

// Closes the descriptor on every path; the mapping does not need it once made.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

StatusOr<SharedSegment> SharedSegment::Create(const std::string& name, size_t bytes) {
  if (bytes == 0) return InvalidArgument("shared memory segment " + name + " of 0 bytes");
  Fd fd(::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (fd.get() < 0) {
    const int err = errno;
    return Status(err == EEXIST ? StatusCode::kAlreadyExists : StatusCode::kUnavailable,
                  Errno("shm_open(" + name + ", O_CREAT)", err));
  }
  auto fail = [&](StatusCode code, const std::string& what, int err) {
    ::shm_unlink(name.c_str());
    return Status(code, Errno(what + " of shared memory segment " + name, err));
  };
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return fail(StatusCode::kUnavailable, "ftruncate to " + std::to_string(bytes), errno);
  }
  // posix_fallocate returns the error rather than setting errno.
  if (int err = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(bytes)); err != 0) {
    return fail(err == ENOSPC ? StatusCode::kResourceExhausted : StatusCode::kUnavailable,
                "reserving " + std::to_string(bytes) + " bytes (is /dev/shm large enough?)", err);
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return fail(StatusCode::kUnavailable, "mmap", errno);
  SharedSegment s;
  s.data_ = static_cast<uint8_t*>(p);
  s.size_ = bytes;
  s.name_ = name;
  return s;
}

StatusOr<SharedSegment> SharedSegment::Open(const std::string& name) {
  Fd fd(::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0));
  if (fd.get() < 0) {
    const int err = errno;
    return Status(err == ENOENT ? StatusCode::kNotFound : StatusCode::kUnavailable,
                  Errno("shm_open(" + name + ")", err));
  }
  struct stat st = {};
  if (::fstat(fd.get(), &st) != 0) return Unavailable(Errno("fstat of " + name, errno));
  if (st.st_size <= 0) return Unavailable("shared memory segment " + name + " is empty");
  const size_t bytes = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return Unavailable(Errno("mmap of " + name, errno));
  SharedSegment s;
  s.data_ = static_cast<uint8_t*>(p);
  s.size_ = bytes;
  s.name_ = name;
  return s;
}

Status SharedSegment::Unlink(const std::string& name) {
  if (::shm_unlink(name.c_str()) != 0 && errno != ENOENT) {
    return Unavailable(Errno("shm_unlink(" + name + ")", errno));
  }
  return Status::Ok();
}

SharedSegment::~SharedSegment() { Reset(); }

SharedSegment::SharedSegment(SharedSegment&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      name_(std::move(other.name_)) {}

SharedSegment& SharedSegment::operator=(SharedSegment&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    name_ = std::move(other.name_);
  }
  return *this;
}

void SharedSegment::Reset() {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace deja::worker::comm
