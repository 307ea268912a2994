#pragma once
// skim-llama's backends for the routing families that do not score block summaries (policy=skim
// with router=...):
//  - kmeans_backend (router=kmeans,clusters=C,probe=P,iterations=I): per layer, a k-means state of
//    the cached keys (route::kmeans), built over every key on the first call of a sequence and
//    appended to key by key after it; rows scored by route::kmeans_router, then the same
//    reserved<budgeted> selector and executor as the summary routers (budget, sink, local, recency).
//  - vertical_slash_backend (router=vertical_slash,columns=N,diagonals=N,last_q=N): a prefill
//    pattern. Calls of several queries (prefill, a question) run index::build_vertical_slash over
//    the call's queries and the cache and attend over its CSR; a call of one query (decode)
//    attends densely, as the pattern has no decode form (its estimate is one query's exact
//    attention). bq defaults to 64 for it; sink and local count blocks. It reads the cache as
//    contiguous rows (index::build_vertical_slash takes K as a strided view).
//  - tokens_backend (router=tokens): select::top_tokens scores every visible key with the row's
//    last query (fp32 q·k, the max over the row's query heads) and exec::token_gather attends over
//    the kept positions. The budget is a share of each row's visible keys (budget=S) or a count of
//    keys beyond the reserved ones (k=N); sink and local count tokens, not blocks.
// Each counts the (query, key) pairs it read as the block backends do (engine_stats). Each reads
// K/V as floats and refuses a quantised cache (kv=int8|fp8) with a status.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "eval/routers.hpp"
#include "llama/backend.hpp"
#include "llama/selectors.hpp"
#include "skim/exec/cpu/token_gather.hpp"
#include "skim/index/token_list.hpp"
#include "skim/route/kmeans.hpp"
#include "skim/select/reserved.hpp"
#include "skim/select/top_tokens.hpp"

namespace skim_llama::engine_detail {

template <class Exec>
struct kmeans_backend final : backend {
  using pipeline = skim_eval::kmeans_pipeline<skim::select::reserved<budgeted>, Exec>;
  shared_setup s;
  pipeline pipe;
  kmeans_backend(shared_setup s_, pipeline p) : s(s_), pipe(p) {}

  skim::status run(const attention_args& a, layer_state& st, engine_stats& stats) override {
    if (s.quantized()) return no_codes(s, "router=kmeans");
    const skim_eval::config& cfg = s.o->sparse;
    const call c(a, cfg.block_q(), cfg.block, cfg.scope, s.o->page_size, s.pages, s.page_table);
    pipeline p = pipe;
    p.state = &st.kmeans;
    st.kmeans.fit(c.p, p.clusters);
    st.reserve_ws(p.workspace_bytes(c.p));
    // The state follows the cache: built over every key of a fresh sequence, else appended to.
    if (st.clustered > a.n_kv - a.n_q) st.clustered = 0;  // the cache was reset
    skim::summaries_mode mode = skim::summaries_mode::kept;
    if (st.clustered == 0) {
      mode = skim::summaries_mode::build;
    } else if (st.clustered == a.n_kv - 1) {
      mode = skim::summaries_mode::append_newest;
    } else {
      for (std::int32_t t = st.clustered; t < a.n_kv; ++t) {
        SKIM_TRY(skim::route::kmeans::append(c.p, c.kv, {.seq = 0, .position = t, .sequence = st.kmeans.view(p.clusters)}));
      }
    }
    const skim::index::mutable_block_table table = st.selection(c.p, std::max(p.table_width(c.p), 1));
    skim::stage_times t;
    SKIM_TRY(p.run(skim::pipeline_args<float, skim::paged_kv<float>, float>{
                       .prob = c.p, .q = c.q, .kv = c.kv, .o = c.o, .lse = st.lse, .mode = mode, .selected = table},
                   st.ws.span(), &t));
    st.clustered = a.n_kv;
    stats.times += t;
    count_selection(stats, *s.o, c.p, table, a, st);
    return skim::status::success();
  }
};

template <class Exec>
struct vertical_slash_backend final : backend {
  using pipeline = skim_eval::vertical_slash_pipeline<Exec>;
  shared_setup s;
  pipeline pipe;
  dense_backend<Exec> decode;
  vertical_slash_backend(shared_setup s_, pipeline p) : s(s_), pipe(p), decode(s_) {}

  skim::status run(const attention_args& a, layer_state& st, engine_stats& stats) override {
    if (s.quantized()) return no_codes(s, "router=vertical_slash");
    if (a.n_q == 1) return decode.run(a, st, stats);
    const skim_eval::config& cfg = s.o->sparse;
    const call c(a, cfg.block_q(), cfg.block, cfg.scope, s.o->page_size, s.pages, s.page_table);
    pipeline p = pipe;
    p.csr = &st.csr;
    st.reserve_ws(p.workspace_bytes(c.p));
    const skim::index::mutable_block_table table = st.selection(c.p, std::max(p.table_width(c.p), 1));
    skim::stage_times t;
    // The pattern reads K as a strided view: the cache's rows, which the paged view maps one to one.
    const skim::contiguous_kv<float> kv{
        .k = skim::strided_view<const float>::token_major(a.k.data(), a.n_kv, a.heads_kv, a.head_dim),
        .v = skim::strided_view<const float>::token_major(a.v.data(), a.n_kv, a.heads_kv, a.head_dim)};
    SKIM_TRY(p.run(skim::pipeline_args<float, skim::contiguous_kv<float>, float>{
                       .prob = c.p, .q = c.q, .kv = kv, .o = c.o, .lse = st.lse, .selected = table},
                   st.ws.span(), &t));
    stats.times += t;
    count_selection(stats, *s.o, c.p, table, a, st);
    return skim::status::success();
  }
};

struct tokens_backend final : backend {
  shared_setup s;
  skim::exec::token_gather exec{};
  explicit tokens_backend(shared_setup s_) : s(s_) {}

