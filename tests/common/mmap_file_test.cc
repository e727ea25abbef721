// MappedFile: contents, empty files, missing paths, directories and move semantics.
#include "common/mmap_file.h"

#include <string>

#include <gtest/gtest.h>

#include "tests/common/temp_dir.h"

namespace deja {
namespace {

using test_util::TempDir;
using test_util::WriteBytes;

TEST(MappedFileTest, MapsContents) {
  TempDir dir;
  const std::string bytes("hello\0world", 11);
  WriteBytes(dir.File("a.bin"), bytes);
  StatusOr<MappedFile> f = MappedFile::Open(dir.File("a.bin"));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_EQ(f->size(), bytes.size());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(f->data()), f->size()), bytes);
  EXPECT_EQ(f->path(), dir.File("a.bin"));
}

TEST(MappedFileTest, EmptyFileIsOk) {
  TempDir dir;
  WriteBytes(dir.File("empty"), "");
  StatusOr<MappedFile> f = MappedFile::Open(dir.File("empty"));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->size(), 0u);
  EXPECT_EQ(f->data(), nullptr);
}

TEST(MappedFileTest, MissingFileIsNotFound) {
  TempDir dir;
  StatusOr<MappedFile> f = MappedFile::Open(dir.File("nope"));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound);
  EXPECT_NE(f.status().message().find("nope"), std::string::npos);
}

TEST(MappedFileTest, DirectoryIsInvalidArgument) {
  TempDir dir;
  StatusOr<MappedFile> f = MappedFile::Open(dir.path());
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
}

TEST(MappedFileTest, MoveTransfersOwnership) {
  TempDir dir;
  WriteBytes(dir.File("a"), "xyz");
  MappedFile a = std::move(MappedFile::Open(dir.File("a"))).value();
  const uint8_t* data = a.data();
  MappedFile b = std::move(a);
  EXPECT_EQ(b.data(), data);
  EXPECT_EQ(b.size(), 3u);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from state is defined
  EXPECT_EQ(a.size(), 0u);
  MappedFile c;
  c = std::move(b);
  EXPECT_EQ(c.data()[1], 'y');
}

TEST(MappedFileTest, PrefetchReportsBytes) {
  TempDir dir;
  WriteBytes(dir.File("big"), std::string(3 * 4096 + 17, 'q'));
  MappedFile f = std::move(MappedFile::Open(dir.File("big"))).value();
  EXPECT_EQ(PrefetchMemory(f.data(), f.size()), f.size());
  EXPECT_EQ(PrefetchMemory(f.data() + 5, 100), 100u);
  EXPECT_EQ(PrefetchMemory(nullptr, 0), 0u);
}

}  // namespace
}  // namespace deja
