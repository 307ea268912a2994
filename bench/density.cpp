// skim_bench_density — at which length and density does the sparse step beat dense attention?
//
// Cost model. Dense attention over every causal block costs ~4·n_q·N·d·heads_q flops (prefill of
// n_q queries over N keys) or reads all 2·N·heads_kv·d K/V elements (decode). The sparse step pays
// for routing before it executes: summarize O(N·d) per kv head (prefill rebuilds the summaries of
// all N keys every step here, an upper bound: an engine keeping them appends only the chunk; decode
// appends the newest key), score O((N/bk)·d·heads_q) per query block (one pooled query per head
// against each block's summary), select O(N/bk) per row, then executes density·(dense work). So
// sparse wins when density + routing/dense < 1, and routing/dense ~ (N/bk)·d / (n_q·N·d) =
// 1/(bk·bq) per query block in prefill but ~1/bk in decode (one query per row pays for a whole
// scoring pass): at short N or high density dense wins.
//
// Rows (bq = 64, bk = 64, head dim 128, 8 query heads, 2 kv heads, Q fp32, K/V fp16, structured data):
//   prefill/step:sparse/exec:E/threads:2/kv:L/sel:1/S/N:N   chunked prefill, the last 512 queries over N keys
//   prefill/step:dense/exec:E/threads:2/kv:L/N:N            the same executor over every causal block
//   prefill_full/step:…/N:N                                 a whole causal prefill: N queries over N keys
//   decode/step:sparse/exec:E/threads:T/kv:L/sel:1/S/N:N    one query over N keys (summaries kept, append_newest)
//   decode/step:dense/exec:E/threads:T/kv:L/N:N             T = 1 and 2 (one kv head per thread)
//   decode/step:sparse_shared/exec:E/threads:1/kv:L/sel:1/S/N:N   S = 2, 8: one selection per query block
//                                                           for both kv heads (sparse_attention::share_heads)
//   decode/step:engine/sum:M/bk:B/exec:E/threads:1/kv:L/sel:1/S/N:N   skim::decode_step as an engine runs it
//                                                           (the group's scores summed, sink 1 + local 8),
//                                                           1/S of the blocks, N <= 32768: skim::defaults
//                                                           (M multi_centroid2, B 4; S = 8, 16, both layouts),
//                                                           and at S = 8, HND, the other summaries and block
//                                                           sizes of docs/quality-kcode.md's rows, max_bound16
//                                                           beside max_bound, and both over a bf16 cache
//                                                           (M …/cache:bf16)
//   …/N:32768/cold                                          a step after a 64 MiB read evicts its data
//                                                           (evict_caches), as a model's layer meets it:
//                                                           dense and the engine's defaults, max_bound and
//                                                           max_bound16 (one thread, HND)
// kv:L is the K/V layout both rows of a pair read: HND (head-major [heads_kv, tokens, dim]) or
// NHD (token-major [tokens, heads_kv, dim]), the same values in either (so their coverage agrees); decode runs both (the sparse step's selections are per
// kv head, and on NHD a per-head read uses half of every line pair the hardware pulls in:
// docs/performance.md), prefill HND only (its tiles are compute-bound).
// Counters: flops (prefill, rate over the pairs read) or bytes (decode, K+V bytes of the blocks read),
// density (share of the causal pairs selected), coverage (decode: the mean attention mass over
// query heads that the last step's blocks hold, metrics::for_each_query_row), and the stage times of the sparse step in seconds
// (summarize, score, select, execute; means per step). Compare a sparse row with the dense row of the
// same N: bench/plot.py draws time(sparse)/time(dense) and the crossover.
// Default lengths: prefill and prefill_full 4K..32K, decode 4K..128K; --skim_max_n=65536 (or more)
// adds longer prefill. A prefill_full dense row at N = 32768 takes several seconds per iteration.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <string>
#include <type_traits>
#include <vector>

#include "common.hpp"
#include "skim/decode_step.hpp"
#include "skim/summarize/max_bound.hpp"
#include "skim/summarize/max_bound16.hpp"
#include "skim/summarize/mean_pool.hpp"
#include "sparse_step.hpp"

namespace {

using namespace skim_bench;
using kv_type = skim::half;

constexpr std::int32_t heads_q = 8, heads_kv = 2, dim = 128, block_q = 64, block_kv = 64;
constexpr std::int32_t chunk = 512;  // prefill queries per step

// A decode step of one layer of a model starts from caches the other layers have just filled: its
// summaries and K/V come from DRAM. The rows ending in /cold time that step: before each one,
// untimed, a 64 MiB read (twice the L3 of the machines docs/performance.md reports) evicts them.
void evict_caches() {
  static const std::vector<std::uint64_t> junk(std::size_t{64} << 17, 1);  // 64 MiB
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < junk.size(); i += 8) sum += junk[i];  // one read per 64-byte line
  benchmark::DoNotOptimize(sum);
}

