#pragma once
// What skim-llama's attention backends share (engine.hpp, family_backends.hpp): the engine's
// options, its statistics, the per-layer state, the problem and paged view of one call, the
// counting of what a selection read, and the backend interface.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "eval/options.hpp"
#include "eval/routers.hpp"
#include "llama/block_mass.hpp"
#include "llama/forward.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/views.hpp"
#include "skim/core/workspace.hpp"
#include "skim/core/attention_args.hpp"
#include "skim/exec/cpu/scalar.hpp"
#include "skim/index/block_table.hpp"
#include "skim/index/causal_all.hpp"
#include "skim/pipeline.hpp"
#if __has_include("skim/exec/cpu/simd.hpp")
#include "skim/exec/cpu/simd.hpp"
#define SKIM_LLAMA_HAS_SIMD 1
#endif

namespace skim_llama {

enum class attention_policy : std::uint8_t { dense, skim, recency, random, oracle };
enum class executor_kind : std::uint8_t { scalar, simd };
enum class eviction : std::uint8_t { none, attention_mass, recency, summary_score };

struct engine_options {
  attention_policy policy = attention_policy::dense;
#ifdef SKIM_LLAMA_HAS_SIMD
  executor_kind exec = executor_kind::simd;  // exec=scalar in a spec for the portable executor
#else
  executor_kind exec = executor_kind::scalar;
#endif
  skim_eval::config sparse{};   // summarizer, block, bq, select, k | budget, threshold, sink, local, recency, pool, reduce, scope, router
  bool tokens = false;          // router=tokens (family_backends.hpp): top_tokens and token_gather
  std::uint64_t seed = 1;       // random baseline
  eviction evict = eviction::none;
  double keep = 0.5;            // eviction: share of each (layer, kv head)'s blocks kept
  std::int32_t evict_sink = 1, evict_newest = 1;
  std::int32_t evict_queries = 8;  // summary_score: recent queries per kv head group
  std::int32_t page_size = 16;
  std::int32_t dense_layers = 0;  // the first N layers attend densely whatever the policy
  std::int32_t threads = 1;     // projections, classifier and the dense executor (not part of a spec)
  bool measure = false;         // sparse policies: measure each selection's coverage of the true mass (stats.coverage)
  std::int32_t measure_from = 0;  // ... for queries at positions >= this
  std::string spec;             // as given
};

struct engine_stats {
  double pairs_read = 0.0;    // (query, kv head, key) triples the index read
  double pairs_causal = 0.0;  // the same under dense causal attention
  double kv_read = 0.0;       // distinct (query, kv head, key) triples: the union over a group's query heads
  double evicted_mass = 0.0;  // Σ over (decode step, layer, query head) of the true mass in evicted blocks
  std::int64_t evicted_samples = 0;
  skim::stage_times times;
  coverage_stats coverage;    // engine_options::measure
  double decode_attention_seconds = 0.0;  // wall time of attention calls of one query (decode steps)
  std::int64_t decode_steps = 0;          // forward calls of one token
  [[nodiscard]] double density() const { return pairs_causal > 0 ? pairs_read / pairs_causal : 1.0; }
  // K/V read per (query, kv head) / causal keys: the bytes a decode step loads, relative to dense.
  [[nodiscard]] double kv_density() const { return pairs_causal > 0 ? kv_read / pairs_causal : 1.0; }
  [[nodiscard]] double eviction_loss() const { return evicted_samples > 0 ? evicted_mass / static_cast<double>(evicted_samples) : 0.0; }
};

namespace engine_detail {

struct layer_state {
  std::vector<float> summaries;  // [max_blocks, heads_kv, record_floats]
  std::int32_t summarized = 0;   // keys appended to the summaries
  skim_eval::kmeans_storage kmeans;        // router=kmeans: centroids, counts, membership
  std::int32_t clustered = 0;              // ... keys they hold
  std::vector<std::int32_t> positions;     // router=tokens: the token list [rows, width]
  skim_eval::vertical_slash_storage csr;   // router=vertical_slash
  std::vector<std::int32_t> ids, count;
  std::vector<float> lse;
  std::vector<float> block_mass;  // dense_block_mass of the last call (measurements, oracle)
  std::vector<std::int32_t> top_blocks;  // ... and the blocks of each row's most probable keys
  skim::workspace_buffer ws;
  std::vector<float> mass, true_mass, head_mass;          // [max_blocks, heads_kv], ..., [max_blocks]
  std::vector<std::vector<std::int32_t>> resident;        // [heads_kv] ids kept in the cache, ascending
  std::vector<std::vector<float>> recent_q;               // [heads_kv] [<= evict_queries * group, head_dim]
  std::vector<std::int32_t> keep_ids, evict_ids;
  void reserve_ws(std::size_t bytes) {
    if (ws.size() < bytes) ws = skim::workspace_buffer(bytes);
  }
  // The block table a call's selection goes into: rows × width ids and rows counts (grown, not
  // cleared), and the call's LSE.
  [[nodiscard]] skim::index::mutable_block_table selection(const skim::problem& p, std::int32_t width) {
    const auto rows = static_cast<std::size_t>(p.index_rows());
    ids.resize(rows * static_cast<std::size_t>(width));
    count.resize(rows);
    lse.resize(static_cast<std::size_t>(p.tokens_q()) * p.heads_q);
    return {.ids = ids, .count = count, .width = width};
  }
};

// What every call shares: the problem of one sequence and the paged view of this layer's cache.
struct call {
  std::int32_t cu_q[2] = {0, 0}, cu_kv[2] = {0, 0}, indptr[2] = {0, 0};
  skim::problem p;
  skim::paged_kv<float> kv;
  skim::strided_view<const float> q;
  skim::strided_view<float> o;
  call(const attention_args& a, std::int32_t block_q, std::int32_t block_kv, skim::index_scope scope, std::int32_t page_size,
       std::int32_t pages, std::span<const std::int32_t> page_table)
      : cu_q{0, a.n_q}, cu_kv{0, a.n_kv}, indptr{0, pages} {
    p = {.heads_q = a.heads_q, .heads_kv = a.heads_kv, .head_dim = a.head_dim, .block_q = block_q, .block_kv = block_kv,
         .softmax_scale = a.scale, .cu_seqlens_q = cu_q, .cu_seqlens_kv = cu_kv, .scope = scope};
    kv = skim::paged_kv<float>::packed(a.k.data(), a.v.data(), pages, page_size, a.heads_kv, a.head_dim, indptr,
                                       page_table.first(static_cast<std::size_t>(pages)));
    q = skim::strided_view<const float>::token_major(a.q.data(), a.n_q, a.heads_q, a.head_dim);
    o = skim::strided_view<float>::token_major(a.out.data(), a.n_q, a.heads_q, a.head_dim);
  }
  call(const call&) = delete;
};

// (query, kv head, key) triples a block table reads, over its rows.
inline double pairs_read(const skim::problem& p, skim::index::block_table t) {
  double n = 0;
  (void)skim::for_each_row(p, [&](const skim::row_info& r) {
    const double heads = p.scope == skim::index_scope::kv_head ? 1.0 : 1.0 / p.group_size();
    for (auto c = t.cursor(r); !c.done(); c.next()) {
      for (std::int32_t qi = r.q_begin; qi < r.q_end; ++qi) {
        const std::int32_t vis = r.visible_keys(qi, p.mask);
        n += heads * std::max(0, std::min((c.id() + 1) * p.block_kv, vis) - c.id() * p.block_kv);
      }
    }
  });
  return n;
}
// Distinct keys read per (query, kv head): under index_scope::query_head the union of the blocks the
// group's query heads chose, which is what a decode step loads from memory (its K/V bytes).
inline double kv_keys_read(const skim::problem& p, skim::index::block_table t) {
  if (p.scope == skim::index_scope::kv_head) return pairs_read(p, t);
  const std::int32_t group = p.group_size();
  std::vector<char> mark(static_cast<std::size_t>(p.max_kv_blocks()));
  double n = 0;
  (void)skim::for_each_row(p, [&](const skim::row_info& r) {
    if (r.head % group == 0) std::fill(mark.begin(), mark.end(), 0);
    for (auto c = t.cursor(r); !c.done(); c.next()) mark[static_cast<std::size_t>(c.id())] = 1;
    if (r.head % group != group - 1) return;
    for (std::int32_t b = 0; b < r.visible_blocks; ++b) {
      if (!mark[static_cast<std::size_t>(b)]) continue;
      for (std::int32_t qi = r.q_begin; qi < r.q_end; ++qi) {
        n += std::max(0, std::min((b + 1) * p.block_kv, r.visible_keys(qi, p.mask)) - b * p.block_kv);
      }
    }
  });
  return n;
}
inline double pairs_causal(const attention_args& a) {
  double n = 0;
  for (std::int32_t i = 0; i < a.n_q; ++i) n += i + a.n_kv - a.n_q + 1;
  return n * a.heads_kv;
}

// Counts what a call's selection read: (query, key) pairs, distinct K/V keys, and the causal pairs.
inline void count_reads(engine_stats& stats, const skim::problem& p, skim::index::block_table t, const attention_args& a) {
  stats.pairs_read += pairs_read(p, t);
  stats.kv_read += kv_keys_read(p, t);
  stats.pairs_causal += pairs_causal(a);
}
// Adds a call's coverage of the true mass (block_mass / top_blocks from dense_block_mass).
inline void count_coverage(engine_stats& stats, const engine_options& o, const skim::problem& p, skim::index::block_table t,
                           const attention_args& a, std::span<const float> block_mass, std::span<const std::int32_t> top_blocks) {
  stats.coverage.min_position = o.measure_from;
  stats.coverage.add(p, t, block_mass, top_blocks, a.layer, a.n_kv - a.n_q);
}
// What a routed call's selection read and, with engine_options::measure, its coverage of the true
// mass (dense attention over the call's Q and K, kept in the layer's state).
inline void count_selection(engine_stats& stats, const engine_options& o, const skim::problem& p, skim::index::block_table t,
                            const attention_args& a, layer_state& st) {
  count_reads(stats, p, t, a);
  if (!o.measure) return;
  dense_block_mass(a, p.block_kv, o.threads, st.block_mass, &st.top_blocks);
  count_coverage(stats, o, p, t, a, st.block_mass, st.top_blocks);
}

struct backend {
  virtual ~backend() = default;
  [[nodiscard]] virtual skim::status run(const attention_args& a, layer_state& st, engine_stats& stats) = 0;
};

struct shared_setup {
  const engine_options* o = nullptr;
  std::int32_t pages = 0;
  std::span<const std::int32_t> page_table;
  std::int32_t max_blocks = 0;
};

// Dense attention: skim's executor over index::causal_all (its threads where it takes them).
template <class Exec>
struct dense_backend final : backend {
  shared_setup s;
  Exec exec{};
  explicit dense_backend(shared_setup s_) : s(s_) {}
  skim::status run(const attention_args& a, layer_state& st, engine_stats& stats) override {
    const call c(a, 64, 64, skim::index_scope::kv_head, s.o->page_size, s.pages, s.page_table);
    const skim::attention_args<float, skim::paged_kv<float>, skim::index::causal_all, float> args{
        .prob = c.p, .q = c.q, .kv = c.kv, .index = {}, .o = c.o};
    if constexpr (requires { exec.workspace_bytes(c.p, s.o->threads); }) {  // simd: items on threads
      st.reserve_ws(exec.workspace_bytes(c.p, s.o->threads));
      SKIM_TRY(exec.run(args, st.ws.span(), s.o->threads));
    } else {
      st.reserve_ws(exec.workspace_bytes(c.p));
      SKIM_TRY(exec.run(args, st.ws.span()));
    }
    stats.pairs_read += pairs_causal(a);
    stats.kv_read += pairs_causal(a);
    stats.pairs_causal += pairs_causal(a);
    return skim::status::success();
  }
};

}  // namespace engine_detail

}  // namespace skim_llama
