// BlockFiles (worker/prefix/block_files.h) on real files in a fresh temporary directory: round
// trips, unfinished writes served from their buffers, every kind of bad file read as DataLoss
// (never a crash), ranged reads and their chunk checks, Remove, Open's cleanup, back-pressure
// and concurrent use. A FIFO planted as a block's temporary file holds the writer inside that
// write for as long as a test needs.
#include "worker/prefix/block_files.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace deja::worker::prefix {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<char>;
using Ranges = std::vector<std::pair<size_t, size_t>>;

constexpr uint64_t kLayout = 0x1234'5678'9abc'def0ull;
// Pinned by the format documented in block_files.h.
constexpr size_t kHeaderBytes = 48;

size_t FileBytes(size_t payload, size_t chunk) {
  return kHeaderBytes + 4 * ((payload + chunk - 1) / chunk) + payload;
}

std::shared_ptr<const Bytes> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto b = std::make_shared<Bytes>(n);
  for (char& c : *b) c = static_cast<char>(rng());
  return b;
}

uint32_t BitwiseCrc32c(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t crc = ~0u;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

Bytes Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

void Store(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

Bytes Concat(const Bytes& payload, const Ranges& ranges) {
  Bytes out;
  for (const auto& [offset, length] : ranges) {
    out.insert(out.end(), payload.begin() + offset, payload.begin() + offset + length);
  }
  return out;
}

class BlockFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/block_files_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    dir_ = root_ + "/blocks";
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  std::unique_ptr<BlockFiles> OpenFiles(BlockFilesOptions options = {}, std::string dir = "",
                                        uint64_t layout = kLayout) {
    auto files = BlockFiles::Open(dir.empty() ? dir_ : dir, layout, options);
    CHECK(files.ok()) << files.status().ToString();
    return std::move(files).value();
  }
  std::string PathOf(uint64_t id, const std::string& dir = "") const {
    return (dir.empty() ? dir_ : dir) + "/" + std::to_string(id) + ".kvb";
  }
  // Reads block `id` as `bytes` long and compares it with `want` when it reads.
  static Status ReadEquals(BlockFiles& files, uint64_t id, size_t bytes, const Bytes& want) {
    Bytes got(bytes);
    Status s = files.Read(id, got.data(), bytes);
    if (s.ok()) {
      EXPECT_EQ(got, want) << "block " << id;
    }
    return s;
  }

  std::string root_;
  std::string dir_;
};

TEST(Crc32cTest, MatchesPublishedValuesAndABitwiseReference) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  Bytes zeros(32, 0), ones(32, '\xFF'), up(32), down(32);
  for (int i = 0; i < 32; ++i) up[i] = static_cast<char>(i), down[i] = static_cast<char>(31 - i);
  // RFC 3720, B.4.
  EXPECT_EQ(Crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(up.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(down.data(), 32), 0x113FDB5Cu);
  EXPECT_EQ(Crc32c(nullptr, 0), 0u);

  const auto data = RandomBytes(5000, 1);
  std::mt19937_64 rng(2);
  for (int i = 0; i < 300; ++i) {
    const size_t start = rng() % 64, len = rng() % (i < 200 ? 80 : 4900);
    const char* p = data->data() + start;
    const uint32_t want = BitwiseCrc32c(p, len);
    ASSERT_EQ(Crc32c(p, len), want) << "start " << start << " length " << len;
    const size_t split = len == 0 ? 0 : rng() % len;
    ASSERT_EQ(Crc32c(p + split, len - split, Crc32c(p, split)), want) << "split " << split;
  }
}

TEST(Crc32cTest, Throughput) {
  const auto data = RandomBytes(64 << 20, 3);
  Crc32c(data->data(), data->size());  // warm the pages and caches
  const int passes = 4;
  uint32_t crc = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < passes; ++i) crc = Crc32c(data->data(), data->size());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("CRC-32C (slicing-by-8): %.0f MB/s over %d x 64 MiB (crc %08x)\n",
              passes * 64.0 * 1.048576 / s, passes, crc);
  EXPECT_GT(s, 0);
}

