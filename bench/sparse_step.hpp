#pragma once
// The sparse step the pipeline benchmarks (block_size, density) time: skim::sparse_attention with a
// fixed pipeline, not skim::defaults — max_bound summaries, pooled_router{mean queries, max over the GQA
// group}, reserved<top_k>{sink 1, local 1, recency} — and the fastest executor this binary is built for,
// split one kv head per thread like every 2-thread row (common.hpp: head_slice), beside the dense
// peer: the same executor over every causal block (index::causal_all), split the same way; and
// time_sparse_steps(), the timing loop and stage counters both programs share.
//
// Budget: a row keeps ceil(kv_blocks / share) blocks (sink and local included), so the share of the
// causal pairs it reads is about 1/share; the rows report the density they actually got.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "common.hpp"
#include "skim/exec/cpu/scalar.hpp"
#include "skim/index/block_table.hpp"
#include "skim/index/causal_all.hpp"
#include "skim/metrics/quality.hpp"
#include "skim/pipeline.hpp"
#include "skim/route/pooled_router.hpp"
#include "skim/select/reserved.hpp"
#include "skim/select/top_k.hpp"
#include "skim/summarize/max_bound.hpp"

// SKIM_BENCH_NO_SIMD: build without the SIMD executors (e.g. while simd.hpp is being written).
#if !defined(SKIM_BENCH_NO_SIMD) && __has_include("skim/exec/cpu/simd.hpp") && (defined(__AVX2__) || defined(__AVX512F__))
#include "skim/exec/cpu/simd.hpp"
#define SKIM_BENCH_HAS_SIMD 1
#endif

namespace skim_bench {

#if defined(SKIM_BENCH_HAS_SIMD) && defined(__AVX512F__)
using step_executor = skim::exec::simd<xsimd::avx512f>;
inline constexpr const char* step_executor_name = "simd_avx512f";
#elif defined(SKIM_BENCH_HAS_SIMD) && defined(__AVX2__)
using step_executor = skim::exec::simd<xsimd::avx2>;
inline constexpr const char* step_executor_name = "simd_avx2";
#else
using step_executor = skim::exec::scalar;
inline constexpr const char* step_executor_name = "scalar";
#endif

using sparse_step = skim::sparse_attention<skim::summarize::max_bound, skim::route::pooled_router,
                                           skim::select::reserved<skim::select::top_k>, step_executor>;

// share_heads: one selection per query block for all its kv heads (sparse_attention::share_heads).
[[nodiscard]] inline sparse_step make_sparse_step(std::int32_t kv_blocks, std::int32_t share, bool share_heads = false) {
  const std::int32_t blocks = (kv_blocks + share - 1) / share;
  sparse_step step;
  step.share_heads = share_heads;
  step.router = {.pool = skim::route::query_pool::mean, .reduce = skim::route::group_reduce::max};
  step.selector = {.sink = 1, .local = 1, .recency = true, .dynamic = {.k = std::max(blocks - 2, 1)}};
  return step;
}

// One kv head per slice (split_kv_heads, how the 2-thread rows run: a slice per thread), or the
// whole problem in one slice (1 thread: the executor then runs a query block's kv heads together,
// like the dense peer's single run). Each slice owns its summaries, block_table, lse and workspace.
// T is the K/V dtype; Q and O are fp32.
template <class T>
class sparse_job {
 public:
  struct slice {
    skim::problem prob;
    skim::strided_view<const float> q;
    skim::contiguous_kv<T> kv;
    skim::strided_view<float> o;
    std::vector<float> summaries, lse;
    std::vector<std::int32_t> ids, count;
    std::int32_t width = 0;
    skim::workspace_buffer ws;
    skim::stage_times times;
  };

