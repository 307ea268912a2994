#pragma once
// Shared pieces of skim's benchmarks (bench/*.cpp): data builders, the peers every program runs in
// the same process (docs/design.md §12), and a small two-thread pool.
//
//  - random_tensor / haystack     Q, K, V: random normal, or structured like examples/needle_demo.cpp
//                                 (sink, drifting local window, planted needles), at any length
//  - head_slice                   views of one kv head's GQA group: how the benchmarks run skim with
//                                 2 threads (one kv head per thread, each with its own sub-problem and
//                                 workspace) — the split an engine's pool makes; it changes no result
//  - eigen_attention              dense causal attention per head: S = QKᵀ (GEMM), masked softmax,
//                                 O = PV (GEMM), in query chunks, fp32; threads split the heads the
//                                 same way (one kv group per thread); Eigen itself runs one thread
//                                 (no OpenMP), so "2 threads" means the same thing for every row
//  - eigen_gemm                   Eigen's plain GEMM [M, d]·[d, N] split by output rows: the compute ceiling
//  - stream_read                  a plain 64-bit integer sum over a buffer, split in halves: the
//                                 bandwidth ceiling for reading the same bytes (rotated over copies
//                                 of the buffer, like the inputs, when they would fit in L3:
//                                 rotation_copies)
//
// Nothing here is part of skim's API.

#include <benchmark/benchmark.h>

#include <Eigen/Core>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <concepts>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "skim/core/attention_args.hpp"
#include "skim/core/dtypes.hpp"
#include "skim/core/host_buffer.hpp"
#include "skim/core/status.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/quantized.hpp"
#include "skim/core/views.hpp"
#include "skim/core/workspace.hpp"

namespace skim_bench {

using skim::bfloat16;
using skim::half;

template <class T>
[[nodiscard]] constexpr const char* dtype_name() noexcept {
  if constexpr (std::is_same_v<T, float>) {
    return "fp32";
  } else if constexpr (std::is_same_v<T, half>) {
    return "fp16";
  } else if constexpr (std::is_same_v<T, std::int8_t>) {
    return "int8";
  } else if constexpr (std::is_same_v<T, skim::fp8_e4m3>) {
    return "fp8";
  } else {
    return "bf16";
  }
}

// 8-bit K/V codes (quantised sources, skim::quantized_kv).
template <class T>
inline constexpr bool is_code = std::is_same_v<T, std::int8_t> || std::is_same_v<T, skim::fp8_e4m3>;

// ---------------------------------------------------------------------------------------------
// Command-line flags of our own, read (and removed) before benchmark::Initialize sees argv.
// --skim_max_n=N: the longest sequence a program registers (default per program; big N is opt-in).
inline std::int32_t take_max_n_flag(int& argc, char** argv, std::int32_t fallback) {
  std::int32_t max_n = fallback;
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    constexpr std::string_view key = "--skim_max_n=";
    if (a.substr(0, key.size()) == key) {
      max_n = static_cast<std::int32_t>(std::atol(argv[i] + key.size()));
    } else {
      argv[out++] = argv[i];
    }
  }
  argc = out;
  return max_n;
}

// ---------------------------------------------------------------------------------------------
// Two-thread pool: the calling thread plus one persistent worker, so that a 2-thread row does not
// pay a thread start per iteration (tens of microseconds, a few % of a 32K decode). The worker spins for 50 ms
// after a job, then sleeps on an atomic wait: an idle pool does not steal a core from the
// single-threaded rows that follow (their first 50 ms share the core with the spinning worker;
// Google Benchmark's first iterations are its warm-up estimate).
class pool {
 public:
  pool() : worker_([this] { loop(); }) {}
  pool(const pool&) = delete;
  pool& operator=(const pool&) = delete;
  ~pool() {
    stop_.store(true);
    generation_.fetch_add(1);
    generation_.notify_one();
    worker_.join();
  }

