#include "worker/kv/policy_table.h"

#include <google/protobuf/descriptor.h>

#include <algorithm>
#include <vector>

#include "common/enum_table.h"

namespace deja::worker::kv {
namespace {

using v1::CachePolicy;
using v1::WorkerCachePolicy;

const CachePolicyRow kCachePolicies[] = {
    {CachePolicyKind::kFull, "full", "every token", CachePolicy::KIND_FULL,
     WorkerCachePolicy::KIND_FULL, /*bounded=*/false, /*heavy_hitters=*/false,
     /*reads_prefix_cache=*/true, /*decays=*/false, /*retaining_heads=*/false,
     [](int32_t, int32_t, const CachePolicyConfig&) { return MakeFullPolicy(); }},
    // The window baseline gets the same total budget as h2o would, all of it recent.
    {CachePolicyKind::kWindow, "window", "the most recent tokens", CachePolicy::KIND_WINDOW,
     WorkerCachePolicy::KIND_WINDOW, /*bounded=*/true, /*heavy_hitters=*/false,
     /*reads_prefix_cache=*/true, /*decays=*/false, /*retaining_heads=*/false,
     [](int32_t heavy, int32_t recent, const CachePolicyConfig&) {
       return MakeWindowPolicy(heavy + recent);
     }},
    // The token being decoded always stays, so h2o keeps at least one recent token.
    {CachePolicyKind::kH2O, "h2o", "heavy hitters plus the most recent tokens",
     CachePolicy::KIND_H2O, WorkerCachePolicy::KIND_H2O, /*bounded=*/true,
     /*heavy_hitters=*/true, /*reads_prefix_cache=*/false, /*decays=*/true,
     /*retaining_heads=*/false,
     [](int32_t heavy, int32_t recent, const CachePolicyConfig& c) {
       return MakeH2OPolicy(heavy, std::max<int32_t>(recent, 1), c.h2o_mean_score, c.h2o_decay,
                            c.sink_tokens);
     }},
    // heavy: the tokens kept by retaining-head score; recent: the stabilisers (at least the
    // token being decoded).
    {CachePolicyKind::kLocret, "locret",
     "the stabilisers (recent tokens) plus the tokens the retaining heads score highest",
     CachePolicy::KIND_LOCRET, WorkerCachePolicy::KIND_LOCRET, /*bounded=*/true,
     /*heavy_hitters=*/true, /*reads_prefix_cache=*/false, /*decays=*/false,
     /*retaining_heads=*/true,
     [](int32_t heavy, int32_t recent, const CachePolicyConfig&) {
       return MakeLocretPolicy(heavy, std::max<int32_t>(recent, 1));
     }},
};

// The proto values with a row, by their proto names: "KIND_FULL, KIND_WINDOW or KIND_H2O".
template <typename ProtoKind>
std::string ProtoNames(ProtoKind CachePolicyRow::*field,
                       const google::protobuf::EnumDescriptor* descriptor) {
  std::vector<std::string> names;
  for (const CachePolicyRow& row : kCachePolicies) {
    names.emplace_back(descriptor->FindValueByNumber(row.*field)->name());
  }
  return OneOf(names);
}

template <typename ProtoKind>
StatusOr<CachePolicyKind> KindOf(ProtoKind kind, ProtoKind CachePolicyRow::*field,
                                 const google::protobuf::EnumDescriptor* descriptor,
                                 const std::string& field_name) {
  if (const CachePolicyRow* row = FindRow(kCachePolicies, field, kind)) return row->kind;
  return InvalidArgument(field_name + " must be " + ProtoNames(field, descriptor) + ", got " +
                         std::to_string(static_cast<int>(kind)));
}

}  // namespace

std::span<const CachePolicyRow> CachePolicyTable() { return kCachePolicies; }

const CachePolicyRow& CachePolicyOf(CachePolicyKind kind) {
  const CachePolicyRow* row = FindRow(kCachePolicies, &CachePolicyRow::kind, kind);
  CHECK(row != nullptr) << "cache policy kind " << static_cast<int>(kind) << " has no row";
  return *row;
}

const char* CachePolicyName(CachePolicyKind kind) { return CachePolicyOf(kind).name; }

const CachePolicyRow* FindCachePolicy(v1::WorkerCachePolicy::Kind kind) {
  return FindRow(kCachePolicies, &CachePolicyRow::wire, kind);
}

std::string CachePolicyKindsWith(bool CachePolicyRow::*capability) {
  std::vector<std::string> names;
  for (const CachePolicyRow& row : kCachePolicies) {
    if (row.*capability) names.emplace_back(CachePolicy::Kind_Name(row.api));
  }
  return OneOf(names);
}

StatusOr<CachePolicyKind> ParseCachePolicy(std::string_view name, const std::string& what) {
  DEJA_ASSIGN_OR_RETURN(const CachePolicyRow* row, ParseRow(kCachePolicies, name, what));
  return row->kind;
}

StatusOr<CachePolicyKind> FromProto(v1::CachePolicy::Kind kind, const std::string& field) {
  return KindOf(kind, &CachePolicyRow::api, CachePolicy::Kind_descriptor(), field);
}

StatusOr<CachePolicyKind> FromProto(v1::WorkerCachePolicy::Kind kind, const std::string& field) {
  return KindOf(kind, &CachePolicyRow::wire, WorkerCachePolicy::Kind_descriptor(), field);
}

v1::CachePolicy::Kind ToApiProto(CachePolicyKind kind) { return CachePolicyOf(kind).api; }

v1::WorkerCachePolicy::Kind ToWorkerProto(CachePolicyKind kind) { return CachePolicyOf(kind).wire; }

}  // namespace deja::worker::kv
