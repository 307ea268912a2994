// skim_bench_cuda: times skim's CUDA executors on one shape and prints one JSON line per result.
// bench/cuda/compare.py runs it next to PyTorch's peers (SDPA cuDNN and flash, FlexAttention with
// the same block mask) and prints the table; scripts/cuda runs both on the GPU machine.
//
//   skim_bench_cuda decode  --batch 8 --n 131072 --blocks 16   (--blocks 0: every block, dense)
//   skim_bench_cuda prefill --n 32768 --blocks 16              (--blocks 0: every causal block)
//   skim_bench_cuda step    --batch 8 --n 131072 --blocks 16   (append + route + decode, one CUDA graph;
//                                                               --fuse-append 0: append in its own launch;
//                                                               graph_ms: reps steps back to back in one graph;
//                                                               --share 1: one selection per sequence for all
//                                                               its kv heads, decode over device_head_shared;
//                                                               --fuse-select 0: the router's select kernel
//                                                               instead of decode selecting its own rows)
//   common: --heads-q 32 --heads-kv 8 --dim 128 --bk 128 --bq 128 --dtype bf16|fp16
//           --layout hnd|nhd (K/V head-major [heads_kv, tokens, dim], as the PyTorch peers hold them,
//           or token-major [tokens, heads_kv, dim]; printed as "layout")
//           --sets 4 (index sets rotated between timed runs) --reps 50 --index-out FILE
//   decode, prefill, step: --kv same|fp8|int8 (K/V in Q's type, or 8-bit codes with a scale per block
//           and kv head; printed as "kv"; decode's rate counts the codes' bytes and the scales')
//   step: --summaries kv|float (max_bound records in K's own type, 16-bit or codes, the default; or,
//           over codes, float; printed as "summaries"); codes under --dtype bf16, without --share
//   decode, step: --kernel simt|mma|auto (decode's split kernel: CUDA cores, tensor cores, or the
//           executor's choice; printed as "kernel" in the JSON line) --chunk-blocks C (printed as
//           "chunk_blocks": the executor's choice when 0) --cluster-merge 0|1 (decode::merge_in_cluster)
//   decode, step: --page P (0, the default: contiguous K/V; P > 0: skim's paged source, pages of P
//           tokens over a pool whose page table is a random permutation, so a sequence's pages are
//           scattered; --layout within a page; 16-bit K/V only); --pages 0,16,64: one run (one line)
//           per page size in one process
//   prefill: --kernel mma|wgmma|auto (cuda::prefill's kernel: mma.sync, wgmma on sm_90a, or
//           the executor's choice, the default; printed as "kernel" in the JSON line)
//
// Method (docs/design.md §12): random inputs (never zeros), a warm-up, device events around each run, the
// median over reps (decode also prints graph_ms: reps launches back to back in one CUDA graph, per
// launch, as an engine's captured decode step runs them); each rep uses the next of --sets random index sets over the same K/V, so the
// selected bytes of one rep are not left in L2 by the previous one. --index-out writes the index
// sets (int32, [sets, rows, blocks]) so compare.py builds FlexAttention's mask from the same ids.
// Rates: decode counts the selected K+V bytes read once; prefill counts 4·pairs·head_dim·heads_q
// over the (causally) visible pairs of the selected blocks.
// Decode and step lines end with the shape: heads_q, heads_kv, dim, bk, page, dtype. A shape or a
// run the executor refuses prints one line with "error" (the status message) and exits with 3.
//
// The shape sweep (batch 1..64, head_dim 64 and 128, GQA 1/4/8, paged K/V with pages of 16 and 64,
// each against SDPA cuDNN / flash and FlexAttention) is compare.py's --only sweep:
//   python3 bench/cuda/compare.py --runner build/cuda-device/skim_bench_cuda --out OUT --only sweep [--quick]
//   SKIM_CUDA_BENCH_ARGS='--only sweep' scripts/cuda bench
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

