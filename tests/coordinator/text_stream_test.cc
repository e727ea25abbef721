// TextStream: UTF-8-safe incremental text and stop sequences that are never emitted.
#include "coordinator/text_stream.h"

#include <gtest/gtest.h>

#include "common/utf8.h"
#include "coordinator_test_util.h"

namespace deja::coordinator {
namespace {

class TextStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tokenizer_ = test::LoadTokenizer();
    ASSERT_NE(tokenizer_, nullptr);
  }
  std::vector<int32_t> Ids(const std::string& text) {
    StatusOr<std::vector<int32_t>> ids = tokenizer_->Encode(text, false);
    EXPECT_TRUE(ids.ok());
    return ids.ok() ? *ids : std::vector<int32_t>();
  }
  // Feeds every id; returns the emitted text, checking each piece is whole UTF-8 and a prefix
  // of `expected`.
  std::string Run(const std::vector<int32_t>& ids, std::vector<std::string> stops,
                  const std::string& expected, bool* stopped) {
    TextStream stream(*tokenizer_, std::move(stops));
    std::string out;
    *stopped = false;
    for (int32_t id : ids) {
      TextStream::Piece p = stream.Add(id);
      EXPECT_EQ(FindInvalidUtf8(p.text), kUtf8Valid);
      out += p.text;
      EXPECT_EQ(expected.compare(0, out.size(), out), 0) << "emitted past the expected text";
      if (p.stopped) {
        *stopped = true;
        return out;
      }
    }
    TextStream::Piece tail = stream.Finish();
    *stopped = tail.stopped;
    return out + tail.text;
  }

  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(TextStreamTest, WithoutStopsEqualsDecode) {
  const std::string text = "And God said, Let there be light: and there was light. héllo 日本語 ✓";
  const std::vector<int32_t> ids = Ids(text);
  bool stopped;
  EXPECT_EQ(Run(ids, {}, text, &stopped), tokenizer_->Decode(ids, true));
  EXPECT_FALSE(stopped);
}

TEST_F(TextStreamTest, StopSequenceIsCutAndNeverEmitted) {
  const std::string text = "one two three four five";
  for (const std::string stop : {"three", "o t", "e f", "five", "t"}) {
    bool stopped;
    const std::string expected = text.substr(0, text.find(stop));
    EXPECT_EQ(Run(Ids(text), {"zzz", stop}, expected, &stopped), expected) << stop;
    EXPECT_TRUE(stopped) << stop;
  }
}

TEST_F(TextStreamTest, PartialStopPrefixAtTheEndIsEmitted) {
  const std::string text = "alpha beta thr";
  bool stopped;
  EXPECT_EQ(Run(Ids(text), {"three"}, text, &stopped), text);
  EXPECT_FALSE(stopped);
}

TEST_F(TextStreamTest, EarliestOfSeveralStopsWins) {
  const std::string text = "red green blue";
  bool stopped;
  EXPECT_EQ(Run(Ids(text), {"blue", "green"}, "red ", &stopped), "red ");
  EXPECT_TRUE(stopped);
}

TEST_F(TextStreamTest, MultiByteStop) {
  const std::string text = "price: 5€ or 6€";
  bool stopped;
  EXPECT_EQ(Run(Ids(text), {"€"}, "price: 5", &stopped), "price: 5");
  EXPECT_TRUE(stopped);
}

TEST_F(TextStreamTest, SpecialTokensAddNoText) {
  TextStream stream(*tokenizer_, {});
  EXPECT_EQ(stream.Add(tokenizer_->eos_id()).text, "");
}

}  // namespace
}  // namespace deja::coordinator
