#pragma once
// What skim_bench_cuda's translation units share (runner.cu: options, decode, prefill and main; step.cu:
// the routed decode step): the options, device buffers and their random fills, timing, and the decode
// batch with its K/V (16-bit or codes). Usage and method: runner.cu.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <skim/cuda.cuh>

#define BENCH_CHECK(expr)                                                                   \
  do {                                                                                      \
    const cudaError_t e_ = (expr);                                                          \
    if (e_ != cudaSuccess) {                                                                \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

#define BENCH_STATUS(expr)                                                                  \
  do {                                                                                      \
    const skim::status s_ = (expr);                                                         \
    if (!s_.ok()) {                                                                         \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, s_.message());     \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

namespace skim_bench {

struct options {
  std::string mode;
  int batch = 1, n = 32768, heads_q = 32, heads_kv = 8, dim = 128, bq = 128, bk = 128, blocks = 16;
  int sets = 4, reps = 50, chunk_blocks = 0;
  int cluster_merge = 1;  // decode, step: decode::merge_in_cluster
  int share = 0;          // step: decode_router::share_heads (one selection per sequence)
  int fuse_append = 1;  // step: append_newest folded into the router's score kernel (0: its own launch)
  int fuse_select = 2;  // step: decode selects its rows among the kept candidates (decode_router::score_routed;
                        // 1: from the scores, decode_router::routed; 0: the select kernel)
  int page = 0;         // decode, step: 0 contiguous K/V; P > 0: pages of P tokens in random order
  std::string dtype = "bf16";
  std::string layout = "hnd";  // K/V: hnd (head-major) or nhd (token-major)
  std::string kernel = "auto";  // decode's split kernel: simt (CUDA cores), mma (tensor cores), auto
  std::string kv = "same";      // decode, prefill, step: K/V in Q's type, or quantised codes (fp8, int8)
  std::string summaries = "kv";  // step: max_bound records in K's type (16-bit or codes), or float
  std::string index_out;
  std::string pages;  // --pages P1,P2,...: one run per page size (as --page), in one process
};

inline skim::cuda::decode_kernel decode_kernel_of(const options& o) {
  if (o.kernel == "simt") return skim::cuda::decode_kernel::cuda_cores;
  if (o.kernel == "mma") return skim::cuda::decode_kernel::tensor_cores;
  return skim::cuda::decode_kernel::automatic;
}

// The decode executor the options ask for: split (--chunk-blocks), kernel, merge in a cluster.
inline skim::cuda::decode decode_of(const options& o) {
  skim::cuda::decode exec;
  if (o.chunk_blocks > 0) exec.chunk_blocks = o.chunk_blocks;
  exec.kernel = decode_kernel_of(o);
  exec.merge_in_cluster = o.cluster_merge != 0;
  return exec;
}

template <class T>
struct device_array {
  T* p = nullptr;
  std::size_t n = 0;
  explicit device_array(std::size_t count) : n(count) { BENCH_CHECK(cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(T))); }
  device_array(const device_array&) = delete;
  ~device_array() { cudaFree(p); }
  void upload(const std::vector<T>& h) { BENCH_CHECK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice)); }
};

// N(0, 1) values in a 16-bit type, generated on the host once per distinct pattern and tiled:
// random everywhere, cheap to make for gigabytes.
// a filled with a pattern of value(x) for x ~ N(0, 1), drawn on the host once and tiled.
template <class T, class Value>
void fill_tiled(device_array<T>& a, unsigned seed, Value value) {
  constexpr std::size_t pattern = std::size_t(1) << 22;
  std::vector<T> h(std::min(a.n, pattern));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (T& x : h) x = value(nd(rng));
  BENCH_CHECK(cudaMemcpy(a.p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  for (std::size_t off = h.size(); off < a.n; off += h.size()) {  // the same tiles, copied on the device
    const std::size_t m = std::min(h.size(), a.n - off);
    BENCH_CHECK(cudaMemcpy(a.p + off, a.p, m * sizeof(T), cudaMemcpyDeviceToDevice));
  }
}
template <class T>
void fill_random(device_array<T>& a, unsigned seed) {
  fill_tiled(a, seed, [](float x) { return T::from_float(x); });
}

// Random 8-bit codes (int8 over its range, e4m3 a rounded N(0, 16²)) and scales near their
// inverse, so that the values are about N(0, 1), tiled as fill_random's.
template <class Code>
void fill_codes(device_array<Code>& a, unsigned seed) {
  fill_tiled(a, seed, [](float x) {
    if constexpr (std::is_same_v<Code, std::int8_t>) return static_cast<std::int8_t>(std::clamp(48.0f * x, -127.0f, 127.0f));
    else return Code::from_float(16.0f * x);
  });
}
inline void fill_scales(device_array<float>& a, float unit, unsigned seed) {
  std::vector<float> h(a.n);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.5f, 2.0f);
  for (float& x : h) x = unit * u(rng);
  a.upload(h);
}

// The shape's fields of a JSON line (after "impl"): the problem and the K/V storage.
inline std::string shape_fields(const options& o) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "\"heads_q\": %d, \"heads_kv\": %d, \"dim\": %d, \"bk\": %d, \"page\": %d, \"dtype\": \"%s\"",
                o.heads_q, o.heads_kv, o.dim, o.bk, o.page, o.dtype.c_str());
  return buf;
}