// K/V live in skim::host_buffer, as an engine's cache should (huge pages where the kernel gives
// them; docs/performance.md, "CPU: huge pages"): the sparse and the dense rows read the same buffers.
struct tensors {
  std::int32_t keys = -1, queries = -1;
  std::vector<float> q, o;
  skim::host_buffer<kv_type> k, v;          // token-major [keys, heads_kv, dim]
  skim::host_buffer<kv_type> k_hnd, v_hnd;  // the same values head-major [heads_kv, keys, dim], made on first use

  // K or V in `layout`: the HND and NHD rows of a length compute on the same tensors (same coverage).
  [[nodiscard]] const kv_type* kv(kv_layout layout, bool key) {
    if (layout == kv_layout::token_major) return key ? k.data() : v.data();
    if (k_hnd.empty()) {
      k_hnd = head_major(k);
      v_hnd = head_major(v);
    }
    return key ? k_hnd.data() : v_hnd.data();
  }

 private:
  [[nodiscard]] skim::host_buffer<kv_type> head_major(const skim::host_buffer<kv_type>& x) const {
    skim::host_buffer<kv_type> y(x.size());
    for (std::int32_t t = 0; t < keys; ++t)
      for (std::int32_t h = 0; h < heads_kv; ++h)
        std::copy_n(x.begin() + (std::ptrdiff_t(t) * heads_kv + h) * dim, dim,
                    y.begin() + (std::ptrdiff_t(h) * keys + t) * dim);
    return y;
  }
};

// Built on first use and kept (rows of all lengths alternate under random interleaving).
tensors& data(std::int32_t keys, std::int32_t queries) {
  static std::map<std::pair<std::int32_t, std::int32_t>, tensors> cache;
  auto [it, added] = cache.try_emplace({keys, queries});
  tensors& t = it->second;
  if (!added) return t;
  const haystack h = make_haystack(keys, queries, heads_q, heads_kv, dim, 2026);
  t.keys = keys;
  t.queries = queries;
  t.q = h.q;
  t.o.assign(h.q.size(), 0.0f);
  t.k = to_host_buffer(convert<kv_type>(h.k));
  t.v = to_host_buffer(convert<kv_type>(h.v));
  return t;
}

// data(n, 1)'s K or V head-major in bfloat16, converted once: the engine rows over a bf16 cache.
const skim::host_buffer<skim::bfloat16>& bf16_kv(std::int32_t n, bool key) {
  static std::map<std::pair<std::int32_t, bool>, skim::host_buffer<skim::bfloat16>> cache;
  auto [it, added] = cache.try_emplace({n, key});
  if (added) {
    const kv_type* x = data(n, 1).kv(kv_layout::head_major, key);
    it->second = skim::host_buffer<skim::bfloat16>(std::size_t(n) * heads_kv * dim);
    std::transform(x, x + it->second.size(), it->second.begin(),
                   [](kv_type e) { return skim::bfloat16::from_float(skim::to_float(e)); });
  }
  return it->second;
}

skim::problem make_problem(const std::int32_t (&cu_q)[2], const std::int32_t (&cu_kv)[2]) {
  return {.heads_q = heads_q, .heads_kv = heads_kv, .head_dim = dim, .block_q = block_q, .block_kv = block_kv,
          .mask = skim::mask_kind::causal, .cu_seqlens_q = cu_q, .cu_seqlens_kv = cu_kv};
}

void sparse(benchmark::State& state, int threads, kv_layout layout, std::int32_t n, std::int32_t queries,
            std::int32_t share, bool share_heads = false) {
  tensors& d = data(n, queries);
  const std::int32_t cu_q[2] = {0, queries}, cu_kv[2] = {0, n};
  const skim::problem p = make_problem(cu_q, cu_kv);
  const bool decode = queries == 1;
  sparse_job<kv_type> job(make_sparse_step(p.kv_blocks(0), share, share_heads), p, d.q.data(), d.kv(layout, true),
                          d.kv(layout, false), d.o.data(),
                          decode ? skim::summaries_mode::append_newest : skim::summaries_mode::build, layout,
                          /*split_kv_heads=*/threads > 1);
  if (!time_sparse_steps(state, job, threads)) return;
  const double density = job.density();
  state.counters["density"] = density;
  if (decode) {
    set_rate(state, "bytes", density * 2.0 * n * heads_kv * dim * sizeof(kv_type));
    state.counters["coverage"] = job.coverage();  // attention mass the selection keeps (a dense pass, untimed)
  } else {
    set_rate(state, "flops", 4.0 * job.selected_pairs_all_heads() * dim);
  }
}