TEST_F(BlockFilesTest, RoundTripsPayloadsOfManySizesAndChunkSizes) {
  const std::vector<size_t> sizes = {0,    1,    7,    8,    9,       4095,
                                     4096, 4097, 8191, 8192, 3 << 20, (3 << 20) + 5};
  for (uint32_t chunk : {7u, 4096u, 65536u}) {
    SCOPED_TRACE("chunk_bytes " + std::to_string(chunk));
    const std::string dir = dir_ + "/c" + std::to_string(chunk);
    auto files = OpenFiles({.chunk_bytes = chunk}, dir);
    std::vector<std::shared_ptr<const Bytes>> data;
    int64_t total = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      data.push_back(RandomBytes(sizes[i], 100 + i));
      files->Write(i, data.back());
      total += static_cast<int64_t>(FileBytes(sizes[i], chunk));
    }
    files->Flush();
    EXPECT_EQ(files->pending_bytes(), 0);
    EXPECT_EQ(files->write_failures(), 0);
    EXPECT_EQ(files->bytes_written(), total);
    for (size_t i = 0; i < sizes.size(); ++i) {
      SCOPED_TRACE("payload " + std::to_string(sizes[i]));
      EXPECT_EQ(fs::file_size(PathOf(i, dir)), FileBytes(sizes[i], chunk));
      EXPECT_FALSE(fs::exists(PathOf(i, dir) + ".tmp"));
      const int64_t before = files->bytes_read();
      EXPECT_TRUE(ReadEquals(*files, i, sizes[i], *data[i]).ok());
      EXPECT_EQ(files->bytes_read() - before, static_cast<int64_t>(FileBytes(sizes[i], chunk)));
    }
  }
  // Null with zero bytes is a valid destination for an empty block.
  auto files = OpenFiles({}, dir_ + "/c7");
  files->Write(1, std::make_shared<Bytes>());
  files->Flush();
  EXPECT_TRUE(files->Read(1, nullptr, 0).ok());
  EXPECT_TRUE(files->ReadRanges(1, {{0, 0}}, nullptr).ok());
}

TEST_F(BlockFilesTest, SyncedWritesRoundTrip) {
  auto files = OpenFiles({.sync = true});
  const auto data = RandomBytes(100000, 4);
  files->Write(3, data);
  files->Flush();
  EXPECT_TRUE(ReadEquals(*files, 3, data->size(), *data).ok());
}

TEST_F(BlockFilesTest, ReadsRightAfterWritesSeeTheNewestData) {
  auto files = OpenFiles();
  std::vector<std::shared_ptr<const Bytes>> newest(50);
  for (int round = 0; round < 3; ++round) {
    for (uint64_t id = 0; id < newest.size(); ++id) {
      newest[id] = RandomBytes(65536 + id, round * 1000 + id);
      files->Write(id, newest[id]);
      ASSERT_TRUE(ReadEquals(*files, id, newest[id]->size(), *newest[id]).ok());
      Bytes part(100);
      ASSERT_TRUE(files->ReadRanges(id, {{60000, 100}}, part.data()).ok());
      EXPECT_EQ(part, Concat(*newest[id], {{60000, 100}}));
    }
  }
  files->Flush();
  for (uint64_t id = 0; id < newest.size(); ++id) {
    EXPECT_TRUE(ReadEquals(*files, id, newest[id]->size(), *newest[id]).ok());
  }
}

