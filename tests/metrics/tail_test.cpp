// metrics/tail.hpp — percentiles on known sequences, both bad sides, empty and NaN input.
#include "skim/metrics/tail.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "metrics/metrics_testing.hpp"

using namespace skim::metrics;

TEST_CASE("tail: 1..100 in shuffled order, low side is bad (recall, coverage)") {
  const std::uint32_t seed = skim::metrics_test::fresh_seed();
  INFO("seed ", seed);
  std::mt19937 rng(seed);
  std::vector<double> x(100);
  std::iota(x.begin(), x.end(), 1.0);
  std::shuffle(x.begin(), x.end(), rng);
  const tail_summary t = summarize_tail(x, tail_side::low_is_bad);
  CHECK(t.count == 100);
  CHECK(t.mean == doctest::Approx(50.5).epsilon(1e-15));
  CHECK(t.p1 == doctest::Approx(1.99).epsilon(1e-12));   // 1 + 0.01 · 99
  CHECK(t.p5 == doctest::Approx(5.95).epsilon(1e-12));   // 1 + 0.05 · 99
  CHECK(t.p50 == doctest::Approx(50.5).epsilon(1e-12));
  CHECK(t.worst == 1.0);
}

TEST_CASE("tail: 1..100, high side is bad (error): p1 is the 99th percentile, worst the max") {
  std::vector<double> x(100);
  std::iota(x.begin(), x.end(), 1.0);
  std::reverse(x.begin(), x.end());
  const tail_summary t = summarize_tail(x, tail_side::high_is_bad);
  CHECK(t.mean == doctest::Approx(50.5).epsilon(1e-15));
  CHECK(t.p1 == doctest::Approx(99.01).epsilon(1e-12));
  CHECK(t.p5 == doctest::Approx(95.05).epsilon(1e-12));
  CHECK(t.p50 == doctest::Approx(50.5).epsilon(1e-12));
  CHECK(t.worst == 100.0);
  // The rule is symmetric: the high-side tail of x is minus the low-side tail of -x.
  std::vector<double> neg(x.size());
  std::transform(x.begin(), x.end(), neg.begin(), [](double v) { return -v; });
  const tail_summary n = summarize_tail(neg, tail_side::low_is_bad);
  CHECK(n.p1 == doctest::Approx(-t.p1).epsilon(1e-12));
  CHECK(n.p5 == doctest::Approx(-t.p5).epsilon(1e-12));
  CHECK(n.worst == -t.worst);
}

TEST_CASE("tail: small sequences interpolate between order statistics") {
  const std::vector<double> x{4.0, 0.0, 2.0};  // sorted 0, 2, 4
  const tail_summary lo = summarize_tail(x, tail_side::low_is_bad);
  CHECK(lo.p1 == doctest::Approx(0.04));  // pos 0.02: 0 + 0.02 · 2
  CHECK(lo.p5 == doctest::Approx(0.2));
  CHECK(lo.p50 == 2.0);
  CHECK(lo.mean == 2.0);
  const std::vector<double> one{0.25};
  const tail_summary s = summarize_tail(one, tail_side::high_is_bad);
  CHECK(s.count == 1);
  CHECK(s.p1 == 0.25);
  CHECK(s.p5 == 0.25);
  CHECK(s.p50 == 0.25);
  CHECK(s.worst == 0.25);
}

TEST_CASE("tail: empty input is all NaN, NaN values are ignored") {
  const tail_summary e = summarize_tail({}, tail_side::low_is_bad);
  CHECK(e.count == 0);
  CHECK(std::isnan(e.mean));
  CHECK(std::isnan(e.p1));
  CHECK(std::isnan(e.worst));
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> x{nan, 3.0, nan, 1.0};
  const tail_summary t = summarize_tail(x, tail_side::high_is_bad);
  CHECK(t.count == 2);
  CHECK(t.mean == 2.0);
  CHECK(t.worst == 3.0);
  CHECK(t.p50 == 2.0);
}
