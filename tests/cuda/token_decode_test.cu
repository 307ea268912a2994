// cuda::token_decode against exec::reference (CPU, double) on random decode shapes: 0..4 queries per
// sequence (decode and speculative rows, empty sequences), GQA groups 1/4/8, odd head dims up to 256,
// contiguous and paged K/V (token-major or head-major), both index scopes, bf16, fp16 and fp32
// inputs, 16-bit and fp32 outputs, empty rows and dense rows (every visible key listed). The
// reference reads the list as a block index with block_kv = 1 (a key block per token), so it is
// exactly the double-precision softmax over the listed keys. Also: bit-identical reruns, every output
// written (buffers start as NaN), the device error word for bad positions / order / counts / pages,
// host errors. Quantised K/V (int8 and fp8 e4m3 codes with scales per block or per head,
// support/quantized_case.hpp) against the same reference over the dequantised fp32 K/V.
//
// Run only these: skim_cuda_tests -tc='token_decode*'
#include "cuda/support.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "skim/exec/cpu/reference.hpp"
#include "skim/exec/cuda/token_decode.cuh"
#include "skim/index/block_table.hpp"
#include "support/executor_cases.hpp"
#include "support/quantized_case.hpp"
#include "support/random_case.hpp"

namespace {

using namespace skim;
using namespace skim::test;
namespace sc = skim::cuda;
namespace tc = skim::test::cuda;

case_spec random_token_spec(std::mt19937& rng) {
  case_spec s;
  s.head_dim = pick(rng, {1, 3, 32, 33, 64, 100, 128, 256});
  s.heads_kv = uniform(rng, 1, 2);
  s.heads_q = s.heads_kv * pick(rng, {1, 4, 8});
  s.block_q = pick(rng, {1, 1, 2, 4});
  s.block_kv = 16;  // not read by token_decode
  s.mask = chance(rng, 0.85) ? mask_kind::causal : mask_kind::none;
  s.scope = chance(rng, 0.7) ? index_scope::kv_head : index_scope::query_head;
  s.softmax_scale = chance(rng, 0.5) ? 0.0f
                                     : std::uniform_real_distribution<float>(0.3f, 3.0f)(rng) /
                                           std::sqrt(static_cast<float>(s.head_dim));
  const std::int32_t batch = uniform(rng, 1, 5);
  s.seqs.clear();
  for (std::int32_t b = 0; b < batch; ++b) {
    const int kind = uniform(rng, 0, 9);
    const std::int32_t q = kind == 0 ? 0 : (kind <= 6 ? 1 : uniform(rng, 2, 4));
    const int kv_kind = uniform(rng, 0, 9);
    const std::int32_t kv = kv_kind == 0 ? 0 : (kv_kind == 1 ? uniform(rng, 0, 8) : uniform(rng, 1, 1500));
    s.seqs.push_back({q, kv});
  }
  // At least one query and one key in the batch: the executors take no null Q or K/V (nor page
  // table), and an empty tensor's buffer here is null. Empty sequences stay, inside the batch.
  std::int32_t all_q = 0, all_kv = 0;
  for (const auto& l : s.seqs) all_q += l.q, all_kv += l.kv;
  if (all_q == 0) s.seqs[0].q = 1;
  if (all_kv == 0) s.seqs[0].kv = 1;
  s.paged = chance(rng, 0.5);
  s.page_size = pick(rng, {1, 8, 16, 17, 64});
  s.kv_head_major = chance(rng, 0.5);
  return s;
}

// Rows of ascending positions (problem row order), with a list and a block_kv = 1 table of them.
struct host_list {
  std::vector<std::vector<std::int32_t>> rows;
  std::vector<std::int32_t> positions, count;
  std::int32_t width = 0;