  // f(t) for t in [0, threads), threads <= 2; returns when every call has.
  void run(int threads, const std::function<void(int)>& f) {
    if (threads <= 1) {
      f(0);
      return;
    }
    job_ = &f;
    done_.store(false, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_one();
    f(0);
    for (std::uint32_t spins = 0; !done_.load(std::memory_order_acquire); ++spins) backoff(spins);
  }

  static pool& instance() {
    static pool p;
    return p;
  }

 private:
  void loop() {
    std::uint64_t seen = 0;
    for (;;) {
      // Spin up to spin_time (a row's iterations follow each other much faster than that, so the
      // worker is awake when the next one starts: waking a sleeping thread can take milliseconds on a
      // loaded machine), then sleep until the next job.
      const auto idle_since = std::chrono::steady_clock::now();
      std::uint64_t g;
      std::uint32_t spins = 0;
      while ((g = generation_.load(std::memory_order_acquire)) == seen) {
        backoff(spins);
        if ((++spins & 1023u) == 0 && std::chrono::steady_clock::now() - idle_since > spin_time) generation_.wait(seen);
      }
      seen = g;
      if (stop_.load()) return;
      (*job_)(1);
      done_.store(true, std::memory_order_release);
    }
  }

  static constexpr std::chrono::milliseconds spin_time{50};
  // Spin a few microseconds, then yield: on a machine with more runnable threads than cores, a
  // waiting thread that keeps its core can hold off the very thread it waits for by a whole
  // scheduler slice (milliseconds).
  static void backoff(std::uint32_t spins) noexcept {
    if (spins < 4096) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    } else {
      std::this_thread::yield();
    }
  }

  const std::function<void(int)>* job_ = nullptr;
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<bool> done_{true};
  std::atomic<bool> stop_{false};
  std::thread worker_;
};

// ---------------------------------------------------------------------------------------------
// Data. Tensors are token-major [tokens, heads, dim], built in fp32 and converted per dtype.

inline std::vector<float> random_tensor(std::size_t n, std::uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, stddev);
  std::vector<float> x(n);
  for (float& e : x) e = nd(rng);
  return x;
}

// x in storage type T; codes are x in units of 1/32 (int8, clamped) or 1/16 (e4m3), the scales a
// quantised source pairs them with (code_unit<T>).
template <class T>
inline constexpr float code_unit = std::is_same_v<T, std::int8_t> ? 1.0f / 32.0f : 1.0f / 16.0f;
template <class T>
std::vector<T> convert(const std::vector<float>& x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, std::int8_t>) {
    std::vector<T> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = static_cast<std::int8_t>(std::clamp(std::nearbyint(x[i] * 32.0f), -127.0f, 127.0f));
    return y;
  } else {
    constexpr float scale = is_code<T> ? 16.0f : 1.0f;  // e4m3 codes in units of 1/16
    std::vector<T> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = T::from_float(x[i] * scale);
    return y;
  }
}

// x copied into a skim::host_buffer (huge pages from 2 MiB on, where the kernel gives them).
template <class T>
skim::host_buffer<T> to_host_buffer(const std::vector<T>& x) {
  skim::host_buffer<T> y(x.size());
  std::copy(x.begin(), x.end(), y.begin());
  return y;
}

// Structured data with the three shapes real attention has (examples/needle_demo.cpp, at any
// length): an attention sink on the first 4 keys, a slowly drifting "position" direction shared by
// a key and the queries near it (a local window), and needles planted far back that query block i
// of kv head g looks for (needle (i / 64) % needles of g). The queries are the last `queries` tokens.
struct haystack {
  std::int32_t keys = 0, queries = 0, heads_q = 0, heads_kv = 0, dim = 0;
  static constexpr std::int32_t needles = 3;
  std::vector<float> q, k, v;              // [queries, heads_q, dim], [keys, heads_kv, dim] x2
  std::vector<std::int32_t> needle_pos;    // [heads_kv, needles]

