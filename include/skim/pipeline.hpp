#pragma once
// sparse_attention<Summarizer, Router, Selector, Executor>: the five stages composed (docs/design.md §1).
//
//   1 summarize  block summaries of K          (build them, append the newest key, or take them as kept)
//   2 score      one logit per candidate block  (Router, per index row)
//   3 select     sorted unique block ids        (Selector, per index row, into a block_table)
//   4 describe   the block_table the caller owns (and can read back: metrics, eviction, debugging)
//   5 execute    exact attention over exactly those blocks (Executor)
//
// The same call serves prefill (many query blocks per sequence; summaries built from the K cache)
// and decode (one query per sequence; the engine appends each new key's summary, or asks the call
// to append the newest key of every sequence). Stage times are reported on request, so a step
// where the index costs more than the attention shows at a glance.
//
// Query, then run — nothing allocates in run():
//   skim::sparse_attention<summarize::max_bound, route::pooled_router, select::reserved<select::top_k>,
//                          exec::scalar> sparse{.router = {...}, .selector = {...}};
//   summaries: summary_floats(p) floats, kept beside the KV cache across decode steps;
//   selected:  a mutable_block_table of selected_rows(p) rows × table_width(p) ids;
//   workspace: workspace_bytes(p) bytes (skim::workspace_buffer), reused by every call.
//
// Scores and selections run row by row (one row of scores in the workspace, not the whole
// [rows, blocks] matrix), so prefill at long context needs O(max_kv_blocks) scratch for them.
//
// share_heads: one selection per query block for all its index heads instead of one per head. The
// heads' scores are pooled by their maximum (a block any head rates high stays a candidate), by
// default after each head's scores are taken relative to its own best block (head_pool::relative:
// heads whose scores differ in scale get their best blocks alike, where with the raw maximum a loud
// head takes the budget; a threshold selector then compares tau with scores <= 0). The selector
// chooses once per query block into a table of total_q_blocks() rows, and the executor reads it
// through index::head_shared: exec::simd then runs decode rows fused and reads token-major K/V rows
// whole (docs/performance.md). Every head attends over the same blocks: fewer distinct bytes, less
// per-head fit. A selector prior is per head, so share_heads takes none.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>

#include "skim/concepts/block_index.hpp"
#include "skim/concepts/selector.hpp"
#include "skim/concepts/summarizer.hpp"
#include "skim/core/attention_args.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"
#include "skim/core/views.hpp"
#include "skim/core/workspace.hpp"
#include "skim/index/block_table.hpp"
#include "skim/index/head_shared.hpp"
#include "skim/route/head_pool.hpp"
#include "skim/select/select_all.hpp"
#include "skim/summarize/build.hpp"

namespace skim {

// Seconds spent per stage in one run (describe is part of select: the ids are written as chosen).
struct stage_times {
  double summarize = 0.0;
  double score = 0.0;
  double select = 0.0;
  double execute = 0.0;
  [[nodiscard]] constexpr double total() const noexcept { return summarize + score + select + execute; }
  constexpr stage_times& operator+=(const stage_times& o) noexcept {
    summarize += o.summarize;
    score += o.score;
    select += o.select;
    execute += o.execute;
    return *this;
  }
};

// What stage 1 does with the summaries span.
enum class summaries_mode : std::uint8_t {
  build,          // summarise the whole K cache (prefill, or summaries not kept between calls)
  append_newest,  // add each sequence's newest key (a decode step; the rest are kept from before)
  kept,           // the caller keeps them current (e.g. summarize::append as tokens arrive)
};

template <element TQ, kv_source KV, element TO = TQ>
struct pipeline_args {
  problem prob;
  strided_view<const TQ> q;  // [tokens_q, heads_q, head_dim]
  KV kv;                     // K, V: contiguous or paged
  strided_view<TO> o;        // [tokens_q, heads_q, head_dim]
  std::span<float> lse{};    // [tokens_q * heads_q] token-major, or empty
  std::span<float> summaries{};                     // [summary_floats(prob)], see summarize/build.hpp
  summaries_mode mode = summaries_mode::build;
  std::span<const float> prior{};                   // [index_rows, max_kv_blocks] or empty (selector's prior)
  index::mutable_block_table selected{};            // [selected_rows, table_width] ids + counts: out
};

template <summarizer Summarizer, class Router, selector Selector, class Executor>
struct sparse_attention {
  Router router{};
  Selector selector{};
  Executor executor{};
  bool share_heads = false;                 // one selection per query block for all its heads (see the header)
  head_pool pool = head_pool::relative;     // with share_heads: how the heads' scores are pooled