  // q [n_q, heads_q, dim] fp32, k, v [n_kv, heads_kv, dim], o [n_q, heads_q, dim]; p the whole problem.
  sparse_job(const sparse_step& step, const skim::problem& p, const float* q, const T* k, const T* v, float* o,
             skim::summaries_mode mode, kv_layout layout = kv_layout::token_major, bool split_kv_heads = true)
      : step_(step), mode_(mode), slices_(std::size_t(split_kv_heads ? p.heads_kv : 1)) {
    const std::int32_t nq = p.tokens_q(), nkv = p.tokens_kv();
    const auto qv = skim::strided_view<const float>::token_major(q, nq, p.heads_q, p.head_dim);
    const auto ov = skim::strided_view<float>::token_major(o, nq, p.heads_q, p.head_dim);
    const auto kv_view = [&](const T* x) {
      return layout == kv_layout::head_major ? skim::strided_view<const T>::head_major(x, nkv, p.heads_kv, p.head_dim)
                                             : skim::strided_view<const T>::token_major(x, nkv, p.heads_kv, p.head_dim);
    };
    const auto kv = kv_view(k);
    const auto vv = kv_view(v);
    for (std::int32_t g = 0; g < std::int32_t(slices_.size()); ++g) {
      slice& s = slices_[std::size_t(g)];
      s.prob = split_kv_heads ? slice_problem(p) : p;
      const std::int32_t kv_heads = s.prob.heads_kv, q_heads = s.prob.heads_q;
      s.q = slice_heads(qv, g * q_heads, q_heads);
      s.o = slice_heads(ov, g * q_heads, q_heads);
      s.kv = {.k = slice_heads(kv, g * kv_heads, kv_heads), .v = slice_heads(vv, g * kv_heads, kv_heads)};
      s.summaries.resize(std::size_t(step_.summary_floats(s.prob)));
      s.lse.resize(std::size_t(nq) * std::size_t(q_heads));
      s.width = step_.table_width(s.prob);
      s.ids.resize(std::size_t(step_.selected_rows(s.prob) * s.width));
      s.count.resize(std::size_t(step_.selected_rows(s.prob)));
      s.ws = skim::workspace_buffer(step_.workspace_bytes(s.prob));
    }
    if (mode_ != skim::summaries_mode::build) {  // decode keeps its summaries: build them once, here
      const skim::summaries_mode keep = mode_;
      mode_ = skim::summaries_mode::build;
      (void)run(1);
      mode_ = keep;
    }
  }

  // One step on `threads` threads; the stage times are summed over the slices and divided by the
  // threads used (slices on different threads run side by side), so they add up to about the step's
  // wall time.
  [[nodiscard]] skim::status run(int threads) {
    std::atomic<int> failed{-1};
    const int n = static_cast<int>(slices_.size());
    const int used = std::min(threads, n);
    pool::instance().run(used, [&](int t) {
      for (int g = t; g < n; g += used) {
        if (!run_slice(slices_[std::size_t(g)]).ok()) failed.store(g);
      }
    });
    if (failed.load() >= 0) return run_slice(slices_[std::size_t(failed.load())]);
    times_ = {};
    for (const slice& s : slices_) times_ += s.times;
    const double k = 1.0 / double(used);
    times_ = {times_.summarize * k, times_.score * k, times_.select * k, times_.execute * k};
    return skim::status::success();
  }

  [[nodiscard]] const skim::stage_times& times() const noexcept { return times_; }
  [[nodiscard]] const std::vector<slice>& slices() const noexcept { return slices_; }
  [[nodiscard]] skim::index::block_table table(std::int32_t g) const noexcept {
    const slice& s = slices_[std::size_t(g)];
    return {.ids = s.ids, .count = s.count, .width = s.width};
  }
  // f(index) with slice g's selection as the executor read it: the table, or it shared by the heads.
  template <class F>
  void with_index(std::int32_t g, F&& f) const {
    if (step_.share_heads) {
      f(skim::index::head_shared<skim::index::block_table>{table(g), slices_[std::size_t(g)].prob.index_heads()});
    } else {
      f(table(g));
    }
  }

