#pragma once
// block_csr: compressed sparse rows of block ids (FlashInfer BSR style). Row r's ids are
// col_idx[row_ptr[r], row_ptr[r + 1]).
//
// A non-owning view over caller memory. basic_block_csr<const std::int32_t> (block_csr) is the
// read-only index; basic_block_csr<std::int32_t> (mutable_block_csr) is what canonicalize()
// compacts in place, and converts to the read-only view. col_idx may be longer than
// row_ptr[rows] (capacity); entries past it are never read.

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "skim/concepts/block_index.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"
#include "skim/index/order.hpp"

namespace skim::index {

template <class T>
struct basic_block_csr {
  static_assert(std::is_same_v<std::remove_const_t<T>, std::int32_t>, "block ids are std::int32_t");

  std::span<T> row_ptr;  // [rows + 1], row_ptr[0] == 0, non-decreasing, row_ptr[rows] <= col_idx.size()
  std::span<T> col_idx;  // [nnz] (or more: capacity)

  // (A template, so that the read-only instantiation does not declare a conversion to itself.)
  template <class U = T>
    requires(!std::is_const_v<U>)
  [[nodiscard]] constexpr operator basic_block_csr<const U>() const noexcept {
    return {row_ptr, col_idx};
  }

  // Ids of row r.row. Reads only inside row_ptr and col_idx, whatever their content: an
  // out-of-range row gives an empty cursor, [row_ptr[r], row_ptr[r + 1]) is clamped to col_idx.
  [[nodiscard]] constexpr detail::span_cursor cursor(const row_info& r) const noexcept {
    if (r.row < 0 || static_cast<std::size_t>(r.row) + 1 >= row_ptr.size()) return {};
    const auto size = static_cast<std::int64_t>(col_idx.size());
    std::int64_t b = row_ptr[static_cast<std::size_t>(r.row)];
    std::int64_t e = row_ptr[static_cast<std::size_t>(r.row) + 1];
    b = b < 0 ? 0 : (b > size ? size : b);
    e = e < b ? b : (e > size ? size : e);
    const std::int32_t* p = col_idx.data();
    return {p + b, p + e};
  }

  // @post ok iff row_ptr has index_rows() + 1 entries, row_ptr[0] == 0, row_ptr never decreases,
  // row_ptr[rows] <= col_idx.size(), and every row holds ids in [0, visible_blocks), sorted and
  // unique under order::canonical.
  [[nodiscard]] status validate(const problem& p, order o = order::canonical) const noexcept {
    SKIM_TRY(skim::validate(p));
    const std::int64_t rows = p.index_rows();
    if (row_ptr.size() != static_cast<std::size_t>(rows) + 1) {
      return status::error(status_code::shape_mismatch, "block_csr row_ptr has %zu entries, needs rows %lld + 1",
                           row_ptr.size(), static_cast<long long>(rows));
    }
    if (row_ptr[0] != 0) return status::error(status_code::invalid_index, "row_ptr[0] = %d, must be 0", row_ptr[0]);
    for (std::size_t r = 1; r < row_ptr.size(); ++r) {
      if (row_ptr[r] < row_ptr[r - 1]) {
        return status::error(status_code::invalid_index, "row_ptr[%zu] = %d < row_ptr[%zu] = %d (must not decrease)",
                             r, row_ptr[r], r - 1, row_ptr[r - 1]);
      }
    }
    if (static_cast<std::size_t>(row_ptr.back()) > col_idx.size()) {
      return status::error(status_code::invalid_index, "row_ptr[%lld] = %d > col_idx size %zu",
                           static_cast<long long>(rows), row_ptr.back(), col_idx.size());
    }
    return for_each_row(p, [&](const row_info& r) noexcept -> status {
      const std::int32_t* first = col_idx.data() + row_ptr[static_cast<std::size_t>(r.row)];
      const std::int32_t* last = col_idx.data() + row_ptr[static_cast<std::size_t>(r.row) + 1];
      return detail::check_row_ids(r, first, last, o);
    });
  }
};

using block_csr = basic_block_csr<const std::int32_t>;
using mutable_block_csr = basic_block_csr<std::int32_t>;

static_assert(block_index<block_csr>);
static_assert(block_index<mutable_block_csr>);

}  // namespace skim::index
