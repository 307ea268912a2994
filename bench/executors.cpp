// skim_bench_executors — how fast does each executor run exact attention over a given index?
//
// Cost model. Prefill over every causal block (index::causal_all) is compute-bound: each visible
// (query, key) pair costs one dot product for the score and one axpy for P·V, 4·head_dim flops, so
// the work is 4 · pairs · head_dim · heads_q with pairs = N(N+1)/2 per head; the ceiling is the
// machine's GEMM rate (the eigen_gemm peer), and a good kernel reaches ≥ 70% of it (docs/performance.md's targets).
// Decode (one query, N keys) is bandwidth-bound: every selected K and V row is read once (the
// group's query heads share it), 2 · selected keys · heads_kv · head_dim · sizeof(dtype) bytes
// against ~4 · N · heads_q · head_dim flops; the ceiling is a streaming read of the same bytes (the
// stream peer), and a good kernel reaches ≥ 70% of it. Both read memory, not the 32 MiB L3: inputs
// under 96 MiB rotate over copies (rotation_copies in common.hpp), and sel:1/8 rotates over the 8
// disjoint choices of every 8th block (offsets 0..7), so one pass over the rotation reads 96 MiB or more.
//
// Rows (names are key:value fields split by '/'; bench/plot.py reads them):
//   prefill/exec:E/threads:T/dim:D/bk:B/kv:DT/N:4096          GFLOP/s on visible pairs (counter flops)
//   decode/exec:E/threads:T/dim:D/bk:B/kv:DT/sel:S/N:N         GB/s on selected K+V bytes (counter bytes)
//   prefill/peer:eigen_attention/threads:T/dim:D/kv:fp32/N:4096   the same visible-pair flops
//   gemm/peer:eigen/threads:2/dim:D/M:4096                    2·M·M·D flops of [M, D]·[D, M]
//   decode/peer:stream/threads:T/dim:D/kv:DT/N:N               the bytes of all K+V at that dtype
//                                                              (threads:1 at d = 128, for the one-thread rows)
//   decode_hnd/exec:E/threads:2/dim:128/bk:B/kv:DT/sel:1/8/N:131072   sel:1/8 with head-major K/V
//                                                              [heads_kv, tokens, dim] (the layout in which
//                                                              per-head selections read whole cache lines)
//   decode_shared/exec:E/threads:2/dim:128/bk:B/kv:DT/sel:1/8/N:131072   sel:1/8 on token-major K/V with
//                                                              the ids as one row shared by the kv heads
//                                                              (index::head_shared: read fused, whole rows)
//   decode_l3/exec:simd_avx512f/threads:T/dim:128/bk:32/kv:DT/sel:all/N:4096   the same decode with K/V
//                                                              read from L3 (no rotation): its arithmetic's
//                                                              rate, a ceiling beside the stream's
// E is scalar (the portable executor; it has no threads of its own, so threads:1) and simd_avx2 /
// simd_avx512f where include/skim/exec/cpu/simd.hpp exists and this binary is built for the arch.
// threads:2 runs one kv head per thread (8 query heads, 2 kv heads: two GQA groups of 4), each on
// its own sub-problem and workspace — the same split for skim and for the Eigen peer.
// sel:all reads every block (index::causal_all: head-invariant, so exec::simd reads each token row
// of K/V once for both kv heads); sel:1/8 reads every 8th block through a block_table (one row per
// kv head: a data-driven selection, read per kv head), the gather skim exists for.
// Q and O are fp32; kv:DT is the K/V storage type (converted to fp32 in registers): fp32, fp16, bf16,
// or int8 / fp8 codes with a scale per (block, kv head) (quantized_kv; the rate counts the codes).

#include <benchmark/benchmark.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common.hpp"
#include "skim/core/attention_args.hpp"
#include "skim/core/problem.hpp"
#include "skim/exec/cpu/scalar.hpp"
#include "skim/index/block_table.hpp"
#include "skim/index/causal_all.hpp"
#include "skim/index/head_shared.hpp"