  void finish(std::int32_t pad) {
    width = pad;
    for (const auto& r : rows) width = std::max(width, static_cast<std::int32_t>(r.size()) + pad);
    positions.clear();
    count.clear();
    for (const auto& r : rows) {
      count.push_back(static_cast<std::int32_t>(r.size()));
      for (std::int32_t j = 0; j < width; ++j) positions.push_back(j < static_cast<std::int32_t>(r.size()) ? r[j] : -1);
    }
  }
};

// Per row: empty, a few positions, about half, or every visible key (dense).
host_list random_list(const problem& p, std::mt19937& rng) {
  host_list h;
  REQUIRE(for_each_row(p, [&](const row_info& r) {
            const std::int32_t v = r.visible_keys(r.q_end - 1, p.mask);
            const double density = pick(rng, {0.0, 0.01, 0.1, 0.5, 1.0});
            std::bernoulli_distribution keep(density);
            std::vector<std::int32_t> row;
            for (std::int32_t j = 0; j < v; ++j) {
              if (keep(rng)) row.push_back(j);
            }
            h.rows.push_back(row);
          }).ok());
  h.finish(uniform(rng, 0, 2));
  return h;
}

struct device_list {
  tc::buffer<std::int32_t> positions, count;
  std::int32_t width = 0;
  std::int64_t rows = 0;
  explicit device_list(const host_list& h)
      : positions(std::max<std::size_t>(h.positions.size(), 1)), count(std::max<std::size_t>(h.count.size(), 1)),
        width(h.width), rows(static_cast<std::int64_t>(h.rows.size())) {
    upload(positions, h.positions);
    upload(count, h.count);
  }
  static void upload(tc::buffer<std::int32_t>& b, const std::vector<std::int32_t>& v) {
    if (!v.empty()) SKIM_CUDA_REQUIRE(cudaMemcpy(b.data(), v.data(), v.size() * 4, cudaMemcpyHostToDevice));
  }
  [[nodiscard]] sc::device_token_list view() const {
    return {.positions = positions.data(), .count = count.data(), .width = width, .rows = rows};
  }
};

// The reference over exactly the listed keys: the list read as a block_table of a problem with one
// key per block (block_kv = 1), the same rows and the same causal mask.
// kv: c's own K/V, or (quantised cases) the dequantised fp32 K/V.
template <class TQ, class TKV, class KV>
void reference_output(const random_case<TQ, TKV>& c, const host_list& h, const KV& kv, output<float>& ref) {
  problem p = c.prob();
  p.block_kv = 1;
  const index::block_table table{h.positions, h.count, h.width};
  REQUIRE(table.validate(p).ok());
  const attention_args<TQ, KV, index::block_table, float> ra{
      .prob = p, .q = c.q_view(), .kv = kv, .index = table, .o = ref.view, .lse = ref.lse};
  const status st = exec::reference{}.run(ra, {});
  INFO("reference: " << std::string(st.message()));
  REQUIRE(st.ok());
}
template <class TQ, class TKV>
void reference_output(const random_case<TQ, TKV>& c, const host_list& h, output<float>& ref) {
  reference_output(c, h, c.contiguous(), ref);
}

// One run into fresh NaN-poisoned O / lse.
template <class TO, class TQ, class TKV, class KV>
tc::gpu_output<TO> run_tokens(const sc::token_decode& dec, tc::device_case<TQ, TKV>& dc, const sc::device_problem& p,
                              const KV& kv, const sc::device_token_list& list, std::int32_t tokens_q) {
  const std::size_t n = static_cast<std::size_t>(std::max(tokens_q, 1)) * p.heads_q * p.head_dim;
  tc::buffer<TO> o(n);
  tc::buffer<float> lse(static_cast<std::size_t>(std::max(tokens_q, 1)) * p.heads_q);
  const sc::device_token_args<TQ, KV, TO> a{
      .prob = p,
      .q = sc::device_view<const TQ>::token_major(dc.q.data(), p.heads_q, p.head_dim),
      .kv = kv,
      .tokens = list,
      .o = sc::device_view<TO>::token_major(o.data(), p.heads_q, p.head_dim),
      .lse = lse.data()};
  const status st = dec.run(a, {}, nullptr);
  INFO("run: " << std::string(st.message()));
  REQUIRE(st.ok());
  SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
  return tc::gpu_output<TO>::fetch(o, lse, static_cast<std::size_t>(tokens_q) * p.heads_q, p.head_dim, dc.error_bits());
}

// fp32 accumulation against double, plus the output's rounding.
template <class TO>
[[nodiscard]] constexpr double tolerance() {
  return std::is_same_v<TO, float> ? 1e-4 : (std::is_same_v<TO, skim::half> ? 2e-3 : 1.2e-2);
}

template <class TQ, class TKV, class F>
void with_kv(const random_case<TQ, TKV>& c, const tc::device_case<TQ, TKV>& dc, F&& f) {
  if (c.spec.paged) {
    f(dc.paged(c));
  } else {
    f(dc.contiguous(c.spec));
  }
}

// ---------------------------------------------------------------------------------------------
// Quantised K/V: 8-bit codes with scales per (sequence, block, kv head) or per kv head.

// Decode and speculative shapes for quantised K/V: even and odd head dims, GQA 1/2/4, varlen batches
// of 1..max_queries queries (and empty sequences), key blocks that end partial, both layouts.
case_spec random_quantized_token_spec(std::mt19937& rng, std::int32_t max_queries) {
  case_spec s = random_token_spec(rng);
  s.head_dim = pick(rng, {33, 40, 57, 64, 72, 96, 128, 256});
  s.heads_q = s.heads_kv * pick(rng, {1, 2, 4});
  s.block_kv = pick(rng, {16, 17, 32, 64});  // the scales' key blocks
  for (auto& l : s.seqs) {
    if (l.q > 0) l.q = uniform(rng, 1, max_queries);
  }
  if (s.block_q > max_queries) s.block_q = max_queries;
  return s;
}

// The codes and scales of a quantized_host on the device, in the layout c.spec asks for, as
// device_quantized_kv sources over dc's strides and page table.
template <class Code>
struct device_codes {
  tc::buffer<Code> k, v, k_pages, v_pages;
  tc::buffer<float> k_scales, v_scales;
  std::int64_t seq_stride = 0, block_stride = 0, head_stride = 1;

