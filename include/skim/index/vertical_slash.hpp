#pragma once
// vertical_slash: a block_csr for long prefill from the "vertical-slash" pattern (MInference's
// observation: a prefill head's attention concentrates on a few key columns, the vertical lines,
// and a few diagonals, the slash lines, at fixed distances behind the query), estimated from the
// exact attention of the sequence's last queries.
//
// For each sequence b and each index row head h (problem::scope: a kv_head row pools the
// group_size() query heads that read kv head h; a query_head row is query head h alone):
//
//  1. Estimate. The last L = min(last_q, seq_len_q(b)) queries t of the sequence, each with its
//     exact softmax probabilities p(t, g, j) = softmax_j(scale · q_{t,g}·k_j) over the keys j it may
//     see (bottom-right causal, or every key under mask_kind::none), in double precision, for each
//     query head g of the row. A query's position is pos(t) = t + seq_len_kv(b) - seq_len_q(b).
//       vertical[j] = Σ_{g, t} p(t, g, j)                       for key columns j in [0, seq_len_kv);
//       slash[o]    = Σ_{g, t, j : pos(t) - j = o} p(t, g, j)   for diagonal offsets o in [0, seq_len_kv)
//     (under mask_kind::none the keys after pos(t) have a negative offset and count only in
//     vertical). Summation order is fixed: heads g ascending, then queries t, then keys j.
//  2. Keep the min(columns, seq_len_kv) best columns and the min(diagonals, seq_len_kv) best
//     offsets, ranked as skim's selectors rank blocks (select/rank.hpp): score descending, index
//     ascending, NaN read as -inf — a strict total order, so the kept set is one well-defined set.
//  3. Describe. Row (b, i, h), for query block i with queries [q_begin, q_end), holds the union of
//      - the block (block_kv granularity) of each kept column visible to some query of the block
//        (under causality: column < visible keys of the block's last query);
//      - the blocks each kept offset o crosses for the block's queries: query t reads key
//        pos(t) - o when that is >= 0 (it is then always visible to t);
//      - the first sink_blocks blocks (index/sink.hpp) and the last window_blocks visible blocks
//        (index/sliding_window.hpp),
//     restricted to [0, row.visible_blocks), ascending and unique: block_csr::validate(p) holds.
//
// Layouts: Q [tokens_q, heads_q, head_dim] and K [tokens_kv, heads_kv, head_dim] as strided_views of
// float, half or bfloat16 (each converted to double for the estimate); V is not read. The output is a
// mutable_block_csr over caller memory: row_ptr of index_rows() + 1 entries, col_idx of at least
// capacity(p, options) entries (capacity(p), the causal_all count, bounds it for any options).
//
// Cost: the estimate is an O(L · seq_len_kv · head_dim) pass per query head and sequence (L = 64 by
// default; dot products in double, vs_query_tile queries against each key row at a time), plus two
// selections (nth_element, then a sort of the kept ids) over seq_len_kv candidates; the rows cost
// O(visible_blocks + columns + diagonals · blocks a diagonal crosses) each. Why the CPU: the estimate
// is L / seq_len_q of dense prefill's score work (one pass of L queries against the keys per head),
// its result is a small CSR, and in double with a fixed order its ids are reproducible to the bit,
// exact ties included; so it runs here, in one thread, with no kernel of its own, and the CSR goes to
// any executor (exec::simd, exec::scalar, or cuda::prefill through device_block_csr after a copy).
// Its time grows with seq_len_kv · heads_q while a sparse prefill's grows with the kept blocks:
// measure both on long sequences (docs/performance.md) before putting it on a latency path.
//
// Entry points (no allocation; scratch from the caller's workspace of workspace_bytes(p, options)
// bytes, aligned to workspace_alignment; it depends on the shape only):
//   const std::int64_t cap = vertical_slash_capacity(p, o);        // col_idx entries
//   skim::workspace_buffer ws(vertical_slash_workspace_bytes(p, o));
//   SKIM_TRY(build_vertical_slash(p, q, k, o, {row_ptr, col_idx}, ws.span()));
//
// Errors: build_vertical_slash checks the problem, the options (no negative count, last_q >= 1), Q
// and K against the problem (check_view), row_ptr's size, col_idx against capacity(p, options) (which
// must fit the int32 row_ptr), and the workspace, before it reads or writes anything; a failed check
// leaves row_ptr and col_idx untouched. Determinism: the ids depend only on the inputs' values (not
// on the workspace's contents); non-finite Q or K give NaN scores, which rank last.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

