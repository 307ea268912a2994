#pragma once
// skim-eval's command line: the options and the configuration specs (namespace skim_eval).
//
//   skim-eval --q Q.npy --k K.npy --v V.npy [--causal|--no-causal] [--recall 8,16,32] [--json]
//             [--min-position N] [--repeat N] [--head-table] --config SPEC [--config SPEC ...]
//
// A SPEC is a comma list of key=value (config_keys below lists them; the defaults are skim::defaults'
// decode routing: multi_centroid of 2, blocks of 4, one query per row, sink 1, local 8, reduce sum, kv scope):
//   summarizer=max_bound,block=16,bq=16,select=top_k,k=8,sink=1,local=1,recency=1,pool=max
// budget=B (0 < B <= 1, top_k only) replaces k: the longest row (the last query block, which sees
// every kv block) reads ceil(B × kv blocks) blocks, reserved ones included, i.e.
//   k = max(0, ceil(B × kv_blocks) − min(sink, kv_blocks) − max(local, recency))
// for every row of the layer (shorter rows take min(k, what they see)). budget=1 reads every block.
//
// Parsing never throws and never exits: each function returns an error text (empty when all is
// well) that names the bad item, e.g. "--config 'select=topk': unknown selector 'topk' (top_k,
// threshold)"; main() prefixes "skim-eval: " and exits with status 2.

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "skim/core/problem.hpp"
#include "skim/defaults.hpp"
#include "skim/pipeline.hpp"
#include "skim/route/pooled_router.hpp"
#include "skim/select/threshold.hpp"

namespace skim_eval {

enum class summarizer_kind : std::uint8_t { mean_pool, max_bound, probe_max, multi_centroid, lsh };
enum class selector_kind : std::uint8_t { top_k, threshold };
// Where a configuration's block ids come from: block summaries scored by pooled_router (then the
// selector), k-means centroids scored by kmeans_router (then the selector), or the vertical-slash
// prefill pattern (index::build_vertical_slash, which chooses the blocks itself), or the token-level
// indexer (select::top_tokens over blocks of one key: the blocks it keeps are its tokens).
enum class router_kind : std::uint8_t { pooled, kmeans, vertical_slash, tokens };

// One pipeline to evaluate, as given by a --config SPEC.
struct config {
  std::string spec;  // the text it came from, for reports
  // The defaults are skim/defaults.hpp's decode routing (one query per row).
  summarizer_kind summarizer = summarizer_kind::multi_centroid;
  std::int32_t probes = 4;     // probe_max: 2, 4 or 8
  std::int32_t centroids = 2;  // multi_centroid: 2 or 4
  std::int32_t rounds = 4;     // lsh: 4 or 8 rounds of 4-bit SimHash buckets
  router_kind router = router_kind::pooled;
  std::int32_t clusters = 32;  // kmeans: centroids per (layer, kv head)
  std::int32_t probe = 4;      // kmeans: nearest centroids probed per query head
  std::int32_t iterations = 4; // kmeans: Lloyd iterations of the build
  std::int32_t columns = 64;   // vertical_slash: key columns kept per (layer, index head)
  std::int32_t diagonals = 64; // vertical_slash: diagonals kept per (layer, index head)
  std::int32_t last_q = 64;    // vertical_slash: last queries the pattern is estimated from
  std::int32_t block = skim::defaults::block_kv;  // bk, keys per block
  std::int32_t bq = 1;         // queries per block; 0: the same as block
  selector_kind select = selector_kind::top_k;
  std::optional<std::int32_t> k;  // top_k: blocks beyond the reserved ones
  std::optional<double> budget;   // top_k: share of the kv blocks, (0, 1] (see the header comment)
  skim::select::threshold_mode mode = skim::select::threshold_mode::relative;
  std::optional<float> tau;       // threshold: required
  std::int32_t k_min = 0;
  std::int32_t k_max = std::numeric_limits<std::int32_t>::max();
  std::int32_t sink = skim::defaults::sink_blocks;    // reserved: first blocks
  std::int32_t local = skim::defaults::local_blocks;  // reserved: newest visible blocks
  bool recency = true;         // reserved: the newest visible block
  float importance = 0.0f;     // reserved: share of the dynamic budget by the oracle prior (run.hpp)
  skim::route::query_pool pool = skim::route::query_pool::last;
  skim::route::group_reduce reduce = skim::defaults::reduce;
  skim::index_scope scope = skim::defaults::scope;
  bool share = false;          // one selection per query block for all its heads (sparse_attention::share_heads)
  skim::head_pool share_pool = skim::head_pool::relative;  // share=1: relative; share=max: the raw maximum

