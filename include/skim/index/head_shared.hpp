#pragma once
// head_shared<Index>: one selection per query block, read by every index head of the block.
//
// The wrapped index has the rows of the problem with a single index head: row q_block_offset(b) + i
// for query block i of sequence b (shared_problem(p) is that problem, for building and validating
// it). Row (q_block_offset(b) + i) · index_heads + h of the problem reads that row, for every h.
//
// Why: a selection per kv head reads, from a token-major [tokens, heads_kv, head_dim] cache, one
// head's part of each token row, and the lines the hardware fetches beside it belong to the other
// heads. A shared selection is head-invariant (head_invariant.hpp), so exec::simd<Arch> runs a decode
// query block's kv heads in one work item and reads the token rows whole, as dense decode does
// (docs/performance.md, density crossover). The price is in quality: every head attends over the
// same blocks, so route each query block once on its heads' pooled scores (sparse_attention's
// share_heads pools them by their maximum, by default after each head's scores are taken relative to
// its own best block: head_pool::relative).

#include <cstdint>

#include "skim/concepts/block_index.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"

namespace skim::index {

template <block_index Index>
struct head_shared {
  Index rows;                    // one row per query block: the rows of shared_problem(p)
  std::int32_t index_heads = 1;  // p.index_heads(): problem rows per query block

  // The problem `rows` is laid out for: p with one kv head that every query head of a group reads
  // (the same sequences, blocks and masks; index_rows() = total_q_blocks()).
  [[nodiscard]] static constexpr problem shared_problem(const problem& p) noexcept {
    problem one = p;
    one.heads_q = p.heads_kv > 0 ? p.heads_q / p.heads_kv : p.heads_q;
    one.heads_kv = 1;
    one.scope = index_scope::kv_head;
    return one;
  }

  // Row r.row of the problem reads row r.row / index_heads of `rows` (its query block's).
  [[nodiscard]] constexpr auto cursor(const row_info& r) const noexcept {
    row_info block = r;
    block.row = index_heads > 0 ? r.row / index_heads : -1;  // -1: no row (an empty cursor)
    block.head = 0;
    return rows.cursor(block);
  }

  // @post ok iff index_heads == p.index_heads() and rows is valid for shared_problem(p).
  [[nodiscard]] status validate(const problem& p) const noexcept {
    SKIM_TRY(skim::validate(p));
    if (index_heads != p.index_heads()) {
      return status::error(status_code::shape_mismatch, "head_shared: index_heads %d, the problem has %d index heads",
                           index_heads, p.index_heads());
    }
    return rows.validate(shared_problem(p));
  }
};

}  // namespace skim::index