namespace {

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

struct options {
  std::string mode;
  int batch = 1, n = 32768, heads_q = 32, heads_kv = 8, dim = 128, bq = 128, bk = 128, blocks = 16;
  int sets = 4, reps = 50, chunk_blocks = 0;
  int cluster_merge = 1;  // decode, step: decode::merge_in_cluster
  int share = 0;          // step: decode_router::share_heads (one selection per sequence)
  int fuse_append = 1;  // step: append_newest folded into the router's score kernel (0: its own launch)
  int fuse_select = 1;  // step: decode selects its rows (decode_router::routed; 0: the select kernel)
  int page = 0;         // decode, step: 0 contiguous K/V; P > 0: pages of P tokens in random order
  std::string dtype = "bf16";
  std::string layout = "hnd";  // K/V: hnd (head-major) or nhd (token-major)
  std::string kernel = "auto";  // decode's split kernel: simt (CUDA cores), mma (tensor cores), auto
  std::string kv = "same";      // decode, prefill, step: K/V in Q's type, or quantised codes (fp8, int8)
  std::string summaries = "kv";  // step: max_bound records in K's type (16-bit or codes), or float
  std::string index_out;
  std::string pages;  // --pages P1,P2,...: one run per page size (as --page), in one process
};

skim::cuda::decode_kernel decode_kernel_of(const options& o) {
  if (o.kernel == "simt") return skim::cuda::decode_kernel::cuda_cores;
  if (o.kernel == "mma") return skim::cuda::decode_kernel::tensor_cores;
  return skim::cuda::decode_kernel::automatic;
}

options parse(int argc, char** argv) {
  options o;
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s decode|prefill [--batch B] [--n N] [--blocks K] ...\n", argv[0]);
    std::exit(2);
  }
  o.mode = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--batch") o.batch = std::atoi(v);
    else if (k == "--n") o.n = std::atoi(v);
    else if (k == "--heads-q") o.heads_q = std::atoi(v);
    else if (k == "--heads-kv") o.heads_kv = std::atoi(v);
    else if (k == "--dim") o.dim = std::atoi(v);
    else if (k == "--bq") o.bq = std::atoi(v);
    else if (k == "--bk") o.bk = std::atoi(v);
    else if (k == "--blocks") o.blocks = std::atoi(v);
    else if (k == "--sets") o.sets = std::atoi(v);
    else if (k == "--reps") o.reps = std::atoi(v);
    else if (k == "--chunk-blocks") o.chunk_blocks = std::atoi(v);
    else if (k == "--dtype") o.dtype = v;
    else if (k == "--kernel") o.kernel = v;
    else if (k == "--layout") o.layout = v;
    else if (k == "--kv") o.kv = v;
    else if (k == "--summaries") o.summaries = v;
    else if (k == "--fuse-append") o.fuse_append = std::atoi(v);
    else if (k == "--cluster-merge") o.cluster_merge = std::atoi(v);
    else if (k == "--share") o.share = std::atoi(v);
    else if (k == "--fuse-select") o.fuse_select = std::atoi(v);
    else if (k == "--index-out") o.index_out = v;
    else if (k == "--page") o.page = std::atoi(v);
    else if (k == "--pages") o.pages = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  return o;
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
void fill_scales(device_array<float>& a, float unit, unsigned seed) {
  std::vector<float> h(a.n);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.5f, 2.0f);
  for (float& x : h) x = unit * u(rng);
  a.upload(h);
}

// The shape's fields of a JSON line (after "impl"): the problem and the K/V storage.
std::string shape_fields(const options& o) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "\"heads_q\": %d, \"heads_kv\": %d, \"dim\": %d, \"bk\": %d, \"page\": %d, \"dtype\": \"%s\"",
                o.heads_q, o.heads_kv, o.dim, o.bk, o.page, o.dtype.c_str());
  return buf;
}