TEST_F(BlockFilesTest, QueuedWritesAreServedCancelledAndWaitedForWhileTheWriterIsBusy) {
  auto files = OpenFiles();
  // Block 1's temporary file is a FIFO: the writer stays in that write until the test reads it.
  const std::string fifo = PathOf(1) + ".tmp";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const int rfd = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(rfd, 0);
  const auto one = RandomBytes(1 << 20, 1);  // far more than a pipe holds
  const auto two = RandomBytes(5000, 2);
  const auto three = RandomBytes(3000, 3);
  files->Write(1, one);
  files->Write(2, two);
  files->Write(3, three);
  pollfd p{rfd, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 10000), 1) << "the writer never started block 1";
  EXPECT_EQ(files->pending_bytes(), (1 << 20) + 5000 + 3000);

  // In flight and queued blocks are served from their buffers, at once.
  EXPECT_TRUE(ReadEquals(*files, 1, one->size(), *one).ok());
  EXPECT_TRUE(ReadEquals(*files, 2, two->size(), *two).ok());
  EXPECT_EQ(files->Read(2, nullptr, 0).code(), StatusCode::kDataLoss);
  Bytes part(10);
  EXPECT_EQ(files->ReadRanges(2, {{4995, 10}}, part.data()).code(), StatusCode::kInvalidArgument);

  // A queued write is cancelled.
  files->Remove(2);
  EXPECT_EQ(files->pending_bytes(), (1 << 20) + 3000);
  EXPECT_EQ(files->Read(2, part.data(), 5000).code(), StatusCode::kNotFound);

  // Removing the block in flight waits for its write to end.
  std::atomic<bool> removed{false};
  std::thread remover([&] {
    files->Remove(1);
    removed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(removed.load());
  ASSERT_EQ(::fcntl(rfd, F_SETFL, 0), 0);
  size_t drained = 0;
  char buf[65536];
  for (ssize_t n; (n = ::read(rfd, buf, sizeof(buf))) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    ASSERT_GT(n, 0);
    drained += static_cast<size_t>(n);
  }
  ::close(rfd);
  remover.join();
  EXPECT_TRUE(removed.load());
  EXPECT_EQ(drained, FileBytes(1 << 20, 4096));
  files->Flush();
  EXPECT_FALSE(fs::exists(PathOf(1)));
  EXPECT_FALSE(fs::exists(PathOf(2)));
  EXPECT_EQ(files->Read(1, buf, 1).code(), StatusCode::kNotFound);
  EXPECT_TRUE(ReadEquals(*files, 3, three->size(), *three).ok());
  // Block 2 was never written.
  EXPECT_EQ(files->bytes_written(),
            static_cast<int64_t>(FileBytes(1 << 20, 4096) + FileBytes(3000, 4096)));
}

TEST_F(BlockFilesTest, MissingBlocksAreNotFound) {
  auto files = OpenFiles();
  char c;
  EXPECT_EQ(files->Read(42, &c, 1).code(), StatusCode::kNotFound);
  EXPECT_EQ(files->ReadRanges(42, {{0, 1}}, &c).code(), StatusCode::kNotFound);
  EXPECT_EQ(files->bytes_read(), 0);
}

TEST_F(BlockFilesTest, RemoveDeletesTheFile) {
  auto files = OpenFiles();
  const auto data = RandomBytes(10000, 5);
  files->Write(8, data);
  files->Flush();
  ASSERT_TRUE(fs::exists(PathOf(8)));
  files->Remove(8);
  EXPECT_FALSE(fs::exists(PathOf(8)));
  Bytes out(data->size());
  EXPECT_EQ(files->Read(8, out.data(), out.size()).code(), StatusCode::kNotFound);
  files->Remove(8);  // unknown ids are fine
  files->Write(8, data);
  files->Flush();
  EXPECT_TRUE(ReadEquals(*files, 8, data->size(), *data).ok());
}

TEST_F(BlockFilesTest, AFailedWriteIsCountedAndLeavesNoBlock) {
  auto files = OpenFiles();
  ASSERT_TRUE(fs::create_directory(PathOf(9)));  // the rename onto it fails, even for root
  files->Write(9, RandomBytes(1000, 6));
  files->Flush();
  EXPECT_EQ(files->write_failures(), 1);
  EXPECT_EQ(files->bytes_written(), 0);
  EXPECT_EQ(files->pending_bytes(), 0);
  EXPECT_FALSE(fs::exists(PathOf(9) + ".tmp"));
  Bytes out(1000);
  EXPECT_EQ(files->Read(9, out.data(), out.size()).code(), StatusCode::kDataLoss);
}

TEST_F(BlockFilesTest, AFlippedPayloadByteIsDataLoss) {
  auto files = OpenFiles();
  const size_t size = (3 << 20) + 17;
  const auto data = RandomBytes(size, 7);
  files->Write(7, data);
  files->Flush();
  const Bytes good = Load(PathOf(7));
  const size_t payload_at = good.size() - size;
  std::mt19937_64 rng(8);
  std::vector<size_t> positions = {0, size - 1, 4095, 4096};
  for (int i = 0; i < 20; ++i) positions.push_back(rng() % size);
  for (size_t pos : positions) {
    Bytes bad = good;
    bad[payload_at + pos] ^= static_cast<char>(1 << (rng() % 8));
    Store(PathOf(7), bad);
    const Status s = ReadEquals(*files, 7, size, *data);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << "payload byte " << pos;
    EXPECT_NE(s.message().find("7.kvb"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("chunk " + std::to_string(pos / 4096)), std::string::npos)
        << s.message();
  }
  Store(PathOf(7), good);
  EXPECT_TRUE(ReadEquals(*files, 7, size, *data).ok());
}

TEST_F(BlockFilesTest, AFlippedHeaderByteIsDataLoss) {
  auto files = OpenFiles();
  const auto data = RandomBytes(10000, 9);  // 3 chunks: 60 bytes before the payload
  files->Write(1, data);
  files->Flush();
  const Bytes good = Load(PathOf(1));
  ASSERT_EQ(good.size(), kHeaderBytes + 12 + 10000);
  for (size_t at = 0; at < kHeaderBytes + 12; ++at) {
    for (char mask : {'\x01', '\x80', '\xFF'}) {
      Bytes bad = good;
      bad[at] ^= mask;
      Store(PathOf(1), bad);
      const Status s = ReadEquals(*files, 1, data->size(), *data);
      EXPECT_EQ(s.code(), StatusCode::kDataLoss) << "header byte " << at;
      Bytes part(10);
      EXPECT_EQ(files->ReadRanges(1, {{0, 10}}, part.data()).code(), StatusCode::kDataLoss);
    }
  }
}

TEST_F(BlockFilesTest, ATruncatedOrExtendedFileIsDataLoss) {
  auto files = OpenFiles();
  const auto data = RandomBytes(10000, 10);
  files->Write(1, data);
  files->Flush();
  const Bytes good = Load(PathOf(1));
  for (size_t len : {size_t{0}, size_t{1}, size_t{47}, size_t{48}, size_t{49}, size_t{59},
                     size_t{60}, size_t{61}, size_t{5000}, good.size() - 1}) {
    Store(PathOf(1), Bytes(good.begin(), good.begin() + len));
    const Status s = ReadEquals(*files, 1, data->size(), *data);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << "truncated to " << len;
    EXPECT_NE(s.message().find("1.kvb"), std::string::npos) << s.message();
  }
  Bytes longer = good;
  longer.push_back(0);
  Store(PathOf(1), longer);
  EXPECT_EQ(ReadEquals(*files, 1, data->size(), *data).code(), StatusCode::kDataLoss);
}

TEST_F(BlockFilesTest, AFileOfAnotherLayoutOrBlockOrSizeIsDataLoss) {
  const std::string other_dir = root_ + "/other";
  auto other = OpenFiles({}, other_dir, kLayout + 1);
  auto files = OpenFiles();
  const auto data = RandomBytes(5000, 11);
  other->Write(5, data);
  other->Flush();
  fs::copy_file(PathOf(5, other_dir), PathOf(5));
  Status s = ReadEquals(*files, 5, data->size(), *data);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("layout"), std::string::npos) << s.message();

  files->Write(1, data);
  files->Flush();
  fs::rename(PathOf(1), PathOf(2));
  s = ReadEquals(*files, 2, data->size(), *data);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("holds block 1"), std::string::npos) << s.message();
  EXPECT_EQ(ReadEquals(*files, 1, data->size(), *data).code(), StatusCode::kNotFound);

  files->Write(3, data);
  files->Flush();
  EXPECT_EQ(ReadEquals(*files, 3, data->size() - 1, *data).code(), StatusCode::kDataLoss);
  EXPECT_EQ(ReadEquals(*files, 3, data->size() + 1, *data).code(), StatusCode::kDataLoss);
  EXPECT_TRUE(ReadEquals(*files, 3, data->size(), *data).ok());
}

