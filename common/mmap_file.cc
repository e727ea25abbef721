#include "common/mmap_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace deja {
namespace {

Status ErrnoStatus(int err, const std::string& what, const std::string& path) {
  std::string msg = what + " " + path + ": " + std::strerror(err);
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return NotFound(msg);
    case EACCES:
    case EPERM:
      return {StatusCode::kPermissionDenied, msg};
    case ENOMEM:
      return ResourceExhausted(msg);
    default:
      return Internal(msg);
  }
}

// Closes the descriptor on every return path of Open.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() { ::close(fd_); }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

}  // namespace

StatusOr<MappedFile> MappedFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "cannot open", path);
  FdCloser closer(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoStatus(errno, "cannot stat", path);
  if (!S_ISREG(st.st_mode)) return InvalidArgument("not a regular file: " + path);

  MappedFile file;
  file.path_ = path;
  file.size_ = static_cast<size_t>(st.st_size);
  // mmap rejects a zero length, and an empty file has nothing to map anyway.
  if (file.size_ == 0) return file;
  void* p = ::mmap(nullptr, file.size_, PROT_READ, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED) {
    file.size_ = 0;
    return ErrnoStatus(errno, "cannot mmap", path);
  }
  file.data_ = static_cast<const uint8_t*>(p);
  return file;
}

MappedFile::~MappedFile() { Reset(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      path_(std::move(other.path_)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    path_ = std::move(other.path_);
  }
  return *this;
}

void MappedFile::Reset() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

size_t PrefetchMemory(const void* data, size_t bytes) {
  if (data == nullptr || bytes == 0) return 0;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t aligned = begin & ~(uintptr_t{page} - 1);
  // Advice is best effort: memory that is not a file mapping just ignores it.
  ::madvise(reinterpret_cast<void*>(aligned), bytes + (begin - aligned), MADV_WILLNEED);
  const volatile uint8_t* p = static_cast<const uint8_t*>(data);
  uint8_t sink = 0;
  for (size_t off = 0; off < bytes; off += page) sink ^= p[off];
  sink ^= p[bytes - 1];
  (void)sink;
  return bytes;
}

void ReleaseFileMemory(const void* data, size_t bytes) {
  if (data == nullptr || bytes == 0) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + page - 1) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(page - 1);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace deja