  // Keys row r keeps beyond its reserved ones, under the budget of cfg (as budgeted::total does
  // for blocks: a share of the row's visible keys, reserved ones included, or k beyond them).
  [[nodiscard]] static std::int32_t scored_keys(const skim_eval::config& cfg, std::int32_t visible) {
    const std::int32_t reserved = std::min(visible, cfg.sink + cfg.local);
    if (cfg.k) return std::max(*cfg.k, 0);
    const double v = visible, share = cfg.budget.value_or(1.0);
    const auto total = static_cast<std::int32_t>(std::ceil(share * v - budgeted::share_slack * v));
    return std::max(total - reserved, 0);
  }

  skim::status run(const attention_args& a, layer_state& st, engine_stats& stats) override {
    if (s.quantized()) return no_codes(s, "router=tokens");
    const skim_eval::config& cfg = s.o->sparse;
    const call c(a, cfg.block_q(), 1, cfg.scope, s.o->page_size, s.pages, s.page_table);
    const skim::select::top_tokens widest{.t = scored_keys(cfg, a.n_kv), .sink = cfg.sink, .window = cfg.local};
    const std::int32_t width = std::max(widest.max_count(c.p), 1);
    const auto rows = static_cast<std::size_t>(c.p.index_rows());
    st.positions.resize(rows * static_cast<std::size_t>(width));
    st.count.resize(rows);
    st.reserve_ws(std::max(widest.workspace_bytes(c.p), exec.workspace_bytes(c.p)));
    const auto t0 = std::chrono::steady_clock::now();
    SKIM_TRY(skim::for_each_row(c.p, [&](const skim::row_info& r) -> skim::status {
      const skim::select::top_tokens sel{.t = scored_keys(cfg, skim::index::row_visible_keys(r, c.p.mask)),
                                         .sink = cfg.sink, .window = cfg.local};
      const std::span<std::int32_t> out =
          std::span(st.positions).subspan(static_cast<std::size_t>(r.row) * width, static_cast<std::size_t>(width));
      std::int32_t n = 0;
      SKIM_TRY(sel.select_row(c.p, r, c.q, c.kv, out, n, st.ws.span()));
      st.count[static_cast<std::size_t>(r.row)] = n;
      return skim::status::success();
    }));
    const auto t1 = std::chrono::steady_clock::now();
    const skim::index::token_list list{st.positions, st.count, width};
    SKIM_TRY(exec.run(skim::exec::token_attention_args<float, skim::paged_kv<float>, float>{
                          .prob = c.p, .q = c.q, .kv = c.kv, .tokens = list, .o = c.o},
                      st.ws.span()));
    stats.times.score += std::chrono::duration<double>(t1 - t0).count();
    stats.times.execute += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    count_token_reads(stats, c.p, list, a);
    return skim::status::success();
  }

  // (query, kv head, key) triples read: each query of a row reads the listed keys it sees; under
  // index_scope::query_head the distinct keys of a group's rows are what it loads (kv_read).
  void count_token_reads(engine_stats& stats, const skim::problem& p, skim::index::token_list list,
                         const attention_args& a) {
    const std::int32_t group = p.group_size();
    const bool per_head = p.scope == skim::index_scope::query_head;
    std::vector<char> mark(per_head ? static_cast<std::size_t>(a.n_kv) : 0);
    double pairs = 0, distinct = 0;
    (void)skim::for_each_row(p, [&](const skim::row_info& r) {
      const std::span<const std::int32_t> keys = list.row(r);
      if (per_head && r.head % group == 0) std::fill(mark.begin(), mark.end(), 0);
      for (std::int32_t qi = r.q_begin; qi < r.q_end; ++qi) {
        const std::int32_t vis = r.visible_keys(qi, p.mask);
        const auto seen = static_cast<double>(std::lower_bound(keys.begin(), keys.end(), vis) - keys.begin());
        pairs += per_head ? seen / group : seen;
      }
      if (!per_head) return;
      for (const std::int32_t j : keys) mark[static_cast<std::size_t>(j)] = 1;
      if (r.head % group != group - 1) return;
      for (std::int32_t qi = r.q_begin; qi < r.q_end; ++qi) {
        const std::int32_t vis = r.visible_keys(qi, p.mask);
        for (std::int32_t j = 0; j < vis; ++j) distinct += mark[static_cast<std::size_t>(j)];
      }
    });
    stats.pairs_read += pairs;
    stats.kv_read += per_head ? distinct : pairs;
    stats.pairs_causal += pairs_causal(a);
  }
};

}  // namespace skim_llama::engine_detail
