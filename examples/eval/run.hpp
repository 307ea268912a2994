#pragma once
// skim-eval's work: for each configuration and each layer, run the pipeline with the scalar
// executor, measure what it selected against dense attention, and time it against a dense run.
//
// Per configuration (run_config):
//  - the runtime choices (summarizer and its parameter, selector) pick one instantiation of
//    sparse_attention<Summarizer, pooled_router, reserved<Selector>, exec::scalar> (the table in
//    evaluate_config: 7 summarizers × 2 selectors);
//  - each layer is one problem: one sequence of `tokens` queries and keys, causal bottom-right
//    (or none), summaries built from the layer's K (prefill);
//  - quality (metrics::quality_accumulator, layer by layer) counts only the queries at positions
//    >= min_position. The metrics API measures every query of a problem, so the tool measures
//    a restricted problem: the queries [m, tokens) against all keys (bottom-right causality gives
//    them exactly the keys they see in the full problem), cut into blocks of gcd(m, bq) queries
//    so that each restricted block lies inside one block of the full problem, and read through
//    measured_rows_index, which hands each restricted row the ids of its full row (less the
//    blocks none of its queries can see). With m = 0 the restricted problem is the full one;
//  - cost (tiles, keys, pairs) is per index row of the *full* problem, over the rows whose query
//    block holds a measured query (a block is computed whole, whatever is measured), and dense
//    cost is exec over index::causal_all over the same rows: density = pairs read / dense pairs;
//  - time: stage times of the pipeline and the time of a dense scalar run over causal_all, each
//    summed over the layers; `repeat` passes, medians reported (docs/design.md §12).
// importance=S needs a prior: the tool gives the dense attention mass each block receives from
// the row's queries (all of its queries and query heads) — an oracle, for comparison only.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "options.hpp"
#include "routers.hpp"
#include "skim/core/attention_args.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/views.hpp"
#include "skim/core/workspace.hpp"
#include "skim/exec/cpu/scalar.hpp"
#include "skim/index/block_table.hpp"
#include "skim/index/causal_all.hpp"
#include "skim/index/head_shared.hpp"
#include "skim/metrics/cost.hpp"
#include "skim/metrics/quality.hpp"
#include "skim/pipeline.hpp"
#include "skim/route/pooled_router.hpp"
#include "skim/select/reserved.hpp"
#include "skim/select/threshold.hpp"
#include "skim/select/top_k.hpp"
#include "skim/summarize/max_bound.hpp"
#include "skim/summarize/mean_pool.hpp"
#include "skim/summarize/multi_centroid.hpp"
#include "skim/summarize/lsh_buckets.hpp"
#include "skim/summarize/probe_max.hpp"
#include "tensors.hpp"

namespace skim_eval {

// What went wrong, and the exit status it deserves: 2 for bad input (files, shapes, options, a
// configuration the data cannot run), 1 for a failure while evaluating.
struct outcome {
  int exit_code = 0;
  std::string error;
  [[nodiscard]] bool ok() const noexcept { return exit_code == 0; }
  [[nodiscard]] static outcome bad_input(std::string e) { return {2, std::move(e)}; }
  [[nodiscard]] static outcome failed(std::string e) { return {1, std::move(e)}; }
};

// One configuration's numbers.
struct config_result {
  config cfg;
  std::int32_t block_q = 0;
  std::int32_t block_kv = 0;
  std::int32_t kv_blocks = 0;      // per layer (one sequence of `tokens` keys)
  std::int32_t dynamic_k = -1;     // top_k's k per row (given, or from budget); -1 for threshold
  skim::metrics::quality_report quality;   // measured queries; .cost over the measured rows (see above)
  skim::metrics::cost_summary dense_cost;  // causal_all over the same index rows
  skim::stage_times times;         // per stage: median over passes of the sum over layers (seconds)
  double sparse_seconds = 0.0;     // median over passes of the whole pipeline, summed over layers
  double dense_seconds = 0.0;      // median over passes of the dense scalar run, summed over layers