  [[nodiscard]] std::int32_t block_q() const noexcept { return bq > 0 ? bq : block; }
};

struct options {
  std::string q_path, k_path, v_path;
  bool causal = true;
  std::vector<std::int32_t> recall_at{8, 16, 32};
  bool json = false;
  bool head_table = false;        // text output: the per-(layer, head) table after each config
  std::int32_t min_position = 0;  // measure quality only for queries at positions >= this
  std::int32_t repeat = 3;        // timed runs per config; times are medians
  std::vector<config> configs;
  bool help = false;
};

inline constexpr std::string_view usage_text =
    "usage: skim-eval --q Q.npy --k K.npy --v V.npy [--causal|--no-causal] [--recall 8,16,32]\n"
    "                 [--json] [--min-position N] [--repeat N] [--head-table] --config SPEC [--config SPEC ...]\n"
    "\n"
    "Evaluates sparse-attention pipelines on Q, K, V dumped from a model, against dense attention.\n"
    "  Q.npy  [tokens, heads_q, dim] or [layers, heads_q, tokens, dim], float32 or float16\n"
    "  K.npy, V.npy  the same layout with heads_kv (heads_q % heads_kv == 0: GQA)\n"
    "Each layer is one sequence; causal (bottom-right) unless --no-causal.\n"
    "  --recall LIST       the t of recall@t (default 8,16,32)\n"
    "  --min-position N    measure only queries at positions >= N (default 0)\n"
    "  --repeat N          timed runs per config, median reported (default 3)\n"
    "  --json              one JSON object for the whole run instead of text\n"
    "  --head-table        text: print the per-(layer, head) means after each config\n"
    "SPEC: comma list of key=value, e.g.\n"
    "  summarizer=max_bound,block=16,select=top_k,k=8,sink=1,local=1,recency=1,pool=max,reduce=max,scope=kv\n"
    "  summarizer  mean_pool | max_bound | probe_max (probes=2|4|8) | multi_centroid (centroids=2|4)\n"
    "              | lsh (rounds=4|8: SimHash buckets of 4 bits; scores are collision counts, for top_k)\n"
    "  block, bq   key / query block sizes (bq=0: the same as block)\n"
    "  defaults    summarizer=multi_centroid,centroids=2,block=4,bq=1,sink=1,local=8,recency=1,reduce=sum,scope=kv\n"
    "  select      top_k (k=N or budget=B) | threshold (mode=absolute|relative|mass, tau, k_min, k_max)\n"
    "  budget=B    top_k with k = ceil(B x kv blocks) - reserved blocks (sink + max(local, recency))\n"
    "  sink=N local=N recency=0|1 importance=S   reserved branches; importance ranks by the dense\n"
    "              attention mass of each block (an oracle prior)\n"
    "  pool=last|mean|max reduce=max|mean|sum scope=kv|query   router and index heads\n"
    "  router      pooled (block summaries, the default) | kmeans (clusters=N, probe=N, iterations=N:\n"
    "              centroids of each layer's keys; a query takes its probe nearest centroids' blocks)\n"
    "              | vertical_slash (columns=N, diagonals=N, last_q=N, with sink and local as the\n"
    "              reserved blocks: the prefill pattern estimated from the last queries; no selector)\n"
    "              | tokens (block=1: select::top_tokens keeps each row's best keys by exact q.k,\n"
    "              heads by max, sink and local counting keys; token_gather attends; k or budget)\n"
    "  share=0|1|max  one selection per query block for all its heads: 1 pools the heads' scores by\n"
    "              their maximum after each head's less its best block's, max by the raw maximum\n";

namespace detail {

inline std::string quote(std::string_view s) {
  std::string r(1, '\'');
  r.append(s);
  r += '\'';
  return r;
}

inline bool parse_int(std::string_view s, std::int32_t& out) {
  if (s.empty()) return false;
  if (s.front() == '+') s.remove_prefix(1);
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc{} && end == s.data() + s.size();
}

inline bool parse_float(std::string_view s, double& out) {
  if (s.empty()) return false;
  if (s.front() == '+') s.remove_prefix(1);
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc{} && end == s.data() + s.size();
}

// "a, b, c" of a list of names.
inline std::string choices(std::initializer_list<std::string_view> names) {
  std::string s;
  for (std::string_view n : names) s += (s.empty() ? "" : ", ") + std::string(n);
  return s;
}

}  // namespace detail

inline constexpr std::string_view config_keys =
    "summarizer, probes, centroids, rounds, block, bq, select, k, budget, mode, tau, k_min, k_max, sink, local, recency, "
    "importance, pool, reduce, scope, share, router, clusters, probe, iterations, columns, diagonals, last_q";

// Parses one SPEC into `out` (starting from the defaults). Returns "" or the error text.
[[nodiscard]] inline std::string parse_config(std::string_view spec, config& out) {
  using detail::quote;
  config c;
  c.spec = std::string(spec);
  const std::string where = "--config " + quote(spec) + ": ";
  if (spec.empty()) return where + "empty configuration";
  std::vector<std::string> seen;

  std::size_t pos = 0;
  while (pos <= spec.size()) {
    const std::size_t comma = std::min(spec.find(',', pos), spec.size());
    const std::string_view item = spec.substr(pos, comma - pos);
    pos = comma + 1;
    if (item.empty()) return where + "empty item (two commas, or a comma at an end)";
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos) return where + quote(item) + " is not key=value";
    const std::string_view key = item.substr(0, eq), value = item.substr(eq + 1);
    for (const std::string& s : seen) {
      if (s == key) return where + "key " + quote(key) + " given twice";
    }
    seen.emplace_back(key);
    if (value.empty()) return where + "key " + quote(key) + " has no value";

    const auto integer = [&](std::int32_t& dst, std::int32_t lo, std::int32_t hi) -> std::string {
      std::int32_t v = 0;
      if (!detail::parse_int(value, v)) return where + std::string(key) + " " + quote(value) + " is not an integer";
      if (v < lo || v > hi) {
        return where + std::string(key) + " " + std::string(value) + " outside [" + std::to_string(lo) + ", " +
               std::to_string(hi) + "]";
      }
      dst = v;
      return {};
    };
    const auto real = [&](double& dst) -> std::string {
      if (!detail::parse_float(value, dst) || !std::isfinite(dst)) {
        return where + std::string(key) + " " + quote(value) + " is not a finite number";
      }
      return {};
    };
    constexpr std::int32_t max_block = 1 << 16;
    constexpr std::int32_t max_int = std::numeric_limits<std::int32_t>::max();
    std::string err;

    if (key == "summarizer") {
      if (value == "mean_pool") c.summarizer = summarizer_kind::mean_pool;
      else if (value == "max_bound") c.summarizer = summarizer_kind::max_bound;
      else if (value == "probe_max") c.summarizer = summarizer_kind::probe_max;
      else if (value == "multi_centroid") c.summarizer = summarizer_kind::multi_centroid;
      else if (value == "lsh") c.summarizer = summarizer_kind::lsh;
      else {
        return where + "unknown summarizer " + quote(value) + " (" +
               detail::choices({"mean_pool", "max_bound", "probe_max", "multi_centroid", "lsh"}) + ")";
      }
    } else if (key == "rounds") {
      if (value == "4" || value == "8") c.rounds = value[0] - '0';
      else return where + "rounds " + quote(value) + " unsupported (4, 8)";
    } else if (key == "probes") {
      if (value == "2" || value == "4" || value == "8") c.probes = value[0] - '0';
      else return where + "probes " + quote(value) + " unsupported (2, 4, 8)";
    } else if (key == "centroids") {
      if (value == "2" || value == "4") c.centroids = value[0] - '0';
      else return where + "centroids " + quote(value) + " unsupported (2, 4)";
    } else if (key == "router") {
      if (value == "pooled") c.router = router_kind::pooled;
      else if (value == "kmeans") c.router = router_kind::kmeans;
      else if (value == "vertical_slash") c.router = router_kind::vertical_slash;
      else if (value == "tokens") c.router = router_kind::tokens;
      else return where + "unknown router " + quote(value) + " (" + detail::choices({"pooled", "kmeans", "vertical_slash", "tokens"}) + ")";
    } else if (key == "clusters") {
      err = integer(c.clusters, 1, 4096);
    } else if (key == "probe") {
      err = integer(c.probe, 1, 4096);
    } else if (key == "iterations") {
      err = integer(c.iterations, 1, 100);
    } else if (key == "columns") {
      err = integer(c.columns, 0, max_int);
    } else if (key == "diagonals") {
      err = integer(c.diagonals, 0, max_int);
    } else if (key == "last_q") {
      err = integer(c.last_q, 1, max_int);
    } else if (key == "block") {
      err = integer(c.block, 1, max_block);
    } else if (key == "bq") {
      err = integer(c.bq, 1, max_block);
    } else if (key == "select") {
      if (value == "top_k") c.select = selector_kind::top_k;
      else if (value == "threshold") c.select = selector_kind::threshold;
      else return where + "unknown selector " + quote(value) + " (top_k, threshold)";
    } else if (key == "k") {
      std::int32_t v = 0;
      err = integer(v, 0, max_int);
      c.k = v;
    } else if (key == "budget") {
      double v = 0.0;
      err = real(v);
      if (err.empty() && !(v > 0.0 && v <= 1.0)) err = where + "budget " + std::string(value) + " outside (0, 1]";
      c.budget = v;
    } else if (key == "mode") {
      using skim::select::threshold_mode;
      if (value == "absolute") c.mode = threshold_mode::absolute;
      else if (value == "relative") c.mode = threshold_mode::relative;
      else if (value == "mass") c.mode = threshold_mode::mass;
      else return where + "unknown threshold mode " + quote(value) + " (absolute, relative, mass)";
    } else if (key == "tau") {
      double v = 0.0;
      err = real(v);
      c.tau = static_cast<float>(v);
    } else if (key == "k_min") {
      err = integer(c.k_min, 0, max_int);
    } else if (key == "k_max") {
      err = integer(c.k_max, 0, max_int);
    } else if (key == "sink") {
      err = integer(c.sink, 0, max_int);
    } else if (key == "local") {
      err = integer(c.local, 0, max_int);
    } else if (key == "recency") {
      if (value == "1" || value == "true") c.recency = true;
      else if (value == "0" || value == "false") c.recency = false;
      else return where + "recency " + quote(value) + " is not 0 or 1";
    } else if (key == "importance") {
      double v = 0.0;
      err = real(v);
      if (err.empty() && !(v >= 0.0 && v <= 1.0)) err = where + "importance " + std::string(value) + " outside [0, 1]";
      c.importance = static_cast<float>(v);
    } else if (key == "pool") {
      using skim::route::query_pool;
      if (value == "last") c.pool = query_pool::last;
      else if (value == "mean") c.pool = query_pool::mean;
      else if (value == "max") c.pool = query_pool::max;
      else return where + "unknown pool " + quote(value) + " (last, mean, max)";
    } else if (key == "reduce") {
      using skim::route::group_reduce;
      if (value == "max") c.reduce = group_reduce::max;
      else if (value == "mean") c.reduce = group_reduce::mean;
      else if (value == "sum") c.reduce = group_reduce::sum;
      else return where + "unknown reduce " + quote(value) + " (max, mean, sum)";
    } else if (key == "scope") {
      if (value == "kv") c.scope = skim::index_scope::kv_head;
      else if (value == "query") c.scope = skim::index_scope::query_head;
      else return where + "unknown scope " + quote(value) + " (kv, query)";
    } else if (key == "share") {
      if (value == "1" || value == "true") c.share = true, c.share_pool = skim::head_pool::relative;
      else if (value == "max") c.share = true, c.share_pool = skim::head_pool::max;
      else if (value == "0" || value == "false") c.share = false;
      else return where + "share " + quote(value) + " is not 0, 1 or max";
    } else {
      return where + "unknown key " + quote(key) + " (" + std::string(config_keys) + ")";
    }
    if (!err.empty()) return err;
  }

