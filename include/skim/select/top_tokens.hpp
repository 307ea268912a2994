#pragma once
// top_tokens: a token-level indexer. It scores every visible key token of an index row against the
// row's query and keeps the best t, plus a sink and a local window, as an index::token_list
// (docs/design.md §1: stages 2 to 4 for tokens instead of blocks).
//
// For index row r (sequence b, query block i, index head h) with V = index::row_visible_keys(r)
// visible keys:
//
//   score[j] = max_{query heads g of the row} q_g · k_j      j in [0, V)
//
//  - q_g is the row's *last* query (a decode row's only query; in a longer block the query that
//    sees every visible key of the row) for query head g, converted to fp32; the query heads of a
//    kv-head row (index_scope::kv_head, the default) are its GQA group, those of a query-head row
//    the one query head. The heads reduce by max, in head order, as route::pooled_router's
//    group_reduce::max does; a head whose dot product is NaN counts as -inf.
//  - k_j is key token j of the row's kv head, converted to fp32 from the stored element type
//    (float, half, bfloat16); the dot product is fp32, products added in dimension order
//    d = 0, 1, ..., head_dim - 1. The score is unscaled: the softmax scale orders keys the same way
//    for any positive scale, and rounding after a multiplication could only add ties.
//  - The row keeps the tokens [0, sink) and [V - window, V) (clipped to [0, V); where they
//    overlap, a token is kept once), and the best t of the remaining tokens by (score descending,
//    position ascending), NaN read as -inf — a strict total order, so the kept set does not depend
//    on the selection algorithm. t >= V - reserved keeps every visible token (dense); V = 0 keeps none.
//  - The row's positions are written ascending to its token_list slots [0, count), `pad` after them.
//
// Cost per row: V key rows of head_dim elements read once (for every query head of the row), in
// tiles of 16 keys converted to fp32 and transposed so that the dot products vectorise over keys;
// V · heads · head_dim fp32 multiply-adds, then O(V) to keep the best t positions (rank.hpp's
// keep_best, a few passes). Over a decode step that is all of K read once per kv head — the K half
// of dense decode attention's traffic, before the selected rows are read again by the executor.
// That is the indexer's cost, and why engines score a low-precision (or narrower) copy of K: the
// q and K given here may be any copy with the problem's shape (a bf16 copy of an fp32 cache, an
// indexer's own keys), not necessarily the tensors the attention reads.
//
// Entry points (no allocation; scratch from the caller's workspace of workspace_bytes(problem)
// bytes, aligned to workspace_alignment: the row's fp32 queries, a transposed fp32 tile of 16 keys,
// and one score and one candidate per key of the longest sequence):
//  - select_row(): one row, the work item of an engine's thread pool (one workspace per thread);
//  - select(): every row of the problem into a mutable_token_list of width >= max_count(problem).
// Rows are independent and deterministic: the same inputs give the same positions whatever the
// workspace held or which thread ran the row.
// Errors: parameters (validate), the problem, Q, the K/V source (its V is checked, never read), the
// list's shape and the workspace are checked before anything is read; on failure the list's content
// is unspecified, except that select_row with too small an `out` returns shape_mismatch with
// count = the positions the row needs and out untouched.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

#include "skim/config.hpp"
#include "skim/core/dtypes.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"
#include "skim/core/views.hpp"
#include "skim/core/workspace.hpp"
#include "skim/index/token_list.hpp"
#include "skim/select/rank.hpp"

namespace skim::select {

namespace top_tokens_detail {


// The most keys any row of p sees: the longest sequence's key count.
[[nodiscard]] inline std::int32_t max_keys(const problem& p) noexcept {
  std::int32_t n = 0;
  for (std::int32_t b = 0; b < p.batch(); ++b) n = std::max(n, p.seq_len_kv(b));
  return n;
}

}  // namespace top_tokens_detail

struct top_tokens {
  std::int32_t t = 0;       // >= 0: scored tokens kept beyond the reserved ones
  std::int32_t sink = 0;    // >= 0: the row's first keys, always kept
  std::int32_t window = 0;  // >= 0: the row's last visible keys, always kept

