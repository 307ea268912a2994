// CUDA graphs replayed over bad device content. skim's CUDA executors read sequence lengths, page
// tables and indices from device memory, so an engine captures a step once and rewrites that memory
// between replays; the kernels must not trust it (core/cuda/common.cuh, docs/cuda.md). Each test
// captures one graph on valid content, replays it and checks it against exec::reference and a call
// outside the graph (bit for bit); then, without capturing again, writes bad content into the same
// device buffers and replays:
//   block ids past the sequence's blocks (into the next sequence), INT_MAX, negative ids (-7,
//   INT_MIN, and the padding value -1 inside the count), repeated and descending ids, counts past
//   the width and negative, kv lengths past max_seqlen_kv, cu_seqlens_kv / cu_seqlens_q decreasing,
//   query lengths past max_seqlen_q, page ids outside the pool, a page list one page short;
//   and, as benign content, garbage in the padding slots past each row's count.
// After each replay: the error word is exactly the documented bits; rows whose input did not change
// are bit-identical to the valid replay; changed rows are what the docs promise (the bad id or key
// skipped, an empty row o = 0 / lse = -inf, a malformed sequence's rows not written); no output past
// the last token is written. K/V outside every sequence is NaN: tokens before and after the K/V
// arrays, sequences without queries between the attended ones, spare pages and page tails, so a
// read outside a sequence turns its rows NaN. Then the valid content again: the original bits.
//
// Run only these: skim_cuda_tests -tc='graph replay*'   (the sanitizers run the "*small*" ones)
#include "cuda/support.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "skim/exec/cpu/reference.hpp"
#include "skim/index/block_csr.hpp"

namespace {

using namespace skim;
using namespace skim::test;
namespace sc = skim::cuda;
namespace tc = skim::test::cuda;
using T = skim::half;  // Q, K, V; O and lse are float

constexpr std::int32_t int_max = std::numeric_limits<std::int32_t>::max();
constexpr std::int32_t int_min = std::numeric_limits<std::int32_t>::min();
constexpr std::uint32_t unwritten_bits = 0xffffffffu;  // O and lse are 0xff-filled before each replay

[[nodiscard]] std::string hex(std::uint32_t x) {
  std::ostringstream s;
  s << "0x" << std::hex << x;
  return s.str();
}

// ---------------------------------------------------------------------------------------------
// A batch laid out for isolation checks

// What the graph reads from device memory besides Q and K/V: the host writes it between replays.
struct content {
  std::vector<std::int32_t> cu_q, cu_kv, ids, count, page_indptr, page_indices;
};

// A batch whose sequences with no query (q == 0) hold only NaN keys and values: they sit before,
// between and after the attended sequences, so an address past a sequence's own tokens reads NaN.
// The contiguous K/V also has `guard` NaN tokens before its first and after its last token; pages
// not owned by an attended sequence (spare pages, the poison sequences' pages) and the tails of the
// last pages are NaN. Index rows are numbered as skim::problem numbers them (sequences with a query).
struct scene {
  static constexpr std::int32_t guard = 16;

  std::int32_t heads_q = 0, heads_kv = 0, head_dim = 0, block_q = 0, block_kv = 0, max_q = 0, max_kv = 0,
               page_size = 0;
  std::vector<sequence_lengths> seqs;
  std::vector<std::vector<std::int32_t>> rows;  // the valid index rows
  std::int32_t width = 0, num_pages = 0, tokens_q = 0, tokens_kv = 0;
  content good;
  std::vector<float> q, k, v;      // values (rounded to T): q [tokens_q, heads_q, d], k/v [tokens_kv, heads_kv, d]
  std::vector<T> q16, k16, v16;    // Q; K/V with the guard tokens, token-major
  std::vector<T> kp16, vp16;       // pages [num_pages, page_size, heads_kv, d]

  scene(std::int32_t hq, std::int32_t hkv, std::int32_t d, std::int32_t bq, std::int32_t bk, std::int32_t mq,
        std::int32_t mkv, std::int32_t ps, std::vector<sequence_lengths> s, std::vector<std::vector<std::int32_t>> r,
        std::int32_t pad, std::uint32_t seed)
      : heads_q(hq), heads_kv(hkv), head_dim(d), block_q(bq), block_kv(bk), max_q(mq), max_kv(mkv), page_size(ps),
        seqs(std::move(s)), rows(std::move(r)) {
    std::mt19937 rng(seed);
    good.cu_q = {0};
    good.cu_kv = {0};
    for (const auto& l : seqs) {
      good.cu_q.push_back(good.cu_q.back() + l.q);
      good.cu_kv.push_back(good.cu_kv.back() + l.kv);
    }
    tokens_q = good.cu_q.back();
    tokens_kv = good.cu_kv.back();
    for (const auto& row : rows) width = std::max(width, static_cast<std::int32_t>(row.size()));
    width += pad;
    for (const auto& row : rows) {
      good.count.push_back(static_cast<std::int32_t>(row.size()));
      for (std::int32_t j = 0; j < width; ++j) {
        good.ids.push_back(j < static_cast<std::int32_t>(row.size()) ? row[j] : index::block_table::pad);
      }
    }
    const std::size_t dd = static_cast<std::size_t>(d);
    const std::size_t kv_row = static_cast<std::size_t>(hkv) * dd;  // elements of one token
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const auto value = [&] { return to_float(from_float<T>(normal(rng))); };
    const float nan = std::numeric_limits<float>::quiet_NaN();
    q.resize(static_cast<std::size_t>(tokens_q) * hq * dd);
    for (float& x : q) x = value();
    k.assign(static_cast<std::size_t>(tokens_kv) * kv_row, nan);
    v.assign(k.size(), nan);
    for (std::size_t b = 0; b < seqs.size(); ++b) {
      if (seqs[b].q == 0) continue;  // a poison sequence
      for (std::size_t x = good.cu_kv[b] * kv_row; x < good.cu_kv[b + 1] * kv_row; ++x) {
        k[x] = value();
        v[x] = value();
      }
    }
    const auto rounded = [](const std::vector<float>& x) {
      std::vector<T> y(x.size());
      std::transform(x.begin(), x.end(), y.begin(), [](float f) { return from_float<T>(f); });
      return y;
    };
    q16 = rounded(q);
    const std::vector<T> guard_tokens(guard * kv_row, from_float<T>(nan));
    for (auto [dst, src] : {std::pair{&k16, &k}, std::pair{&v16, &v}}) {
      *dst = guard_tokens;
      const std::vector<T> body = rounded(*src);
      dst->insert(dst->end(), body.begin(), body.end());
      dst->insert(dst->end(), guard_tokens.begin(), guard_tokens.end());
    }
    // Pages: every sequence's, poison ones included, and 3 spare, at shuffled slots; all NaN but the
    // attended sequences' tokens.
    std::int32_t needed = 0;
    for (const auto& l : seqs) needed += (l.kv + ps - 1) / ps;
    num_pages = needed + 3;
    std::vector<std::int32_t> slots(static_cast<std::size_t>(num_pages));
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
    const std::size_t page_elems = static_cast<std::size_t>(ps) * kv_row;
    kp16.assign(static_cast<std::size_t>(num_pages) * page_elems, from_float<T>(nan));
    vp16.assign(kp16.size(), from_float<T>(nan));
    good.page_indptr = {0};
    std::size_t next = 0;
    for (std::size_t b = 0; b < seqs.size(); ++b) {
      const std::int32_t pages = (seqs[b].kv + ps - 1) / ps;
      for (std::int32_t pg = 0; pg < pages; ++pg) good.page_indices.push_back(slots[next++]);
      good.page_indptr.push_back(static_cast<std::int32_t>(good.page_indices.size()));
      if (seqs[b].q == 0) continue;
      for (std::int32_t t = 0; t < seqs[b].kv; ++t) {
        const std::size_t page = static_cast<std::size_t>(good.page_indices[good.page_indptr[b] + t / ps]);
        const std::size_t dst = page * page_elems + static_cast<std::size_t>(t % ps) * kv_row;
        const std::size_t src = static_cast<std::size_t>(good.cu_kv[b] + t) * kv_row;
        for (std::size_t e = 0; e < kv_row; ++e) {
          kp16[dst + e] = from_float<T>(k[src + e]);
          vp16[dst + e] = from_float<T>(v[src + e]);
        }
      }
    }
    if (good.page_indices.empty()) good.page_indices.push_back(0);  // never read; keeps the buffer non-empty
  }

