// The KV-cache policy table: every row round-trips between its name, its kind and both proto
// values and builds a policy of its kind; unknown names and values are refused with the
// accepted ones listed; and every value of both proto enums has a row, so a proto value added
// without a row fails here. Links deja_kv_policy alone, as the coordinator does.
#include "worker/kv/policy_table.h"

#include <google/protobuf/descriptor.h>
#include <gtest/gtest.h>

#include <set>
#include <string>

namespace deja::worker::kv {
namespace {

TEST(PolicyTableTest, EveryRowRoundTrips) {
  for (const CachePolicyRow& row : CachePolicyTable()) {
    SCOPED_TRACE(row.name);
    EXPECT_EQ(&CachePolicyOf(row.kind), &row);
    EXPECT_STREQ(CachePolicyName(row.kind), row.name);
    StatusOr<CachePolicyKind> parsed = ParseCachePolicy(row.name, "--kv-policy");
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(*parsed, row.kind);
    EXPECT_EQ(ToApiProto(row.kind), row.api);
    EXPECT_EQ(ToWorkerProto(row.kind), row.wire);
    StatusOr<CachePolicyKind> from_api = FromProto(row.api, "cache.kind");
    ASSERT_TRUE(from_api.ok()) << from_api.status().ToString();
    EXPECT_EQ(*from_api, row.kind);
    StatusOr<CachePolicyKind> from_wire = FromProto(row.wire, "config.cache.kind");
    ASSERT_TRUE(from_wire.ok()) << from_wire.status().ToString();
    EXPECT_EQ(*from_wire, row.kind);
    // The factory builds this kind, bounded exactly when the row says so.
    std::unique_ptr<EvictionPolicy> policy = row.make(3, 4, CachePolicyConfig{});
    ASSERT_NE(policy, nullptr);
    EXPECT_EQ(policy->kind(), row.kind);
    EXPECT_EQ(policy->budget() > 0, row.bounded);
    EXPECT_FALSE(row.heavy_hitters && !row.bounded);
  }
}

TEST(PolicyTableTest, RowsAreInKindOrderAndSpellingsAreUnique) {
  std::set<std::string> names;
  std::set<int> api, wire;
  int i = 0;
  for (const CachePolicyRow& row : CachePolicyTable()) {
    EXPECT_EQ(static_cast<int>(row.kind), i++) << row.name;
    EXPECT_TRUE(names.insert(row.name).second) << row.name;
    EXPECT_TRUE(api.insert(row.api).second) << row.name;
    EXPECT_TRUE(wire.insert(row.wire).second) << row.name;
  }
}

// Iterates the proto enums' descriptors: a value without a row fails here.
TEST(PolicyTableTest, EveryProtoValueHasARow) {
  const google::protobuf::EnumDescriptor* api = v1::CachePolicy::Kind_descriptor();
  for (int i = 0; i < api->value_count(); ++i) {
    const auto value = static_cast<v1::CachePolicy::Kind>(api->value(i)->number());
    // KIND_UNSPECIFIED means "the server default", which is not a kind of its own.
    if (value == v1::CachePolicy::KIND_UNSPECIFIED) continue;
    EXPECT_TRUE(FromProto(value, "cache.kind").ok()) << api->value(i)->name();
  }
  EXPECT_EQ(static_cast<int>(CachePolicyTable().size()), api->value_count() - 1);
  const google::protobuf::EnumDescriptor* wire = v1::WorkerCachePolicy::Kind_descriptor();
  for (int i = 0; i < wire->value_count(); ++i) {
    const auto value = static_cast<v1::WorkerCachePolicy::Kind>(wire->value(i)->number());
    EXPECT_TRUE(FromProto(value, "config.cache.kind").ok()) << wire->value(i)->name();
  }
  EXPECT_EQ(static_cast<int>(CachePolicyTable().size()), wire->value_count());
}

TEST(PolicyTableTest, UnknownNamesAndValuesListTheAcceptedOnes) {
  Status s = ParseCachePolicy("lru", "--kv-policy").status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "--kv-policy must be full, window, h2o or locret, got 'lru'");
  EXPECT_FALSE(ParseCachePolicy("", "--kv-policy").ok());
  EXPECT_FALSE(ParseCachePolicy("H2O", "--kv-policy").ok());

  s = FromProto(static_cast<v1::CachePolicy::Kind>(9), "cache.kind").status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "cache.kind must be KIND_FULL, KIND_WINDOW, KIND_H2O or KIND_LOCRET, got 9");
  EXPECT_EQ(FromProto(v1::CachePolicy::KIND_UNSPECIFIED, "cache.kind").status().code(),
            StatusCode::kInvalidArgument);
  s = FromProto(static_cast<v1::WorkerCachePolicy::Kind>(7), "config.cache.kind").status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "config.cache.kind must be KIND_FULL, KIND_WINDOW, KIND_H2O or KIND_LOCRET, got 7");
}

// The capabilities the coordinator, the step engine and the model ask a row for, instead of
// naming kinds: which policies read the prefix cache, decay their scores, and are scored by the
// retaining heads (prefilled in chunks); a wire value finds its row.
TEST(PolicyTableTest, CapabilitiesSayWhatEachPolicyDoes) {
  EXPECT_EQ(CachePolicyKindsWith(&CachePolicyRow::reads_prefix_cache), "KIND_FULL or KIND_WINDOW");
  EXPECT_EQ(CachePolicyKindsWith(&CachePolicyRow::decays), "KIND_H2O");
  EXPECT_EQ(CachePolicyKindsWith(&CachePolicyRow::retaining_heads), "KIND_LOCRET");
  EXPECT_EQ(CachePolicyKindsWith(&CachePolicyRow::bounded),
            "KIND_WINDOW, KIND_H2O or KIND_LOCRET");
  for (const CachePolicyRow& row : CachePolicyTable()) {
    ASSERT_EQ(FindCachePolicy(row.wire), &row);
    // A policy that decays accumulates scores; one scored by retaining heads never reads a
    // cached prefix (its cache never holds a whole prompt).
    if (row.decays) EXPECT_TRUE(row.bounded && row.heavy_hitters) << row.name;
    if (row.retaining_heads) EXPECT_FALSE(row.reads_prefix_cache) << row.name;
  }
  EXPECT_EQ(FindCachePolicy(static_cast<v1::WorkerCachePolicy::Kind>(77)), nullptr);
}

}  // namespace
}  // namespace deja::worker::kv
