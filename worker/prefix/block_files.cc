// BlockFiles: block files on disk, their background writer and their checks (format in the
// header).
#include "worker/prefix/block_files.h"

#include <fcntl.h>
#include <glog/logging.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <unordered_map>

namespace deja::worker::prefix {
namespace {

// Header fields are copied to and from disk as they lie in memory.
static_assert(std::endian::native == std::endian::little, "block files are little-endian");

constexpr char kMagic[8] = {'D', 'J', 'K', 'V', 'B', 'L', 'K', '\0'};
constexpr uint32_t kVersion = 1;
// Bounds what a corrupt header can make a reader allocate per chunk.
constexpr uint32_t kMaxChunkBytes = 1u << 30;

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t header_crc;
  uint64_t layout_key;
  uint64_t id;
  uint64_t payload_bytes;
  uint32_t chunk_bytes;
  uint32_t num_chunks;
};
static_assert(sizeof(Header) == 48 && std::is_trivially_copyable_v<Header>);

// Slicing-by-8 tables: kCrc[0] is the bytewise table of the reflected Castagnoli polynomial,
// kCrc[k][b] the CRC of byte b followed by k zero bytes, so eight lookups consume eight bytes.
constexpr auto kCrc = [] {
  std::array<std::array<uint32_t, 256>, 8> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    t[0][i] = c;
  }
  for (int s = 1; s < 8; ++s) {
    for (int i = 0; i < 256; ++i) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
  }
  return t;
}();

uint64_t NumChunks(uint64_t payload_bytes, uint32_t chunk_bytes) {
  return payload_bytes / chunk_bytes + (payload_bytes % chunk_bytes != 0);
}
uint64_t PayloadOffset(const Header& h) { return sizeof(Header) + 4ull * h.num_chunks; }

std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%016" PRIx64, v);
  return buf;
}

std::string ErrnoMessage(int err, const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::generic_category().message(err);
}

// `<decimal id>.kvb` or `<decimal id>.kvb.tmp`: the names this class writes.
bool IsOwnFileName(std::string_view name) {
  size_t digits = 0;
  while (digits < name.size() && name[digits] >= '0' && name[digits] <= '9') ++digits;
  const std::string_view rest = name.substr(digits);
  return digits > 0 && digits <= 20 && (rest == ".kvb" || rest == ".kvb.tmp");
}

// Owns a file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  int get() const { return fd_; }
  // Returns close's result: some filesystems (NFS) report write errors only there.
  int Close() { return ::close(std::exchange(fd_, -1)); }

 private:
  int fd_ = -1;
};

