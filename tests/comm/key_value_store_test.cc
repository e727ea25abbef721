// The rendezvous stores: values round-trip byte for byte, Get blocks until a value appears,
// timeouts are DeadlineExceeded, and two FileStores on one directory (as two processes would)
// see each other's keys.
#include "worker/comm/key_value_store.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "tests/common/temp_dir.h"

namespace deja::worker::comm {
namespace {

using namespace std::chrono_literals;
using test_util::TempDir;

class StoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { store_ = Make(); }

  std::unique_ptr<KeyValueStore> Make() {
    if (GetParam() == "memory") return MakeInMemoryStore();
    auto s = MakeFileStore(dir_.path() + "/store");
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(*s) : nullptr;
  }

  TempDir dir_;
  std::unique_ptr<KeyValueStore> store_;
};

TEST_P(StoreTest, SetThenGetRoundTripsBytes) {
  const std::string value("a\0b\xff/c", 6);
  ASSERT_TRUE(store_->Set("group/rank_0", value).ok());
  auto got = store_->Get("group/rank_0", 1s);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, value);
  ASSERT_TRUE(store_->Set("group/rank_0", "").ok());
  EXPECT_EQ(*store_->Get("group/rank_0", 1s), "");
}

TEST_P(StoreTest, GetWaitsForALaterSet) {
  std::thread setter([&] {
    std::this_thread::sleep_for(50ms);
    EXPECT_TRUE(store_->Set("late", "here").ok());
  });
  auto got = store_->Get("late", 5s);
  setter.join();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "here");
}

TEST_P(StoreTest, MissingKeyTimesOut) {
  const auto start = std::chrono::steady_clock::now();
  auto got = store_->Get("absent", 100ms);
  EXPECT_EQ(got.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(got.status().message().find("absent"), std::string::npos);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 100ms);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
}

TEST_P(StoreTest, WaitForSeveralKeys) {
  ASSERT_TRUE(store_->Set("a", "1").ok());
  EXPECT_EQ(store_->Wait({"a", "b"}, 50ms).code(), StatusCode::kDeadlineExceeded);
  std::thread setter([&] { EXPECT_TRUE(store_->Set("b", "2").ok()); });
  EXPECT_TRUE(store_->Wait({"a", "b"}, 5s).ok());
  setter.join();
  EXPECT_TRUE(store_->Wait({}, 0ms).ok());
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreTest, ::testing::Values("memory", "file"));

TEST(FileStoreTest, TwoStoresOnOneDirectoryShareKeys) {
  TempDir dir;
  auto a = MakeFileStore(dir.path());
  auto b = MakeFileStore(dir.path());
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->Set("k", "v").ok());
  auto got = (*b)->Get("k", 1s);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, "v");
}

TEST(FileStoreTest, UnusableDirectoryIsAnError) {
  TempDir dir;
  test_util::WriteBytes(dir.File("file"), "x");
  auto s = MakeFileStore(dir.File("file") + "/sub");
  EXPECT_FALSE(s.ok());
}

}  // namespace
}  // namespace deja::worker::comm