TEST_F(BlockFilesTest, ReadRangesReturnsExactlyTheRequestedBytes) {
  for (uint32_t chunk : {1000u, 4096u}) {
    SCOPED_TRACE("chunk_bytes " + std::to_string(chunk));
    const std::string dir = dir_ + "/c" + std::to_string(chunk);
    auto files = OpenFiles({.chunk_bytes = chunk}, dir);
    const size_t size = (1 << 20) + 123;
    const size_t chunks = (size + chunk - 1) / chunk;
    const int64_t head = static_cast<int64_t>(kHeaderBytes + 4 * chunks);
    const auto data = RandomBytes(size, 12);
    files->Write(1, data);
    files->Flush();
    std::mt19937_64 rng(13);
    for (int iter = 0; iter < 300; ++iter) {
      Ranges ranges(1 + rng() % 8);
      // The header and CRC table are read once: later reads of the file use them from memory.
      const int64_t paid = iter == 0 ? head : 0;
      int64_t upper = paid;  // at most the covering chunks of every range
      for (auto& [offset, length] : ranges) {
        switch (rng() % 5) {
          case 0:
            length = 0;
            break;
          case 1:
            length = 1 + rng() % 100;
            break;
          case 2:
            length = size;
            break;
          default:
            length = 1 + rng() % 20000;
        }
        offset = rng() % (size - length + 1);
        if (rng() % 6 == 0) offset = size - length;  // up to the payload's end
        if (length > 0) {
          upper += static_cast<int64_t>(
              std::min<size_t>(size, ((offset + length - 1) / chunk + 1) * chunk) -
              offset / chunk * chunk);
        }
      }
      const Bytes want = Concat(*data, ranges);
      Bytes got(want.size() + 1, '\x5A');
      const int64_t before = files->bytes_read();
      int64_t counted = 7;  // the call adds to it
      ASSERT_TRUE(files->ReadRanges(1, ranges, got.data(), &counted).ok());
      EXPECT_EQ(got.back(), '\x5A') << "wrote past the requested bytes";
      got.pop_back();
      ASSERT_EQ(got, want) << "iteration " << iter;
      const int64_t read = files->bytes_read() - before;
      EXPECT_EQ(counted - 7, read);
      EXPECT_GE(read, paid);
      EXPECT_LE(read, upper);
    }
    // The bytes actually read: whole covering chunks, shared ones once.
    auto read_of = [&](const Ranges& ranges) {
      const int64_t before = files->bytes_read();
      Bytes out(size);
      EXPECT_TRUE(files->ReadRanges(1, ranges, out.data()).ok());
      return files->bytes_read() - before;
    };
    EXPECT_EQ(read_of({{3 * chunk + 5, 10}}), chunk);
    EXPECT_EQ(read_of({{3 * chunk + 5, 10}, {3 * chunk + 100, 10}}), chunk);
    EXPECT_EQ(read_of({{3 * chunk - 5, 10}}), 2 * chunk);
    EXPECT_EQ(read_of({{size - 1, 1}}), static_cast<int64_t>(size - (chunks - 1) * chunk));
    EXPECT_EQ(read_of({}), 0);

    Bytes out(16);
    for (const auto& bad : std::vector<Ranges>{
             {{size, 1}}, {{size - 1, 2}}, {{0, 1}, {SIZE_MAX, 2}}, {{0, SIZE_MAX}}, {{1, size}}}) {
      EXPECT_EQ(files->ReadRanges(1, bad, out.data()).code(), StatusCode::kInvalidArgument);
    }
    EXPECT_TRUE(files->ReadRanges(1, {{size, 0}}, out.data()).ok());
    // A new file for the block: its own header and table are read (and its bytes served).
    const auto other = RandomBytes(size, 14);
    files->Write(1, other);
    files->Flush();
    EXPECT_EQ(read_of({{3 * chunk + 5, 10}}), head + chunk);
    EXPECT_EQ(read_of({{3 * chunk + 5, 10}}), chunk);
    EXPECT_TRUE(ReadEquals(*files, 1, size, *other).ok());
  }
}

