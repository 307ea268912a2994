#pragma once
// The index concept: which key blocks each index row reads.
//
// A block_cursor walks one row's logical block ids:
//  1. done() is true once the row is exhausted;
//  2. id() is the current block id, valid while !done();
//  3. next() advances; ids come strictly ascending (sorted, unique) for a valid index.
//
// A cursor may also be a skippable_cursor: skip(n) advances n >= 0 ids in O(1) (explicit rows and
// id ranges), so a walk that needs only a window of a row (a decode chunk) starts there.
//
// A block_index gives a cursor for any row of a problem:
//  1. cursor(row_info) -> block_cursor, reading nothing outside the index's own storage even for
//     an invalid index (row numbers beyond the storage are the caller's duty: validate first);
//  2. validate(problem) -> status: ok iff every row the problem defines yields sorted, unique ids
//     in [0, row.visible_blocks) — the canonical form executors require. A failure names the
//     value and the row ("block id 97 >= kv blocks 96 in row 12").
// Whether a tile is full or partial comes from the row's geometry (row_info::is_full), not the index.
//
// Executors also check each id against the row as they go (strictly ascending, < visible_blocks),
// so an index that skipped validation can cost a status, never an out-of-bounds read.

#include <concepts>
#include <cstdint>

#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"

namespace skim {

template <class C>
concept block_cursor = std::copyable<C> && requires(C& c, const C& cc) {
  { cc.done() } -> std::convertible_to<bool>;
  { cc.id() } -> std::convertible_to<std::int32_t>;
  c.next();
};

template <class C>
concept skippable_cursor = block_cursor<C> && requires(C& c, std::int64_t n) { c.skip(n); };

template <class I>
concept block_index = std::copyable<I> && requires(const I& index, const row_info& r, const problem& p) {
  { index.cursor(r) } -> block_cursor;
  { index.validate(p) } -> std::same_as<status>;
};

namespace index {

// Cursor over the ids [first, last).
struct range_cursor {
  std::int32_t first = 0;
  std::int32_t last = 0;
  [[nodiscard]] constexpr bool done() const noexcept { return first >= last; }
  [[nodiscard]] constexpr std::int32_t id() const noexcept { return first; }
  constexpr void next() noexcept { ++first; }
  constexpr void skip(std::int64_t n) noexcept {
    first = n < static_cast<std::int64_t>(last) - first ? first + static_cast<std::int32_t>(n) : last;
  }
};
static_assert(skippable_cursor<range_cursor>);

}  // namespace index
}  // namespace skim