  [[nodiscard]] status validate() const noexcept {
    if (t < 0) return status::error(status_code::invalid_argument, "top_tokens t %d < 0", t);
    if (sink < 0) return status::error(status_code::invalid_argument, "top_tokens sink %d < 0", sink);
    if (window < 0) return status::error(status_code::invalid_argument, "top_tokens window %d < 0", window);
    return status::success();
  }

  // Query heads one index row scores: the GQA group for a kv-head row, one for a query-head row.
  [[nodiscard]] static constexpr std::int32_t heads_per_row(const problem& p) noexcept {
    return p.scope == index_scope::kv_head ? p.group_size() : 1;
  }

  // An upper bound, in [0, visible_keys], on the positions of a row that sees visible_keys keys.
  [[nodiscard]] std::int32_t max_count(std::int32_t visible_keys) const noexcept {
    const std::int64_t want = static_cast<std::int64_t>(std::max(t, 0)) + std::max(sink, 0) + std::max(window, 0);
    return static_cast<std::int32_t>(std::clamp<std::int64_t>(want, 0, std::max(visible_keys, std::int32_t{0})));
  }
  // The width of a token_list that holds every row of p.
  [[nodiscard]] std::int32_t max_count(const problem& p) const noexcept {
    return max_count(top_tokens_detail::max_keys(p));
  }

  // Scratch bytes of select_row and select for p (depends on heads, head_dim and the longest sequence).
  [[nodiscard]] std::size_t workspace_bytes(const problem& p) const noexcept {
    workspace_arena measure;
    (void)carve(measure, p);
    return measure.bytes();
  }

  // Selects one index row into out[0, count), ascending. r must be the row make_row_info gives
  // (checked); p, q and k are validated (O(batch)), so selecting every row is cheaper with select().
  // q: [tokens_q, heads_q, head_dim]; k: any K/V source of p whose K is read (V is not).
  template <element TQ, kv_source KV>
    requires element<typename KV::value_type>
  [[nodiscard]] status select_row(const problem& p, const row_info& r, strided_view<const TQ> q, const KV& k,
                                  std::span<std::int32_t> out, std::int32_t& count,
                                  std::span<std::byte> workspace) const noexcept {
    count = 0;
    SKIM_TRY(check_inputs(p, q, k, workspace));
    SKIM_TRY(check_row(p, r));
    const std::int32_t needed = row_count(index::row_visible_keys(r, p.mask));
    if (static_cast<std::size_t>(needed) > out.size()) {
      count = needed;
      return status::error(status_code::shape_mismatch, "row %lld selects %d tokens, out has room for %zu",
                           static_cast<long long>(r.row), needed, out.size());
    }
    workspace_arena arena(workspace);
    const scratch s = carve(arena, p);
    count = select_unchecked(p, r, q, k.bind(p), out, s);
    return status::success();
  }

