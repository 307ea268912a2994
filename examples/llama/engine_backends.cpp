// skim-llama's attention backends (engine.hpp's engine_detail::make_backends): the routed, oracle
// and evicting backends, and the factory that picks one per engine_options. Every summarizer,
// selector and executor the options can name is instantiated here, so this file holds most of the
// engine's build time; a program links it once (the skim_llama_backends library, or the test
// binary's own copy) instead of compiling it in each file that includes engine.hpp.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "llama/engine.hpp"
#include "llama/block_mass.hpp"
#include "llama/family_backends.hpp"
#include "llama/selectors.hpp"
#include "skim/evict/attention_mass.hpp"
#include "skim/evict/rank.hpp"
#include "skim/evict/recency.hpp"
#include "skim/evict/summary_score.hpp"
#include "skim/index/causal_all.hpp"
#include "skim/pipeline.hpp"
#include "skim/route/pooled_router.hpp"
#include "skim/select/reserved.hpp"
#include "skim/select/threshold.hpp"
#include "skim/summarize/build.hpp"
#include "skim/summarize/lsh_buckets.hpp"
#include "skim/summarize/max_bound.hpp"
#include "skim/summarize/mean_pool.hpp"
#include "skim/summarize/multi_centroid.hpp"
#include "skim/summarize/probe_max.hpp"

namespace skim_llama {

namespace engine_detail {

// Brings the layer's summaries up to n_kv keys; returns the mode for the pipeline.
template <class S>
[[nodiscard]] skim::status update_summaries(const call& c, layer_state& st, std::int32_t n_kv, std::int32_t n_q,
                                            skim::summaries_mode& mode) {
  if (st.summarized == 0 && n_kv == n_q) {
    mode = skim::summaries_mode::build;
  } else if (st.summarized == n_kv - 1) {
    mode = skim::summaries_mode::append_newest;
  } else {
    for (std::int32_t t = st.summarized; t < n_kv; ++t) {
      SKIM_TRY(skim::summarize::append<S>(c.p, c.kv, {.seq = 0, .position = t, .records = st.summaries}, st.ws.span()));
    }
    mode = skim::summaries_mode::kept;
  }
  st.summarized = n_kv;
  return skim::status::success();
}

template <class S, class Dyn, class Exec>
struct sparse_backend final : backend {
  using pipeline = skim::sparse_attention<S, skim::route::pooled_router, skim::select::reserved<Dyn>, Exec>;
  shared_setup s;
  pipeline pipe;
  sparse_backend(shared_setup s_, pipeline p) : s(s_), pipe(p) {}
  skim::status run(const attention_args& a, layer_state& st, engine_stats& stats) override {
    const skim_eval::config& cfg = s.o->sparse;
    const call c(a, cfg.block_q(), cfg.block, cfg.scope, s.o->page_size, s.pages, s.page_table);
    if (st.summaries.empty()) {
      st.summaries.resize(static_cast<std::size_t>(s.max_blocks) * a.heads_kv * S::record_floats(a.head_dim));
    }
    st.reserve_ws(std::max(pipe.workspace_bytes(c.p), skim::summarize::workspace_bytes<S>(c.p)));
    if (st.summarized > a.n_kv - a.n_q) st.summarized = 0;  // the cache was reset
    const skim::index::mutable_block_table table = st.selection(c.p, std::max(pipe.table_width(c.p), 1));
    const auto rows = static_cast<std::size_t>(c.p.index_rows());
    // The previous layer's mass of each block is this layer's prior (importance > 0); layer 0 has none.
    const bool prior = pipe.selector.importance > 0.0f;
    const bool have_prior = prior && a.layer > 0 && carried.size() == rows * static_cast<std::size_t>(c.p.max_kv_blocks());
    pipeline p = pipe;
    if (!have_prior) p.selector.importance = 0.0f;
    const std::span<const float> prior_span = have_prior ? std::span<const float>(carried) : std::span<const float>{};
    skim::stage_times t;
    if (!s.quantized()) {
      skim::summaries_mode mode{};
      SKIM_TRY(update_summaries<S>(c, st, a.n_kv, a.n_q, mode));
      const skim::pipeline_args<float, skim::paged_kv<float>, float> args{
          .prob = c.p, .q = c.q, .kv = c.kv, .o = c.o, .lse = st.lse, .summaries = st.summaries, .mode = mode,
          .prior = prior_span, .selected = table};
      SKIM_TRY(p.run(args, st.ws.span(), &t));
    } else {
      SKIM_TRY(with_kv<Exec>(s, a, c, [&]<class KV>(const KV& kv) -> skim::status {
        if constexpr (skim::is_quantized_kv<KV>) {
          const auto t0 = std::chrono::steady_clock::now();
          SKIM_TRY(summarize_codes(c, a, st));
          t.summarize = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          // Summaries kept (just brought up to date from the dequantised keys), so the pipeline reads
          // no keys from its source (an empty window ending at n_kv); it attends over the codes.
          const skim::sparse_attention<S, skim::route::pooled_router, skim::select::reserved<Dyn>, codes_executor<Exec, KV>> qp{
              .router = p.router, .selector = p.selector, .executor = {.inner = p.executor, .kv = kv}, .share_heads = p.share_heads,
              .pool = p.pool};
          const skim::pipeline_args<float, dequantized_window, float> args{
              .prob = c.p, .q = c.q, .kv = window(c, a, st, a.n_kv), .o = c.o, .lse = st.lse, .summaries = st.summaries,
              .mode = skim::summaries_mode::kept, .prior = prior_span, .selected = table};
          skim::stage_times rest;
          SKIM_TRY(qp.run(args, st.ws.span(), &rest));
          t.score = rest.score, t.select = rest.select, t.execute = rest.execute;
          return skim::status::success();
        } else {
          return no_codes(s, "a float source");  // with_kv hands a quantised cache's codes only
        }
      }));
    }
    stats.times += t;
    attention_args tmp;
    const attention_args& fa = prior || s.o->measure ? float_args(s, a, st, tmp) : a;
    if (prior) selected_mass(c.p, fa, table, st.lse, carried);
    count_selection(stats, *s.o, c.p, table, fa, st);
    return skim::status::success();
  }

