#pragma once
// reserved<Dynamic>: reserved branches first, then a dynamic selector over the blocks left
// (docs/design.md §7). For a row with v visible blocks:
//  - sink: ids [0, sink) — the attention sinks at the start of the sequence;
//  - local: the `local` newest visible blocks, ids [v - local, v) — the local window;
//  - recency: the newest visible block v - 1, kept whatever the scores say (insurance: the
//    block holding the query's own recent keys is never dropped by a noisy router);
//  - importance: the best ceil(importance * B) blocks by the prior among the blocks not reserved
//    above, where B is the dynamic selector's budget for the row (its max_count(v), less any
//    budget_used from an enclosing selector); ranked like scores (prior descending, id
//    ascending, NaN read as -inf). The share comes out of the dynamic budget: the dynamic
//    selector then runs with budget_used raised by the importance count, so sink, local and
//    recency are extra while importance + dynamic together stay within B.
// The dynamic selector sees every reserved block in its `exclude` list, so it never picks one
// again (and threshold counts their mass as already kept); the result is the sorted union.
// Each branch is clamped to the row: sink > v takes every block, and so on.
//
// ceil(importance * B) is taken as ceil(importance * B - importance_slack * B): a share written
// in decimal is not exact in float (0.3f is 0.30000001), and 0.3f * 10 must give 3 blocks, not 4.
//
// Workspace: three int32 lists of v entries, then the dynamic selector's own workspace.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include "skim/concepts/selector.hpp"
#include "skim/core/status.hpp"
#include "skim/core/workspace.hpp"
#include "skim/select/rank.hpp"
#include "skim/select/top_k.hpp"  // for the concept check below

namespace skim::select {

template <selector Dynamic>
struct reserved {
  // 1e-6 of the budget: above float's relative error (6e-8) on a decimal share, far below one block
  // for any budget under a million blocks.
  static constexpr double importance_slack = 1e-6;

  std::int32_t sink = 0;      // >= 0 blocks at the start
  std::int32_t local = 0;     // >= 0 newest visible blocks
  bool recency = true;        // keep the newest visible block
  float importance = 0.0f;    // in [0, 1], share of the dynamic budget chosen by the prior
  Dynamic dynamic{};

  [[nodiscard]] status validate() const noexcept {
    if (sink < 0) return status::error(status_code::invalid_argument, "reserved sink %d < 0", sink);
    if (local < 0) return status::error(status_code::invalid_argument, "reserved local %d < 0", local);
    if (!(importance >= 0.0f && importance <= 1.0f)) {
      return status::error(status_code::invalid_argument, "reserved importance %g outside [0, 1]",
                           static_cast<double>(importance));
    }
    return dynamic.validate();
  }

  [[nodiscard]] std::int32_t max_count(std::int32_t visible_blocks) const noexcept {
    const std::int64_t v = std::max(visible_blocks, std::int32_t{0});
    // sink < 0 is rejected by validate(), but the size query comes first: clamp it so that a bad
    // parameter can never make max_count negative (a negative block_table width). Found by
    // tests/fuzz/select_fuzz.cpp; regression test in tests/hardening/fuzz_regression_test.cpp.
    const std::int64_t fixed = std::clamp<std::int64_t>(sink, 0, v) + std::min<std::int64_t>(newest(), v);
    return static_cast<std::int32_t>(std::min(v, fixed + dynamic.max_count(visible_blocks)));
  }

  [[nodiscard]] std::size_t workspace_bytes(std::int32_t max_blocks) const noexcept {
    workspace_arena measure;
    (void)carve(measure, max_blocks);
    return measure.bytes();
  }