  [[nodiscard]] std::int32_t needle_of(std::int32_t kv_head, std::int32_t query) const noexcept {
    return needle_pos[static_cast<std::size_t>(kv_head * needles + (query / 64) % needles)];
  }
};

inline std::vector<float> unit_vector(std::mt19937& rng, std::int32_t dim) {
  std::normal_distribution<float> nd;
  std::vector<float> u(static_cast<std::size_t>(dim));
  double n = 0;
  for (float& x : u) {
    x = nd(rng);
    n += double(x) * x;
  }
  for (float& x : u) x = static_cast<float>(x / std::sqrt(n));
  return u;
}

// Strengths in units of the scaled score q·k/sqrt(d), as in the demo: the haystack holds about 1% of
// a query's mass at 8K keys (more at longer N: it grows with the number of keys).
inline haystack make_haystack(std::int32_t keys, std::int32_t queries, std::int32_t heads_q, std::int32_t heads_kv,
                              std::int32_t dim, std::uint32_t seed) {
  constexpr float sink_score = 10.0f, local_score = 8.0f, needle_score = 14.0f;
  constexpr float query_noise = 0.35f, key_noise = 0.5f;
  constexpr std::int32_t drift = 96;  // tokens between anchor directions of the position signal
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  haystack h;
  h.keys = keys;
  h.queries = queries;
  h.heads_q = heads_q;
  h.heads_kv = heads_kv;
  h.dim = dim;
  h.q.resize(std::size_t(queries) * heads_q * dim);
  h.k.resize(std::size_t(keys) * heads_kv * dim);
  h.v.resize(h.k.size());
  const float root_d = std::sqrt(float(dim));
  const float sink_amp = std::sqrt(sink_score * root_d), local_amp = std::sqrt(local_score * root_d);
  const float needle_amp = std::sqrt(needle_score * root_d);
  const std::int32_t far_end = std::max(65, keys - queries - 512);
  std::uniform_int_distribution<std::int32_t> far_back(64, far_end);
  const std::int32_t group = heads_q / heads_kv;

  for (std::int32_t g = 0; g < heads_kv; ++g) {
    const std::vector<float> sink_dir = unit_vector(rng, dim);
    std::vector<std::vector<float>> anchors;
    for (std::int32_t a = 0; a <= keys / drift + 1; ++a) anchors.push_back(unit_vector(rng, dim));
    const auto position = [&](std::int32_t t, std::int32_t e) {
      const float w = float(t % drift) / drift;
      return (1 - w) * anchors[std::size_t(t / drift)][std::size_t(e)] + w * anchors[std::size_t(t / drift + 1)][std::size_t(e)];
    };
    std::vector<std::vector<float>> needle_dir;
    for (std::int32_t n = 0; n < haystack::needles; ++n) {
      needle_dir.push_back(unit_vector(rng, dim));
      h.needle_pos.push_back(far_back(rng));
    }
    for (std::int32_t t = 0; t < keys; ++t) {
      float* k = h.k.data() + (std::size_t(t) * heads_kv + g) * dim;
      float* v = h.v.data() + (std::size_t(t) * heads_kv + g) * dim;
      for (std::int32_t e = 0; e < dim; ++e) {
        k[e] = key_noise * nd(rng) + local_amp * position(t, e) + (t < 4 ? sink_amp * sink_dir[std::size_t(e)] : 0.0f);
        v[e] = nd(rng);
      }
      for (std::int32_t n = 0; n < haystack::needles; ++n) {
        if (h.needle_pos[std::size_t(g * haystack::needles + n)] != t) continue;
        for (std::int32_t e = 0; e < dim; ++e) k[e] = key_noise * nd(rng) + needle_amp * needle_dir[std::size_t(n)][std::size_t(e)];
      }
    }
    for (std::int32_t i = 0; i < queries; ++i) {
      const std::int32_t t = keys - queries + i;  // the query's own position
      const std::int32_t n = (i / 64) % haystack::needles;
      for (std::int32_t hh = g * group; hh < (g + 1) * group; ++hh) {
        float* q = h.q.data() + (std::size_t(i) * heads_q + hh) * dim;
        for (std::int32_t e = 0; e < dim; ++e) {
          q[e] = query_noise * nd(rng) + local_amp * position(t, e) + sink_amp * sink_dir[std::size_t(e)] +
                 needle_amp * needle_dir[std::size_t(n)][std::size_t(e)];
        }
      }
    }
  }
  return h;
}