// SKIM_BENCH_NO_SIMD: build without the SIMD executors (e.g. while simd.hpp is being written).
#if !defined(SKIM_BENCH_NO_SIMD) && __has_include("skim/exec/cpu/simd.hpp") && (defined(__AVX2__) || defined(__AVX512F__))
#include "skim/exec/cpu/simd.hpp"
#define SKIM_BENCH_HAS_SIMD 1
#endif

namespace {

using namespace skim_bench;

constexpr std::int32_t heads_q = 8;
constexpr std::int32_t heads_kv = 2;
constexpr std::int32_t prefill_n = 4096;
constexpr std::int32_t block_q = 64;

// The data of every shape, built on first use and kept: with --benchmark_enable_random_interleaving
// (bench/run.sh) the rows of all shapes alternate. About 1 GiB at the 128K decode shapes.
struct tensors {
  std::vector<float> q, o;
  skim::host_buffer<std::byte> k, v;  // K, V in the row's dtype, in huge pages as an engine's cache should be
};

// K and V hold `copies` consecutive copies of [n_kv, heads_kv, dim] (rotation, see decode()).
template <class T>
tensors& data(std::int32_t n_q, std::int32_t n_kv, std::int32_t dim, std::int32_t copies = 1) {
  static std::map<std::string, tensors> cache;
  const std::string key = std::to_string(n_q) + "/" + std::to_string(n_kv) + "/" + std::to_string(dim) + "/" +
                          dtype_name<T>() + "/" + std::to_string(copies);
  auto [it, added] = cache.try_emplace(key);
  tensors& t = it->second;
  if (!added) return t;
  t.q = random_tensor(std::size_t(n_q) * heads_q * dim, 1);
  t.o.assign(t.q.size(), 0.0f);
  for (auto [dst, seed] : {std::pair{&t.k, 2u}, std::pair{&t.v, 3u}}) {
    const std::vector<T> x = convert<T>(random_tensor(std::size_t(n_kv) * heads_kv * dim, seed));
    const std::size_t copy_bytes = x.size() * sizeof(T);
    *dst = skim::host_buffer<std::byte>(copy_bytes * std::size_t(copies));
    for (std::int32_t c = 0; c < copies; ++c) std::memcpy(dst->data() + copy_bytes * std::size_t(c), x.data(), copy_bytes);
  }
  return t;
}

template <class T>
const T* as(const skim::host_buffer<std::byte>& b) {
  return reinterpret_cast<const T*>(b.data());
}

// Prefill over every causal block at N = 4096, GFLOP/s on visible pairs.
template <class Exec, class T>
void prefill(benchmark::State& state, int threads, std::int32_t dim, std::int32_t bk) {
  tensors& d = data<T>(prefill_n, prefill_n, dim);
  const std::int32_t cu[2] = {0, prefill_n};
  const skim::problem p{.heads_q = heads_q, .heads_kv = heads_kv, .head_dim = dim, .block_q = block_q, .block_kv = bk,
                        .mask = skim::mask_kind::causal, .cu_seqlens_q = cu, .cu_seqlens_kv = cu};
  executor_job<Exec, T, skim::index::causal_all> job(Exec{}, p, d.q.data(), as<T>(d.k), as<T>(d.v), d.o.data(),
                                                     threads, [](const skim::problem&, int) { return skim::index::causal_all{}; });
  for (auto _ : state) {
    const skim::status s = job.run();
    if (!s.ok()) {
      state.SkipWithError(s.message());
      return;
    }
    benchmark::DoNotOptimize(d.o.data());
    benchmark::ClobberMemory();
  }
  set_rate(state, "flops", 4.0 * causal_pairs(prefill_n, prefill_n) * dim * heads_q);
}

// Decode (one query) over N keys: every block (sel = 1) or every sel-th block, GB/s on selected K+V bytes.
// Iterations rotate over jobs that read disjoint bytes: copies of K/V (when K+V < rotation_bytes)
// and, for sel > 1, the sel choices of every sel-th block (offset o: blocks o, o + sel, ...).
// cached: one copy, read again each iteration, so that K/V stay in the caches (the arithmetic's rate).
template <class Exec, class T>
void decode(benchmark::State& state, int threads, std::int32_t dim, std::int32_t bk, std::int32_t n, std::int32_t sel,
            kv_layout layout = kv_layout::token_major, bool shared = false, bool cached = false) {
  const std::int32_t copies = cached ? 1 : rotation_copies(2.0 * n * heads_kv * dim * sizeof(T));
  tensors& d = data<T>(1, n, dim, copies);
  const std::size_t copy_elements = std::size_t(n) * heads_kv * dim;
  const std::int32_t cu_q[2] = {0, 1}, cu_kv[2] = {0, n};
  const skim::problem p{.heads_q = heads_q, .heads_kv = heads_kv, .head_dim = dim, .block_q = block_q, .block_kv = bk,
                        .mask = skim::mask_kind::causal, .cu_seqlens_q = cu_q, .cu_seqlens_kv = cu_kv};
  const std::int32_t blocks = p.kv_blocks(0);
  // Codes' scales, one per (block, kv head) for K and V alike (empty for 16- and 32-bit K/V).
  const std::vector<float> scales(is_code<T> ? std::size_t(blocks) * heads_kv : 0, code_unit<T>);
  const auto run_all = [&](auto& jobs) {
    std::size_t next = 0;
    for (auto _ : state) {
      const skim::status s = jobs[next]->run();
      next = (next + 1) % jobs.size();
      if (!s.ok()) {
        state.SkipWithError(s.message());
        return;
      }
      benchmark::DoNotOptimize(d.o.data());
      benchmark::ClobberMemory();
    }
  };
  if (sel == 1) {
    using job = executor_job<Exec, T, skim::index::causal_all>;
    std::vector<std::unique_ptr<job>> jobs;
    for (std::int32_t c = 0; c < copies; ++c) {
      jobs.push_back(std::make_unique<job>(Exec{}, p, d.q.data(), as<T>(d.k) + copy_elements * c,
                                           as<T>(d.v) + copy_elements * c, d.o.data(), threads,
                                           [](const skim::problem&, int) { return skim::index::causal_all{}; },
                                           thread_split::automatic, layout, scales));
    }
    run_all(jobs);
    set_rate(state, "bytes", 2.0 * n * heads_kv * dim * sizeof(T));
    return;
  }
  // Every sel-th block from offset o, the same for each index row (of each slice); `shared` stores
  // them once per query block (index::head_shared: run fused) instead of once per kv head.
  std::vector<std::vector<std::int32_t>> ids(static_cast<std::size_t>(sel)), count(static_cast<std::size_t>(sel));
  double chosen_total = 0;
  const auto run_choices = [&]<class Index>(auto make_index_of) {
    using job = executor_job<Exec, T, Index>;
    std::vector<std::unique_ptr<job>> jobs;
    for (std::int32_t o = 0; o < sel; ++o) {
      const std::int32_t chosen = (blocks - o + sel - 1) / sel;
      chosen_total += chosen;
      std::vector<std::int32_t>& oi = ids[std::size_t(o)];
      const std::int32_t rows = shared ? 1 : heads_kv;  // one query block
      count[std::size_t(o)].assign(std::size_t(rows), chosen);
      for (std::int32_t r = 0; r < rows; ++r) {
        for (std::int32_t c = 0; c < chosen; ++c) oi.push_back(o + c * sel);
      }
      const auto make_index = make_index_of(oi, count[std::size_t(o)], chosen);
      for (std::int32_t c = 0; c < copies; ++c) {
        jobs.push_back(std::make_unique<job>(Exec{}, p, d.q.data(), as<T>(d.k) + copy_elements * c,
                                             as<T>(d.v) + copy_elements * c, d.o.data(), threads, make_index,
                                             thread_split::automatic, layout, scales));
      }
    }
    run_all(jobs);
  };
  if (shared) {
    using shared_index = skim::index::head_shared<skim::index::block_table>;
    run_choices.template operator()<shared_index>([](const auto& oi, const auto& oc, std::int32_t chosen) {
      return [&oi, &oc, chosen](const skim::problem& sp, int) {
        return shared_index{.rows = {.ids = oi, .count = oc, .width = chosen}, .index_heads = sp.index_heads()};
      };
    });
  } else {
    run_choices.template operator()<skim::index::block_table>([](const auto& oi, const auto& oc, std::int32_t chosen) {
      return [&oi, &oc, chosen](const skim::problem& sp, int slice) {
        // A whole-problem table has heads_kv rows; a slice's has one (its kv head's).
        const std::int32_t rows = std::int32_t(sp.index_rows());
        return skim::index::block_table{
            .ids = std::span<const std::int32_t>(oi).subspan(std::size_t(slice * chosen), std::size_t(rows * chosen)),
            .count = std::span<const std::int32_t>(oc).subspan(std::size_t(slice), std::size_t(rows)),
            .width = chosen};
      };
    });
  }
  set_rate(state, "bytes", 2.0 * (chosen_total / sel) * bk * heads_kv * dim * sizeof(T));
}

void eigen_attention_peer(benchmark::State& state, int threads, std::int32_t dim) {
  tensors& d = data<float>(prefill_n, prefill_n, dim);
  eigen_attention attn(d.q.data(), as<float>(d.k), as<float>(d.v), d.o.data(), prefill_n, prefill_n, heads_q, heads_kv, dim);
  for (auto _ : state) {
    attn.run(threads);
    benchmark::DoNotOptimize(d.o.data());
    benchmark::ClobberMemory();
  }
  set_rate(state, "flops", 4.0 * causal_pairs(prefill_n, prefill_n) * dim * heads_q);
}

void gemm_peer(benchmark::State& state, int threads, std::int32_t dim) {
  eigen_gemm g(prefill_n, prefill_n, dim);
  for (auto _ : state) {
    g.run(threads);
    benchmark::DoNotOptimize(g.sample());
  }
  set_rate(state, "flops", g.flops());
}

void stream_peer(benchmark::State& state, int threads, double bytes) {
  stream_read r(static_cast<std::size_t>(bytes), rotation_copies(bytes));
  for (auto _ : state) benchmark::DoNotOptimize(r.run(threads));
  set_rate(state, "bytes", r.bytes());
}

constexpr std::int32_t dims[] = {64, 128};
constexpr std::int32_t block_sizes[] = {16, 32, 64, 128};
constexpr std::int32_t decode_lengths[] = {32768, 131072};

template <class Exec, class T>
void register_executor(const std::string& name, int threads) {
  const std::string id = "exec:" + name + "/threads:" + std::to_string(threads);
  for (const std::int32_t dim : dims) {
    for (const std::int32_t bk : block_sizes) {
      const std::string shape = "/dim:" + std::to_string(dim) + "/bk:" + std::to_string(bk) + "/kv:" + dtype_name<T>();
      benchmark::RegisterBenchmark(("prefill/" + id + shape + "/N:" + std::to_string(prefill_n)).c_str(),
                                   [=](benchmark::State& s) { prefill<Exec, T>(s, threads, dim, bk); })
          ->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.2);
    }
  }
}

