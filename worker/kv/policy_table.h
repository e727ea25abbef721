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
  // What the rest of deja asks of a policy instead of naming its kind:
  // reads_prefix_cache: a request starts from cached prompt blocks (false where the cache needs
  // every prompt query's attention, or never holds a whole prompt: it computes its prompt).
  bool reads_prefix_cache;
  // decays: attention adds into per-slot scores, which CachePolicy.score_decay may decay.
  bool decays;
  // retaining_heads: the scores come from the workers' retaining heads (which they must hold);
  // the prompt is prefilled in chunks of chunk_tokens, evicting after each.
  bool retaining_heads;
  // Builds the policy from budgets already resolved to tokens per head (heavy is 0 for a kind
  // without heavy hitters when the coordinator resolved them).
  std::unique_ptr<EvictionPolicy> (*make)(int32_t heavy, int32_t recent,
                                          const CachePolicyConfig& config);
};

// Every kind, one row each, CachePolicyKind order.
std::span<const CachePolicyRow> CachePolicyTable();

// The row of `kind` (every CachePolicyKind has one).
const CachePolicyRow& CachePolicyOf(CachePolicyKind kind);
// The row of a wire value; null for one without a row.
const CachePolicyRow* FindCachePolicy(v1::WorkerCachePolicy::Kind kind);
// The API names of the kinds whose row has `capability`: "KIND_H2O", "KIND_FULL or KIND_WINDOW".
std::string CachePolicyKindsWith(bool CachePolicyRow::*capability);
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