// Causal (bottom-right) query-key pairs of one head: query i of n_q sees keys [0, i + n_kv - n_q].
[[nodiscard]] inline double causal_pairs(std::int64_t n_q, std::int64_t n_kv) noexcept {
  double pairs = 0;
  for (std::int64_t i = 0; i < n_q; ++i) pairs += double(std::min(n_kv, std::max<std::int64_t>(0, i + n_kv - n_q + 1)));
  return pairs;
}

// ---------------------------------------------------------------------------------------------
// One kv head's GQA group as a problem of its own: heads [g·group, (g+1)·group) of Q and O, kv head g
// of K and V, same strides. Sub-problems of different kv heads touch disjoint data, so running them
// on different threads computes exactly what the whole problem computes (the lse layout differs:
// [tokens_q, group] per slice).
template <class T>
[[nodiscard]] skim::strided_view<T> slice_heads(skim::strided_view<T> v, std::int32_t first, std::int32_t count) noexcept {
  v.data = v.data + first * v.head_stride;
  v.heads = count;
  return v;
}

[[nodiscard]] inline skim::problem slice_problem(skim::problem p) noexcept {
  p.heads_q = p.group_size();
  p.heads_kv = 1;
  return p;
}

// Executors that offer work items for an engine's thread pool (exec::simd: prepare, item_count,
// run_items with a scratch slot per thread).
template <class Exec, class Args>
concept has_work_items = requires(const Exec& e, const Args& a, std::span<std::byte> ws) {
  { e.prepare(a, ws, std::int32_t{2}) } -> std::same_as<skim::status>;
  { e.item_count(a.prob) } -> std::convertible_to<std::int64_t>;
  { e.run_items(a, ws, std::int64_t{0}, std::int64_t{1}, std::int32_t{0}) } -> std::same_as<skim::status>;
  { e.workspace_bytes(a.prob, std::int32_t{2}) } -> std::convertible_to<std::size_t>;
};

// An executor call on `threads` threads of the pool:
//  - an executor with work items: one prepare(), then the threads take items one at a time from a
//    shared counter, each with its own scratch slot (how skim's parallel_for and an engine's pool
//    drive it; causal prefill items differ in cost by up to N, so a static split would be unbalanced);
//  - any other executor with threads > 1: one sub-problem per kv head (slice_problem), kv heads t,
//    t + threads, ... on thread t, each with its own workspace (the split the Eigen peer uses);
//  - threads = 1: the whole problem in one run() call.
// make_index(problem, slice) gives the index of a (sub-)problem: a block_table needs its own rows.
enum class thread_split : std::uint8_t { automatic, kv_heads };
// K/V layout of the job's views over the same buffers: token-major [tokens, heads_kv, dim] (NHD, the
// default) or head-major [heads_kv, tokens, dim] (HND).
enum class kv_layout : std::uint8_t { token_major, head_major };

// The K/V source of a job over elements T: contiguous_kv<T>, or quantized_kv<T> for 8-bit codes.
template <class T, bool Code = is_code<T>>
struct job_kv_of {
  using type = skim::contiguous_kv<T>;
};
template <class T>
struct job_kv_of<T, true> {
  using type = skim::quantized_kv<T>;
};
template <class T>
using job_kv = typename job_kv_of<T>::type;

template <class Exec, class T, class Index>
class executor_job {
 public:
  using args_type = skim::attention_args<float, job_kv<T>, Index, float>;
  static constexpr bool has_items = has_work_items<Exec, args_type>;

