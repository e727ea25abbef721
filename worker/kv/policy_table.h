// The KV-cache policy kinds, spelled out once: for each kind its --kv-policy name, its value in
// the public deja.v1.CachePolicy.Kind and in the internal deja.v1.WorkerCachePolicy.Kind, the
// budgets it reads and how to build it. The command line, the coordinator's validation and the
// worker's step engine all translate through these rows; none names a kind by hand.
//
// Adding a policy: its class and factory in a policy_<name>.cc (declared in eviction_policy.h
// with a CachePolicyKind value), one row in policy_table.cc, and a value in each proto enum
// (eviction_policy_test checks that every proto value has a row).
//
// Part of deja_kv_policy, which the coordinator links without the model.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "common/status.h"
#include "deja/v1/text_generation.pb.h"
#include "deja/v1/worker.pb.h"
#include "worker/kv/eviction_policy.h"

namespace deja::worker::kv {

struct CachePolicyRow {
  CachePolicyKind kind;
  const char* name;  // --kv-policy, logs
  const char* help;  // a phrase for --help
  v1::CachePolicy::Kind api;
  v1::WorkerCachePolicy::Kind wire;
  // The per-head budgets the kind reads: a bounded policy keeps `recent` tokens, one with heavy
  // hitters `heavy` more; an unbounded one (full) keeps every token and reads neither.
  bool bounded;
  bool heavy_hitters;
  // Builds the policy from budgets already resolved to tokens per head (heavy is 0 for a kind
  // without heavy hitters when the coordinator resolved them).
  std::unique_ptr<EvictionPolicy> (*make)(int32_t heavy, int32_t recent,
                                          const CachePolicyConfig& config);
};

// Every kind, one row each, CachePolicyKind order.
std::span<const CachePolicyRow> CachePolicyTable();

// The row of `kind` (every CachePolicyKind has one).
const CachePolicyRow& CachePolicyOf(CachePolicyKind kind);
const char* CachePolicyName(CachePolicyKind kind);

// The kind named `name`; InvalidArgument "<what> must be full, window or h2o, got 'x'".
StatusOr<CachePolicyKind> ParseCachePolicy(std::string_view name, const std::string& what);

// The kind of a proto value; InvalidArgument "<field> must be KIND_FULL, ..., got 7" for a value
// without a row (KIND_UNSPECIFIED included: what it means is the caller's to decide).
StatusOr<CachePolicyKind> FromProto(v1::CachePolicy::Kind kind, const std::string& field);
StatusOr<CachePolicyKind> FromProto(v1::WorkerCachePolicy::Kind kind, const std::string& field);
v1::CachePolicy::Kind ToApiProto(CachePolicyKind kind);
v1::WorkerCachePolicy::Kind ToWorkerProto(CachePolicyKind kind);

}  // namespace deja::worker::kv