  // Floats of the batch's block summaries.
  [[nodiscard]] std::int64_t summary_floats(const problem& p) const noexcept {
    return summarize::make_summary_layout<Summarizer>(p).floats();
  }
  // Ids per row of the selected block_table: the most the selector can choose for any row.
  [[nodiscard]] std::int32_t table_width(const problem& p) const noexcept { return select::max_count(selector, p); }
  // Rows of the selected block_table: one per index row, or one per query block with share_heads.
  [[nodiscard]] std::int64_t selected_rows(const problem& p) const noexcept {
    return share_heads ? p.total_q_blocks() : p.index_rows();
  }

  // Scratch of run(): the largest of the stages' needs (they run one after another), where the
  // score/select stage holds one row of scores next to the router's and selector's scratch.
  [[nodiscard]] std::size_t workspace_bytes(const problem& p) const noexcept {
    if (!validate(p).ok()) return 0;  // run() rejects it before touching the workspace
    const std::size_t summarize_bytes = summarize::workspace_bytes<Summarizer>(p);
    workspace_arena route_select;  // the same takes as run(), in the same order (each one is aligned)
    (void)route_select.take<float>(static_cast<std::size_t>(p.max_kv_blocks()));
    (void)route_select.take<float>(share_heads ? static_cast<std::size_t>(p.max_kv_blocks()) : 0);
    (void)route_select.take<std::byte>(router.workspace_bytes(p));
    (void)route_select.take<std::byte>(selector.workspace_bytes(p.max_kv_blocks()));
    const std::size_t execute_bytes = executor.workspace_bytes(p);
    return std::max({summarize_bytes, route_select.bytes(), execute_bytes});
  }

  [[nodiscard]] status can_implement(const problem& p) const noexcept {
    SKIM_TRY(validate(p));
    SKIM_TRY(selector.validate());
    SKIM_TRY(router.can_implement(p));
    return executor.can_implement(p);
  }

  // Runs the five stages. @post on success: a.selected holds the canonical index that was
  // executed, a.o (and a.lse) the attention over exactly those blocks, *times the stage times.
  template <element TQ, kv_source KV, element TO>
  [[nodiscard]] status run(const pipeline_args<TQ, KV, TO>& a, std::span<std::byte> workspace,
                           stage_times* times = nullptr) const noexcept {
    using clock = std::chrono::steady_clock;
    const problem& p = a.prob;
    SKIM_TRY(can_implement(p));
    SKIM_TRY(check_view(a.q, p.tokens_q(), p.heads_q, p.head_dim, "Q"));
    SKIM_TRY(a.kv.validate(p));
    SKIM_TRY(check_sizes(a));
    SKIM_TRY(check_workspace(workspace, workspace_bytes(p)));
    stage_times t;

    // 1 summarize
    auto t0 = clock::now();
    SKIM_TRY(summarize_stage(a, workspace));
    t.summarize = seconds(t0, clock::now());

    // 2 score and 3 select, row by row; 4 the ids land in the caller's block_table.
    workspace_arena arena(workspace);
    const std::span<float> scores = arena.take<float>(static_cast<std::size_t>(p.max_kv_blocks()));
    const std::span<float> pooled = arena.take<float>(share_heads ? static_cast<std::size_t>(p.max_kv_blocks()) : 0);
    const std::span<std::byte> route_ws = arena.take<std::byte>(router.workspace_bytes(p));
    const std::span<std::byte> select_ws = arena.take<std::byte>(selector.workspace_bytes(p.max_kv_blocks()));
    const summarize::summary_layout layout = summarize::make_summary_layout<Summarizer>(p);
    const std::int32_t width = a.selected.width;
    const std::int32_t stride = p.max_kv_blocks();
    std::int64_t seq_first_block = 0;
    std::int32_t seq_of_first_block = 0;
    const status rows = for_each_row(p, [&](const row_info& r) noexcept -> status {
      for (; seq_of_first_block < r.seq; ++seq_of_first_block) seq_first_block += p.kv_blocks(seq_of_first_block);
      const std::span<const float> seq_records =
          std::span<const float>(a.summaries).subspan(static_cast<std::size_t>(seq_first_block * layout.block_floats()),
                                                      static_cast<std::size_t>(layout.sequence_floats(r.seq)));
      auto ts = clock::now();
      SKIM_TRY(router.template score_row<Summarizer>(p, r, a.q, seq_records, scores, route_ws));
      std::int64_t out_row = r.row;
      std::span<const float> chosen_from = scores;
      if (share_heads) {  // pool the query block's heads (rows h = 0 .. index_heads - 1 come in order)
        const auto visible = static_cast<std::size_t>(r.visible_blocks);
        pool_head_scores(pool, r.head, scores.first(visible), pooled.first(visible));
        if (r.head + 1 < p.index_heads()) {
          t.score += seconds(ts, clock::now());
          return status::success();
        }
        out_row = r.row / p.index_heads();
        chosen_from = pooled;
      }
      auto tm = clock::now();
      const std::span<std::int32_t> ids =
          a.selected.ids.subspan(static_cast<std::size_t>(out_row) * static_cast<std::size_t>(width),
                                 static_cast<std::size_t>(width));
      const row_scores in{.row = r,
                          .scores = chosen_from,
                          .prior = a.prior.empty() ? std::span<const float>{}
                                                   : a.prior.subspan(static_cast<std::size_t>(r.row * stride),
                                                                     static_cast<std::size_t>(stride))};
      std::int32_t count = 0;
      SKIM_TRY(selector.select_row(in, ids, count, select_ws));
      std::fill(ids.begin() + count, ids.end(), index::mutable_block_table::pad);
      a.selected.count[static_cast<std::size_t>(out_row)] = count;
      auto te = clock::now();
      t.score += seconds(ts, tm);
      t.select += seconds(tm, te);
      return status::success();
    });
    SKIM_TRY(rows);

    // 5 execute over exactly the selected blocks.
    t0 = clock::now();
    const auto execute = [&]<class Index>(const Index& index) {
      return executor.run(attention_args<TQ, KV, Index, TO>{.prob = p, .q = a.q, .kv = a.kv, .index = index,
                                                            .o = a.o, .lse = a.lse},
                          workspace);
    };
    const index::block_table selected = a.selected;
    SKIM_TRY(share_heads ? execute(index::head_shared<index::block_table>{selected, p.index_heads()})
                         : execute(selected));
    t.execute = seconds(t0, clock::now());
    if (times != nullptr) *times = t;
    return status::success();
  }

