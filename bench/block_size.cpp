// skim_bench_block_size — what does the key block size bk buy and cost, at each length and budget?
//
// Cost model. Routing works on blocks: summarize touches every key once (O(N·d), bk-independent),
// score touches N/bk summaries per query block and head (halving bk doubles it), select ranks N/bk
// candidates per row. Execution reads density·N keys per query whatever bk is, but small tiles pay
// more per-tile overhead (loads, transposes, softmax rescaling per tile). Quality goes the other
// way: a small block's summary is tight (a needle among 15 other keys is visible in a max_bound
// summary, among 127 it is not), so at the same density small blocks cover more attention mass.
// The trade-off: the smallest bk whose routing cost stays a small share of the step.
//
// Rows (chunked prefill: the last 512 queries over N keys; bq 64, head dim 128, 8 query heads,
// 2 kv heads, Q fp32, K/V fp16, structured data with sink, local window and needles; 2 threads, one
// kv head each):
//   prefill/step:sparse/exec:E/threads:2/bk:B/sel:1/S/N:N   the sparse step, budget ceil(blocks/S)
//   prefill/step:dense/exec:E/threads:2/N:N                  the same executor over every causal block
// Counters:
//   flops                    rate over the selected pairs (4·pairs·d·heads_q per step, all stages' time)
//   summarize_s, score_s, select_s, execute_s   seconds per step in each stage (pipeline stage_times)
//   summarize_blocks_per_s, score_blocks_per_s, select_blocks_per_s   blocks handled per second of the stage
//   density                  share of the causal pairs in the selected blocks
//   coverage, coverage_p5    dense attention mass inside the selected blocks, exp(lse_sparse - lse_dense):
//                            mean and 5th percentile over the sampled (query, head) rows
//   recall8                  share of each sampled row's 8 highest-scoring keys inside its selected blocks
//   needle                   share of (query, kv head) rows whose selected blocks hold the planted needle
//   error                    ‖o_sparse − o_dense‖ / ‖o_dense‖ over the sampled rows
// Quality is measured on every 8th query of the chunk, against a dense reference in double computed
// here (the full dense output at 64K would cost minutes). Default lengths 4K and 8K;
// --skim_max_n=65536 runs up to 64K (minutes: the dense reference and the dense peer grow with N).

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common.hpp"
#include "sparse_step.hpp"