  // Pairs read / visible (query, key) pairs of dense attention over the same rows.
  [[nodiscard]] double density() const noexcept {
    return dense_cost.pairs_needed > 0
               ? static_cast<double>(quality.cost.pairs_read) / static_cast<double>(dense_cost.pairs_needed)
               : std::nan("");
  }
  // Sparse time over dense time (< 1: the sparse pipeline is faster).
  [[nodiscard]] double time_ratio() const noexcept {
    return dense_seconds > 0.0 ? sparse_seconds / dense_seconds : std::nan("");
  }
};

struct run_result {
  input_shape shape;
  options opts;
  std::vector<config_result> configs;
};

// top_k's k for a config on a layer of kv_blocks blocks: k, or from budget (options.hpp).
[[nodiscard]] inline std::int32_t dynamic_k_for(const config& c, std::int32_t kv_blocks) noexcept {
  if (c.k) return *c.k;
  const double n = kv_blocks;
  // 1e-9·n of slack: a decimal budget is not exact in binary (0.25 × 32 must give 8, not 9).
  const auto total = static_cast<std::int64_t>(std::ceil(*c.budget * n - 1e-9 * n));
  const std::int64_t reserved = std::min<std::int64_t>(c.sink, kv_blocks) +
                                std::min<std::int64_t>(std::max(c.local, c.recency ? 1 : 0), kv_blocks);
  return static_cast<std::int32_t>(std::max<std::int64_t>(0, total - reserved));
}

// The index of the restricted problem (queries [first_query, tokens), blocks of g | bq queries):
// row r reads the ids of the full problem's row for the same query block and index head, less
// the ids the restricted row cannot see. Satisfies skim::block_index.
struct measured_rows_index {
  struct cursor_type {
    const std::int32_t* p = nullptr;
    const std::int32_t* e = nullptr;
    [[nodiscard]] bool done() const noexcept { return p == e; }
    [[nodiscard]] std::int32_t id() const noexcept { return *p; }
    void next() noexcept { ++p; }
  };

  skim::index::block_table table;  // the full problem's selection
  skim::problem full;              // the full problem (its spans outlive this index)
  std::int32_t first_query = 0;    // m, the first measured query position
  bool shared = false;             // table has one row per query block (sparse_attention::share_heads)

