// The Registry over prometheus-cpp: the rendered text for each metric type (children in any
// order), escaping, numbers that read back exactly, concurrent updates, and CHECKs on programmer
// errors.
#include "metrics/registry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

namespace deja::metrics {
namespace {

// The serialized lines, sorted: prometheus-cpp renders children in no fixed order.
std::vector<std::string> SortedLines(const std::string& text) {
  std::vector<std::string> lines;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  std::sort(lines.begin(), lines.end());
  return lines;
}

TEST(RegistryTest, CounterFamilyRendersHelpTypeAndChildren) {
  Registry registry;
  auto& requests = registry.AddCounter("deja_coordinator_requests_total",
                                       "Finished requests by gRPC code.", {"code"});
  requests.Add({{"code", "OK"}}).Increment();
  requests.Add({{"code", "OK"}}).Increment(2);
  requests.Add({{"code", "INVALID_ARGUMENT"}}).Increment();
  EXPECT_EQ(SortedLines(registry.Serialize()),
            SortedLines("# HELP deja_coordinator_requests_total Finished requests by gRPC code.\n"
                        "# TYPE deja_coordinator_requests_total counter\n"
                        "deja_coordinator_requests_total{code=\"INVALID_ARGUMENT\"} 1\n"
                        "deja_coordinator_requests_total{code=\"OK\"} 3\n"));
}

TEST(RegistryTest, AddReturnsTheSameChildForTheSameLabelsInAnyOrder) {
  Registry registry;
  auto& family = registry.AddCounter("deja_test_events_total", "Events.", {"a", "b"});
  Counter& first = family.Add({{"a", "1"}, {"b", "2"}});
  Counter& again = family.Add({{"b", "2"}, {"a", "1"}});
  EXPECT_EQ(&first, &again);
  EXPECT_NE(&first, &family.Add({{"a", "1"}, {"b", "3"}}));
}

TEST(RegistryTest, LabelsRenderSortedByName) {
  Registry registry;
  auto& family = registry.AddGauge("deja_test_value_ratio", "Ratio.", {"zeta", "alpha"});
  family.Add({{"alpha", "a"}, {"zeta", "z"}}).Set(0.5);
  EXPECT_NE(registry.Serialize().find("deja_test_value_ratio{alpha=\"a\",zeta=\"z\"} 0.5\n"),
            std::string::npos)
      << registry.Serialize();
}

TEST(RegistryTest, GaugeWithoutLabelsGoesUpAndDown) {
  Registry registry;
  Gauge& running = registry.AddGauge("deja_scheduler_running_sequences", "Running.").Add({});
  running.Increment();
  running.Increment(4);
  running.Decrement(2);
  EXPECT_DOUBLE_EQ(running.Value(), 3);
  running.Set(-1.25);
  EXPECT_EQ(registry.Serialize(),
            "# HELP deja_scheduler_running_sequences Running.\n"
            "# TYPE deja_scheduler_running_sequences gauge\n"
            "deja_scheduler_running_sequences -1.25\n");
}

TEST(RegistryTest, CounterIgnoresNegativeAndNaNAmounts) {
  Registry registry;
  Counter& c = registry.AddCounter("deja_test_x_total", "X.").Add({});
  c.Increment(5);
  c.Increment(-3);
  c.Increment(std::numeric_limits<double>::quiet_NaN());
  EXPECT_DOUBLE_EQ(c.Value(), 5);
}

TEST(RegistryTest, HistogramRendersCumulativeBucketsSumAndCount) {
  Registry registry;
  auto& latency = registry.AddHistogram("deja_coordinator_request_duration_seconds",
                                        "Request latency.", {"method"}, {0.1, 0.5, 1});
  Histogram& h = latency.Add({{"method", "Generate"}});
  h.Observe(0.05);
  h.Observe(0.1);  // bounds are inclusive
  h.Observe(0.3);
  h.Observe(2.5);
  h.Observe(std::nan(""));  // ignored
  EXPECT_EQ(
      SortedLines(registry.Serialize()),
      SortedLines(
          "# HELP deja_coordinator_request_duration_seconds Request latency.\n"
          "# TYPE deja_coordinator_request_duration_seconds histogram\n"
          "deja_coordinator_request_duration_seconds_bucket{method=\"Generate\",le=\"0.1\"} 2\n"
          "deja_coordinator_request_duration_seconds_bucket{method=\"Generate\",le=\"0.5\"} 3\n"
          "deja_coordinator_request_duration_seconds_bucket{method=\"Generate\",le=\"1\"} 3\n"
          "deja_coordinator_request_duration_seconds_bucket{method=\"Generate\",le=\"+Inf\"} 4\n"
          "deja_coordinator_request_duration_seconds_sum{method=\"Generate\"} 2.95\n"
          "deja_coordinator_request_duration_seconds_count{method=\"Generate\"} 4\n"));
  const Histogram::Snapshot snap = h.Collect();
  EXPECT_EQ(snap.cumulative, (std::vector<uint64_t>{2, 3, 3, 4}));
  EXPECT_EQ(snap.count, 4u);
  EXPECT_DOUBLE_EQ(snap.sum, 2.95);
}

TEST(RegistryTest, HistogramWithoutLabelsHasOnlyLeLabel) {
  Registry registry;
  Histogram& h =
      registry.AddHistogram("deja_worker_step_duration_seconds", "Step.", {}, {1}).Add({});
  h.Observe(3);
  const std::string text = registry.Serialize();
  EXPECT_NE(text.find("deja_worker_step_duration_seconds_bucket{le=\"1\"} 0\n"), std::string::npos);
  EXPECT_NE(text.find("deja_worker_step_duration_seconds_bucket{le=\"+Inf\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("deja_worker_step_duration_seconds_sum 3\n"), std::string::npos);
  EXPECT_NE(text.find("deja_worker_step_duration_seconds_count 1\n"), std::string::npos);
}

TEST(RegistryTest, EveryFamilyRendersOnceWithItsChildren) {
  Registry registry;
  registry.AddGauge("deja_b_value", "B.").Add({}).Set(1);
  registry.AddCounter("deja_a_events_total", "A.").Add({});
  // A family appears once it has a child.
  auto& none = registry.AddCounter("deja_test_none_total", "Nothing yet.", {"code"});
  std::string text = registry.Serialize();
  for (const char* name : {"deja_b_value", "deja_a_events_total"}) {
    EXPECT_EQ(text.find(std::string("# TYPE ") + name), text.rfind(std::string("# TYPE ") + name));
    EXPECT_NE(text.find(std::string("# TYPE ") + name), std::string::npos) << name;
  }
  EXPECT_EQ(text.find("deja_test_none_total"), std::string::npos);
  none.Add({{"code", "OK"}});
  text = registry.Serialize();
  EXPECT_NE(text.find("deja_test_none_total{code=\"OK\"} 0\n"), std::string::npos) << text;
}

TEST(TextFormatTest, EscapesLabelValues) {
  Registry registry;
  registry.AddGauge("deja_build_info", "Build.", {"version"})
      .Add({{"version", "1.0 \"rc\"\\x\n"}})
      .Set(1);
  EXPECT_EQ(registry.Serialize(),
            "# HELP deja_build_info Build.\n"
            "# TYPE deja_build_info gauge\n"
            "deja_build_info{version=\"1.0 \\\"rc\\\"\\\\x\\n\"} 1\n");
}

TEST(TextFormatTest, NumbersReadBack) {
  Registry registry;
  auto& family = registry.AddGauge("deja_test_number", "N.", {"case"});
  const double third = 1.0 / 3.0;
  family.Add({{"case", "third"}}).Set(third);
  family.Add({{"case", "tiny"}}).Set(2.5e-7);
  family.Add({{"case", "inf"}}).Set(std::numeric_limits<double>::infinity());
  const std::string text = registry.Serialize();
  auto value = [&](const std::string& c) {
    const std::string key = "deja_test_number{case=\"" + c + "\"} ";
    const size_t at = text.find(key);
    EXPECT_NE(at, std::string::npos) << text;
    return text.substr(at + key.size(), text.find('\n', at) - at - key.size());
  };
  EXPECT_EQ(std::stod(value("third")), third);
  EXPECT_EQ(std::stod(value("tiny")), 2.5e-7);
  EXPECT_EQ(value("inf"), "+Inf");
}

TEST(TextFormatTest, ValidatesNames) {
  EXPECT_TRUE(IsValidMetricName("deja_x:y_total"));
  EXPECT_FALSE(IsValidMetricName("1abc"));
  EXPECT_FALSE(IsValidMetricName("a-b"));
  EXPECT_FALSE(IsValidMetricName(""));
  EXPECT_TRUE(IsValidLabelName("rank"));
  EXPECT_FALSE(IsValidLabelName("__name"));
  EXPECT_FALSE(IsValidLabelName("a:b"));
}

TEST(BucketsTest, ExponentialAndLinear) {
  EXPECT_EQ(ExponentialBuckets(0.001, 2, 4), (std::vector<double>{0.001, 0.002, 0.004, 0.008}));
  EXPECT_EQ(LinearBuckets(1, 0.5, 3), (std::vector<double>{1, 1.5, 2}));
}

TEST(ConcurrencyTest, IncrementsFromManyThreadsAddUp) {
  Registry registry;
  auto& counters = registry.AddCounter("deja_test_hits_total", "Hits.", {"thread_group"});
  Gauge& gauge = registry.AddGauge("deja_test_level", "Level.").Add({});
  auto& hist_family = registry.AddHistogram("deja_test_size_bytes", "Sizes.", {}, {10, 100});
  constexpr int kThreads = 8;
  constexpr int kIters = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Half the threads share one child, the rest another: Add races with Add too.
      Counter& c = counters.Add({{"thread_group", t % 2 == 0 ? "even" : "odd"}});
      Histogram& h = hist_family.Add({});
      for (int i = 0; i < kIters; ++i) {
        c.Increment();
        gauge.Increment(2);
        gauge.Decrement();
        h.Observe(static_cast<double>(i % 200));
      }
    });
  }
  // Rendering while updating must be safe (checked further under TSan).
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(registry.Serialize().empty());
  for (auto& th : threads) th.join();
  EXPECT_DOUBLE_EQ(counters.Add({{"thread_group", "even"}}).Value(), kThreads / 2 * kIters);
  EXPECT_DOUBLE_EQ(counters.Add({{"thread_group", "odd"}}).Value(), kThreads / 2 * kIters);
  EXPECT_DOUBLE_EQ(gauge.Value(), kThreads * kIters);
  const Histogram::Snapshot snap = hist_family.Add({}).Collect();
  EXPECT_EQ(snap.count, static_cast<uint64_t>(kThreads * kIters));
  // i % 200 in [0, 10] is 11 of every 200 values; in [0, 100] is 101 of them.
  EXPECT_EQ(snap.cumulative[0], static_cast<uint64_t>(kThreads * kIters / 200 * 11));
  EXPECT_EQ(snap.cumulative[1], static_cast<uint64_t>(kThreads * kIters / 200 * 101));
  EXPECT_DOUBLE_EQ(snap.sum, kThreads * (kIters / 200) * (199.0 * 200 / 2));
}

using RegistryDeathTest = ::testing::Test;

TEST(RegistryDeathTest, ProgrammerErrorsCheckFail) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        Registry r;
        r.AddCounter("deja_no_suffix", "x");
      },
      "must end in _total");
  EXPECT_DEATH(
      {
        Registry r;
        r.AddGauge("deja_dup", "x");
        r.AddGauge("deja_dup", "y");
      },
      "registered twice");
  EXPECT_DEATH(
      {
        Registry r;
        r.AddGauge("deja_g", "x", {"code"}).Add({{"kode", "1"}});
      },
      "missing label");
  EXPECT_DEATH(
      {
        Registry r;
        r.AddHistogram("deja_h", "x", {"le"}, {1});
      },
      "reserved");
  EXPECT_DEATH(
      {
        Registry r;
        r.AddHistogram("deja_h", "x", {}, {2, 1});
      },
      "strictly increase");
  EXPECT_DEATH(
      {
        Registry r;
        r.AddGauge("deja_help", "two\nlines");
      },
      "HELP text");
  EXPECT_DEATH(
      {
        Registry r;
        r.AddGauge("deja-bad", "x");
      },
      "invalid metric name");
}

}  // namespace
}  // namespace deja::metrics
