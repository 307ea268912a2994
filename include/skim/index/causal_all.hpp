#pragma once
// causal_all: every block a row can see — dense attention expressed as an index.
// Under mask_kind::none that is every block of the sequence.

#include "skim/concepts/block_index.hpp"

namespace skim::index {

struct causal_all {
  [[nodiscard]] constexpr range_cursor cursor(const row_info& r) const noexcept { return {0, r.visible_blocks}; }
  [[nodiscard]] status validate(const problem&) const noexcept { return status::success(); }
};
static_assert(block_index<causal_all>);

}  // namespace skim::index
