#pragma once
// skim_llama::budgeted — the engine's dynamic selector: a per-row budget of a share of the row's
// visible blocks, filled by one of three rules. Used inside skim::select::reserved<>, so the sink and
// newest blocks are reserved first and the budget counts them:
//   total(row) = k >= 0 ? reserved + k : ceil(share × visible_blocks)   (at least the reserved ones)
//   rule::score   the best blocks by the router's scores (skim's top_k order: score desc, id asc)
//   rule::newest  the newest blocks not reserved (with sink reserved: the recency-only baseline,
//                 sink + a window of newest blocks)
//   rule::random  blocks drawn uniformly without replacement, seeded by (seed, row geometry): the
//                 random baseline; deterministic for a given run
// A budget of a share of each row's own visible blocks makes "25% budget" mean 25% of the causal
// keys for every query, prefill and decode alike (skim-eval's budget instead fixes k from the
// longest row).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include "skim/concepts/selector.hpp"
#include "skim/core/status.hpp"
#include "skim/core/workspace.hpp"
#include "skim/select/rank.hpp"

namespace skim_llama {

struct budgeted {
  enum class rule : std::uint8_t { score, newest, random };
  // 1e-9 of the row: a decimal share is not exact in binary (0.25 × 32 must give 8, not 9).
  static constexpr double share_slack = 1e-9;

  rule how = rule::score;
  double share = 1.0;       // (0, 1], used when k < 0
  std::int32_t k = -1;      // >= 0: a fixed number of blocks beyond the reserved ones
  std::uint64_t seed = 1;   // rule::random

  [[nodiscard]] skim::status validate() const noexcept {
    if (k < 0 && !(share > 0.0 && share <= 1.0)) {
      return skim::status::error(skim::status_code::invalid_argument, "budgeted share %g outside (0, 1]", share);
    }
    return skim::status::success();
  }
  [[nodiscard]] std::int32_t total(std::int32_t visible, std::int32_t reserved) const noexcept {
    if (k >= 0) return reserved + k;
    const double v = visible;
    return static_cast<std::int32_t>(std::ceil(share * v - share_slack * v));
  }
  [[nodiscard]] std::int32_t max_count(std::int32_t visible) const noexcept {
    const std::int32_t v = std::max(visible, std::int32_t{0});
    return std::clamp(k >= 0 ? k : total(v, 0), std::int32_t{0}, v);
  }
  [[nodiscard]] std::size_t workspace_bytes(std::int32_t max_blocks) const noexcept {
    skim::workspace_arena m;
    (void)m.take<std::int32_t>(static_cast<std::size_t>(std::max(max_blocks, std::int32_t{0})));
    return m.bytes();
  }

  [[nodiscard]] skim::status select_row(const skim::row_scores& in, std::span<std::int32_t> out, std::int32_t& count,
                                        std::span<std::byte> workspace) const noexcept {
    count = 0;
    SKIM_TRY(validate());
    SKIM_TRY(skim::select::detail::check_row_input(in));
    const std::int32_t v = in.row.visible_blocks;
    SKIM_TRY(skim::check_workspace(workspace, workspace_bytes(v)));
    skim::workspace_arena arena(workspace);
    const std::span<std::int32_t> cand = arena.take<std::int32_t>(static_cast<std::size_t>(v));
    const std::int32_t n = skim::select::detail::gather_candidates(v, in.exclude, cand);
    const auto reserved = static_cast<std::int32_t>(in.exclude.size());
    // in.exclude holds every block chosen before (reserved<>'s sink, local, recency and importance
    // blocks); in.budget_used counts those of them that came out of this selector's budget. A share
    // caps the row's whole selection, so only the excluded count comes off it; k counts beyond the
    // reserved branches, so the budget already used comes off it.
    const std::int32_t take =
        std::clamp(k >= 0 ? k - in.budget_used : total(v, reserved) - reserved, std::int32_t{0}, n);
    if (static_cast<std::size_t>(take) > out.size()) {
      count = take;
      return skim::select::detail::out_too_small(in.row, take, out.size());
    }
    switch (how) {
      case rule::score:
        skim::select::detail::keep_best(in.scores, cand.first(static_cast<std::size_t>(n)), static_cast<std::size_t>(take));
        std::copy_n(cand.begin(), take, out.begin());
        break;
      case rule::newest:  // candidates ascend: the last `take`
        std::copy_n(cand.begin() + (n - take), take, out.begin());
        break;
      case rule::random: {
        std::uint64_t x = seed ^ (static_cast<std::uint64_t>(in.row.q_begin) << 20) ^
                          (static_cast<std::uint64_t>(in.row.kv_len) << 40) ^ static_cast<std::uint64_t>(in.row.head);
        for (std::int32_t i = 0; i < take; ++i) {  // partial Fisher-Yates with splitmix64
          x += 0x9e3779b97f4a7c15ULL;
          std::uint64_t z = x;
          z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
          z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
          z ^= z >> 31;
          const auto j = i + static_cast<std::int32_t>(z % static_cast<std::uint64_t>(n - i));
          std::swap(cand[static_cast<std::size_t>(i)], cand[static_cast<std::size_t>(j)]);
        }
        std::sort(cand.begin(), cand.begin() + take);
        std::copy_n(cand.begin(), take, out.begin());
        break;
      }
    }
    count = take;
    return skim::status::success();
  }
};
static_assert(skim::selector<budgeted>);

}  // namespace skim_llama
