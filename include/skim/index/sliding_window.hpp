#pragma once
// sliding_window: the newest `blocks` key blocks the row can see (its local window), at block
// granularity. Under causality the newest visible block is the one holding the row's diagonal.

#include "skim/concepts/block_index.hpp"

namespace skim::index {

struct sliding_window {
  std::int32_t blocks = 1;

  [[nodiscard]] constexpr range_cursor cursor(const row_info& r) const noexcept {
    const std::int32_t n = blocks < 0 ? 0 : blocks;
    const std::int32_t first = r.visible_blocks - n;
    return {first > 0 ? first : 0, r.visible_blocks};
  }
  [[nodiscard]] status validate(const problem&) const noexcept {
    if (blocks < 0) return status::error(status_code::invalid_argument, "sliding_window blocks %d < 0", blocks);
    return status::success();
  }
};
static_assert(block_index<sliding_window>);

}  // namespace skim::index
