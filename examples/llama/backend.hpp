#pragma once
// What skim-llama's attention backends share (engine.hpp, family_backends.hpp): the engine's
// options, its statistics, the per-layer state, the problem and paged view of one call, the
// counting of what a selection read, and the backend interface.
//
// A quantised cache (engine_options::kv = int8 or fp8; kv_quant.hpp): the forward pass hands its K/V
// to the engine's quantized_cache and the attention call's float K/V are empty. Backends that
// support codes read them through with_kv() (exec::simd over skim::int8_kv / fp8_kv, one scale per
// block of the call's block_kv keys, so the cache's block is the spec's `block`); whatever reads
// keys as floats (summaries, the measured and the oracle's true mass) reads the codes' dequantised
// values (dequantized_window, dequantized_args). The others refuse a quantised cache with a status.

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
#include "llama/kv_quant.hpp"
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
  kv_format kv = kv_format::fp32;  // kv=int8|fp8: the cache stores codes (kv_quant.hpp), scales per (block, kv head)
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
  std::vector<float> dequant_k, dequant_v;  // a quantised cache's keys (and values) as floats, for summaries and masses
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
    if (!a.k.empty()) {  // else a quantised cache: the codes come through with_kv()
      kv = skim::paged_kv<float>::packed(a.k.data(), a.v.data(), pages, page_size, a.heads_kv, a.head_dim, indptr,
                                         page_table.first(static_cast<std::size_t>(pages)));
    }
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
  const quantized_cache<std::int8_t>* int8 = nullptr;     // kv=int8: the engine's cache
  const quantized_cache<skim::fp8_e4m3>* fp8 = nullptr;   // kv=fp8
  [[nodiscard]] bool quantized() const { return int8 != nullptr || fp8 != nullptr; }
};

// The status of a backend that reads K/V as floats only, given a quantised cache.
[[nodiscard]] inline skim::status no_codes(const shared_setup& s, const char* what) {
  return skim::status::error(skim::status_code::unsupported, "%s reads K/V as floats and cannot run over a kv=%s cache",
                             what, kv_format_name(s.o->kv));
}

// Executors that read quantised K/V (exec::simd); exec::scalar does not.
template <class Exec>
inline constexpr bool reads_codes =
#ifdef SKIM_LLAMA_HAS_SIMD
    std::is_same_v<Exec, skim::exec::simd<xsimd::default_arch>>;
#else
    false;
#endif

// Calls f(kv) with this layer's K/V source: the call's paged float rows, or the quantised cache's
// codes of the call's keys (the call's block_kv must be the cache's).
template <class Exec, class F>
[[nodiscard]] skim::status with_kv(const shared_setup& s, const attention_args& a, const call& c, F&& f) {
  if (!s.quantized()) return f(c.kv);
  if constexpr (reads_codes<Exec>) {
    const std::int32_t bk = s.int8 ? s.int8->block_kv() : s.fp8->block_kv();
    if (c.p.block_kv != bk) {
      return skim::status::error(skim::status_code::shape_mismatch, "the call's blocks of %d keys are not the kv=%s cache's %d",
                                 c.p.block_kv, kv_format_name(s.o->kv), bk);
    }
    if (s.int8) return f(s.int8->view(a.layer, a.n_kv));
    return f(s.fp8->view(a.layer, a.n_kv));
  } else {
    return no_codes(s, "exec=scalar");
  }
}

// Keys [first, last) of this layer's quantised cache, dequantised into st.dequant_k (and V into
// st.dequant_v with values), [last - first, heads_kv, head_dim]. Grows the scratch, never shrinks it.
inline void dequantize_into(const shared_setup& s, layer_state& st, std::int32_t layer, std::int32_t first, std::int32_t last,
                            bool values) {
  const auto need = static_cast<std::size_t>(last - first) * static_cast<std::size_t>(s.int8 ? s.int8->kv_heads() * s.int8->head_dim()
                                                                                              : s.fp8->kv_heads() * s.fp8->head_dim());
  if (st.dequant_k.size() < need) st.dequant_k.resize(need);
  if (values && st.dequant_v.size() < need) st.dequant_v.resize(need);
  float* v = values ? st.dequant_v.data() : nullptr;
  if (s.int8) {
    s.int8->dequantize(layer, first, last, st.dequant_k.data(), v);
  } else {
    s.fp8->dequantize(layer, first, last, st.dequant_k.data(), v);
  }
}