void dense(benchmark::State& state, int threads, kv_layout layout, std::int32_t n, std::int32_t queries,
           bool cold = false) {
  tensors& d = data(n, queries);
  const std::int32_t cu_q[2] = {0, queries}, cu_kv[2] = {0, n};
  const skim::problem p = make_problem(cu_q, cu_kv);
  // Split by kv head like the sparse step (its pipeline runs one kv head per thread), so the two
  // rows differ only in what they compute.
  executor_job<step_executor, kv_type, skim::index::causal_all> job(
      step_executor{}, p, d.q.data(), d.kv(layout, true), d.kv(layout, false), d.o.data(), threads,
      [](const skim::problem&, int) { return skim::index::causal_all{}; }, thread_split::kv_heads, layout);
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      evict_caches();
      state.ResumeTiming();
    }
    const skim::status s = job.run();
    if (!s.ok()) {
      state.SkipWithError(s.message());
      return;
    }
    benchmark::ClobberMemory();
  }
  if (queries == 1) {
    set_rate(state, "bytes", 2.0 * n * heads_kv * dim * sizeof(kv_type));
  } else {
    set_rate(state, "flops", 4.0 * causal_pairs(queries, n) * heads_q * dim);
  }
  state.counters["density"] = 1.0;
}

// skim::decode_step<step_executor, Summarizer> over blocks of bk keys on one thread, over a sequence
// that grows by one key a step (the step refuses a key appended twice: its summaries may be sums):
// steps from n - span keys to n, then the summaries of n - span keys are rebuilt, untimed. Budget:
// 1/share of the blocks at n keys, reserved ones included.
// T: the cache's element, kv_type or (head-major only) bfloat16 (bf16_kv).
template <class Summarizer, class T = kv_type>
void engine_step(benchmark::State& state, kv_layout layout, std::int32_t n, std::int32_t bk, std::int32_t share,
                 bool cold = false) {
  constexpr std::int32_t span = 256;
  tensors& d = data(n, 1);
  const std::int32_t blocks = (n + bk - 1) / bk;
  const std::int32_t reserved = skim::defaults::sink_blocks + skim::defaults::local_blocks;
  skim::decode_step<step_executor, Summarizer> step;
  const skim::decode_step_config c{.heads_q = heads_q, .heads_kv = heads_kv, .head_dim = dim, .block_kv = bk,
                                   .max_seqlen_kv = n, .top_k = std::max((blocks + share - 1) / share - reserved, 1)};
  const auto view = [&](const T* x) {
    return layout == kv_layout::head_major ? skim::strided_view<const T>::head_major(x, n, heads_kv, dim)
                                           : skim::strided_view<const T>::token_major(x, n, heads_kv, dim);
  };
  const auto source = [&](bool key) {
    if constexpr (std::is_same_v<T, kv_type>) {
      return d.kv(layout, key);
    } else {
      static_assert(std::is_same_v<T, skim::bfloat16>);
      return layout == kv_layout::head_major ? bf16_kv(n, key).data() : nullptr;
    }
  };
  if (source(true) == nullptr) {
    state.SkipWithError("a bf16 cache is head-major only");
    return;
  }
  const skim::contiguous_kv<T> kv{.k = view(source(true)), .v = view(source(false))};
  const std::span<const float> q(d.q.data(), std::size_t(heads_q) * dim);
  const std::span<float> o(d.o.data(), std::size_t(heads_q) * dim);
  skim::status s = step.plan(c);
  std::int32_t len = n - span;
  if (s.ok()) s = step.prefill(0, kv, len);
  skim::stage_times sum{}, t{};
  for (auto _ : state) {
    if (len == n || cold) {
      state.PauseTiming();
      if (len == n) {
        len = n - span;
        s = step.prefill(0, kv, len);
      }
      if (cold) evict_caches();
      state.ResumeTiming();
    }
    if (s.ok()) s = step.run(0, q, kv, ++len, o, {}, &t);
    if (!s.ok()) {
      state.SkipWithError(s.message());
      return;
    }
    sum += t;
    benchmark::ClobberMemory();
  }
  set_stage_counters(state, sum);
  const double density = static_cast<double>(std::min(c.top_k + reserved, blocks)) / blocks;
  state.counters["density"] = density;
  set_rate(state, "bytes", density * 2.0 * n * heads_kv * dim * sizeof(T));
}

}  // namespace

