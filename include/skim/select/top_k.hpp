#pragma once
// top_k: the k best visible blocks of a row, ties to the lower block id.
//
// "Best" is the ranking order of rank.hpp: score descending, then id ascending, NaN read as -inf.
// Blocks scored -inf are still visible blocks and rank last; they are taken when k exceeds the
// rest (k >= visible_blocks takes every visible block, k = 0 takes none). Inside an enclosing
// selector the budget is k - budget_used and excluded blocks are skipped.
// Cost: O(visible_blocks) on average (nth_element), plus O(k log k) to sort the result by id.
// Workspace: one int32 candidate list of visible_blocks entries.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "skim/concepts/selector.hpp"
#include "skim/core/status.hpp"
#include "skim/core/workspace.hpp"
#include "skim/select/rank.hpp"

namespace skim::select {

struct top_k {
  std::int32_t k = 0;  // >= 0

  [[nodiscard]] status validate() const noexcept {
    if (k < 0) return status::error(status_code::invalid_argument, "top_k k %d < 0", k);
    return status::success();
  }

  [[nodiscard]] std::int32_t max_count(std::int32_t visible_blocks) const noexcept {
    return std::clamp(k, std::int32_t{0}, std::max(visible_blocks, std::int32_t{0}));
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
    SKIM_TRY(check_workspace(workspace, workspace_bytes(v)));
    workspace_arena arena(workspace);
    const std::span<std::int32_t> candidates = carve(arena, v);  // [visible_blocks]
    const std::int32_t n = detail::gather_candidates(v, in.exclude, candidates);
    const std::int32_t budget = std::max(k - in.budget_used, std::int32_t{0});
    const std::int32_t take = std::min(budget, n);
    if (static_cast<std::size_t>(take) > out.size()) {
      count = take;
      return detail::out_too_small(in.row, take, out.size());
    }
    detail::keep_best(in.scores, candidates.first(static_cast<std::size_t>(n)), static_cast<std::size_t>(take));
    std::copy_n(candidates.begin(), take, out.begin());
    count = take;
    return status::success();
  }

 private:
  // The one sequence of takes both workspace_bytes and select_row use (workspace.hpp).
  [[nodiscard]] static std::span<std::int32_t> carve(workspace_arena& arena, std::int32_t blocks) noexcept {
    return arena.take<std::int32_t>(static_cast<std::size_t>(std::max(blocks, std::int32_t{0})));
  }
};
static_assert(selector<top_k>);

}  // namespace skim::select
