// cuda::decode against exec::reference (CPU, double) on random decode shapes: 0..8 queries per
// sequence (decode and speculative rows, empty sequences), kv lengths not multiples of block_kv,
// GQA groups 1/4/8, head_dim 64 and 128, block_kv 16..128, contiguous and paged K/V (page sizes unlike
// block_kv), each token-major or head-major, kv-head and query-head index scope, block_table and block_csr, bf16 and fp16 inputs,
// 16-bit and fp32 outputs, several splits per row (fixed and automatic chunk sizes; the merge by the
// merge kernel, for up to hundreds of splits, or in a cluster on sm_90+, bit for bit the same).
// Every case runs both split kernels (decode_kernel::cuda_cores and tensor_cores; the latter rounds
// P to 16 bits, so its tolerance is prefill's: 2e-2 relative for bf16, 5e-3 for fp16). Besides the
// stored forms: implicit indices and unions (causal_all, sink + window, a table or CSR with them). Also: bit-identical reruns (and automatic = tensor_cores),
// every output written (buffers start as NaN), the device error word for bad ids / order / counts /
// pages, host errors.
//
// Run only these: skim_cuda_tests -tc='decode*'   (the sanitizer runs the "decode small" cases)
#include "cuda/support.cuh"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "skim/exec/cpu/reference.hpp"
#include "skim/index/block_csr.hpp"
#include "skim/index/block_union.hpp"
#include "skim/index/causal_all.hpp"
#include "skim/index/head_shared.hpp"
#include "skim/index/sink.hpp"
#include "skim/index/sliding_window.hpp"
#include "support/executor_cases.hpp"
#include "support/quantized_case.hpp"
#include "support/random_case.hpp"

namespace {

using namespace skim;
using namespace skim::test;
namespace sc = skim::cuda;
namespace tc = skim::test::cuda;
using skim::cuda::decode;
using skim::cuda::decode_kernel;

// The split kernels every case runs.
constexpr decode_kernel kernels[] = {decode_kernel::cuda_cores, decode_kernel::tensor_cores};

[[nodiscard]] const char* kernel_name(decode_kernel k) {
  return k == decode_kernel::cuda_cores ? "cuda_cores" : (k == decode_kernel::tensor_cores ? "tensor_cores" : "automatic");
}

// dec with its split kernel set to k.
[[nodiscard]] decode with_kernel(decode dec, decode_kernel k) {
  dec.kernel = k;
  return dec;
}

// ---------------------------------------------------------------------------------------------
// Cases

// A random decode shape: every sequence has at most 8 queries; at least one has a query and a key.
case_spec random_decode_spec(std::mt19937& rng) {
  case_spec s;
  s.head_dim = pick(rng, {64, 128});
  s.heads_kv = uniform(rng, 1, 2);
  s.heads_q = s.heads_kv * pick(rng, {1, 4, 8});
  s.block_kv = pick(rng, {16, 32, 64, 128});
  s.block_q = pick(rng, {1, 2, 4, 8, 16, 64});
  s.mask = chance(rng, 0.85) ? mask_kind::causal : mask_kind::none;
  s.scope = chance(rng, 0.7) ? index_scope::kv_head : index_scope::query_head;
  s.softmax_scale = chance(rng, 0.5) ? 0.0f
                                     : std::uniform_real_distribution<float>(0.3f, 3.0f)(rng) /
                                           std::sqrt(static_cast<float>(s.head_dim));
  const std::int32_t batch = uniform(rng, 1, 5);
  s.seqs.clear();
  for (std::int32_t b = 0; b < batch; ++b) {
    sequence_lengths l;
    const int kind = uniform(rng, 0, 9);
    l.q = kind == 0 ? 0 : (kind <= 5 ? 1 : uniform(rng, 2, 8));
    const int kv_kind = uniform(rng, 0, 9);
    l.kv = kv_kind == 0 ? 0 : (kv_kind == 1 ? uniform(rng, 0, 8) : uniform(rng, 1, 2500));
    s.seqs.push_back(l);
  }
  if (std::none_of(s.seqs.begin(), s.seqs.end(), [](const sequence_lengths& l) { return l.q > 0 && l.kv > 0; })) {
    s.seqs[0] = {uniform(rng, 1, 8), uniform(rng, 1, 2500)};
  }
  s.paged = chance(rng, 0.5);
  do {
    s.page_size = pick(rng, {8, 16, 17, 32, 64, 100, 128});
  } while (s.page_size == s.block_kv);
  s.kv_head_major = chance(rng, 0.5);
  return s;
}

// Per-row sorted unique ids, in CSR and block_table form (rows numbered as skim::problem numbers them).
struct host_index {
  std::vector<std::vector<std::int32_t>> rows;
  std::vector<std::int32_t> row_ptr{0}, col_idx;
  std::vector<std::int32_t> ids, count;
  std::int32_t width = 0;

  void finish(std::int32_t pad) {
    for (const auto& r : rows) width = std::max(width, static_cast<std::int32_t>(r.size()));
    width += pad;
    for (const auto& r : rows) {
      col_idx.insert(col_idx.end(), r.begin(), r.end());
      row_ptr.push_back(static_cast<std::int32_t>(col_idx.size()));
      count.push_back(static_cast<std::int32_t>(r.size()));
      for (std::int32_t j = 0; j < width; ++j) ids.push_back(j < static_cast<std::int32_t>(r.size()) ? r[j] : -1);
    }
  }
  [[nodiscard]] index::block_csr csr_view() const { return {row_ptr, col_idx}; }
  [[nodiscard]] std::int32_t max_count() const {
    std::int32_t n = 0;
    for (const auto& r : rows) n = std::max(n, static_cast<std::int32_t>(r.size()));
    return n;
  }
};

// Up to max_ids visible blocks per row, often with the newest one (ragged tail, causal diagonal);
// some rows empty.
host_index random_index(const problem& p, std::mt19937& rng, std::int32_t max_ids) {
  host_index hi;
  REQUIRE(for_each_row(p, [&](const row_info& r) {
            std::set<std::int32_t> s;
            if (r.visible_blocks > 0 && !chance(rng, 0.08)) {
              const std::int32_t k = uniform(rng, 1, std::min(r.visible_blocks, max_ids));
              if (chance(rng, 0.6)) s.insert(r.visible_blocks - 1);
              while (static_cast<std::int32_t>(s.size()) < k) s.insert(uniform(rng, 0, r.visible_blocks - 1));
            }
            hi.rows.emplace_back(s.begin(), s.end());
          }).ok());
  hi.finish(uniform(rng, 0, 2));
  return hi;
}

// The index on the device (buffers of at least one element, so no pointer is null).
struct device_index {
  tc::buffer<std::int32_t> ids, count, row_ptr, col_idx;
  std::int32_t width = 0;
  std::int64_t rows = 0;

