#pragma once
// Conversions from any block_index (stored forms, implicit rules, unions) into the stored forms,
// written into caller memory. Query the sizes first, then convert:
//
//   const std::int64_t nnz = count_nnz(p, idx);               // -> col_idx size for to_csr
//   const std::int32_t width = max_row_count(p, idx);         // -> width for to_block_table
//   const std::int64_t words = dense_mask_words(p);           // -> words for to_dense_mask
//
// Output order: to_csr and to_block_table copy each row in its cursor's order, so their output
// is canonical (sorted, unique) exactly when the input's rows are — always for a valid
// block_index. A raw (order::any) input stays raw: canonicalise the result (canonicalize.hpp).
// to_dense_mask is canonical by construction (a bit is set once, read in ascending order).
//
// Every id is checked against its row ([0, visible_blocks), the same messages as validate), so a
// converted index always passes validate(p, order::any) and nothing is written out of bounds.
// On a failed status the outputs hold a partial result.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

#include "skim/concepts/block_index.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"
#include "skim/index/block_table.hpp"
#include "skim/index/dense_block_mask.hpp"
#include "skim/index/order.hpp"

namespace skim::index {

// Ids over all rows of p (the col_idx size to_csr needs). @pre validate(p).ok()
template <block_index I>
[[nodiscard]] std::int64_t count_nnz(const problem& p, const I& idx) noexcept {
  std::int64_t n = 0;
  static_cast<void>(for_each_row(p, [&](const row_info& r) noexcept {
    for (auto c = idx.cursor(r); !c.done(); c.next()) ++n;
  }));
  return n;
}

// Most ids in any row of p (the smallest width to_block_table accepts). @pre validate(p).ok()
template <block_index I>
[[nodiscard]] std::int32_t max_row_count(const problem& p, const I& idx) noexcept {
  std::int32_t most = 0;
  static_cast<void>(for_each_row(p, [&](const row_info& r) noexcept {
    std::int32_t n = 0;
    for (auto c = idx.cursor(r); !c.done(); c.next()) ++n;
    most = std::max(most, n);
  }));
  return most;
}

// Writes idx as CSR.
// @pre  row_ptr_out has index_rows() + 1 entries; col_idx_out at least count_nnz(p, idx).
// @post on ok, block_csr{row_ptr_out, col_idx_out} holds the same rows as idx; col_idx_out past
//       row_ptr_out[rows] is untouched.
template <block_index I>
[[nodiscard]] status to_csr(const problem& p, const I& idx, std::span<std::int32_t> row_ptr_out,
                            std::span<std::int32_t> col_idx_out) noexcept {
  SKIM_TRY(skim::validate(p));
  const std::int64_t rows = p.index_rows();
  if (row_ptr_out.size() != static_cast<std::size_t>(rows) + 1) {
    return status::error(status_code::shape_mismatch, "to_csr row_ptr_out has %zu entries, needs rows %lld + 1",
                         row_ptr_out.size(), static_cast<long long>(rows));
  }
  // row_ptr is int32 (FlashInfer's layout): the total must fit.
  const auto capacity = static_cast<std::int64_t>(
      std::min<std::size_t>(col_idx_out.size(), static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())));
  std::int64_t nnz = 0;
  row_ptr_out[0] = 0;
  return for_each_row(p, [&](const row_info& r) noexcept -> status {
    std::int64_t pos = 0;
    for (auto c = idx.cursor(r); !c.done(); c.next(), ++pos) {
      const auto id = static_cast<std::int32_t>(c.id());
      SKIM_TRY(detail::check_id_range(r, id, pos));
      if (nnz >= capacity) {
        return status::error(status_code::shape_mismatch, "to_csr col_idx_out has %zu entries, too few for row %lld",
                             col_idx_out.size(), static_cast<long long>(r.row));
      }
      col_idx_out[static_cast<std::size_t>(nnz++)] = id;
    }
    row_ptr_out[static_cast<std::size_t>(r.row) + 1] = static_cast<std::int32_t>(nnz);
    return status::success();
  });
}

// Writes idx as a block table of the given width, padding each row with block_table::pad.
// @pre  ids_out has index_rows() * width entries, count_out index_rows().
// @post on ok, block_table{ids_out, count_out, width} holds the same rows as idx. A row with
//       more than width ids fails with invalid_argument (max_row_count gives the width needed).
template <block_index I>
[[nodiscard]] status to_block_table(const problem& p, const I& idx, std::int32_t width,
                                    std::span<std::int32_t> ids_out, std::span<std::int32_t> count_out) noexcept {
  SKIM_TRY(skim::validate(p));
  if (width < 0) return status::error(status_code::invalid_argument, "to_block_table width %d < 0", width);
  const std::int64_t rows = p.index_rows();
  if (count_out.size() != static_cast<std::size_t>(rows)) {
    return status::error(status_code::shape_mismatch, "to_block_table count_out has %zu entries, problem has %lld rows",
                         count_out.size(), static_cast<long long>(rows));
  }
  if (ids_out.size() != static_cast<std::size_t>(rows) * static_cast<std::size_t>(width)) {
    return status::error(status_code::shape_mismatch,
                         "to_block_table ids_out has %zu entries, needs rows %lld x width %d", ids_out.size(),
                         static_cast<long long>(rows), width);
  }
  return for_each_row(p, [&](const row_info& r) noexcept -> status {
    std::int32_t* row = ids_out.data() + static_cast<std::size_t>(r.row) * static_cast<std::size_t>(width);
    std::int64_t n = 0;
    for (auto c = idx.cursor(r); !c.done(); c.next(), ++n) {
      const auto id = static_cast<std::int32_t>(c.id());
      SKIM_TRY(detail::check_id_range(r, id, n));
      if (n < width) row[n] = id;
    }
    if (n > width) {
      return status::error(status_code::invalid_argument, "to_block_table row %lld has %lld blocks > width %d",
                           static_cast<long long>(r.row), static_cast<long long>(n), width);
    }
    std::fill(row + n, row + width, block_table::pad);
    count_out[static_cast<std::size_t>(r.row)] = static_cast<std::int32_t>(n);
    return status::success();
  });
}

// Writes idx as a dense mask with problem::max_kv_blocks() columns
// (view it with dense_block_mask::for_problem(p, words_out)).
// @pre words_out has dense_mask_words(p) entries.
template <block_index I>
[[nodiscard]] status to_dense_mask(const problem& p, const I& idx, std::span<std::uint64_t> words_out) noexcept {
  SKIM_TRY(skim::validate(p));
  const std::int64_t wpr = mask_words_per_row(p.max_kv_blocks());
  if (words_out.size() != static_cast<std::size_t>(dense_mask_words(p))) {
    return status::error(status_code::shape_mismatch,
                         "to_dense_mask words_out has %zu entries, needs rows %lld x words per row %lld",
                         words_out.size(), static_cast<long long>(p.index_rows()), static_cast<long long>(wpr));
  }
  return for_each_row(p, [&](const row_info& r) noexcept -> status {
    std::uint64_t* row = words_out.data() + r.row * wpr;
    std::fill(row, row + wpr, std::uint64_t{0});
    std::int64_t pos = 0;
    for (auto c = idx.cursor(r); !c.done(); c.next(), ++pos) {
      const auto id = static_cast<std::int32_t>(c.id());
      SKIM_TRY(detail::check_id_range(r, id, pos));  // id < visible_blocks <= max_kv_blocks: in the row
      row[id / bits_per_word] |= std::uint64_t{1} << (id % bits_per_word);
    }
    return status::success();
  });
}

}  // namespace skim::index