  [[nodiscard]] cursor_type cursor(const skim::row_info& r) const noexcept {
    const std::int32_t full_block = (first_query + r.q_begin) / full.block_q;
    const auto row = static_cast<std::size_t>(shared ? full_block
                                                     : static_cast<std::int64_t>(full_block) * full.index_heads() + r.head);
    if (row >= table.count.size() || table.width <= 0) return {};
    const std::int32_t* first = table.ids.data() + row * static_cast<std::size_t>(table.width);
    const std::int32_t n = std::clamp(table.count[row], std::int32_t{0}, table.width);
    cursor_type c{first, first};
    while (c.e != first + n && *c.e < r.visible_blocks) ++c.e;  // ids ascend: a prefix
    return c;
  }
  [[nodiscard]] skim::status validate(const skim::problem&) const noexcept {
    if (shared) return skim::index::head_shared<skim::index::block_table>{table, full.index_heads()}.validate(full);
    return table.validate(full);
  }
};
static_assert(skim::block_index<measured_rows_index>);

namespace detail {

using steady = std::chrono::steady_clock;

[[nodiscard]] inline double median(std::vector<double> x) {
  if (x.empty()) return std::nan("");
  std::sort(x.begin(), x.end());
  const std::size_t n = x.size();
  return n % 2 == 1 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

[[nodiscard]] inline std::string layer_error(std::int32_t layer, const skim::status& s) {
  return "layer " + std::to_string(layer) + ": " + s.message();
}

// The oracle prior [index_rows, max_kv_blocks]: per row, the dense attention mass each visible
// block receives, summed over the row's queries and query heads.
inline void attention_mass_prior(const skim::problem& p, skim::strided_view<const float> q,
                                 const skim::contiguous_kv<float>& kv, std::vector<float>& prior) {
  const std::int32_t stride = p.max_kv_blocks();
  prior.assign(static_cast<std::size_t>(p.index_rows() * stride), 0.0f);
  const double scale = p.scale();
  std::vector<double> s;
  (void)skim::for_each_row(p, [&](const skim::row_info& r) {
    const std::int32_t heads = p.scope == skim::index_scope::kv_head ? p.group_size() : 1;
    const std::int32_t first_head = p.scope == skim::index_scope::kv_head ? r.head * heads : r.head;
    const std::int32_t kv_head = first_head / p.group_size();
    std::vector<double> mass(static_cast<std::size_t>(stride), 0.0);
    for (std::int32_t g = first_head; g < first_head + heads; ++g) {
      for (std::int32_t t = r.q_begin; t < r.q_end; ++t) {
        const std::int32_t n = r.visible_keys(t, p.mask);
        if (n == 0) continue;
        s.resize(static_cast<std::size_t>(n));
        double m = -INFINITY;
        const float* qr = q.row(t, g);
        for (std::int32_t j = 0; j < n; ++j) {
          const float* kr = kv.k.row(j, kv_head);
          double dot = 0.0;
          for (std::int32_t e = 0; e < p.head_dim; ++e) dot += static_cast<double>(qr[e]) * kr[e];
          s[static_cast<std::size_t>(j)] = dot * scale;
          m = std::max(m, dot * scale);
        }
        double sum = 0.0;
        for (double& x : s) sum += (x = std::exp(x - m));
        for (std::int32_t j = 0; j < n; ++j) mass[static_cast<std::size_t>(j / p.block_kv)] += s[static_cast<std::size_t>(j)] / sum;
      }
    }
    std::copy(mass.begin(), mass.end(), prior.begin() + r.row * stride);
  });
}

// Evaluates one configuration with one pipeline type. See the header comment.
template <class Pipeline>
[[nodiscard]] outcome evaluate(const inputs& in, const options& o, const Pipeline& pipe, config_result& out) {
  const input_shape& sh = in.shape;
  const config& c = out.cfg;
  const std::int32_t tokens = sh.tokens, m = o.min_position;
  const std::int32_t cu[2] = {0, tokens};
  const skim::problem p{.heads_q = sh.heads_q, .heads_kv = sh.heads_kv, .head_dim = sh.dim,
                        .block_q = c.block_q(), .block_kv = c.block,
                        .mask = o.causal ? skim::mask_kind::causal : skim::mask_kind::none,
                        .cu_seqlens_q = cu, .cu_seqlens_kv = cu, .scope = c.scope};
  // The restricted problem of the measured queries (header comment).
  const std::int32_t cu_measured[2] = {0, tokens - m};
  skim::problem pm = p;
  pm.cu_seqlens_q = cu_measured;
  pm.block_q = m == 0 ? p.block_q : std::gcd(m, p.block_q);

  const std::string where = "--config '" + c.spec + "': ";
  if (const skim::status s = pipe.can_implement(p); !s.ok()) return outcome::bad_input(where + s.message());

  // Buffers, reused by every layer and pass.
  std::vector<float> summaries(static_cast<std::size_t>(pipe.summary_floats(p)));
  const std::int32_t width = std::max(pipe.table_width(p), 1);
  const auto rows = static_cast<std::size_t>(pipe.selected_rows(p));
  std::vector<std::int32_t> ids(rows * static_cast<std::size_t>(width)), count(rows);
  const skim::index::mutable_block_table selected{.ids = ids, .count = count, .width = width};
  std::vector<float> o_sparse(static_cast<std::size_t>(tokens) * sh.heads_q * sh.dim), o_dense(o_sparse.size());
  std::vector<float> lse(static_cast<std::size_t>(tokens) * sh.heads_q), prior;
  const skim::exec::scalar dense_exec;
  skim::workspace_buffer ws(std::max(pipe.workspace_bytes(p), dense_exec.workspace_bytes(p)));
  const auto o_view = [&](std::vector<float>& o_buf) {
    return skim::strided_view<float>::token_major(o_buf.data(), tokens, sh.heads_q, sh.dim);
  };

  skim::metrics::quality_accumulator acc({.recall_at = o.recall_at});
  skim::metrics::cost_totals sparse_cost, dense_cost;
  std::vector<double> stage[4], sparse_total, dense_total;
  for (std::int32_t pass = 0; pass < o.repeat; ++pass) {
    skim::stage_times pass_times;
    double pass_sparse = 0.0, pass_dense = 0.0;
    for (std::int32_t layer = 0; layer < sh.layers; ++layer) {
      const auto q = in.q_view(layer);
      const skim::contiguous_kv<float> kv{.k = in.k_view(layer), .v = in.v_view(layer)};
      if (c.importance > 0.0f) attention_mass_prior(p, q, kv, prior);  // not timed: an oracle's input

      const skim::pipeline_args<float, skim::contiguous_kv<float>, float> a{
          .prob = p, .q = q, .kv = kv, .o = o_view(o_sparse), .lse = lse, .summaries = summaries,
          .mode = skim::summaries_mode::build, .prior = prior, .selected = selected};
      skim::stage_times t;
      const auto t0 = steady::now();
      if (const skim::status s = pipe.run(a, ws.span(), &t); !s.ok()) return outcome::failed(where + layer_error(layer, s));
      pass_sparse += std::chrono::duration<double>(steady::now() - t0).count();
      pass_times += t;

      const skim::attention_args<float, skim::contiguous_kv<float>, skim::index::causal_all, float> d{
          .prob = p, .q = q, .kv = kv, .index = {}, .o = o_view(o_dense), .lse = lse};
      const auto t1 = steady::now();
      if (const skim::status s = dense_exec.run(d, ws.span()); !s.ok()) {
        return outcome::failed(where + "dense " + layer_error(layer, s));
      }
      pass_dense += std::chrono::duration<double>(steady::now() - t1).count();

      if (pass != 0) continue;
      // Quality over the measured queries, cost over the rows that hold them.
      const skim::index::block_table table = selected;
      const measured_rows_index measured{.table = table, .full = p, .first_query = m, .shared = pipe.share_heads};
      const auto qm = skim::strided_view<const float>{q.data + static_cast<std::int64_t>(m) * q.token_stride,
                                                      tokens - m, q.heads, q.head_dim, q.token_stride, q.head_stride};
      if (const skim::status s = acc.add(layer, pm, qm, kv, measured); !s.ok()) {
        return outcome::failed(where + layer_error(layer, s));
      }
      const skim::status s = skim::for_each_row(p, [&](const skim::row_info& r) -> skim::status {
        if (r.q_end <= m) return skim::status::success();
        skim::metrics::row_cost rc, dc;
        if (pipe.share_heads) {
          SKIM_TRY(skim::metrics::measure_row_cost(
              p, r, skim::index::head_shared<skim::index::block_table>{table, p.index_heads()}, rc));
        } else {
          SKIM_TRY(skim::metrics::measure_row_cost(p, r, table, rc));
        }
        SKIM_TRY(skim::metrics::measure_row_cost(p, r, skim::index::causal_all{}, dc));
        sparse_cost.add(rc);
        dense_cost.add(dc);
        return skim::status::success();
      });
      if (!s.ok()) return outcome::failed(where + layer_error(layer, s));
    }
    stage[0].push_back(pass_times.summarize);
    stage[1].push_back(pass_times.score);
    stage[2].push_back(pass_times.select);
    stage[3].push_back(pass_times.execute);
    sparse_total.push_back(pass_sparse);
    dense_total.push_back(pass_dense);
  }
  out.block_q = p.block_q;
  out.block_kv = p.block_kv;
  out.kv_blocks = p.max_kv_blocks();
  out.quality = acc.summary();
  out.quality.cost = skim::metrics::summarize(sparse_cost);
  out.dense_cost = skim::metrics::summarize(dense_cost);
  out.times = {.summarize = median(stage[0]), .score = median(stage[1]), .select = median(stage[2]),
               .execute = median(stage[3])};
  out.sparse_seconds = median(sparse_total);
  out.dense_seconds = median(dense_total);
  return {};
}

template <class Summarizer>
[[nodiscard]] outcome evaluate_with(const inputs& in, const options& o, config_result& out) {
  namespace sel = skim::select;
  const config& c = out.cfg;
  const skim::route::pooled_router router{.pool = c.pool, .reduce = c.reduce};
  if (c.select == selector_kind::top_k) {
    const std::int32_t kv_blocks = (in.shape.tokens + c.block - 1) / c.block;
    out.dynamic_k = dynamic_k_for(c, kv_blocks);
    using pipeline = skim::sparse_attention<Summarizer, skim::route::pooled_router, sel::reserved<sel::top_k>,
                                            skim::exec::scalar>;
    const pipeline pipe{.router = router,
                        .selector = {.sink = c.sink, .local = c.local, .recency = c.recency,
                                     .importance = c.importance, .dynamic = {.k = out.dynamic_k}},
                        .share_heads = c.share,
                        .pool = c.share_pool};
    return evaluate(in, o, pipe, out);
  }
  using pipeline = skim::sparse_attention<Summarizer, skim::route::pooled_router, sel::reserved<sel::threshold>,
                                          skim::exec::scalar>;
  const pipeline pipe{.router = router,
                      .selector = {.sink = c.sink, .local = c.local, .recency = c.recency, .importance = c.importance,
                                   .dynamic = {.mode = c.mode, .tau = c.tau.value_or(0.0f), .k_min = c.k_min,
                                               .k_max = c.k_max}},
                      .share_heads = c.share,
                      .pool = c.share_pool};
  return evaluate(in, o, pipe, out);
}

[[nodiscard]] inline outcome evaluate_kmeans(const inputs& in, const options& o, config_result& out) {
  const config& c = out.cfg;
  const std::int32_t kv_blocks = (in.shape.tokens + c.block - 1) / c.block;
  out.dynamic_k = dynamic_k_for(c, kv_blocks);
  kmeans_storage state;
  const kmeans_pipeline<> pipe{.router = {.probe = c.probe, .pool = c.pool},
                             .selector = {.sink = c.sink, .local = c.local, .recency = c.recency,
                                          .importance = c.importance, .dynamic = {.k = out.dynamic_k}},
                             .build_options = {.iterations = c.iterations},
                             .clusters = c.clusters,
                             .state = &state};
  return evaluate(in, o, pipe, out);
}

[[nodiscard]] inline outcome evaluate_vertical_slash(const inputs& in, const options& o, config_result& out) {
  const config& c = out.cfg;
  vertical_slash_storage csr;
  const vertical_slash_pipeline<> pipe{.options = {.columns = c.columns, .diagonals = c.diagonals, .sink_blocks = c.sink,
                                                 .window_blocks = c.local, .last_q = c.last_q},
                                     .csr = &csr};
  return evaluate(in, o, pipe, out);
}

[[nodiscard]] inline outcome evaluate_tokens(const inputs& in, const options& o, config_result& out) {
  const config& c = out.cfg;
  out.dynamic_k = dynamic_k_for(c, in.shape.tokens);  // blocks of one key
  const tokens_pipeline pipe{.selector = {.t = out.dynamic_k, .sink = c.sink, .window = c.local}};
  return evaluate(in, o, pipe, out);
}

}  // namespace detail

// Evaluates one configuration: the router, then the runtime summarizer choice, picks the instantiation.
[[nodiscard]] inline outcome evaluate_config(const inputs& in, const options& o, const config& c, config_result& out) {
  namespace sum = skim::summarize;
  out = {};
  out.cfg = c;
  if (c.router == router_kind::kmeans) return detail::evaluate_kmeans(in, o, out);
  if (c.router == router_kind::vertical_slash) return detail::evaluate_vertical_slash(in, o, out);
  if (c.router == router_kind::tokens) return detail::evaluate_tokens(in, o, out);
  switch (c.summarizer) {
    case summarizer_kind::mean_pool: return detail::evaluate_with<sum::mean_pool>(in, o, out);
    case summarizer_kind::max_bound: return detail::evaluate_with<sum::max_bound>(in, o, out);
    case summarizer_kind::probe_max:
      switch (c.probes) {
        case 2: return detail::evaluate_with<sum::probe_max<2>>(in, o, out);
        case 4: return detail::evaluate_with<sum::probe_max<4>>(in, o, out);
        case 8: return detail::evaluate_with<sum::probe_max<8>>(in, o, out);
        default: break;
      }
      break;
    case summarizer_kind::multi_centroid:
      switch (c.centroids) {
        case 2: return detail::evaluate_with<sum::multi_centroid<2>>(in, o, out);
        case 4: return detail::evaluate_with<sum::multi_centroid<4>>(in, o, out);
        default: break;
      }
      break;
    case summarizer_kind::lsh:
      switch (c.rounds) {
        case 4: return detail::evaluate_with<sum::lsh_buckets<4, 4>>(in, o, out);
        case 8: return detail::evaluate_with<sum::lsh_buckets<8, 4>>(in, o, out);
        default: break;
      }
      break;
  }
  return outcome::bad_input("--config '" + c.spec + "': no instantiation for this summarizer choice");
}

// Checks the options against the inputs, then evaluates every configuration.
[[nodiscard]] inline outcome run_loaded(const inputs& in, const options& o, run_result& out) {
  out = {};
  out.shape = in.shape;
  out.opts = o;
  if (o.min_position >= in.shape.tokens) {
    return outcome::bad_input("--min-position " + std::to_string(o.min_position) + " >= tokens " +
                              std::to_string(in.shape.tokens) + ": no query to measure");
  }
  for (const config& c : o.configs) {
    config_result r;
    if (outcome e = evaluate_config(in, o, c, r); !e.ok()) return e;
    out.configs.push_back(std::move(r));
  }
  return {};
}

// Reads the files named in the options and evaluates every configuration.
[[nodiscard]] inline outcome run(const options& o, run_result& out) {
  inputs in;
  if (std::string e = load_inputs(o.q_path, o.k_path, o.v_path, in); !e.empty()) return outcome::bad_input(e);
  return run_loaded(in, o, out);
}

}  // namespace skim_eval
