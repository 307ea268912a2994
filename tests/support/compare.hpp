#pragma once
// Comparison of an executor's output against the reference's, row by row.
//
// For every (query token, query head):
//  - a row the reference leaves empty (lse = -inf, o = 0: no visible key) must be exactly o = 0,
//    lse = -inf in the tested output;
//  - otherwise the relative L2 error ‖o - o_ref‖ / max(‖o_ref‖, floor) must be <= tol_o, and
//    |lse - lse_ref| <= tol_lse · max(1, |lse_ref|).
// The floor (0.1·sqrt(head_dim), ~ the norm of an average of 100 N(0, 1) rows: the random rows hold
// tens to hundreds of keys) keeps a row whose exact output happens to cancel to little (likely at
// small head_dim) from turning fp32 rounding into a large relative error: at 0.05·sqrt(head_dim) a
// row of ~70 keys at head_dim 2 with norm 0.084 failed by its fp32 sums alone (absolute error 8.9e-7,
// relative 1.05e-5). NaN anywhere fails (comparisons are written as !(x <= tol)).

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <sstream>
#include <string>

#include "skim/core/dtypes.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/views.hpp"

namespace skim::test {

struct comparison {
  double max_rel_o = 0.0;
  double max_abs_lse = 0.0;
  std::int64_t empty_rows = 0;
  std::int64_t rows = 0;
  std::int64_t failures = 0;
  std::string first_failure;
};

template <element TO>
[[nodiscard]] comparison compare(const problem& p, strided_view<TO> test, strided_view<TO> ref,
                                 std::span<const float> lse_test, std::span<const float> lse_ref, double tol_o,
                                 double tol_lse = 1e-5) {
  comparison c;
  const auto fail = [&](std::int32_t t, std::int32_t h, const std::string& what) {
    if (c.failures++ == 0) {
      std::ostringstream s;
      s << "token " << t << " head " << h << ": " << what;
      c.first_failure = s.str();
    }
  };
  const double floor = 0.1 * std::sqrt(static_cast<double>(p.head_dim));
  for (std::int32_t t = 0; t < p.tokens_q(); ++t) {
    for (std::int32_t h = 0; h < p.heads_q; ++h) {
      ++c.rows;
      const TO* a = test.row(t, h);
      const TO* r = ref.row(t, h);
      double err = 0.0, norm = 0.0;
      bool ref_zero = true, test_zero = true;
      for (std::int32_t e = 0; e < p.head_dim; ++e) {
        const double x = to_float(a[e]), y = to_float(r[e]);
        err += (x - y) * (x - y);
        norm += y * y;
        ref_zero = ref_zero && y == 0.0;
        test_zero = test_zero && x == 0.0;
      }
      const std::size_t l = static_cast<std::size_t>(t) * static_cast<std::size_t>(p.heads_q) + static_cast<std::size_t>(h);
      const bool has_lse = !lse_ref.empty();
      const bool ref_empty = has_lse ? lse_ref[l] == -INFINITY : ref_zero;
      if (ref_empty) {
        ++c.empty_rows;
        if (!ref_zero) fail(t, h, "reference row with lse -inf has non-zero o");
        if (!test_zero) fail(t, h, "row with no visible key has non-zero (or NaN) o");
        if (has_lse && !(lse_test[l] == -INFINITY)) fail(t, h, "row with no visible key has lse " + std::to_string(lse_test[l]));
        continue;
      }
      const double rel = std::sqrt(err) / std::max(std::sqrt(norm), floor);
      if (!(rel <= c.max_rel_o)) c.max_rel_o = std::isnan(rel) ? INFINITY : rel;
      if (!(rel <= tol_o)) fail(t, h, "relative error of o " + std::to_string(rel));
      if (has_lse) {
        const double dl = std::abs(static_cast<double>(lse_test[l]) - lse_ref[l]);
        if (!(dl <= c.max_abs_lse)) c.max_abs_lse = std::isnan(dl) ? INFINITY : dl;
        if (!(dl <= tol_lse * std::max(1.0, std::abs(static_cast<double>(lse_ref[l]))))) {
          fail(t, h, "lse " + std::to_string(lse_test[l]) + " vs reference " + std::to_string(lse_ref[l]));
        }
      }
    }
  }
  return c;
}

// CHECKs a comparison, reporting the first failing row.
inline void check(const comparison& c) {
  INFO("rows " << c.rows << ", empty " << c.empty_rows << ", max rel o " << c.max_rel_o << ", max |dlse| "
               << c.max_abs_lse << ", failures " << c.failures << ", first: " << c.first_failure);
  CHECK(c.failures == 0);
}

}  // namespace skim::test
