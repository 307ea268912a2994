#pragma once
// pooled_router: scores every key block of an index row from its summary, for a pooled query of the
// row's query block, reduced over the GQA group, in logit units (docs/design.md §7).
//
// For row r (sequence b, query block i, index head h) and key block j < r.visible_blocks:
//
//   score[j] = scale · reduce_{query heads g of the row} pool_{queries t of the block} S::score(record(j), q_{t,g})
//
// where record(j) is the summary of block j for the row's kv head, scale is problem::scale() (so a
// selector may treat scores as logits: a probability-mass threshold needs that), and
//  - query_pool picks which query vectors are scored (the queries t in [r.q_begin, r.q_end)):
//      last  the block's last query: under causality it sees the most keys (every visible block);
//      mean  the mean query vector (fp32, summed in token order, divided by the count); every query of
//            the block is pooled, whatever it can see;
//      max   the max over the block's queries of each query's own score: bq times the scoring work of
//            last/mean (and bq·heads·head_dim floats of scratch), the best recall of the three. A query
//            pools only the blocks it can see a key of (under causality a block on the diagonal is not
//            scored for the queries before its first key), so a future key never lifts a block's score
//            through a query that cannot read it; the row's last query sees every visible block, so
//            each visible block has at least one score;
//  - group_reduce combines the query heads of the row: for a kv-head row (index_scope::kv_head, the
//    default) the group_size() query heads that read the kv head; for a query-head row the one query
//    head (every reduce is then the identity):
//      max   the best head's score (any head that wants the block keeps it);
//      mean  the heads' mean;
//      sum   the heads' sum (mean · group_size: the same order, logits group_size times larger).
//
// Blocks j >= r.visible_blocks (the causal future: no query of the block sees a key of them) score
// -inf, and so does every entry of the output past r.kv_blocks: a row writes a span of any width
// >= r.kv_blocks completely. The causal diagonal block is visible, hence a candidate; its score is
// whatever the summary says about all of its keys. Under mask_kind::none every block is visible.
// A block whose record holds no key (a stale summary) scores -inf whatever the scale.
//
// Cost per row: visible_blocks · heads · (1 for last/mean, bq for max) calls of S::score (O(head_dim)
// each for mean_pool and max_bound; a summarizer with a prepared query, lsh_buckets, does its
// query work once per pooled vector and a few lookups per call), plus pooling the block's queries once (converted to fp32 from
// TQ = float, half or bfloat16). The records of the row's kv head are read once per block. A score
// is a chain of dependent additions (its order is part of its bits); with last/mean pooling a
// summarizer defining score4 (max_bound, mean_pool, multi_centroid) scores four heads of the group
// side by side, four chains in flight, and one defining score4_blocks (the three of them) several
// blocks a call (S::score4_blocks_per_call) with the four heads as the lanes of one vector, every
// block's chains in flight together: the same bits. That loop also asks for the records 32 blocks
// ahead (one kv head's records are strided: the hardware prefetchers lose them).
//
// Entry points (no allocation; scratch is the pooled query vectors, from the caller's workspace of
// workspace_bytes(problem) bytes, aligned to workspace_alignment):
//  - score_row(): one row, the work item an engine's thread pool runs (one workspace per thread);
//  - score(): every row of the problem into scores [index_rows, max_kv_blocks], row-major.
// The softmax scale must be positive: summaries estimate the largest q·k, which is the largest
// logit only when the scale is (can_implement() says unsupported otherwise).

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>

#include "skim/concepts/router.hpp"
#include "skim/concepts/summarizer.hpp"
#include "skim/config.hpp"
#include "skim/core/dtypes.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"
#include "skim/core/views.hpp"
#include "skim/core/workspace.hpp"
#include "skim/detail/dot.hpp"
#include "skim/summarize/build.hpp"
#include "skim/summarize/max_bound.hpp"
#include "skim/summarize/mean_pool.hpp"