  // Keys that belong to another choice, and what each choice needs.
  const auto given = [&](std::string_view key) {
    for (const std::string& s : seen) {
      if (s == key) return true;
    }
    return false;
  };
  if (given("probes") && c.summarizer != summarizer_kind::probe_max) return where + "probes needs summarizer=probe_max";
  if (given("rounds") && c.summarizer != summarizer_kind::lsh) return where + "rounds needs summarizer=lsh";
  if (c.share && c.importance > 0.0f) return where + "share=1 takes no importance (its prior is per index head)";
  if (given("centroids") && c.summarizer != summarizer_kind::multi_centroid) {
    return where + "centroids needs summarizer=multi_centroid";
  }
  for (std::string_view key : {"clusters", "probe", "iterations"}) {
    if (given(key) && c.router != router_kind::kmeans) return where + std::string(key) + " needs router=kmeans";
  }
  for (std::string_view key : {"columns", "diagonals", "last_q"}) {
    if (given(key) && c.router != router_kind::vertical_slash) {
      return where + std::string(key) + " needs router=vertical_slash";
    }
  }
  if (c.router != router_kind::pooled) {
    const std::string name = c.router == router_kind::kmeans           ? "kmeans"
                             : c.router == router_kind::vertical_slash ? "vertical_slash"
                                                                       : "tokens";
    for (std::string_view key : {"summarizer", "reduce", "share"}) {
      if (given(key)) return where + std::string(key) + " needs router=pooled (not " + name + ")";
    }
    if (c.router == router_kind::kmeans && c.pool == skim::route::query_pool::max) {
      return where + "router=kmeans takes pool=last or pool=mean";
    }
  }
  if (c.router == router_kind::tokens) {
    for (std::string_view key : {"select", "mode", "tau", "k_min", "k_max", "recency", "importance", "pool"}) {
      if (given(key)) return where + std::string(key) + " does not apply to router=tokens (top_tokens selects)";
    }
    if (given("block") && c.block != 1) return where + "router=tokens takes block=1 (its blocks are keys)";
    c.block = 1;
    c.recency = false;  // the newest key is in the local window
  }
  if (c.router == router_kind::vertical_slash) {
    for (std::string_view key : {"select", "k", "budget", "mode", "tau", "k_min", "k_max", "recency", "importance", "pool"}) {
      if (given(key)) return where + std::string(key) + " does not apply to router=vertical_slash (it selects itself)";
    }
    c.recency = false;  // its window is `local`
    out = std::move(c);
    return {};
  }
  if (c.select == selector_kind::top_k) {
    for (std::string_view key : {"mode", "tau", "k_min", "k_max"}) {
      if (given(key)) return where + std::string(key) + " needs select=threshold";
    }
    if (c.k && c.budget) return where + "k and budget exclude each other";
    if (!c.k && !c.budget) return where + "top_k needs k=N or budget=B";
  } else {
    for (std::string_view key : {"k", "budget"}) {
      if (given(key)) return where + std::string(key) + " needs select=top_k (threshold takes k_min, k_max)";
    }
    if (!c.tau) return where + "threshold needs tau";
    if (c.k_min > c.k_max) return where + "k_min " + std::to_string(c.k_min) + " > k_max " + std::to_string(c.k_max);
    skim::select::threshold t{.mode = c.mode, .tau = *c.tau, .k_min = c.k_min, .k_max = c.k_max};
    if (const skim::status s = t.validate(); !s.ok()) return where + s.message();
  }
  out = std::move(c);
  return {};
}

