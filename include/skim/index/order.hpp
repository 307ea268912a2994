#pragma once
// Validation mode of the stored index forms, and the checks they share.
//
// order::canonical — what executors require and what the block_index concept's validate(problem)
//   checks: every row's ids sorted ascending, unique, in [0, row.visible_blocks).
// order::any — raw input: ids in range and the storage well formed (counts, row_ptr, span sizes),
//   but a row may be unsorted and hold duplicates. Validate raw input with order::any, then
//   canonicalise it in place (canonicalize.hpp).
//
// Every failure names the bad value and its place; the exact texts are part of the contract
// (tests compare them), so two ids out of range give two different messages: one beyond the
// sequence's own blocks (varlen: the sequence has fewer blocks than the mask has columns), one
// inside the sequence but in the future under causality.

#include <concepts>
#include <cstdint>

#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"

namespace skim::index {

enum class order : std::uint8_t { canonical, any };

// validate(problem, index, order) for the stored forms (block_table, block_csr, dense_block_mask).
template <class I>
  requires requires(const I& i, const problem& p, order o) {
    { i.validate(p, o) } -> std::same_as<status>;
  }
[[nodiscard]] status validate(const problem& p, const I& index, order o) noexcept {
  return index.validate(p, o);
}

namespace detail {

// Checks one id of row r at `position` (its ordinal in the row's storage; < 0: no position, as
// in a bitmask where the id is the position).
[[nodiscard]] inline status check_id_range(const row_info& r, std::int32_t id, std::int64_t position) noexcept {
  const auto row = static_cast<long long>(r.row);
  const auto pos = static_cast<long long>(position);
  if (id < 0) {
    if (position < 0) return status::error(status_code::invalid_index, "block id %d < 0 in row %lld", id, row);
    return status::error(status_code::invalid_index, "block id %d < 0 in row %lld (position %lld)", id, row, pos);
  }
  if (id >= r.kv_blocks) {
    if (position < 0) {
      return status::error(status_code::invalid_index, "block id %d >= kv blocks %d of sequence %d in row %lld",
                           id, r.kv_blocks, r.seq, row);
    }
    return status::error(status_code::invalid_index,
                         "block id %d >= kv blocks %d of sequence %d in row %lld (position %lld)", id, r.kv_blocks,
                         r.seq, row, pos);
  }
  if (id >= r.visible_blocks) {
    if (position < 0) {
      return status::error(status_code::invalid_index,
                           "block id %d >= visible blocks %d in row %lld: in the future under causality", id,
                           r.visible_blocks, row);
    }
    return status::error(status_code::invalid_index,
                         "block id %d >= visible blocks %d in row %lld (position %lld): in the future under causality",
                         id, r.visible_blocks, row, pos);
  }
  return status::success();
}

// Checks that `id` at `position` may follow `prev` at position - 1 in canonical order.
[[nodiscard]] inline status check_ascending(const row_info& r, std::int32_t prev, std::int32_t id,
                                            std::int64_t position) noexcept {
  if (id == prev) {
    return status::error(status_code::invalid_index, "duplicate block id %d in row %lld (positions %lld and %lld)",
                         id, static_cast<long long>(r.row), static_cast<long long>(position - 1),
                         static_cast<long long>(position));
  }
  if (id < prev) {
    return status::error(status_code::invalid_index, "unsorted block ids in row %lld: %d at position %lld after %d",
                         static_cast<long long>(r.row), id, static_cast<long long>(position), prev);
  }
  return status::success();
}

// Checks the ids [first, last) of row r: each in range; in canonical order also strictly ascending.
[[nodiscard]] inline status check_row_ids(const row_info& r, const std::int32_t* first, const std::int32_t* last,
                                          order o) noexcept {
  std::int64_t pos = 0;
  for (const std::int32_t* p = first; p != last; ++p, ++pos) {
    SKIM_TRY(check_id_range(r, *p, pos));
    if (o == order::canonical && pos > 0) SKIM_TRY(check_ascending(r, p[-1], *p, pos));
  }
  return status::success();
}

// Cursor over stored ids [p, e) (block_table and block_csr rows).
struct span_cursor {
  const std::int32_t* p = nullptr;
  const std::int32_t* e = nullptr;
  [[nodiscard]] constexpr bool done() const noexcept { return p == e; }
  [[nodiscard]] constexpr std::int32_t id() const noexcept { return *p; }
  constexpr void next() noexcept { ++p; }
  // Advances n >= 0 ids at once (at most to the end).
  constexpr void skip(std::int64_t n) noexcept { p = n < e - p ? p + n : e; }
};

}  // namespace detail
}  // namespace skim::index
