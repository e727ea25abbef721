// A small Prometheus client: counters, gauges and histograms grouped in labelled families, kept
// in a Registry that renders the text exposition format 0.0.4. Updates are lock-free atomics;
// only creating a child (Family::Add) and rendering take a lock.
//
// Usage (declare all families of a process in one metrics.{h,cc}):
//   Registry registry;
//   auto& requests = registry.AddCounter("deja_coordinator_requests_total",
//                                        "Finished requests by gRPC code.", {"code"});
//   Counter& ok = requests.Add({{"code", "OK"}});  // stable reference; keep it
//   ok.Increment();
//
// Names are fixed by the code, not by input, so an invalid name or label set is a programmer
// error and CHECK-fails. Label values may come from anywhere: they are escaped when rendered.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace deja::metrics {

// Label name -> value. Add() requires exactly the family's label names, in any order.
using Labels = std::map<std::string, std::string>;

// A monotonically increasing value (requests, tokens, bytes, seconds spent).
class Counter {
 public:
  // Adds `amount`, which must be >= 0; negative or NaN amounts are ignored so a counter never
  // goes down.
  void Increment(double amount = 1.0);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A value that goes up and down (queue length, bytes in use, a timestamp).
class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Increment(double amount = 1.0) { value_.fetch_add(amount, std::memory_order_relaxed); }
  void Decrement(double amount = 1.0) { value_.fetch_sub(amount, std::memory_order_relaxed); }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Counts observations into buckets with inclusive upper bounds (Prometheus `le`), plus their
// sum. The +Inf bucket is implicit.
class Histogram {
 public:
  struct Snapshot {
    // Cumulative counts for each bound, then the +Inf bucket (== count).
    std::vector<uint64_t> cumulative;
    double sum = 0.0;
    uint64_t count = 0;
  };

  // `bounds` must be finite and strictly increasing (CHECKed).
  explicit Histogram(std::vector<double> bounds);

  // NaN observations are ignored.
  void Observe(double value);
  const std::vector<double>& bounds() const { return bounds_; }
  // Counts and sum at one moment; the count is the sum of the bucket counts, so the +Inf bucket
  // and _count always agree even while other threads observe.
  Snapshot Collect() const;

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // bounds_.size() + 1 entries
  std::atomic<double> sum_{0.0};
};

// Bucket helpers: `count` bounds start, start*factor, ... / start, start+width, ...
std::vector<double> ExponentialBuckets(double start, double factor, int count);
std::vector<double> LinearBuckets(double start, double width, int count);

enum class MetricType { kCounter, kGauge, kHistogram };

// Common part of every family: name, help, label names, rendering.
class FamilyBase {
 public:
  virtual ~FamilyBase() = default;
  const std::string& name() const { return name_; }
  MetricType type() const { return type_; }
  // Appends this family in the text exposition format.
  void Render(std::string* out) const;

 protected:
  FamilyBase(std::string name, std::string help, MetricType type,
             std::vector<std::string> label_names);
  // Label values in label_names_ order; CHECK-fails unless `labels` has exactly those names.
  std::vector<std::string> ValuesInOrder(const Labels& labels) const;
  virtual void RenderChildren(std::string* out) const = 0;
  // Renders `{a="x",b="y"}` (plus an optional extra label), or nothing when there are none.
  std::string LabelText(const std::vector<std::string>& values, const char* extra_name = nullptr,
                        const std::string& extra_value = "") const;

  std::string name_;
  std::string help_;
  MetricType type_;
  std::vector<std::string> label_names_;
  mutable std::mutex mu_;
};

// A metric name with labels and one child metric per distinct set of label values.
// Only a Registry can make the key that Family's constructor asks for.
class RegistryKey {
 private:
  friend class Registry;
  RegistryKey() = default;
};

template <typename T>
class Family final : public FamilyBase {
 public:
  // Families are created by Registry::Add*.
  Family(RegistryKey key, std::string name, std::string help, MetricType type,
         std::vector<std::string> label_names, std::vector<double> bounds = {});

  // Returns the child for these label values, creating it on first use. The reference stays
  // valid for the Registry's lifetime; hot paths should keep it instead of calling Add again.
  T& Add(const Labels& labels);

 private:
  void RenderChildren(std::string* out) const override;

  std::vector<double> bounds_;  // histograms only
  std::map<std::vector<std::string>, std::unique_ptr<T>> children_;
};

extern template class Family<Counter>;
extern template class Family<Gauge>;
extern template class Family<Histogram>;

// Owns families; renders them in the order they were added. Thread-safe.
class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Counter names must end in "_total" (Prometheus convention, docs/architecture.md#metrics).
  Family<Counter>& AddCounter(const std::string& name, const std::string& help,
                              std::vector<std::string> label_names = {});
  Family<Gauge>& AddGauge(const std::string& name, const std::string& help,
                          std::vector<std::string> label_names = {});
  // `bounds` as for Histogram; the label name "le" is reserved.
  Family<Histogram>& AddHistogram(const std::string& name, const std::string& help,
                                  std::vector<std::string> label_names, std::vector<double> bounds);

  // Every family in the Prometheus text exposition format, version 0.0.4.
  std::string Serialize() const;

 private:
  void CheckNewName(const std::string& name) const;

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<FamilyBase>> families_;
};

// Text-format helpers, exposed for tests and for other exporters.
// Label value: backslash, double quote and newline escaped.
std::string EscapeLabelValue(const std::string& value);
// HELP text: backslash and newline escaped.
std::string EscapeHelp(const std::string& help);
// Shortest text that reads back as the same double; "+Inf", "-Inf", "NaN".
std::string FormatValue(double value);
bool IsValidMetricName(const std::string& name);
bool IsValidLabelName(const std::string& name);

}  // namespace deja::metrics