namespace skim::route {

// Which query vectors of a query block are scored (see the header comment).
enum class query_pool : std::uint8_t { last, mean, max };

// How the scores of a row's query heads are combined (see the header comment).
enum class group_reduce : std::uint8_t { max, mean, sum };

[[nodiscard]] constexpr std::string_view to_string(query_pool x) noexcept {
  switch (x) {
    case query_pool::last: return "last";
    case query_pool::mean: return "mean";
    case query_pool::max: return "max";
  }
  return "unknown";
}

[[nodiscard]] constexpr std::string_view to_string(group_reduce x) noexcept {
  switch (x) {
    case group_reduce::max: return "max";
    case group_reduce::mean: return "mean";
    case group_reduce::sum: return "sum";
  }
  return "unknown";
}

namespace detail {

inline constexpr float neg_inf = -std::numeric_limits<float>::infinity();

// The pooled fp32 query of query head `head` for row r into dst [head_dim]: with mean, the mean of
// the row's queries (summed in token order, then divided by their count), else its last query.
// token0: the row's sequence's first query token. Shared by the routers that pool (pooled_router,
// kmeans_router), so both pool to the same bits.
template <element TQ>
SKIM_FORCEINLINE void pool_query(const strided_view<const TQ>& q, std::int64_t token0, const row_info& r,
                                 std::int32_t head, std::int32_t head_dim, bool mean, float* dst) noexcept {
  if (!mean) {
    const TQ* src = q.row(token0 + r.q_end - 1, head);
    for (std::int32_t k = 0; k < head_dim; ++k) dst[k] = to_float(src[k]);
    return;
  }
  for (std::int32_t k = 0; k < head_dim; ++k) dst[k] = 0.0f;
  for (std::int32_t t = r.q_begin; t < r.q_end; ++t) {
    const TQ* src = q.row(token0 + t, head);
    for (std::int32_t k = 0; k < head_dim; ++k) dst[k] += to_float(src[k]);
  }
  const float count = static_cast<float>(r.q_end - r.q_begin);
  for (std::int32_t k = 0; k < head_dim; ++k) dst[k] /= count;
}

}  // namespace detail

struct pooled_router {
  query_pool pool = query_pool::last;
  group_reduce reduce = group_reduce::max;

  // The most blocks one score4_blocks call may score (decode, with last or mean pooling: each
  // summarizer says how many it wants, S::score4_blocks_per_call); the workspace holds their scores.
  static constexpr std::int32_t max_block_group = 8;

  // Query heads one index row scores: the GQA group for a kv-head row, one for a query-head row.
  // @pre validate(p) is ok.
  [[nodiscard]] static constexpr std::int32_t heads_per_row(const problem& p) noexcept {
    return p.scope == index_scope::kv_head ? p.group_size() : 1;
  }

  // Scratch: [heads_per_row, vectors per head (block_q for max, else 1), prepared_query_capacity(head_dim)]
  // pooled fp32 queries, each prepared in place for the summarizer (summarizer.hpp, requirement 8),
  // then heads_per_row floats of scores for each of max_block_group blocks, then heads_per_row ·
  // head_dim floats of the queries interleaved by four (requirement 11).
  [[nodiscard]] std::size_t workspace_bytes(const problem& p) const noexcept {
    workspace_arena measure;
    (void)take_queries(measure, p);
    return measure.bytes();
  }

  [[nodiscard]] status can_implement(const problem& p) const noexcept {
    if (to_string(pool) == "unknown") {
      return status::error(status_code::invalid_argument, "query_pool %d is not last, mean or max",
                           static_cast<int>(pool));
    }
    if (to_string(reduce) == "unknown") {
      return status::error(status_code::invalid_argument, "group_reduce %d is not max, mean or sum",
                           static_cast<int>(reduce));
    }
    if (p.softmax_scale < 0.0f) {
      return status::error(status_code::unsupported,
                           "softmax_scale %g < 0: summaries estimate the largest q.k, the largest logit only "
                           "for a positive scale",
                           static_cast<double>(p.softmax_scale));
    }
    return status::success();
  }

