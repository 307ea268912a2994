#pragma once
// skim_llama::engine — a llama2.c checkpoint with every attention call done by skim.
//
// The model code is forward.hpp's; the engine plugs its attention_fn and keeps, per layer:
//  - a paged view of forward.hpp's KV cache (skim::paged_kv over pages of page_size tokens of the
//    cache's [tokens, kv_heads, head_dim] rows, through a page table);
//  - skim's block summaries of K, built at prefill and appended as tokens arrive (summaries_mode::
//    build, then append_newest per decode step, or summarize::append + kept for a later chunk);
//  - the selected block_table, the LSE and a workspace, reused by every call.
// Modes (engine_options):
//  - dense:   skim's executor (simd<xsimd::default_arch> where built, else scalar; exec=scalar
//             picks the scalar one) over index::causal_all;
//  - skim:    sparse_attention<Summarizer, pooled_router, reserved<budgeted>, Executor> with any
//             summarizer, budget (a share of each row's visible blocks, or k), threshold selector,
//             block sizes and reserved branches (sink, local, recency; importance=S takes the share S
//             of the budget by the previous layer's mass of each block: block_mass.hpp's
//             selected_mass of layer l - 1's selection and LSE, layer 0 takes none). What a spec
//             leaves out is skim::defaults' (skim/defaults.hpp): blocks of 4 keys, mean_pool, the
//             group's scores summed, one selection per kv head, sink 1 and local 8;
//             router=kmeans, router=vertical_slash and router=tokens swap the summaries for the
//             k-means, vertical-slash and token-level families (family_backends.hpp);
//  - recency: the same pipeline with reserved<budgeted{newest}>: sink + the newest blocks;
//  - random:  reserved<budgeted{random}>: sink + newest + random blocks at the same budget;
//  - oracle:  blocks ranked by the true mass they receive (dense attention over the call's own Q and
//             K), then the same reserved<budgeted> and executor: the ceiling of block routing;
//  - eviction (with dense): a cache that keeps ceil(keep × blocks) blocks per (layer, kv head),
//    chosen by skim::evict (attention_mass / recency / summary_score), evicted blocks never return;
//    decode runs over the resident blocks, the mass is accumulated from the executor's LSE
//    (evict::accumulate_mass), and the true attention mass of the evicted blocks is measured.
// kv=int8|fp8 stores the K/V cache as codes with one float scale per (block of `block` keys, kv
// head) (kv_quant.hpp; default kv=fp32, float rows): dense, skim (block summaries, read from the
// dequantised codes), recency, random and oracle attend over the codes with exec::simd; router=kmeans,
// vertical_slash and tokens, eviction and exec=scalar read K/V as floats and refuse it.
// dense_layers=N runs the first N layers densely under any policy. With engine_options::measure the
// routed and oracle calls also record their selections' coverage of the true mass (stats.coverage).
// The attention spec uses skim-eval's syntax (eval/options.hpp) plus the engine's keys, e.g.
//   policy=skim,budget=0.125
//   policy=skim,summarizer=mean_pool,block=16,budget=0.25,sink=1,local=8,scope=kv,reduce=sum
//   policy=oracle,block=8,budget=0.125,sink=0,recency=0,scope=query
//   policy=dense,evict=attention_mass,keep=0.5,block=16
//   policy=skim,router=kmeans,clusters=64,probe=8,budget=0.125
//   policy=skim,router=vertical_slash,block=16,columns=32,diagonals=128
//   policy=skim,router=tokens,budget=0.125
//   policy=skim,budget=0.125,kv=int8
// The options, statistics, per-layer state and the dense backend are in backend.hpp.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "eval/options.hpp"
#include "llama/backend.hpp"
#include "llama/block_mass.hpp"
#include "llama/family_backends.hpp"
#include "llama/forward.hpp"
#include "llama/model.hpp"
#include "llama/selectors.hpp"
#include "skim/core/attention_args.hpp"
#include "skim/core/views.hpp"
#include "skim/core/workspace.hpp"
#include "skim/evict/attention_mass.hpp"
#include "skim/evict/rank.hpp"
#include "skim/evict/recency.hpp"
#include "skim/evict/summary_score.hpp"
#include "skim/exec/cpu/scalar.hpp"
#include "skim/index/block_table.hpp"
#include "skim/index/causal_all.hpp"
#include "skim/pipeline.hpp"
#include "skim/route/pooled_router.hpp"
#include "skim/select/reserved.hpp"
#include "skim/select/threshold.hpp"
#include "skim/summarize/build.hpp"
#include "skim/summarize/max_bound.hpp"
#include "skim/summarize/mean_pool.hpp"
#include "skim/summarize/multi_centroid.hpp"
#include "skim/summarize/lsh_buckets.hpp"
#include "skim/summarize/probe_max.hpp"

