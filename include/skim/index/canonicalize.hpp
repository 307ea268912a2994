#pragma once
// Canonicalisation: sort and deduplicate every row of a stored index in place, so raw input (a
// selector's output in score order, a concatenation of branches) becomes what executors require.
//
//   SKIM_TRY(validate(p, table, order::any));   // optional: canonicalize validates the same way
//   SKIM_TRY(canonicalize(p, table));
//   // table now passes validate(p, table, order::canonical)
//
// Both functions first validate with order::any and change nothing if that fails. They do not
// allocate (std::sort on each row's own ids).

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"
#include "skim/index/block_csr.hpp"
#include "skim/index/block_table.hpp"
#include "skim/index/order.hpp"

namespace skim::index {

// Sorts and deduplicates each row of t; count shrinks by the duplicates dropped, and every slot
// past the new count (freed or padding before) holds block_table::pad, as conversions write it.
// @post on ok, t.validate(p) is ok.
[[nodiscard]] inline status canonicalize(const problem& p, mutable_block_table t) noexcept {
  SKIM_TRY(t.validate(p, order::any));
  const std::int64_t rows = p.index_rows();
  for (std::int64_t r = 0; r < rows; ++r) {
    std::int32_t* first = t.ids.data() + static_cast<std::size_t>(r) * static_cast<std::size_t>(t.width);
    std::int32_t* last = first + t.count[static_cast<std::size_t>(r)];
    std::sort(first, last);
    std::int32_t* kept = std::unique(first, last);
    std::fill(kept, first + t.width, block_table::pad);
    t.count[static_cast<std::size_t>(r)] = static_cast<std::int32_t>(kept - first);
  }
  return status::success();
}

// Sorts and deduplicates each row of c, compacting col_idx towards the front and rewriting
// row_ptr; the slots freed at the end, [new nnz, old nnz), get block_table::pad.
// @post on ok, nnz = c.row_ptr[rows] (the new count of ids) and c.validate(p) is ok; on failure
//       nnz is untouched.
[[nodiscard]] inline status canonicalize(const problem& p, mutable_block_csr c, std::int64_t& nnz) noexcept {
  SKIM_TRY(c.validate(p, order::any));
  const std::int64_t rows = p.index_rows();
  std::int32_t* col = c.col_idx.data();
  std::int32_t write = 0;      // compacted end; never passes the read position, so rows don't clobber
  std::int32_t old_begin = 0;  // row r's old start (row_ptr[r] is already rewritten)
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int32_t old_end = c.row_ptr[static_cast<std::size_t>(r) + 1];
    std::sort(col + old_begin, col + old_end);
    const std::int32_t row_begin = write;
    for (std::int32_t k = old_begin; k < old_end; ++k) {
      if (write == row_begin || col[write - 1] != col[k]) col[write++] = col[k];
    }
    c.row_ptr[static_cast<std::size_t>(r) + 1] = write;
    old_begin = old_end;
  }
  std::fill(col + write, col + old_begin, block_table::pad);
  nnz = write;
  return status::success();
}

}  // namespace skim::index
