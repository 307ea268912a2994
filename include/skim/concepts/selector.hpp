#pragma once
// The selector concept: which key blocks one index row reads, chosen from the row's block scores
// (docs/design.md §1, §7).
//
// Input of one row (row_scores):
//  - scores [>= row.visible_blocks]: one logit per block, as a router writes them. Entries at or
//    past visible_blocks are never read (they are the future, or another sequence's padding).
//    NaN reads as -inf: every selector ranks blocks by (score descending, id ascending) with
//    NaN = -inf, a strict total order, so a broken router's NaN cannot make the choice depend on
//    comparison quirks or on the algorithm's visiting order — the same input gives the same ids.
//  - prior [>= row.visible_blocks], or empty: a per-block prior (attention mass a block received
//    during prefill, a learned predictor's score); read by selectors that say so (reserved's
//    importance share), same NaN rule.
//  - exclude: sorted unique ids in [0, visible_blocks) an enclosing selector already took
//    (reserved.hpp passes its reserved blocks); a selector never picks them again.
//  - budget_used >= 0: how much of this selector's own budget the enclosing selector spent on its
//    behalf (reserved's importance share); the selector's limits shrink by that much.
// Plain callers leave exclude and budget_used empty and 0.
//
// Requirements on S:
//  1. std::copyable; parameters are public members, set with designated initialisers.
//  2. s.validate() -> status: ok iff the parameters are in their domain; a failure names the
//     parameter and its value ("top_k k -1 < 0").
//  3. s.max_count(visible_blocks) -> std::int32_t, noexcept: an upper bound, in [0, visible_blocks],
//     on the ids select_row writes for any row with that many visible blocks (size a block_table's
//     width with it: select_all.hpp's max_count(s, problem)).
//  4. s.workspace_bytes(max_blocks) -> std::size_t, noexcept: scratch bytes select_row needs for any
//     row with visible_blocks <= max_blocks; depends on nothing else, never decreases as max_blocks
//     grows (so one workspace sized for a problem's widest row serves every row).
//  5. s.select_row(in, out, count, workspace) noexcept -> status: writes the chosen ids — sorted
//     ascending, unique, in [0, visible_blocks), none in in.exclude — to out[0, count). It checks
//     its parameters, the input spans and the workspace (check_workspace) first. On failure count
//     is 0 and out is not written, except when out is too small: then the status is
//     shape_mismatch and count is the number of ids the row needs.
//  6. select_row does not allocate and is deterministic: the same inputs give the same ids,
//     whatever the workspace held before.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"

namespace skim {

// The input of one selector row (see the concept's comment).
struct row_scores {
  row_info row{};
  std::span<const float> scores{};          // [>= row.visible_blocks], logits; NaN reads as -inf
  std::span<const float> prior{};           // [>= row.visible_blocks], or empty: no prior
  std::span<const std::int32_t> exclude{};  // [n], sorted unique ids in [0, row.visible_blocks)
  std::int32_t budget_used = 0;             // >= 0, spent by an enclosing selector
};

template <class S>
concept selector = std::copyable<S> &&
    requires(const S& s, const row_scores& in, std::span<std::int32_t> out, std::int32_t& count,
             std::span<std::byte> workspace, std::int32_t blocks) {
      { s.validate() } -> std::same_as<status>;
      { s.max_count(blocks) } noexcept -> std::same_as<std::int32_t>;
      { s.workspace_bytes(blocks) } noexcept -> std::same_as<std::size_t>;
      { s.select_row(in, out, count, workspace) } noexcept -> std::same_as<status>;
    };

}  // namespace skim