namespace skim_llama {

// Parses an attention spec (header comment) into out. Returns "" or the error.
[[nodiscard]] inline std::string parse_attention(std::string_view spec, engine_options& out) {
  engine_options o;
  o.spec = std::string(spec);
  std::string rest;
  bool budget_given = false, bq_given = false, block_given = false;
  // router=vertical_slash selects by its own counts (no budget), router=tokens is the engine's own.
  const bool vertical_slash = spec.find("router=vertical_slash") != std::string_view::npos;
  std::size_t pos = 0;
  while (pos < spec.size()) {
    const std::size_t comma = std::min(spec.find(',', pos), spec.size());
    const std::string_view item = spec.substr(pos, comma - pos);
    pos = comma + 1;
    const std::size_t eq = item.find('=');
    const std::string_view key = item.substr(0, eq), value = eq == std::string_view::npos ? "" : item.substr(eq + 1);
    const auto number = [&](double lo, double hi, double& v) {
      return skim_eval::detail::parse_float(value, v) && v >= lo && v <= hi;
    };
    double v = 0;
    if (item == "dense") {
      o.policy = attention_policy::dense;
    } else if (key == "policy") {
      if (value == "dense") o.policy = attention_policy::dense;
      else if (value == "skim") o.policy = attention_policy::skim;
      else if (value == "recency") o.policy = attention_policy::recency;
      else if (value == "random") o.policy = attention_policy::random;
      else if (value == "oracle") o.policy = attention_policy::oracle;
      else return "attention '" + o.spec + "': unknown policy '" + std::string(value) + "' (dense, skim, recency, random, oracle)";
    } else if (key == "exec") {
      if (value == "scalar") o.exec = executor_kind::scalar;
#ifdef SKIM_LLAMA_HAS_SIMD
      else if (value == "simd") o.exec = executor_kind::simd;
#endif
      else return "attention '" + o.spec + "': unknown executor '" + std::string(value) + "'";
    } else if (key == "seed") {
      if (!number(0, 1e18, v)) return "attention '" + o.spec + "': bad seed";
      o.seed = static_cast<std::uint64_t>(v);
    } else if (key == "kv") {
      if (value == "fp32") o.kv = kv_format::fp32;
      else if (value == "int8") o.kv = kv_format::int8;
      else if (value == "fp8") o.kv = kv_format::fp8;
      else return "attention '" + o.spec + "': unknown kv '" + std::string(value) + "' (fp32, int8, fp8)";
    } else if (key == "router" && value == "tokens") {
      o.tokens = true;
    } else if (key == "evict") {
      if (value == "none") o.evict = eviction::none;
      else if (value == "attention_mass" || value == "mass") o.evict = eviction::attention_mass;
      else if (value == "recency") o.evict = eviction::recency;
      else if (value == "summary_score" || value == "summary") o.evict = eviction::summary_score;
      else return "attention '" + o.spec + "': unknown eviction '" + std::string(value) + "' (attention_mass, recency, summary_score)";
    } else if (key == "keep") {
      if (!number(1e-6, 1.0, v)) return "attention '" + o.spec + "': keep outside (0, 1]";
      o.keep = v;
    } else if (key == "dense_layers") {
      if (!number(0, 1 << 20, v)) return "attention '" + o.spec + "': bad dense_layers";
      o.dense_layers = static_cast<std::int32_t>(v);
    } else if (key == "evict_sink" || key == "evict_newest" || key == "evict_queries" || key == "page") {
      if (!number(key == "page" || key == "evict_queries" ? 1 : 0, 1 << 20, v)) return "attention '" + o.spec + "': bad " + std::string(key);
      (key == "evict_sink" ? o.evict_sink : key == "evict_newest" ? o.evict_newest : key == "page" ? o.page_size : o.evict_queries) =
          static_cast<std::int32_t>(v);
    } else {
      budget_given |= key == "budget" || key == "k" || key == "select";
      bq_given |= key == "bq";
      block_given |= key == "block";
      rest += (rest.empty() ? "" : ",") + std::string(item);
    }
  }
  if (!budget_given && !vertical_slash) rest += (rest.empty() ? "" : ",") + std::string("budget=1");
  if (!block_given) rest.append(",block=").append(std::to_string(skim::defaults::block_kv));  // skim-eval's default, kept explicit
  if (const std::string e = skim_eval::parse_config(rest, o.sparse); !e.empty()) return "attention '" + o.spec + "': " + e;
  if (!bq_given) o.sparse.bq = vertical_slash ? 64 : 1;  // each query picks its own blocks, as in decode (skim-eval's default too);
                                                         // vertical-slash is a prefill pattern of query blocks
  const bool other_router = o.tokens || o.sparse.router != skim_eval::router_kind::pooled;
  if (other_router && o.policy != attention_policy::skim) {
    return "attention '" + o.spec + "': router=kmeans, vertical_slash and tokens run with policy=skim";
  }
  if (other_router && (o.sparse.select != skim_eval::selector_kind::top_k || o.sparse.importance > 0.0f)) {
    return "attention '" + o.spec + "': router=kmeans and tokens take budget=B or k=N (no threshold, no importance)";
  }
  if (o.evict != eviction::none && o.policy != attention_policy::dense) {
    return "attention '" + o.spec + "': eviction runs with policy=dense (attention over the resident blocks)";
  }
  if (o.policy != attention_policy::skim && o.sparse.select != skim_eval::selector_kind::top_k) {
    return "attention '" + o.spec + "': the recency and random baselines take budget=B or k=N";
  }
  if (o.kv != kv_format::fp32) {
    const auto refuse = [&](const char* why) {  // appended piecewise: g++ 12 -O3 warns on a chain of + here
      std::string m = "attention '";
      m.append(o.spec).append("': kv=").append(kv_format_name(o.kv)).append(why);
      return m;
    };
    if (o.exec != executor_kind::simd) return refuse(" reads codes with exec=simd (exec::scalar reads floats only)");
    if (other_router) return refuse(" runs with block summaries (router=kmeans, vertical_slash and tokens read K/V as floats)");
    if (o.evict != eviction::none) return refuse(" does not run with eviction (it reads K/V as floats)");
  }
  out = std::move(o);
  return {};
}

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

}  // namespace engine_detail