template <class Exec, class T>
void register_decode(const std::string& name, int threads) {
  const std::string id = "exec:" + name + "/threads:" + std::to_string(threads);
  for (const std::int32_t n : decode_lengths) {
    for (const std::int32_t dim : dims) {
      for (const std::int32_t bk : block_sizes) {
        for (const std::int32_t sel : {1, 8}) {
          if (sel != 1 && n != decode_lengths[1]) continue;  // the gather at the longest length only
          const std::string row = "decode/" + id + "/dim:" + std::to_string(dim) + "/bk:" + std::to_string(bk) +
                                  "/kv:" + dtype_name<T>() + "/sel:" + (sel == 1 ? "all" : "1/" + std::to_string(sel)) +
                                  "/N:" + std::to_string(n);
          benchmark::RegisterBenchmark(row.c_str(), [=](benchmark::State& s) { decode<Exec, T>(s, threads, dim, bk, n, sel); })
              ->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(0.1);
          if (dim == 128 && threads > 1) {  // again on head-major K/V (the per-head gather reads whole lines there)
            benchmark::RegisterBenchmark(("decode_hnd" + row.substr(6)).c_str(), [=](benchmark::State& s) {
              decode<Exec, T>(s, threads, dim, bk, n, sel, kv_layout::head_major);
            })->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(0.1);
          }
          if (dim == 128 && threads > 1 && sel != 1) {  // the same ids as one row shared by the kv heads
            benchmark::RegisterBenchmark(("decode_shared" + row.substr(6)).c_str(), [=](benchmark::State& s) {
              decode<Exec, T>(s, threads, dim, bk, n, sel, kv_layout::token_major, /*shared=*/true);
            })->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(0.1);
          }
        }
      }
    }
  }
}