Status WriteAll(int fd, const char* data, size_t bytes, const std::string& path) {
  while (bytes > 0) {
    const ssize_t n = ::write(fd, data, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Internal(ErrnoMessage(n < 0 ? errno : EIO, "writing", path));
    data += n;
    bytes -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

// Reads exactly `bytes` at `offset`; the file ending early is DataLoss (it shrank after fstat).
Status PreadAll(int fd, void* out, size_t bytes, uint64_t offset, const std::string& path,
                std::atomic<int64_t>& counter) {
  char* p = static_cast<char*>(out);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Internal(ErrnoMessage(errno, "reading", path));
    if (n == 0) return DataLoss(path + ": file ended at byte " + std::to_string(offset));
    counter += n;
    p += n;
    offset += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

// Opens block file `path`: a regular file.
Status OpenBlockFile(const std::string& path, Fd& fd, struct stat& st) {
  const int raw = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (raw < 0) {
    const int err = errno;
    if (err == ENOENT) return NotFound(path + ": no such block file");
    return Internal(ErrnoMessage(err, "opening", path));
  }
  fd = Fd(raw);
  if (::fstat(fd.get(), &st) != 0) return Internal(ErrnoMessage(errno, "stat of", path));
  if (!S_ISREG(st.st_mode)) return DataLoss(path + ": not a regular file");
  return Status::Ok();
}

// Checks everything in an open block file but the payload: that its size matches its header,
// the header's checksum, layout and id. Nothing in the file is trusted before it has been
// bounded by the file's size.
Status CheckHeader(const std::string& path, uint64_t layout_key, uint64_t id, const Fd& fd,
                   const struct stat& st, Header& h, std::vector<uint32_t>& crcs,
                   std::atomic<int64_t>& bytes_read) {
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < sizeof(Header)) {
    return DataLoss(path + ": truncated: " + std::to_string(file_bytes) +
                    " bytes, shorter than a header");
  }
  DEJA_RETURN_IF_ERROR(PreadAll(fd.get(), &h, sizeof(h), 0, path, bytes_read));
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) {
    return DataLoss(path + ": bad magic, not a block file");
  }
  if (h.version != kVersion) {
    return DataLoss(path + ": format version " + std::to_string(h.version) + ", expected " +
                    std::to_string(kVersion));
  }
  if (h.chunk_bytes == 0 || h.chunk_bytes > kMaxChunkBytes ||
      h.num_chunks != NumChunks(h.payload_bytes, h.chunk_bytes)) {
    return DataLoss(path + ": corrupt header: " + std::to_string(h.num_chunks) + " chunks of " +
                    std::to_string(h.chunk_bytes) + " bytes cannot hold a " +
                    std::to_string(h.payload_bytes) + "-byte payload");
  }
  // payload_bytes is bounded first so the sum cannot wrap.
  if (h.payload_bytes > file_bytes || PayloadOffset(h) + h.payload_bytes != file_bytes) {
    return DataLoss(path + ": file is " + std::to_string(file_bytes) +
                    " bytes, its header describes a " + std::to_string(h.payload_bytes) +
                    "-byte payload (torn or corrupt)");
  }
  crcs.resize(h.num_chunks);
  DEJA_RETURN_IF_ERROR(
      PreadAll(fd.get(), crcs.data(), 4ull * h.num_chunks, sizeof(h), path, bytes_read));
  Header zeroed = h;
  zeroed.header_crc = 0;
  if (Crc32c(crcs.data(), 4ull * h.num_chunks, Crc32c(&zeroed, sizeof(zeroed))) != h.header_crc) {
    return DataLoss(path + ": header checksum mismatch");
  }
  if (h.layout_key != layout_key) {
    return DataLoss(path + ": written for layout " + Hex(h.layout_key) + ", this worker's is " +
                    Hex(layout_key));
  }
  if (h.id != id) {
    return DataLoss(path + ": holds block " + std::to_string(h.id) + ", not " + std::to_string(id));
  }
  return Status::Ok();
}

// Checks chunks [first, end) of the payload, whose bytes start at `data`.
Status VerifyChunks(const std::string& path, const Header& h, const std::vector<uint32_t>& crcs,
                    uint64_t first, uint64_t end, const char* data) {
  for (uint64_t c = first; c < end; ++c) {
    const uint64_t begin = c * h.chunk_bytes;
    const uint64_t len = std::min<uint64_t>(h.chunk_bytes, h.payload_bytes - begin);
    if (Crc32c(data + (begin - first * h.chunk_bytes), len) != crcs[c]) {
      return DataLoss(path + ": checksum mismatch in payload chunk " + std::to_string(c) +
                      " (bytes " + std::to_string(begin) + ".." + std::to_string(begin + len) +
                      ")");
    }
  }
  return Status::Ok();
}

Status CheckRanges(const std::vector<std::pair<size_t, size_t>>& ranges, uint64_t payload_bytes,
                   const std::string& path) {
  for (const auto& [offset, length] : ranges) {
    if (length > payload_bytes || offset > payload_bytes - length) {
      return InvalidArgument(path + ": range at " + std::to_string(offset) + " of " +
                             std::to_string(length) + " bytes is past the " +
                             std::to_string(payload_bytes) + "-byte payload");
    }
  }
  return Status::Ok();
}

}  // namespace

uint32_t Crc32c(const void* data, size_t bytes, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (; bytes >= 8; bytes -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    v ^= crc;
    crc = kCrc[7][v & 0xFF] ^ kCrc[6][(v >> 8) & 0xFF] ^ kCrc[5][(v >> 16) & 0xFF] ^
          kCrc[4][(v >> 24) & 0xFF] ^ kCrc[3][(v >> 32) & 0xFF] ^ kCrc[2][(v >> 40) & 0xFF] ^
          kCrc[1][(v >> 48) & 0xFF] ^ kCrc[0][v >> 56];
  }
  for (; bytes > 0; --bytes, ++p) crc = (crc >> 8) ^ kCrc[0][(crc ^ *p) & 0xFF];
  return ~crc;
}

StatusOr<std::unique_ptr<BlockFiles>> BlockFiles::Open(const std::string& dir, uint64_t layout_key,
                                                       const BlockFilesOptions& options) {
  namespace fs = std::filesystem;
  if (options.max_pending_bytes <= 0) {
    return InvalidArgument("block files: max_pending_bytes must be positive, got " +
                           std::to_string(options.max_pending_bytes));
  }
  if (options.chunk_bytes == 0 || options.chunk_bytes > kMaxChunkBytes) {
    return InvalidArgument("block files: chunk_bytes must be in [1, 2^30], got " +
                           std::to_string(options.chunk_bytes));
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir, ec)) {
    return Internal("block files: cannot create directory " + dir +
                    (ec ? ": " + ec.message() : ": not a directory"));
  }
  // Collected first: unlinking while a directory is being listed may skip entries. A stale file
  // that survived would be served if a later write of its id failed, so failing to delete one
  // fails Open.
  std::vector<fs::path> old;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    if (IsOwnFileName(it->path().filename().string()) && !it->is_directory(type_ec)) {
      old.push_back(it->path());
    }
  }
  if (ec) return Internal("block files: listing " + dir + ": " + ec.message());
  for (const fs::path& p : old) {
    if (!fs::remove(p, ec) && ec) {
      return Internal("block files: deleting old " + p.string() + ": " + ec.message());
    }
  }
  LOG(INFO) << "Block files in " << dir << " for layout " << Hex(layout_key) << ": deleted "
            << old.size() << " of an earlier worker";
  return std::unique_ptr<BlockFiles>(new BlockFiles(dir, layout_key, options));
}