namespace {

using namespace skim_bench;
using kv_type = skim::half;

constexpr std::int32_t heads_q = 8, heads_kv = 2, dim = 128, block_q = 64;
constexpr std::int32_t group = heads_q / heads_kv;
constexpr std::int32_t chunk = 512;   // queries per step
constexpr std::int32_t sample = 8;    // quality on every 8th query
constexpr std::int32_t top_t = 8;     // recall@8
constexpr int threads = 2;

// The data of one length, and the dense reference of the sampled rows.
struct tensors {
  std::int32_t keys = -1;
  haystack h;
  std::vector<float> o;
  std::vector<kv_type> k, v;
  // Per sampled query s (query s·sample) and head: lse, o [dim], top-t keys.
  std::vector<double> lse;
  std::vector<double> out;
  std::vector<std::int32_t> top;
};

// Built on first use and kept (rows of all lengths alternate under random interleaving).
tensors& data(std::int32_t keys) {
  static std::map<std::int32_t, tensors> cache;
  auto [it, added] = cache.try_emplace(keys);
  tensors& t = it->second;
  if (!added) return t;
  t.keys = keys;
  t.h = make_haystack(keys, chunk, heads_q, heads_kv, dim, 2026);
  t.o.assign(t.h.q.size(), 0.0f);
  t.k = convert<kv_type>(t.h.k);
  t.v = convert<kv_type>(t.h.v);
  // Dense reference over the K/V the executor reads (fp16 values), in double.
  const std::int32_t rows = chunk / sample;
  t.lse.assign(std::size_t(rows * heads_q), 0.0);
  t.out.assign(std::size_t(rows * heads_q * dim), 0.0);
  t.top.assign(std::size_t(rows * heads_q * top_t), -1);
  const double scale = 1.0 / std::sqrt(double(dim));
  std::vector<float> kf(t.k.size()), vf(t.v.size());
  for (std::size_t i = 0; i < kf.size(); ++i) kf[i] = skim::to_float(t.k[i]), vf[i] = skim::to_float(t.v[i]);
  std::vector<double> s(static_cast<std::size_t>(keys));
  std::vector<std::int32_t> order(static_cast<std::size_t>(keys));
  for (std::int32_t r = 0; r < rows; ++r) {
    const std::int32_t qi = r * sample;
    const std::int32_t visible = keys - chunk + qi + 1;
    for (std::int32_t h = 0; h < heads_q; ++h) {
      const std::int32_t g = h / group;
      const float* q = t.h.q.data() + (std::size_t(qi) * heads_q + h) * dim;
      double m = -INFINITY;
      for (std::int32_t j = 0; j < visible; ++j) {
        const float* k = kf.data() + (std::size_t(j) * heads_kv + g) * dim;
        float dot = 0;
        for (std::int32_t e = 0; e < dim; ++e) dot += q[e] * k[e];
        s[std::size_t(j)] = dot * scale;
        m = std::max(m, s[std::size_t(j)]);
      }
      const std::size_t row = std::size_t(r * heads_q + h);
      double l = 0;
      double* o = t.out.data() + row * dim;
      for (std::int32_t j = 0; j < visible; ++j) {
        const double p = std::exp(s[std::size_t(j)] - m);
        l += p;
        const float* v = vf.data() + (std::size_t(j) * heads_kv + g) * dim;
        for (std::int32_t e = 0; e < dim; ++e) o[e] += p * v[e];
      }
      for (std::int32_t e = 0; e < dim; ++e) o[e] /= l;
      t.lse[row] = m + std::log(l);
      for (std::int32_t j = 0; j < visible; ++j) order[std::size_t(j)] = j;
      std::partial_sort(order.begin(), order.begin() + top_t, order.begin() + visible,
                        [&](std::int32_t a, std::int32_t b) { return s[std::size_t(a)] > s[std::size_t(b)]; });
      std::copy_n(order.begin(), top_t, t.top.begin() + std::ptrdiff_t(row * top_t));
    }
  }
  return t;
}

skim::problem make_problem(const std::int32_t (&cu_q)[2], const std::int32_t (&cu_kv)[2], std::int32_t bk) {
  return {.heads_q = heads_q, .heads_kv = heads_kv, .head_dim = dim, .block_q = block_q, .block_kv = bk,
          .mask = skim::mask_kind::causal, .cu_seqlens_q = cu_q, .cu_seqlens_kv = cu_kv};
}

struct quality {
  double coverage = 0, coverage_p5 = 0, recall = 0, needle = 0, error = 0;
};

quality measure(const tensors& d, const sparse_job<kv_type>& job) {
  quality r;
  const std::int32_t rows = chunk / sample;
  std::vector<double> cover;
  double err = 0, norm = 0, hits = 0, needles = 0;
  for (std::int32_t g = 0; g < heads_kv; ++g) {
    const auto& sl = job.slices()[std::size_t(g)];
    const skim::index::block_table table = job.table(g);
    const std::int32_t bk = sl.prob.block_kv;
    std::vector<char> chosen(std::size_t(sl.prob.kv_blocks(0)));
    (void)skim::for_each_row(sl.prob, [&](const skim::row_info& row) {
      std::fill(chosen.begin(), chosen.end(), 0);
      for (auto c = table.cursor(row); !c.done(); c.next()) chosen[std::size_t(c.id())] = 1;
      for (std::int32_t qi = row.q_begin; qi < row.q_end; ++qi) {
        needles += chosen[std::size_t(d.h.needle_of(g, qi) / bk)];
        if (qi % sample != 0) continue;
        for (std::int32_t hh = 0; hh < group; ++hh) {
          const std::int32_t h = g * group + hh;
          const std::size_t ref = std::size_t((qi / sample) * heads_q + h);
          cover.push_back(std::exp(double(sl.lse[std::size_t(qi * group + hh)]) - d.lse[ref]));
          for (std::int32_t x = 0; x < top_t; ++x) hits += chosen[std::size_t(d.top[ref * top_t + std::size_t(x)] / bk)];
          const float* o = d.o.data() + (std::size_t(qi) * heads_q + h) * dim;
          for (std::int32_t e = 0; e < dim; ++e) {
            const double want = d.out[ref * dim + std::size_t(e)];
            err += (o[e] - want) * (o[e] - want);
            norm += want * want;
          }
        }
      }
    });
  }
  std::sort(cover.begin(), cover.end());
  for (double c : cover) r.coverage += c;
  r.coverage /= double(cover.size());
  r.coverage_p5 = cover[cover.size() / 20];
  r.recall = hits / double(rows * heads_q * top_t);
  r.needle = needles / double(chunk * heads_kv);
  r.error = std::sqrt(err / norm);
  return r;
}

void sparse(benchmark::State& state, std::int32_t n, std::int32_t bk, std::int32_t share) {
  tensors& d = data(n);
  const std::int32_t cu_q[2] = {0, chunk}, cu_kv[2] = {0, n};
  const skim::problem p = make_problem(cu_q, cu_kv, bk);
  sparse_job<kv_type> job(make_sparse_step(p.kv_blocks(0), share), p, d.h.q.data(), d.k.data(), d.v.data(),
                          d.o.data(), skim::summaries_mode::build);
  const std::optional<skim::stage_times> timed = time_sparse_steps(state, job, threads);
  if (!timed) return;
  const skim::stage_times& sum = *timed;
  const double it = double(state.iterations());
  const double blocks = double(p.kv_blocks(0));
  const double scored = double(p.q_blocks(0)) * blocks;  // per kv head, about: rows × visible blocks
  // Each thread handles one kv head: blocks per second of one thread's stage time.
  state.counters["summarize_blocks_per_s"] = blocks * it / sum.summarize;
  state.counters["score_blocks_per_s"] = scored * it / sum.score;
  state.counters["select_blocks_per_s"] = scored * it / sum.select;
  const quality q = measure(d, job);
  state.counters["density"] = job.density();
  state.counters["coverage"] = q.coverage;
  state.counters["coverage_p5"] = q.coverage_p5;
  state.counters["recall8"] = q.recall;
  state.counters["needle"] = q.needle;
  state.counters["error"] = q.error;
  set_rate(state, "flops", 4.0 * job.selected_pairs_all_heads() * dim);
}

void dense(benchmark::State& state, std::int32_t n) {
  tensors& d = data(n);
  const std::int32_t cu_q[2] = {0, chunk}, cu_kv[2] = {0, n};
  const skim::problem p = make_problem(cu_q, cu_kv, 64);
  executor_job<step_executor, kv_type, skim::index::causal_all> job(
      step_executor{}, p, d.h.q.data(), d.k.data(), d.v.data(), d.o.data(), threads,
      [](const skim::problem&, int) { return skim::index::causal_all{}; }, thread_split::kv_heads);
  for (auto _ : state) {
    const skim::status s = job.run();
    if (!s.ok()) {
      state.SkipWithError(s.message());
      return;
    }
    benchmark::ClobberMemory();
  }
  set_rate(state, "flops", 4.0 * causal_pairs(chunk, n) * heads_q * dim);
}

}  // namespace

int main(int argc, char** argv) {
  const std::int32_t max_n = take_max_n_flag(argc, argv, 8192);
  const std::string exec = std::string("/exec:") + step_executor_name + "/threads:" + std::to_string(threads);
  for (std::int32_t n = 4096; n <= max_n; n *= 2) {
    benchmark::RegisterBenchmark(("prefill/step:dense" + exec + "/bk:64/N:" + std::to_string(n)).c_str(),
                                 [=](benchmark::State& s) { dense(s, n); })
        ->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.2);
    for (const std::int32_t bk : {16, 32, 64, 128}) {
      for (const std::int32_t share : {4, 8, 16, 32}) {
        benchmark::RegisterBenchmark(("prefill/step:sparse" + exec + "/bk:" + std::to_string(bk) + "/sel:1/" +
                                      std::to_string(share) + "/N:" + std::to_string(n)).c_str(),
                                     [=](benchmark::State& s) { sparse(s, n, bk, share); })
            ->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.1);
      }
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