int main(int argc, char** argv) {
  const std::int32_t max_n = take_max_n_flag(argc, argv, 32768);
  enum class mode { prefill, prefill_full, decode };
  for (const mode m : {mode::prefill, mode::prefill_full, mode::decode}) {
    const bool decode = m == mode::decode;
    const std::string name = m == mode::prefill ? "prefill" : m == mode::prefill_full ? "prefill_full" : "decode";
    const std::int32_t longest = decode ? std::max(max_n, 131072) : max_n;
    // Decode also on one thread: a step of a few hundred microseconds on two threads waits for the
    // slower one, and on a shared machine that one is often descheduled; one thread is the robust figure.
    for (const int threads : decode ? std::vector<int>{1, 2} : std::vector<int>{2}) {
      for (const kv_layout layout : decode ? std::vector{kv_layout::head_major, kv_layout::token_major}
                                           : std::vector{kv_layout::head_major}) {
        const std::string exec = std::string("/exec:") + step_executor_name + "/threads:" + std::to_string(threads) +
                                 (layout == kv_layout::head_major ? "/kv:HND" : "/kv:NHD");
        for (std::int32_t n = 4096; n <= longest; n *= 2) {
          const std::int32_t queries = decode ? 1 : m == mode::prefill ? chunk : n;
          // A whole prefill runs up to seconds per step: one iteration (repetitions give the median).
          const auto timing = [&](benchmark::internal::Benchmark* b) {
            b->Unit(benchmark::kMillisecond)->UseRealTime();
            if (m == mode::prefill_full) b->Iterations(1);
            else b->MinTime(decode ? 0.1 : 0.2);
          };
          timing(benchmark::RegisterBenchmark((name + "/step:dense" + exec + "/N:" + std::to_string(n)).c_str(),
                                              [=](benchmark::State& s) { dense(s, threads, layout, n, queries); }));
          for (const std::int32_t share : {2, 4, 8, 16, 32}) {
            timing(benchmark::RegisterBenchmark(
                (name + "/step:sparse" + exec + "/sel:1/" + std::to_string(share) + "/N:" + std::to_string(n)).c_str(),
                [=](benchmark::State& s) { sparse(s, threads, layout, n, queries, share); }));
            if (decode && threads == 1 && n <= 32768) {  // the engine's step (skim::decode_step)
              const auto engine = [&](const char* summ, std::int32_t bk, auto run, bool cold = false) {
                timing(benchmark::RegisterBenchmark((name + "/step:engine/sum:" + summ + "/bk:" + std::to_string(bk) +
                                                     exec + "/sel:1/" + std::to_string(share) + "/N:" +
                                                     std::to_string(n) + (cold ? "/cold" : ""))
                                                        .c_str(),
                                                    [=](benchmark::State& s) { run(s, layout, n, bk, share, cold); }));
              };
              if (share == 8 || share == 16) engine("multi_centroid2", 4, engine_step<skim::defaults::summarizer>);
              if (share == 8 && layout == kv_layout::head_major) {
                engine("multi_centroid2", 8, engine_step<skim::summarize::multi_centroid<2>>);
                engine("mean_pool", 4, engine_step<skim::summarize::mean_pool>);
                engine("mean_pool", 16, engine_step<skim::summarize::mean_pool>);
                engine("max_bound", 16, engine_step<skim::summarize::max_bound>);
                engine("max_bound16", 16, engine_step<skim::summarize::max_bound16<kv_type>>);
                engine("max_bound/cache:bf16", 16, engine_step<skim::summarize::max_bound, skim::bfloat16>);
                engine("max_bound16/cache:bf16", 16,
                       engine_step<skim::summarize::max_bound16<skim::bfloat16>, skim::bfloat16>);
                if (n == 32768) {  // the step as a layer of a model meets it (evict_caches), dense beside it
                  timing(benchmark::RegisterBenchmark((name + "/step:dense" + exec + "/N:" + std::to_string(n) + "/cold").c_str(),
                                                      [=](benchmark::State& s) { dense(s, threads, layout, n, queries, true); }));
                  engine("multi_centroid2", 4, engine_step<skim::defaults::summarizer>, true);
                  engine("max_bound", 16, engine_step<skim::summarize::max_bound>, true);
                  engine("max_bound16", 16, engine_step<skim::summarize::max_bound16<kv_type>>, true);
                  engine("max_bound/cache:bf16", 16, engine_step<skim::summarize::max_bound, skim::bfloat16>, true);
                  engine("max_bound16/cache:bf16", 16,
                         engine_step<skim::summarize::max_bound16<skim::bfloat16>, skim::bfloat16>, true);
                }
              }
            }
            if (decode && threads == 1 && (share == 2 || share == 8)) {  // one selection for both kv heads
              timing(benchmark::RegisterBenchmark(
                  (name + "/step:sparse_shared" + exec + "/sel:1/" + std::to_string(share) + "/N:" + std::to_string(n))
                      .c_str(),
                  [=](benchmark::State& s) { sparse(s, threads, layout, n, queries, share, /*share_heads=*/true); }));
            }
          }
        }
      }
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