// Headers and CRC tables already checked, per block id, with the identity of the file they came
// from: a later read of the same file (same device, inode, size and change time) does not read
// and check them again. Its payload is still checked chunk by chunk against the table. A file
// rewritten by this class is a new inode (written aside, then renamed over).
struct VerifiedTables {
  struct Entry {
    dev_t dev;
    ino_t ino;
    off_t size;
    int64_t ctime_ns;
    Header header;
    std::shared_ptr<const std::vector<uint32_t>> crcs;
  };
  static constexpr int64_t kMaxBytes = 64ll << 20;  // of tables held; past it, start over

  static int64_t CtimeNs(const struct stat& st) {
    return static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
  }
  bool Find(uint64_t id, const struct stat& st, Header* h,
            std::shared_ptr<const std::vector<uint32_t>>* crcs) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = entries.find(id);
    if (it == entries.end()) return false;
    const Entry& e = it->second;
    if (e.dev != st.st_dev || e.ino != st.st_ino || e.size != st.st_size ||
        e.ctime_ns != CtimeNs(st)) {
      return false;
    }
    *h = e.header;
    *crcs = e.crcs;
    return true;
  }
  void Put(uint64_t id, const struct stat& st, const Header& h,
           std::shared_ptr<const std::vector<uint32_t>> crcs) {
    std::lock_guard<std::mutex> lock(mu);
    EraseLocked(id);
    const int64_t b = static_cast<int64_t>(crcs->size()) * 4;
    if (bytes + b > kMaxBytes) {
      entries.clear();
      bytes = 0;
    }
    bytes += b;
    entries[id] = Entry{st.st_dev, st.st_ino, st.st_size, CtimeNs(st), h, std::move(crcs)};
  }
  void Erase(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu);
    EraseLocked(id);
  }
  void EraseLocked(uint64_t id) {
    auto it = entries.find(id);
    if (it == entries.end()) return;
    bytes -= static_cast<int64_t>(it->second.crcs->size()) * 4;
    entries.erase(it);
  }

  std::mutex mu;
  std::unordered_map<uint64_t, Entry> entries;
  int64_t bytes = 0;
};

BlockFiles::BlockFiles(std::string dir, uint64_t layout_key, const BlockFilesOptions& options)
    : dir_(std::move(dir)),
      layout_key_(layout_key),
      options_(options),
      verified_(std::make_unique<VerifiedTables>()),
      writer_([this] { WriterLoop(); }) {}

BlockFiles::~BlockFiles() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_one();
  writer_.join();  // the writer drains the queue before it returns
}

std::string BlockFiles::PathOf(uint64_t id) const {
  return dir_ + "/" + std::to_string(id) + ".kvb";
}

void BlockFiles::Write(uint64_t id, std::shared_ptr<const std::vector<char>> data) {
  CHECK(data != nullptr) << "BlockFiles::Write of block " << id << " without data";
  const int64_t bytes = static_cast<int64_t>(data->size());
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] {
    return pending_bytes_ == 0 || pending_bytes_ + bytes <= options_.max_pending_bytes;
  });
  const uint64_t seq = next_seq_++;
  unwritten_[id] = Unwritten{seq, data};
  queue_.push_back(Job{id, seq, std::move(data)});
  pending_bytes_ += bytes;
  work_cv_.notify_one();
}

