#pragma once
// Helpers shared by the selectors (skim::select::detail): the ranking order, the input checks of
// row_scores, candidate lists and sorted merges. Not a policy; include a selector instead.
//
// The ranking order is (key descending, id ascending) with key = score, NaN read as -inf. It is a
// strict total order on distinct ids (two equal keys, -0 and +0 included, fall back to the id), so
// "the k best" is one well-defined set whatever algorithm finds it and in whatever order it visits
// the blocks; selectors return it sorted by id.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>

#include "skim/concepts/selector.hpp"
#include "skim/config.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"
#include "skim/core/workspace.hpp"

namespace skim::select::detail {

inline constexpr float neg_inf = -std::numeric_limits<float>::infinity();
inline constexpr float pos_inf = std::numeric_limits<float>::infinity();

// A score as the ranking reads it: NaN is -inf (documented in concepts/selector.hpp).
[[nodiscard]] inline float key(float score) noexcept { return std::isnan(score) ? neg_inf : score; }

// Strict weak (in fact total) order "a ranks before b" over block ids by their keys.
struct ranks_before {
  const float* keys;  // [> every id compared]
  [[nodiscard]] bool operator()(std::int32_t a, std::int32_t b) const noexcept {
    const float ka = key(keys[a]);
    const float kb = key(keys[b]);
    return ka > kb || (ka == kb && a < b);
  }
};

// Checks the spans of one row's input against its geometry.
[[nodiscard]] inline status check_row_input(const row_scores& in) noexcept {
  const auto row = static_cast<long long>(in.row.row);
  const std::int32_t v = in.row.visible_blocks;
  if (v < 0) return status::error(status_code::invalid_argument, "visible blocks %d < 0 in row %lld", v, row);
  if (in.scores.size() < static_cast<std::size_t>(v)) {
    return status::error(status_code::shape_mismatch, "scores has %zu entries < visible blocks %d in row %lld",
                         in.scores.size(), v, row);
  }
  if (!in.prior.empty() && in.prior.size() < static_cast<std::size_t>(v)) {
    return status::error(status_code::shape_mismatch, "prior has %zu entries < visible blocks %d in row %lld",
                         in.prior.size(), v, row);
  }
  if (in.budget_used < 0) {
    return status::error(status_code::invalid_argument, "budget_used %d < 0 in row %lld", in.budget_used, row);
  }
  for (std::size_t i = 0; i < in.exclude.size(); ++i) {
    const std::int32_t id = in.exclude[i];
    if (id < 0 || id >= v) {
      return status::error(status_code::invalid_argument, "exclude id %d outside [0, %d) in row %lld (position %zu)",
                           id, v, row, i);
    }
    if (i > 0 && id <= in.exclude[i - 1]) {
      return status::error(status_code::invalid_argument,
                           "exclude ids not strictly ascending in row %lld: %d at position %zu after %d", row, id, i,
                           in.exclude[i - 1]);
    }
  }
  return status::success();
}

// Writes the ids of [0, visible) not in `exclude` (sorted) to out, ascending; returns how many.
// @pre out.size() >= visible - exclude.size(); exclude sorted unique in [0, visible).
[[nodiscard]] inline std::int32_t gather_candidates(std::int32_t visible, std::span<const std::int32_t> exclude,
                                                    std::span<std::int32_t> out) noexcept {
  std::int32_t n = 0;
  std::size_t e = 0;
  for (std::int32_t id = 0; id < visible; ++id) {
    if (e < exclude.size() && exclude[e] == id) {
      ++e;
      continue;
    }
    out[static_cast<std::size_t>(n++)] = id;
  }
  return n;
}

// A key as an unsigned integer in the ranking's order: key(a) > key(b) iff ordered_key(a) >
// ordered_key(b), with NaN read as -inf and -0 as +0 (equal keys, decided by the id). The sign
// bit flipped for positive floats and every bit for negative ones, branch-free.
[[nodiscard]] inline std::uint32_t ordered_key(float score) noexcept {
  std::uint32_t bits = std::bit_cast<std::uint32_t>(score);
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  bits = magnitude > 0x7f800000u ? 0xff800000u : bits;  // NaN: -inf
  bits = magnitude == 0 ? 0u : bits;                     // -0: +0
  return bits ^ (static_cast<std::uint32_t>(static_cast<std::int32_t>(bits) >> 31) | 0x80000000u);
}

// Writes the k best of ids (by ranks_before over keys) to ids[0, k), in their input order: sorted by
// id when ids ascend, as every caller's candidate list does. ids[k, n) is left unspecified.
// @pre 0 <= k <= ids.size(); ids unique, each < keys.size().
// How: a radix selection finds the k-th best key without reordering ids. A first pass finds the
// leading bits every ordered_key shares. Each further pass takes the next 8 bits and counts, among
// the keys that still equal the k-th best on the bits before, how many fall in each of the 256
// values; the k-th best lies in the value where the count from the top reaches what is still needed.
// Once that value's keys are all needed, or every bit is known, one pass keeps every key above the
// k-th best's prefix and, of those equal to it, the first ones in id order: ties go to the lower id.
// O(n) a pass, no branch on the data; the counts (four interleaved copies, so that runs of equal
// digits do not wait on each other) are 4 KB of stack. nth_element and a sort of the kept ids took
// 1.5-1.8x as long in a decode step's selection over 8192 blocks a row.
inline void keep_best(std::span<const float> keys, std::span<std::int32_t> ids, std::size_t k) noexcept {
  const std::size_t n = ids.size();
  if (k == 0 || k >= n) return;
  const auto ordered = [&](std::size_t i) noexcept { return ordered_key(keys[static_cast<std::size_t>(ids[i])]); };
  std::uint32_t all_and = ~0u, all_or = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t u = ordered(i);
    all_and &= u;
    all_or |= u;
  }
  int low = 32 - std::countl_zero(all_and ^ all_or);  // bits [low, 32) are the same in every key
  std::uint32_t known = low == 32 ? 0u : ~0u << low;   // the k-th best key's bits found so far...
  std::uint32_t prefix = all_and & known;              // ...are these
  std::size_t needed = k;  // keys still to take among those equal to prefix under known
  constexpr int digit_bits = 8;
  std::uint32_t counts[4][1u << digit_bits];
  while (low > 0) {
    const int shift = low > digit_bits ? low - digit_bits : 0;
    const std::uint32_t digits = 1u << (low - shift);
    std::memset(counts, 0, sizeof counts);
    const auto count = [&](std::size_t i, int copy) noexcept {
      const std::uint32_t u = ordered(i);
      counts[copy][(u >> shift) & (digits - 1)] += (u & known) == prefix ? 1u : 0u;
    };
    std::size_t i = 0;
    for (; i + 4 <= n; i += 4) {
      for (int c = 0; c < 4; ++c) count(i + static_cast<std::size_t>(c), c);
    }
    for (; i < n; ++i) count(i, 0);
    std::uint32_t digit = digits;
    std::size_t above = 0;  // keys ahead of the k-th best
    std::size_t here = 0;
    for (;;) {
      --digit;
      here = std::size_t{counts[0][digit]} + counts[1][digit] + counts[2][digit] + counts[3][digit];
      if (above + here >= needed) break;
      above += here;
    }
    needed -= above;
    prefix |= digit << shift;
    known |= (digits - 1) << shift;
    low = here == needed ? 0 : shift;  // every key of this value taken: nothing left to tell apart
  }
  // Keep the keys above prefix (under known) and the first `needed` equal to it, in input order.
  std::size_t kept = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::int32_t id = ids[i];
    const std::uint32_t u = ordered_key(keys[static_cast<std::size_t>(id)]) & known;
    const bool tie = u == prefix && needed > 0;
    needed -= tie ? 1 : 0;
    ids[kept] = id;
    kept += (u > prefix || tie) ? 1 : 0;
  }
  SKIM_DASSERT(kept == k);
}

