#pragma once
// kmeans_router: scores key blocks from a kmeans state (route/kmeans.hpp: centroids of each
// (sequence, kv head)'s keys, their key counts and the per-block membership), so that any selector
// takes the blocks of the nearest centroids first (docs/design.md §7).
//
// kmeans_router{probe, pool}: for row r (sequence b, query block i, index head) and kv head h, each
// query head g of the row (the GQA group for a kv-head row, one head for a query-head row), with its
// pooled query q_g (query_pool last: the block's last query; mean: the fp32 mean of the block's
// queries in token order, as pooled_router.hpp):
//   candidates  clusters c holding a key of a visible block: membership[j][h][c] > 0 for some
//               j < r.visible_blocks (under causality a centroid may also summarise keys no query
//               of the row sees; it is probed only if it holds a visible one);
//   s_g(c)      = q_g · centroid[h][c], fp32 in dimension order;
//   probed_g    the `probe` best candidates by (s_g desc, c asc), a NaN s_g read as −inf (all if fewer);
//   listed      the union over the row's heads of probed_g, each cluster with m(c) = the max of
//               s_g(c) over the heads that probed it, in order (m desc, c asc);
//   held_j      the listed clusters holding a key of block j (n_j(c) = membership[j][h][c] > 0
//               keys), in list order; best_j = m of the first of them (the largest);
//   score[j]    = scale · best_j + log(Σ over c in held_j of n_j(c) · exp(scale · (m(c) − best_j))),
//               fp32, the sum in list order (scale · best_j alone if best_j is +inf), for
//               j < r.visible_blocks;
//               −inf if no probed cluster of any head holds a key of j, and for every j >=
//               r.visible_blocks (the causal future and the padding of a wider span).
// scale is problem::scale(): each held key is approximated by its centroid, so exp(score[j]) is the
// block's attention mass, up to the softmax's normaliser, under that approximation — a block holding
// many keys of a near centroid ranks above one holding a single key of it (the plain nearest-
// centroid score would tie them, and a top-k would break the tie by position). A block whose keys
// all lie in one cluster scores scale · m + log(its keys there). Blocks no probed centroid holds rank
// last (−inf).
// Cost per row: the candidates from the counts when the row sees every block (decode: O(C); the
// same set, as counts[c] = Σ_j membership[j][c]), else one pass over the visible blocks' membership
// (4·C·visible bytes); heads·C·d·2 flops for s, heads·C·log(probe) to rank; the heads' probed
// clusters merged into one list in rank order, then per visible block that list's length
// (<= min(C, heads·probe)) membership loads and an exp per held cluster.
// Cost per decode step (append, then one row per kv head), at d = 128, C = 64, probe 8, GQA 4 and
// 4096 blocks of 16 keys: append 3·C·d + 3·d = 25 kflops, 33 KiB read; scoring 2·heads·C·d = 65
// kflops over 32 KiB of centroids, then at most 4·C bytes of membership per block (1 MiB), against
// pooled_router over mean_pool records: 4.2 Mflops over 2.1 MiB. Build is the expensive part
// ((1 + iterations)·C·n·d·3 flops: a prefill cost).
// Scratch (workspace_bytes(p, C)): heads·d + (heads + 1)·C floats, (heads + 2)·C int32.
//
// Errors: every call checks its problem, spans and workspace before reading anything and names the
// bad value; the router also checks that each kv head of a sequence holds exactly the sequence's
// keys (a stale state is a status, not a silent misroute); a state whose membership disagrees with
// its counts (not one build and append wrote) scores in bounds but as unspecified values. No
// allocation; results depend on the inputs only (not on the workspace's content).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <span>
#include <type_traits>

#include "skim/core/dtypes.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"
#include "skim/core/views.hpp"
#include "skim/core/workspace.hpp"
#include "skim/route/kmeans.hpp"
#include "skim/route/pooled_router.hpp"

namespace skim::route {

// The router over a kmeans state (see the header).
struct kmeans_router {
  std::int32_t probe = 4;               // clusters probed per query head, >= 1
  query_pool pool = query_pool::last;   // last or mean