// One thread, at the block size decode reads best (32) and d = 128 only, both layouts: the share of
// the one-thread streaming read (a single core's bandwidth is a different ceiling than two cores').
template <class Exec, class T>
void register_decode_one_thread(const std::string& name) {
  for (const std::int32_t n : decode_lengths) {
    const std::string row = "/exec:" + name + "/threads:1/dim:128/bk:32/kv:" + dtype_name<T>() + "/sel:all/N:" + std::to_string(n);
    for (const kv_layout l : {kv_layout::token_major, kv_layout::head_major}) {
      benchmark::RegisterBenchmark(((l == kv_layout::token_major ? "decode" : "decode_hnd") + row).c_str(),
                                   [=](benchmark::State& s) { decode<Exec, T>(s, 1, 128, 32, n, 1, l); })
          ->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(0.1);
    }
  }
}

// The rows above at N = 4096 without rotation: K/V (4 MiB in fp16) stay in L3 and every iteration
// reads them from there, so the rate is what the arithmetic allows, the ceiling that memory rows are
// compared with besides the stream (one core's FMAs can be slower than its share of memory).
template <class Exec, class T>
void register_decode_cached(const std::string& name) {
  constexpr std::int32_t n = 4096;
  for (const int threads : {1, 2}) {
    const std::string row = "decode_l3/exec:" + name + "/threads:" + std::to_string(threads) + "/dim:128/bk:32/kv:" +
                            dtype_name<T>() + "/sel:all/N:" + std::to_string(n);
    benchmark::RegisterBenchmark(row.c_str(), [=](benchmark::State& s) {
      decode<Exec, T>(s, threads, 128, 32, n, 1, kv_layout::token_major, false, true);
    })->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(0.1);
  }
}