// The status select_row returns when out cannot hold the `needed` ids of its row (concept req. 5).
[[nodiscard]] inline status out_too_small(const row_info& r, std::int32_t needed, std::size_t room) noexcept {
  return status::error(status_code::shape_mismatch, "row %lld selects %d blocks, out has room for %zu",
                       static_cast<long long>(r.row), needed, room);
}

// The workspace of a selector that ranks one candidate list: one int32 per visible block.
[[nodiscard]] inline std::span<std::int32_t> carve_candidates(workspace_arena& arena, std::int32_t blocks) noexcept {
  return arena.take<std::int32_t>(static_cast<std::size_t>(std::max(blocks, std::int32_t{0})));
}
[[nodiscard]] inline std::size_t candidate_list_bytes(std::int32_t max_blocks) noexcept {
  workspace_arena measure;
  (void)carve_candidates(measure, max_blocks);
  return measure.bytes();
}

// select_row of a selector that keeps the k best of its row's candidates (top_k, threshold): checks
// sel's parameters, the row's input and the workspace (candidate_list_bytes), lists the candidates
// (visible, not excluded, ascending), takes k = keep(candidates) clamped to [0, candidates], and
// writes the k best to out[0, k), ascending, with count = k. When out is shorter: out_too_small,
// with count = k (the room needed). keep may reorder the candidates but must leave them ascending.
template <class Selector, class Keep>
[[nodiscard]] status select_best(const Selector& sel, const row_scores& in, std::span<std::int32_t> out,
                                 std::int32_t& count, std::span<std::byte> workspace, Keep keep) noexcept {
  count = 0;
  SKIM_TRY(sel.validate());
  SKIM_TRY(check_row_input(in));
  const std::int32_t v = in.row.visible_blocks;
  SKIM_TRY(check_workspace(workspace, candidate_list_bytes(v)));
  workspace_arena arena(workspace);
  const std::span<std::int32_t> all = carve_candidates(arena, v);
  const std::span<std::int32_t> candidates = all.first(static_cast<std::size_t>(gather_candidates(v, in.exclude, all)));
  const std::int32_t k = std::clamp(keep(candidates), std::int32_t{0}, static_cast<std::int32_t>(candidates.size()));
  count = k;
  if (static_cast<std::size_t>(k) > out.size()) return out_too_small(in.row, k, out.size());
  keep_best(in.scores, candidates, static_cast<std::size_t>(k));
  std::copy_n(candidates.begin(), k, out.begin());
  return status::success();
}

// Merges the disjoint ascending ids a[0, na) and b into a[0, na + b.size()), from the back.
// @pre a.size() >= na + b.size().
inline void merge_into(std::span<std::int32_t> a, std::size_t na, std::span<const std::int32_t> b) noexcept {
  std::size_t i = na, j = b.size(), o = na + b.size();
  while (j > 0) {
    if (i > 0 && a[i - 1] > b[j - 1]) {
      a[--o] = a[--i];
    } else {
      a[--o] = b[--j];
    }
  }
}

}  // namespace skim::select::detail
