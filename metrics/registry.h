// deja's metric families over prometheus-cpp (Debian's prometheus-cpp-dev): counters, gauges and
// histograms grouped in labelled families, kept in a Registry that renders the text exposition
// format (prometheus::TextSerializer). Updates go straight to prometheus-cpp's lock-free
// metrics; creating a child (Family::Add) and rendering take a lock.
//
// Usage (declare all families of a process in one metrics.{h,cc}):
//   Registry registry;
//   auto& requests = registry.AddCounter("deja_coordinator_requests_total",
//                                        "Finished requests by gRPC code.", {"code"});
//   Counter& ok = requests.Add({{"code", "OK"}});  // stable reference; keep it
//   ok.Increment();
//
// What this layer adds to prometheus-cpp: the label names are declared with the family and every
// Add must give exactly those (a typo is a CHECK failure, not a new time series); counters never
// go down (negative or NaN increments are ignored); names, label names and help texts are checked
// when a family is made (names are fixed by the code, so a bad one is a programmer error and
// CHECK-fails). Label values may come from anywhere: prometheus-cpp escapes them. Families render
// grouped by type (counters, gauges, histograms), each child once; a family appears once it has a
// child.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace prometheus {
class Registry;
class Counter;
class Gauge;
class Histogram;
template <typename T>
class Family;
}  // namespace prometheus

namespace deja::metrics {

// Label name -> value. Add() requires exactly the family's label names, in any order.
using Labels = std::map<std::string, std::string>;

// A monotonically increasing value (requests, tokens, bytes, seconds spent).
class Counter {
 public:
  using Impl = prometheus::Counter;
  explicit Counter(prometheus::Counter* impl) : impl_(impl) {}
  // Adds `amount`, which must be >= 0; negative or NaN amounts are ignored so a counter never
  // goes down.
  void Increment(double amount = 1.0);
  double Value() const;

 private:
  prometheus::Counter* impl_;
};

// A value that goes up and down (queue length, bytes in use, a timestamp).
class Gauge {
 public:
  using Impl = prometheus::Gauge;
  explicit Gauge(prometheus::Gauge* impl) : impl_(impl) {}
  void Set(double value);
  void Increment(double amount = 1.0);
  void Decrement(double amount = 1.0);
  double Value() const;

 private:
  prometheus::Gauge* impl_;
};

// Counts observations into buckets with inclusive upper bounds (Prometheus `le`), plus their
// sum. The +Inf bucket is implicit.
class Histogram {
 public:
  using Impl = prometheus::Histogram;
  struct Snapshot {
    // Cumulative counts for each bound, then the +Inf bucket (== count).
    std::vector<uint64_t> cumulative;
    double sum = 0.0;
    uint64_t count = 0;
  };

  // A histogram of its own (outside any registry); `bounds` must be finite and strictly
  // increasing (CHECKed).
  explicit Histogram(std::vector<double> bounds);
  // A child of a registry's family.
  Histogram(prometheus::Histogram* impl, std::vector<double> bounds);
  ~Histogram();
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  // NaN observations are ignored.
  void Observe(double value);
  const std::vector<double>& bounds() const { return bounds_; }
  // Counts and sum at one moment.
  Snapshot Collect() const;

 private:
  std::vector<double> bounds_;
  std::unique_ptr<prometheus::Histogram> owned_;
  prometheus::Histogram* impl_;
};

// Bucket helpers: `count` bounds start, start*factor, ... / start, start+width, ...
std::vector<double> ExponentialBuckets(double start, double factor, int count);
std::vector<double> LinearBuckets(double start, double width, int count);

// Only a Registry can make the key that Family's constructor asks for.
class RegistryKey {
 private:
  friend class Registry;
  RegistryKey() = default;
};

// A metric name with declared label names and one child per distinct set of label values.
template <typename T>
class Family final {
 public:
  using Impl = prometheus::Family<typename T::Impl>;
  // Families are created by Registry::Add*.
  Family(RegistryKey key, Impl* impl, std::string name, std::vector<std::string> label_names,
         std::vector<double> bounds = {});

  // Returns the child for these label values, creating it on first use. The reference stays
  // valid for the Registry's lifetime; hot paths should keep it instead of calling Add again.
  T& Add(const Labels& labels);
  const std::string& name() const { return name_; }

 private:
  Impl* impl_;
  std::string name_;
  std::vector<std::string> label_names_;
  std::vector<double> bounds_;  // histograms only
  std::mutex mu_;
  std::map<Labels, std::unique_ptr<T>> children_;
};

// Owns the prometheus-cpp registry and deja's families. Thread-safe.
class Registry {
 public:
  Registry();
  ~Registry();
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
  void CheckNewFamily(const std::string& name, const std::string& help,
                      const std::vector<std::string>& label_names);

  mutable std::mutex mu_;
  std::unique_ptr<prometheus::Registry> impl_;
  std::vector<std::string> names_;
  std::vector<std::unique_ptr<Family<Counter>>> counters_;
  std::vector<std::unique_ptr<Family<Gauge>>> gauges_;
  std::vector<std::unique_ptr<Family<Histogram>>> histograms_;
};

bool IsValidMetricName(const std::string& name);
bool IsValidLabelName(const std::string& name);

}  // namespace deja::metrics
