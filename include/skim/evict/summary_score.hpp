#pragma once
// evict::summary_score<S> — rank blocks by what a router would say about them now: a block's score
// is the best S::score of its summary record over the recent queries of its kv head's group
// (evidence.queries [n, head_dim], unscaled), i.e. "would any recent query look here?". Cheap
// (blocks × n × record cost, no pass over the keys) and needs no attention statistics, so it also
// serves engines whose executor does not report probabilities. A block no recent query favours is
// evicted first; with no query at all every score is -inf and ties keep the lower ids.
//
// evidence: records [>= blocks, heads_kv, record_floats] (summarize/build.hpp's layout for one
// sequence), heads_kv, head (this request's kv head), head_dim, queries.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

#include "skim/concepts/evictor.hpp"
#include "skim/concepts/summarizer.hpp"
#include "skim/core/status.hpp"

namespace skim::evict {

template <summarizer S>
struct summary_score {
  [[nodiscard]] status validate() const noexcept { return status::success(); }

  [[nodiscard]] status score_blocks(const request& r, const evidence& ev, std::span<float> scores) const noexcept {
    if (ev.head_dim <= 0 || ev.heads_kv <= 0 || ev.head < 0 || ev.head >= ev.heads_kv) {
      return status::error(status_code::invalid_argument, "summary_score evidence: head %d of heads_kv %d, head_dim %d",
                           ev.head, ev.heads_kv, ev.head_dim);
    }
    const std::int64_t rf = S::record_floats(ev.head_dim);
    const std::int64_t need = static_cast<std::int64_t>(r.blocks) * ev.heads_kv * rf;
    if (static_cast<std::int64_t>(ev.records.size()) < need) {
      return status::error(status_code::shape_mismatch, "summary_score records hold %zu floats, need %lld for %d blocks",
                           ev.records.size(), static_cast<long long>(need), r.blocks);
    }
    if (ev.queries.size() % static_cast<std::size_t>(ev.head_dim) != 0) {
      return status::error(status_code::shape_mismatch, "summary_score queries hold %zu floats, not a multiple of head_dim %d",
                           ev.queries.size(), ev.head_dim);
    }
    if (scores.size() < static_cast<std::size_t>(r.blocks)) {
      return status::error(status_code::shape_mismatch, "summary_score scores hold %zu, need %d", scores.size(), r.blocks);
    }
    const std::size_t nq = ev.queries.size() / static_cast<std::size_t>(ev.head_dim);
    const auto score_one = [&](std::int32_t id) noexcept {
      const float* rec = ev.records.data() + (static_cast<std::int64_t>(id) * ev.heads_kv + ev.head) * rf;
      float best = -std::numeric_limits<float>::infinity();
      for (std::size_t i = 0; i < nq; ++i) best = std::max(best, S::score(rec, ev.queries.data() + i * static_cast<std::size_t>(ev.head_dim), ev.head_dim));
      scores[static_cast<std::size_t>(id)] = best;
    };
    if (r.resident.empty()) {
      for (std::int32_t id = 0; id < r.blocks; ++id) score_one(id);
    } else {
      for (const std::int32_t id : r.resident) {
        if (id >= 0 && id < r.blocks) score_one(id);
      }
    }
    return status::success();
  }
};

}  // namespace skim::evict
