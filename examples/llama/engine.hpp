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
// The options, statistics, per-layer state and the dense backend are in backend.hpp; the routed,
// oracle and evicting backends, and the factory that picks one, in engine_backends.cpp, which a
// program including this header links (CMake: skim_llama_backends).

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
#include "llama/forward.hpp"
#include "llama/model.hpp"
#include "skim/defaults.hpp"

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
      rest.append(rest.empty() ? "" : ",").append(item);
    }
  }
  // Appended piecewise, as below: g++ 12 -O3 warns (-Wrestrict) on `rest += "," + std::string(...)`.
  if (!budget_given && !vertical_slash) rest.append(rest.empty() ? "" : ",").append("budget=1");
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

// The backends an engine's options ask for: the policy's, and (dense_layers > 0) dense attention
// for the first layers. Defined in engine_backends.cpp, which instantiates every summarizer,
// selector and executor the options can name: most of the engine's build time, paid once by each
// program that links it rather than by every file that includes this header.
struct backends {
  std::unique_ptr<backend> policy;
  std::unique_ptr<backend> dense;  // null without dense_layers
};
[[nodiscard]] backends make_backends(const shared_setup& s);

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
    engine_detail::backends b = engine_detail::make_backends(s);
    backend_ = std::move(b.policy);
    dense_ = std::move(b.dense);
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