  [[nodiscard]] std::int32_t batch() const { return static_cast<std::int32_t>(seqs.size()); }
  [[nodiscard]] std::int32_t group() const { return heads_q / heads_kv; }
  [[nodiscard]] std::int32_t index_heads() const { return heads_kv; }  // index_scope::kv_head
  // The first index row of sequence b over the valid lengths, divided by index_heads.
  [[nodiscard]] std::int64_t q_block_offset(std::int32_t b) const {
    std::int64_t n = 0;
    for (std::int32_t s = 0; s < b; ++s) n += (seqs[s].q + block_q - 1) / block_q;
    return n;
  }
  [[nodiscard]] problem prob() const {
    return problem{.heads_q = heads_q, .heads_kv = heads_kv, .head_dim = head_dim, .block_q = block_q,
                   .block_kv = block_kv, .mask = mask_kind::causal, .softmax_scale = 0.0f,
                   .cu_seqlens_q = good.cu_q, .cu_seqlens_kv = good.cu_kv, .scope = index_scope::kv_head};
  }
};

// The scene's buffers on the device. Content buffers keep their sizes: bad content rewrites values.
struct device_scene {
  tc::buffer<std::int32_t> cu_q, cu_kv, ids, count, page_indptr, page_indices;
  tc::buffer<T> q, k, v, k_pages, v_pages;
  tc::buffer<float> o, lse;  // one token more than the batch's: written by nothing
  tc::buffer<std::uint32_t> error;

  explicit device_scene(const scene& s)
      : cu_q(s.good.cu_q), cu_kv(s.good.cu_kv), ids(std::max<std::size_t>(s.good.ids.size(), 1)),
        count(std::max<std::size_t>(s.good.count.size(), 1)), page_indptr(s.good.page_indptr),
        page_indices(s.good.page_indices), q(s.q16), k(s.k16), v(s.v16), k_pages(s.kp16), v_pages(s.vp16),
        o(static_cast<std::size_t>(s.tokens_q + 1) * s.heads_q * s.head_dim),
        lse(static_cast<std::size_t>(s.tokens_q + 1) * s.heads_q), error(1) {
    SKIM_CUDA_REQUIRE(cudaMemset(error.data(), 0, sizeof(std::uint32_t)));
  }

  [[nodiscard]] sc::device_problem prob(const scene& s) const {
    return {.batch = s.batch(), .heads_q = s.heads_q, .heads_kv = s.heads_kv, .head_dim = s.head_dim,
            .block_q = s.block_q, .block_kv = s.block_kv, .mask = mask_kind::causal, .softmax_scale = 0.0f,
            .scope = index_scope::kv_head, .cu_seqlens_q = cu_q.data(), .cu_seqlens_kv = cu_kv.data(),
            .max_seqlen_q = s.max_q, .max_seqlen_kv = s.max_kv, .error = error.data()};
  }
  [[nodiscard]] sc::device_contiguous_kv<T> contiguous(const scene& s) const {
    const std::int64_t ts = static_cast<std::int64_t>(s.heads_kv) * s.head_dim;
    return {.k = k.data() + scene::guard * ts, .v = v.data() + scene::guard * ts, .token_stride = ts,
            .head_stride = s.head_dim};
  }
  [[nodiscard]] sc::device_paged_kv<T> paged(const scene& s) const {
    const std::int64_t ts = static_cast<std::int64_t>(s.heads_kv) * s.head_dim;
    return {.k_pages = k_pages.data(), .v_pages = v_pages.data(), .num_pages = s.num_pages,
            .page_size = s.page_size, .page_stride = ts * s.page_size, .token_stride = ts,
            .head_stride = s.head_dim, .page_indptr = page_indptr.data(), .page_indices = page_indices.data()};
  }
  [[nodiscard]] sc::device_block_table table(const scene& s) const {
    return {.ids = ids.data(), .count = count.data(), .width = s.width,
            .rows = static_cast<std::int64_t>(s.rows.size())};
  }
  [[nodiscard]] sc::device_view<const T> q_view(const scene& s) const {
    return sc::device_view<const T>::token_major(q.data(), s.heads_q, s.head_dim);
  }
  [[nodiscard]] sc::device_view<float> o_view(const scene& s) const {
    return sc::device_view<float>::token_major(o.data(), s.heads_q, s.head_dim);
  }