  // Query heads one index row scores: the GQA group for a kv-head row, one for a query-head row.
  [[nodiscard]] static constexpr std::int32_t heads_per_row(const problem& p) noexcept {
    return p.scope == index_scope::kv_head ? p.group_size() : 1;
  }

  // Scratch: queries [heads, d], cluster scores [heads, C] and merged scores [C] fp32; ranked ids
  // [heads, C], candidate flags [C] and the merged list [C] int32 (heads = heads_per_row(p)).
  [[nodiscard]] std::size_t workspace_bytes(const problem& p, std::int32_t clusters) const noexcept {
    workspace_arena measure;
    (void)take_scratch(measure, p, clusters);
    return measure.bytes();
  }

  [[nodiscard]] status can_implement(const problem& p) const noexcept {
    if (probe < 1) return status::error(status_code::invalid_argument, "kmeans_router probe %d < 1", probe);
    if (pool != query_pool::last && pool != query_pool::mean) {
      return status::error(status_code::unsupported, "kmeans_router query_pool %d is not last or mean",
                           static_cast<int>(pool));
    }
    if (p.softmax_scale < 0.0f) {
      return status::error(status_code::unsupported,
                           "softmax_scale %g < 0: the nearest centroids are the largest logits only for a positive "
                           "scale",
                           static_cast<double>(p.softmax_scale));
    }
    return status::success();
  }

  // Scores one index row. r must be the row make_row_info(p, ...) gives (checked); seq_state is the
  // row's sequence's state (layout::sequence(batch state, r.seq), or an engine's own spans), with
  // membership for at least r.kv_blocks blocks. scores: [>= r.kv_blocks], every entry written.
  template <element TQ>
  [[nodiscard]] status score_row(const problem& p, const row_info& r, strided_view<const TQ> q,
                                 const kmeans::const_state& seq_state, std::span<float> scores,
                                 std::span<std::byte> workspace) const noexcept {
    SKIM_TRY(validate(p));
    SKIM_TRY(can_implement(p));
    SKIM_TRY(check_view(q, p.tokens_q(), p.heads_q, p.head_dim, "Q"));
    SKIM_TRY(check_row(p, r));
    SKIM_TRY(kmeans::detail::check_clusters(seq_state.clusters));
    const kmeans::layout l = kmeans::make_layout(p, seq_state.clusters);
    SKIM_TRY(kmeans::detail::check_spans(seq_state, l.sequence_centroid_floats(), l.sequence_counts(),
                                         r.kv_blocks * l.block_membership(), r.seq));
    SKIM_TRY(kmeans::detail::check_key_count(seq_state, p.heads_kv, r.seq, r.kv_len, "the sequence has"));
    if (scores.size() < static_cast<std::size_t>(r.kv_blocks)) {
      return status::error(status_code::shape_mismatch, "scores of row %lld has %zu floats, needs kv blocks %d",
                           static_cast<long long>(r.row), scores.size(), r.kv_blocks);
    }
    SKIM_TRY(check_workspace(workspace, workspace_bytes(p, seq_state.clusters)));
    workspace_arena arena(workspace);
    score_unchecked(p, r, q, seq_state, scores, take_scratch(arena, p, seq_state.clusters));
    return status::success();
  }