  template <class T>
  device_codes(const random_case<T, T>& c, const quantized_host<Code>& qh)
      : k(stored(c, qh.k, false)), v(stored(c, qh.v, false)), k_pages(stored(c, qh.k_pages, true)),
        v_pages(stored(c, qh.v_pages, true)), k_scales(qh.k_scales), v_scales(qh.v_scales),
        seq_stride(qh.seq_stride), block_stride(qh.block_stride), head_stride(qh.head_stride) {}

  template <class T>
  [[nodiscard]] static std::vector<Code> stored(const random_case<T, T>& c, const std::vector<Code>& x, bool pages) {
    if (!c.spec.kv_head_major) return x;
    const std::int64_t d = c.spec.head_dim, h = c.spec.heads_kv;
    const std::int64_t tokens = pages ? c.spec.page_size : static_cast<std::int64_t>(x.size()) / (d * h);
    return heads_outside(x, pages ? c.num_pages : 1, tokens, h, d);
  }
  template <class Source>
  [[nodiscard]] sc::device_quantized_kv<Source> quantize(const Source& codes) const {
    return {codes, k_scales.data(), v_scales.data(), seq_stride, block_stride, head_stride};
  }
  template <class T>
  [[nodiscard]] auto contiguous(const tc::device_case<T, T>& dc, const case_spec& s) const {
    const auto cs = dc.contiguous(s);
    return quantize(sc::device_contiguous_kv<Code>{.k = k.data(), .v = v.data(), .token_stride = cs.token_stride,
                                                   .head_stride = cs.head_stride});
  }
  template <class T>
  [[nodiscard]] auto paged(const tc::device_case<T, T>& dc, const random_case<T, T>& c) const {
    const auto ps = dc.paged(c);
    return quantize(sc::device_paged_kv<Code>{.k_pages = k_pages.data(), .v_pages = v_pages.data(),
                                              .num_pages = ps.num_pages, .page_size = ps.page_size,
                                              .page_stride = ps.page_stride, .token_stride = ps.token_stride,
                                              .head_stride = ps.head_stride, .page_indptr = ps.page_indptr,
                                              .page_indices = ps.page_indices});
  }
};

// One case with Q of type TQ, output TO and K/V quantised to Code, on the contiguous and the paged
// source, against the reference over the dequantised fp32 K/V and the same list.
template <class TQ, class TO, class Code>
void quantized_token_case(const case_spec& s, std::mt19937& rng, std::uint32_t seed) {
  const random_case<TQ, TQ> c(s, rng);
  const host_list hl = random_list(c.prob(), rng);
  tc::device_case<TQ, TQ> dc(c);
  const device_list dl(hl);
  const sc::device_problem p = dc.prob(s);
  const bool per_block = chance(rng, 0.6);
  const std::int32_t max_blocks = p.max_kv_blocks() + uniform(rng, 0, 2);
  const quantized_host<Code> qh(c, rng, per_block, max_blocks);
  const device_codes<Code> codes(c, qh);
  INFO("seed " << seed << ": " << s.describe() << (per_block ? ", scales per block" : ", scales per head"));
  const sc::token_decode dec;
  REQUIRE(dec.can_implement(p).ok());

  output<float> ref(c.spec, c.tokens_q());
  const std::int32_t tokens_kv = c.cu_kv.back();
  const contiguous_kv<float> rkv{
      .k = strided_view<const float>::token_major(qh.kf.data(), tokens_kv, s.heads_kv, s.head_dim),
      .v = strided_view<const float>::token_major(qh.vf.data(), tokens_kv, s.heads_kv, s.head_dim),
      .cu_seqlens_kv = {}};
  reference_output(c, hl, rkv, ref);

  const auto check = [&](const auto& kv, const char* source) {
    INFO("source " << source);
    const auto g = run_tokens<TO>(dec, dc, p, kv, dl.view(), c.tokens_q());
    CHECK(g.error == 0u);
    tc::check_against(s, g, ref, c.tokens_q(), tolerance<TO>(), 1e-4);
    const auto again = run_tokens<TO>(dec, dc, p, kv, dl.view(), c.tokens_q());
    CHECK(std::memcmp(g.o.data(), again.o.data(), g.o.size() * sizeof(TO)) == 0);
    CHECK(std::memcmp(g.lse.data(), again.lse.data(), g.lse.size() * sizeof(float)) == 0);
  };
  check(codes.contiguous(dc, s), "contiguous");
  check(codes.paged(dc, c), "paged");
}

}  // namespace