 private:
  [[nodiscard]] static double seconds(std::chrono::steady_clock::time_point a,
                                      std::chrono::steady_clock::time_point b) noexcept {
    return std::chrono::duration<double>(b - a).count();
  }

  template <class Args>
  [[nodiscard]] status check_sizes(const Args& a) const noexcept {
    const problem& p = a.prob;
    const std::int64_t need = summary_floats(p);
    if (static_cast<std::int64_t>(a.summaries.size()) < need) {
      return status::error(status_code::shape_mismatch, "summaries has %zu floats, needs %lld", a.summaries.size(),
                           static_cast<long long>(need));
    }
    const std::int64_t rows = selected_rows(p);
    const std::int32_t width = table_width(p);
    if (a.selected.width < width) {
      return status::error(status_code::shape_mismatch, "selected block_table width %d < %d the selector may choose",
                           a.selected.width, width);
    }
    if (static_cast<std::int64_t>(a.selected.count.size()) != rows ||
        static_cast<std::int64_t>(a.selected.ids.size()) != rows * a.selected.width) {
      return status::error(status_code::shape_mismatch,
                           "selected block_table has %zu counts and %zu ids, needs %lld rows x width %d",
                           a.selected.count.size(), a.selected.ids.size(), static_cast<long long>(rows),
                           a.selected.width);
    }
    if (share_heads && !a.prior.empty()) {
      return status::error(status_code::unsupported, "share_heads takes no prior (it has %zu floats): a prior is per "
                           "index head", a.prior.size());
    }
    if (!a.prior.empty() && static_cast<std::int64_t>(a.prior.size()) != rows * p.max_kv_blocks()) {
      return status::error(status_code::shape_mismatch, "prior has %zu floats, needs %lld rows x %d kv blocks",
                           a.prior.size(), static_cast<long long>(rows), p.max_kv_blocks());
    }
    return status::success();
  }

  template <class Args>
  [[nodiscard]] status summarize_stage(const Args& a, std::span<std::byte> workspace) const noexcept {
    const problem& p = a.prob;
    switch (a.mode) {
      case summaries_mode::build:
        return summarize::build<Summarizer>(p, a.kv, a.summaries, workspace);
      case summaries_mode::append_newest: {
        const summarize::summary_layout layout = summarize::make_summary_layout<Summarizer>(p);
        std::int64_t first = 0;
        for (std::int32_t b = 0; b < p.batch(); ++b) {
          const std::int32_t n = p.seq_len_kv(b);
          if (n > 0) {
            const summarize::append_site site{
                .seq = b,
                .position = n - 1,
                .records = a.summaries.subspan(static_cast<std::size_t>(first),
                                               static_cast<std::size_t>(layout.sequence_floats(b)))};
            SKIM_TRY(summarize::append<Summarizer>(p, a.kv, site, workspace));
          }
          first += layout.sequence_floats(b);
        }
        return status::success();
      }
      case summaries_mode::kept:
        return status::success();
    }
    return status::error(status_code::invalid_argument, "summaries mode %d unknown", static_cast<int>(a.mode));
  }
};

}  // namespace skim