  explicit device_index(const host_index& h)
      : ids(std::max<std::size_t>(h.ids.size(), 1)), count(std::max<std::size_t>(h.count.size(), 1)),
        row_ptr(h.row_ptr), col_idx(std::max<std::size_t>(h.col_idx.size(), 1)), width(h.width),
        rows(static_cast<std::int64_t>(h.rows.size())) {
    upload_prefix(ids, h.ids);
    upload_prefix(count, h.count);
    upload_prefix(col_idx, h.col_idx);
  }
  static void upload_prefix(tc::buffer<std::int32_t>& b, const std::vector<std::int32_t>& v) {
    if (!v.empty()) SKIM_CUDA_REQUIRE(cudaMemcpy(b.data(), v.data(), v.size() * 4, cudaMemcpyHostToDevice));
  }
  [[nodiscard]] sc::device_block_table table() const {
    return {.ids = ids.data(), .count = count.data(), .width = width, .rows = rows};
  }
  [[nodiscard]] sc::device_block_csr csr(std::int64_t capacity) const {
    return {.row_ptr = row_ptr.data(), .col_idx = col_idx.data(), .capacity = capacity, .rows = rows};
  }
};

// ---------------------------------------------------------------------------------------------
// Running

// Runs decode once into fresh NaN-poisoned O / lse buffers and a 0xff-filled workspace.
// bound < 0: run(a, workspace, ...) (the index's own bound); else run(a, bound, workspace, ...).
template <class TO, class T, class KV, class Index>
// q: a view of dc.q's values laid out otherwise (null data: dc.q, token-major and dense).
tc::gpu_output<TO> run_decode(const decode& dec, tc::device_case<T, T>& dc, const sc::device_problem& p, const KV& kv,
                              const Index& index, std::int32_t tokens_q, std::int32_t bound = -1,
                              sc::device_view<const T> q = {}) {
  const std::size_t n = static_cast<std::size_t>(std::max(tokens_q, 1)) * p.heads_q * p.head_dim;
  tc::buffer<TO> o(n);
  tc::buffer<float> lse(static_cast<std::size_t>(std::max(tokens_q, 1)) * p.heads_q);
  const sc::device_attention_args<T, KV, Index, TO> a{
      .prob = p,
      .q = q.data != nullptr ? q : sc::device_view<const T>::token_major(dc.q.data(), p.heads_q, p.head_dim),
      .kv = kv,
      .index = index,
      .o = sc::device_view<TO>::token_major(o.data(), p.heads_q, p.head_dim),
      .lse = lse.data()};
  const std::size_t ws_bytes = dec.workspace_bytes(p, bound < 0 ? index.max_ids() : bound);
  tc::buffer<std::uint8_t> ws(ws_bytes);
  const status st = bound < 0 ? dec.run(a, ws.bytes(ws_bytes), nullptr) : dec.run(a, bound, ws.bytes(ws_bytes), nullptr);
  INFO("run: " << st.message());
  REQUIRE(st.ok());
  SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
  return tc::gpu_output<TO>::fetch(o, lse, static_cast<std::size_t>(tokens_q) * p.heads_q, p.head_dim, dc.error_bits());
}

// Relative L2 tolerance of o for output type TO, inputs T, split kernel k: the output's rounding, and
// for tensor_cores P rounded to T before P·V (prefill's bounds).
template <class TO, class T>
[[nodiscard]] constexpr double tolerance(decode_kernel k) {
  const double out = std::is_same_v<TO, float> ? 2e-3 : (std::is_same_v<TO, skim::half> ? 4e-3 : 1.2e-2);
  if (k == decode_kernel::cuda_cores) return out;
  const double p = std::is_same_v<T, skim::bfloat16> ? 2e-2 : 5e-3;
  return out > p ? out : p;
}

// The reference's O (fp32) and lse for c with hi's selection, into ref (output<float>(c.spec, tokens_q)).
template <class T>
void reference_output(const random_case<T, T>& c, const host_index& hi, output<float>& ref) {
  const attention_args<T, contiguous_kv<T>, index::block_csr, float> ra{
      .prob = c.prob(), .q = c.q_view(), .kv = c.contiguous(), .index = hi.csr_view(), .o = ref.view, .lse = ref.lse};
  const status st = exec::reference{}.run(ra, {});
  INFO("reference: " << st.message());
  REQUIRE(st.ok());
}

// A bf16 case with a random selection of up to max_ids blocks a row (random_index), on the host and
// the device, with the reference's output over that selection. Tests bind its parts by name:
//   auto& [c, hi, ref, dc, di, p] = selected;
struct selection_case {
  random_case<skim::bfloat16, skim::bfloat16> c;
  host_index hi;
  output<float> ref;
  tc::device_case<skim::bfloat16, skim::bfloat16> dc;
  device_index di;
  sc::device_problem p;