TEST_F(BlockFilesTest, ReadRangesChecksTheChunksItReadsAndOnlyThose) {
  auto files = OpenFiles();
  const size_t kChunk = 4096;
  const auto data = RandomBytes(16 * kChunk, 14);
  files->Write(1, data);
  files->Flush();
  Bytes bad = Load(PathOf(1));
  bad[kHeaderBytes + 4 * 16 + 5 * kChunk + 100] ^= 0x10;  // chunk 5
  Store(PathOf(1), bad);

  auto read = [&](const Ranges& ranges) {
    Bytes out(Concat(*data, ranges).size());
    const Status s = files->ReadRanges(1, ranges, out.data());
    if (s.ok()) {
      EXPECT_EQ(out, Concat(*data, ranges));
    }
    return s.code();
  };
  EXPECT_EQ(read({{5 * kChunk + 100, 1}}), StatusCode::kDataLoss);
  EXPECT_EQ(read({{5 * kChunk + 2000, 10}}), StatusCode::kDataLoss);  // same chunk, not the byte
  EXPECT_EQ(read({{4 * kChunk + 10, 2 * kChunk}}), StatusCode::kDataLoss);
  EXPECT_EQ(read({{1, 5}, {5 * kChunk, 1}}), StatusCode::kDataLoss);
  EXPECT_EQ(read({{4 * kChunk, kChunk}}), StatusCode::kOk);
  EXPECT_EQ(read({{6 * kChunk, kChunk}}), StatusCode::kOk);
  EXPECT_EQ(read({{2 * kChunk + 7, 100}, {9 * kChunk + 1, 3000}}), StatusCode::kOk);
  EXPECT_EQ(read({{4 * kChunk + 1, 10}, {6 * kChunk + 1, 10}}), StatusCode::kOk);
  EXPECT_EQ(read({{0, 5 * kChunk}, {6 * kChunk, 10 * kChunk}}), StatusCode::kOk);
  EXPECT_EQ(ReadEquals(*files, 1, data->size(), *data).code(), StatusCode::kDataLoss);
}

