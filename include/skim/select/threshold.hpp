#pragma once
// threshold: keeps k = min(k_max, max(k_min, c)) best blocks, where c counts the blocks that pass
// a threshold set by `mode` (docs/design.md §7). The kept blocks are always the k best in the ranking
// order of rank.hpp (score descending, id ascending, NaN read as -inf), so the blocks that pass
// are exactly the best c, and k_min / k_max only widen or cut that prefix.
//
// Blocks scored -inf (or NaN) carry no softmax weight, so they never count toward c in any mode;
// they are taken only to reach k_min, after every finite block.
//  - absolute: c = |{j : s_j >= tau}|.
//  - relative: c = |{j : s_j >= m - tau}|, m the row's best score, tau >= 0 in logits: the blocks
//    whose softmax weight is within a factor e^-tau of the best block's. m - tau is computed in
//    float; tau = +inf keeps every finite block.
//  - mass: c is the smallest number of best blocks whose softmax-normalised scores
//    p_j = e^(s_j - m) / sum_i e^(s_i - m) add up to at least tau, tau in (0, 1]. The sums are
//    taken in double, in ranking order, and the total is the same running sum carried to the
//    end, so the cut is exact against it (tau = 1 keeps every block whose weight still changes
//    the sum). With +inf scores, the +inf blocks share all the mass equally.
// The row is every visible block: inside an enclosing selector (reserved.hpp) m and the mass
// total include the excluded blocks, and the excluded blocks' mass counts as already kept — so
// sink, window and importance blocks that hold most of the mass leave little for the threshold.
// k_min and k_max shrink by budget_used (not below 0); k never exceeds the candidates left.
//
// Cost: absolute and relative O(visible_blocks) (a count, then keep_best's radix selection); mass
// O(visible_blocks log visible_blocks) (two sorts). Workspace: one int32 list of visible_blocks.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

#include "skim/concepts/selector.hpp"
#include "skim/core/status.hpp"
#include "skim/select/rank.hpp"

namespace skim::select {

enum class threshold_mode : std::uint8_t { absolute, relative, mass };

struct threshold {
  threshold_mode mode = threshold_mode::absolute;
  float tau = 0.0f;  // absolute: a logit; relative: >= 0 logits below the best; mass: (0, 1]
  std::int32_t k_min = 0;  // >= 0
  std::int32_t k_max = std::numeric_limits<std::int32_t>::max();  // >= k_min

  [[nodiscard]] status validate() const noexcept {
    if (k_min < 0) return status::error(status_code::invalid_argument, "threshold k_min %d < 0", k_min);
    if (k_max < 0) return status::error(status_code::invalid_argument, "threshold k_max %d < 0", k_max);
    if (k_min > k_max) {
      return status::error(status_code::invalid_argument, "threshold k_min %d > k_max %d", k_min, k_max);
    }
    if (std::isnan(tau)) return status::error(status_code::invalid_argument, "threshold tau is NaN");
    switch (mode) {
      case threshold_mode::absolute: return status::success();
      case threshold_mode::relative:
        if (tau < 0.0f) {
          return status::error(status_code::invalid_argument, "threshold relative tau %g < 0",
                               static_cast<double>(tau));
        }
        return status::success();
      case threshold_mode::mass:
        if (!(tau > 0.0f && tau <= 1.0f)) {
          return status::error(status_code::invalid_argument, "threshold mass tau %g outside (0, 1]",
                               static_cast<double>(tau));
        }
        return status::success();
    }
    return status::error(status_code::invalid_argument, "threshold mode %d unknown", static_cast<int>(mode));
  }

  [[nodiscard]] std::int32_t max_count(std::int32_t visible_blocks) const noexcept {
    return std::clamp(k_max, std::int32_t{0}, std::max(visible_blocks, std::int32_t{0}));
  }

  [[nodiscard]] std::size_t workspace_bytes(std::int32_t max_blocks) const noexcept {
    return detail::candidate_list_bytes(max_blocks);
  }

  [[nodiscard]] status select_row(const row_scores& in, std::span<std::int32_t> out, std::int32_t& count,
                                  std::span<std::byte> workspace) const noexcept {
    return detail::select_best(*this, in, out, count, workspace, [&](std::span<std::int32_t> candidates) noexcept {
      const std::int32_t passing = mode == threshold_mode::mass ? count_mass(in, candidates)
                                                                : count_passing(in, candidates);
      const std::int32_t lo = std::max(k_min - in.budget_used, std::int32_t{0});
      const std::int32_t hi = std::max(k_max - in.budget_used, std::int32_t{0});
      return std::min(hi, std::max(lo, passing));
    });
  }

 private:
  // The best key over every visible block (excluded ones too).
  [[nodiscard]] static float row_max(const row_scores& in) noexcept {
    float m = detail::neg_inf;
    for (std::int32_t j = 0; j < in.row.visible_blocks; ++j) m = std::max(m, detail::key(in.scores[j]));
    return m;
  }

  // absolute and relative: the candidates with a finite-or-+inf key >= the threshold.
  [[nodiscard]] std::int32_t count_passing(const row_scores& in, std::span<const std::int32_t> candidates) const noexcept {
    float cut = tau;
    if (mode == threshold_mode::relative) {
      const float m = row_max(in);
      if (m == detail::neg_inf) return 0;  // no block carries weight
      cut = tau == detail::pos_inf ? detail::neg_inf : m - tau;  // +inf - +inf would be NaN
    }
    std::int32_t c = 0;
    for (const std::int32_t id : candidates) {
      const float s = detail::key(in.scores[id]);
      c += (s > detail::neg_inf && s >= cut) ? 1 : 0;
    }
    return c;
  }

  // mass: ranks the candidates (a sort) and returns the length of the shortest prefix of that order
  // that, with the excluded blocks' mass, holds a share tau of the row's mass; the candidates end
  // ascending again.
  [[nodiscard]] std::int32_t count_mass(const row_scores& in, std::span<std::int32_t> candidates) const noexcept {
    const float m = row_max(in);
    if (m == detail::neg_inf) return 0;
    // Softmax weight relative to the best block: in (0, 1], 0 for -inf; with m = +inf, the
    // +inf blocks weigh 1 and the rest 0 (e^(inf - inf) would be NaN).
    const auto weight = [m](float score) noexcept -> double {
      const float s = detail::key(score);
      if (m == detail::pos_inf) return s == detail::pos_inf ? 1.0 : 0.0;
      return s == detail::neg_inf ? 0.0 : std::exp(static_cast<double>(s) - static_cast<double>(m));
    };
    std::sort(candidates.begin(), candidates.end(), detail::ranks_before{in.scores.data()});
    double kept = 0.0;
    for (const std::int32_t id : in.exclude) kept += weight(in.scores[id]);
    double total = kept;
    for (const std::int32_t id : candidates) total += weight(in.scores[id]);
    const double target = static_cast<double>(tau) * total;  // total > 0: the best block weighs 1
    std::int32_t c = 0;
    // Same additions in the same order as `total`, so `kept` reaches `total` >= target by the end.
    while (kept < target && c < static_cast<std::int32_t>(candidates.size())) {
      kept += weight(in.scores[candidates[static_cast<std::size_t>(c)]]);
      ++c;
    }
    std::sort(candidates.begin(), candidates.end());  // ascending again, as select_best's keep_best wants them
    return c;
  }
};
static_assert(selector<threshold>);

}  // namespace skim::select
