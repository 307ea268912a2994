#pragma once
// sink: the first `blocks` key blocks of the sequence (attention sinks), clipped to what the row sees.

#include "skim/concepts/block_index.hpp"

namespace skim::index {

struct sink {
  std::int32_t blocks = 1;

  [[nodiscard]] constexpr range_cursor cursor(const row_info& r) const noexcept {
    const std::int32_t n = blocks < 0 ? 0 : blocks;
    return {0, n < r.visible_blocks ? n : r.visible_blocks};
  }
  [[nodiscard]] status validate(const problem&) const noexcept {
    if (blocks < 0) return status::error(status_code::invalid_argument, "sink blocks %d < 0", blocks);
    return status::success();
  }
};
static_assert(block_index<sink>);

}  // namespace skim::index
