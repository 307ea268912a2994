#pragma once
// token_list: a fixed-width table of key *token* positions per index row, plus a count per row —
// the output of a token-level indexer (score every cached key, keep the best t), where the block
// forms of this directory hold key *block* ids.
//
// Rows are the index rows of a problem (docs/design.md §4): row = (q_block_offset(b) + i) ·
// index_heads + h, one per (sequence, query block, index head). Row r's positions are
// positions[r · width, r · width + count[r]); slots past count are padding and never read
// (select::top_tokens writes `pad` there). A position is relative to the row's sequence: token j
// is key cu_seqlens_kv[b] + j of K/V (or slot j of the sequence's pages).
//
// Canonical form (what validate(problem) accepts and every token executor requires):
//  - 0 <= count[r] <= width;
//  - positions strictly ascending (sorted, unique: a key listed twice would count twice in the
//    softmax), in [0, visible_keys(r)), where visible_keys(r) are the keys the row's last query
//    sees: under causality (bottom-right aligned, §3) keys j <= q_end - 1 + kv_len - q_len, under
//    mask_kind::none all kv_len keys. A decode row (one query) sees every key of its sequence.
// The earlier queries of a multi-query row see a prefix of the row's keys; an executor gives each
// query only the listed positions it sees (the causal mask still applies inside a row).
//
// A non-owning view over caller memory, like block_table: basic_token_list<const std::int32_t>
// (token_list) is what executors read; basic_token_list<std::int32_t> (mutable_token_list) is what
// a selector writes, and converts to the read-only view. It is not a block_index (its entries are
// not block ids): block executors cannot take it by mistake.
//
// Cost: validate is O(rows + listed positions) plus for_each_row's O(batch²) row walk; row() is O(1).

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"

namespace skim::index {

// Keys [0, row_visible_keys(r, mask)) are visible to some query of row r (to its last query).
// 0 for a row without queries (never made by make_row_info for a valid problem).
[[nodiscard]] constexpr std::int32_t row_visible_keys(const row_info& r, mask_kind mask) noexcept {
  return r.q_end > r.q_begin ? r.visible_keys(r.q_end - 1, mask) : 0;
}

// Checks position `pos` (at ordinal `at` of row r's list) against the row and its predecessor
// `prev` (-1 before the first). Executors run it again while they gather (docs/design.md §6), so
// a list that skipped validation costs a status, never an out-of-bounds read.
[[nodiscard]] inline status check_token_position(const row_info& r, std::int32_t visible, std::int32_t pos,
                                                 std::int32_t prev, std::int64_t at) noexcept {
  const auto row = static_cast<long long>(r.row);
  const auto where = static_cast<long long>(at);
  if (pos < 0) {
    return status::error(status_code::invalid_index, "token position %d < 0 in row %lld (position %lld)", pos, row,
                         where);
  }
  if (pos >= r.kv_len) {
    return status::error(status_code::invalid_index,
                         "token position %d >= keys %d of sequence %d in row %lld (position %lld)", pos, r.kv_len,
                         r.seq, row, where);
  }
  if (pos >= visible) {
    return status::error(status_code::invalid_index,
                         "token position %d >= visible keys %d in row %lld (position %lld): in the future under "
                         "causality",
                         pos, visible, row, where);
  }
  if (at > 0 && pos == prev) {
    return status::error(status_code::invalid_index, "duplicate token position %d in row %lld (positions %lld and %lld)",
                         pos, row, where - 1, where);
  }
  if (at > 0 && pos < prev) {
    return status::error(status_code::invalid_index, "unsorted token positions in row %lld: %d at position %lld after %d",
                         row, pos, where, prev);
  }
  return status::success();
}

template <class T>
struct basic_token_list {
  static_assert(std::is_same_v<std::remove_const_t<T>, std::int32_t>, "token positions are std::int32_t");
  static constexpr std::int32_t pad = -1;  // written into unused slots; never read as a position

  std::span<T> positions;  // [rows, width], row-major
  std::span<T> count;      // [rows], 0 <= count[r] <= width
  std::int32_t width = 0;

  // A mutable list converts to the read-only one (a template, as in block_table).
  template <class U = T>
    requires(!std::is_const_v<U>)
  [[nodiscard]] constexpr operator basic_token_list<const U>() const noexcept {
    return {positions, count, width};
  }

  // Positions of row r.row. Reads only inside positions and count, whatever their content: an
  // out-of-range row gives an empty span, a count is clamped to [0, width] and to the end of positions.
  [[nodiscard]] constexpr std::span<const std::int32_t> row(const row_info& r) const noexcept {
    if (r.row < 0 || static_cast<std::size_t>(r.row) >= count.size() || width <= 0) return {};
    const auto begin = static_cast<std::size_t>(r.row) * static_cast<std::size_t>(width);
    if (begin >= positions.size()) return {};
    const std::int32_t c = count[static_cast<std::size_t>(r.row)];
    std::size_t n = c < 0 ? 0 : static_cast<std::size_t>(c);
    if (n > static_cast<std::size_t>(width)) n = static_cast<std::size_t>(width);
    if (n > positions.size() - begin) n = positions.size() - begin;
    return {positions.data() + begin, n};
  }

  // @post ok iff count has index_rows() entries, positions rows · width, and every row is in the
  // canonical form of the header comment. A failure names the value, its row and its position.
  [[nodiscard]] status validate(const problem& p) const noexcept {
    SKIM_TRY(skim::validate(p));
    if (width < 0) return status::error(status_code::invalid_argument, "token_list width %d < 0", width);
    const std::int64_t rows = p.index_rows();
    if (count.size() != static_cast<std::size_t>(rows)) {
      return status::error(status_code::shape_mismatch, "token_list count has %zu entries, problem has %lld rows",
                           count.size(), static_cast<long long>(rows));
    }
    if (positions.size() != static_cast<std::size_t>(rows) * static_cast<std::size_t>(width)) {
      return status::error(status_code::shape_mismatch,
                           "token_list positions has %zu entries, needs rows %lld x width %d", positions.size(),
                           static_cast<long long>(rows), width);
    }
    return for_each_row(p, [&](const row_info& r) noexcept -> status {
      const std::int32_t n = count[static_cast<std::size_t>(r.row)];
      const auto row_number = static_cast<long long>(r.row);
      if (n < 0) return status::error(status_code::invalid_index, "count %d < 0 in row %lld", n, row_number);
      if (n > width) {
        return status::error(status_code::invalid_index, "count %d > width %d in row %lld", n, width, row_number);
      }
      const std::int32_t visible = row_visible_keys(r, p.mask);
      const std::int32_t* first = positions.data() + static_cast<std::size_t>(r.row) * static_cast<std::size_t>(width);
      for (std::int32_t i = 0; i < n; ++i) {
        SKIM_TRY(check_token_position(r, visible, first[i], i > 0 ? first[i - 1] : -1, i));
      }
      return status::success();
    });
  }
};

using token_list = basic_token_list<const std::int32_t>;
using mutable_token_list = basic_token_list<std::int32_t>;

}  // namespace skim::index
