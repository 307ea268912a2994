#pragma once
// Pipelines for the routers that do not score block summaries, shared by skim-eval and skim-llama:
// each has the members evaluate() (run.hpp) reads from a skim::sparse_attention (can_implement,
// summary_floats, table_width, selected_rows, workspace_bytes, run, share_heads), so every
// configuration is measured and timed the same way. Selector and executor are template parameters
// (skim-eval: reserved<top_k> and the scalar executor; skim-llama: its budgeted selector and its
// executor).
//
//  - kmeans_pipeline: stage 1 keeps the k-means state of the keys as pipeline_args::mode says
//    (build: route::kmeans::build over every key; append_newest: route::kmeans::append_newest;
//    kept: the caller brought it up to date), stage 2 scores each row with route::kmeans_router,
//    stage 3 selects as the summary pipelines do, stage 5 attends over the table.
//  - vertical_slash_pipeline: index::build_vertical_slash estimates the pattern and writes a CSR
//    (reported as the score stage), converted to the block table evaluate() measures (the select
//    stage), then the same execution.
//  - tokens_pipeline: over blocks of one key, select::top_tokens writes its token list straight into
//    the block table evaluate() measures (a position is then a block id: the same rows), reported as
//    the score stage, and exec::token_gather attends over it.
// Their state (centroids, counts, membership; the CSR) lives in storage the caller keeps for the
// configuration's run, grown by run() when a shape needs more (a tool's convenience: an engine
// sizes it once); summary_floats is 0 (pipeline_args::summaries goes unused).

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "skim/core/attention_args.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"
#include "skim/core/workspace.hpp"
#include "skim/exec/cpu/scalar.hpp"
#include "skim/exec/cpu/token_gather.hpp"
#include "skim/index/block_csr.hpp"
#include "skim/index/block_table.hpp"
#include "skim/index/convert.hpp"
#include "skim/index/token_list.hpp"
#include "skim/index/vertical_slash.hpp"
#include "skim/pipeline.hpp"
#include "skim/route/kmeans_router.hpp"
#include "skim/select/reserved.hpp"
#include "skim/select/top_k.hpp"
#include "skim/select/top_tokens.hpp"

namespace skim_eval {

namespace detail {
[[nodiscard]] inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace detail

// The k-means state of kmeans_pipeline (route::kmeans::layout: a batch state, or one sequence's
// with membership room for the blocks still to come).
struct kmeans_storage {
  std::vector<float> centroids;
  std::vector<std::int32_t> counts, membership;
  // Grows the spans to the layout of (p, clusters), keeping what they hold (membership is
  // block-major, so a sequence's existing blocks stay where they are).
  void fit(const skim::problem& p, std::int32_t clusters) {
    const skim::route::kmeans::layout l = skim::route::kmeans::make_layout(p, clusters);
    grow(centroids, l.centroid_floats());
    grow(counts, l.count_entries());
    grow(membership, l.membership_entries());
  }
  [[nodiscard]] skim::route::kmeans::state view(std::int32_t clusters) {
    return {clusters, centroids, counts, membership};
  }

 private:
  template <class T>
  static void grow(std::vector<T>& v, std::int64_t n) {
    if (v.size() < static_cast<std::size_t>(n)) v.resize(static_cast<std::size_t>(n));
  }
};

struct vertical_slash_storage {
  std::vector<std::int32_t> row_ptr, col_idx;
};

template <class Selector = skim::select::reserved<skim::select::top_k>, class Executor = skim::exec::scalar>
struct kmeans_pipeline {
  skim::route::kmeans_router router{};
  Selector selector{};
  skim::route::kmeans::options build_options{};
  std::int32_t clusters = 32;
  Executor executor{};
  kmeans_storage* state = nullptr;  // grown by run() to the problem's layout
  static constexpr bool share_heads = false;
  [[nodiscard]] std::int64_t summary_floats(const skim::problem&) const noexcept { return 0; }
  [[nodiscard]] std::int32_t table_width(const skim::problem& p) const noexcept {
    return skim::select::max_count(selector, p);
  }
  [[nodiscard]] std::int64_t selected_rows(const skim::problem& p) const noexcept { return p.index_rows(); }

  [[nodiscard]] std::size_t workspace_bytes(const skim::problem& p) const noexcept {
    if (!skim::validate(p).ok()) return 0;
    skim::workspace_arena route_select;  // the takes of run(), in order
    (void)route_select.take<float>(static_cast<std::size_t>(p.max_kv_blocks()));
    (void)route_select.take<std::byte>(router.workspace_bytes(p, clusters));
    (void)route_select.take<std::byte>(selector.workspace_bytes(p.max_kv_blocks()));
    return std::max({skim::route::kmeans::build_workspace_bytes(p, clusters), route_select.bytes(),
                     executor.workspace_bytes(p)});
  }