  // Codes (T an 8-bit code) read with scales[kv_block * heads_kv + h] for K and V alike, and run as
  // one problem (a scale array is not sliced by kv head).
  template <class MakeIndex>
  executor_job(const Exec& exec, const skim::problem& p, const float* q, const T* k, const T* v, float* o, int threads,
               MakeIndex&& make_index, thread_split split = thread_split::automatic,
               kv_layout layout = kv_layout::token_major, std::span<const float> scales = {})
      : exec_(exec), threads_(threads), items_(has_items && split == thread_split::automatic) {
    const std::int32_t slices = threads <= 1 || items_ || is_code<T> ? 1 : p.heads_kv;
    const std::int32_t nq = p.tokens_q(), nkv = p.tokens_kv();
    const auto qv = skim::strided_view<const float>::token_major(q, nq, p.heads_q, p.head_dim);
    const auto ov = skim::strided_view<float>::token_major(o, nq, p.heads_q, p.head_dim);
    const auto kv_view = [&](const T* x) {
      return layout == kv_layout::head_major ? skim::strided_view<const T>::head_major(x, nkv, p.heads_kv, p.head_dim)
                                             : skim::strided_view<const T>::token_major(x, nkv, p.heads_kv, p.head_dim);
    };
    const auto kv = kv_view(k);
    const auto vv = kv_view(v);
    for (std::int32_t s = 0; s < slices; ++s) {
      const skim::problem sp = slices == 1 ? p : slice_problem(p);
      const std::int32_t g = slices == 1 ? 0 : s;
      const std::int32_t hq = sp.heads_q, hkv = sp.heads_kv;
      job_kv<T> source{.k = slice_heads(kv, g, hkv), .v = slice_heads(vv, g, hkv)};
      if constexpr (is_code<T>) {
        source.k_scales = scales;
        source.v_scales = scales;
      }
      args_.push_back(args_type{.prob = sp,
                                .q = slice_heads(qv, g * p.group_size(), hq),
                                .kv = source,
                                .index = make_index(sp, s),
                                .o = slice_heads(ov, g * p.group_size(), hq)});
      if constexpr (has_items) {
        ws_.emplace_back(exec_.workspace_bytes(sp, std::int32_t(std::max(threads, 1))));
      } else {
        ws_.emplace_back(exec_.workspace_bytes(sp));
      }
    }
  }

  // Runs the whole problem once; the first failed status, if any.
  [[nodiscard]] skim::status run() {
    if constexpr (has_items) {
      if (items_ && threads_ > 1) {
        const args_type& a = args_[0];
        const std::span<std::byte> ws = ws_[0].span();
        SKIM_TRY(exec_.prepare(a, ws, std::int32_t(threads_)));
        const std::int64_t n = exec_.item_count(a.prob);
        skim::status results[2];
        std::atomic<std::int64_t> next{0};
        pool::instance().run(threads_, [&](int t) {
          for (std::int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < n && results[t].ok();
               i = next.fetch_add(1, std::memory_order_relaxed)) {
            results[t] = exec_.run_items(a, ws, i, i + 1, std::int32_t(t));
          }
        });
        SKIM_TRY(results[0]);
        return results[1];
      }
    }
    std::atomic<int> failed{-1};
    const int slices = static_cast<int>(args_.size());
    const int threads = std::min(threads_, slices);
    pool::instance().run(threads, [&](int t) {
      for (int s = t; s < slices; s += threads) {
        if (!exec_.run(args_[std::size_t(s)], ws_[std::size_t(s)].span()).ok()) failed.store(s);
      }
    });
    if (failed.load() >= 0) {
      const int s = failed.load();
      return exec_.run(args_[std::size_t(s)], ws_[std::size_t(s)].span());  // again, for its message
    }
    return skim::status::success();
  }

 private:
  Exec exec_;
  int threads_;
  bool items_;
  std::vector<args_type> args_;
  std::vector<skim::workspace_buffer> ws_;
};