// A shape the executor refuses (or a run it rejects): one JSON line with the reason in "error" instead
// of a measurement, exit status 3.
inline int refuse(const options& o, const char* why) {
  std::string msg;
  for (const char* c = why; *c != '\0'; ++c) {
    if (*c == '"' || *c == '\\') msg += '\\';
    if (static_cast<unsigned char>(*c) >= 0x20) msg += *c;
  }
  std::printf("{\"bench\": \"%s\", \"impl\": \"skim\", \"batch\": %d, \"n\": %d, \"blocks\": %d, %s, \"kv\": \"%s\", "
              "\"error\": \"%s\"}\n",
              o.mode.c_str(), o.batch, o.n, o.blocks, shape_fields(o).c_str(), o.kv.c_str(), msg.c_str());
  std::fflush(stdout);
  return 3;
}

// Median of `reps` timed runs of f(rep) after 3 warm-up runs; milliseconds.
template <class F>
double time_median(int reps, F&& f) {
  cudaEvent_t start, stop;
  BENCH_CHECK(cudaEventCreate(&start));
  BENCH_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) f(i, nullptr);
  BENCH_CHECK(cudaDeviceSynchronize());
  std::vector<float> ms(static_cast<std::size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    BENCH_CHECK(cudaEventRecord(start));
    f(i, nullptr);
    BENCH_CHECK(cudaEventRecord(stop));
    BENCH_CHECK(cudaEventSynchronize(stop));
    BENCH_CHECK(cudaEventElapsedTime(&ms[static_cast<std::size_t>(i)], start, stop));
  }
  std::sort(ms.begin(), ms.end());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms[ms.size() / 2];
}

// Median time of one f(rep, stream) when `reps` of them run back to back in one CUDA graph (docs/design.md §12:
// for short launches, a graph shrinks the launch gaps that per-call events also count): the graph is
// replayed `replays` times, each timed by device events and divided by reps.
template <class F>
double time_graph(int reps, F&& f, int replays = 7) {
  cudaStream_t stream;
  BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  BENCH_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < reps; ++i) f(i, stream);
  BENCH_CHECK(cudaStreamEndCapture(stream, &graph));
  BENCH_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  BENCH_CHECK(cudaEventCreate(&start));
  BENCH_CHECK(cudaEventCreate(&stop));
  BENCH_CHECK(cudaGraphLaunch(exec, stream));  // warm-up
  std::vector<float> ms(static_cast<std::size_t>(replays));
  for (auto& x : ms) {
    BENCH_CHECK(cudaEventRecord(start, stream));
    BENCH_CHECK(cudaGraphLaunch(exec, stream));
    BENCH_CHECK(cudaEventRecord(stop, stream));
    BENCH_CHECK(cudaEventSynchronize(stop));
    BENCH_CHECK(cudaEventElapsedTime(&x, start, stop));
    x /= static_cast<float>(reps);
  }
  std::sort(ms.begin(), ms.end());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  return ms[ms.size() / 2];
}

// K/V of `tokens` tokens per head in o.layout.
template <class T>
skim::cuda::device_contiguous_kv<T> kv_of(const options& o, const T* k, const T* v, std::int64_t tokens) {
  const std::int64_t d = o.dim;
  if (o.layout == "nhd") return {.k = k, .v = v, .token_stride = d * o.heads_kv, .head_stride = d};
  return {.k = k, .v = v, .token_stride = d, .head_stride = d * tokens};
}

// Pages per sequence with --page P (ceil(n / P)), and the K (or V) elements the run allocates: the
// contiguous [batch · n] tokens, or a pool of batch · pages_per_seq pages of P tokens.
inline int pages_per_seq(const options& o) { return o.page > 0 ? (o.n + o.page - 1) / o.page : 0; }
inline std::size_t kv_elems(const options& o) {
  const std::size_t tokens = o.page > 0 ? std::size_t(o.batch) * pages_per_seq(o) * o.page : std::size_t(o.batch) * o.n;
  return tokens * o.heads_kv * o.dim;
}

// One decode step's tensors on the device: o.batch sequences of one query over o.n keys each,
// random Q, K, V (o.layout), the output, and the problem over them (bottom-right causal). With
// --page P, K/V are also a pool of pages of P tokens over the same buffers (o.layout within a page:
// hnd [pages, heads_kv, P, dim], nhd [pages, P, heads_kv, dim]); sequence b owns pages_per_seq
// slots of a page table that is a random permutation of the pool, so its pages are scattered.
template <class T>
struct decode_batch {
  device_array<T> q, k, v, out;
  device_array<std::int32_t> cu_q, cu_kv, page_indptr, page_indices;
  skim::cuda::device_problem prob;

