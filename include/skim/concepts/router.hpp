#pragma once
// The router concept: one score per candidate key block for each index row (docs/design.md §1, §7).
//
// A router reads the block summaries a summarizer S built (skim/summarize/build.hpp layout:
// [total_kv_blocks, heads_kv, record_floats]) and the queries, and writes, per index row, a score in
// logit units (the softmax scale applied) for every key block of the row's sequence. A selector ranks
// these scores; a probability-mass threshold treats them as logits, hence the scale.
//
// Requirements on a router R used with summarizer S (r a const R):
//  1. r.workspace_bytes(problem) -> std::size_t: scratch bytes score_row() and score() need. It depends
//     on the problem's shape only (never on data) and never fails; for a problem that validate()
//     rejects it may return anything, and the scoring calls then report the problem.
//  2. r.can_implement(problem) -> status: ok iff the scoring calls accept every valid input of this
//     problem; otherwise names the value (an option, the scale) it cannot handle.
//  3. r.template score_row<S>(problem, row_info, q, seq_records, scores, workspace) noexcept -> status,
//     for q a strided_view<const TQ> [tokens_q, heads_q, head_dim] of any skim::element TQ, seq_records
//     the records of the row's sequence ([kv_blocks(seq), heads_kv, record_floats]) and scores a span of
//     at least row.kv_blocks floats: writes every float of scores — the score of block j at scores[j]
//     for j < row.visible_blocks, -inf for every other entry (the causal future and any padding).
//  4. r.template score<S>(problem, q, records, scores, workspace) noexcept -> status: score_row for
//     every index row, row-major into scores [index_rows, max_kv_blocks] (rows padded with -inf);
//     records is the whole batch's [total_kv_blocks, heads_kv, record_floats].
//  5. Both scoring calls check their input (sizes, the workspace as check_workspace does) before reading
//     anything, report bad input as a status naming the value and its place, never allocate, and are
//     deterministic: the same inputs give the same bits whatever the workspace held before.
//  6. Routers are cheap copyable values; options are public members.
//
// Each router checks the concept right after its definition, with the summarizers it is meant for:
// static_assert(skim::router<route::pooled_router, summarize::mean_pool>).

#include <concepts>
#include <cstddef>
#include <span>

#include "skim/concepts/summarizer.hpp"
#include "skim/core/dtypes.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"
#include "skim/core/views.hpp"

namespace skim {

template <class R, class S>
concept router = summarizer<S> && std::copyable<R> &&
    requires(const R& r, const problem& p, const row_info& row, strided_view<const float> q32,
             strided_view<const half> q16, strided_view<const bfloat16> qb16, std::span<const float> records,
             std::span<float> scores, std::span<std::byte> workspace) {
      { r.workspace_bytes(p) } -> std::same_as<std::size_t>;
      { r.can_implement(p) } -> std::same_as<status>;
      { r.template score_row<S>(p, row, q32, records, scores, workspace) } noexcept -> std::same_as<status>;
      { r.template score_row<S>(p, row, q16, records, scores, workspace) } noexcept -> std::same_as<status>;
      { r.template score_row<S>(p, row, qb16, records, scores, workspace) } noexcept -> std::same_as<status>;
      { r.template score<S>(p, q32, records, scores, workspace) } noexcept -> std::same_as<status>;
      { r.template score<S>(p, q16, records, scores, workspace) } noexcept -> std::same_as<status>;
      { r.template score<S>(p, qb16, records, scores, workspace) } noexcept -> std::same_as<status>;
    };

}  // namespace skim