void BlockFiles::WriterLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and drained
    Job job = std::move(queue_.front());
    queue_.pop_front();
    in_flight_ = job.id;
    lock.unlock();
    const Status status = WriteFile(job);
    if (!status.ok()) {
      ++write_failures_;
      LOG(WARNING) << "Block " << job.id << " has no disk copy: " << status.ToString();
    }
    lock.lock();
    in_flight_.reset();
    pending_bytes_ -= static_cast<int64_t>(job.data->size());
    // Only now, with the file final (or failed), may readers stop using the buffer; a newer
    // write of the same id keeps its own entry.
    auto it = unwritten_.find(job.id);
    if (it != unwritten_.end() && it->second.seq == job.seq) unwritten_.erase(it);
    done_cv_.notify_all();
  }
}

Status BlockFiles::WriteFile(const Job& job) {
  const std::vector<char>& payload = *job.data;
  const uint32_t chunk = options_.chunk_bytes;
  const uint64_t num_chunks = NumChunks(payload.size(), chunk);
  const std::string path = PathOf(job.id);
  const std::string tmp = path + ".tmp";
  Status status = [&]() -> Status {
    if (num_chunks > UINT32_MAX) return InvalidArgument(path + ": payload has too many chunks");
    Header h{};
    std::memcpy(h.magic, kMagic, sizeof(kMagic));
    h.version = kVersion;
    h.layout_key = layout_key_;
    h.id = job.id;
    h.payload_bytes = payload.size();
    h.chunk_bytes = chunk;
    h.num_chunks = static_cast<uint32_t>(num_chunks);
    std::vector<uint32_t> crcs(num_chunks);
    for (uint64_t c = 0; c < num_chunks; ++c) {
      const uint64_t begin = c * chunk;
      crcs[c] = Crc32c(payload.data() + begin, std::min<uint64_t>(chunk, payload.size() - begin));
    }
    h.header_crc = Crc32c(crcs.data(), 4 * num_chunks, Crc32c(&h, sizeof(h)));
    Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) return Internal(ErrnoMessage(errno, "creating", tmp));
    DEJA_RETURN_IF_ERROR(WriteAll(fd.get(), reinterpret_cast<const char*>(&h), sizeof(h), tmp));
    DEJA_RETURN_IF_ERROR(
        WriteAll(fd.get(), reinterpret_cast<const char*>(crcs.data()), 4 * num_chunks, tmp));
    DEJA_RETURN_IF_ERROR(WriteAll(fd.get(), payload.data(), payload.size(), tmp));
    if (options_.sync && ::fdatasync(fd.get()) != 0) {
      return Internal(ErrnoMessage(errno, "syncing", tmp));
    }
    if (fd.Close() != 0) return Internal(ErrnoMessage(errno, "closing", tmp));
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      return Internal(ErrnoMessage(errno, "renaming to", path));
    }
    bytes_written_ += static_cast<int64_t>(PayloadOffset(h) + payload.size());
    return Status::Ok();
  }();
  if (!status.ok()) {
    // An older file of this id would otherwise be served in its place.
    ::unlink(tmp.c_str());
    ::unlink(path.c_str());
    return status;
  }
  if (options_.sync) {
    // Makes the rename durable; the file itself is complete either way, so this only warns.
    Fd dir_fd(::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (dir_fd.get() < 0 || ::fsync(dir_fd.get()) != 0) {
      LOG(WARNING) << ErrnoMessage(errno, "syncing directory", dir_);
    }
  }
  return Status::Ok();
}

std::shared_ptr<const std::vector<char>> BlockFiles::FindUnwritten(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = unwritten_.find(id);
  return it == unwritten_.end() ? nullptr : it->second.data;
}

Status BlockFiles::Read(uint64_t id, char* out, size_t bytes, int64_t* bytes_read) {
  return ReadCounted(id, {{0, bytes}}, out, bytes, bytes_read);
}

Status BlockFiles::ReadRanges(uint64_t id, const std::vector<std::pair<size_t, size_t>>& ranges,
                              char* out, int64_t* bytes_read) {
  return ReadCounted(id, ranges, out, std::nullopt, bytes_read);
}

Status BlockFiles::ReadCounted(uint64_t id, const std::vector<std::pair<size_t, size_t>>& ranges,
                               char* out, std::optional<size_t> payload_bytes,
                               int64_t* bytes_read) {
  std::atomic<int64_t> read{0};
  Status st = ReadInto(id, ranges, out, payload_bytes, read);
  bytes_read_ += read.load();
  if (bytes_read != nullptr) *bytes_read += read.load();
  return st;
}

