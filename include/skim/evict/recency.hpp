#pragma once
// evict::recency — keep the newest blocks (StreamingLLM's window when combined with the sink):
// a block's score is its id. Reads no evidence.

#include <cstdint>
#include <span>

#include "skim/concepts/evictor.hpp"
#include "skim/core/status.hpp"

namespace skim::evict {

struct recency {
  [[nodiscard]] status validate() const noexcept { return status::success(); }
  [[nodiscard]] status score_blocks(const request& r, const evidence&, std::span<float> scores) const noexcept {
    if (scores.size() < static_cast<std::size_t>(r.blocks)) {
      return status::error(status_code::shape_mismatch, "recency scores hold %zu, need %d blocks", scores.size(), r.blocks);
    }
    for (std::int32_t id = 0; id < r.blocks; ++id) scores[static_cast<std::size_t>(id)] = static_cast<float>(id);
    return status::success();
  }
};
static_assert(evictor<recency>);

}  // namespace skim::evict