TEST_CASE_TEMPLATE("token_decode random shapes against reference", Types,
                   types<skim::bfloat16, skim::bfloat16, skim::bfloat16>, types<skim::half, skim::half, float>,
                   types<float, float, float>, types<skim::bfloat16, skim::half, skim::half>) {
  using TQ = typename Types::q;
  using TKV = typename Types::kv;
  using TO = typename Types::o;
  for (int trial = 0; trial < 12; ++trial) {
    const std::uint32_t seed = next_seed();
    std::mt19937 rng(seed);
    const case_spec s = random_token_spec(rng);
    INFO("seed " << seed << ": " << s.describe());
    const random_case<TQ, TKV> c(s, rng);
    const host_list hl = random_list(c.prob(), rng);
    tc::device_case<TQ, TKV> dc(c);
    const device_list dl(hl);
    const sc::device_problem p = dc.prob(s);
    const sc::token_decode dec;
    REQUIRE(dec.can_implement(p).ok());
    output<float> ref(c.spec, c.tokens_q());
    reference_output(c, hl, ref);
    with_kv(c, dc, [&](const auto& kv) {
      const auto g = run_tokens<TO>(dec, dc, p, kv, dl.view(), c.tokens_q());
      CHECK(g.error == 0u);
      tc::check_against(s, g, ref, c.tokens_q(), tolerance<TO>(), 1e-4);
      const auto again = run_tokens<TO>(dec, dc, p, kv, dl.view(), c.tokens_q());
      CHECK(std::memcmp(g.o.data(), again.o.data(), g.o.size() * sizeof(TO)) == 0);
      CHECK(std::memcmp(g.lse.data(), again.lse.data(), g.lse.size() * sizeof(float)) == 0);
    });
  }
}

