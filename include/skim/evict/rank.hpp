#pragma once
// skim::evict::rank — keep the protected blocks and the best-scored rest of one (sequence, kv head),
// evict the others. Shared by every evictor (concepts/evictor.hpp).
//
//   keep set = sink ids ∪ newest ids (those resident) ∪ the best (keep − protected) other resident
//              ids by (score descending, id ascending; NaN = -inf)
// If more blocks are protected than `keep`, all protected blocks stay (protection wins). keep_ids
// and evict_ids come out sorted ascending; together they are exactly the resident ids.
//
// No allocation: workspace_bytes(max_blocks) bytes (scores and a candidate list).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "skim/concepts/evictor.hpp"
#include "skim/core/status.hpp"
#include "skim/core/workspace.hpp"
#include "skim/select/rank.hpp"

namespace skim::evict {

struct decision {
  std::span<std::int32_t> keep_ids{};   // [>= resident count]: out, sorted
  std::span<std::int32_t> evict_ids{};  // [>= resident count]: out, sorted
  std::int32_t keep_count = 0;
  std::int32_t evict_count = 0;
};

[[nodiscard]] inline std::size_t workspace_bytes(std::int32_t max_blocks) noexcept {
  workspace_arena m;
  (void)m.take<float>(static_cast<std::size_t>(std::max(max_blocks, 0)));
  (void)m.take<std::int32_t>(static_cast<std::size_t>(std::max(max_blocks, 0)));
  return m.bytes();
}

// Checks a request: sizes in range, resident sorted unique in [0, blocks).
[[nodiscard]] inline status check_request(const request& r) noexcept {
  if (r.blocks < 0) return status::error(status_code::invalid_argument, "evict blocks %d < 0", r.blocks);
  if (r.keep < 0) return status::error(status_code::invalid_argument, "evict keep %d < 0", r.keep);
  if (r.sink < 0) return status::error(status_code::invalid_argument, "evict sink %d < 0", r.sink);
  if (r.newest < 0) return status::error(status_code::invalid_argument, "evict newest %d < 0", r.newest);
  std::int32_t prev = -1;
  for (std::size_t i = 0; i < r.resident.size(); ++i) {
    const std::int32_t id = r.resident[i];
    if (id <= prev || id >= r.blocks) {
      return status::error(status_code::invalid_index,
                           "resident[%zu] = %d is not in (%d, %d): resident ids must ascend inside [0, blocks)", i, id,
                           prev, r.blocks);
    }
    prev = id;
  }
  return status::success();
}

[[nodiscard]] inline std::int32_t resident_count(const request& r) noexcept {
  return r.resident.empty() ? r.blocks : static_cast<std::int32_t>(r.resident.size());
}

template <evictor E>
[[nodiscard]] status rank(const E& e, const request& r, const evidence& ev, decision& out,
                          std::span<std::byte> workspace) noexcept {
  out.keep_count = out.evict_count = 0;
  SKIM_TRY(e.validate());
  SKIM_TRY(check_request(r));
  const std::int32_t n = resident_count(r);
  if (out.keep_ids.size() < static_cast<std::size_t>(n) || out.evict_ids.size() < static_cast<std::size_t>(n)) {
    return status::error(status_code::shape_mismatch, "evict decision holds %zu keep / %zu evict ids, needs %d each",
                         out.keep_ids.size(), out.evict_ids.size(), n);
  }
  SKIM_TRY(check_workspace(workspace, workspace_bytes(r.blocks)));
  workspace_arena arena(workspace);
  const std::span<float> scores = arena.take<float>(static_cast<std::size_t>(r.blocks));
  const std::span<std::int32_t> cand = arena.take<std::int32_t>(static_cast<std::size_t>(r.blocks));
  SKIM_TRY(e.score_blocks(r, ev, scores));

  const auto id_at = [&](std::int32_t i) { return r.resident.empty() ? i : r.resident[static_cast<std::size_t>(i)]; };
  const auto is_protected = [&](std::int32_t id) { return id < r.sink || id >= r.blocks - r.newest; };
  std::int32_t protected_n = 0, nc = 0;
  for (std::int32_t i = 0; i < n; ++i) {
    const std::int32_t id = id_at(i);
    if (is_protected(id)) ++protected_n;
    else cand[static_cast<std::size_t>(nc++)] = id;
  }
  const std::int32_t take = std::clamp(r.keep - protected_n, std::int32_t{0}, nc);
  // The best `take` candidates (ranking order of select/rank.hpp), ascending: cand holds the
  // resident ids in order, so keep_best keeps them in order.
  select::detail::keep_best(scores, cand.first(static_cast<std::size_t>(nc)), static_cast<std::size_t>(take));
  // Merge protected ids with the kept candidates (both ascending) into keep_ids.
  std::int32_t k = 0, c = 0;
  for (std::int32_t i = 0; i < n; ++i) {
    const std::int32_t id = id_at(i);
    if (!is_protected(id)) continue;
    while (c < take && cand[static_cast<std::size_t>(c)] < id) out.keep_ids[static_cast<std::size_t>(k++)] = cand[static_cast<std::size_t>(c++)];
    out.keep_ids[static_cast<std::size_t>(k++)] = id;
  }
  while (c < take) out.keep_ids[static_cast<std::size_t>(k++)] = cand[static_cast<std::size_t>(c++)];
  // The candidates not kept, ascending: the resident ids again, less the protected and the kept.
  std::int32_t evicted = 0;
  c = 0;
  for (std::int32_t i = 0; i < n; ++i) {
    const std::int32_t id = id_at(i);
    if (is_protected(id)) continue;
    if (c < take && cand[static_cast<std::size_t>(c)] == id) {
      ++c;
    } else {
      out.evict_ids[static_cast<std::size_t>(evicted++)] = id;
    }
  }
  SKIM_DASSERT(evicted == nc - take);
  out.keep_count = k;
  out.evict_count = evicted;
  return status::success();
}

}  // namespace skim::evict
