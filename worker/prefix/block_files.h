// BlockFiles: the disk tier of a worker's prefix KV cache. Each cached KV block (opaque bytes) is
// one file `<dir>/<id>.kvb`, written once by a background thread and checked on every read. The
// index of blocks lives in the coordinator, so this class keeps none: a file is there or not.
//
// On-disk format (little-endian; version 1):
//   offset  size  field
//        0     8  magic "DJKVBLK\0"
//        8     4  format version (1)
//       12     4  header CRC-32C: of bytes [0, 48 + 4 * num_chunks) with this field zeroed
//       16     8  layout_key (model, dtype, geometry, rank; must match the reader's)
//       24     8  block id (must match the file name's)
//       32     8  payload_bytes
//       40     4  chunk_bytes (> 0)
//       44     4  num_chunks = ceil(payload_bytes / chunk_bytes)
//       48  4*n   CRC-32C of each payload chunk (the last one may be short)
//   48+4*n    ..  payload
// Chunk CRCs are the only payload check: a whole read verifies all of them, a ranged read only
// the chunks it touches, so one flipped bit costs at most one chunk and a slice never pays for
// the whole block. The header and CRC table of a file read before are kept in memory (keyed by
// the file's inode, size and change time), so later ranged reads of it read only their chunks.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"

namespace deja::worker::prefix {

// CRC-32C (Castagnoli), software slicing-by-8. `crc` is the result of a previous call when the
// data comes in pieces (0 to start): Crc32c(b, n, Crc32c(a, m)) == CRC of a followed by b.
uint32_t Crc32c(const void* data, size_t bytes, uint32_t crc = 0);

struct BlockFilesOptions {
  // Write() blocks while more than this many bytes are queued or being written.
  int64_t max_pending_bytes = 256 << 20;
  // Granularity of the payload CRCs, and so the most a ranged read reads beyond each range's
  // ends (rounded out to chunk boundaries) plus 4 bytes of table per chunk in the file.
  uint32_t chunk_bytes = 4096;
  // fdatasync each file before its rename and fsync the directory after. Off by default: Open
  // deletes every file of an earlier process, so surviving power loss buys nothing, and torn
  // files from a crash fail their checksums anyway. On bounds the page cache's dirty memory
  // (and costs a device flush per block).
  bool sync = false;
};

struct VerifiedTables;

class BlockFiles {
 public:
  // Creates `dir` (with parents) and deletes the files an earlier BlockFiles left in it
  // (`<decimal id>.kvb` and `<decimal id>.kvb.tmp`), keeping any other file: a new worker group
  // starts with an empty cache. InvalidArgument for bad options, Internal if `dir` cannot be
  // created or listed.
  static StatusOr<std::unique_ptr<BlockFiles>> Open(const std::string& dir, uint64_t layout_key,
                                                    int64_t max_pending_bytes = 256 << 20) {
    return Open(dir, layout_key, BlockFilesOptions{.max_pending_bytes = max_pending_bytes});
  }
  static StatusOr<std::unique_ptr<BlockFiles>> Open(const std::string& dir, uint64_t layout_key,
                                                    const BlockFilesOptions& options);
  // Flushes, then joins the writer.
  ~BlockFiles();
  BlockFiles(const BlockFiles&) = delete;
  BlockFiles& operator=(const BlockFiles&) = delete;

  // Queues `data` (may be empty, not null) as block `id` and returns, unless the queue is over
  // max_pending_bytes: then it waits for the writer to drain below (a single block larger than
  // the limit waits for an empty queue). A later Write of the same id replaces the file. Failures
  // are logged and counted; the block then has no file.
  void Write(uint64_t id, std::shared_ptr<const std::vector<char>> data);

  // Copies block `id`, which must be `bytes` long, into `out`. A block still queued or being
  // written is copied from its buffer, without waiting behind the queue. NotFound without a
  // file; DataLoss naming the file and the mismatch for a file that is torn, corrupt, of another
  // layout or block, or not `bytes` long; Internal for other I/O errors. `bytes_read`, when not
  // null, grows by what this call read from the file (as bytes_read()).
  Status Read(uint64_t id, char* out, size_t bytes, int64_t* bytes_read = nullptr);
  // Copies the payload ranges (offset, length), in order, end to end into `out`. Reads and
  // verifies only the chunks that cover them. InvalidArgument for a range past the payload's
  // end; otherwise as Read.
  Status ReadRanges(uint64_t id, const std::vector<std::pair<size_t, size_t>>& ranges, char* out,
                    int64_t* bytes_read = nullptr);

  // Drops block `id`: cancels its queued writes, waits for one in flight, deletes its file.
  void Remove(uint64_t id);
  // Waits until every queued write has finished.
  void Flush();

  const std::string& dir() const { return dir_; }
  // Bytes written to / read from files, headers and whole CRC chunks included.
  int64_t bytes_written() const { return bytes_written_.load(); }
  int64_t bytes_read() const { return bytes_read_.load(); }
  int64_t write_failures() const { return write_failures_.load(); }
  // Payload bytes queued or being written.
  int64_t pending_bytes() const { return pending_bytes_.load(); }

 private:
  struct Job {
    uint64_t id;
    uint64_t seq;
    std::shared_ptr<const std::vector<char>> data;
  };
  // The newest unfinished write of an id: what Read serves until its file is final.
  struct Unwritten {
    uint64_t seq;
    std::shared_ptr<const std::vector<char>> data;
  };

  BlockFiles(std::string dir, uint64_t layout_key, const BlockFilesOptions& options);
  void WriterLoop();
  Status WriteFile(const Job& job);
  // Read (`payload_bytes` set) and ReadRanges: ReadInto counting into bytes_read_ and
  // *bytes_read.
  Status ReadCounted(uint64_t id, const std::vector<std::pair<size_t, size_t>>& ranges, char* out,
                     std::optional<size_t> payload_bytes, int64_t* bytes_read);
  Status ReadInto(uint64_t id, const std::vector<std::pair<size_t, size_t>>& ranges, char* out,
                  std::optional<size_t> payload_bytes, std::atomic<int64_t>& bytes_read);
  // The buffer of an unfinished write of `id`, or null.
  std::shared_ptr<const std::vector<char>> FindUnwritten(uint64_t id);
  std::string PathOf(uint64_t id) const;

  const std::string dir_;
  const uint64_t layout_key_;
  const BlockFilesOptions options_;

  std::mutex mu_;
  std::condition_variable work_cv_;  // writer: a job arrived or stop
  std::condition_variable done_cv_;  // waiters: a job finished or was cancelled
  std::deque<Job> queue_;
  std::unordered_map<uint64_t, Unwritten> unwritten_;
  std::optional<uint64_t> in_flight_;  // id of the job being written
  uint64_t next_seq_ = 0;
  bool stop_ = false;

  std::atomic<int64_t> bytes_written_{0};
  std::atomic<int64_t> bytes_read_{0};
  std::atomic<int64_t> write_failures_{0};
  std::atomic<int64_t> pending_bytes_{0};
  // The headers and CRC tables of files read before (block_files.cc).
  std::unique_ptr<VerifiedTables> verified_;

  std::thread writer_;  // last: starts after every member it uses exists
};

}  // namespace deja::worker::prefix