// ---------------------------------------------------------------------------------------------
// Eigen dense causal attention, fp32, per query head: for query chunks of `chunk` rows,
//   S = scale · Q_c K_[0,last)ᵀ   (GEMM, only the keys the chunk's last query sees)
//   P = softmax(S) with future keys masked
//   O_c = P V_[0,last)            (GEMM)
// Flops actually done exceed the visible pairs by about chunk/2 keys per row (the masked triangle
// of the chunk's diagonal); rates count visible pairs only, like every other row.
class eigen_attention {
 public:
  using row_major = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using const_map = Eigen::Map<const row_major, 0, Eigen::OuterStride<>>;
  using map = Eigen::Map<row_major, 0, Eigen::OuterStride<>>;
  static constexpr std::int32_t chunk = 128;

  // q [n_q, heads_q, dim], k, v [n_kv, heads_kv, dim], o [n_q, heads_q, dim], token-major fp32.
  eigen_attention(const float* q, const float* k, const float* v, float* o, std::int32_t n_q, std::int32_t n_kv,
                  std::int32_t heads_q, std::int32_t heads_kv, std::int32_t dim)
      : q_(q), k_(k), v_(v), o_(o), n_q_(n_q), n_kv_(n_kv), heads_q_(heads_q), heads_kv_(heads_kv), dim_(dim) {
    for (row_major& s : scores_) s.resize(chunk, n_kv);
  }

  // Heads of kv groups t, t + threads, ... on thread t.
  void run(int threads) {
    pool::instance().run(threads, [&](int t) {
      for (std::int32_t g = t; g < heads_kv_; g += threads) {
        const std::int32_t group = heads_q_ / heads_kv_;
        for (std::int32_t h = g * group; h < (g + 1) * group; ++h) head(h, g, scores_[std::size_t(t)]);
      }
    });
  }

 private:
  void head(std::int32_t h, std::int32_t g, row_major& s) const {
    const float scale = 1.0f / std::sqrt(float(dim_));
    const std::int64_t qs = std::int64_t(heads_q_) * dim_, ks = std::int64_t(heads_kv_) * dim_;
    const std::int32_t offset = n_kv_ - n_q_;  // query i sees keys j <= i + offset
    for (std::int32_t r0 = 0; r0 < n_q_; r0 += chunk) {
      const std::int32_t rows = std::min(chunk, n_q_ - r0);
      const std::int32_t keys = std::clamp(r0 + rows + offset, 0, n_kv_);  // seen by the chunk's last query
      if (keys == 0) continue;
      const const_map qc(q_ + std::int64_t(r0) * qs + std::int64_t(h) * dim_, rows, dim_, Eigen::OuterStride<>(qs));
      const const_map kc(k_ + std::int64_t(g) * dim_, keys, dim_, Eigen::OuterStride<>(ks));
      const const_map vc(v_ + std::int64_t(g) * dim_, keys, dim_, Eigen::OuterStride<>(ks));
      auto sc = s.topLeftCorner(rows, keys);
      sc.noalias() = (scale * qc) * kc.transpose();
      for (std::int32_t i = 0; i < rows; ++i) {
        const std::int32_t seen = std::clamp(r0 + i + offset + 1, 0, keys);
        float* row = s.row(i).data();
        float m = -std::numeric_limits<float>::infinity();
        for (std::int32_t j = 0; j < seen; ++j) m = std::max(m, row[j]);
        float sum = 0;
        for (std::int32_t j = 0; j < seen; ++j) {
          row[j] = std::exp(row[j] - m);
          sum += row[j];
        }
        const float inv = seen > 0 ? 1.0f / sum : 0.0f;
        for (std::int32_t j = 0; j < seen; ++j) row[j] *= inv;
        for (std::int32_t j = seen; j < keys; ++j) row[j] = 0.0f;
      }
      map oc(o_ + std::int64_t(r0) * qs + std::int64_t(h) * dim_, rows, dim_, Eigen::OuterStride<>(qs));
      oc.noalias() = sc * vc;
    }
  }