class engine {
 public:
  // With kv=int8|fp8 the float cache holds no rows: K/V live in the quantised cache (kv_quant.hpp),
  // blocks of o.sparse.block keys.
  engine(const model& m, const engine_options& o, int max_tokens)
      : m_(&m), o_(o), cache_(m.cfg, round_up(max_tokens, o.page_size), o.kv == kv_format::fp32) {
    const int pages = cache_.max_tokens / o_.page_size;
    page_table_.resize(static_cast<std::size_t>(pages));
    for (int i = 0; i < pages; ++i) page_table_[static_cast<std::size_t>(i)] = i;
    const config& c = m.cfg;
    if (o_.kv == kv_format::int8) int8_ = std::make_unique<quantized_cache<std::int8_t>>(c.n_layers, cache_.max_tokens, c.n_kv_heads, c.head_dim(), o_.sparse.block);
    if (o_.kv == kv_format::fp8) fp8_ = std::make_unique<quantized_cache<skim::fp8_e4m3>>(c.n_layers, cache_.max_tokens, c.n_kv_heads, c.head_dim(), o_.sparse.block);
    const engine_detail::shared_setup s{.o = &o_, .pages = pages, .page_table = page_table_,
                                        .max_blocks = (cache_.max_tokens + o_.sparse.block - 1) / o_.sparse.block,
                                        .int8 = int8_.get(), .fp8 = fp8_.get()};
#ifdef SKIM_LLAMA_HAS_SIMD
    using simd = skim::exec::simd<xsimd::default_arch>;
    backend_ = o_.exec == executor_kind::simd ? engine_detail::make_backend_with<simd>(s)
                                              : engine_detail::make_backend_with<skim::exec::scalar>(s);
    if (o_.dense_layers > 0) {
      dense_ = o_.exec == executor_kind::simd ? std::unique_ptr<engine_detail::backend>(std::make_unique<engine_detail::dense_backend<simd>>(s))
                                              : std::make_unique<engine_detail::dense_backend<skim::exec::scalar>>(s);
    }
#else
    backend_ = engine_detail::make_backend_with<skim::exec::scalar>(s);
    if (o_.dense_layers > 0) dense_ = std::make_unique<engine_detail::dense_backend<skim::exec::scalar>>(s);
#endif
    layers_.resize(static_cast<std::size_t>(m.cfg.n_layers));
  }