  // The dequantised keys [from, n_kv) in st.dequant_k, as a K source of the call's sequence for
  // the summarizers (which read K only: no V).
  [[nodiscard]] static dequantized_window window(const call& c, const attention_args& a, const layer_state& st, std::int32_t from) {
    return {.k = st.dequant_k.data(), .v = nullptr, .first = from, .rows = a.n_kv - from, .heads_kv = a.heads_kv,
            .head_dim = c.p.head_dim};
  }

  // A quantised cache's summaries: those of its closed blocks are kept (their codes never change);
  // the blocks from the first one not closed when last summarised on are summarised again from
  // their keys' dequantised values (the open block's codes change as keys arrive). So the records
  // are those of summarize::build over the dequantised cache, and a decode step redoes at most
  // one block's keys. Sets st.summarized to n_kv.
  [[nodiscard]] skim::status summarize_codes(const call& c, const attention_args& a, layer_state& st) const {
    const std::int32_t from = st.summarized / c.p.block_kv * c.p.block_kv;
    dequantize_into(s, st, a.layer, from, a.n_kv, false);
    const dequantized_window w = window(c, a, st, from);
    if (from == 0) {
      SKIM_TRY(skim::summarize::build<S>(c.p, w, st.summaries, st.ws.span()));
    } else {
      for (std::int32_t t = from; t < a.n_kv; ++t) {
        SKIM_TRY(skim::summarize::append<S>(c.p, w, {.seq = 0, .position = t, .records = st.summaries}, st.ws.span()));
      }
    }
    st.summarized = a.n_kv;
    return skim::status::success();
  }
  std::vector<float> carried;  // [index_rows, max_kv_blocks]: the last layer's selected_mass
};

// The block oracle: each row's blocks ranked by the true mass they receive (dense attention over
// the call's own Q and K, summed over the row's queries and heads), then the same reserved
// selector and executor as a routed policy. The ceiling of block routing at a budget.
template <class Dyn, class Exec>
struct oracle_backend final : backend {
  shared_setup s;
  skim::select::reserved<Dyn> selector;
  Exec exec{};
  std::vector<float> scores;
  skim::workspace_buffer select_ws;
  oracle_backend(shared_setup s_, skim::select::reserved<Dyn> sel) : s(s_), selector(sel) {}
  skim::status run(const attention_args& a, layer_state& st, engine_stats& stats) override {
    const skim_eval::config& cfg = s.o->sparse;
    const call c(a, cfg.block_q(), cfg.block, cfg.scope, s.o->page_size, s.pages, s.page_table);
    attention_args tmp;  // a quantised cache: the mass of the dequantised codes, what the model attends over
    dense_block_mass(float_args(s, a, st, tmp), c.p.block_kv, s.o->threads, st.block_mass, s.o->measure ? &st.top_blocks : nullptr);
    const std::int32_t width = std::max(skim::select::max_count(selector, c.p), 1);
    const auto rows = static_cast<std::size_t>(c.p.index_rows());
    st.ids.resize(rows * static_cast<std::size_t>(width));
    st.count.resize(rows);
    scores.resize(static_cast<std::size_t>(c.p.max_kv_blocks()));
    if (const std::size_t need = selector.workspace_bytes(c.p.max_kv_blocks()); select_ws.size() < need) {
      select_ws = skim::workspace_buffer(need);
    }
    const std::span<std::byte> ws = select_ws.span();
    SKIM_TRY(skim::for_each_row(c.p, [&](const skim::row_info& r) -> skim::status {
      row_mass(c.p, r, st.block_mass, c.p.max_kv_blocks(), scores);
      std::fill(scores.begin() + r.visible_blocks, scores.end(), -INFINITY);
      const std::span<std::int32_t> ids = std::span(st.ids).subspan(static_cast<std::size_t>(r.row) * width, static_cast<std::size_t>(width));
      std::int32_t count = 0;
      SKIM_TRY(selector.select_row({.row = r, .scores = scores}, ids, count, ws));
      std::fill(ids.begin() + count, ids.end(), skim::index::mutable_block_table::pad);
      st.count[static_cast<std::size_t>(r.row)] = count;
      return skim::status::success();
    }));
    const skim::index::block_table table{.ids = st.ids, .count = st.count, .width = width};
    st.reserve_ws(exec.workspace_bytes(c.p));
    SKIM_TRY(with_kv<Exec>(s, a, c, [&]<class KV>(const KV& kv) {
      return exec.run(skim::attention_args<float, KV, skim::index::block_table, float>{.prob = c.p, .q = c.q, .kv = kv, .index = table, .o = c.o},
                      st.ws.span());
    }));
    count_reads(stats, c.p, table, a);
    if (s.o->measure) count_coverage(stats, *s.o, c.p, table, a, st.block_mass, st.top_blocks);
    return skim::status::success();
  }
};

// Dense attention over the resident blocks of a cache that evicts (decode only: n_q = 1).
template <class S, class Exec>
struct evict_backend final : backend {
  shared_setup s;
  Exec exec{};
  explicit evict_backend(shared_setup s_) : s(s_) {}