  const float *q_, *k_, *v_;
  float* o_;
  std::int32_t n_q_, n_kv_, heads_q_, heads_kv_, dim_;
  row_major scores_[2];
};

// Eigen's GEMM C[m, n] = A[m, d]·B[d, n], the output rows split over the threads: the compute
// ceiling of attention's two GEMMs at the same sizes. Flops: 2·m·n·d.
class eigen_gemm {
 public:
  using row_major = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  eigen_gemm(std::int32_t m, std::int32_t n, std::int32_t d)
      : a_(row_major::Random(m, d)), b_(row_major::Random(d, n)), c_(m, n) {}
  void run(int threads) {
    const Eigen::Index m = a_.rows();
    pool::instance().run(threads, [&](int t) {
      const Eigen::Index first = m * t / threads, last = m * (t + 1) / threads;
      c_.middleRows(first, last - first).noalias() = a_.middleRows(first, last - first) * b_;
    });
  }
  [[nodiscard]] double flops() const noexcept { return 2.0 * double(a_.rows()) * double(b_.cols()) * double(a_.cols()); }
  [[nodiscard]] float sample() const noexcept { return c_(0, 0); }

 private:
  row_major a_, b_, c_;
};

// Streaming read: the sum of a buffer's 64-bit words, halves on different threads. Integer adds
// vectorise without -ffast-math, so the loop runs at the memory's pace. With copies > 1 the buffer
// holds that many segments of `bytes` and each run reads the next one (rotation: see rotation_copies).
class stream_read {
 public:
  explicit stream_read(std::size_t bytes, std::int32_t copies = 1)
      : words_(bytes / sizeof(std::uint64_t) * std::size_t(std::max(copies, 1))), copies_(std::max(copies, 1)) {
    for (std::size_t i = 0; i < words_.size(); ++i) words_[i] = i * 0x9e3779b97f4a7c15ull;
  }
  std::uint64_t run(int threads) {
    std::uint64_t part[2] = {0, 0};
    const std::size_t n = words_.size() / std::size_t(copies_);
    const std::uint64_t* w = words_.data() + n * std::size_t(next_);
    next_ = (next_ + 1) % copies_;
    pool::instance().run(threads, [&](int t) {
      const std::size_t first = n * std::size_t(t) / std::size_t(threads), last = n * std::size_t(t + 1) / std::size_t(threads);
      std::uint64_t s = 0;
      for (std::size_t i = first; i < last; ++i) s += w[i];
      part[t] = s;
    });
    return part[0] + part[1];
  }
  // Bytes one run reads.
  [[nodiscard]] double bytes() const noexcept { return double(words_.size() / std::size_t(copies_) * sizeof(std::uint64_t)); }

 private:
  skim::host_buffer<std::uint64_t> words_;  // huge pages, as the inputs it is a ceiling for
  std::int32_t copies_ = 1;
  std::int32_t next_ = 0;
};

// Inputs smaller than this are rotated: a bench keeps this many copies of them and each iteration
// reads the next one, so that together they overflow the last-level cache (32 MiB here) and a row
// measures memory, not cache. 96 MiB = 3x that L3.
constexpr double rotation_bytes = 96.0 * 1024 * 1024;
[[nodiscard]] inline std::int32_t rotation_copies(double bytes) noexcept {
  return bytes >= rotation_bytes ? 1 : static_cast<std::int32_t>(std::ceil(rotation_bytes / bytes));
}

// ---------------------------------------------------------------------------------------------
// Rate counters (docs/design.md §12: every row shows a rate). kIsRate divides by the row's time; with
// UseRealTime that is wall time.
inline void set_rate(benchmark::State& state, const char* name, double per_iteration) {
  state.counters[name] = benchmark::Counter(per_iteration * double(state.iterations()), benchmark::Counter::kIsRate);
}

}  // namespace skim_bench