  // Drops the cache (a new sequence); statistics are kept.
  void reset() {
    cache_.tokens = 0;
    for (auto& l : layers_) l.summarized = 0, l.clustered = 0;
  }
  [[nodiscard]] int tokens() const { return cache_.tokens; }
  // The float cache: its rows, or (kv=int8|fp8) the token count only.
  [[nodiscard]] const kv_cache& cache() const { return cache_; }
  // The quantised cache (kv=int8 or fp8), or null.
  [[nodiscard]] const quantized_cache<std::int8_t>* int8_cache() const { return int8_.get(); }
  [[nodiscard]] const quantized_cache<skim::fp8_e4m3>* fp8_cache() const { return fp8_.get(); }
  // Starts a new sequence from another engine's float cache of the same model (its tokens' K and V
  // are copied, or quantised as a prefill of them would; summaries are rebuilt on the next call):
  // e.g. one dense prefill shared by policies.
  [[nodiscard]] skim::status start_from(const kv_cache& other) {
    if (other.kv_heads != cache_.kv_heads || other.head_dim != cache_.head_dim || other.tokens > cache_.max_tokens) {
      return skim::status::error(skim::status_code::shape_mismatch, "cache of %d tokens (%d kv heads of dim %d) does not fit one of %d (%d of %d)",
                                 other.tokens, other.kv_heads, other.head_dim, cache_.max_tokens, cache_.kv_heads, cache_.head_dim);
    }
    if (!other.holds_rows()) {
      return skim::status::error(skim::status_code::unsupported, "the cache to start from holds codes, not float rows");
    }
    reset();
    const auto row = static_cast<std::size_t>(cache_.kv_heads) * cache_.head_dim;
    const int layers = static_cast<int>(layers_.size());
    for (int l = 0; l < layers; ++l) {
      const std::span<const float> k(other.k.data() + l * other.layer_stride(), other.tokens * row);
      const std::span<const float> v(other.v.data() + l * other.layer_stride(), other.tokens * row);
      if (int8_ || fp8_) {
        SKIM_TRY(int8_ ? int8_->append(l, 0, k, v) : fp8_->append(l, 0, k, v));
      } else {
        std::copy(k.begin(), k.end(), cache_.k_at(l, 0));
        std::copy(v.begin(), v.end(), cache_.v_at(l, 0));
      }
    }
    cache_.tokens = other.tokens;
    return skim::status::success();
  }
  [[nodiscard]] int capacity() const { return cache_.max_tokens; }
  [[nodiscard]] const engine_options& options() const { return o_; }

