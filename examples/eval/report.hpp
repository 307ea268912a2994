#pragma once
// skim-eval's output: a text report per configuration, or one JSON object for the whole run.
//
// Every quality number is a tail_summary (metrics/tail.hpp): mean, p1, p5, p50, worst, where p1
// and p5 are on the *bad* side — the 1st/5th percentiles of recall and coverage, the 99th/95th of
// output error and tiles per row — and worst is the min (recall, coverage) or max (error, tiles).
// "worst head" is the (layer, query head) with the worst mean.
//
// JSON (stable keys; NaN and infinities are written as null):
// {"inputs": {"q", "k", "v", "layers", "tokens", "heads_q", "heads_kv", "head_dim", "causal",
//             "min_position", "repeat", "recall_at"},
//  "configs": [{"spec", "block_q", "block_kv", "kv_blocks", "dynamic_k", "rows", "rows_without_keys",
//               "recall": [{"t", "mean", "p1", "p5", "p50", "worst", "worst_head": {"layer", "head", "mean"}}],
//               "coverage": {... as one recall entry without "t"}, "error": {... the same},
//               "cost": {"index_rows", "tiles", "keys_read", "pairs_read", "pairs_needed", "utilisation",
//                        "dense_keys_read", "dense_pairs", "density", "tiles_per_row": {"mean", "p1", "p5",
//                        "p50", "worst"}},
//               "time_s": {"summarize", "score", "select", "execute", "pipeline", "dense", "ratio"},
//               "heads": [{"layer", "head", "rows", "coverage", "error", "recall": [...]}]}]}

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "run.hpp"
#include "skim/metrics/quality.hpp"

namespace skim_eval {

namespace detail {

inline std::string json_string(std::string_view s) {
  std::string r = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      r += '\\';
      r += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      r += buf;
    } else {
      r += ch;
    }
  }
  return r + "\"";
}

inline std::string json_number(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

inline std::string json_tail(const skim::metrics::tail_summary& t) {
  return "\"mean\": " + json_number(t.mean) + ", \"p1\": " + json_number(t.p1) + ", \"p5\": " + json_number(t.p5) +
         ", \"p50\": " + json_number(t.p50) + ", \"worst\": " + json_number(t.worst);
}

inline std::string json_head(const skim::metrics::head_ref& h) {
  return "{\"layer\": " + std::to_string(h.layer) + ", \"head\": " + std::to_string(h.head) +
         ", \"mean\": " + json_number(h.mean) + "}";
}

inline void text_row(std::FILE* f, const char* name, const skim::metrics::tail_summary& t,
                     const skim::metrics::head_ref* worst) {
  std::fprintf(f, "  %-14s %8.4f %8.4f %8.4f %8.4f %8.4f", name, t.mean, t.p1, t.p5, t.p50, t.worst);
  if (worst != nullptr && worst->layer >= 0) std::fprintf(f, "   layer %d head %d: %.4f", worst->layer, worst->head, worst->mean);
  std::fputc('\n', f);
}

inline double ms(double seconds) { return seconds * 1e3; }

}  // namespace detail

inline void print_text(const run_result& r, std::FILE* f) {
  const input_shape& s = r.shape;
  std::fprintf(f, "inputs: %s, %s, %s\n", r.opts.q_path.c_str(), r.opts.k_path.c_str(), r.opts.v_path.c_str());
  std::fprintf(f,
               "  %d layers x %d tokens, %d query heads, %d kv heads (group %d), head dim %d, %s; "
               "measuring queries at positions >= %d\n",
               s.layers, s.tokens, s.heads_q, s.heads_kv, s.group_size(), s.dim, r.opts.causal ? "causal" : "no mask",
               r.opts.min_position);
  for (std::size_t i = 0; i < r.configs.size(); ++i) {
    const config_result& c = r.configs[i];
    const auto& q = c.quality;
    std::fprintf(f, "\n[%zu] %s\n", i + 1, c.cfg.spec.c_str());
    std::fprintf(f, "  blocks: bq %d, bk %d, %d kv blocks per layer", c.block_q, c.block_kv, c.kv_blocks);
    if (c.dynamic_k >= 0) std::fprintf(f, ", top_k k = %d", c.dynamic_k);
    std::fprintf(f, "; %lld (query, head) rows measured, %lld without keys\n", static_cast<long long>(q.rows),
                 static_cast<long long>(q.rows_without_keys));
    std::fprintf(f, "  %-14s %8s %8s %8s %8s %8s   %s\n", "", "mean", "p1", "p5", "p50", "worst", "worst head (mean)");
    for (std::size_t t = 0; t < q.recall_at.size(); ++t) {
      const std::string name = "recall@" + std::to_string(q.recall_at[t]);
      detail::text_row(f, name.c_str(), q.recall[t], &q.worst_recall_head[t]);
    }
    detail::text_row(f, "coverage", q.coverage, &q.worst_coverage_head);
    detail::text_row(f, "error", q.error, &q.worst_error_head);
    detail::text_row(f, "tiles/row", q.cost.tiles_per_row, nullptr);
    std::fprintf(f, "  (p1/p5 are the bad side: 99th/95th percentiles for error and tiles/row)\n");
    const double rows = static_cast<double>(q.cost.index_rows);
    std::fprintf(f,
                 "  keys read per index row %.1f of %.1f (dense, causal); pairs read %lld, needed %lld "
                 "(utilisation %.3f)\n",
                 rows > 0 ? static_cast<double>(q.cost.keys_read) / rows : std::nan(""),
                 rows > 0 ? static_cast<double>(c.dense_cost.keys_read) / rows : std::nan(""),
                 static_cast<long long>(q.cost.pairs_read), static_cast<long long>(q.cost.pairs_needed),
                 q.cost.utilisation());
    std::fprintf(f, "  density %.4f (pairs read / visible pairs of dense, %lld index rows)\n", c.density(),
                 static_cast<long long>(q.cost.index_rows));
    std::fprintf(f,
                 "  time (ms, median of %d, summed over %d layers): summarize %.3f  score %.3f  select %.3f  "
                 "execute %.3f  pipeline %.3f | dense %.3f | sparse/dense %.2f\n",
                 r.opts.repeat, s.layers, detail::ms(c.times.summarize), detail::ms(c.times.score),
                 detail::ms(c.times.select), detail::ms(c.times.execute), detail::ms(c.sparse_seconds),
                 detail::ms(c.dense_seconds), c.time_ratio());
    if (r.opts.head_table) std::fprintf(f, "\n%s", skim::metrics::head_table_markdown(q).c_str());
  }
}