  [[nodiscard]] status select_row(const row_scores& in, std::span<std::int32_t> out, std::int32_t& count,
                                  std::span<std::byte> workspace) const noexcept {
    count = 0;
    SKIM_TRY(validate());
    SKIM_TRY(detail::check_row_input(in));
    const std::int32_t v = in.row.visible_blocks;
    if (importance > 0.0f && in.prior.empty() && v > 0) {  // a row with no block needs no prior
      return status::error(status_code::invalid_argument, "reserved importance %g needs a prior; none given for row %lld",
                           static_cast<double>(importance), static_cast<long long>(in.row.row));
    }
    SKIM_TRY(check_workspace(workspace, workspace_bytes(v)));
    workspace_arena arena(workspace);
    const scratch s = carve(arena, v);

    // Sink, local and recency: [0, a) and [b, v), less what an enclosing selector already took.
    const std::int32_t a = std::min(sink, v);
    const std::int32_t b = std::max(v - std::min(newest(), v), a);
    std::size_t own = 0;  // s.own[0, own): our reserved ids, ascending
    std::size_t e = 0;
    const auto keep = [&](std::int32_t id) noexcept {
      while (e < in.exclude.size() && in.exclude[e] < id) ++e;
      if (e == in.exclude.size() || in.exclude[e] != id) s.own[own++] = id;
    };
    for (std::int32_t id = 0; id < a; ++id) keep(id);
    for (std::int32_t id = b; id < v; ++id) keep(id);
    // s.exclude[0, excluded): the enclosing selector's ids and ours.
    std::copy(in.exclude.begin(), in.exclude.end(), s.exclude.begin());
    std::size_t excluded = in.exclude.size();
    detail::merge_into(s.exclude, excluded, s.own.first(own));
    excluded += own;

    // Importance: the best blocks by prior among the rest, out of the dynamic budget.
    const std::int32_t budget = std::max(dynamic.max_count(v) - in.budget_used, std::int32_t{0});
    const std::int32_t wanted = importance_count(budget);
    std::int32_t important = 0;
    if (wanted > 0) {
      const std::int32_t n = detail::gather_candidates(v, s.exclude.first(excluded), s.other);
      important = std::min(wanted, n);
      detail::keep_best(in.prior, s.other.first(static_cast<std::size_t>(n)), static_cast<std::size_t>(important));
      const auto picked = s.other.first(static_cast<std::size_t>(important));
      detail::merge_into(s.own, own, picked);
      detail::merge_into(s.exclude, excluded, picked);
      own += picked.size();
      excluded += picked.size();
    }

    // The dynamic choice among the blocks left, into s.other.
    std::int32_t dynamic_count = 0;
    const row_scores rest{.row = in.row, .scores = in.scores, .prior = in.prior,
                          .exclude = s.exclude.first(excluded), .budget_used = in.budget_used + important};
    SKIM_TRY(dynamic.select_row(rest, s.other, dynamic_count, s.dynamic));

    const std::int64_t total = static_cast<std::int64_t>(own) + dynamic_count;
    if (static_cast<std::size_t>(total) > out.size()) {
      count = static_cast<std::int32_t>(total);
      return detail::out_too_small(in.row, count, out.size());
    }
    std::merge(s.own.begin(), s.own.begin() + static_cast<std::ptrdiff_t>(own), s.other.begin(),
               s.other.begin() + dynamic_count, out.begin());
    count = static_cast<std::int32_t>(total);
    return status::success();
  }

 private:
  struct scratch {
    std::span<std::int32_t> own;        // [v] reserved ids of this selector, ascending
    std::span<std::int32_t> exclude;    // [v] ids the dynamic selector must skip, ascending
    std::span<std::int32_t> other;      // [v] importance candidates, then the dynamic choice
    std::span<std::byte> dynamic;       // [dynamic.workspace_bytes(v)]
  };

  // The one sequence of takes both workspace_bytes and select_row use (workspace.hpp).
  [[nodiscard]] scratch carve(workspace_arena& arena, std::int32_t blocks) const noexcept {
    const auto n = static_cast<std::size_t>(std::max(blocks, std::int32_t{0}));
    scratch s;
    s.own = arena.take<std::int32_t>(n);
    s.exclude = arena.take<std::int32_t>(n);
    s.other = arena.take<std::int32_t>(n);
    s.dynamic = arena.take<std::byte>(dynamic.workspace_bytes(blocks));  // 64-byte aligned, as it checks
    return s;
  }

  // Newest blocks kept by local and recency together.
  [[nodiscard]] std::int32_t newest() const noexcept { return std::max(local, recency ? 1 : 0); }

  [[nodiscard]] std::int32_t importance_count(std::int32_t budget) const noexcept {
    if (budget <= 0 || importance <= 0.0f) return 0;
    const double b = static_cast<double>(budget);
    const double n = std::ceil(static_cast<double>(importance) * b - importance_slack * b);
    return static_cast<std::int32_t>(std::clamp(n, 0.0, b));
  }
};
static_assert(selector<reserved<top_k>>);
static_assert(selector<reserved<reserved<top_k>>>);  // nests: the inner one sees the outer one's exclude

}  // namespace skim::select