  // Writes c into the content buffers, poisons O and lse, clears the error word: all on `stream`.
  void prepare(const content& c, cudaStream_t stream) {
    const auto put = [&](tc::buffer<std::int32_t>& b, const std::vector<std::int32_t>& x) {
      REQUIRE(x.size() <= b.size());
      if (!x.empty()) {
        SKIM_CUDA_REQUIRE(cudaMemcpyAsync(b.data(), x.data(), x.size() * sizeof(std::int32_t),
                                          cudaMemcpyHostToDevice, stream));
      }
    };
    put(cu_q, c.cu_q);
    put(cu_kv, c.cu_kv);
    put(ids, c.ids);
    put(count, c.count);
    put(page_indptr, c.page_indptr);
    put(page_indices, c.page_indices);
    SKIM_CUDA_REQUIRE(cudaMemsetAsync(o.data(), 0xff, o.size() * sizeof(float), stream));
    SKIM_CUDA_REQUIRE(cudaMemsetAsync(lse.data(), 0xff, lse.size() * sizeof(float), stream));
    SKIM_CUDA_REQUIRE(cudaMemsetAsync(error.data(), 0, sizeof(std::uint32_t), stream));
  }
};

struct result {
  std::vector<float> o, lse;
  std::uint32_t error = 0;
};

// Writes c, then enqueue(stream) (a graph launch or a direct call), then reads O, lse and the error word.
template <class F>
result run_on(device_scene& ds, const content& c, cudaStream_t stream, F&& enqueue) {
  ds.prepare(c, stream);
  enqueue(stream);
  SKIM_CUDA_REQUIRE(cudaStreamSynchronize(stream));
  result r;
  r.o = ds.o.download();
  r.lse = ds.lse.download();
  SKIM_CUDA_REQUIRE(cudaMemcpy(&r.error, ds.error.data(), sizeof r.error, cudaMemcpyDeviceToHost));
  return r;
}

// One captured graph, destroyed with the object.
struct graph {
  cudaGraphExec_t exec = nullptr;
  graph() = default;
  graph(const graph&) = delete;
  graph& operator=(const graph&) = delete;
  ~graph() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
  }
  // Captures what enqueue(stream) enqueues (it returns the executor's status).
  template <class F>
  void capture(cudaStream_t stream, F&& enqueue) {
    cudaGraph_t g = nullptr;
    SKIM_CUDA_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const status st = enqueue(stream);
    const cudaError_t end = cudaStreamEndCapture(stream, &g);
    INFO("captured run: " << st.message());
    REQUIRE(st.ok());
    SKIM_CUDA_REQUIRE(end);
    SKIM_CUDA_REQUIRE(cudaGraphInstantiate(&exec, g, 0));
    SKIM_CUDA_REQUIRE(cudaGraphDestroy(g));
  }
  void launch(cudaStream_t stream) const { SKIM_CUDA_REQUIRE(cudaGraphLaunch(exec, stream)); }
};

struct stream_owner {
  cudaStream_t s = nullptr;
  stream_owner() { SKIM_CUDA_REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  stream_owner(const stream_owner&) = delete;
  stream_owner& operator=(const stream_owner&) = delete;
  ~stream_owner() {
    if (s != nullptr) cudaStreamDestroy(s);
  }
};

// ---------------------------------------------------------------------------------------------
// What a replay must give

// Per sequence: the ids each of its index rows attends (after the skips), which keys may be read,
// which sequences' rows must not be written.
struct expectation {
  std::vector<std::vector<std::int32_t>> rows;  // attended ids of each index row
  std::vector<std::int64_t> row_base;           // per sequence: its first index row / index_heads
  std::function<bool(std::int32_t b, std::int32_t t)> key_ok;  // null: every key of the sequence
  std::vector<std::int32_t> unwritten;   // sequences whose lengths are bad: O and lse keep 0xff
  std::vector<std::int32_t> touched;     // sequences whose rows may differ from the valid replay