template <class T>
void register_dtype() {
  // Peers first, in the same process and on the same data as the executors after them.
  if constexpr (std::is_same_v<T, float>) {
    for (const std::int32_t dim : dims) {
      for (const int threads : {1, 2}) {
        benchmark::RegisterBenchmark(("prefill/peer:eigen_attention/threads:" + std::to_string(threads) + "/dim:" +
                                      std::to_string(dim) + "/kv:fp32/N:" + std::to_string(prefill_n)).c_str(),
                                     [=](benchmark::State& s) { eigen_attention_peer(s, threads, dim); })
            ->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.2);
      }
      benchmark::RegisterBenchmark(("gemm/peer:eigen/threads:2/dim:" + std::to_string(dim) + "/M:" + std::to_string(prefill_n)).c_str(),
                                   [=](benchmark::State& s) { gemm_peer(s, 2, dim); })
          ->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.2);
    }
  }
  register_executor<skim::exec::scalar, T>("scalar", 1);
#if defined(SKIM_BENCH_HAS_SIMD) && defined(__AVX2__)
  register_executor<skim::exec::simd<xsimd::avx2>, T>("simd_avx2", 2);
#endif
#if defined(SKIM_BENCH_HAS_SIMD) && defined(__AVX512F__)
  register_executor<skim::exec::simd<xsimd::avx512f>, T>("simd_avx512f", 2);