#include "skim/core/dtypes.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"
#include "skim/core/views.hpp"
#include "skim/core/workspace.hpp"
#include "skim/index/block_csr.hpp"

namespace skim::index {

struct vertical_slash_options {
  std::int32_t columns = 256;     // key columns kept per (sequence, index head); >= 0
  std::int32_t diagonals = 256;   // diagonal offsets kept per (sequence, index head); >= 0
  std::int32_t sink_blocks = 1;   // first blocks every row keeps; >= 0
  std::int32_t window_blocks = 1; // newest visible blocks every row keeps; >= 0
  std::int32_t last_q = 64;       // queries the pattern is estimated from; >= 1 (clamped to seq_len_q)

  [[nodiscard]] status validate() const noexcept {
    if (columns < 0) return status::error(status_code::invalid_argument, "vertical_slash columns %d < 0", columns);
    if (diagonals < 0) {
      return status::error(status_code::invalid_argument, "vertical_slash diagonals %d < 0", diagonals);
    }
    if (sink_blocks < 0) {
      return status::error(status_code::invalid_argument, "vertical_slash sink_blocks %d < 0", sink_blocks);
    }
    if (window_blocks < 0) {
      return status::error(status_code::invalid_argument, "vertical_slash window_blocks %d < 0", window_blocks);
    }
    if (last_q < 1) return status::error(status_code::invalid_argument, "vertical_slash last_q %d < 1", last_q);
    return status::success();
  }
};

namespace detail {

// Keys of the longest sequence; 0 for a problem validate() rejects (so sizes stay safe to compute).
[[nodiscard]] inline std::int32_t vs_max_kv_len(const problem& p) noexcept {
  if (!skim::validate(p).ok()) return 0;
  std::int32_t n = 0;
  for (std::int32_t b = 0; b < p.batch(); ++b) n = std::max(n, p.seq_len_kv(b));
  return n;
}

[[nodiscard]] constexpr std::int32_t vs_clamp(std::int32_t x, std::int32_t hi) noexcept {
  return x < 0 ? 0 : (x > hi ? hi : x);
}

// Upper bound of one row's ids: columns' blocks, diagonals' blocks, sink and window, at most visible.
[[nodiscard]] constexpr std::int64_t vs_row_bound(const problem& p, const row_info& r,
                                                  const vertical_slash_options& o) noexcept {
  // An interval of n consecutive keys touches at most ceil((n - 1) / block_kv) + 1 blocks.
  const std::int64_t n = r.q_end - r.q_begin;
  const std::int64_t crossed = (n - 1 + p.block_kv - 1) / p.block_kv + 1;
  const std::int64_t bound = static_cast<std::int64_t>(vs_clamp(o.columns, r.kv_len)) +
                             static_cast<std::int64_t>(vs_clamp(o.diagonals, r.kv_len)) * crossed +
                             std::max(o.sink_blocks, 0) + std::max(o.window_blocks, 0);
  return std::min<std::int64_t>(bound, r.visible_blocks);
}

// Queries whose logits are computed together: each key row is converted once per tile, and the
// tile's dot products run side by side (each still summed over head_dim in ascending order).
inline constexpr std::int32_t vs_query_tile = 8;

// Scratch of one build; the same takes measure (workspace_bytes) and carve (build).
struct vs_scratch {
  std::span<double> queries;          // [head_dim, vs_query_tile]: a tile's queries, in double
  std::span<double> probs;            // [vs_query_tile, max_kv_len]: the tile's logits, then probabilities
  std::span<double> vertical;         // [max_kv_len]
  std::span<double> slash;            // [max_kv_len]
  std::span<std::int32_t> candidates; // [max_kv_len]: ids ranked by keep_best
  std::span<std::int32_t> columns;    // [index_heads, kept columns]: the sequence's, per head, ascending
  std::span<std::int32_t> diagonals;  // [index_heads, kept diagonals]
  std::span<std::uint8_t> marks;      // [max_kv_blocks]: one row's blocks
};

[[nodiscard]] inline vs_scratch vs_take(workspace_arena& arena, const problem& p,
                                        const vertical_slash_options& o) noexcept {
  const std::int32_t n = vs_max_kv_len(p);  // 0 for an invalid problem
  const std::size_t heads = n > 0 ? static_cast<std::size_t>(p.index_heads()) : 0;
  const auto len = static_cast<std::size_t>(n);
  vs_scratch s;
  s.queries = arena.take<double>(n > 0 ? static_cast<std::size_t>(vs_query_tile) * p.head_dim : 0);
  s.probs = arena.take<double>(static_cast<std::size_t>(vs_query_tile) * len);
  s.vertical = arena.take<double>(len);
  s.slash = arena.take<double>(len);
  s.candidates = arena.take<std::int32_t>(len);
  s.columns = arena.take<std::int32_t>(heads * static_cast<std::size_t>(vs_clamp(o.columns, n)));
  s.diagonals = arena.take<std::int32_t>(heads * static_cast<std::size_t>(vs_clamp(o.diagonals, n)));
  s.marks = arena.take<std::uint8_t>(n > 0 ? static_cast<std::size_t>(p.max_kv_blocks()) : 0);
  return s;
}

// Writes the k best of scores[0, n) (score descending, index ascending, NaN as -inf) to out[0, k),
// ascending. @pre 0 <= k <= n; candidates has n entries.
inline void vs_keep_best(const double* scores, std::int32_t n, std::int32_t k, std::int32_t* candidates,
                         std::int32_t* out) noexcept {
  for (std::int32_t j = 0; j < n; ++j) candidates[j] = j;
  const auto key = [scores](std::int32_t j) noexcept {
    const double s = scores[j];
    return std::isnan(s) ? -std::numeric_limits<double>::infinity() : s;
  };
  const auto before = [&key](std::int32_t a, std::int32_t b) noexcept {
    const double ka = key(a), kb = key(b);
    return ka > kb || (ka == kb && a < b);
  };
  if (k < n) std::nth_element(candidates, candidates + k, candidates + n, before);
  std::sort(candidates, candidates + k);
  std::copy_n(candidates, k, out);
}

// vertical and slash of (sequence b, index head h) into s.vertical[0, n_kv), s.slash[0, n_kv).
// @pre everything build_vertical_slash checks; seq_len_kv(b) > 0.
template <element TQ, element TK>
void vs_estimate(const problem& p, const strided_view<const TQ>& q, const strided_view<const TK>& k, std::int32_t b,
                 std::int32_t h, std::int32_t last_q, const vs_scratch& s) noexcept {
  const std::int32_t n_q = p.seq_len_q(b), n_kv = p.seq_len_kv(b), d = p.head_dim;
  const std::int32_t offset = n_kv - n_q;  // pos(t) = t + offset
  const bool kv_scope = p.scope == index_scope::kv_head;
  const std::int32_t heads = kv_scope ? p.group_size() : 1;
  const std::int32_t first_head = kv_scope ? h * heads : h;
  const std::int32_t kv_head = kv_scope ? h : h / p.group_size();
  const std::int64_t q0 = p.cu_seqlens_q[b], k0 = p.cu_seqlens_kv[b];
  const double scale = static_cast<double>(p.scale());
  double* vertical = s.vertical.data();
  double* slash = s.slash.data();
  std::fill(vertical, vertical + n_kv, 0.0);
  std::fill(slash, slash + n_kv, 0.0);
  const std::int32_t first_t = n_q - std::min(last_q, n_q);
  const auto visible_keys = [&](std::int32_t t) {
    return p.mask == mask_kind::none ? n_kv : vs_clamp(t + offset + 1, n_kv);
  };
  for (std::int32_t g = 0; g < heads; ++g) {
    for (std::int32_t t0 = first_t; t0 < n_q; t0 += vs_query_tile) {
      const std::int32_t tile = std::min(vs_query_tile, n_q - t0);
      double* queries = s.queries.data();  // [head_dim, vs_query_tile]: a dimension's values side by side
      for (std::int32_t x = 0; x < vs_query_tile; ++x) {
        const TQ* qt = q.row(q0 + t0 + (x < tile ? x : 0), first_head + g);  // a short tile repeats its first
        for (std::int32_t e = 0; e < d; ++e) {
          queries[static_cast<std::size_t>(e) * vs_query_tile + x] = static_cast<double>(to_float(qt[e]));
        }
      }
      // Logits of the tile's queries: query x's row holds keys [0, visible_keys(t0 + x)), the
      // tile's last query sees the most (keys past a query's own prefix are computed, never read).
      const std::int32_t keys = visible_keys(t0 + tile - 1);
      for (std::int32_t j = 0; j < keys; ++j) {
        const TK* kj = k.row(k0 + j, kv_head);
        double dot[vs_query_tile] = {};
        for (std::int32_t e = 0; e < d; ++e) {
          const double ke = static_cast<double>(to_float(kj[e]));
          const double* qe = queries + static_cast<std::size_t>(e) * vs_query_tile;
          for (std::int32_t x = 0; x < vs_query_tile; ++x) dot[x] += qe[x] * ke;
        }
        for (std::int32_t x = 0; x < tile; ++x) s.probs[static_cast<std::size_t>(x) * n_kv + j] = scale * dot[x];
      }
      // Each query's softmax, then its share of the columns and diagonals, queries ascending.
      for (std::int32_t x = 0; x < tile; ++x) {
        const std::int32_t t = t0 + x, pos = t + offset, visible = visible_keys(t);
        double* probs = s.probs.data() + static_cast<std::size_t>(x) * n_kv;
        double m = -std::numeric_limits<double>::infinity();
        for (std::int32_t j = 0; j < visible; ++j) m = probs[j] > m ? probs[j] : m;
        double sum = 0.0;
        for (std::int32_t j = 0; j < visible; ++j) {
          probs[j] = std::exp(probs[j] - m);
          sum += probs[j];
        }
        for (std::int32_t j = 0; j < visible; ++j) {
          const double pj = probs[j] / sum;
          vertical[j] += pj;
          if (pos - j >= 0) slash[pos - j] += pj;  // pos - j < n_kv: pos <= n_kv - 1
        }
      }
    }
  }
}

}  // namespace detail

// Ids a CSR of p can hold for any options: Σ over rows of visible_blocks (the causal_all count),
// at most index_rows() · max_kv_blocks(). 0 for a problem validate() rejects.
[[nodiscard]] inline std::int64_t vertical_slash_capacity(const problem& p) noexcept {
  if (!skim::validate(p).ok()) return 0;
  std::int64_t n = 0;
  (void)for_each_row(p, [&](const row_info& r) noexcept { n += r.visible_blocks; });
  return n;
}

// Ids build_vertical_slash may write for p and o (the col_idx size it requires): Σ over rows of
// min(visible_blocks, columns + diagonals · blocks a diagonal crosses + sink_blocks + window_blocks),
// counts clamped to the sequence's keys. 0 for a problem validate() rejects.
[[nodiscard]] inline std::int64_t vertical_slash_capacity(const problem& p, const vertical_slash_options& o) noexcept {
  if (!skim::validate(p).ok()) return 0;
  std::int64_t n = 0;
  (void)for_each_row(p, [&](const row_info& r) noexcept { n += detail::vs_row_bound(p, r, o); });
  return n;
}

// Scratch bytes of build_vertical_slash: vs_query_tile + 2 doubles and one int32 per key of the
// longest sequence, the kept columns and diagonals of every index head, a byte per key block, a tile
// of queries. Never fails.
[[nodiscard]] inline std::size_t vertical_slash_workspace_bytes(const problem& p,
                                                                const vertical_slash_options& o) noexcept {
  workspace_arena measure;
  (void)detail::vs_take(measure, p, o);
  return measure.bytes();
}

// Builds the vertical-slash index of p (see the header comment) into out.
// q: [tokens_q, heads_q, head_dim]; k: [tokens_kv, heads_kv, head_dim].
// out.row_ptr: index_rows() + 1 entries; out.col_idx: >= vertical_slash_capacity(p, o) entries
// (entries past row_ptr[rows] are left alone).
template <element TQ, element TK>
[[nodiscard]] status build_vertical_slash(const problem& p, strided_view<const TQ> q, strided_view<const TK> k,
                                          const vertical_slash_options& o, mutable_block_csr out,
                                          std::span<std::byte> workspace) noexcept {
  SKIM_TRY(skim::validate(p));
  SKIM_TRY(o.validate());
  SKIM_TRY(check_view(q, p.tokens_q(), p.heads_q, p.head_dim, "Q"));
  SKIM_TRY(check_view(k, p.tokens_kv(), p.heads_kv, p.head_dim, "K"));
  const std::int64_t rows = p.index_rows();
  if (out.row_ptr.size() != static_cast<std::size_t>(rows) + 1) {
    return status::error(status_code::shape_mismatch, "vertical_slash row_ptr has %zu entries, needs rows %lld + 1",
                         out.row_ptr.size(), static_cast<long long>(rows));
  }
  const std::int64_t capacity = vertical_slash_capacity(p, o);
  if (capacity > std::numeric_limits<std::int32_t>::max()) {
    return status::error(status_code::invalid_argument,
                         "vertical_slash may write %lld ids, more than an int32 row_ptr holds",
                         static_cast<long long>(capacity));
  }
  if (out.col_idx.size() < static_cast<std::size_t>(capacity)) {
    return status::error(status_code::shape_mismatch, "vertical_slash col_idx has %zu entries, needs capacity %lld",
                         out.col_idx.size(), static_cast<long long>(capacity));
  }
  SKIM_TRY(check_workspace(workspace, vertical_slash_workspace_bytes(p, o)));
  workspace_arena arena(workspace);
  const detail::vs_scratch s = detail::vs_take(arena, p, o);

  // The CSR is written in row order, and rows interleave the index heads of a query block: each
  // sequence's pattern is estimated for all its heads first.
  const std::int32_t heads = p.index_heads();
  const std::int32_t bk = p.block_kv;
  std::int32_t nnz = 0;
  std::int64_t row_base = 0;  // q_block_offset(b)
  out.row_ptr[0] = 0;
  for (std::int32_t b = 0; b < p.batch(); ++b) {
    const std::int32_t n_q = p.seq_len_q(b), n_kv = p.seq_len_kv(b);
    const std::int32_t n_columns = detail::vs_clamp(o.columns, n_kv);
    const std::int32_t n_diagonals = detail::vs_clamp(o.diagonals, n_kv);
    const std::int32_t column_stride = detail::vs_clamp(o.columns, static_cast<std::int32_t>(s.vertical.size()));
    const std::int32_t diagonal_stride = detail::vs_clamp(o.diagonals, static_cast<std::int32_t>(s.vertical.size()));
    // 1, 2: the kept columns and offsets of every index head of the sequence.
    if (n_q > 0 && n_kv > 0) {
      for (std::int32_t h = 0; h < heads; ++h) {
        detail::vs_estimate(p, q, k, b, h, o.last_q, s);
        detail::vs_keep_best(s.vertical.data(), n_kv, n_columns, s.candidates.data(),
                             s.columns.data() + static_cast<std::size_t>(h) * column_stride);
        detail::vs_keep_best(s.slash.data(), n_kv, n_diagonals, s.candidates.data(),
                             s.diagonals.data() + static_cast<std::size_t>(h) * diagonal_stride);
      }
    }
    // 3: the rows, in row order.
    const std::int32_t offset = n_kv - n_q;
    const std::int32_t nqb = p.q_blocks(b);
    for (std::int32_t i = 0; i < nqb; ++i) {
      for (std::int32_t h = 0; h < heads; ++h) {
        const row_info r = make_row_info(p, row_base, b, i, h);
        const std::int32_t vb = r.visible_blocks;
        std::uint8_t* marks = s.marks.data();
        std::fill(marks, marks + vb, std::uint8_t{0});
        for (std::int32_t j = 0; j < std::min(o.sink_blocks, vb); ++j) marks[j] = 1;
        for (std::int32_t j = std::max(vb - o.window_blocks, 0); j < vb; ++j) marks[j] = 1;
        const std::int32_t* columns = s.columns.data() + static_cast<std::size_t>(h) * column_stride;
        const std::int32_t seen = r.visible_keys(r.q_end - 1, p.mask);  // keys the block's last query sees
        for (std::int32_t c = 0; c < n_columns && columns[c] < seen; ++c) marks[columns[c] / bk] = 1;
        const std::int32_t* diagonals = s.diagonals.data() + static_cast<std::size_t>(h) * diagonal_stride;
        const std::int32_t pos_first = r.q_begin + offset, pos_last = r.q_end - 1 + offset;
        for (std::int32_t x = 0; x < n_diagonals && pos_last - diagonals[x] >= 0; ++x) {
          const std::int32_t first = std::max(pos_first - diagonals[x], 0) / bk;
          const std::int32_t last = std::min((pos_last - diagonals[x]) / bk, vb - 1);
          for (std::int32_t j = first; j <= last; ++j) marks[j] = 1;
        }
        for (std::int32_t j = 0; j < vb; ++j) {
          if (marks[j] == 0) continue;
          // vs_row_bound bounds every row, so capacity bounds nnz; the check keeps a broken bound a status.
          if (static_cast<std::size_t>(nnz) >= out.col_idx.size()) {
            return status::error(status_code::invalid_index, "vertical_slash row %lld exceeds capacity %lld",
                                 static_cast<long long>(r.row), static_cast<long long>(capacity));
          }
          out.col_idx[static_cast<std::size_t>(nnz++)] = j;
        }
        out.row_ptr[static_cast<std::size_t>(r.row) + 1] = nnz;
      }
    }
    row_base += nqb;
  }
  return status::success();
}

}  // namespace skim::index
