#pragma once
// dense_block_mask: one bit per (row, kv block), packed into 64-bit words; bit j of row r is
// words[r * words_per_row() + j / 64] >> (j % 64) & 1. Easy to check and to build, quadratic in
// space: use it for tests, short sequences, or as a conversion target.
//
// A non-owning, read-only view over caller memory. `cols` is the mask's column count, normally
// problem::max_kv_blocks() (for_problem); bits at ids >= cols (the last word's tail) must be
// clear. A set bit is always unique and the cursor yields bits in ascending order, so a mask has no
// unsorted or duplicate form: validate's order argument is accepted and ignored.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>

#include "skim/concepts/block_index.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"
#include "skim/index/order.hpp"

namespace skim::index {

inline constexpr std::int32_t bits_per_word = 64;

// Words per row of a mask with `cols` columns: ceil(cols / 64).
[[nodiscard]] constexpr std::int64_t mask_words_per_row(std::int32_t cols) noexcept {
  return cols <= 0 ? 0 : (static_cast<std::int64_t>(cols) + bits_per_word - 1) / bits_per_word;
}

// Words of a mask for problem p with problem::max_kv_blocks() columns (the size to_dense_mask needs).
[[nodiscard]] constexpr std::int64_t dense_mask_words(const problem& p) noexcept {
  return p.index_rows() * mask_words_per_row(p.max_kv_blocks());
}

// Walks the set bits of one row, lowest first, with std::countr_zero.
struct mask_cursor {
  const std::uint64_t* word = nullptr;  // current word
  const std::uint64_t* end = nullptr;   // one past the row's last word
  std::uint64_t bits = 0;               // unvisited set bits of *word
  std::int32_t base = 0;                // id of bit 0 of *word

  constexpr mask_cursor() noexcept = default;
  constexpr mask_cursor(const std::uint64_t* first, const std::uint64_t* last) noexcept : word(first), end(last) {
    if (word != end) {
      bits = *word;
      skip_empty();
    }
  }
  [[nodiscard]] constexpr bool done() const noexcept { return word == end; }
  [[nodiscard]] constexpr std::int32_t id() const noexcept { return base + std::countr_zero(bits); }
  constexpr void next() noexcept {
    bits &= bits - 1;  // clear the lowest set bit
    skip_empty();
  }

 private:
  // @post done() or bits != 0
  constexpr void skip_empty() noexcept {
    while (bits == 0) {
      if (++word == end) return;
      bits = *word;
      base += bits_per_word;
    }
  }
};
static_assert(block_cursor<mask_cursor>);

struct dense_block_mask {
  std::span<const std::uint64_t> words;  // [rows, words_per_row()], row-major
  std::int32_t cols = 0;                 // columns (kv blocks) per row; bits >= cols are clear

  // A mask view with problem::max_kv_blocks() columns.
  [[nodiscard]] static constexpr dense_block_mask for_problem(const problem& p,
                                                              std::span<const std::uint64_t> words) noexcept {
    return {words, p.max_kv_blocks()};
  }

  [[nodiscard]] constexpr std::int64_t words_per_row() const noexcept { return mask_words_per_row(cols); }

  // Set bits of row r.row. Reads only inside words: an out-of-range row gives an empty cursor,
  // a row cut short by the end of words is scanned up to there.
  [[nodiscard]] constexpr mask_cursor cursor(const row_info& r) const noexcept {
    const std::int64_t wpr = words_per_row();
    const auto size = static_cast<std::int64_t>(words.size());
    if (r.row < 0 || wpr == 0 || r.row > size / wpr) return {};  // also keeps r.row * wpr from overflowing
    const std::int64_t begin = r.row * wpr;
    if (begin >= size) return {};
    const std::int64_t end = begin + wpr < size ? begin + wpr : size;
    return {words.data() + begin, words.data() + end};
  }

  // @post ok iff cols >= 0, words has index_rows() * words_per_row() entries, and every set bit
  // of a row is at an id in [0, visible_blocks) (and so < cols).
  [[nodiscard]] status validate(const problem& p, order = order::canonical) const noexcept {
    SKIM_TRY(skim::validate(p));
    if (cols < 0) return status::error(status_code::invalid_argument, "dense_block_mask cols %d < 0", cols);
    const std::int64_t rows = p.index_rows();
    const std::int64_t wpr = words_per_row();
    if (words.size() != static_cast<std::size_t>(rows * wpr)) {
      return status::error(status_code::shape_mismatch,
                           "dense_block_mask words has %zu entries, needs rows %lld x words per row %lld",
                           words.size(), static_cast<long long>(rows), static_cast<long long>(wpr));
    }
    return for_each_row(p, [&](const row_info& r) noexcept -> status {
      for (mask_cursor c = cursor(r); !c.done(); c.next()) {
        // The sequence's own range first: it names the more useful bound.
        if (c.id() >= r.visible_blocks) return detail::check_id_range(r, c.id(), -1);
        if (c.id() >= cols) {
          return status::error(status_code::invalid_index, "bit %d set beyond the %d mask columns in row %lld",
                               c.id(), cols, static_cast<long long>(r.row));
        }
      }
      return status::success();
    });
  }
};
static_assert(block_index<dense_block_mask>);

}  // namespace skim::index