  // Share of the causal (query, key) pairs the selected blocks hold, over every slice.
  [[nodiscard]] double density() const {
    double chosen = 0, causal = 0;
    for (std::int32_t g = 0; g < std::int32_t(slices_.size()); ++g) {
      const slice& s = slices_[std::size_t(g)];
      const auto count = [&](const auto& index) {
        (void)skim::for_each_row(s.prob, [&](const skim::row_info& row) {
          const std::int32_t bk = s.prob.block_kv;
          for (std::int32_t qq = row.q_begin; qq < row.q_end; ++qq) {
            const std::int32_t visible = row.visible_keys(qq, s.prob.mask);
            causal += visible;
            for (auto c = index.cursor(row); !c.done(); c.next()) {
              const std::int32_t first = std::int32_t(c.id()) * bk;
              chosen += std::clamp(visible - first, 0, bk);
            }
          }
        });
      };
      with_index(g, count);
    }
    return chosen / causal;
  }
  // Mean attention-mass coverage of the last step's selection over every (query, query head) row
  // that sees a key (metrics::for_each_query_row: exact softmax over all keys, in double). Costs a
  // dense pass: call it outside timed loops, and for decode (one query) rather than prefill.
  [[nodiscard]] double coverage() const {
    double sum = 0;
    std::int64_t rows = 0;
    for (std::int32_t g = 0; g < std::int32_t(slices_.size()); ++g) {
      const slice& s = slices_[std::size_t(g)];
      const auto add = [&](const auto& index) {
        const skim::status st = skim::metrics::for_each_query_row(
            s.prob, s.q, s.kv, index, {}, [&](const skim::metrics::query_row& r) {
              if (r.has_keys()) {
                sum += r.coverage;
                ++rows;
              }
            });
        if (!st.ok()) sum = std::numeric_limits<double>::quiet_NaN();
      };
      with_index(g, add);
    }
    return rows > 0 ? sum / double(rows) : std::numeric_limits<double>::quiet_NaN();
  }

  // Selected (query, key) pairs × query heads, for GFLOP/s of the execute stage.
  [[nodiscard]] double selected_pairs_all_heads() const { return density() * causal_pairs_all_heads(); }
  [[nodiscard]] double causal_pairs_all_heads() const {
    const skim::problem& p = slices_[0].prob;
    return causal_pairs(p.tokens_q(), p.tokens_kv()) * p.heads_q * double(slices_.size());
  }

 private:
  [[nodiscard]] skim::status run_slice(slice& s) {
    const skim::pipeline_args<float, skim::contiguous_kv<T>, float> a{
        .prob = s.prob, .q = s.q, .kv = s.kv, .o = s.o, .lse = s.lse, .summaries = s.summaries, .mode = mode_,
        .selected = {.ids = s.ids, .count = s.count, .width = s.width}};
    return step_.run(a, s.ws.span(), &s.times);
  }

  sparse_step step_;
  skim::summaries_mode mode_;
  std::vector<slice> slices_;
  skim::stage_times times_;
};

// The stage times of `sum` over the state's iterations, in seconds per step (summarize_s, ...).
inline void set_stage_counters(benchmark::State& state, const skim::stage_times& sum) {
  const double it = double(state.iterations());
  state.counters["summarize_s"] = sum.summarize / it;
  state.counters["score_s"] = sum.score / it;
  state.counters["select_s"] = sum.select / it;
  state.counters["execute_s"] = sum.execute / it;
}

// Times job.run(threads) over the benchmark's iterations and sets the per-step means of the stage
// times as counters (summarize_s, score_s, select_s, execute_s). Returns the summed stage times,
// or nothing when a run failed (the benchmark is then skipped with its message).
template <class T>
[[nodiscard]] std::optional<skim::stage_times> time_sparse_steps(benchmark::State& state, sparse_job<T>& job,
                                                                 int threads) {
  skim::stage_times sum;
  for (auto _ : state) {
    const skim::status s = job.run(threads);
    if (!s.ok()) {
      state.SkipWithError(s.message());
      return std::nullopt;
    }
    sum += job.times();
    benchmark::ClobberMemory();
  }
  set_stage_counters(state, sum);
  return sum;
}

}  // namespace skim_bench