  // Scores one index row. r must be the row make_row_info(p, ...) gives (checked: O(1)); p is
  // validated (O(batch)), so scoring every row is cheaper with score().
  // q: [tokens_q, heads_q, head_dim]. seq_records: [kv_blocks(r.seq), heads_kv, record_floats], the
  // records of the row's sequence (the batch layout from summary_layout::sequence_offset(r.seq), or an
  // engine's own per-sequence span). scores: [>= r.kv_blocks], every entry written (see the header).
  template <summarizer S, element TQ>
  [[nodiscard]] status score_row(const problem& p, const row_info& r, strided_view<const TQ> q,
                                 std::span<const float> seq_records, std::span<float> scores,
                                 std::span<std::byte> workspace) const noexcept {
    SKIM_TRY(validate(p));
    SKIM_TRY(can_implement(p));
    SKIM_TRY(check_view(q, p.tokens_q(), p.heads_q, p.head_dim, "Q"));
    SKIM_TRY(check_row(p, r));
    const std::int64_t rf = S::record_floats(p.head_dim);
    const std::int64_t needed = static_cast<std::int64_t>(r.kv_blocks) * p.heads_kv * rf;
    if (seq_records.size() < static_cast<std::size_t>(needed)) {
      return status::error(status_code::shape_mismatch,
                           "records of sequence %d has %zu floats, needs %lld (%d kv blocks x %d kv heads x %lld "
                           "floats) for row %lld",
                           r.seq, seq_records.size(), static_cast<long long>(needed), r.kv_blocks, p.heads_kv,
                           static_cast<long long>(rf), static_cast<long long>(r.row));
    }
    if (scores.size() < static_cast<std::size_t>(r.kv_blocks)) {
      return status::error(status_code::shape_mismatch, "scores of row %lld has %zu floats, needs kv blocks %d",
                           static_cast<long long>(r.row), scores.size(), r.kv_blocks);
    }
    SKIM_TRY(check_workspace(workspace, workspace_bytes(p)));
    workspace_arena arena(workspace);
    score_unchecked<S>(p, r, q, seq_records.data(), scores, take_queries(arena, p).data());
    return status::success();
  }

  // Scores every index row of p, row by row in index order.
  // q: [tokens_q, heads_q, head_dim]. records: [total_kv_blocks, heads_kv, record_floats] as
  // summarize::build writes them (floats past that are not read).
  // scores: [index_rows, max_kv_blocks] row-major (floats past that are left alone); row r's entries
  // past its visible blocks, padding included, are -inf.
  template <summarizer S, element TQ>
  [[nodiscard]] status score(const problem& p, strided_view<const TQ> q, std::span<const float> records,
                             std::span<float> scores, std::span<std::byte> workspace) const noexcept {
    SKIM_TRY(validate(p));
    SKIM_TRY(can_implement(p));
    SKIM_TRY(check_view(q, p.tokens_q(), p.heads_q, p.head_dim, "Q"));
    const summarize::summary_layout l = summarize::make_summary_layout<S>(p);
    if (records.size() < static_cast<std::size_t>(l.floats())) {
      return status::error(status_code::shape_mismatch,
                           "records has %zu floats, needs %lld (%lld kv blocks x %d kv heads x %lld floats)",
                           records.size(), static_cast<long long>(l.floats()),
                           static_cast<long long>(l.total_kv_blocks), l.heads_kv,
                           static_cast<long long>(l.record_floats));
    }
    const std::int64_t rows = p.index_rows();
    const std::int32_t width = p.max_kv_blocks();
    if (scores.size() < static_cast<std::size_t>(rows * width)) {
      return status::error(status_code::shape_mismatch,
                           "scores has %zu floats, needs %lld (%lld index rows x %d max kv blocks)", scores.size(),
                           static_cast<long long>(rows * width), static_cast<long long>(rows), width);
    }
    SKIM_TRY(check_workspace(workspace, workspace_bytes(p)));
    workspace_arena arena(workspace);
    float* queries = take_queries(arena, p).data();
    std::int64_t row_base = 0;     // q_block_offset(b)
    std::int64_t first_block = 0;  // kv_block_offset(b)
    for (std::int32_t b = 0; b < p.batch(); ++b) {
      const float* seq_records = records.data() + first_block * l.block_floats();
      const std::int32_t nqb = p.q_blocks(b);
      for (std::int32_t i = 0; i < nqb; ++i) {
        for (std::int32_t h = 0; h < p.index_heads(); ++h) {
          const row_info r = make_row_info(p, row_base, b, i, h);
          score_unchecked<S>(p, r, q, seq_records, scores.subspan(static_cast<std::size_t>(r.row * width), width),
                             queries);
        }
      }
      row_base += nqb;
      first_block += p.kv_blocks(b);
    }
    return status::success();
  }