TEST_F(BlockFilesTest, OpenDeletesItsOwnOldFilesAndKeepsOthers) {
  fs::create_directories(dir_ + "/7.kvb");
  const std::vector<std::string> own = {"1.kvb", "22.kvb.tmp", "18446744073709551615.kvb"};
  const std::vector<std::string> foreign = {
      "notes.txt", "abc.kvb", "1.kvb.bak", "x1.kvb",      ".kvb",
      "1.kvbx",    "-1.kvb",  "1.tmp",     "7.kvb/2.kvb", "123456789012345678901.kvb"};
  for (const auto& name : own) Store(dir_ + "/" + name, {'x'});
  for (const auto& name : foreign) Store(dir_ + "/" + name, {'y'});
  auto files = OpenFiles();
  for (const auto& name : own) EXPECT_FALSE(fs::exists(dir_ + "/" + name)) << name;
  for (const auto& name : foreign) EXPECT_TRUE(fs::exists(dir_ + "/" + name)) << name;
  char c;
  EXPECT_EQ(files->Read(1, &c, 1).code(), StatusCode::kNotFound);

  // Parents are created; a file in the way and bad options are errors.
  EXPECT_TRUE(BlockFiles::Open(root_ + "/a/b/c", kLayout).ok());
  EXPECT_FALSE(BlockFiles::Open(dir_ + "/notes.txt", kLayout).ok());
  EXPECT_FALSE(BlockFiles::Open(dir_ + "/notes.txt/sub", kLayout).ok());
  EXPECT_EQ(BlockFiles::Open(dir_, kLayout, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(BlockFiles::Open(dir_, kLayout, {.chunk_bytes = 0}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(BlockFilesTest, BackPressureBoundsPendingBytes) {
  const int64_t kLimit = 64 << 10;
  auto files = OpenFiles({.max_pending_bytes = kLimit, .chunk_bytes = 512});
  std::mt19937_64 rng(15);
  std::vector<std::shared_ptr<const Bytes>> data;
  for (uint64_t id = 0; id < 300; ++id) {
    data.push_back(RandomBytes(1 + rng() % 20000, 1000 + id));
    files->Write(id, data.back());
    EXPECT_LE(files->pending_bytes(), kLimit);
  }
  data.push_back(RandomBytes(4 * kLimit, 16));  // larger than the limit: waits for an empty queue
  files->Write(300, data.back());
  files->Flush();
  EXPECT_EQ(files->pending_bytes(), 0);
  EXPECT_EQ(files->write_failures(), 0);
  for (uint64_t id = 0; id < data.size(); ++id) {
    EXPECT_TRUE(ReadEquals(*files, id, data[id]->size(), *data[id]).ok()) << id;
  }
}

TEST_F(BlockFilesTest, ConcurrentReadersAndWritersOnDistinctIds) {
  auto files = OpenFiles({.max_pending_bytes = 256 << 10, .chunk_bytes = 1024});
  constexpr int kThreads = 4, kBlocks = 80;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(100 + t);
      std::vector<std::shared_ptr<const Bytes>> mine(kBlocks);
      std::vector<bool> removed(kBlocks, false);
      auto check = [&](int i) {
        const uint64_t id = t * 1000 + i;
        const Bytes& want = *mine[i];
        Bytes got(want.size());
        Status s = files->Read(id, got.data(), got.size());
        if (removed[i] ? s.code() != StatusCode::kNotFound : (!s.ok() || got != want)) {
          ++failures;
        }
        if (removed[i] || want.empty()) return;
        const size_t offset = rng() % want.size();
        const size_t length = rng() % (want.size() - offset + 1);
        Bytes part(length);
        s = files->ReadRanges(id, {{offset, length}}, part.data());
        if (!s.ok() || part != Concat(want, {{offset, length}})) ++failures;
      };
      for (int i = 0; i < kBlocks; ++i) {
        mine[i] = RandomBytes(rng() % 50000, t * 1000 + i);
        files->Write(t * 1000 + i, mine[i]);
        check(static_cast<int>(rng() % (i + 1)));
        if (rng() % 8 == 0) {
          const int victim = static_cast<int>(rng() % (i + 1));
          files->Remove(t * 1000 + victim);
          removed[victim] = true;
        }
        if (rng() % 16 == 0) files->Flush();
      }
      files->Flush();
      for (int i = 0; i < kBlocks; ++i) check(i);
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(files->write_failures(), 0);
  EXPECT_EQ(files->pending_bytes(), 0);
}

TEST_F(BlockFilesTest, GarbageFilesAreDataLossNeverACrash) {
  auto files = OpenFiles({.chunk_bytes = 256});
  std::mt19937_64 rng(17);
  for (uint64_t id = 0; id < 600; ++id) {
    const size_t size = rng() % 3000;
    const auto data = RandomBytes(size, 5000 + id);
    Bytes file;
    const int kind = static_cast<int>(rng() % 4);
    if (kind == 0) {  // random bytes, mostly shorter than a header
      file = *RandomBytes(rng() % (rng() % 2 ? 100 : 20000), 9000 + id);
    } else {  // a real file of this id, damaged
      files->Write(id, data);
      files->Flush();
      file = Load(PathOf(id));
      const size_t table_end = kHeaderBytes + 4 * ((size + 255) / 256);
      if (kind == 1) {
        for (int flips = 1 + rng() % 4; flips > 0; --flips) {
          file[rng() % file.size()] ^= static_cast<char>(1 + rng() % 255);
        }
      } else if (kind == 2) {
        file.resize(rng() % 2 ? rng() % file.size() : file.size() + 1 + rng() % 100);
      } else {
        // Lies in the size fields, with a header checksum that agrees with them.
        const uint64_t lies[] = {0, 1, 255, 256, size + 1, 1ull << 40, ~0ull, ~0ull / 256 + 1};
        const uint64_t lie = lies[rng() % std::size(lies)];
        const Bytes original = file;
        switch (rng() % 3) {
          case 0:
            std::memcpy(&file[32], &lie, 8);
            break;
          case 1:
            std::memcpy(&file[40], &lie, 4);
            break;
          default:
            std::memcpy(&file[44], &lie, 4);
        }
        if (file == original) continue;  // the truth by chance
        std::memset(&file[12], 0, 4);
        const uint32_t crc = Crc32c(file.data(), std::min(file.size(), table_end));
        std::memcpy(&file[12], &crc, 4);
      }
    }
    Store(PathOf(id), file);
    Bytes out(size);
    const Status s = files->Read(id, out.data(), size);
    // Another chunk size that still gives one chunk (any above a small payload's size) describes
    // the same file truthfully.
    if (s.ok() && kind == 3 && size < 256) {
      EXPECT_EQ(out, *data) << "block " << id;
    } else {
      EXPECT_EQ(s.code(), StatusCode::kDataLoss) << "block " << id << " kind " << kind;
    }
    if (size == 0) continue;
    const Ranges ranges = {{rng() % size, 1}, {0, size}};
    Bytes part(size + 1);
    const Status r = files->ReadRanges(id, ranges, part.data());
    // Flips outside the chunks read go unseen, but what is returned is then right.
    if (r.ok()) {
      EXPECT_EQ(part, Concat(*data, ranges)) << "block " << id;
    } else {
      EXPECT_EQ(r.code(), StatusCode::kDataLoss) << "block " << id << " kind " << kind;
    }
  }
}

}  // namespace
}  // namespace deja::worker::prefix