[[nodiscard]] inline std::string to_json(const run_result& r) {
  using namespace detail;
  const input_shape& s = r.shape;
  std::string j = "{\"inputs\": {\"q\": " + json_string(r.opts.q_path) + ", \"k\": " + json_string(r.opts.k_path) +
                  ", \"v\": " + json_string(r.opts.v_path) + ", \"layers\": " + std::to_string(s.layers) +
                  ", \"tokens\": " + std::to_string(s.tokens) + ", \"heads_q\": " + std::to_string(s.heads_q) +
                  ", \"heads_kv\": " + std::to_string(s.heads_kv) + ", \"head_dim\": " + std::to_string(s.dim) +
                  ", \"causal\": " + (r.opts.causal ? "true" : "false") +
                  ", \"min_position\": " + std::to_string(r.opts.min_position) +
                  ", \"repeat\": " + std::to_string(r.opts.repeat) + ", \"recall_at\": [";
  for (std::size_t t = 0; t < r.opts.recall_at.size(); ++t) j += (t ? ", " : "") + std::to_string(r.opts.recall_at[t]);
  j += "]},\n \"configs\": [";
  for (std::size_t i = 0; i < r.configs.size(); ++i) {
    const config_result& c = r.configs[i];
    const auto& q = c.quality;
    j += i ? ",\n  {" : "\n  {";
    j += "\"spec\": " + json_string(c.cfg.spec) + ", \"block_q\": " + std::to_string(c.block_q) +
         ", \"block_kv\": " + std::to_string(c.block_kv) + ", \"kv_blocks\": " + std::to_string(c.kv_blocks) +
         ", \"dynamic_k\": " + (c.dynamic_k >= 0 ? std::to_string(c.dynamic_k) : "null") +
         ", \"rows\": " + std::to_string(q.rows) + ", \"rows_without_keys\": " + std::to_string(q.rows_without_keys);
    j += ",\n   \"recall\": [";
    for (std::size_t t = 0; t < q.recall_at.size(); ++t) {
      j += (t ? ", " : "") + std::string("{\"t\": ") + std::to_string(q.recall_at[t]) + ", " + json_tail(q.recall[t]) +
           ", \"worst_head\": " + json_head(q.worst_recall_head[t]) + "}";
    }
    j += "],\n   \"coverage\": {" + json_tail(q.coverage) + ", \"worst_head\": " + json_head(q.worst_coverage_head) + "}";
    j += ",\n   \"error\": {" + json_tail(q.error) + ", \"worst_head\": " + json_head(q.worst_error_head) + "}";
    j += ",\n   \"cost\": {\"index_rows\": " + std::to_string(q.cost.index_rows) +
         ", \"tiles\": " + std::to_string(q.cost.tiles) + ", \"keys_read\": " + std::to_string(q.cost.keys_read) +
         ", \"pairs_read\": " + std::to_string(q.cost.pairs_read) +
         ", \"pairs_needed\": " + std::to_string(q.cost.pairs_needed) +
         ", \"utilisation\": " + json_number(q.cost.utilisation()) +
         ", \"dense_keys_read\": " + std::to_string(c.dense_cost.keys_read) +
         ", \"dense_pairs\": " + std::to_string(c.dense_cost.pairs_needed) +
         ", \"density\": " + json_number(c.density()) + ", \"tiles_per_row\": {" + json_tail(q.cost.tiles_per_row) + "}}";
    j += ",\n   \"time_s\": {\"summarize\": " + json_number(c.times.summarize) +
         ", \"score\": " + json_number(c.times.score) + ", \"select\": " + json_number(c.times.select) +
         ", \"execute\": " + json_number(c.times.execute) + ", \"pipeline\": " + json_number(c.sparse_seconds) +
         ", \"dense\": " + json_number(c.dense_seconds) + ", \"ratio\": " + json_number(c.time_ratio()) + "}";
    j += ",\n   \"heads\": [";
    for (std::size_t h = 0; h < q.heads.size(); ++h) {
      const auto& hq = q.heads[h];
      j += (h ? ", " : "") + std::string("{\"layer\": ") + std::to_string(hq.layer) +
           ", \"head\": " + std::to_string(hq.head) + ", \"rows\": " + std::to_string(hq.rows) +
           ", \"coverage\": " + json_number(hq.coverage) + ", \"error\": " + json_number(hq.error) + ", \"recall\": [";
      for (std::size_t t = 0; t < hq.recall.size(); ++t) j += (t ? ", " : "") + json_number(hq.recall[t]);
      j += "]}";
    }
    j += "]}";
  }
  j += "]}\n";
  return j;
}

}  // namespace skim_eval
