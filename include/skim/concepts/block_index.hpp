#pragma once
// The index concept: which key blocks each index row reads.
//
// A block_cursor walks one row's logical block ids:
//  1. done() is true once the row is exhausted;
//  2. id() is the current block id, valid while !done();
//  3. next() advances; ids come strictly ascending (sorted, unique) for a valid index.
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
};
static_assert(block_cursor<range_cursor>);

}  // namespace index
}  // namespace skim
