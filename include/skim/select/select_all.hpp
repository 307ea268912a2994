#pragma once
// select_all: runs a selector over every index row of a problem and stores the result as an index
// (block_table or block_csr) in canonical form — what validate(problem) accepts.
//
// Scores come as a router writes them: one row of score_stride floats per index row, row-major,
// row r's block j at scores[r * score_stride + j]; only the first visible_blocks of each row are
// read. A prior, if any, is laid out the same way with its own stride.
//
// Query, then run:
//   const std::int32_t width = select::max_count(sel, p);            // block_table width
//   skim::workspace_buffer ws(select::workspace_bytes(sel, p));     // outside the hot path
//   SKIM_TRY(select::select_all(sel, p, {.scores = s, .score_stride = stride}, table, ws.span()));
// select_all does not allocate; one workspace serves every row (selector concept, req. 4). Rows
// are independent: each row's ids depend on that row's input only, so any split of the rows over
// threads gives the same index (run select_row per row, see the selector concept).
// On failure the output's content is unspecified.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

#include "skim/concepts/selector.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"
#include "skim/core/workspace.hpp"
#include "skim/index/block_csr.hpp"
#include "skim/index/block_table.hpp"

namespace skim::select {

struct select_input {
  std::span<const float> scores{};    // [index_rows, score_stride], logits
  std::int64_t score_stride = 0;      // >= problem::max_kv_blocks()
  std::span<const float> prior{};     // [index_rows, prior_stride], or empty: no prior
  std::int64_t prior_stride = 0;      // >= problem::max_kv_blocks() when a prior is given
};

// The most ids any row of p gets: the width of a block_table that always suffices.
template <selector S>
[[nodiscard]] std::int32_t max_count(const S& s, const problem& p) noexcept {
  return s.max_count(p.max_kv_blocks());
}

// Scratch bytes select_all needs for p (0 is possible: then any span, even an empty one, works).
template <selector S>
[[nodiscard]] std::size_t workspace_bytes(const S& s, const problem& p) noexcept {
  return s.workspace_bytes(p.max_kv_blocks());
}

namespace detail {

// Checks one [index_rows, stride] input: its stride covers every row's blocks, its span every row.
[[nodiscard]] inline status check_rows(const char* name, const char* stride_name, std::span<const float> values,
                                       std::int64_t stride, const problem& p) noexcept {
  const std::int64_t rows = p.index_rows();
  if (stride < p.max_kv_blocks()) {
    return status::error(status_code::shape_mismatch, "%s %lld < max kv blocks %d", stride_name,
                         static_cast<long long>(stride), p.max_kv_blocks());
  }
  if (static_cast<std::uint64_t>(values.size()) < static_cast<std::uint64_t>(rows) * static_cast<std::uint64_t>(stride)) {
    return status::error(status_code::shape_mismatch, "%s has %zu entries < index rows %lld x %s %lld", name,
                         values.size(), static_cast<long long>(rows), stride_name, static_cast<long long>(stride));
  }
  return status::success();
}

// Checks everything select_all reads (but the output) before it writes anything.
template <selector S>
[[nodiscard]] status check_select_all(const S& s, const problem& p, const select_input& in,
                                      std::span<std::byte> workspace) noexcept {
  SKIM_TRY(validate(p));
  SKIM_TRY(s.validate());
  SKIM_TRY(check_rows("scores", "score_stride", in.scores, in.score_stride, p));
  if (!in.prior.empty()) SKIM_TRY(check_rows("prior", "prior_stride", in.prior, in.prior_stride, p));
  return check_workspace(workspace, workspace_bytes(s, p));
}

// Row r's input. @pre check_select_all(...) is ok.
[[nodiscard]] inline row_scores row_input(const select_input& in, const row_info& r) noexcept {
  const auto row = static_cast<std::size_t>(r.row);
  row_scores rs{.row = r, .scores = in.scores.subspan(row * static_cast<std::size_t>(in.score_stride),
                                                      static_cast<std::size_t>(in.score_stride))};
  if (!in.prior.empty()) {
    rs.prior = in.prior.subspan(row * static_cast<std::size_t>(in.prior_stride),
                                static_cast<std::size_t>(in.prior_stride));
  }
  return rs;
}

}  // namespace detail

// Fills a block_table: row r's ids at ids[r * width, r * width + count[r]), the rest of the row
// set to block_table::pad, so the whole table is a function of the input.
// @post on success out.validate(p) is ok. A row that selects more than width ids is an error
// (size width with max_count(s, p)).
template <selector S>
[[nodiscard]] status select_all(const S& s, const problem& p, const select_input& in, index::mutable_block_table out,
                                std::span<std::byte> workspace) noexcept {
  SKIM_TRY(detail::check_select_all(s, p, in, workspace));
  const std::int64_t rows = p.index_rows();
  if (out.width < 0) return status::error(status_code::invalid_argument, "block_table width %d < 0", out.width);
  if (out.count.size() != static_cast<std::size_t>(rows)) {
    return status::error(status_code::shape_mismatch, "block_table count has %zu entries, problem has %lld rows",
                         out.count.size(), static_cast<long long>(rows));
  }
  if (out.ids.size() != static_cast<std::size_t>(rows) * static_cast<std::size_t>(out.width)) {
    return status::error(status_code::shape_mismatch, "block_table ids has %zu entries, needs rows %lld x width %d",
                         out.ids.size(), static_cast<long long>(rows), out.width);
  }
  return for_each_row(p, [&](const row_info& r) noexcept -> status {
    const auto width = static_cast<std::size_t>(out.width);
    const std::span<std::int32_t> ids = out.ids.subspan(static_cast<std::size_t>(r.row) * width, width);
    std::int32_t n = 0;
    const status st = s.select_row(detail::row_input(in, r), ids, n, workspace);
    if (!st.ok()) {
      if (static_cast<std::size_t>(n) > width) {
        return status::error(status_code::shape_mismatch,
                             "row %lld selects %d blocks > block_table width %d (size it with max_count)",
                             static_cast<long long>(r.row), n, out.width);
      }
      return st;
    }
    std::fill(ids.begin() + n, ids.end(), index::mutable_block_table::pad);
    out.count[static_cast<std::size_t>(r.row)] = n;
    return status::success();
  });
}

// Fills a block_csr row by row: row_ptr written as it goes, ids packed into col_idx, whose size is
// the capacity (entries past row_ptr[rows] are left as they were). Exceeding it is an error.
// @post on success out.validate(p) is ok.
template <selector S>
[[nodiscard]] status select_all(const S& s, const problem& p, const select_input& in, index::mutable_block_csr out,
                                std::span<std::byte> workspace) noexcept {
  SKIM_TRY(detail::check_select_all(s, p, in, workspace));
  const std::int64_t rows = p.index_rows();
  if (out.row_ptr.size() != static_cast<std::size_t>(rows) + 1) {
    return status::error(status_code::shape_mismatch, "block_csr row_ptr has %zu entries, needs rows %lld + 1",
                         out.row_ptr.size(), static_cast<long long>(rows));
  }
  // row_ptr holds int32: never pack more ids than it can address.
  const std::size_t capacity =
      std::min(out.col_idx.size(), static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()));
  out.row_ptr[0] = 0;
  return for_each_row(p, [&](const row_info& r) noexcept -> status {
    const auto begin = static_cast<std::size_t>(out.row_ptr[static_cast<std::size_t>(r.row)]);
    std::int32_t n = 0;
    const status st = s.select_row(detail::row_input(in, r), out.col_idx.subspan(begin, capacity - begin), n, workspace);
    if (!st.ok()) {
      if (static_cast<std::size_t>(n) > capacity - begin) {
        return status::error(status_code::shape_mismatch,
                             "block_csr col_idx capacity %zu exceeded in row %lld: rows up to it need %zu ids",
                             capacity, static_cast<long long>(r.row), begin + static_cast<std::size_t>(n));
      }
      return st;
    }
    out.row_ptr[static_cast<std::size_t>(r.row) + 1] = static_cast<std::int32_t>(begin + static_cast<std::size_t>(n));
    return status::success();
  });
}

}  // namespace skim::select