  // Selects every index row of p into `list` (count[r] and positions of row r; `pad` past count).
  // list: index_rows() counts and rows · width positions, width >= max_count(p).
  template <element TQ, kv_source KV>
    requires element<typename KV::value_type>
  [[nodiscard]] status select(const problem& p, strided_view<const TQ> q, const KV& k, index::mutable_token_list list,
                              std::span<std::byte> workspace) const noexcept {
    SKIM_TRY(check_inputs(p, q, k, workspace));
    const std::int64_t rows = p.index_rows();
    if (list.width < max_count(p)) {
      return status::error(status_code::shape_mismatch, "token_list width %d < max_count %d", list.width,
                           max_count(p));
    }
    if (list.count.size() != static_cast<std::size_t>(rows)) {
      return status::error(status_code::shape_mismatch, "token_list count has %zu entries, problem has %lld rows",
                           list.count.size(), static_cast<long long>(rows));
    }
    if (list.positions.size() != static_cast<std::size_t>(rows) * static_cast<std::size_t>(list.width)) {
      return status::error(status_code::shape_mismatch,
                           "token_list positions has %zu entries, needs rows %lld x width %d", list.positions.size(),
                           static_cast<long long>(rows), list.width);
    }
    workspace_arena arena(workspace);
    const scratch s = carve(arena, p);
    const KV kv = k.bind(p);
    return for_each_row(p, [&](const row_info& r) noexcept {
      const std::span<std::int32_t> out =
          list.positions.subspan(static_cast<std::size_t>(r.row) * static_cast<std::size_t>(list.width),
                                 static_cast<std::size_t>(list.width));
      const std::int32_t n = select_unchecked(p, r, q, kv, out, s);
      list.count[static_cast<std::size_t>(r.row)] = n;
      for (std::size_t j = static_cast<std::size_t>(n); j < out.size(); ++j) out[j] = index::mutable_token_list::pad;
    });
  }

 private:
  // Keys scored per step: their K rows converted to fp32 and transposed, so that the dot products
  // run as reduction-free loops over the tile's keys (each key's sum still in dimension order).
  static constexpr std::int32_t tile_keys = 16;

  struct scratch {
    std::span<float> queries;            // [heads_per_row, head_dim] fp32
    std::span<float> kt;                 // [head_dim, tile_keys] Kᵀ of the current tile
    std::span<float> scores;             // [max_keys]
    std::span<std::int32_t> candidates;  // [max_keys]
  };

  [[nodiscard]] static scratch carve(workspace_arena& arena, const problem& p) noexcept {
    // Any value will do for a problem validate() rejects, as long as computing it is safe.
    const bool shaped = p.heads_q > 0 && p.heads_kv > 0 && p.heads_q % p.heads_kv == 0 && p.head_dim > 0;
    const std::size_t heads = shaped ? static_cast<std::size_t>(heads_per_row(p)) : 0;
    const std::size_t keys = shaped ? static_cast<std::size_t>(top_tokens_detail::max_keys(p)) : 0;
    scratch s;
    const std::size_t dim = static_cast<std::size_t>(shaped ? p.head_dim : 0);
    s.queries = arena.take<float>(heads * dim);
    s.kt = arena.take<float>(dim * tile_keys);
    s.scores = arena.take<float>(keys);
    s.candidates = arena.take<std::int32_t>(keys);
    return s;
  }

  template <element TQ, kv_source KV>
  [[nodiscard]] status check_inputs(const problem& p, const strided_view<const TQ>& q, const KV& k,
                                    std::span<std::byte> workspace) const noexcept {
    SKIM_TRY(validate());
    SKIM_TRY(skim::validate(p));
    SKIM_TRY(check_view(q, p.tokens_q(), p.heads_q, p.head_dim, "Q"));
    SKIM_TRY(k.validate(p));
    return check_workspace(workspace, workspace_bytes(p));
  }

  // Positions a row with v visible keys keeps.
  [[nodiscard]] std::int32_t row_count(std::int32_t v) const noexcept {
    const std::int32_t s = std::min(sink, v);
    const std::int32_t w_first = std::max(s, v - std::min(window, v));
    return s + std::min(t, w_first - s) + (v - w_first);
  }