Status BlockFiles::ReadInto(uint64_t id, const std::vector<std::pair<size_t, size_t>>& ranges,
                            char* out, std::optional<size_t> payload_bytes,
                            std::atomic<int64_t>& bytes_read) {
  std::string path = PathOf(id);
  auto size_is = [&](uint64_t actual) {
    if (!payload_bytes || actual == *payload_bytes) return CheckRanges(ranges, actual, path);
    return DataLoss(path + ": payload is " + std::to_string(actual) + " bytes, expected " +
                    std::to_string(*payload_bytes));
  };
  // Copied outside the lock: the shared_ptr keeps the buffer alive if its write finishes.
  if (auto data = FindUnwritten(id)) {
    path += " (queued)";
    DEJA_RETURN_IF_ERROR(size_is(data->size()));
    for (const auto& [offset, length] : ranges) {
      if (length > 0) std::memcpy(out, data->data() + offset, length);
      out += length;
    }
    return Status::Ok();
  }
  Fd fd;
  struct stat st;
  DEJA_RETURN_IF_ERROR(OpenBlockFile(path, fd, st));
  Header h;
  std::shared_ptr<const std::vector<uint32_t>> table;
  if (!verified_->Find(id, st, &h, &table)) {
    std::vector<uint32_t> read;
    DEJA_RETURN_IF_ERROR(CheckHeader(path, layout_key_, id, fd, st, h, read, bytes_read));
    table = std::make_shared<const std::vector<uint32_t>>(std::move(read));
    verified_->Put(id, st, h, table);
  }
  const std::vector<uint32_t>& crcs = *table;
  DEJA_RETURN_IF_ERROR(size_is(h.payload_bytes));

  // Ranges in file order, so those whose chunks touch or overlap share one read and one check.
  std::vector<size_t> out_offset(ranges.size());
  std::vector<size_t> order;
  for (size_t i = 0, at = 0; i < ranges.size(); at += ranges[i].second, ++i) {
    out_offset[i] = at;
    if (ranges[i].second > 0) order.push_back(i);
  }
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return ranges[a].first < ranges[b].first; });
  const uint64_t chunk = h.chunk_bytes;
  auto last_chunk = [&](size_t i) { return (ranges[i].first + ranges[i].second - 1) / chunk; };
  std::vector<char> buf;
  for (size_t k = 0; k < order.size();) {
    const uint64_t first = ranges[order[k]].first / chunk;
    uint64_t last = last_chunk(order[k]);
    size_t end = k + 1;
    for (; end < order.size() && ranges[order[end]].first / chunk <= last + 1; ++end) {
      last = std::max(last, last_chunk(order[end]));
    }
    const uint64_t begin_byte = first * chunk;
    const uint64_t run_bytes = std::min<uint64_t>(h.payload_bytes, (last + 1) * chunk) - begin_byte;
    // A range that is exactly its chunks (a whole read) goes straight to `out`, without a copy.
    const auto& [offset, length] = ranges[order[k]];
    const bool direct = end == k + 1 && offset == begin_byte && length == run_bytes;
    if (!direct) buf.resize(run_bytes);
    char* run = direct ? out + out_offset[order[k]] : buf.data();
    DEJA_RETURN_IF_ERROR(
        PreadAll(fd.get(), run, run_bytes, PayloadOffset(h) + begin_byte, path, bytes_read));
    DEJA_RETURN_IF_ERROR(VerifyChunks(path, h, crcs, first, last + 1, run));
    for (; !direct && k < end; ++k) {
      const size_t i = order[k];
      std::memcpy(out + out_offset[i], run + (ranges[i].first - begin_byte), ranges[i].second);
    }
    k = end;
  }
  return Status::Ok();
}

void BlockFiles::Remove(uint64_t id) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (it->id != id) {
        ++it;
        continue;
      }
      pending_bytes_ -= static_cast<int64_t>(it->data->size());
      it = queue_.erase(it);
    }
    unwritten_.erase(id);
    done_cv_.notify_all();  // the queue shrank: Write and Flush may go on
    done_cv_.wait(lock, [&] { return in_flight_ != id; });
  }
  verified_->Erase(id);
  if (::unlink(PathOf(id).c_str()) != 0 && errno != ENOENT) {
    LOG(WARNING) << ErrnoMessage(errno, "deleting", PathOf(id));
  }
}

void BlockFiles::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return queue_.empty() && !in_flight_.has_value(); });
}

}  // namespace deja::worker::prefix