 private:
  [[nodiscard]] std::span<float> take_queries(workspace_arena& arena, const problem& p) const noexcept {
    // Any value will do for a problem validate() rejects, as long as computing it is safe.
    if (p.heads_q <= 0 || p.heads_kv <= 0 || p.head_dim <= 0 || p.block_q <= 0) return arena.take<float>(0);
    const std::size_t heads = p.scope == index_scope::kv_head ? static_cast<std::size_t>(p.heads_q / p.heads_kv) : 1;
    const std::size_t vectors = pool == query_pool::max ? static_cast<std::size_t>(p.block_q) : 1;
    // The queries, then one score per head for each of max_block_group blocks (score_unchecked's
    // group_scores), then the queries interleaved by four (q4: heads_per_row · head_dim floats).
    const auto d = static_cast<std::size_t>(p.head_dim);
    return arena.take<float>(heads * vectors * static_cast<std::size_t>(prepared_query_capacity(p.head_dim)) +
                             max_block_group * heads + heads * d);
  }

  // @pre everything score_row checks; queries is the take_queries span.
  template <summarizer S, element TQ>
  void score_unchecked(const problem& p, const row_info& r, const strided_view<const TQ>& q,
                       const float* seq_records, std::span<float> scores, float* queries) const noexcept {
    const std::int32_t d = p.head_dim;
    const std::int32_t heads = heads_per_row(p);
    const std::int32_t first_head = p.scope == index_scope::kv_head ? r.head * heads : r.head;  // query head
    const std::int32_t kv_head = p.scope == index_scope::kv_head ? r.head : r.head / p.group_size();
    const std::int64_t token0 = p.cu_seqlens_q[r.seq];
    const std::int32_t n_q = r.q_end - r.q_begin;  // >= 1 for a valid row
    const std::int32_t vectors = pool == query_pool::max ? n_q : 1;

    // 1. Pool: queries [heads, vectors, cap], fp32, then each prepared for S.
    const std::int64_t cap = prepared_query_capacity(d);
    for (std::int32_t g = 0; g < heads; ++g) {
      float* dst = queries + static_cast<std::int64_t>(g) * vectors * cap;
      if (pool != query_pool::max) {
        detail::pool_query(q, token0, r, first_head + g, d, pool == query_pool::mean, dst);
      } else {
        for (std::int32_t v = 0; v < vectors; ++v) {
          const TQ* src = q.row(token0 + r.q_begin + v, first_head + g);
          for (std::int32_t k = 0; k < d; ++k) dst[v * cap + k] = to_float(src[k]);
        }
      }
      for (std::int32_t v = 0; v < vectors; ++v) prepare_query<S>(dst + v * cap, d);
    }

    // 2. Score the visible blocks; -inf for the rest of the span.
    const std::int64_t rf = S::record_floats(d);
    const std::int64_t block_stride = static_cast<std::int64_t>(p.heads_kv) * rf;
    const float scale = p.scale();
    const auto record_of = [&](std::int32_t j) { return seq_records + j * block_stride + kv_head * rf; };
    // One vector per head (last, mean): the group's scores at once (score_group: four heads side by
    // side where S allows, score_group_blocks: several blocks too; the same bits), then reduced in
    // head order as below.
    float* group_scores = queries + static_cast<std::int64_t>(heads) * vectors * cap;  // [max_block_group][heads]
    float* q4 = group_scores + static_cast<std::int64_t>(max_block_group) * heads;
    // Block j's score from its heads' scores (one vector per head) or from its record (max pooling).
    const auto finish = [&](std::int32_t j, const float* record, const float* head_scores) {
      // With max pooling, query t scores block j only if it sees one of its keys: t + offset + 1 > j·bk.
      std::int32_t v_first = 0;
      if (pool == query_pool::max && p.mask == mask_kind::causal) {
        const std::int64_t t = static_cast<std::int64_t>(j) * p.block_kv - r.causal_offset;  // first query seeing j
        v_first = t > r.q_begin ? static_cast<std::int32_t>(t - r.q_begin) : 0;
      }
      float acc = reduce == group_reduce::max ? detail::neg_inf : 0.0f;
      for (std::int32_t g = 0; g < heads; ++g) {
        const float* head_queries = queries + static_cast<std::int64_t>(g) * vectors * cap;
        float s = detail::neg_inf;
        if (vectors == 1) {
          s = head_scores[g];
          s = s > detail::neg_inf ? s : detail::neg_inf;  // as the max over one score below (NaN -> -inf)
        }
        for (std::int32_t v = vectors == 1 ? vectors : v_first; v < vectors; ++v) {
          const float x = score_prepared<S>(record, head_queries + v * cap, d);
          s = x > s ? x : s;
        }
        if (reduce == group_reduce::max) {
          acc = s > acc ? s : acc;
        } else {
          acc += s;
        }
      }
      if (reduce == group_reduce::mean) acc /= static_cast<float>(heads);
      scores[j] = acc == detail::neg_inf ? detail::neg_inf : acc * scale;  // an empty record stays -inf
    };
    std::int32_t j = 0;
    if constexpr (scores_four_blocks<S>) {
      constexpr std::int32_t block_group = S::score4_blocks_per_call;
      static_assert(block_group >= 1 && block_group <= max_block_group);
      if (vectors == 1) {
        for (std::int32_t g = 0; g + 4 <= heads; g += 4) {
          summarize::detail::interleave4(queries + static_cast<std::int64_t>(g) * cap, cap, d,
                                         q4 + static_cast<std::int64_t>(g) * d);
        }
        // Records are [block, kv head, record]: one kv head's lie apart, a few to a page, and the
        // hardware prefetchers, which stop at page ends, keep losing them once they come from DRAM.
        // So decode asks for the records prefetch_blocks ahead into L2, a request per line (at
        // N = 32768 scoring took half the time; docs/performance.md, the engine's decode step).
        // Written in place: GCC 12 (-O1 and up) deletes the calls of a lambda that only prefetches.
        constexpr std::int32_t prefetch_blocks = 32;
        const std::int64_t record_bytes = rf * static_cast<std::int64_t>(sizeof(float));
        for (; j + block_group <= r.visible_blocks; j += block_group) {
          if (j + prefetch_blocks + block_group <= r.visible_blocks) {
            for (std::int32_t k = 0; k < block_group; ++k) {
              const char* ahead = reinterpret_cast<const char*>(record_of(j + prefetch_blocks + k));
              for (std::int64_t at = 0; at < record_bytes; at += 64) SKIM_PREFETCH_L2(ahead + at);
            }
          }
          const float* records[block_group];
          float* outs[block_group];
          for (std::int32_t k = 0; k < block_group; ++k) {
            records[k] = record_of(j + k);
            outs[k] = group_scores + static_cast<std::int64_t>(k) * heads;
          }
          score_group_blocks<S, block_group>(records, queries, cap, q4, heads, d, outs);
          for (std::int32_t k = 0; k < block_group; ++k) finish(j + k, records[k], outs[k]);
        }
      }
    }
    for (; j < r.visible_blocks; ++j) {
      if (vectors == 1) score_group<S>(record_of(j), queries, cap, heads, d, group_scores);
      finish(j, record_of(j), group_scores);
    }
    for (std::size_t t = static_cast<std::size_t>(r.visible_blocks); t < scores.size(); ++t) scores[t] = detail::neg_inf;
  }
};
static_assert(router<pooled_router, summarize::mean_pool>);
static_assert(router<pooled_router, summarize::max_bound>);

}  // namespace skim::route