  // Scores every index row of p, row by row in index order, into scores [index_rows, max_kv_blocks]
  // row-major (floats past that are left alone). state: the batch's (make_layout(p, state.clusters)).
  template <element TQ>
  [[nodiscard]] status score(const problem& p, strided_view<const TQ> q, const kmeans::const_state& state,
                             std::span<float> scores, std::span<std::byte> workspace) const noexcept {
    SKIM_TRY(validate(p));
    SKIM_TRY(can_implement(p));
    SKIM_TRY(check_view(q, p.tokens_q(), p.heads_q, p.head_dim, "Q"));
    SKIM_TRY(kmeans::detail::check_state(p, state));
    const kmeans::layout l = kmeans::make_layout(p, state.clusters);
    for (std::int32_t b = 0; b < p.batch(); ++b) {
      SKIM_TRY(kmeans::detail::check_key_count(l.sequence(state, b), p.heads_kv, b, p.seq_len_kv(b),
                                               "the sequence has"));
    }
    const std::int64_t rows = p.index_rows();
    const std::int32_t width = p.max_kv_blocks();
    if (scores.size() < static_cast<std::size_t>(rows * width)) {
      return status::error(status_code::shape_mismatch,
                           "scores has %zu floats, needs %lld (%lld index rows x %d max kv blocks)", scores.size(),
                           static_cast<long long>(rows * width), static_cast<long long>(rows), width);
    }
    SKIM_TRY(check_workspace(workspace, workspace_bytes(p, state.clusters)));
    workspace_arena arena(workspace);
    const scratch s = take_scratch(arena, p, state.clusters);
    std::int64_t row_base = 0;
    for (std::int32_t b = 0; b < p.batch(); ++b) {
      const kmeans::const_state seq = l.sequence(state, b);
      const std::int32_t nqb = p.q_blocks(b);
      for (std::int32_t i = 0; i < nqb; ++i) {
        for (std::int32_t h = 0; h < p.index_heads(); ++h) {
          const row_info r = make_row_info(p, row_base, b, i, h);
          score_unchecked(p, r, q, seq, scores.subspan(static_cast<std::size_t>(r.row * width), width), s);
        }
      }
      row_base += nqb;
    }
    return status::success();
  }

 private:
  struct scratch {
    float* queries = nullptr;         // [heads, d]
    float* cluster_scores = nullptr;  // [heads, C]
    float* merged_scores = nullptr;   // [C]
    std::int32_t* ranked = nullptr;     // [heads, C]
    std::int32_t* candidate = nullptr;  // [C]
    std::int32_t* merged = nullptr;     // [C]
  };

  [[nodiscard]] static scratch take_scratch(workspace_arena& arena, const problem& p, std::int32_t clusters) noexcept {
    // Any value will do for input validate() rejects, as long as computing it is safe.
    const bool sane = p.heads_q > 0 && p.heads_kv > 0 && p.head_dim > 0 && clusters > 0;
    const std::size_t heads = !sane ? 0
                              : p.scope == index_scope::kv_head ? static_cast<std::size_t>(p.heads_q / p.heads_kv)
                                                                : 1;
    const std::size_t d = sane ? static_cast<std::size_t>(p.head_dim) : 0;
    const std::size_t c = sane ? static_cast<std::size_t>(clusters) : 0;
    scratch s;
    s.queries = arena.take<float>(heads * d).data();
    s.cluster_scores = arena.take<float>(heads * c).data();
    s.merged_scores = arena.take<float>(c).data();
    s.ranked = arena.take<std::int32_t>(heads * c).data();
    s.candidate = arena.take<std::int32_t>(c).data();
    s.merged = arena.take<std::int32_t>(c).data();
    return s;
  }

  // candidate[c] |= (m[c] > 0): one block's row; restrict lets it vectorise.
  static SKIM_FORCEINLINE void mark_held(const std::int32_t* SKIM_RESTRICT m, std::int32_t* SKIM_RESTRICT candidate,
                                         std::int32_t clusters) noexcept {
    for (std::int32_t c = 0; c < clusters; ++c) candidate[c] |= m[c] > 0 ? 1 : 0;
  }