  selection_case(const case_spec& s, std::mt19937& rng, std::int32_t max_ids)
      : c(s, rng), hi(random_index(c.prob(), rng, max_ids)), ref(c.spec, c.tokens_q()), dc(c), di(hi),
        p(dc.prob(s)) {
    reference_output(c, hi, ref);
  }
};

// Calls f(kv source) for the storage the spec asks for.
template <class T, class F>
void with_kv(const random_case<T, T>& c, const tc::device_case<T, T>& dc, F&& f) {
  if (c.spec.paged) {
    f(dc.paged(c));
  } else {
    f(dc.contiguous(c.spec));
  }
}

// One random case of element types Types, compared with the reference.
template <class Types>
void random_decode_case(std::uint32_t seed) {
  using T = typename Types::q;
  using TO = typename Types::o;
  static_assert(std::is_same_v<T, typename Types::kv>);
  std::mt19937 rng(seed);
  case_spec s = random_decode_spec(rng);
  const random_case<T, T> c(s, rng);
  const host_index hi = random_index(c.prob(), rng, 20);
  decode dec;
  dec.chunk_blocks = pick(rng, {0, 1, 2, 3, 8});
  const bool csr = chance(rng, 0.5);
  const bool explicit_bound = chance(rng, 0.5);
  INFO("seed " << seed << ": " << s.describe() << ", chunk_blocks " << dec.chunk_blocks << (csr ? ", csr" : ", table")
               << (explicit_bound ? " explicit bound" : "") << ", width " << hi.width);
  MESSAGE("decode random seed " << seed << ": " << s.describe());

  tc::device_case<T, T> dc(c);
  const device_index di(hi);
  const sc::device_problem p = dc.prob(s);
  REQUIRE(dec.can_implement(p).ok());
  output<float> ref(c.spec, c.tokens_q());
  reference_output(c, hi, ref);
  const std::int32_t bound = explicit_bound ? hi.max_count() : -1;
  for (const decode_kernel k : kernels) {
    INFO("kernel " << kernel_name(k));
    const decode dk = with_kernel(dec, k);
    with_kv(c, dc, [&](const auto& kv) {
      const auto g = csr ? run_decode<TO>(dk, dc, p, kv, di.csr(static_cast<std::int64_t>(hi.col_idx.size())),
                                          c.tokens_q(), bound)
                         : run_decode<TO>(dk, dc, p, kv, di.table(), c.tokens_q(), bound);
      CHECK(g.error == 0u);
      tc::check_against(s, g, ref, c.tokens_q(), tolerance<TO, T>(k));
    });
  }
}

// ---------------------------------------------------------------------------------------------
// Quantised K/V: 8-bit codes with scales per (sequence, block, kv head) or per kv head
// (support/quantized_case.hpp).

// One random case with Q of type T and quantised K/V (Code), on both split kernels, against the
// reference over the dequantised values.
template <class T, class Code>
void quantized_case(const case_spec& s, std::mt19937& rng, std::uint32_t seed) {
  const random_case<T, T> c(s, rng);
  const host_index hi = random_index(c.prob(), rng, 20);
  const bool per_block = chance(rng, 0.6);
  tc::device_case<T, T> dc(c);
  const sc::device_problem p = dc.prob(s);
  const std::int32_t max_blocks = p.max_kv_blocks() + uniform(rng, 0, 2);
  const quantized_host<Code> qh(c, rng, per_block, max_blocks);
  decode dec;
  dec.chunk_blocks = pick(rng, {0, 1, 2, 3, 8});
  const bool csr = chance(rng, 0.5);
  INFO("seed " << seed << ": " << s.describe() << (per_block ? ", scales per block" : ", scales per head")
               << ", chunk_blocks " << dec.chunk_blocks << (csr ? ", csr" : ", table"));
  MESSAGE("decode quantized seed " << seed << ": " << s.describe());

  output<float> ref(c.spec, c.tokens_q());
  const contiguous_kv<float> rkv{.k = strided_view<const float>::token_major(qh.kf.data(), c.cu_kv.back(), s.heads_kv, s.head_dim),
                                 .v = strided_view<const float>::token_major(qh.vf.data(), c.cu_kv.back(), s.heads_kv, s.head_dim),
                                 .cu_seqlens_kv = {}};
  const attention_args<T, contiguous_kv<float>, index::block_csr, float> ra{
      .prob = c.prob(), .q = c.q_view(), .kv = rkv, .index = hi.csr_view(), .o = ref.view, .lse = ref.lse};
  REQUIRE(exec::reference{}.run(ra, {}).ok());

  const std::int64_t d = s.head_dim, hk = s.heads_kv;
  const auto stored = [&](const std::vector<Code>& x, bool pages) {
    if (!s.kv_head_major) return x;
    const std::int64_t tokens = pages ? s.page_size : static_cast<std::int64_t>(x.size()) / (d * hk);
    return heads_outside(x, pages ? c.num_pages : 1, tokens, hk, d);
  };
  const tc::buffer<Code> k(stored(qh.k, false)), v(stored(qh.v, false)), kp(stored(qh.k_pages, true)),
      vp(stored(qh.v_pages, true));
  const tc::buffer<float> ks(qh.k_scales), vs(qh.v_scales);
  const device_index di(hi);
  const auto quantize = [&](const auto& codes) {
    return sc::device_quantized_kv<std::decay_t<decltype(codes)>>{codes, ks.data(), vs.data(), qh.seq_stride,
                                                                   qh.block_stride, qh.head_stride};
  };
  const auto cs = dc.contiguous(s);
  const auto ps = dc.paged(c);
  for (const decode_kernel kern : kernels) {
    INFO("kernel " << kernel_name(kern));
    const decode dk = with_kernel(dec, kern);
    const auto check = [&](const auto& kv) {
      const auto g = csr ? run_decode<float>(dk, dc, p, kv, di.csr(static_cast<std::int64_t>(hi.col_idx.size())), c.tokens_q())
                         : run_decode<float>(dk, dc, p, kv, di.table(), c.tokens_q());
      CHECK(g.error == 0u);
      tc::check_against(s, g, ref, c.tokens_q(), tolerance<float, T>(kern));
    };
    if (s.paged) {
      check(quantize(sc::device_paged_kv<Code>{.k_pages = kp.data(), .v_pages = vp.data(), .num_pages = ps.num_pages,
                                                .page_size = ps.page_size, .page_stride = ps.page_stride,
                                                .token_stride = ps.token_stride, .head_stride = ps.head_stride,
                                                .page_indptr = ps.page_indptr, .page_indices = ps.page_indices}));
    } else {
      check(quantize(sc::device_contiguous_kv<Code>{.k = k.data(), .v = v.data(), .token_stride = cs.token_stride,
                                                     .head_stride = cs.head_stride}));
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("decode random shapes against reference", Types, types<skim::bfloat16, skim::bfloat16, skim::bfloat16>,
                   types<skim::bfloat16, skim::bfloat16, float>, types<skim::half, skim::half, skim::half>, types<skim::half, skim::half, float>) {
  std::uint32_t base = 1000;
  if constexpr (std::is_same_v<typename Types::o, float>) base += 100;
  if constexpr (std::is_same_v<typename Types::q, skim::half>) base += 200;
  for (std::uint32_t i = 0; i < 16; ++i) random_decode_case<Types>(base + i);
}

// A small fixed case for compute-sanitizer (memcheck, racecheck): decode and speculative rows,
// partial blocks, several splits per row (merge kernel), both sources and both index forms, both
// split kernels.
TEST_CASE("decode small: fixed shapes, both kernels, sources and index forms") {
  for (const std::int32_t d : {64, 128}) {
    std::mt19937 rng(7u + static_cast<std::uint32_t>(d));
    case_spec s;
    s.head_dim = d;
    s.heads_kv = 2;
    s.heads_q = 8;
    s.block_q = 8;
    s.block_kv = 16;
    s.seqs = {{1, 50}, {3, 37}, {0, 20}, {2, 0}, {1, 16}};
    s.page_size = 24;
    selection_case selected(s, rng, 4);
    auto& [c, hi, ref, dc, di, p] = selected;
    for (const decode_kernel k : kernels) {
      for (const std::int32_t chunk : {0, 1, 8}) {
        decode dec;
        dec.chunk_blocks = chunk;
        dec.kernel = k;
        const double tol = tolerance<float, skim::bfloat16>(k);
        INFO("d " << d << " chunk_blocks " << chunk << " kernel " << kernel_name(k));
        {
          const auto g = run_decode<float>(dec, dc, p, dc.contiguous(s), di.table(), c.tokens_q());
          CHECK(g.error == 0u);
          tc::check_against(s, g, ref, c.tokens_q(), tol);
        }
        {
          const auto g = run_decode<float>(dec, dc, p, dc.paged(c), di.csr(static_cast<std::int64_t>(hi.col_idx.size())),
                                           c.tokens_q(), hi.max_count());
          CHECK(g.error == 0u);
          tc::check_against(s, g, ref, c.tokens_q(), tol);
        }
      }
    }
  }
}

// Long rows: every block of a 5280-key sequence selected for 64 rows (GQA 8 × 8 queries). chunk 1
// gives 330 splits, more (m, l) pairs than the merge stages in shared memory; the automatic chunk
// gives a few splits of many blocks; one sequence is shorter than the others' bound.
TEST_CASE("decode many splits: merge of hundreds of partials, automatic chunk") {
  std::mt19937 rng(2024);
  case_spec s;
  s.head_dim = 128;
  s.heads_kv = 1;
  s.heads_q = 8;
  s.block_q = 8;
  s.block_kv = 16;
  s.seqs = {{8, 5280}, {3, 1000}};
  const random_case<skim::bfloat16, skim::bfloat16> c(s, rng);
  host_index hi;
  REQUIRE(for_each_row(c.prob(), [&](const row_info& r) {
            std::vector<std::int32_t> all(static_cast<std::size_t>(r.visible_blocks));
            for (std::int32_t j = 0; j < r.visible_blocks; ++j) all[static_cast<std::size_t>(j)] = j;
            hi.rows.push_back(all);
          }).ok());
  hi.finish(0);
  REQUIRE(hi.max_count() >= 300);
  output<float> ref(c.spec, c.tokens_q());
  reference_output(c, hi, ref);
  tc::device_case<skim::bfloat16, skim::bfloat16> dc(c);
  const device_index di(hi);
  const sc::device_problem p = dc.prob(s);
  for (const decode_kernel k : kernels) {
    for (const std::int32_t chunk : {1, 0}) {
      decode dec;
      dec.chunk_blocks = chunk;
      dec.kernel = k;
      INFO("chunk_blocks " << chunk << ", splits " << dec.splits(p, hi.width) << ", kernel " << kernel_name(k));
      const auto g1 = run_decode<float>(dec, dc, p, dc.contiguous(s), di.table(), c.tokens_q());
      CHECK(g1.error == 0u);
      tc::check_against(s, g1, ref, c.tokens_q(), tolerance<float, skim::bfloat16>(k));
      const auto g2 = run_decode<float>(dec, dc, p, dc.paged(c), di.csr(static_cast<std::int64_t>(hi.col_idx.size())),
                                        c.tokens_q());
      CHECK(g2.error == 0u);
      CHECK(std::memcmp(g1.o.data(), g2.o.data(), g1.o.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(g1.lse.data(), g2.lse.data(), g1.lse.size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("decode small head_shared: one row per query block reads as its ids stored for every head") {
  for (std::uint32_t seed = 70; seed < 76; ++seed) {
    std::mt19937 rng(seed);
    const case_spec s = random_decode_spec(rng);
    const random_case<skim::bfloat16, skim::bfloat16> c(s, rng);
    const problem hp = c.prob();
    const std::int32_t heads = hp.index_heads();
    // The shared rows (one per query block, laid out for shared_problem), and the same ids per head.
    const host_index shared = random_index(index::head_shared<index::block_csr>::shared_problem(hp), rng, 20);
    host_index per_head;
    for (std::size_t r = 0; r < shared.rows.size() * static_cast<std::size_t>(heads); ++r) {
      per_head.rows.push_back(shared.rows[r / static_cast<std::size_t>(heads)]);
    }
    per_head.finish(shared.width - shared.max_count());  // the same width: the same splits
    INFO("seed " << seed << ": " << s.describe() << ", index heads " << heads);
    output<float> ref(c.spec, c.tokens_q());
    reference_output(c, per_head, ref);
    tc::device_case<skim::bfloat16, skim::bfloat16> dc(c);
    const device_index dp(per_head), ds(shared);
    const sc::device_problem p = dc.prob(s);
    const sc::device_head_shared<sc::device_block_table> table{ds.table(), heads};
    const sc::device_head_shared<sc::device_block_csr> csr{ds.csr(static_cast<std::int64_t>(shared.col_idx.size())),
                                                          heads};
    decode dec;
    dec.chunk_blocks = pick(rng, {0, 2});
    for (const decode_kernel k : kernels) {
      INFO("kernel " << kernel_name(k) << ", chunk_blocks " << dec.chunk_blocks);
      const decode dk = with_kernel(dec, k);
      with_kv(c, dc, [&](const auto& kv) {
        const auto want = run_decode<float>(dk, dc, p, kv, dp.table(), c.tokens_q());
        CHECK(want.error == 0u);
        tc::check_against(s, want, ref, c.tokens_q(), tolerance<float, skim::bfloat16>(k));
        for (const auto& got : {run_decode<float>(dk, dc, p, kv, table, c.tokens_q()),
                                run_decode<float>(dk, dc, p, kv, csr, c.tokens_q())}) {
          CHECK(got.error == 0u);
          CHECK(std::memcmp(got.o.data(), want.o.data(), want.o.size() * sizeof(float)) == 0);
          CHECK(std::memcmp(got.lse.data(), want.lse.data(), want.lse.size() * sizeof(float)) == 0);
        }
      });
    }
    // index_heads must be the problem's: a mismatch is a host error, nothing runs.
    const sc::device_attention_args<skim::bfloat16, sc::device_contiguous_kv<skim::bfloat16>,
                                    sc::device_head_shared<sc::device_block_table>, float>
        bad{.prob = p,
            .q = sc::device_view<const skim::bfloat16>::token_major(dc.q.data(), p.heads_q, p.head_dim),
            .kv = dc.contiguous(s),
            .index = {ds.table(), heads + 1},
            .o = sc::device_view<float>::token_major(nullptr, p.heads_q, p.head_dim)};
    const status st = dec.run(bad, {}, nullptr);
    CHECK(st.code() == status_code::shape_mismatch);
    CHECK(std::string(st.message()).find("index_heads") != std::string::npos);
  }
}

// The cluster merge (sm_90+: a row's splits as one cluster, merged through distributed shared
// memory) against the merge kernel: the same bits, for 1..8 splits per row (rows shorter than the
// grid's splits, whose later splits exit at once), more than 8 (the merge kernel either way),
// multi-pass units (64 rows), both split kernels, both sources, table and CSR.
TEST_CASE("decode small cluster merge: the merge kernel's bits without its launch") {
  int device = 0, major = 0;
  SKIM_CUDA_REQUIRE(cudaGetDevice(&device));
  SKIM_CUDA_REQUIRE(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  std::int32_t clustered = 0;
  for (std::uint32_t seed = 80; seed < 86; ++seed) {
    std::mt19937 rng(seed);
    case_spec s = random_decode_spec(rng);
    if (seed == 80) {  // 8 queries × GQA 8 per unit: 64 rows, several passes of each kernel
      s.heads_kv = 1;
      s.heads_q = 8;
      s.block_q = 8;
      s.seqs = {{8, 1500}, {5, 700}, {1, 90}};
    }
    selection_case selected(s, rng, 20);
    auto& [c, hi, ref, dc, di, p] = selected;
    decode dec;
    const std::int32_t want_splits = std::array{2, 3, 8, 12, 2, 5}[seed - 80];  // 12: past a cluster
    dec.chunk_blocks = std::max(1, (hi.width + want_splits - 1) / want_splits);
    const std::int32_t splits = dec.splits(p, hi.width);
    if (major >= 9 && splits >= 2 && splits <= decode::max_cluster_splits) ++clustered;
    INFO("seed " << seed << ": " << s.describe() << ", chunk_blocks " << dec.chunk_blocks << ", splits " << splits);
    for (const decode_kernel k : kernels) {
      INFO("kernel " << kernel_name(k));
      decode by_kernel = with_kernel(dec, k);
      by_kernel.merge_in_cluster = false;
      decode in_cluster = by_kernel;
      in_cluster.merge_in_cluster = true;
      with_kv(c, dc, [&](const auto& kv) {
        const std::int64_t capacity = static_cast<std::int64_t>(hi.col_idx.size());
        const auto want = run_decode<float>(by_kernel, dc, p, kv, di.table(), c.tokens_q());
        CHECK(want.error == 0u);
        tc::check_against(s, want, ref, c.tokens_q(), tolerance<float, skim::bfloat16>(k));
        for (const auto& got : {run_decode<float>(in_cluster, dc, p, kv, di.table(), c.tokens_q()),
                                run_decode<float>(in_cluster, dc, p, kv, di.csr(capacity), c.tokens_q(), hi.width)}) {
          CHECK(got.error == 0u);
          CHECK(std::memcmp(got.o.data(), want.o.data(), want.o.size() * sizeof(float)) == 0);
          CHECK(std::memcmp(got.lse.data(), want.lse.data(), want.lse.size() * sizeof(float)) == 0);
        }
      });
    }
  }
  if (major >= 9) CHECK(clustered >= 4);  // the seeds above give clusters of 2..8 splits
}

// Implicit indices and unions (index/cuda/device_index.cuh): every visible block (causal_all), a sink and a window, and
// a routed selection (table or CSR) with a sink and a window, against the reference over the CPU's
// index of the same numbers; rows cut in splits (merged in a cluster or by the merge kernel), both
// kernels, both sources.
TEST_CASE("decode small implicit indices: causal_all, sink + window, a table or CSR with them") {
  namespace ix = skim::index;
  for (std::uint32_t seed = 90; seed < 96; ++seed) {
    std::mt19937 rng(seed);
    const case_spec s = random_decode_spec(rng);
    selection_case selected(s, rng, 12);
    auto& [c, hi, ref, dc, di, p] = selected;
    const std::int32_t sink = uniform(rng, 0, 2), window = uniform(rng, 1, 3);
    decode dec;
    dec.chunk_blocks = pick(rng, {0, 1, 2});
    INFO("seed " << seed << ": " << s.describe() << ", sink " << sink << ", window " << window << ", chunk_blocks "
                 << dec.chunk_blocks);
    const auto check_index = [&](const char* what, const auto& cpu_index, const auto& device_index) {
      INFO(what);
      output<float> want(c.spec, c.tokens_q());
      const attention_args<skim::bfloat16, contiguous_kv<skim::bfloat16>, std::remove_cvref_t<decltype(cpu_index)>, float>
          ra{.prob = c.prob(), .q = c.q_view(), .kv = c.contiguous(), .index = cpu_index, .o = want.view, .lse = want.lse};
      REQUIRE(exec::reference{}.run(ra, {}).ok());
      for (const decode_kernel k : kernels) {
        INFO("kernel " << kernel_name(k));
        with_kv(c, dc, [&](const auto& kv) {
          const auto got = run_decode<float>(with_kernel(dec, k), dc, p, kv, device_index, c.tokens_q());
          CHECK(got.error == 0u);
          tc::check_against(s, got, want, c.tokens_q(), tolerance<float, skim::bfloat16>(k));
        });
      }
    };
    const ix::sink cs{sink};
    const ix::sliding_window cw{window};
    const sc::device_sink ds{sink};
    const sc::device_sliding_window dw{window};
    check_index("causal_all", ix::causal_all{}, sc::device_causal_all{});
    check_index("sink + window", ix::make_union(cs, cw), sc::make_device_union(ds, dw));
    check_index("table + sink + window", ix::make_union(hi.csr_view(), cs, cw),
                sc::make_device_union(di.table(), ds, dw));
    check_index("csr + sink + window", ix::make_union(hi.csr_view(), cs, cw),
                sc::make_device_union(di.csr(static_cast<std::int64_t>(hi.col_idx.size())), ds, dw));
  }
}

TEST_CASE("decode deterministic: two runs give bit-identical O and lse, automatic = tensor_cores on sm_80+") {
  int device = 0, major = 0;
  SKIM_CUDA_REQUIRE(cudaGetDevice(&device));
  SKIM_CUDA_REQUIRE(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  for (std::uint32_t seed = 50; seed < 54; ++seed) {
    std::mt19937 rng(seed);
    case_spec s = random_decode_spec(rng);
    selection_case selected(s, rng, 20);
    auto& [c, hi, ref, dc, di, p] = selected;
    INFO("seed " << seed << ": " << s.describe());
    decode dec;
    dec.chunk_blocks = 2;
    for (const decode_kernel k : kernels) {
      INFO("kernel " << kernel_name(k));
      const decode dk = with_kernel(dec, k);
      with_kv(c, dc, [&](const auto& kv) {
        const auto g1 = run_decode<float>(dk, dc, p, kv, di.table(), c.tokens_q());
        const auto g2 = run_decode<float>(dk, dc, p, kv, di.table(), c.tokens_q());
        CHECK(std::memcmp(g1.o.data(), g2.o.data(), g1.o.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(g1.lse.data(), g2.lse.data(), g1.lse.size() * sizeof(float)) == 0);
        if (k == decode_kernel::tensor_cores && major >= 8) {
          const auto ga = run_decode<float>(with_kernel(dec, decode_kernel::automatic), dc, p, kv, di.table(), c.tokens_q());
          CHECK(std::memcmp(g1.o.data(), ga.o.data(), g1.o.size() * sizeof(float)) == 0);
          CHECK(std::memcmp(g1.lse.data(), ga.lse.data(), g1.lse.size() * sizeof(float)) == 0);
        }
      });
    }
  }
}

// Q rows the tensor-core kernel cannot read as 16-byte chunks (a token stride of heads · d + 3
// elements: most rows start off a 16-byte boundary, and head-major strides likewise) are read element
// by element: the same bits as the dense view's, for both kernels and sources.
TEST_CASE("decode small Q view of any stride: unaligned rows read as the dense view's") {
  for (std::uint32_t seed = 90; seed < 94; ++seed) {
    std::mt19937 rng(seed);
    const case_spec s = random_decode_spec(rng);
    selection_case selected(s, rng, 20);
    auto& [c, hi, ref, dc, di, p] = selected;
    REQUIRE(!s.q_head_major);  // c.q is token-major, as run_decode's default view reads it
    const std::int32_t tokens = c.tokens_q(), heads = s.heads_q, d = s.head_dim;
    const bool head_major = seed % 2 == 1;
    // head-major: [heads][tokens · d + 3] rows of d; token-major: [tokens][heads · d + 3].
    const std::int64_t token_stride = head_major ? d : static_cast<std::int64_t>(heads) * d + 3;
    const std::int64_t head_stride = head_major ? static_cast<std::int64_t>(tokens) * d + 3 : d;
    std::vector<skim::bfloat16> strided(static_cast<std::size_t>(head_major ? heads * head_stride : tokens * token_stride));
    for (std::int32_t t = 0; t < tokens; ++t)
      for (std::int32_t h = 0; h < heads; ++h)
        for (std::int32_t e = 0; e < d; ++e)
          strided[static_cast<std::size_t>(t * token_stride + h * head_stride + e)] =
              c.q[(static_cast<std::size_t>(t) * heads + h) * d + e];
    const tc::buffer<skim::bfloat16> q_strided(strided);
    const sc::device_view<const skim::bfloat16> q{q_strided.data(), token_stride, head_stride};
    INFO("seed " << seed << ": " << s.describe() << (head_major ? ", Q head-major" : ", Q token-major") << ", padded by 3");
    for (const decode_kernel k : kernels) {
      INFO("kernel " << kernel_name(k));
      decode dec = with_kernel(decode{}, k);
      dec.chunk_blocks = 2;
      with_kv(c, dc, [&](const auto& kv) {
        const auto want = run_decode<float>(dec, dc, p, kv, di.table(), tokens);
        const auto got = run_decode<float>(dec, dc, p, kv, di.table(), tokens, -1, q);
        CHECK(got.error == 0u);
        tc::check_against(s, got, ref, tokens, tolerance<float, skim::bfloat16>(k));
        CHECK(std::memcmp(got.o.data(), want.o.data(), want.o.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(got.lse.data(), want.lse.data(), want.lse.size() * sizeof(float)) == 0);
      });
    }
  }
}

TEST_CASE("decode bad index content is skipped and reported") {
  std::mt19937 rng(91);
  case_spec s;
  s.head_dim = 128;
  s.heads_kv = 1;
  s.heads_q = 4;
  s.block_q = 8;
  s.block_kv = 32;
  s.seqs = {{1, 300}, {2, 200}};
  s.paged = true;
  s.page_size = 16;
  const random_case<skim::half, skim::half> c(s, rng);
  host_index good;
  good.rows = {{0, 3, 5, 9}, {1, 2, 6}};  // row 0: sequence 0 (10 blocks), row 1: sequence 1 (7 blocks)
  good.finish(1);
  tc::device_case<skim::half, skim::half> dc(c);
  const sc::device_problem p = dc.prob(s);
  decode dec;
  dec.chunk_blocks = 2;
  // The error word of a run of each split kernel (each must report on its own).
  const auto errors = [&](const auto& kv, const auto& index, std::int32_t bound = -1) {
    std::vector<std::uint32_t> out;
    for (const decode_kernel k : kernels) {
      out.push_back(run_decode<skim::half>(with_kernel(dec, k), dc, p, kv, index, c.tokens_q(), bound).error);
    }
    return out;
  };

  SUBCASE("valid index: error word 0") {
    const device_index di(good);
    for (const std::uint32_t e : errors(dc.paged(c), di.table())) CHECK(e == 0u);
  }
  SUBCASE("id past the visible blocks") {
    host_index h;
    h.rows = {{0, 3, 5, 10}, {1, 2, 6}};
    h.finish(0);
    const device_index di(h);
    for (const std::uint32_t e : errors(dc.contiguous(s), di.table())) CHECK((e & sc::bad_block_id) != 0u);
  }
  SUBCASE("negative id") {
    host_index h;
    h.rows = {{0, 3, 5, 9}, {-1, 2, 6}};
    h.finish(0);
    const device_index di(h);
    for (const std::uint32_t e : errors(dc.contiguous(s), di.csr(7))) CHECK((e & sc::bad_block_id) != 0u);
  }
  SUBCASE("ids not increasing (within and across splits)") {
    for (const auto& row0 : {std::vector<std::int32_t>{3, 0, 5, 9}, std::vector<std::int32_t>{0, 5, 5, 9}}) {
      host_index h;
      h.rows = {row0, {1, 2, 6}};
      h.finish(0);
      const device_index di(h);
      for (const std::uint32_t e : errors(dc.contiguous(s), di.table())) CHECK((e & sc::bad_order) != 0u);
    }
  }
  SUBCASE("count past the width, and rows past index.rows") {
    device_index di(good);
    std::vector<std::int32_t> count = {good.width + 1, 3};
    di.count.upload(count);
    for (const std::uint32_t e : errors(dc.contiguous(s), di.table())) CHECK((e & sc::bad_count) != 0u);
    sc::device_block_csr short_csr = di.csr(7);
    short_csr.rows = 1;
    for (const std::uint32_t e : errors(dc.contiguous(s), short_csr)) CHECK((e & sc::bad_count) != 0u);
  }
  SUBCASE("more ids than the bound given to run") {
    const device_index di(good);
    for (const std::uint32_t e : errors(dc.contiguous(s), di.csr(7), 2)) CHECK((e & sc::bad_count) != 0u);
  }
  SUBCASE("page outside the pool") {
    const device_index di(good);
    for (const std::int32_t bad : {-1, c.num_pages}) {
      std::vector<std::int32_t> pages = c.page_indices;
      pages[0] = bad;  // sequence 0's first page: tokens 0..15, in selected block 0
      dc.page_indices.upload(pages);
      for (const std::uint32_t e : errors(dc.paged(c), di.table())) CHECK((e & sc::bad_page) != 0u);
      dc.page_indices.upload(c.page_indices);
    }
  }
}

// The automatic chunk's rule (decode.cuh; measured in docs/performance.md), at the shapes that chose
// it: 32 query heads over 8 kv heads, one query per sequence, blocks of 128.
TEST_CASE("decode automatic chunk: 64 CTAs, 128 for long rows") {
  const decode dec;
  const auto chunk = [&](std::int32_t batch, std::int32_t blocks, bool codes, std::int32_t heads_kv = 8) {
    const sc::device_problem p{.batch = batch, .heads_q = 32, .heads_kv = heads_kv, .head_dim = 128, .block_q = 1,
                               .block_kv = 128, .max_seqlen_q = 1, .max_seqlen_kv = 131072};
    INFO("batch " << batch << ", blocks " << blocks << (codes ? ", codes" : ", 16-bit") << ", kv heads " << heads_kv);
    CHECK(dec.splits(p, blocks, codes) == (blocks + dec.chunk(p, blocks, codes) - 1) / dec.chunk(p, blocks, codes));
    return dec.chunk(p, blocks, codes);
  };
  // 16-bit K/V: about 64 CTAs; rows of 64 units cut in two where each half keeps 4096 keys.
  CHECK(chunk(1, 16, false) == 2);    // 8 chunks (256 keys each, the least)
  CHECK(chunk(1, 64, false) == 8);    // 8 chunks
  CHECK(chunk(4, 16, false) == 8);    // 2 chunks
  CHECK(chunk(4, 64, false) == 32);   // 2 chunks: 128 CTAs would leave 2048 keys a chunk
  CHECK(chunk(8, 16, false) == 16);   // whole: halves of 1024 keys
  CHECK(chunk(8, 64, false) == 32);   // two halves of 4096 keys
  CHECK(chunk(16, 256, false, 4) == 128);
  CHECK(chunk(16, 16, false) == 16);  // 128 units: whole
  CHECK(chunk(8, 1024, false) == 256);  // at most 256 blocks
  // 8-bit codes: 128 CTAs where chunks keep 1024 keys, else 64.
  CHECK(chunk(1, 64, true) == 8);
  CHECK(chunk(2, 16, true) == 4);
  CHECK(chunk(2, 64, true) == 8);
  CHECK(chunk(4, 16, true) == 8);
  CHECK(chunk(4, 64, true) == 16);
  CHECK(chunk(8, 16, true) == 8);
  CHECK(chunk(1, 1024, true) == 64);  // 16 chunks: the merge kernel
  // A set chunk_blocks is taken as it is.
  decode fixed;
  fixed.chunk_blocks = 3;
  const sc::device_problem p{.batch = 8, .heads_q = 32, .heads_kv = 8, .head_dim = 128, .block_q = 1,
                             .block_kv = 128, .max_seqlen_q = 1, .max_seqlen_kv = 131072};
  CHECK(fixed.chunk(p, 64, false) == 3);
  CHECK(fixed.splits(p, 64, false) == 22);
}

TEST_CASE("decode host errors") {
  std::mt19937 rng(5);
  case_spec s;
  s.head_dim = 128;
  s.heads_kv = 2;
  s.heads_q = 8;
  s.block_q = 8;
  s.block_kv = 16;
  s.seqs = {{1, 100}, {1, 64}};
  const random_case<skim::bfloat16, skim::bfloat16> c(s, rng);
  host_index hi;
  hi.rows = {{0, 1, 2}, {3, 6}, {0, 3}, {1}};
  hi.finish(0);
  tc::device_case<skim::bfloat16, skim::bfloat16> dc(c);
  const device_index di(hi);
  sc::device_problem p = dc.prob(s);
  decode dec;
  dec.chunk_blocks = 1;

  const auto args = [&](const sc::device_problem& prob, float* o) {
    return sc::device_attention_args<skim::bfloat16, sc::device_contiguous_kv<skim::bfloat16>, sc::device_block_table, float>{
        .prob = prob,
        .q = sc::device_view<const skim::bfloat16>::token_major(dc.q.data(), prob.heads_q, prob.head_dim),
        .kv = dc.contiguous(s),
        .index = di.table(),
        .o = sc::device_view<float>::token_major(o, prob.heads_q, prob.head_dim),
        .lse = nullptr};
  };
  tc::buffer<float> o(static_cast<std::size_t>(c.tokens_q()) * s.heads_q * s.head_dim);

  SUBCASE("head_dim 96 is unsupported") {
    sc::device_problem q = p;
    q.head_dim = 96;
    const status st = dec.can_implement(q);
    CHECK(st.code() == status_code::unsupported);
    CHECK(std::string(st.message()).find("96") != std::string::npos);
    CHECK(dec.run(args(q, o.data()), {}, nullptr).code() == status_code::unsupported);
  }
  SUBCASE("more queries than max_queries is unsupported") {
    sc::device_problem q = p;
    q.max_seqlen_q = 9;
    CHECK(dec.can_implement(q).code() == status_code::unsupported);
  }
  SUBCASE("workspace too small names both sizes") {
    const std::size_t need = dec.workspace_bytes(p, hi.width);
    REQUIRE(need > 0);
    tc::buffer<std::uint8_t> ws(need);
    const status st = dec.run(args(p, o.data()), ws.bytes(need - 1), nullptr);
    CHECK(st.code() == status_code::workspace_too_small);
    CHECK(std::string(st.message()).find(std::to_string(need)) != std::string::npos);
    CHECK(std::string(st.message()).find(std::to_string(need - 1)) != std::string::npos);
    CHECK(dec.run(args(p, o.data()), {}, nullptr).code() == status_code::workspace_too_small);
    CHECK(dec.run(args(p, o.data()), ws.bytes(need), nullptr).ok());
    SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
    CHECK(dc.error_bits() == 0u);
  }
  SUBCASE("tensor_cores needs Q and K/V of one type; automatic then runs cuda_cores") {
    const sc::device_attention_args<skim::half, sc::device_contiguous_kv<skim::bfloat16>, sc::device_block_table, float>
        mixed{.prob = p,
              .q = sc::device_view<const skim::half>::token_major(reinterpret_cast<const skim::half*>(dc.q.data()),
                                                                   p.heads_q, p.head_dim),
              .kv = dc.contiguous(s),
              .index = di.table(),
              .o = sc::device_view<float>::token_major(o.data(), p.heads_q, p.head_dim),
              .lse = nullptr};
    const std::size_t need = dec.workspace_bytes(p, hi.width);
    tc::buffer<std::uint8_t> ws(need);
    const status st = with_kernel(dec, decode_kernel::tensor_cores).run(mixed, ws.bytes(need), nullptr);
    CHECK(st.code() == status_code::unsupported);
    CHECK(std::string(st.message()).find("one type") != std::string::npos);
    CHECK(with_kernel(dec, decode_kernel::automatic).run(mixed, ws.bytes(need), nullptr).ok());
    SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
    CHECK(dc.error_bits() == 0u);
  }
  SUBCASE("misaligned K/V stride") {
    auto a = args(p, o.data());
    a.kv.head_stride = 132;
    a.kv.token_stride = 132 * 2;
    CHECK(dec.run(a, {}, nullptr).code() == status_code::misaligned);
  }
}

template <class T, class Code>
void random_quantized_case(std::uint32_t seed) {
  std::mt19937 rng(seed);
  const case_spec s = random_decode_spec(rng);
  quantized_case<T, Code>(s, rng, seed);
}

// Quantised K/V (int8, fp8 e4m3) under bf16 and fp16 Q, both split kernels: random shapes, both
// sources and layouts, scales per block or per head, against the reference over the dequantised values.
TEST_CASE_TEMPLATE("decode quantized K/V against reference", Code, std::int8_t, skim::fp8_e4m3) {
  const std::uint32_t base = std::is_same_v<Code, std::int8_t> ? 3000 : 3100;
  for (std::uint32_t i = 0; i < 12; ++i) random_quantized_case<skim::bfloat16, Code>(base + i);
  for (std::uint32_t i = 0; i < 12; ++i) random_quantized_case<skim::half, Code>(base + 50 + i);
}

// A small fixed quantised case for compute-sanitizer: both codes and kernels, both sources, partial
// blocks, decode and speculative rows, several splits.
TEST_CASE("decode small quantized: both codes, kernels and sources") {
  for (const bool paged : {false, true}) {
    for (const std::int32_t d : {64, 128}) {
      std::mt19937 rng(31u + static_cast<std::uint32_t>(d) + (paged ? 1u : 0u));
      case_spec s;
      s.head_dim = d;
      s.heads_kv = 2;
      s.heads_q = 8;
      s.block_q = 8;
      s.block_kv = 16;
      s.seqs = {{1, 50}, {3, 37}, {0, 20}, {1, 16}};
      s.paged = paged;
      s.page_size = 24;
      quantized_case<skim::bfloat16, skim::fp8_e4m3>(s, rng, 0);
      quantized_case<skim::half, std::int8_t>(s, rng, 0);
    }
  }
}

TEST_CASE("decode quantized host errors: scales, alignment") {
  std::mt19937 rng(11);
  case_spec s;
  s.head_dim = 64;
  s.heads_kv = 2;
  s.heads_q = 8;
  s.block_q = 1;
  s.block_kv = 16;
  s.seqs = {{1, 70}, {1, 33}};
  const random_case<skim::bfloat16, skim::bfloat16> c(s, rng);
  host_index hi;
  hi.rows = {{0, 2}, {1, 4}, {0, 1}, {2}};
  hi.finish(0);
  tc::device_case<skim::bfloat16, skim::bfloat16> dc(c);
  const device_index di(hi);
  const sc::device_problem p = dc.prob(s);
  const tc::buffer<skim::fp8_e4m3> k8(c.k.size()), v8(c.k.size());
  const tc::buffer<float> scales(static_cast<std::size_t>(s.heads_kv));
  using source = sc::device_contiguous_kv<skim::fp8_e4m3>;
  const source codes{.k = k8.data(), .v = v8.data(), .token_stride = s.heads_kv * s.head_dim, .head_stride = s.head_dim};
  tc::buffer<float> o(static_cast<std::size_t>(c.tokens_q()) * s.heads_q * s.head_dim);
  const auto args = [&](const sc::device_quantized_kv<source>& kv) {
    return sc::device_attention_args<skim::bfloat16, sc::device_quantized_kv<source>, sc::device_block_table, float>{
        .prob = p,
        .q = sc::device_view<const skim::bfloat16>::token_major(dc.q.data(), p.heads_q, p.head_dim),
        .kv = kv,
        .index = di.table(),
        .o = sc::device_view<float>::token_major(o.data(), p.heads_q, p.head_dim),
        .lse = nullptr};
  };
  const auto kv = sc::device_quantized_kv<source>::per_head(codes, scales.data(), scales.data());
  decode dec;
  const std::size_t need = dec.workspace_bytes(p, hi.width);
  tc::buffer<std::uint8_t> ws(std::max<std::size_t>(need, 1));
  auto null_scales = kv;
  null_scales.v_scales = nullptr;
  const status ns = dec.run(args(null_scales), ws.bytes(need), nullptr);
  CHECK(ns.code() == status_code::invalid_argument);
  CHECK(std::string(ns.message()).find("scales") != std::string::npos);
  auto negative = kv;
  negative.scale_block_stride = -1;
  CHECK(dec.run(args(negative), ws.bytes(need), nullptr).code() == status_code::invalid_argument);
  auto misaligned = kv;
  misaligned.codes.token_stride = s.heads_kv * s.head_dim + 4;
  CHECK(dec.run(args(misaligned), ws.bytes(need), nullptr).code() == status_code::misaligned);
  CHECK(dec.run(args(kv), ws.bytes(need), nullptr).ok());
  SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
  CHECK(dc.error_bits() == 0u);
}
