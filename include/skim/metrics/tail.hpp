#pragma once
// skim::metrics tails — a mean is not enough: sparse attention fails in the tail (one head, one
// query), so every quality number is reported as a mean and its bad tail (docs/design.md §12).
//
// A tail_summary always reports the *bad* side of the distribution, so that "p1" reads the same
// for every metric: the value that only 1% of rows are worse than.
//  - tail_side::low_is_bad (recall, coverage): p1, p5 are the 1st and 5th percentiles, worst = min.
//  - tail_side::high_is_bad (output error, tiles per row): p1, p5 are the 99th and 95th
//    percentiles ("p1 of the bad tail"), worst = max.
// p50 is the median either way.
//
// Percentiles interpolate linearly between order statistics (numpy.percentile's default, "type 7"):
// the q-quantile of sorted x[0..n) is x[k] + f·(x[k+1] − x[k]) with k + f = q·(n − 1). This rule is
// symmetric, so the high-side p1 of x equals minus the low-side p1 of −x. For 1..100: low side
// p1 = 1.99, p5 = 5.95, p50 = 50.5, worst = 1; high side p1 = 99.01, p5 = 95.05, worst = 100.
//
// Allocates (a sorted copy): an evaluation tool, not a hot path.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace skim::metrics {

enum class tail_side : std::uint8_t { low_is_bad, high_is_bad };

struct tail_summary {
  double mean = std::numeric_limits<double>::quiet_NaN();
  double p1 = std::numeric_limits<double>::quiet_NaN();     // 1% of values are worse (bad side)
  double p5 = std::numeric_limits<double>::quiet_NaN();     // 5% of values are worse (bad side)
  double p50 = std::numeric_limits<double>::quiet_NaN();    // median
  double worst = std::numeric_limits<double>::quiet_NaN();  // min (low_is_bad) or max (high_is_bad)
  std::int64_t count = 0;                                   // values summarised; 0 leaves every field NaN
};

// The q-quantile (q in [0, 1]) of an ascending, non-empty sequence, interpolated linearly.
[[nodiscard]] inline double quantile_sorted(std::span<const double> sorted, double q) noexcept {
  if (sorted.empty()) return std::numeric_limits<double>::quiet_NaN();
  q = q < 0.0 ? 0.0 : (q > 1.0 ? 1.0 : q);
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const auto k = static_cast<std::size_t>(std::floor(pos));
  if (k + 1 >= sorted.size()) return sorted.back();
  const double f = pos - static_cast<double>(k);
  return sorted[k] + f * (sorted[k + 1] - sorted[k]);
}

// Mean and bad-side percentiles of `values`. NaN values are ignored (not counted); infinities count.
[[nodiscard]] inline tail_summary summarize_tail(std::span<const double> values, tail_side side) {
  std::vector<double> x;
  x.reserve(values.size());
  for (double v : values) {
    if (!std::isnan(v)) x.push_back(v);
  }
  tail_summary t;
  t.count = static_cast<std::int64_t>(x.size());
  if (x.empty()) return t;
  double sum = 0.0;
  for (double v : x) sum += v;  // in input order: deterministic
  t.mean = sum / static_cast<double>(x.size());
  std::sort(x.begin(), x.end());
  const bool low = side == tail_side::low_is_bad;
  t.p1 = quantile_sorted(x, low ? 0.01 : 0.99);
  t.p5 = quantile_sorted(x, low ? 0.05 : 0.95);
  t.p50 = quantile_sorted(x, 0.5);
  t.worst = low ? x.front() : x.back();
  return t;
}

}  // namespace skim::metrics