  explicit decode_batch(const options& o)
      : q(std::size_t(o.batch) * o.heads_q * o.dim), k(kv_elems(o)), v(k.n), out(q.n), cu_q(std::size_t(o.batch) + 1),
        cu_kv(cu_q.n), page_indptr(o.page > 0 ? cu_q.n : 0),
        page_indices(o.page > 0 ? std::size_t(o.batch) * pages_per_seq(o) : 0) {
    fill_random(q, 1);
    fill_random(k, 2);
    fill_random(v, 3);
    if (o.page > 0) {
      std::vector<std::int32_t> indptr(page_indptr.n), perm(page_indices.n);
      for (int b = 0; b <= o.batch; ++b) indptr[std::size_t(b)] = b * pages_per_seq(o);
      std::iota(perm.begin(), perm.end(), 0);
      std::mt19937 rng(99);
      for (std::size_t i = perm.size(); i > 1; --i) {  // Fisher-Yates, the same order on every standard library
        std::uniform_int_distribution<std::size_t> pick(0, i - 1);
        std::swap(perm[i - 1], perm[pick(rng)]);
      }
      page_indptr.upload(indptr);
      page_indices.upload(perm);
    }
    std::vector<std::int32_t> hq(cu_q.n), hkv(cu_kv.n);
    for (int b = 0; b <= o.batch; ++b) {
      hq[std::size_t(b)] = b;
      hkv[std::size_t(b)] = b * o.n;
    }
    cu_q.upload(hq);
    cu_kv.upload(hkv);
    prob = {.batch = o.batch, .heads_q = o.heads_q, .heads_kv = o.heads_kv, .head_dim = o.dim, .block_q = 1,
            .block_kv = o.bk, .mask = skim::mask_kind::causal, .cu_seqlens_q = cu_q.p, .cu_seqlens_kv = cu_kv.p,
            .max_seqlen_q = 1, .max_seqlen_kv = o.n};
  }
  [[nodiscard]] skim::cuda::device_view<const T> q_view(const options& o) const noexcept {
    return skim::cuda::device_view<const T>::token_major(q.p, o.heads_q, o.dim);
  }
  [[nodiscard]] skim::cuda::device_view<T> o_view(const options& o) const noexcept {
    return skim::cuda::device_view<T>::token_major(out.p, o.heads_q, o.dim);
  }
  [[nodiscard]] skim::cuda::device_contiguous_kv<T> kv(const options& o) const noexcept {
    return kv_of<T>(o, k.p, v.p, std::int64_t(o.batch) * o.n);
  }
  // The same buffers as the page pool of --page P (o.page > 0).
  [[nodiscard]] skim::cuda::device_paged_kv<T> paged(const options& o) const noexcept {
    const std::int64_t d = o.dim, ps = o.page, h = o.heads_kv;
    const bool nhd = o.layout == "nhd";
    return {.k_pages = k.p, .v_pages = v.p, .num_pages = static_cast<std::int32_t>(page_indices.n), .page_size = o.page,
            .page_stride = ps * h * d, .token_stride = nhd ? h * d : d, .head_stride = nhd ? d : ps * d,
            .page_indptr = page_indptr.p, .page_indices = page_indices.p};
  }
  // The K/V source decode and the step read: contiguous, or paged (Paged: o.page > 0).
  template <bool Paged>
  [[nodiscard]] auto source(const options& o) const noexcept {
    if constexpr (Paged) return paged(o);
    else return kv(o);
  }
};

// The K/V source decode reads: d's K/V (Code = T), or 8-bit codes with per-block scales.
template <class T, class Code>
struct decode_kv {
  std::unique_ptr<device_array<Code>> k, v;
  std::unique_ptr<device_array<float>> ks, vs;

  decode_kv(const options& o, const decode_batch<T>& d) {
    if constexpr (!std::is_same_v<T, Code>) {
      (void)d;
      const std::size_t elems = std::size_t(o.batch) * o.n * o.heads_kv * o.dim;
      const std::size_t scales = std::size_t(o.batch) * ((o.n + o.bk - 1) / o.bk) * o.heads_kv;
      k = std::make_unique<device_array<Code>>(elems);
      v = std::make_unique<device_array<Code>>(elems);
      ks = std::make_unique<device_array<float>>(scales);
      vs = std::make_unique<device_array<float>>(scales);
      fill_codes(*k, 2);
      fill_codes(*v, 3);
      const float unit = std::is_same_v<Code, std::int8_t> ? 1.0f / 48.0f : 1.0f / 16.0f;
      fill_scales(*ks, unit, 4);
      fill_scales(*vs, unit, 5);
    }
  }
  [[nodiscard]] auto source(const options& o, const decode_batch<T>& d) const noexcept {
    if constexpr (std::is_same_v<T, Code>) {
      return d.kv(o);
    } else {
      using src = skim::cuda::device_contiguous_kv<Code>;
      return skim::cuda::device_quantized_kv<src>::per_block(kv_of<Code>(o, k->p, v->p, std::int64_t(o.batch) * o.n),
                                                             ks->p, vs->p, (o.n + o.bk - 1) / o.bk, o.heads_kv);
    }
  }
};

// The routed decode step (`step` mode, step.cu): one JSON line, or a refusal.
int run_step(const options& o);

}  // namespace skim_bench