// Quantised K/V (int8, fp8 e4m3) under bf16 Q (fp32 O) and fp16 Q (fp16 O): random decode and
// speculative shapes, both sources and layouts, scales per block or per head.
TEST_CASE_TEMPLATE("token_decode quantized K/V against reference", Code, std::int8_t, skim::fp8_e4m3) {
  const sc::token_decode dec;
  for (int trial = 0; trial < 10; ++trial) {
    const std::uint32_t seed = next_seed();
    std::mt19937 rng(seed);
    const case_spec s = random_quantized_token_spec(rng, dec.max_queries);
    if (trial % 2 == 0) {
      quantized_token_case<skim::bfloat16, float, Code>(s, rng, seed);
    } else {
      quantized_token_case<skim::half, skim::half, Code>(s, rng, seed);
    }
  }
}

// A small fixed quantised case for compute-sanitizer: both codes, both sources, both layouts,
// partial blocks, decode and speculative rows, an odd head dim.
TEST_CASE("token_decode small quantized: both codes and sources") {
  for (const std::int32_t d : {72, 128}) {
    for (const bool head_major : {false, true}) {
      std::mt19937 rng(41u + static_cast<std::uint32_t>(d) + (head_major ? 1u : 0u));
      case_spec s;
      s.head_dim = d;
      s.heads_kv = 2;
      s.heads_q = 8;
      s.block_q = 4;
      s.block_kv = 16;
      s.seqs = {{1, 50}, {3, 37}, {0, 20}, {1, 16}};
      s.page_size = 24;
      s.kv_head_major = head_major;
      quantized_token_case<skim::bfloat16, float, skim::fp8_e4m3>(s, rng, 0);
      quantized_token_case<skim::half, skim::half, std::int8_t>(s, rng, 0);
    }
  }
}