  template <class E>
  skim::status shrink(const E& policy, layer_state& st, std::int32_t blocks, std::int32_t keep, std::int32_t h,
                      std::int32_t heads_kv, std::int32_t head_dim) {
    std::vector<std::int32_t>& res = st.resident[static_cast<std::size_t>(h)];
    for (std::int32_t b = 0; b < blocks; ++b) st.head_mass[static_cast<std::size_t>(b)] = st.mass[static_cast<std::size_t>(b * heads_kv + h)];
    const skim::evict::request req{.blocks = blocks, .resident = res, .keep = keep, .sink = s.o->evict_sink, .newest = s.o->evict_newest};
    const skim::evict::evidence ev{.mass = st.head_mass, .records = st.summaries, .heads_kv = heads_kv, .head = h,
                                   .head_dim = head_dim, .queries = st.recent_q[static_cast<std::size_t>(h)]};
    skim::evict::decision d{.keep_ids = st.keep_ids, .evict_ids = st.evict_ids};
    SKIM_TRY(skim::evict::rank(policy, req, ev, d, st.ws.span()));
    res.assign(st.keep_ids.begin(), st.keep_ids.begin() + d.keep_count);
    return skim::status::success();
  }

  skim::status run(const attention_args& a, layer_state& st, engine_stats& stats) override {
    if (s.quantized()) return no_codes(s, "an evicting cache");
    if (a.n_q != 1) {
      return skim::status::error(skim::status_code::invalid_argument, "an evicting cache runs one token at a time, got %d", a.n_q);
    }
    const std::int32_t bk = s.o->sparse.block, hkv = a.heads_kv, hd = a.head_dim, group = a.heads_q / a.heads_kv;
    const call c(a, 1, bk, skim::index_scope::kv_head, s.o->page_size, s.pages, s.page_table);
    const auto mb = static_cast<std::size_t>(s.max_blocks);
    if (st.summaries.empty()) {
      st.summaries.resize(mb * hkv * S::record_floats(hd));
      st.mass.assign(mb * hkv, 0.0f);
      st.true_mass.assign(mb * hkv, 0.0f);
      st.head_mass.assign(mb, 0.0f);
      st.keep_ids.resize(mb);
      st.evict_ids.resize(mb);
    }
    if (a.n_kv == 1) {  // a fresh sequence
      st.summarized = 0;
      std::fill(st.mass.begin(), st.mass.end(), 0.0f);
      st.resident.assign(static_cast<std::size_t>(hkv), {});
      st.recent_q.assign(static_cast<std::size_t>(hkv), {});
    }
    st.reserve_ws(std::max({exec.workspace_bytes(c.p), skim::summarize::workspace_bytes<S>(c.p),
                            skim::evict::workspace_bytes(s.max_blocks)}));
    for (std::int32_t t = st.summarized; t < a.n_kv; ++t) {
      SKIM_TRY(skim::summarize::append<S>(c.p, c.kv, {.seq = 0, .position = t, .records = st.summaries}, st.ws.span()));
    }
    st.summarized = a.n_kv;
    const std::int32_t blocks = c.p.kv_blocks(0);
    const auto keep = static_cast<std::int32_t>(std::ceil(s.o->keep * blocks - 1e-9 * blocks));
    for (std::int32_t h = 0; h < hkv; ++h) {
      std::vector<std::int32_t>& res = st.resident[static_cast<std::size_t>(h)];
      if (res.empty() || res.back() != blocks - 1) res.push_back(blocks - 1);
      if (static_cast<std::int32_t>(res.size()) <= keep) continue;
      switch (s.o->evict) {
        case eviction::attention_mass: SKIM_TRY(shrink(skim::evict::attention_mass{}, st, blocks, keep, h, hkv, hd)); break;
        case eviction::recency: SKIM_TRY(shrink(skim::evict::recency{}, st, blocks, keep, h, hkv, hd)); break;
        case eviction::summary_score: SKIM_TRY(shrink(skim::evict::summary_score<S>{}, st, blocks, keep, h, hkv, hd)); break;
        case eviction::none: break;
      }
    }
    // The resident blocks as a block_table: one row per kv head.
    std::size_t width = 1;
    for (const auto& r : st.resident) width = std::max(width, r.size());
    st.ids.assign(static_cast<std::size_t>(hkv) * width, -1);
    st.count.resize(static_cast<std::size_t>(hkv));
    for (std::int32_t h = 0; h < hkv; ++h) {
      const auto& r = st.resident[static_cast<std::size_t>(h)];
      std::copy(r.begin(), r.end(), st.ids.begin() + static_cast<std::ptrdiff_t>(h * width));
      st.count[static_cast<std::size_t>(h)] = static_cast<std::int32_t>(r.size());
    }
    const skim::index::block_table table{.ids = st.ids, .count = st.count, .width = static_cast<std::int32_t>(width)};
    st.lse.resize(static_cast<std::size_t>(a.heads_q));
    const skim::attention_args<float, skim::paged_kv<float>, skim::index::block_table, float> args{
        .prob = c.p, .q = c.q, .kv = c.kv, .index = table, .o = c.o, .lse = st.lse};
    SKIM_TRY(exec.run(args, st.ws.span()));
    // H2O's accumulation from the executor's LSE, and the true mass (dense over the whole cache).
    SKIM_TRY(skim::evict::accumulate_mass(c.p, c.q, c.kv, table, st.lse, st.mass));
    std::fill(st.true_mass.begin(), st.true_mass.end(), 0.0f);
    SKIM_TRY(skim::evict::accumulate_mass(c.p, c.q, c.kv, skim::index::causal_all{}, {}, st.true_mass));
    for (std::int32_t h = 0; h < hkv; ++h) {
      const auto& r = st.resident[static_cast<std::size_t>(h)];
      double total = 0, kept = 0;
      for (std::int32_t b = 0; b < blocks; ++b) total += st.true_mass[static_cast<std::size_t>(b * hkv + h)];
      for (const std::int32_t b : r) kept += st.true_mass[static_cast<std::size_t>(b * hkv + h)];
      stats.evicted_mass += group * (total > 0 ? (total - kept) / total : 0.0);
      stats.evicted_samples += group;
      // Recent queries of the group, for summary_score.
      auto& rq = st.recent_q[static_cast<std::size_t>(h)];
      rq.insert(rq.end(), a.q.begin() + static_cast<std::ptrdiff_t>(h * group * hd),
                a.q.begin() + static_cast<std::ptrdiff_t>((h + 1) * group * hd));
      const auto cap = static_cast<std::size_t>(s.o->evict_queries) * group * hd;
      if (rq.size() > cap) rq.erase(rq.begin(), rq.begin() + static_cast<std::ptrdiff_t>(rq.size() - cap));
    }
    count_reads(stats, c.p, table, a);
    return skim::status::success();
  }
};

// Calls f.template operator()<S>() with the summarizer type of the config.
template <class F>
[[nodiscard]] std::unique_ptr<backend> with_summarizer(const skim_eval::config& c, F&& f) {
  namespace sum = skim::summarize;
  using skim_eval::summarizer_kind;
  switch (c.summarizer) {
    case summarizer_kind::mean_pool: return f.template operator()<sum::mean_pool>();
    case summarizer_kind::max_bound: return f.template operator()<sum::max_bound>();
    case summarizer_kind::probe_max:
      if (c.probes == 2) return f.template operator()<sum::probe_max<2>>();
      if (c.probes == 8) return f.template operator()<sum::probe_max<8>>();
      return f.template operator()<sum::probe_max<4>>();
    case summarizer_kind::multi_centroid:
      if (c.centroids == 4) return f.template operator()<sum::multi_centroid<4>>();
      return f.template operator()<sum::multi_centroid<2>>();
    case summarizer_kind::lsh:
      if (c.rounds == 8) return f.template operator()<sum::lsh_buckets<8, 4>>();
      return f.template operator()<sum::lsh_buckets<4, 4>>();
  }
  return nullptr;
}

template <class Exec>
[[nodiscard]] std::unique_ptr<backend> make_backend_with(const shared_setup& s) {
  const engine_options& o = *s.o;
  const skim_eval::config& c = o.sparse;
  if (o.evict != eviction::none) {
    return with_summarizer(c, [&]<class S>() -> std::unique_ptr<backend> { return std::make_unique<evict_backend<S, Exec>>(s); });
  }
  if (o.policy == attention_policy::dense) return std::make_unique<dense_backend<Exec>>(s);
  const skim::route::pooled_router router{.pool = c.pool, .reduce = c.reduce};
  const budgeted dyn{.how = o.policy == attention_policy::skim || o.policy == attention_policy::oracle ? budgeted::rule::score
                            : o.policy == attention_policy::recency ? budgeted::rule::newest
                                                                    : budgeted::rule::random,
                     .share = c.budget.value_or(1.0), .k = c.k.value_or(-1), .seed = o.seed};
  if (o.tokens) return std::make_unique<tokens_backend>(s);
  if (c.router == skim_eval::router_kind::kmeans) {
    return std::make_unique<kmeans_backend<Exec>>(
        s, typename kmeans_backend<Exec>::pipeline{
               .router = {.probe = c.probe, .pool = c.pool},
               .selector = {.sink = c.sink, .local = c.local, .recency = c.recency, .dynamic = dyn},
               .build_options = {.iterations = c.iterations},
               .clusters = c.clusters});
  }
  if (c.router == skim_eval::router_kind::vertical_slash) {
    return std::make_unique<vertical_slash_backend<Exec>>(
        s, typename vertical_slash_backend<Exec>::pipeline{
               .options = {.columns = c.columns, .diagonals = c.diagonals, .sink_blocks = c.sink,
                           .window_blocks = c.local, .last_q = c.last_q}});
  }
  if (o.policy == attention_policy::skim && c.select == skim_eval::selector_kind::threshold) {
    return with_summarizer(c, [&]<class S>() -> std::unique_ptr<backend> {
      using B = sparse_backend<S, skim::select::threshold, Exec>;
      return std::make_unique<B>(s, typename B::pipeline{
          .router = router,
          .selector = {.sink = c.sink, .local = c.local, .recency = c.recency,
                       .dynamic = {.mode = c.mode, .tau = c.tau.value_or(0.0f), .k_min = c.k_min, .k_max = c.k_max}}});
    });
  }
  const auto make = [&]<class S>() -> std::unique_ptr<backend> {
    using B = sparse_backend<S, budgeted, Exec>;
    return std::make_unique<B>(s, typename B::pipeline{
        .router = router,
        .selector = {.sink = c.sink, .local = c.local, .recency = c.recency, .importance = c.importance, .dynamic = dyn}});
  };
  if (o.policy == attention_policy::oracle) {
    return std::make_unique<oracle_backend<budgeted, Exec>>(
        s, skim::select::reserved<budgeted>{.sink = c.sink, .local = c.local, .recency = c.recency, .dynamic = dyn});
  }
  // The baselines ignore the scores: one cheap summarizer serves them.
  if (o.policy != attention_policy::skim) return make.template operator()<skim::summarize::mean_pool>();
  return with_summarizer(c, make);
}

backends make_backends(const shared_setup& s) {
  const engine_options& o = *s.o;
  backends b;
#ifdef SKIM_LLAMA_HAS_SIMD
  using simd = skim::exec::simd<xsimd::default_arch>;
  if (o.exec == executor_kind::simd) {
    b.policy = make_backend_with<simd>(s);
    if (o.dense_layers > 0) b.dense = std::make_unique<dense_backend<simd>>(s);
    return b;
  }
#endif
  b.policy = make_backend_with<skim::exec::scalar>(s);
  if (o.dense_layers > 0) b.dense = std::make_unique<dense_backend<skim::exec::scalar>>(s);
  return b;
}

}  // namespace engine_detail

}  // namespace skim_llama
