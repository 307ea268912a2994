#pragma once
// top_k: the k best visible blocks of a row, ties to the lower block id.
//
// "Best" is the ranking order of rank.hpp: score descending, then id ascending, NaN read as -inf.
// Blocks scored -inf are still visible blocks and rank last; they are taken when k exceeds the
// rest (k >= visible_blocks takes every visible block, k = 0 takes none). Inside an enclosing
// selector the budget is k - budget_used and excluded blocks are skipped.
// Cost: O(visible_blocks): a few passes over the candidates (rank.hpp's keep_best), already in id order.
// Workspace: one int32 candidate list of visible_blocks entries.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "skim/concepts/selector.hpp"
#include "skim/core/status.hpp"
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
    return detail::candidate_list_bytes(max_blocks);
  }

  [[nodiscard]] status select_row(const row_scores& in, std::span<std::int32_t> out, std::int32_t& count,
                                  std::span<std::byte> workspace) const noexcept {
    // The budget an enclosing selector left.
    return detail::select_best(*this, in, out, count, workspace,
                               [&](std::span<std::int32_t>) noexcept { return k - in.budget_used; });
  }
};
static_assert(selector<top_k>);

}  // namespace skim::select