// Parses argv[1..argc). Returns "" or the error text; out.help is set by --help / -h.
[[nodiscard]] inline std::string parse_options(int argc, const char* const* argv, options& out) {
  using detail::quote;
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    std::string_view inline_value;
    bool has_inline = false;
    if (a.starts_with("--")) {
      if (const std::size_t eq = a.find('='); eq != std::string_view::npos) {
        inline_value = a.substr(eq + 1);
        a = a.substr(0, eq);
        has_inline = true;
      }
    }
    const auto value = [&](std::string_view& v) -> std::string {
      if (has_inline) {
        v = inline_value;
        return {};
      }
      if (i + 1 >= argc) return std::string(a) + " needs a value";
      v = argv[++i];
      return {};
    };
    const auto flag = [&]() -> std::string {
      return has_inline ? std::string(a) + " takes no value" : std::string();
    };
    std::string err;
    std::string_view v;
    if (a == "--help" || a == "-h") {
      o.help = true;
    } else if (a == "--q" || a == "--k" || a == "--v") {
      err = value(v);
      if (err.empty() && v.empty()) err = std::string(a) + " needs a path";
      (a == "--q" ? o.q_path : a == "--k" ? o.k_path : o.v_path) = std::string(v);
    } else if (a == "--causal" || a == "--no-causal") {
      err = flag();
      o.causal = a == "--causal";
    } else if (a == "--json") {
      err = flag();
      o.json = true;
    } else if (a == "--head-table") {
      err = flag();
      o.head_table = true;
    } else if (a == "--recall") {
      err = value(v);
      if (err.empty()) {
        o.recall_at.clear();
        std::size_t pos = 0;
        while (err.empty() && pos <= v.size()) {
          const std::size_t comma = std::min(v.find(',', pos), v.size());
          const std::string_view item = v.substr(pos, comma - pos);
          pos = comma + 1;
          std::int32_t t = 0;
          if (!detail::parse_int(item, t) || t < 1) {
            err = "--recall " + quote(v) + ": " + quote(item) + " is not a positive integer";
          }
          o.recall_at.push_back(t);
        }
      }
    } else if (a == "--min-position" || a == "--repeat") {
      err = value(v);
      std::int32_t n = 0;
      const std::int32_t lo = a == "--repeat" ? 1 : 0;
      if (err.empty() && (!detail::parse_int(v, n) || n < lo)) {
        err = std::string(a) + " " + quote(v) + " is not an integer >= " + std::to_string(lo);
      }
      (a == "--repeat" ? o.repeat : o.min_position) = n;
    } else if (a == "--config") {
      err = value(v);
      config c;
      if (err.empty()) err = parse_config(v, c);
      o.configs.push_back(std::move(c));
    } else {
      err = "unknown option " + quote(argv[i]) + " (see --help)";
    }
    if (!err.empty()) return err;
  }
  if (o.help) {
    out = std::move(o);
    return {};
  }
  if (o.q_path.empty()) return "missing --q (see --help)";
  if (o.k_path.empty()) return "missing --k (see --help)";
  if (o.v_path.empty()) return "missing --v (see --help)";
  if (o.configs.empty()) return "no --config given (see --help)";
  out = std::move(o);
  return {};
}

}  // namespace skim_eval