TEST_CASE("token_decode bad list content is skipped and reported") {
  std::mt19937 rng(92);
  case_spec s;
  s.head_dim = 128;
  s.heads_kv = 1;
  s.heads_q = 4;
  s.block_q = 1;
  s.seqs = {{1, 300}, {1, 200}};
  s.paged = true;
  s.page_size = 16;
  const random_case<skim::half, skim::half> c(s, rng);
  tc::device_case<skim::half, skim::half> dc(c);
  const sc::device_problem p = dc.prob(s);
  const sc::token_decode dec;
  const auto error_of = [&](const std::vector<std::vector<std::int32_t>>& rows, bool paged = false) {
    host_list h;
    h.rows = rows;
    h.finish(1);
    const device_list dl(h);
    return paged ? run_tokens<float>(dec, dc, p, dc.paged(c), dl.view(), c.tokens_q()).error
                 : run_tokens<float>(dec, dc, p, dc.contiguous(s), dl.view(), c.tokens_q()).error;
  };
  const std::vector<std::vector<std::int32_t>> good{{0, 17, 299}, {3, 4, 199}};
  CHECK(error_of(good) == 0u);
  CHECK(error_of(good, true) == 0u);
  CHECK((error_of({{0, 17, 300}, {3, 4, 199}}) & sc::bad_block_id) != 0u);  // past the sequence
  CHECK((error_of({{0, 17, 299}, {-1, 4, 199}}) & sc::bad_block_id) != 0u);
  CHECK((error_of({{0, 17, 299}, {3, 200}}) & sc::bad_block_id) != 0u);  // another sequence's length
  CHECK((error_of({{17, 0, 299}, {3, 4, 199}}) & sc::bad_order) != 0u);
  CHECK((error_of({{0, 17, 17}, {3, 4, 199}}) & sc::bad_order) != 0u);
  SUBCASE("count past the width, rows past the list") {
    host_list h;
    h.rows = good;
    h.finish(0);
    device_list dl(h);
    std::vector<std::int32_t> count = {h.width + 1, 3};
    dl.count.upload(count);
    CHECK((run_tokens<float>(dec, dc, p, dc.contiguous(s), dl.view(), c.tokens_q()).error & sc::bad_count) != 0u);
    device_list short_list(h);
    sc::device_token_list v = short_list.view();
    v.rows = 1;
    CHECK((run_tokens<float>(dec, dc, p, dc.contiguous(s), v, c.tokens_q()).error & sc::bad_count) != 0u);
  }
  SUBCASE("page outside the pool") {
    for (const std::int32_t bad : {-1, c.num_pages}) {
      std::vector<std::int32_t> pages = c.page_indices;
      pages[1] = bad;  // sequence 0's tokens 16..31: position 17 is listed
      dc.page_indices.upload(pages);
      CHECK((error_of(good, true) & sc::bad_page) != 0u);
      dc.page_indices.upload(c.page_indices);
    }
  }
  SUBCASE("quantised source: the same checks; a skipped position reads no scale") {
    // Scales per block with no spare room: a skipped position far past the sequence would read far
    // outside them (compute-sanitizer would see it).
    const quantized_host<std::int8_t> qh(c, rng, true, p.max_kv_blocks());
    const device_codes<std::int8_t> codes(c, qh);
    const auto q_error_of = [&](const std::vector<std::vector<std::int32_t>>& rows, bool paged) {
      host_list h;
      h.rows = rows;
      h.finish(1);
      const device_list dl(h);
      return paged ? run_tokens<float>(dec, dc, p, codes.paged(dc, c), dl.view(), c.tokens_q()).error
                   : run_tokens<float>(dec, dc, p, codes.contiguous(dc, s), dl.view(), c.tokens_q()).error;
    };
    CHECK(q_error_of(good, false) == 0u);
    CHECK(q_error_of(good, true) == 0u);
    CHECK((q_error_of({{0, 17, 1 << 24}, {3, 4, 199}}, false) & sc::bad_block_id) != 0u);
    CHECK((q_error_of({{0, 17, 299}, {-(1 << 24), 4, 199}}, true) & sc::bad_block_id) != 0u);
    CHECK((q_error_of({{17, 0, 299}, {3, 4, 199}}, true) & sc::bad_order) != 0u);
    std::vector<std::int32_t> pages = c.page_indices;
    pages[1] = c.num_pages;  // sequence 0's tokens 16..31: position 17 is listed
    dc.page_indices.upload(pages);
    CHECK((q_error_of(good, true) & sc::bad_page) != 0u);
    dc.page_indices.upload(c.page_indices);
  }
}

