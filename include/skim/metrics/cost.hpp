#pragma once
// skim::metrics cost — what an index makes an executor read and compute, per index row.
//
// An index row (sequence, query block, index head) names tiles: key blocks of up to block_kv keys.
// An executor loads each named tile once for the whole query block and computes every
// (query, key) pair of it, masking the invisible ones; only the visible pairs matter. So per row:
//  - tiles        = ids in the row (unique, by the index contract);
//  - keys_read    = Σ over the tiles of their keys (block_kv, or fewer for the ragged tail): the
//                   physical K/V traffic of the row, per kv head;
//  - pairs_read   = keys_read × query tokens of the block: the (query, key) pairs a tile-wise
//                   executor computes (physical compute);
//  - pairs_needed = Σ over the block's queries of the keys of the tiles that query may see (causal,
//                   sequence length): the logical work. pairs_needed / pairs_read is tile
//                   utilisation, 1 for decode or full tiles, lower where tiles straddle the
//                   causal diagonal or the block is mostly masked.
// Under index_scope::kv_head one index row serves the group's heads_q / heads_kv query heads: the
// K/V of a tile is read once for the group, so costs are counted per index row, not per query head.
//
// Allocates (the per-row tile counts for the tail): an evaluation tool, not a hot path.

#include <cstdint>
#include <limits>
#include <vector>

#include "skim/concepts/block_index.hpp"
#include "skim/core/attention_args.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"
#include "skim/metrics/tail.hpp"

namespace skim::metrics {

// Cost of one index row.
struct row_cost {
  std::int64_t tiles = 0;
  std::int64_t keys_read = 0;
  std::int64_t pairs_read = 0;
  std::int64_t pairs_needed = 0;
};

// Totals over index rows, and the per-row tile counts they came from (for the tail).
struct cost_totals {
  std::int64_t index_rows = 0;
  std::int64_t tiles = 0;
  std::int64_t keys_read = 0;
  std::int64_t pairs_read = 0;
  std::int64_t pairs_needed = 0;
  std::vector<double> tiles_per_row;  // [index_rows], in row order (calls appended in order)

  void add(const row_cost& c) {
    ++index_rows;
    tiles += c.tiles;
    keys_read += c.keys_read;
    pairs_read += c.pairs_read;
    pairs_needed += c.pairs_needed;
    tiles_per_row.push_back(static_cast<double>(c.tiles));
  }
  void add(const cost_totals& o) {
    index_rows += o.index_rows;
    tiles += o.tiles;
    keys_read += o.keys_read;
    pairs_read += o.pairs_read;
    pairs_needed += o.pairs_needed;
    tiles_per_row.insert(tiles_per_row.end(), o.tiles_per_row.begin(), o.tiles_per_row.end());
  }
};

struct cost_summary {
  std::int64_t index_rows = 0;
  std::int64_t tiles = 0;         // Σ tiles over index rows
  std::int64_t keys_read = 0;     // Σ keys of those tiles (physical K/V traffic, per kv head)
  std::int64_t pairs_read = 0;    // Σ keys_read × query tokens of the row's block (physical compute)
  std::int64_t pairs_needed = 0;  // Σ visible (query, key) pairs of the selected tiles (logical work)
  tail_summary tiles_per_row;     // high_is_bad: mean, p1 = 99th percentile, p5 = 95th, worst = max
  // pairs_needed / pairs_read, in (0, 1]; NaN when nothing was read.
  [[nodiscard]] double utilisation() const noexcept {
    return pairs_read > 0 ? static_cast<double>(pairs_needed) / static_cast<double>(pairs_read)
                          : std::numeric_limits<double>::quiet_NaN();
  }
};

[[nodiscard]] inline cost_summary summarize(const cost_totals& t) {
  return {.index_rows = t.index_rows, .tiles = t.tiles, .keys_read = t.keys_read, .pairs_read = t.pairs_read,
          .pairs_needed = t.pairs_needed,
          .tiles_per_row = summarize_tail(t.tiles_per_row, tail_side::high_is_bad)};
}

// Cost of one index row. Checks each id as executors do (check_block_id), so an index that lies in
// validate() costs a status, never a wrong count.
template <block_index Index>
[[nodiscard]] status measure_row_cost(const problem& p, const row_info& row, const Index& index,
                                      row_cost& out) noexcept {
  out = {};
  const std::int32_t queries = row.q_end - row.q_begin;
  return for_each_block_id(index, row, [&](std::int32_t id) noexcept {
    const std::int32_t first = id * p.block_kv;  // < kv_len: id < visible_blocks <= kv_blocks
    const std::int32_t last = first + p.block_kv < row.kv_len ? first + p.block_kv : row.kv_len;
    ++out.tiles;
    out.keys_read += last - first;
    out.pairs_read += static_cast<std::int64_t>(last - first) * queries;
    for (std::int32_t qi = row.q_begin; qi < row.q_end; ++qi) {
      const std::int32_t visible = row.visible_keys(qi, p.mask);
      const std::int32_t end = visible < last ? visible : last;
      if (end > first) out.pairs_needed += end - first;
    }
  });
}

// Cost of every index row of the problem, added to `totals` only if the whole walk succeeds.
template <block_index Index>
[[nodiscard]] status measure_cost(const problem& p, const Index& index, cost_totals& totals) {
  SKIM_TRY(validate(p));
  SKIM_TRY(index.validate(p));
  cost_totals call;
  SKIM_TRY(for_each_row(p, [&](const row_info& row) -> status {
    row_cost c;
    SKIM_TRY(measure_row_cost(p, row, index, c));
    call.add(c);
    return status::success();
  }));
  totals.add(call);
  return status::success();
}

}  // namespace skim::metrics