  // @pre everything score_row checks.
  template <element TQ>
  void score_unchecked(const problem& p, const row_info& r, const strided_view<const TQ>& q,
                       const kmeans::const_state& seq, std::span<float> scores, const scratch& s) const noexcept {
    const std::int32_t d = p.head_dim;
    const std::int32_t C = seq.clusters;
    const std::int32_t heads = heads_per_row(p);
    const std::int32_t first_head = p.scope == index_scope::kv_head ? r.head * heads : r.head;  // query head
    const std::int32_t kv_head = p.scope == index_scope::kv_head ? r.head : r.head / p.group_size();
    const std::int64_t block_stride = static_cast<std::int64_t>(p.heads_kv) * C;
    const std::int32_t* membership =
        seq.membership.empty() ? nullptr : seq.membership.data() + static_cast<std::int64_t>(kv_head) * C;
    const float* centroids = seq.centroids.data() + static_cast<std::int64_t>(kv_head) * C * d;
    const std::int32_t visible = r.visible_blocks;

    // Candidates: clusters holding a key of a visible block.
    // A row that sees every block (decode) reads them from the counts: the same set, as counts[c] =
    // Σ_j membership[j][c] (the state's invariant), in O(C) instead of O(C · blocks).
    std::int32_t* candidate = s.candidate;
    if (visible == r.kv_blocks) {
      const std::int32_t* counts = seq.counts.data() + static_cast<std::int64_t>(kv_head) * C;
      for (std::int32_t c = 0; c < C; ++c) candidate[c] = counts[c] > 0 ? 1 : 0;
    } else {
      for (std::int32_t c = 0; c < C; ++c) candidate[c] = 0;
      for (std::int32_t j = 0; j < visible; ++j) mark_held(membership + j * block_stride, candidate, C);
    }

    // Per head: pool the query, score the candidates, rank the `probe` best first.
    const std::int64_t token0 = p.cu_seqlens_q[r.seq];
    std::int32_t probed = 0;  // per head (the same count for every head)
    for (std::int32_t g = 0; g < heads; ++g) {
      float* qg = s.queries + static_cast<std::int64_t>(g) * d;
      detail::pool_query(q, token0, r, first_head + g, d, pool == query_pool::mean, qg);
      float* sc = s.cluster_scores + static_cast<std::int64_t>(g) * C;
      std::int32_t* ranked = s.ranked + static_cast<std::int64_t>(g) * C;
      std::int32_t n = 0;
      for (std::int32_t c = 0; c < C; ++c) {
        if (candidate[c] == 0) continue;
        const float x = kmeans::detail::dot(qg, centroids + static_cast<std::int64_t>(c) * d, d);
        sc[c] = std::isnan(x) ? detail::neg_inf : x;  // NaN ranks, and scores, as -inf
        ranked[n++] = c;
      }
      probed = std::min(probe, n);
      std::partial_sort(ranked, ranked + probed, ranked + n, [sc](std::int32_t a, std::int32_t b) noexcept {
        return sc[a] > sc[b] || (sc[a] == sc[b] && a < b);
      });
    }

    // The heads' probed clusters as one list: each with its best score over the heads that probed it,
    // in rank order (score desc, id asc), as the definition's `listed`.
    float* merged = s.merged_scores;
    for (std::int32_t c = 0; c < C; ++c) merged[c] = detail::neg_inf;
    for (std::int32_t g = 0; g < heads; ++g) {
      const float* sc = s.cluster_scores + static_cast<std::int64_t>(g) * C;
      const std::int32_t* ranked = s.ranked + static_cast<std::int64_t>(g) * C;
      for (std::int32_t k = 0; k < probed; ++k) merged[ranked[k]] = std::max(merged[ranked[k]], sc[ranked[k]]);
    }
    std::int32_t* list = s.merged;
    std::int32_t listed = 0;
    for (std::int32_t c = 0; c < C; ++c) {
      if (merged[c] != detail::neg_inf) list[listed++] = c;  // a probed -inf scores as no cluster
    }
    std::sort(list, list + listed, [merged](std::int32_t a, std::int32_t b) noexcept {
      return merged[a] > merged[b] || (merged[a] == merged[b] && a < b);
    });

    // Blocks: the log of their held keys' mass, relative to the best listed cluster holding one.
    const float scale = p.scale();
    for (std::int32_t j = 0; j < visible; ++j) {
      const std::int32_t* m = membership + j * block_stride;
      float best = detail::neg_inf, sum = 0.0f;
      for (std::int32_t k = 0; k < listed; ++k) {
        const std::int32_t c = list[k];
        if (m[c] <= 0) continue;
        if (best == detail::neg_inf) best = merged[c];
        sum += static_cast<float>(m[c]) * std::exp((merged[c] - best) * scale);
      }
      scores[j] = best == detail::neg_inf ? detail::neg_inf
                  : std::isinf(best)      ? best * scale
                                          : best * scale + std::log(sum);
    }
    for (std::size_t j = static_cast<std::size_t>(visible); j < scores.size(); ++j) scores[j] = detail::neg_inf;
  }
};

}  // namespace skim::route