  // @pre everything select_row checks; out has room for row_count(V); s carved for p.
  template <element TQ, class KV>
  [[nodiscard]] std::int32_t select_unchecked(const problem& p, const row_info& r, const strided_view<const TQ>& q,
                                              const KV& kv, std::span<std::int32_t> out, const scratch& s) const noexcept {
    const std::int32_t v = index::row_visible_keys(r, p.mask);
    const std::int32_t n_sink = std::min(sink, v);
    const std::int32_t w_first = std::max(n_sink, v - std::min(window, v));  // first token of the window
    const std::int32_t k_keep = std::min(t, w_first - n_sink);
    std::int32_t n = 0;
    for (std::int32_t j = 0; j < n_sink; ++j) out[static_cast<std::size_t>(n++)] = j;
    if (k_keep > 0) {
      score(p, r, q, kv, w_first, s);
      const std::span<std::int32_t> candidates =
          s.candidates.subspan(0, static_cast<std::size_t>(w_first - n_sink));
      for (std::int32_t j = n_sink; j < w_first; ++j) candidates[static_cast<std::size_t>(j - n_sink)] = j;
      detail::keep_best(s.scores, candidates, static_cast<std::size_t>(k_keep));  // best k_keep, ascending
      for (std::int32_t i = 0; i < k_keep; ++i) out[static_cast<std::size_t>(n++)] = candidates[static_cast<std::size_t>(i)];
    }
    for (std::int32_t j = w_first; j < v; ++j) out[static_cast<std::size_t>(n++)] = j;
    return n;
  }

  // scores[j] for the candidates j in [sink, last) (the reserved tokens are never scored).
  template <element TQ, class KV>
  void score(const problem& p, const row_info& r, const strided_view<const TQ>& q, const KV& kv, std::int32_t last,
             const scratch& s) const noexcept {
    const std::int32_t d = p.head_dim;
    const std::int32_t heads = heads_per_row(p);
    const std::int32_t first_head = p.scope == index_scope::kv_head ? r.head * heads : r.head;  // query head
    const std::int32_t kv_head = first_head / p.group_size();
    const std::int64_t token = static_cast<std::int64_t>(p.cu_seqlens_q[r.seq]) + r.q_end - 1;  // the last query
    for (std::int32_t g = 0; g < heads; ++g) {
      const TQ* src = q.row(token, first_head + g);
      float* dst = s.queries.data() + static_cast<std::size_t>(g) * static_cast<std::size_t>(d);
      for (std::int32_t e = 0; e < d; ++e) dst[e] = to_float(src[e]);
    }
    for (std::int32_t j0 = std::min(sink, last); j0 < last; j0 += tile_keys) {
      const std::int32_t n = last - j0 < tile_keys ? last - j0 : tile_keys;
      const typename KV::value_type* keys[tile_keys];
      for (std::int32_t j = 0; j < n; ++j) keys[j] = kv.k_row(r.seq, j0 + j, kv_head);
      for (std::int32_t e = 0; e < d; ++e) {  // contiguous stores; the tile's rows are read in step
        float* SKIM_RESTRICT kt = s.kt.data() + static_cast<std::size_t>(e) * tile_keys;
        for (std::int32_t j = 0; j < n; ++j) kt[j] = to_float(keys[j][e]);
        for (std::int32_t j = n; j < tile_keys; ++j) kt[j] = 0.0f;  // a short last tile: padding, never kept
      }
      float best[tile_keys];
      for (float& b : best) b = -std::numeric_limits<float>::infinity();
      float dots[tile_keys];
      for (std::int32_t g = 0; g < heads; ++g) {
        const float* qg = s.queries.data() + static_cast<std::size_t>(g) * static_cast<std::size_t>(d);
        // Whole tiles (a constant trip count): the loops over keys vectorise at -O2.
        for (std::int32_t j = 0; j < tile_keys; ++j) dots[j] = 0.0f;
        for (std::int32_t e = 0; e < d; ++e) {
          const float qe = qg[e];
          const float* SKIM_RESTRICT kt = s.kt.data() + static_cast<std::size_t>(e) * tile_keys;
          for (std::int32_t j = 0; j < tile_keys; ++j) dots[j] += qe * kt[j];  // key j's sum, in dimension order
        }
        // NaN never wins the max: a key whose every head scores NaN stays -inf, ranked last.
        for (std::int32_t j = 0; j < tile_keys; ++j) best[j] = dots[j] > best[j] ? dots[j] : best[j];
      }
      for (std::int32_t j = 0; j < n; ++j) s.scores[static_cast<std::size_t>(j0 + j)] = best[j];
    }
  }
};

}  // namespace skim::select