// A shape the executor refuses (or a run it rejects): one JSON line with the reason in "error" instead
// of a measurement, exit status 3.
int refuse(const options& o, const char* why) {
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

void write_index(const options& o, const std::vector<std::int32_t>& ids) {
  if (o.index_out.empty()) return;
  FILE* f = std::fopen(o.index_out.c_str(), "wb");
  if (f == nullptr || std::fwrite(ids.data(), sizeof(std::int32_t), ids.size(), f) != ids.size()) {
    std::fprintf(stderr, "cannot write %s\n", o.index_out.c_str());
    std::exit(1);
  }
  std::fclose(f);
}

// `k` distinct sorted ids from [0, visible), always including the last one (the query's own block,
// as a local branch would); all of them when visible <= k.
void pick_blocks(std::mt19937& rng, int visible, int k, std::int32_t* out) {
  if (visible <= k) {
    std::iota(out, out + visible, 0);
    return;
  }
  std::vector<std::int32_t> all(static_cast<std::size_t>(visible - 1));
  std::iota(all.begin(), all.end(), 0);
  for (int i = 0; i < k - 1; ++i) {
    std::uniform_int_distribution<int> d(i, visible - 2);
    std::swap(all[static_cast<std::size_t>(i)], all[static_cast<std::size_t>(d(rng))]);
  }
  std::sort(all.begin(), all.begin() + (k - 1));
  std::copy(all.begin(), all.begin() + (k - 1), out);
  out[k - 1] = visible - 1;
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
int pages_per_seq(const options& o) { return o.page > 0 ? (o.n + o.page - 1) / o.page : 0; }
std::size_t kv_elems(const options& o) {
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

// Paged: K/V read through decode_batch::paged (--page P), else contiguous or quantised (--kv).
template <class T, class Code = T, bool Paged = false>
int run_decode(const options& o) {
  const int kv_blocks = (o.n + o.bk - 1) / o.bk;
  const bool dense = o.blocks <= 0;
  const int width = dense ? kv_blocks : std::min(o.blocks, kv_blocks);
  const int sets = dense ? 1 : o.sets;
  const std::int64_t rows = std::int64_t(o.batch) * o.heads_kv;

  std::vector<std::int32_t> ids(std::size_t(sets) * rows * width), count(std::size_t(rows), width);
  std::mt19937 rng(1234);
  for (int s = 0; s < sets; ++s)
    for (std::int64_t r = 0; r < rows; ++r) {
      std::int32_t* row = ids.data() + (std::size_t(s) * rows + r) * width;
      if (dense) std::iota(row, row + width, 0);
      else pick_blocks(rng, kv_blocks, width, row);
    }
  write_index(o, ids);

  const decode_batch<T> d(o);
  const decode_kv<T, Code> kv(o, d);
  const skim::cuda::device_problem& p = d.prob;
  device_array<std::int32_t> d_ids(ids.size()), d_count(count.size());
  d_ids.upload(ids);
  d_count.upload(count);

  skim::cuda::decode exec;
  if (o.chunk_blocks > 0) exec.chunk_blocks = o.chunk_blocks;
  exec.kernel = decode_kernel_of(o);
  exec.merge_in_cluster = o.cluster_merge != 0;
  if (const skim::status s = exec.can_implement(p); !s.ok()) return refuse(o, s.message());
  const std::size_t ws_bytes = exec.workspace_bytes(p, width);
  device_array<std::byte> ws(ws_bytes);
  const auto source = [&] {
    if constexpr (Paged) return d.paged(o);
    else return kv.source(o, d);
  };
  using args_t = skim::cuda::device_attention_args<T, decltype(source()), skim::cuda::device_block_table, T>;
  const auto args = [&](int rep) {
    return args_t{.prob = p,
                  .q = d.q_view(o),
                  .kv = source(),
                  .index = {.ids = d_ids.p + std::size_t(rep % sets) * rows * width, .count = d_count.p, .width = width,
                            .rows = rows},
                  .o = d.o_view(o)};
  };
  // One checked run first: a shape run() rejects is reported as a JSON line, not a crash.
  if (const skim::status s = exec.run(args(0), std::span<std::byte>(ws.p, ws_bytes), nullptr); !s.ok()) {
    return refuse(o, s.message());
  }
  BENCH_CHECK(cudaDeviceSynchronize());
  const auto run = [&](int rep, cudaStream_t stream) {
    BENCH_STATUS(exec.run(args(rep), std::span<std::byte>(ws.p, ws_bytes), stream));
  };
  const double ms = time_median(o.reps, run);
  const double graph_ms = time_graph(o.reps, run);
  const bool quantized = !std::is_same_v<T, Code>;
  const double bytes = 2.0 * double(rows) * width * (double(o.bk) * o.dim * sizeof(Code) + (quantized ? 4.0 : 0.0));
  std::printf("{\"bench\": \"decode\", \"impl\": \"skim\", \"batch\": %d, \"n\": %d, \"blocks\": %d, \"ms\": %.5f, "
              "\"bytes\": %.0f, \"tb_per_s\": %.3f, \"graph_ms\": %.5f, \"graph_tb_per_s\": %.3f, \"kernel\": \"%s\", "
              "\"layout\": \"%s\", \"chunk_blocks\": %d, \"cluster_merge\": %d, \"kv\": \"%s\", %s}\n",
              o.batch, o.n, dense ? 0 : width, ms, bytes, bytes / ms * 1e-9, graph_ms, bytes / graph_ms * 1e-9,
              o.kernel.c_str(), o.layout.c_str(), exec.chunk(p, width, quantized), o.cluster_merge, o.kv.c_str(),
              shape_fields(o).c_str());
  return 0;
}

skim::cuda::prefill_kernel prefill_kernel_of(const options& o) {
  if (o.kernel == "mma") return skim::cuda::prefill_kernel::mma_sync;
  if (o.kernel == "wgmma") return skim::cuda::prefill_kernel::wgmma;
  return skim::cuda::prefill_kernel::automatic;
}

// Code = T: K/V in Q's type; else 8-bit codes with a scale per (block, kv head) (--kv fp8|int8).
template <class T, class Code = T>
int run_prefill(const options& o) {
  const int q_blocks = (o.n + o.bq - 1) / o.bq;
  const int kv_blocks = (o.n + o.bk - 1) / o.bk;
  const bool dense = o.blocks <= 0;
  const int width = dense ? kv_blocks : std::min(o.blocks, kv_blocks);
  const int sets = dense ? 1 : o.sets;
  const std::int64_t rows = std::int64_t(q_blocks) * o.heads_kv;  // batch 1, index_scope kv_head

  std::vector<std::int32_t> cu{0, o.n};
  std::vector<std::int32_t> ids(std::size_t(sets) * rows * width, -1), count(std::size_t(sets) * rows);
  std::mt19937 rng(4321);
  double pairs = 0;  // visible (query, key) pairs of the first set, per kv head row
  for (int s = 0; s < sets; ++s)
    for (int i = 0; i < q_blocks; ++i)
      for (int h = 0; h < o.heads_kv; ++h) {
        const std::int64_t r = std::int64_t(i) * o.heads_kv + h;
        // Blocks visible to query block i under bottom-right causality with n_q == n_kv.
        const int q_last = std::min(o.n, (i + 1) * o.bq) - 1;
        const int visible = q_last / o.bk + 1;
        std::int32_t* row = ids.data() + (std::size_t(s) * rows + r) * width;
        const int c = std::min(width, visible);
        if (dense) std::iota(row, row + visible, 0);
        else pick_blocks(rng, visible, c, row);
        count[std::size_t(s) * rows + r] = c;
        if (s == 0) {
          for (int j = 0; j < c; ++j)
            for (int qq = i * o.bq; qq <= q_last; ++qq) {
              const int k0 = row[j] * o.bk, k1 = std::min(o.n, k0 + o.bk);
              pairs += std::max(0, std::min(k1, qq + 1) - k0);
            }
        }
      }
  write_index(o, ids);
  // (count is [sets, rows]; compare.py recomputes counts from the -1 padding.)

  constexpr bool quantized = !std::is_same_v<T, Code>;
  const std::size_t elems = std::size_t(o.n) * o.heads_kv * o.dim;
  device_array<T> q(std::size_t(o.n) * o.heads_q * o.dim), out(std::size_t(o.n) * o.heads_q * o.dim);
  device_array<Code> k(elems), v(elems);
  device_array<float> ks(quantized ? std::size_t(kv_blocks) * o.heads_kv : 1), vs(ks.n);
  fill_random(q, 1);
  if constexpr (quantized) {
    fill_codes(k, 2);
    fill_codes(v, 3);
    const float unit = std::is_same_v<Code, std::int8_t> ? 1.0f / 48.0f : 1.0f / 16.0f;
    fill_scales(ks, unit, 4);
    fill_scales(vs, unit, 5);
  } else {
    fill_random(k, 2);
    fill_random(v, 3);
  }
  const auto source = [&] {
    if constexpr (quantized) {
      return skim::cuda::device_quantized_kv<skim::cuda::device_contiguous_kv<Code>>::per_block(
          kv_of<Code>(o, k.p, v.p, o.n), ks.p, vs.p, kv_blocks, o.heads_kv);
    } else {
      return kv_of<T>(o, k.p, v.p, o.n);
    }
  }();
  device_array<std::int32_t> d_cu(cu.size()), d_ids(ids.size()), d_count(count.size());
  d_cu.upload(cu);
  d_ids.upload(ids);
  d_count.upload(count);
  skim::cuda::device_problem p{.batch = 1, .heads_q = o.heads_q, .heads_kv = o.heads_kv, .head_dim = o.dim,
                               .block_q = o.bq, .block_kv = o.bk, .mask = skim::mask_kind::causal,
                               .cu_seqlens_q = d_cu.p, .cu_seqlens_kv = d_cu.p, .max_seqlen_q = o.n,
                               .max_seqlen_kv = o.n};
  const skim::cuda::prefill exec{.kernel = prefill_kernel_of(o)};
  if (const skim::status s = exec.can_implement(p); !s.ok()) return refuse(o, s.message());
  const std::size_t ws_bytes = exec.workspace_bytes(p);
  device_array<std::byte> ws(ws_bytes);
  using args_t = skim::cuda::device_attention_args<T, std::remove_const_t<decltype(source)>, skim::cuda::device_block_table, T>;
  const auto run = [&](int rep, cudaStream_t stream) {
    const std::size_t s = std::size_t(rep % sets);
    args_t a{.prob = p,
             .q = skim::cuda::device_view<const T>::token_major(q.p, o.heads_q, o.dim),
             .kv = source,
             .index = {.ids = d_ids.p + s * rows * width, .count = d_count.p + s * rows, .width = width, .rows = rows},
             .o = skim::cuda::device_view<T>::token_major(out.p, o.heads_q, o.dim)};
    BENCH_STATUS(exec.run(a, std::span<std::byte>(ws.p, ws_bytes), stream));
  };
  const double ms = time_median(o.reps, run);
  const double flops = 4.0 * pairs * o.dim * (o.heads_q / o.heads_kv);
  std::printf("{\"bench\": \"prefill\", \"impl\": \"skim\", \"n\": %d, \"blocks\": %d, \"ms\": %.5f, \"flops\": %.0f, "
              "\"tflop_per_s\": %.2f, \"kernel\": \"%s\", \"layout\": \"%s\", \"kv\": \"%s\"}\n",
              o.n, dense ? 0 : width, ms, flops, flops / ms * 1e-9, o.kernel.c_str(), o.layout.c_str(), o.kv.c_str());
  return 0;
}


// One whole sparse decode step on the device, captured in a CUDA graph and timed by replays:
// append the newest token's key to its block summary, score every block, select sink + local + top-k
// (16 blocks of bk per kv head by default), and attend over them. K/V of the new token are taken as
// already written (the engine's cache write); replaying an append of the same token is idempotent.
// Paged: K/V (read by the summaries' build, the append and decode) through decode_batch::paged.
// Code != T: 8-bit codes with a scale per (block, kv head) (--kv fp8|int8). TS: the summaries' element
// (K's own type, exact for min/max, or float).
template <class T, class Code = T, class TS = Code, bool Paged = false>
int run_step(const options& o) {
  if (!std::is_same_v<T, Code> && o.share) return refuse(o, "--share with --kv fp8|int8: not built in this runner");
  const int kv_blocks = (o.n + o.bk - 1) / o.bk;
  const decode_batch<T> d(o);
  const skim::cuda::device_problem& p = d.prob;
  const decode_kv<T, Code> codes(o, d);
  const auto kv = [&] {
    if constexpr (std::is_same_v<T, Code>) return d.template source<Paged>(o);
    else return codes.source(o, d);
  }();
  using kv_t = std::remove_const_t<decltype(kv)>;
  const std::size_t records = std::size_t(o.batch) * kv_blocks * o.heads_kv;
  device_array<TS> lo(records * o.dim), hi(lo.n);
  device_array<float> scale(skim::cuda::is_device_code_v<TS> ? records : 0);
  const skim::cuda::device_max_bound<TS> sums{.lo = lo.p, .hi = hi.p, .max_kv_blocks = kv_blocks, .scale = scale.p};
  if (const skim::status s = skim::cuda::build(p, kv, sums, nullptr); !s.ok()) return refuse(o, s.message());

  skim::cuda::decode_router router;
  router.selector.sink = 1;
  router.selector.local = 2;
  router.selector.dynamic.k = std::max(0, o.blocks - 3);
  router.share_heads = o.share != 0;  // one selection per sequence, read by every kv head
  if (const skim::status s = router.can_implement(p); !s.ok()) return refuse(o, s.message());
  const int width = router.width(p);
  const std::int64_t rows = std::int64_t(o.batch) * (o.share ? 1 : o.heads_kv);
  device_array<std::int32_t> ids{std::size_t(rows) * width}, count{std::size_t(rows)};
  const skim::cuda::mutable_device_block_table table{.ids = ids.p, .count = count.p, .width = width, .rows = rows};
  device_array<std::byte> route_ws(router.workspace_bytes(p));

  skim::cuda::decode exec;
  if (o.chunk_blocks > 0) exec.chunk_blocks = o.chunk_blocks;
  exec.kernel = decode_kernel_of(o);
  exec.merge_in_cluster = o.cluster_merge != 0;
  if (const skim::status s = exec.can_implement(p); !s.ok()) return refuse(o, s.message());
  const std::size_t ws_bytes = exec.workspace_bytes(p, width);
  device_array<std::byte> ws(ws_bytes);
  using args_t = skim::cuda::device_attention_args<T, kv_t, skim::cuda::device_block_table, T>;
  const args_t a{.prob = p,
                 .q = d.q_view(o),
                 .kv = kv,
                 .index = table,
                 .o = d.o_view(o)};
  const skim::cuda::decode_route_args<T, TS> ra{.prob = p, .q = a.q, .summaries = sums, .index = table};
  // --fuse-select 1 (not with --share): the router only scores; decode selects each row where it
  // reads it (decode_router::routed) and writes the same table.
  const bool fuse_select = o.fuse_select != 0 && !o.share;
  const std::span<float> scores(reinterpret_cast<float*>(route_ws.p), std::size_t(router.score_floats(p)));
  skim::cuda::device_routed_table routed;
  if (fuse_select) {
    if (const skim::status s = router.routed(p, scores, table, routed); !s.ok()) return refuse(o, s.message());
  }
  const skim::cuda::device_attention_args<T, kv_t, skim::cuda::device_routed_table, T> ar{
      .prob = p, .q = a.q, .kv = kv, .index = routed, .o = a.o};
  const auto attend_status = [&](cudaStream_t st) {
    if constexpr (std::is_same_v<T, Code>) {  // shared selections: 16-bit K/V only (fewer kernels to build)
      using shared_t = skim::cuda::device_head_shared<skim::cuda::device_block_table>;
      const skim::cuda::device_attention_args<T, kv_t, shared_t, T> as{
          .prob = p, .q = a.q, .kv = kv, .index = shared_t{table, p.index_heads()}, .o = a.o};
      if (o.share) return exec.run(as, std::span<std::byte>(ws.p, ws_bytes), st);
    }
    if (fuse_select) return exec.run(ar, std::span<std::byte>(ws.p, ws_bytes), st);
    return exec.run(a, std::span<std::byte>(ws.p, ws_bytes), st);
  };

  cudaStream_t stream;
  BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const std::span<std::byte> route_span(route_ws.p, route_ws.n);
  const auto append_status = [&](cudaStream_t st) {  // its own launch, or nothing: the router appends
    return o.fuse_append ? skim::status::success() : skim::cuda::append_newest(p, kv, sums, st);
  };
  const auto route_status = [&](cudaStream_t st) {
    if (fuse_select) return o.fuse_append ? router.score(ra, kv, scores, st) : router.score(ra, scores, st);
    return o.fuse_append ? router.run(ra, kv, route_span, st) : router.run(ra, route_span, st);
  };
  // One checked step first: a shape a stage rejects is reported as a JSON line, not a crash.
  skim::status checked = append_status(stream);
  if (checked.ok()) checked = route_status(stream);
  if (checked.ok()) checked = attend_status(stream);
  if (!checked.ok()) return refuse(o, checked.message());
  BENCH_CHECK(cudaStreamSynchronize(stream));
  const auto append = [&](cudaStream_t st) { BENCH_STATUS(append_status(st)); };
  const auto route = [&](cudaStream_t st) { BENCH_STATUS(route_status(st)); };
  const auto attend = [&](cudaStream_t st) { BENCH_STATUS(attend_status(st)); };
  const auto step = [&](cudaStream_t st) {
    append(st);
    route(st);
    attend(st);
  };
  cudaGraph_t graph;
  cudaGraphExec_t graph_exec;
  BENCH_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  step(stream);
  BENCH_CHECK(cudaStreamEndCapture(stream, &graph));
  BENCH_CHECK(cudaGraphInstantiate(&graph_exec, graph, 0));

  // Stage times (uncaptured launches, events around each), then the graph.
  cudaEvent_t e[4];
  for (auto& ev : e) BENCH_CHECK(cudaEventCreate(&ev));
  std::vector<float> t_append, t_route, t_attend;
  for (int rep = 0; rep < o.reps + 3; ++rep) {
    BENCH_CHECK(cudaEventRecord(e[0], stream));
    append(stream);
    BENCH_CHECK(cudaEventRecord(e[1], stream));
    route(stream);
    BENCH_CHECK(cudaEventRecord(e[2], stream));
    attend(stream);
    BENCH_CHECK(cudaEventRecord(e[3], stream));
    BENCH_CHECK(cudaEventSynchronize(e[3]));
    if (rep < 3) continue;
    float x;
    BENCH_CHECK(cudaEventElapsedTime(&x, e[0], e[1]));
    t_append.push_back(x);
    BENCH_CHECK(cudaEventElapsedTime(&x, e[1], e[2]));
    t_route.push_back(x);
    BENCH_CHECK(cudaEventElapsedTime(&x, e[2], e[3]));
    t_attend.push_back(x);
  }
  const auto median = [](std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::vector<float> t_graph;
  for (int rep = 0; rep < o.reps + 3; ++rep) {
    BENCH_CHECK(cudaEventRecord(e[0], stream));
    BENCH_CHECK(cudaGraphLaunch(graph_exec, stream));
    BENCH_CHECK(cudaEventRecord(e[1], stream));
    BENCH_CHECK(cudaEventSynchronize(e[1]));
    float x;
    BENCH_CHECK(cudaEventElapsedTime(&x, e[0], e[1]));
    if (rep >= 3) t_graph.push_back(x);
  }
  // The same stages with reps steps back to back in one graph (time_graph: as decode's graph_ms), and
  // the score kernel and the routing alone that way: what a step costs inside an engine's captured
  // forward pass, where no graph launch of its own precedes it.
  const double g_step = time_graph(o.reps, [&](int, cudaStream_t st) { step(st); });
  const double g_route = time_graph(o.reps, [&](int, cudaStream_t st) { append(st), route(st); });
  const double g_score = time_graph(o.reps, [&](int, cudaStream_t st) {
    BENCH_STATUS(o.fuse_append ? router.score(ra, kv, scores, st) : router.score(ra, scores, st));
  });
  std::printf("{\"bench\": \"step\", \"impl\": \"skim\", \"batch\": %d, \"n\": %d, \"blocks\": %d, \"ms\": %.5f, "
              "\"append_ms\": %.5f, \"route_ms\": %.5f, \"attend_ms\": %.5f, \"graph_ms\": %.5f, "
              "\"graph_route_ms\": %.5f, \"graph_score_ms\": %.5f, \"kernel\": \"%s\", "
              "\"layout\": \"%s\", \"fuse_append\": %d, \"chunk_blocks\": %d, \"cluster_merge\": %d, \"share\": %d, \"fuse_select\": %d, "
              "\"kv\": \"%s\", \"summaries\": \"%s\", %s}\n",
              o.batch, o.n, width, median(t_graph), median(t_append), median(t_route), median(t_attend),
              g_step, g_route, g_score, o.kernel.c_str(), o.layout.c_str(), o.fuse_append,
              exec.chunk(p, width, skim::cuda::is_device_code_v<Code>), o.cluster_merge, o.share, fuse_select ? 1 : 0,
              o.kv.c_str(), std::is_same_v<TS, float> ? "float" : o.kv == "same" ? o.dtype.c_str() : o.kv.c_str(),
              shape_fields(o).c_str());
  for (auto& ev : e) cudaEventDestroy(ev);
  cudaGraphExecDestroy(graph_exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace

// One measurement (one JSON line) of o.
int run_one(const options& o) {
  const bool bf16 = o.dtype == "bf16";
  if (!bf16 && o.dtype != "fp16") {
    std::fprintf(stderr, "--dtype %s: bf16 or fp16\n", o.dtype.c_str());
    return 2;
  }
  if (o.layout != "hnd" && o.layout != "nhd") {
    std::fprintf(stderr, "--layout %s: hnd or nhd\n", o.layout.c_str());
    return 2;
  }
  if (o.page < 0) {
    std::fprintf(stderr, "--page %d: 0 (contiguous K/V) or a page size\n", o.page);
    return 2;
  }
  if (o.page > 0 && o.mode != "decode" && o.mode != "step") return refuse(o, "--page: decode and step only");
  if (o.mode == "prefill") {
    if (o.kernel != "mma" && o.kernel != "wgmma" && o.kernel != "auto") {
      std::fprintf(stderr, "--kernel %s: mma, wgmma or auto for prefill\n", o.kernel.c_str());
      return 2;
    }
    if (o.kv == "fp8") return bf16 ? run_prefill<skim::bfloat16, skim::fp8_e4m3>(o) : run_prefill<skim::half, skim::fp8_e4m3>(o);
    if (o.kv == "int8") return bf16 ? run_prefill<skim::bfloat16, std::int8_t>(o) : run_prefill<skim::half, std::int8_t>(o);
    if (o.kv != "same") {
      std::fprintf(stderr, "--kv %s: same, fp8 or int8\n", o.kv.c_str());
      return 2;
    }
    return bf16 ? run_prefill<skim::bfloat16>(o) : run_prefill<skim::half>(o);
  }
  if (o.kernel != "simt" && o.kernel != "mma" && o.kernel != "auto") {
    std::fprintf(stderr, "--kernel %s: simt, mma or auto\n", o.kernel.c_str());
    return 2;
  }
  if (o.page > 0 && o.kv != "same") return refuse(o, "--page with --kv fp8|int8: quantised paged K/V not built in this runner");
  if (o.mode == "decode" && o.page > 0) return bf16 ? run_decode<skim::bfloat16, skim::bfloat16, true>(o) : run_decode<skim::half, skim::half, true>(o);
  if (o.mode == "step" && o.page > 0) {
    return bf16 ? run_step<skim::bfloat16, skim::bfloat16, skim::bfloat16, true>(o)
                : run_step<skim::half, skim::half, skim::half, true>(o);
  }
  if (o.mode == "decode") {
    if (o.kv == "fp8") return bf16 ? run_decode<skim::bfloat16, skim::fp8_e4m3>(o) : run_decode<skim::half, skim::fp8_e4m3>(o);
    if (o.kv == "int8") return bf16 ? run_decode<skim::bfloat16, std::int8_t>(o) : run_decode<skim::half, std::int8_t>(o);
    if (o.kv != "same") {
      std::fprintf(stderr, "--kv %s: same, fp8 or int8\n", o.kv.c_str());
      return 2;
    }
    return bf16 ? run_decode<skim::bfloat16>(o) : run_decode<skim::half>(o);
  }
  if (o.mode == "step") {
    if (o.summaries != "kv" && o.summaries != "float") {
      std::fprintf(stderr, "--summaries %s: kv or float\n", o.summaries.c_str());
      return 2;
    }
    // Fewer variants than decode's (each builds its own decode kernels): codes under bf16 Q, float
    // summaries over codes only.
    const bool f = o.summaries == "float";
    if (o.kv == "fp8" || o.kv == "int8") {
      if (!bf16) return refuse(o, "step over --kv fp8|int8: --dtype bf16 only in this runner");
      if (o.kv == "fp8") return f ? run_step<skim::bfloat16, skim::fp8_e4m3, float>(o) : run_step<skim::bfloat16, skim::fp8_e4m3>(o);
      return f ? run_step<skim::bfloat16, std::int8_t, float>(o) : run_step<skim::bfloat16, std::int8_t>(o);
    }
    if (o.kv != "same") {
      std::fprintf(stderr, "--kv %s: same, fp8 or int8\n", o.kv.c_str());
      return 2;
    }
    if (f) return refuse(o, "--summaries float: over --kv fp8|int8 only in this runner");
    return bf16 ? run_step<skim::bfloat16>(o) : run_step<skim::half>(o);
  }
  std::fprintf(stderr, "unknown mode %s\n", o.mode.c_str());
  return 2;
}

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  if (o.pages.empty()) return run_one(o);
  // --pages P1,P2,...: one measurement per page size (0: contiguous) in this process, a line each.
  int rc = 0;
  for (std::size_t at = 0; at <= o.pages.size();) {
    const std::size_t end = std::min(o.pages.find(',', at), o.pages.size());
    options one = o;
    one.page = std::atoi(o.pages.substr(at, end - at).c_str());
    rc = std::max(rc, run_one(one));
    std::fflush(stdout);
    at = end + 1;
  }
  return rc;
}
