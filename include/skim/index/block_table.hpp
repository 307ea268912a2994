#pragma once
// block_table: a fixed-width table of block ids per row, plus a count per row
// (FlexAttention / NSA style). Row r's ids are ids[r * width, r * width + count[r]); the entries
// past count are padding and never read (conversions and canonicalisation write `pad` there).
//
// A non-owning view over caller memory. basic_block_table<const std::int32_t> (block_table) is the
// read-only index; basic_block_table<std::int32_t> (mutable_block_table) is what canonicalize()
// rewrites in place, and converts to the read-only view.

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
struct basic_block_table {
  static_assert(std::is_same_v<std::remove_const_t<T>, std::int32_t>, "block ids are std::int32_t");
  static constexpr std::int32_t pad = -1;  // written into unused slots; never read as an id

  std::span<T> ids;    // [rows, width], row-major
  std::span<T> count;  // [rows], 0 <= count[r] <= width
  std::int32_t width = 0;

  // A mutable table converts to the read-only one.
  // (A template, so that the read-only instantiation does not declare a conversion to itself.)
  template <class U = T>
    requires(!std::is_const_v<U>)
  [[nodiscard]] constexpr operator basic_block_table<const U>() const noexcept {
    return {ids, count, width};
  }

  // Ids of row r.row. Reads only inside ids and count, whatever their content: an out-of-range
  // row gives an empty cursor, a count is clamped to [0, width] and to the end of ids.
  [[nodiscard]] constexpr detail::span_cursor cursor(const row_info& r) const noexcept {
    if (r.row < 0 || static_cast<std::size_t>(r.row) >= count.size() || width <= 0) return {};
    const auto begin = static_cast<std::size_t>(r.row) * static_cast<std::size_t>(width);
    if (begin >= ids.size()) return {};
    std::size_t n = count[static_cast<std::size_t>(r.row)] < 0 ? 0 : static_cast<std::size_t>(count[r.row]);
    if (n > static_cast<std::size_t>(width)) n = static_cast<std::size_t>(width);
    if (n > ids.size() - begin) n = ids.size() - begin;
    const std::int32_t* p = ids.data() + begin;
    return {p, p + n};
  }

  // @post ok iff count has index_rows() entries, ids rows * width, and every row holds
  // 0 <= count <= width ids in [0, visible_blocks), sorted and unique under order::canonical.
  [[nodiscard]] status validate(const problem& p, order o = order::canonical) const noexcept {
    SKIM_TRY(skim::validate(p));
    if (width < 0) return status::error(status_code::invalid_argument, "block_table width %d < 0", width);
    const std::int64_t rows = p.index_rows();
    if (count.size() != static_cast<std::size_t>(rows)) {
      return status::error(status_code::shape_mismatch, "block_table count has %zu entries, problem has %lld rows",
                           count.size(), static_cast<long long>(rows));
    }
    if (ids.size() != static_cast<std::size_t>(rows) * static_cast<std::size_t>(width)) {
      return status::error(status_code::shape_mismatch, "block_table ids has %zu entries, needs rows %lld x width %d",
                           ids.size(), static_cast<long long>(rows), width);
    }
    return for_each_row(p, [&](const row_info& r) noexcept -> status {
      const std::int32_t n = count[static_cast<std::size_t>(r.row)];
      const auto row = static_cast<long long>(r.row);
      if (n < 0) return status::error(status_code::invalid_index, "count %d < 0 in row %lld", n, row);
      if (n > width) return status::error(status_code::invalid_index, "count %d > width %d in row %lld", n, width, row);
      const std::int32_t* first = ids.data() + static_cast<std::size_t>(r.row) * static_cast<std::size_t>(width);
      return detail::check_row_ids(r, first, first + n, o);
    });
  }
};

using block_table = basic_block_table<const std::int32_t>;
using mutable_block_table = basic_block_table<std::int32_t>;

static_assert(block_index<block_table>);
static_assert(block_index<mutable_block_table>);
static_assert(block_cursor<detail::span_cursor>);

}  // namespace skim::index