// The call's arguments with K and V as floats: a itself, or (quantised cache) a copy whose k and v
// are the dequantised cache (in st's scratch). For what reads all of K as floats: the measured
// coverage, the oracle's and the prior's masses (the attention the model computes over the codes).
[[nodiscard]] inline const attention_args& float_args(const shared_setup& s, const attention_args& a, layer_state& st,
                                                      attention_args& tmp) {
  if (!s.quantized()) return a;
  dequantize_into(s, st, a.layer, 0, a.n_kv, true);
  tmp = a;
  const auto n = static_cast<std::size_t>(a.n_kv) * a.heads_kv * a.head_dim;
  tmp.k = std::span<const float>(st.dequant_k).first(n);
  tmp.v = std::span<const float>(st.dequant_v).first(n);
  return tmp;
}

// A float K/V source over keys [first, first + rows) of one sequence (dequantised codes in a
// scratch): what the summarizers read in place of the codes. validate() asks that the window end
// at the sequence's last key; k_row and v_row take first <= t < first + rows only, and v_row a
// window with V (v not null).
struct dequantized_window {
  using value_type = float;
  const float* k = nullptr;
  const float* v = nullptr;
  std::int32_t first = 0, rows = 0, heads_kv = 0, head_dim = 0;
  [[nodiscard]] skim::status validate(const skim::problem& p) const noexcept {
    if (p.batch() != 1 || p.heads_kv != heads_kv || p.head_dim != head_dim || p.seq_len_kv(0) != first + rows) {
      return skim::status::error(skim::status_code::shape_mismatch, "dequantised keys [%d, %d) of %d heads of dim %d do not end a "
                                 "sequence of %d keys (%d heads of dim %d)", first, first + rows, heads_kv, head_dim,
                                 p.batch() == 1 ? p.seq_len_kv(0) : -1, p.heads_kv, p.head_dim);
    }
    return skim::status::success();
  }
  [[nodiscard]] dequantized_window bind(const skim::problem&) const noexcept { return *this; }
  [[nodiscard]] const float* k_row(std::int32_t, std::int32_t t, std::int32_t h) const noexcept {
    return k + (static_cast<std::size_t>(t - first) * heads_kv + h) * head_dim;
  }
  [[nodiscard]] const float* v_row(std::int32_t, std::int32_t t, std::int32_t h) const noexcept {
    return v + (static_cast<std::size_t>(t - first) * heads_kv + h) * head_dim;
  }
};
static_assert(skim::kv_source<dequantized_window>);

// An executor that runs Exec over the quantised source kv whatever K/V its arguments name: a
// pipeline then summarises from one source (dequantized_window) and attends over the codes.
template <class Exec, class KVq>
struct codes_executor {
  Exec inner{};
  KVq kv{};
  [[nodiscard]] std::size_t workspace_bytes(const skim::problem& p) const noexcept { return inner.workspace_bytes(p); }
  [[nodiscard]] skim::status can_implement(const skim::problem& p) const noexcept { return inner.can_implement(p); }
  template <class TQ, class KV, class Index, class TO>
  [[nodiscard]] skim::status run(const skim::attention_args<TQ, KV, Index, TO>& a, std::span<std::byte> ws) const noexcept {
    return inner.run(skim::attention_args<TQ, KVq, Index, TO>{.prob = a.prob, .q = a.q, .kv = kv, .index = a.index, .o = a.o,
                                                               .lse = a.lse},
                     ws);
  }
};

// Dense attention: skim's executor over index::causal_all (its threads where it takes them).
template <class Exec>
struct dense_backend final : backend {
  shared_setup s;
  Exec exec{};
  explicit dense_backend(shared_setup s_) : s(s_) {}
  skim::status run(const attention_args& a, layer_state& st, engine_stats& stats) override {
    // Tiles of 64 keys; a quantised cache's scales come per block of the spec's `block` keys.
    const std::int32_t bk = s.quantized() ? s.o->sparse.block : 64;
    const call c(a, 64, bk, skim::index_scope::kv_head, s.o->page_size, s.pages, s.page_table);
    SKIM_TRY(with_kv<Exec>(s, a, c, [&]<class KV>(const KV& kv) -> skim::status {
      const skim::attention_args<float, KV, skim::index::causal_all, float> args{.prob = c.p, .q = c.q, .kv = kv, .index = {}, .o = c.o};
      if constexpr (requires { exec.workspace_bytes(c.p, s.o->threads); }) {  // simd: items on threads
        st.reserve_ws(exec.workspace_bytes(c.p, s.o->threads));
        return exec.run(args, st.ws.span(), s.o->threads);
      } else {
        st.reserve_ws(exec.workspace_bytes(c.p));
        return exec.run(args, st.ws.span());
      }
    }));
    stats.pairs_read += pairs_causal(a);
    stats.kv_read += pairs_causal(a);
    stats.pairs_causal += pairs_causal(a);
    return skim::status::success();
  }
};

}  // namespace engine_detail

}  // namespace skim_llama
