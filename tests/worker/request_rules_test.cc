// The request rules (worker/rules/): each rule's bounds, its message naming the caller's field,
// and that the rule's words are written in request_rules.cc alone, not again in the coordinator's
// validation or the worker's sequence planning (so the two cannot drift apart).
#include "worker/rules/request_rules.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

namespace deja::rules {
namespace {

namespace kv = worker::kv;

// The status is `code` and its message starts with `field`.
void ExpectRefused(const Status& s, StatusCode code, const std::string& field) {
  EXPECT_EQ(s.code(), code) << s.ToString();
  EXPECT_EQ(s.message().rfind(field, 0), 0u) << s.message();
}

TEST(RequestRules, Sampling) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = INFINITY;
  EXPECT_TRUE(CheckTemperature(0.f, "t").ok());
  EXPECT_TRUE(CheckTemperature(2.5f, "t").ok());
  for (float bad : {-0.1f, nan, inf})
    ExpectRefused(CheckTemperature(bad, "x.t"), StatusCode::kInvalidArgument, "x.t ");
  EXPECT_TRUE(CheckTopK(0, "k").ok());
  ExpectRefused(CheckTopK(-1, "x.top_k"), StatusCode::kInvalidArgument,
                "x.top_k must be >= 0, got -1");
  EXPECT_TRUE(CheckTopP(1.f, "p").ok());
  EXPECT_TRUE(CheckTopP(1e-6f, "p").ok());
  for (float bad : {0.f, 1.0001f, nan})
    ExpectRefused(CheckTopP(bad, "p"), StatusCode::kInvalidArgument, "p must be in (0, 1]");
  EXPECT_TRUE(CheckRepetitionPenalty(1.f, "r").ok());
  for (float bad : {0.f, -1.f, inf, nan})
    ExpectRefused(CheckRepetitionPenalty(bad, "r"), StatusCode::kInvalidArgument, "r ");
  EXPECT_TRUE(CheckTopN(0, "n").ok());
  EXPECT_TRUE(CheckTopN(kMaxTopNTokens, "n").ok());
  ExpectRefused(CheckTopN(kMaxTopNTokens + 1, "response.top_n_tokens"),
                StatusCode::kInvalidArgument, "response.top_n_tokens must be in [0, 5], got 6");
  ExpectRefused(CheckTopN(-1, "n"), StatusCode::kInvalidArgument, "n ");
}

TEST(RequestRules, CachePolicies) {
  const kv::CachePolicyRow& full = kv::CachePolicyOf(kv::CachePolicyKind::kFull);
  const kv::CachePolicyRow& window = kv::CachePolicyOf(kv::CachePolicyKind::kWindow);
  const kv::CachePolicyRow& h2o = kv::CachePolicyOf(kv::CachePolicyKind::kH2O);
  const kv::CachePolicyRow& locret = kv::CachePolicyOf(kv::CachePolicyKind::kLocret);
  EXPECT_TRUE(CheckScoreDecayRange(1.f, "d").ok());
  EXPECT_TRUE(CheckScoreDecayRange(0.5f, "d").ok());
  for (float bad : {0.f, -0.5f, 1.5f})
    ExpectRefused(CheckScoreDecayRange(bad, "cache.score_decay"), StatusCode::kInvalidArgument,
                  "cache.score_decay must be in (0, 1]");
  EXPECT_TRUE(CheckScoreDecayKind(h2o, "d").ok());
  ExpectRefused(CheckScoreDecayKind(window, "cache.score_decay"), StatusCode::kInvalidArgument,
                "cache.score_decay applies to KIND_H2O only, not KIND_WINDOW");
  EXPECT_TRUE(CheckRetainingHeads(locret, true, "k").ok());
  EXPECT_TRUE(CheckRetainingHeads(h2o, false, "k").ok());
  ExpectRefused(CheckRetainingHeads(locret, false, "cache.kind"), StatusCode::kFailedPrecondition,
                "cache.kind: KIND_LOCRET needs retaining heads");
  EXPECT_TRUE(CheckPrefixRead(full, "p").ok());
  EXPECT_TRUE(CheckPrefixRead(window, "p").ok());
  ExpectRefused(CheckPrefixRead(h2o, "config.prefix_blocks"), StatusCode::kInvalidArgument,
                "config.prefix_blocks cannot be read by a KIND_H2O cache");
  ExpectRefused(CheckPrefixRead(locret, "p"), StatusCode::kInvalidArgument, "p cannot be read");
  EXPECT_TRUE(CheckPrefixImportant(full, "i").ok());
  ExpectRefused(CheckPrefixImportant(window, "config.prefix_important"),
                StatusCode::kInvalidArgument, "config.prefix_important ");
}

TEST(RequestRules, Positions) {
  EXPECT_TRUE(CheckPositions(2000, 48, 2048, "config").ok());
  ExpectRefused(
      CheckPositions(2000, 49, 2048, "config"), StatusCode::kOutOfRange,
      "config: prompt_tokens + max_new_tokens = 2049 exceeds the model's position limit of 2048");
}

std::string Read(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(RequestRules, WrittenOnce) {
  const char* dir = std::getenv("DEJA_SOURCE_DIR");
  const std::filesystem::path root = dir != nullptr ? dir : ".";
  const std::string rules = Read(root / "worker/rules/request_rules.cc");
  ASSERT_FALSE(rules.empty()) << "set DEJA_SOURCE_DIR to the source tree";
  // Each rule's own words, and the places that used to hold a copy of them.
  const char* words[] = {"must be a finite number >= 0",
                         "must be a finite number > 0",
                         "needs retaining heads",
                         "start from cached blocks",
                         "reads a prefix's important tokens",
                         "exceeds the model's position limit"};
  const char* callers[] = {"coordinator/validation.cc", "worker/service/step_engine.cc",
                           "worker/sampling/sampler.cc"};
  for (const char* w : words) {
    EXPECT_NE(rules.find(w), std::string::npos) << w;
    for (const char* c : callers) {
      const std::string text = Read(root / c);
      ASSERT_FALSE(text.empty()) << c;
      EXPECT_EQ(text.find(w), std::string::npos) << c << " writes the rule '" << w << "' again";
    }
  }
}

}  // namespace
}  // namespace deja::rules