  [[nodiscard]] skim::status can_implement(const skim::problem& p) const noexcept {
    SKIM_TRY(skim::validate(p));
    SKIM_TRY(selector.validate());
    SKIM_TRY(build_options.validate());
    SKIM_TRY(router.can_implement(p));
    return executor.can_implement(p);
  }

  template <class TQ, class KV, class TO>
  [[nodiscard]] skim::status run(const skim::pipeline_args<TQ, KV, TO>& a, std::span<std::byte> workspace,
                                 skim::stage_times* times) const noexcept {
    using clock = std::chrono::steady_clock;
    const skim::problem& p = a.prob;
    SKIM_TRY(can_implement(p));
    const skim::route::kmeans::layout l = skim::route::kmeans::make_layout(p, clusters);
    state->fit(p, clusters);
    const skim::route::kmeans::state s = state->view(clusters);
    skim::stage_times t;

    auto t0 = clock::now();
    switch (a.mode) {
      case skim::summaries_mode::build: SKIM_TRY(skim::route::kmeans::build(p, a.kv, build_options, s, workspace)); break;
      case skim::summaries_mode::append_newest: {
        if (p.batch() != 1) {
          return skim::status::error(skim::status_code::invalid_argument,
                                     "kmeans_pipeline appends one sequence's key, got a batch of %d", p.batch());
        }
        SKIM_TRY(skim::route::kmeans::append_newest(p, a.kv, std::span<const skim::route::kmeans::state>(&s, 1)));
        break;
      }
      case skim::summaries_mode::kept: break;
    }
    t.summarize = detail::seconds_since(t0);

    skim::workspace_arena arena(workspace);
    const std::span<float> scores = arena.take<float>(static_cast<std::size_t>(p.max_kv_blocks()));
    const std::span<std::byte> route_ws = arena.take<std::byte>(router.workspace_bytes(p, clusters));
    const std::span<std::byte> select_ws = arena.take<std::byte>(selector.workspace_bytes(p.max_kv_blocks()));
    const std::int32_t width = a.selected.width, stride = p.max_kv_blocks();
    SKIM_TRY(skim::for_each_row(p, [&](const skim::row_info& r) noexcept -> skim::status {
      auto ts = clock::now();
      SKIM_TRY(router.score_row(p, r, a.q, l.sequence(skim::route::kmeans::const_state(s), r.seq), scores, route_ws));
      auto tm = clock::now();
      const std::span<std::int32_t> ids =
          a.selected.ids.subspan(static_cast<std::size_t>(r.row) * static_cast<std::size_t>(width),
                                 static_cast<std::size_t>(width));
      const skim::row_scores in{.row = r,
                                .scores = scores,
                                .prior = a.prior.empty() ? std::span<const float>{}
                                                         : a.prior.subspan(static_cast<std::size_t>(r.row * stride),
                                                                           static_cast<std::size_t>(stride))};
      std::int32_t count = 0;
      SKIM_TRY(selector.select_row(in, ids, count, select_ws));
      std::fill(ids.begin() + count, ids.end(), skim::index::mutable_block_table::pad);
      a.selected.count[static_cast<std::size_t>(r.row)] = count;
      t.score += std::chrono::duration<double>(tm - ts).count();
      t.select += detail::seconds_since(tm);
      return skim::status::success();
    }));

    t0 = clock::now();
    const skim::index::block_table selected = a.selected;
    SKIM_TRY(executor.run(skim::attention_args<TQ, KV, skim::index::block_table, TO>{
                              .prob = p, .q = a.q, .kv = a.kv, .index = selected, .o = a.o, .lse = a.lse},
                          workspace));
    t.execute = detail::seconds_since(t0);
    if (times != nullptr) *times = t;
    return skim::status::success();
  }
};

template <class Executor = skim::exec::scalar>
struct vertical_slash_pipeline {
  skim::index::vertical_slash_options options{};
  Executor executor{};
  vertical_slash_storage* csr = nullptr;  // grown by run()
  static constexpr bool share_heads = false;