  // Runs tokens after the cached ones; logits [tokens.size(), vocab], [vocab] (the last position) or empty. An evicting cache
  // takes them one at a time.
  [[nodiscard]] skim::status run(std::span<const int> tokens, std::span<float> logits) {
    forward_options fo;
    fo.attention = [this](const attention_args& a) {
      engine_detail::backend& b = a.layer < o_.dense_layers ? *dense_ : *backend_;
      if (a.n_q != 1) return b.run(a, layers_[static_cast<std::size_t>(a.layer)], stats);
      const auto t0 = std::chrono::steady_clock::now();
      const skim::status s = b.run(a, layers_[static_cast<std::size_t>(a.layer)], stats);
      stats.decode_attention_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return s;
    };
    stats.decode_steps += tokens.size() == 1;
    fo.on_qkv = on_qkv;
    fo.threads = o_.threads;
    if (int8_) fo.store_kv = [this](int l, int first, std::span<const float> k, std::span<const float> v) { return int8_->append(l, first, k, v); };
    if (fp8_) fo.store_kv = [this](int l, int first, std::span<const float> k, std::span<const float> v) { return fp8_->append(l, first, k, v); };
    if (o_.evict == eviction::none || tokens.size() <= 1) return forward(*m_, cache_, tokens, logits, fo);
    const auto v = static_cast<std::size_t>(m_->cfg.vocab_size);
    const bool last_only = logits.size() == v;
    for (std::size_t t = 0; t < tokens.size(); ++t) {
      const std::span<float> out = logits.empty() ? logits
                                   : last_only    ? (t + 1 == tokens.size() ? logits : std::span<float>{})
                                                  : logits.subspan(t * v, v);
      SKIM_TRY(forward(*m_, cache_, tokens.subspan(t, 1), out, fo));
    }
    return skim::status::success();
  }

  // Greedy continuation of `prompt` (prefilled after a reset) by n tokens, appended to out.
  [[nodiscard]] skim::status generate(std::span<const int> prompt, int n, std::vector<int>& out) {
    reset();
    const auto v = static_cast<std::size_t>(m_->cfg.vocab_size);
    std::vector<float> logits(v);  // the prompt's last position only
    SKIM_TRY(run(prompt, logits));
    int next = argmax(logits);
    for (int i = 0; i < n; ++i) {
      out.push_back(next);
      if (i + 1 == n || cache_.tokens >= cache_.max_tokens) break;
      SKIM_TRY(run(std::span<const int>(&next, 1), logits));
      next = argmax(logits);
    }
    return skim::status::success();
  }

  engine_stats stats;
  qkv_hook on_qkv;

 private:
  static int round_up(int n, int m) { return (std::max(n, 1) + m - 1) / m * m; }
  const model* m_;
  engine_options o_;
  kv_cache cache_;
  std::unique_ptr<quantized_cache<std::int8_t>> int8_;     // kv=int8
  std::unique_ptr<quantized_cache<skim::fp8_e4m3>> fp8_;   // kv=fp8
  std::vector<std::int32_t> page_table_;
  std::vector<engine_detail::layer_state> layers_;
  std::unique_ptr<engine_detail::backend> backend_;
  std::unique_ptr<engine_detail::backend> dense_;  // layers < dense_layers
};

// Mean next-token loss (nats) of logits [n, vocab] for ids [n] (positions 0..n-2 predict 1..n-1).
[[nodiscard]] inline double next_token_nll(std::span<const float> logits, std::span<const int> ids, int vocab, double* sum = nullptr) {
  double total = 0;
  for (std::size_t t = 0; t + 1 < ids.size(); ++t) {
    const float* r = logits.data() + t * static_cast<std::size_t>(vocab);
    const float mx = *std::max_element(r, r + vocab);
    double z = 0;
    for (int j = 0; j < vocab; ++j) z += std::exp(static_cast<double>(r[j] - mx));
    total += std::log(z) - (r[ids[t + 1]] - mx);
  }
  if (sum) *sum = total;
  return ids.size() > 1 ? total / static_cast<double>(ids.size() - 1) : 0.0;
}

}  // namespace skim_llama