  [[nodiscard]] static bool has(const std::vector<std::int32_t>& v, std::int32_t b) {
    return std::find(v.begin(), v.end(), b) != v.end();
  }
};

[[nodiscard]] expectation valid_expectation(const scene& s) {
  expectation e;
  e.rows = s.rows;
  for (std::int32_t b = 0; b < s.batch(); ++b) e.row_base.push_back(s.q_block_offset(b));
  return e;
}

// The double-precision attention of query qi of sequence b, head h, over the keys of `blocks` it
// sees (bottom-right causal) that key_ok accepts: o (head_dim) and lse (-inf, o = 0 when none).
void reference_row(const scene& s, std::int32_t b, std::int32_t qi, std::int32_t h, const std::vector<std::int32_t>& blocks,
                   const std::function<bool(std::int32_t, std::int32_t)>& key_ok, std::vector<double>& o, double& lse) {
  const std::int32_t d = s.head_dim, q_len = s.seqs[b].q, kv_len = s.seqs[b].kv, kh = h / s.group();
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const float* qr = &s.q[(static_cast<std::size_t>(s.good.cu_q[b] + qi) * s.heads_q + h) * d];
  std::vector<std::pair<double, std::size_t>> keys;  // (score, element offset of the key's row)
  for (const std::int32_t id : blocks) {
    for (std::int32_t j = id * s.block_kv; j < (id + 1) * s.block_kv && j < kv_len; ++j) {
      if (j > qi + kv_len - q_len) continue;  // causal
      if (key_ok && !key_ok(b, j)) continue;
      const std::size_t off = (static_cast<std::size_t>(s.good.cu_kv[b] + j) * s.heads_kv + kh) * d;
      double dot = 0.0;
      for (std::int32_t e = 0; e < d; ++e) dot += static_cast<double>(qr[e]) * s.k[off + e];
      keys.emplace_back(dot * scale, off);
    }
  }
  o.assign(d, 0.0);
  if (keys.empty()) {
    lse = -INFINITY;
    return;
  }
  double m = -INFINITY;
  for (const auto& [x, off] : keys) m = std::max(m, x);
  double l = 0.0;
  for (const auto& [x, off] : keys) {
    const double p = std::exp(x - m);
    l += p;
    for (std::int32_t e = 0; e < d; ++e) o[e] += p * s.v[off + e];
  }
  for (double& x : o) x /= l;
  lse = m + std::log(l);
}

// Checks a replay's O and lse against e; `valid` is the replay of the valid content (rows of
// untouched sequences must equal it bit for bit; null: no such check). Failures name the case,
// sequence, token and head (the first few of them).
void check_rows(const scene& s, const expectation& e, const result& g, const result* valid, double tol,
                const std::string& what) {
  const std::int32_t d = s.head_dim;
  const double floor = 0.05 * std::sqrt(static_cast<double>(d));
  std::int64_t failures = 0;
  std::string first;
  const auto fail = [&](std::int32_t b, std::int32_t t, std::int32_t h, const std::string& why) {
    if (failures++ < 4) {
      first += "\n  sequence " + std::to_string(b) + " token " + std::to_string(t) + " head " + std::to_string(h) + ": " + why;
    }
  };
  const auto bits = [](float x) {
    std::uint32_t u = 0;
    std::memcpy(&u, &x, sizeof u);
    return u;
  };
  std::vector<double> ro;
  double rl = 0.0;
  for (std::int32_t b = 0; b < s.batch(); ++b) {
    for (std::int32_t qi = 0; qi < s.seqs[b].q; ++qi) {
      const std::int32_t t = s.good.cu_q[b] + qi;
      for (std::int32_t h = 0; h < s.heads_q; ++h) {
        const std::size_t row = static_cast<std::size_t>(t) * s.heads_q + h;
        const float* go = &g.o[row * d];
        const float gl = g.lse[row];
        if (expectation::has(e.unwritten, b)) {
          bool untouched = bits(gl) == unwritten_bits;
          for (std::int32_t x = 0; x < d; ++x) untouched = untouched && bits(go[x]) == unwritten_bits;
          if (!untouched) fail(b, t, h, "a sequence with bad lengths had its O or lse written");
          continue;
        }
        if (valid != nullptr && !expectation::has(e.touched, b)) {
          if (std::memcmp(go, &valid->o[row * d], d * sizeof(float)) != 0 || bits(gl) != bits(valid->lse[row])) {
            fail(b, t, h, "a row whose input did not change differs from the valid replay");
          }
          continue;
        }
        const std::int64_t index_row = (e.row_base[b] + qi / s.block_q) * s.index_heads() + h / s.group();
        const std::vector<std::int32_t> none;
        const auto& ids = index_row < static_cast<std::int64_t>(e.rows.size()) ? e.rows[index_row] : none;
        reference_row(s, b, qi, h, ids, e.key_ok, ro, rl);
        double err = 0.0, norm = 0.0;
        bool zero = true;
        for (std::int32_t x = 0; x < d; ++x) {
          err += (go[x] - ro[x]) * (go[x] - ro[x]);
          norm += ro[x] * ro[x];
          zero = zero && go[x] == 0.0f;
        }
        std::string why;
        if (rl == -INFINITY) {
          if (!zero) why = "row with no key to attend has o not 0 (or NaN)";
          else if (!(gl == -INFINITY)) why = "row with no key to attend has lse " + std::to_string(gl);
        } else {
          const double rel = std::sqrt(err) / std::max(std::sqrt(norm), floor);
          if (!(rel <= tol)) why = "relative error of o " + std::to_string(rel) + " > " + std::to_string(tol);
          else if (!(std::abs(gl - rl) <= 1e-3 * std::max(1.0, std::abs(rl))))
            why = "lse " + std::to_string(gl) + " vs " + std::to_string(rl);
        }
        if (!why.empty()) fail(b, t, h, why);
      }
    }
  }
  // Nothing is written past the batch's last token.
  bool guard_ok = true;
  for (std::size_t x = static_cast<std::size_t>(s.tokens_q) * s.heads_q * d; x < g.o.size(); ++x)
    guard_ok = guard_ok && bits(g.o[x]) == unwritten_bits;
  for (std::size_t x = static_cast<std::size_t>(s.tokens_q) * s.heads_q; x < g.lse.size(); ++x)
    guard_ok = guard_ok && bits(g.lse[x]) == unwritten_bits;
  if (!guard_ok) fail(-1, s.tokens_q, -1, "O or lse written past the last token");
  INFO(what << ": failures " << failures << first);
  CHECK(failures == 0);
}

// exec::reference over the valid content (the scene's values, a CSR of its rows): O [tokens_q,
// heads_q, d] and lse.
void exec_reference(const scene& s, std::vector<float>& o, std::vector<float>& lse) {
  std::vector<std::int32_t> row_ptr{0}, col_idx;
  for (const auto& r : s.rows) {
    col_idx.insert(col_idx.end(), r.begin(), r.end());
    row_ptr.push_back(static_cast<std::int32_t>(col_idx.size()));
  }
  o.assign(static_cast<std::size_t>(s.tokens_q) * s.heads_q * s.head_dim, std::numeric_limits<float>::quiet_NaN());
  lse.assign(static_cast<std::size_t>(s.tokens_q) * s.heads_q, std::numeric_limits<float>::quiet_NaN());
  const contiguous_kv<T> kv{
      .k = strided_view<const T>::token_major(s.k16.data() + scene::guard * s.heads_kv * s.head_dim, s.tokens_kv,
                                              s.heads_kv, s.head_dim),
      .v = strided_view<const T>::token_major(s.v16.data() + scene::guard * s.heads_kv * s.head_dim, s.tokens_kv,
                                              s.heads_kv, s.head_dim),
      .cu_seqlens_kv = {}};
  const attention_args<T, contiguous_kv<T>, index::block_csr, float> ra{
      .prob = s.prob(),
      .q = strided_view<const T>::token_major(s.q16.data(), s.tokens_q, s.heads_q, s.head_dim),
      .kv = kv,
      .index = index::block_csr{row_ptr, col_idx},
      .o = strided_view<float>::token_major(o.data(), s.tokens_q, s.heads_q, s.head_dim),
      .lse = lse};
  const status st = exec::reference{}.run(ra, {});
  INFO("reference: " << st.message());
  REQUIRE(st.ok());
}

// The valid replay against exec::reference (and this file's reference against it, so that the bad
// content's expectations stand on the same ground).
void check_valid(const scene& s, const result& g, double tol, const std::string& what) {
  std::vector<float> o, lse;
  exec_reference(s, o, lse);
  result ref;
  ref.o = o;
  ref.lse = lse;
  ref.o.resize(g.o.size(), std::numeric_limits<float>::quiet_NaN());
  ref.lse.resize(g.lse.size(), std::numeric_limits<float>::quiet_NaN());
  std::fill(ref.o.begin() + static_cast<std::ptrdiff_t>(o.size()), ref.o.end(), [] {
    float f;
    std::memcpy(&f, &unwritten_bits, sizeof f);
    return f;
  }());
  std::fill(ref.lse.begin() + static_cast<std::ptrdiff_t>(lse.size()), ref.lse.end(), ref.o.back());
  check_rows(s, valid_expectation(s), ref, nullptr, 1e-5, what + " (exec::reference against this file's reference)");
  check_rows(s, valid_expectation(s), g, nullptr, tol, what + " (valid content against the reference)");
  CHECK(g.error == 0u);
}

// ---------------------------------------------------------------------------------------------
// Bad content

struct bad_case {
  std::string name;
  std::uint32_t bits = 0;  // the exact error word
  bool paged_only = false;
  std::function<void(content&)> write;      // from the valid content
  std::function<void(expectation&)> expect; // from the valid expectation
};

// Row r of c's table as `ids` (padding -1 after them) with count `n` (default: ids.size()).
// Row r of the table holds `ids` (the rest of the width -1) and count n (no n: the ids' count).
void set_row(const scene& s, content& c, std::int32_t r, const std::vector<std::int32_t>& ids,
             std::optional<std::int32_t> n = std::nullopt) {
  REQUIRE(static_cast<std::int32_t>(ids.size()) <= s.width);
  for (std::int32_t j = 0; j < s.width; ++j) {
    c.ids[static_cast<std::size_t>(r) * s.width + j] = j < static_cast<std::int32_t>(ids.size()) ? ids[j] : -1;
  }
  c.count[r] = n.value_or(static_cast<std::int32_t>(ids.size()));
}

// Replays every case over g (captured on the valid content) and checks it; the valid content after
// each must give `valid` back bit for bit.
template <class Launch>
void replay_cases(const scene& s, device_scene& ds, cudaStream_t stream, Launch&& launch, bool paged,
                  const std::vector<bad_case>& cases, const result& valid, double tol, const std::string& variant) {
  for (const bad_case& bc : cases) {
    if (bc.paged_only && !paged) continue;
    const std::string what = variant + ", " + bc.name;
    content c = s.good;
    bc.write(c);
    expectation e = valid_expectation(s);
    if (bc.expect) bc.expect(e);
    const result g = run_on(ds, c, stream, launch);
    CHECK_MESSAGE(g.error == bc.bits, what << ": error word " << hex(g.error) << ", expected " << hex(bc.bits));
    check_rows(s, e, g, &valid, tol, what);
    if (bc.bits == 0) {  // benign content: the valid bits
      CHECK_MESSAGE(std::memcmp(g.o.data(), valid.o.data(), valid.o.size() * sizeof(float)) == 0,
                    what << ": O differs from the valid replay");
    }
    const result back = run_on(ds, s.good, stream, launch);
    CHECK_MESSAGE(back.error == 0u, what << ", then valid content: error word " << hex(back.error));
    const bool same = std::memcmp(back.o.data(), valid.o.data(), valid.o.size() * sizeof(float)) == 0 &&
                      std::memcmp(back.lse.data(), valid.lse.data(), valid.lse.size() * sizeof(float)) == 0;
    CHECK_MESSAGE(same, what << ", then valid content: O / lse not bit-identical to the first valid replay");
  }
}

// Bad lengths shared by every executor: sequence `longest` gets a kv length past max_kv (its end
// moves up, shrinking the poison sequence after it), sequence `shrunk`'s kv end goes below its start,
// sequence `q_seq`'s query count goes past max_q (the poison sequence after it goes negative).
void add_length_cases(const scene& s, std::vector<bad_case>& cases, std::int32_t longest, std::int32_t shrunk,
                      std::int32_t q_seq) {
  const std::int32_t past = s.max_kv + 1 - s.seqs[longest].kv;
  cases.push_back({"kv length " + std::to_string(s.max_kv + 1) + " > max_seqlen_kv " + std::to_string(s.max_kv) +
                       " (sequence " + std::to_string(longest) + ")",
                   sc::bad_seqlen, false, [=](content& c) { c.cu_kv[longest + 1] += past; },
                   [=](expectation& e) { e.unwritten = e.touched = {longest}; }});
  cases.push_back({"cu_seqlens_kv decreasing (sequence " + std::to_string(shrunk) + " of length -1)", sc::bad_seqlen,
                   false, [=](content& c) { c.cu_kv[shrunk + 1] = c.cu_kv[shrunk] - 1; },
                   [=](expectation& e) { e.unwritten = e.touched = {shrunk}; }});
  cases.push_back({"query length past max_seqlen_q (sequence " + std::to_string(q_seq) + ")", sc::bad_seqlen, false,
                   [=, mq = s.max_q](content& c) { c.cu_q[q_seq + 1] = c.cu_q[q_seq] + mq + 1; },
                   [=](expectation& e) { e.unwritten = e.touched = {q_seq}; }});
}

// Bad page tables for sequence b: its page `slot` (keys [slot·page_size, +page_size)) set to -1,
// num_pages, INT_MAX; and its list one page short (its last page's keys). The keys are skipped.
void add_page_cases(const scene& s, std::vector<bad_case>& cases, std::int32_t b, std::int32_t slot) {
  const std::int32_t ps = s.page_size;
  for (const std::int32_t bad : {-1, s.num_pages, int_max}) {
    cases.push_back({"page id " + std::to_string(bad) + " outside [0, " + std::to_string(s.num_pages) +
                         ") (sequence " + std::to_string(b) + ", page " + std::to_string(slot) + ")",
                     sc::bad_page, true, [=](content& c) { c.page_indices[c.page_indptr[b] + slot] = bad; },
                     [=](expectation& e) {
                       e.touched = {b};
                       e.key_ok = [=](std::int32_t sb, std::int32_t t) { return sb != b || t / ps != slot; };
                     }});
  }
  const std::int32_t last = (s.seqs[b].kv + ps - 1) / ps - 1;
  cases.push_back({"page list of sequence " + std::to_string(b) + " one page short", sc::bad_page, true,
                   [=](content& c) { c.page_indptr[b + 1] -= 1; },
                   [=](expectation& e) {
                     e.touched = {b};
                     e.key_ok = [=](std::int32_t sb, std::int32_t t) { return sb != b || t / ps != last; };
                   }});
}

// Benign: every slot past its row's count holds garbage (never read as an id).
bad_case garbage_padding(const scene& s) {
  return {"garbage in the padding slots past each count (never read)", 0u, false,
          [&s](content& c) {
            const std::int32_t junk[] = {int_max, -5, 1000, int_min};
            for (std::size_t r = 0; r < s.rows.size(); ++r) {
              for (std::int32_t j = c.count[r]; j < s.width; ++j) c.ids[r * s.width + j] = junk[(r + j) % 4];
            }
          },
          nullptr};
}

// ---------------------------------------------------------------------------------------------
// Decode: sequences (q, kv) 0x8, 1x70, 0x16, 1x33, 0x20, 1x0, 1x5, 0x16 (q 0: poison), heads 8/2,
// d 64, block_kv 16, max_seqlen_kv 80, pages of 8 keys. Index rows (kv-head scope, two per attended
// sequence): sequence 1 (5 blocks) rows 0, 1; sequence 3 (3 blocks) rows 2, 3; sequence 5 (no key)
// rows 4, 5; sequence 6 (1 block) rows 6, 7.

scene decode_scene(std::int32_t block_kv = 16, std::uint32_t seed = 11) {
  std::vector<std::vector<std::int32_t>> rows = {{0, 2, 4}, {1, 3, 4}, {0, 1, 2}, {2}, {}, {}, {0}, {}};
  if (block_kv != 16) rows.assign(8, {});  // the routed step writes its own table
  return scene(8, 2, 64, 1, block_kv, 1, 80, 8, {{0, 8}, {1, 70}, {0, 16}, {1, 33}, {0, 20}, {1, 0}, {1, 5}, {0, 16}},
               rows, 2, seed);
}

std::vector<bad_case> decode_cases(const scene& s, bool paged_cases) {
  std::vector<bad_case> v;
  const auto row_case = [&](std::string name, std::uint32_t bits, std::int32_t r, std::vector<std::int32_t> ids,
                            std::optional<std::int32_t> n, std::int32_t seq,
                            std::vector<std::int32_t> attended) {
    v.push_back({std::move(name), bits, false, [&s, r, ids, n](content& c) { set_row(s, c, r, ids, n); },
                 [=](expectation& e) {
                   e.rows[r] = attended;
                   e.touched = {seq};
                 }});
  };
  row_case("block id 3 = sequence 3's block count (the next sequence's keys)", sc::bad_block_id, 2, {0, 1, 2, 3},
           std::nullopt, 3, {0, 1, 2});
  row_case("block id INT_MAX", sc::bad_block_id, 1, {1, 3, 4, int_max}, std::nullopt, 1, {1, 3, 4});
  row_case("block id 1 past sequence 6's one block (the poison after it)", sc::bad_block_id, 6, {0, 1}, std::nullopt, 6,
           {0});
  row_case("negative block id -7", sc::bad_block_id, 0, {-7, 0, 2, 4}, std::nullopt, 1, {0, 2, 4});
  row_case("block id INT_MIN", sc::bad_block_id, 6, {int_min, 0}, std::nullopt, 6, {0});
  row_case("padding value -1 inside the count", sc::bad_block_id, 3, {-1, 2}, std::nullopt, 3, {2});
  row_case("repeated block id", sc::bad_order, 0, {0, 2, 2, 4}, std::nullopt, 1, {0, 2, 4});
  row_case("descending block ids", sc::bad_order, 2, {0, 2, 1}, std::nullopt, 3, {0, 2});
  // A count past the width is clamped to it: the padding slots (-1) inside it are bad ids.
  row_case("count width + 3", sc::bad_count | sc::bad_block_id, 0, {0, 2, 4}, s.width + 3, 1, {0, 2, 4});
  row_case("count INT_MAX", sc::bad_count | sc::bad_block_id, 2, {0, 1, 2}, int_max, 3, {0, 1, 2});
  row_case("count -3 (an empty row: o 0, lse -inf)", sc::bad_count, 1, {1, 3, 4}, -3, 1, {});
  v.push_back(garbage_padding(s));
  add_length_cases(s, v, 1, 3, 6);
  // cu_seqlens_q decreasing: sequence 3 gets -1 queries and the poison sequence 4 two (> max 1); the
  // rows of sequences 5 and 6 are numbered from the device's lengths, one query block later: 5 reads
  // row 6 and 7 ({0} past its no blocks: bad_block_id), 6 reads rows 8 and 9, past the table (bad_count).
  v.push_back({"cu_seqlens_q decreasing (sequence 3 of -1 queries, then 2)", sc::bad_seqlen | sc::bad_count | sc::bad_block_id,
               false, [](content& c) { c.cu_q[4] = c.cu_q[3] - 1; },
               [](expectation& e) {
                 e.unwritten = {3};
                 e.touched = {3, 5, 6};
                 e.row_base[5] = 3;
                 e.row_base[6] = 4;  // rows 8, 9: none (empty)
               }});
  if (paged_cases) add_page_cases(s, v, 1, 2);
  return v;
}

// Every split kernel, the automatic chunk (one split), one block per split merged in a cluster (sm_90)
// and by the merge kernel, over contiguous and paged K/V.
void decode_graph_replays(std::int32_t variants_mask) {
  const scene s = decode_scene();
  device_scene ds(s);
  const stream_owner stream;
  const sc::device_problem p = ds.prob(s);
  struct variant {
    const char* name;
    sc::decode_kernel kernel;
    std::int32_t chunk;
    bool cluster;
  };
  const variant variants[] = {
      {"cuda_cores, automatic chunk", sc::decode_kernel::cuda_cores, 0, true},
      {"tensor_cores, automatic chunk", sc::decode_kernel::tensor_cores, 0, true},
      {"cuda_cores, 1 block a split, cluster merge", sc::decode_kernel::cuda_cores, 1, true},
      {"tensor_cores, 1 block a split, cluster merge", sc::decode_kernel::tensor_cores, 1, true},
      {"cuda_cores, 1 block a split, merge kernel", sc::decode_kernel::cuda_cores, 1, false},
      {"tensor_cores, 1 block a split, merge kernel", sc::decode_kernel::tensor_cores, 1, false},
  };
  for (std::size_t vi = 0; vi < std::size(variants); ++vi) {
    if ((variants_mask >> vi & 1) == 0) continue;
    const variant& var = variants[vi];
    sc::decode dec;
    dec.kernel = var.kernel;
    dec.chunk_blocks = var.chunk;
    dec.merge_in_cluster = var.cluster;
    const std::size_t ws_bytes = dec.workspace_bytes(p, s.width);
    tc::buffer<std::uint8_t> ws(std::max<std::size_t>(ws_bytes, 1));  // 0xff-filled
    for (const bool paged : {false, true}) {
      const std::string name = std::string("decode ") + var.name + (paged ? ", paged K/V" : ", contiguous K/V");
      INFO(name);
      const auto run = [&](cudaStream_t st) {
        const auto go = [&](const auto& kv) {
          using KV = std::decay_t<decltype(kv)>;
          const sc::device_attention_args<T, KV, sc::device_block_table, float> a{
              .prob = p, .q = ds.q_view(s), .kv = kv, .index = ds.table(s), .o = ds.o_view(s), .lse = ds.lse.data()};
          return dec.run(a, ws.bytes(ws_bytes), st);
        };
        return paged ? go(ds.paged(s)) : go(ds.contiguous(s));
      };
      graph g;
      ds.prepare(s.good, stream.s);
      g.capture(stream.s, run);
      const auto replay = [&](cudaStream_t st) { g.launch(st); };
      const result valid = run_on(ds, s.good, stream.s, replay);
      check_valid(s, valid, 5e-3, name);
      const result direct = run_on(ds, s.good, stream.s, [&](cudaStream_t st) { REQUIRE(run(st).ok()); });
      CHECK_MESSAGE(std::memcmp(direct.o.data(), valid.o.data(), valid.o.size() * sizeof(float)) == 0,
                    name << ": graph replay and direct call differ in O");
      CHECK_MESSAGE(std::memcmp(direct.lse.data(), valid.lse.data(), valid.lse.size() * sizeof(float)) == 0,
                    name << ": graph replay and direct call differ in lse");
      replay_cases(s, ds, stream.s, replay, paged, decode_cases(s, paged), valid, 5e-3, name);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Prefill: sequences 0x40, 50x150, 0x64, 64x64, 0x30, 1x0, 0x16 (q 0: poison), heads 2/1, d 64,
// block_kv 64, max_seqlen_q 64, max_seqlen_kv 160, pages of 16 keys. Every sequence has at most 64
// queries: one query block whether block_q is 64 or 128, so the rows are the same: row 0 sequence 1
// (3 visible blocks), row 1 sequence 3 (1 block), row 2 sequence 5 (no key).

scene prefill_scene(std::int32_t block_q) {
  return scene(2, 1, 64, block_q, 64, 64, 160, 16, {{0, 40}, {50, 150}, {0, 64}, {64, 64}, {0, 30}, {1, 0}, {0, 16}},
               {{0, 1, 2}, {0}, {}}, 1, 23);
}

std::vector<bad_case> prefill_cases(const scene& s, bool paged_cases) {
  std::vector<bad_case> v;
  const auto row_case = [&](std::string name, std::uint32_t bits, std::int32_t r, std::vector<std::int32_t> ids,
                            std::optional<std::int32_t> n, std::int32_t seq,
                            std::vector<std::int32_t> attended) {
    v.push_back({std::move(name), bits, false, [&s, r, ids, n](content& c) { set_row(s, c, r, ids, n); },
                 [=](expectation& e) {
                   e.rows[r] = attended;
                   e.touched = {seq};
                 }});
  };
  row_case("block id 3 = sequence 1's block count (the poison after it)", sc::bad_block_id, 0, {0, 1, 2, 3},
           std::nullopt, 1, {0, 1, 2});
  row_case("block id 1 past sequence 3's one block (the poison after it)", sc::bad_block_id, 1, {0, 1}, std::nullopt, 3,
           {0});
  row_case("block id INT_MAX", sc::bad_block_id, 1, {0, int_max}, std::nullopt, 3, {0});
  row_case("negative block id -7", sc::bad_block_id, 0, {-7, 0, 2}, std::nullopt, 1, {0, 2});
  row_case("block id INT_MIN", sc::bad_block_id, 1, {int_min, 0}, std::nullopt, 3, {0});
  row_case("padding value -1 inside the count", sc::bad_block_id, 0, {-1, 1}, std::nullopt, 1, {1});
  row_case("repeated block id", sc::bad_order, 0, {0, 0, 2}, std::nullopt, 1, {0, 2});
  row_case("descending block ids", sc::bad_order, 0, {0, 2, 1}, std::nullopt, 1, {0, 2});
  row_case("count width + 3", sc::bad_count | sc::bad_block_id, 0, {0, 1, 2}, s.width + 3, 1, {0, 1, 2});
  row_case("count -1 (an empty row: o 0, lse -inf)", sc::bad_count, 1, {0}, -1, 3, {});
  v.push_back(garbage_padding(s));
  add_length_cases(s, v, 1, 3, 5);
  // Keys on a bad page are skipped, as decode skips them (prefill's paged K/V runs on mma.sync).
  if (paged_cases) add_page_cases(s, v, 1, 1);
  return v;
}

void prefill_graph_replays(std::int32_t block_q, sc::prefill_kernel kernel, bool paged) {
  const scene s = prefill_scene(block_q);
  device_scene ds(s);
  const stream_owner stream;
  const sc::device_problem p = ds.prob(s);
  const sc::prefill pre{.kernel = kernel};
  const std::string name = "prefill block_q " + std::to_string(block_q) +
                           (kernel == sc::prefill_kernel::mma_sync ? ", mma_sync" : ", automatic") +
                           (paged ? ", paged K/V" : ", contiguous K/V");
  INFO(name);
  const auto run = [&](cudaStream_t st) {
    const auto go = [&](const auto& kv) {
      using KV = std::decay_t<decltype(kv)>;
      const sc::device_attention_args<T, KV, sc::device_block_table, float> a{
          .prob = p, .q = ds.q_view(s), .kv = kv, .index = ds.table(s), .o = ds.o_view(s), .lse = ds.lse.data()};
      return pre.run(a, {}, st);
    };
    return paged ? go(ds.paged(s)) : go(ds.contiguous(s));
  };
  graph g;
  ds.prepare(s.good, stream.s);
  g.capture(stream.s, run);
  const auto replay = [&](cudaStream_t st) { g.launch(st); };
  const result valid = run_on(ds, s.good, stream.s, replay);
  check_valid(s, valid, 5e-3, name);
  const result direct = run_on(ds, s.good, stream.s, [&](cudaStream_t st) { REQUIRE(run(st).ok()); });
  CHECK_MESSAGE(std::memcmp(direct.o.data(), valid.o.data(), valid.o.size() * sizeof(float)) == 0,
                name << ": graph replay and direct call differ in O");
  CHECK_MESSAGE(std::memcmp(direct.lse.data(), valid.lse.data(), valid.lse.size() * sizeof(float)) == 0,
                name << ": graph replay and direct call differ in lse");
  replay_cases(s, ds, stream.s, replay, paged, prefill_cases(s, paged), valid, 5e-3, name);
}

}  // namespace

// ---------------------------------------------------------------------------------------------

TEST_CASE("graph replay small: decode over bad device content, automatic chunk") {
  decode_graph_replays(0b000011);
}

TEST_CASE("graph replay small: decode over bad device content, split rows (cluster and merge kernel)") {
  decode_graph_replays(0b111100);
}

TEST_CASE("graph replay: prefill over bad device content, mma_sync") {
  for (const bool paged : {false, true}) prefill_graph_replays(64, sc::prefill_kernel::mma_sync, paged);
}

TEST_CASE("graph replay: prefill over bad device content, block_q 128 (wgmma on sm_90)") {
  prefill_graph_replays(128, sc::prefill_kernel::automatic, false);
  prefill_graph_replays(128, sc::prefill_kernel::mma_sync, true);
}

// decode_step (summaries, router, table, decode) captured once: bad lengths between replays. The
// router leaves a malformed sequence's rows alone and decode does not write them; every other
// sequence's O and lse are the valid replay's bits; valid content again gives the original bits.
TEST_CASE("graph replay small: decode_step over bad lengths") {
  const scene s = decode_scene(defaults::block_kv, 17);
  device_scene ds(s);
  const stream_owner stream;
  const sc::decode_step_config config{.prob = ds.prob(s), .top_k = 3};
  using step_t = sc::decode_step<T, float>;
  step_t step;
  tc::buffer<std::byte> memory(step_t::device_bytes(config));
  REQUIRE(memory.size() > 0);
  {
    const status st = step.plan(config, memory.bytes(memory.size()));
    INFO("plan: " << st.message());
    REQUIRE(st.ok());
  }
  {
    const status st = step.prefill(ds.contiguous(s), stream.s);
    INFO("prefill: " << st.message());
    REQUIRE(st.ok());
  }
  SKIM_CUDA_REQUIRE(cudaStreamSynchronize(stream.s));
  const auto run = [&](cudaStream_t st) { return step.run(ds.q_view(s), ds.contiguous(s), ds.o_view(s), ds.lse.data(), st); };
  graph g;
  ds.prepare(s.good, stream.s);
  g.capture(stream.s, run);
  const auto replay = [&](cudaStream_t st) { g.launch(st); };
  const result valid = run_on(ds, s.good, stream.s, replay);
  CHECK_MESSAGE(valid.error == 0u, "decode_step valid replay: error word " << hex(valid.error));
  const result direct = run_on(ds, s.good, stream.s, [&](cudaStream_t st) { REQUIRE(run(st).ok()); });
  CHECK_MESSAGE(std::memcmp(direct.o.data(), valid.o.data(), valid.o.size() * sizeof(float)) == 0,
                "decode_step: graph replay and direct call differ in O");
  CHECK_MESSAGE(std::memcmp(direct.lse.data(), valid.lse.data(), valid.lse.size() * sizeof(float)) == 0,
                "decode_step: graph replay and direct call differ in lse");
  // Against the reference over the ids the step selected (its table's rows, numbered as decode's).
  {
    const sc::device_block_table t = step.table();
    REQUIRE(t.rows >= static_cast<std::int64_t>(s.rows.size()));
    std::vector<std::int32_t> ids(static_cast<std::size_t>(t.rows) * t.width), count(static_cast<std::size_t>(t.rows));
    SKIM_CUDA_REQUIRE(cudaMemcpy(ids.data(), t.ids, ids.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost));
    SKIM_CUDA_REQUIRE(cudaMemcpy(count.data(), t.count, count.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost));
    scene routed = s;
    for (std::size_t r = 0; r < routed.rows.size(); ++r) {
      REQUIRE(count[r] >= 0);
      REQUIRE(count[r] <= t.width);
      routed.rows[r].assign(ids.begin() + static_cast<std::ptrdiff_t>(r * t.width),
                            ids.begin() + static_cast<std::ptrdiff_t>(r * t.width + count[r]));
    }
    check_valid(routed, valid, 5e-3, "decode_step");
  }
  std::vector<bad_case> cases;
  add_length_cases(s, cases, 1, 3, 6);
  replay_cases(s, ds, stream.s, replay, false, cases, valid, 5e-3, "decode_step");
}