  [[nodiscard]] std::int64_t summary_floats(const skim::problem&) const noexcept { return 0; }
  [[nodiscard]] std::int32_t table_width(const skim::problem& p) const noexcept { return p.max_kv_blocks(); }
  [[nodiscard]] std::int64_t selected_rows(const skim::problem& p) const noexcept { return p.index_rows(); }
  [[nodiscard]] std::size_t workspace_bytes(const skim::problem& p) const noexcept {
    if (!skim::validate(p).ok()) return 0;
    return std::max(skim::index::vertical_slash_workspace_bytes(p, options), executor.workspace_bytes(p));
  }
  [[nodiscard]] skim::status can_implement(const skim::problem& p) const noexcept {
    SKIM_TRY(skim::validate(p));
    SKIM_TRY(options.validate());
    return executor.can_implement(p);
  }

  template <class TQ, class KV, class TO>
  [[nodiscard]] skim::status run(const skim::pipeline_args<TQ, KV, TO>& a, std::span<std::byte> workspace,
                                 skim::stage_times* times) const noexcept {
    using clock = std::chrono::steady_clock;
    const skim::problem& p = a.prob;
    SKIM_TRY(can_implement(p));
    const auto rows = static_cast<std::size_t>(p.index_rows()) + 1;
    const auto ids = static_cast<std::size_t>(skim::index::vertical_slash_capacity(p, options));
    if (csr->row_ptr.size() < rows) csr->row_ptr.resize(rows);
    if (csr->col_idx.size() < ids) csr->col_idx.resize(ids);
    const std::span<std::int32_t> row_ptr = std::span(csr->row_ptr).first(rows), col_idx = std::span(csr->col_idx).first(ids);
    skim::stage_times t;

    auto t0 = clock::now();
    SKIM_TRY(skim::index::build_vertical_slash(p, a.q, a.kv.k, options,
                                               skim::index::mutable_block_csr{row_ptr, col_idx}, workspace));
    t.score = detail::seconds_since(t0);

    t0 = clock::now();
    const skim::index::block_csr index{row_ptr, col_idx};
    SKIM_TRY(skim::index::to_block_table(p, index, a.selected.width, a.selected.ids, a.selected.count));
    t.select = detail::seconds_since(t0);

    t0 = clock::now();
    SKIM_TRY(executor.run(skim::attention_args<TQ, KV, skim::index::block_csr, TO>{
                              .prob = p, .q = a.q, .kv = a.kv, .index = index, .o = a.o, .lse = a.lse},
                          workspace));
    t.execute = detail::seconds_since(t0);
    if (times != nullptr) *times = t;
    return skim::status::success();
  }
};

struct tokens_pipeline {
  skim::select::top_tokens selector{};
  skim::exec::token_gather executor{};
  static constexpr bool share_heads = false;

  [[nodiscard]] std::int64_t summary_floats(const skim::problem&) const noexcept { return 0; }
  [[nodiscard]] std::int32_t table_width(const skim::problem& p) const noexcept {
    return std::max(selector.max_count(p), 1);
  }
  [[nodiscard]] std::int64_t selected_rows(const skim::problem& p) const noexcept { return p.index_rows(); }
  [[nodiscard]] std::size_t workspace_bytes(const skim::problem& p) const noexcept {
    if (!skim::validate(p).ok()) return 0;
    return std::max(selector.workspace_bytes(p), executor.workspace_bytes(p));
  }
  [[nodiscard]] skim::status can_implement(const skim::problem& p) const noexcept {
    SKIM_TRY(skim::validate(p));
    SKIM_TRY(selector.validate());
    if (p.block_kv != 1) {
      return skim::status::error(skim::status_code::unsupported, "tokens_pipeline needs block_kv 1, got %d", p.block_kv);
    }
    return skim::status::success();
  }

  template <class TQ, class KV, class TO>
  [[nodiscard]] skim::status run(const skim::pipeline_args<TQ, KV, TO>& a, std::span<std::byte> workspace,
                                 skim::stage_times* times) const noexcept {
    using clock = std::chrono::steady_clock;
    const skim::problem& p = a.prob;
    SKIM_TRY(can_implement(p));
    skim::stage_times t;
    auto t0 = clock::now();
    SKIM_TRY(selector.select(p, a.q, a.kv, skim::index::mutable_token_list{a.selected.ids, a.selected.count, a.selected.width},
                             workspace));
    t.score = detail::seconds_since(t0);
    t0 = clock::now();
    const skim::index::token_list list{a.selected.ids, a.selected.count, a.selected.width};
    SKIM_TRY(executor.run(skim::exec::token_attention_args<TQ, KV, TO>{
                              .prob = p, .q = a.q, .kv = a.kv, .tokens = list, .o = a.o, .lse = a.lse},
                          workspace));
    t.execute = detail::seconds_since(t0);
    if (times != nullptr) *times = t;
    return skim::status::success();
  }
};

}  // namespace skim_eval