TEST_CASE("token_decode host errors") {
  std::mt19937 rng(6);
  case_spec s;
  s.head_dim = 64;
  s.heads_kv = 2;
  s.heads_q = 8;
  s.block_q = 1;
  s.seqs = {{1, 100}, {1, 64}};
  const random_case<skim::bfloat16, skim::bfloat16> c(s, rng);
  host_list hl;
  hl.rows = {{0, 1, 2}, {3, 6}, {0, 3}, {1}};
  hl.finish(0);
  tc::device_case<skim::bfloat16, skim::bfloat16> dc(c);
  const device_list dl(hl);
  const sc::device_problem p = dc.prob(s);
  tc::buffer<float> o(static_cast<std::size_t>(c.tokens_q()) * s.heads_q * s.head_dim);
  const auto args = [&](const sc::device_problem& prob) {
    return sc::device_token_args<skim::bfloat16, sc::device_contiguous_kv<skim::bfloat16>, float>{
        .prob = prob,
        .q = sc::device_view<const skim::bfloat16>::token_major(dc.q.data(), prob.heads_q, prob.head_dim),
        .kv = dc.contiguous(s),
        .tokens = dl.view(),
        .o = sc::device_view<float>::token_major(o.data(), prob.heads_q, prob.head_dim),
        .lse = nullptr};
  };
  const sc::token_decode dec;
  CHECK(dec.run(args(p), {}, nullptr).ok());
  SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
  CHECK(dc.error_bits() == 0u);

  sc::device_problem wide = p;
  wide.head_dim = 300;
  CHECK(std::string(dec.can_implement(wide).message()) == "cuda::token_decode: head_dim 300 > 256");
  sc::device_problem long_q = p;
  long_q.max_seqlen_q = 9;
  CHECK(dec.can_implement(long_q).code() == status_code::unsupported);
  auto a = args(p);
  a.tokens.width = -1;
  CHECK(std::string(dec.run(a, {}, nullptr).message()) == "token_list width -1 < 0");
  a = args(p);
  a.tokens.positions = nullptr;
  CHECK(dec.run(a, {}, nullptr).code() == status_code::invalid_argument);
  a = args(p);
  a.tokens.rows = -2;
  CHECK(std::string(dec.run(a, {}, nullptr).message()) == "token_list rows -2 < 0");
  a = args(p);
  a.o.data = nullptr;
  CHECK(dec.run(a, {}, nullptr).code() == status_code::invalid_argument);

  SUBCASE("quantised source: scales") {
    std::vector<std::int8_t> k8(c.k.size()), v8(c.k.size());
    for (auto* x : {&k8, &v8}) {
      for (std::int8_t& e : *x) e = random_code<std::int8_t>(rng);
    }
    std::vector<float> scales(static_cast<std::size_t>(s.heads_kv));
    for (float& x : scales) x = std::uniform_real_distribution<float>(0.01f, 0.05f)(rng);
    const tc::buffer<std::int8_t> kb(k8), vb(v8);
    const tc::buffer<float> sb(scales);
    using source = sc::device_contiguous_kv<std::int8_t>;
    using quantized = sc::device_quantized_kv<source>;
    const source codes{.k = kb.data(), .v = vb.data(), .token_stride = s.heads_kv * s.head_dim, .head_stride = s.head_dim};
    const auto qargs = [&](const quantized& kv) {
      return sc::device_token_args<skim::bfloat16, quantized, float>{
          .prob = p,
          .q = sc::device_view<const skim::bfloat16>::token_major(dc.q.data(), p.heads_q, p.head_dim),
          .kv = kv,
          .tokens = dl.view(),
          .o = sc::device_view<float>::token_major(o.data(), p.heads_q, p.head_dim),
          .lse = nullptr};
    };
    const quantized kv = quantized::per_head(codes, sb.data(), sb.data());
    for (const bool k_side : {true, false}) {
      quantized null_scales = kv;
      (k_side ? null_scales.k_scales : null_scales.v_scales) = nullptr;
      const status ns = dec.run(qargs(null_scales), {}, nullptr);
      CHECK(ns.code() == status_code::invalid_argument);
      CHECK(std::string(ns.message()).find("scales") != std::string::npos);
    }
    quantized negative = kv;
    negative.scale_seq_stride = -1;
    CHECK(dec.run(qargs(negative), {}, nullptr).code() == status_code::invalid_argument);
    quantized misaligned = kv;  // never read: the check fails first
    misaligned.v_scales = reinterpret_cast<const float*>(reinterpret_cast<std::uintptr_t>(sb.data()) + 2);
    CHECK(dec.run(qargs(misaligned), {}, nullptr).code() == status_code::misaligned);
    quantized null_codes = kv;
    null_codes.codes.k = nullptr;
    CHECK(dec.run(qargs(null_codes), {}, nullptr).code() == status_code::invalid_argument);
    CHECK(dec.run(qargs(kv), {}, nullptr).ok());
    SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
    CHECK(dc.error_bits() == 0u);
  }
}