#endif
}

template <class T>
void register_decode_dtype() {
  for (const std::int32_t n : decode_lengths) {
    for (const std::int32_t dim : dims) {
      const double bytes = 2.0 * n * heads_kv * dim * sizeof(T);
      for (const int threads : {1, 2}) {
        if (threads == 1 && dim != 128) continue;  // the one-thread rows' peer (register_decode_one_thread)
        benchmark::RegisterBenchmark(("decode/peer:stream/threads:" + std::to_string(threads) + "/dim:" +
                                      std::to_string(dim) + "/kv:" + dtype_name<T>() + "/N:" + std::to_string(n)).c_str(),
                                     [=](benchmark::State& s) { stream_peer(s, threads, bytes); })
            ->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(0.1);
      }
    }
  }
  register_decode<skim::exec::scalar, T>("scalar", 1);
#if defined(SKIM_BENCH_HAS_SIMD) && defined(__AVX2__)
  register_decode<skim::exec::simd<xsimd::avx2>, T>("simd_avx2", 2);
#endif
#if defined(SKIM_BENCH_HAS_SIMD) && defined(__AVX512F__)
  register_decode<skim::exec::simd<xsimd::avx512f>, T>("simd_avx512f", 2);
  if constexpr (!std::is_same_v<T, float>) {
    register_decode_one_thread<skim::exec::simd<xsimd::avx512f>, T>("simd_avx512f");
    register_decode_cached<skim::exec::simd<xsimd::avx512f>, T>("simd_avx512f");
  }
#endif
}

// Quantised K/V (8-bit codes, T): the simd executors at d = 128 on 1 and 2 threads, both layouts,
// bk 32 and 128, beside the streaming read of the codes' bytes; the 16-bit rows of the same shapes
// are register_decode_dtype's.
template <class T>
void register_decode_codes() {
  for (const std::int32_t n : decode_lengths) {
    const double bytes = 2.0 * n * heads_kv * 128 * sizeof(T);
    for (const int threads : {1, 2}) {
      benchmark::RegisterBenchmark(("decode/peer:stream/threads:" + std::to_string(threads) + "/dim:128/kv:" +
                                    dtype_name<T>() + "/N:" + std::to_string(n)).c_str(),
                                   [=](benchmark::State& s) { stream_peer(s, threads, bytes); })
          ->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(0.1);
    }
  }
#if defined(SKIM_BENCH_HAS_SIMD) && defined(__AVX512F__)
  using E = skim::exec::simd<xsimd::avx512f>;
  for (const std::int32_t n : decode_lengths) {
    for (const int threads : {1, 2}) {
      for (const std::int32_t bk : {32, 128}) {
        const std::string row = "/exec:simd_avx512f/threads:" + std::to_string(threads) + "/dim:128/bk:" +
                                std::to_string(bk) + "/kv:" + dtype_name<T>() + "/sel:all/N:" + std::to_string(n);
        for (const kv_layout l : {kv_layout::token_major, kv_layout::head_major}) {
          benchmark::RegisterBenchmark(((l == kv_layout::token_major ? "decode" : "decode_hnd") + row).c_str(),
                                       [=](benchmark::State& s) { decode<E, T>(s, threads, 128, bk, n, 1, l); })
              ->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(0.1);
        }
      }
    }
  }
#endif
}

}  // namespace

int main(int argc, char** argv) {
  register_dtype<float>();
  register_dtype<skim::half>();
  register_dtype<skim::bfloat16>();
  register_decode_dtype<float>();
  register_decode_dtype<skim::half>();
  register_decode_dtype<skim::bfloat16>();
  register_decode_codes<std::int8_t>();
  register_decode_codes<skim::fp8_e4m3>();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
