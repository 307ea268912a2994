// skim::cuda::prefill against exec::reference (CPU, double) on the same random cases and
// the same host-built selections, each case through every kernel that applies to it (mma_sync
// always; wgmma on an sm_90 device for block_q 128 and contiguous K/V): every supported tile shape,
// bf16 and fp16, fp32 and 16-bit
// outputs, contiguous and paged K/V (token-major or head-major), block_table and block_csr, the implicit indices (causal_all,
// sink + window) and unions of a table or CSR with a sink and a window, both index scopes, GQA 1/4/8,
// varlen batches with empty sequences, partial query and key blocks, q_len < kv_len (prefix
// caching), q_len == kv_len, q_len > kv_len, causal and no mask. Outputs are NaN-poisoned with a
// guard past their end, so a row not written or a write past the view fails. Cases named *small*
// also run under compute-sanitizer (scripts/cuda sanitize).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/support.cuh"
#include "skim/exec/cpu/reference.hpp"
#include "skim/exec/cuda/prefill.cuh"
#include "skim/index/block_union.hpp"
#include "skim/index/causal_all.hpp"
#include "skim/index/head_shared.hpp"
#include "skim/index/sink.hpp"
#include "skim/index/sliding_window.hpp"
#include "support/compare.hpp"
#include "support/executor_cases.hpp"
#include "support/quantized_case.hpp"
#include "support/random_case.hpp"

namespace {

using namespace skim;
using namespace skim::test;
using f16 = skim::half;  // not CUDA's ::half
using bf16 = skim::bfloat16;
namespace tc = skim::test::cuda;

enum class index_form { table, csr };
using skim::cuda::prefill_kernel;

const char* name_of(prefill_kernel k) { return k == prefill_kernel::wgmma ? "wgmma" : "mma_sync"; }

// The kernels a case runs through: mma_sync always, wgmma where it applies on this device.
std::vector<prefill_kernel> kernels_for(const case_spec& s) {
  std::vector<prefill_kernel> k{prefill_kernel::mma_sync};
  if (tc::is_sm90() && s.block_q == 128 && !s.paged) k.push_back(prefill_kernel::wgmma);
  return k;
}

// P is rounded to the input type before P·V, and O to TO: per-row relative L2 error bounds.
template <class T>
inline constexpr double prefill_tolerance = std::is_same_v<T, bf16> ? 2e-2 : 5e-3;
inline constexpr double lse_tolerance = 5e-3;  // relative to max(1, |lse|) (compare.hpp)

// A shape the prefill kernels implement: head_dim, block_q, block_kv in {64, 128}. `work` bounds
// tokens_q · tokens_kv · heads_q · head_dim so the double reference stays quick.
case_spec prefill_spec(std::mt19937& rng, double work) {
  case_spec s;
  s.head_dim = pick(rng, {64, 128});
  s.heads_kv = uniform(rng, 1, 2);
  s.heads_q = s.heads_kv * pick(rng, {1, 4, 8});
  s.block_q = pick(rng, {64, 128});
  s.block_kv = pick(rng, {64, 128});
  s.mask = chance(rng, 0.7) ? mask_kind::causal : mask_kind::none;
  s.scope = chance(rng, 0.75) ? index_scope::kv_head : index_scope::query_head;
  s.softmax_scale = chance(rng, 0.5) ? 0.0f
                                     : std::uniform_real_distribution<float>(0.3f, 3.0f)(rng) /
                                           std::sqrt(static_cast<float>(s.head_dim));
  const std::int32_t batch = uniform(rng, 1, 4);
  const double per_seq = work / (static_cast<double>(s.heads_q) * s.head_dim * batch);
  const std::int32_t max_len = std::clamp(static_cast<std::int32_t>(std::sqrt(per_seq)), 2, 1200);
  s.seqs.clear();
  for (std::int32_t b = 0; b < batch; ++b) {
    sequence_lengths l;
    l.kv = uniform(rng, 1, max_len);
    switch (uniform(rng, 0, 9)) {
      case 0: l = {0, chance(rng, 0.5) ? 0 : l.kv}; break;  // empty sequence (queries, and maybe keys)
      case 1: l.q = 1; break;                                // decode row
      case 2:                                                // more queries than keys
        l.q = uniform(rng, 1, max_len);
        l.kv = uniform(rng, 0, std::max(0, l.q - 1));
        break;
      case 3:  // whole blocks on both sides
        l.q = s.block_q * uniform(rng, 1, std::max(1, max_len / s.block_q));
        l.kv = l.q + s.block_kv * uniform(rng, 0, 2);
        break;
      case 4: case 5: case 6: l.q = l.kv; break;  // plain prefill
      default: l.q = uniform(rng, 1, l.kv); break;  // prefix caching: fewer queries than keys
    }
    s.seqs.push_back(l);
  }
  s.paged = chance(rng, 0.5);
  s.page_size = pick(rng, {1, 8, 16, 17, 64, 128, 256});
  s.q_head_major = chance(rng, 0.25);
  s.o_head_major = chance(rng, 0.25);
  s.kv_head_major = chance(rng, 0.5);
  return s;
}

// A host selection (CSR rows) and its device forms: CSR, and a table `extra` columns wider than
// the longest row (padding past count is -1, never read).
struct device_index {
  tc::buffer<std::int32_t> row_ptr, col_idx, ids, count;
  std::int32_t width = 0;
  std::int64_t rows = 0;

  device_index(const csr_storage& csr, std::int32_t extra) : row_ptr(csr.row_ptr), col_idx(csr.col_idx) {
    rows = static_cast<std::int64_t>(csr.row_ptr.size()) - 1;
    for (std::int64_t r = 0; r < rows; ++r) width = std::max(width, csr.row_ptr[r + 1] - csr.row_ptr[r]);
    width += extra;
    std::vector<std::int32_t> host_ids(static_cast<std::size_t>(rows * width), -1), host_count(static_cast<std::size_t>(rows));
    for (std::int64_t r = 0; r < rows; ++r) {
      host_count[r] = csr.row_ptr[r + 1] - csr.row_ptr[r];
      std::copy(csr.col_idx.begin() + csr.row_ptr[r], csr.col_idx.begin() + csr.row_ptr[r + 1],
                host_ids.begin() + r * width);
    }
    ids = tc::buffer<std::int32_t>(host_ids);
    count = tc::buffer<std::int32_t>(host_count);
  }
  [[nodiscard]] skim::cuda::device_block_csr csr() const {
    return {.row_ptr = row_ptr.data(), .col_idx = col_idx.data(), .capacity = static_cast<std::int64_t>(col_idx.size()),
            .rows = rows};
  }
  [[nodiscard]] skim::cuda::device_block_table table() const {
    return {.ids = ids.data(), .count = count.data(), .width = width, .rows = rows};
  }
};

// What one device run left in memory: O and lse (views' elements, then a guard), the error word.
template <class TO>
struct device_result {
  std::vector<TO> o;
  std::vector<float> lse;
  bool guard_intact = true;  // nothing written past the views
  std::uint32_t error_bits = 0;
};

// A batch without queries or keys has empty (null) buffers, which check_args refuses with
// batch > 0: such tensors get a valid pointer (16-byte aligned, 16 bytes) that is never read.
template <class T>
const tc::buffer<T>& no_tokens() {
  static const tc::buffer<T> dummy(16);
  return dummy;
}
template <class P>
const P* or_dummy(const P* p, const P* dummy) {
  return p != nullptr ? p : dummy;
}

template <class T>
bool all_ones(const std::vector<T>& v, std::size_t from) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(v.data());
  return std::all_of(bytes + from * sizeof(T), bytes + v.size() * sizeof(T), [](unsigned char c) { return c == 0xff; });
}

// Runs prefill on the device with K/V source `kv` (a device form of the case's K/V, or of codes of
// the same shape) and the given device index (any of index/cuda/device_index.cuh).
template <class TO, class T, class KV, class Index>
device_result<TO> run_prefill_with(const random_case<T, T>& c, tc::device_case<T, T>& dc, const KV& kv,
                                   const Index& index, prefill_kernel kernel) {
  const case_spec& s = c.spec;
  const std::size_t o_elems = static_cast<std::size_t>(c.tokens_q()) * s.heads_q * s.head_dim;
  const std::size_t lse_elems = static_cast<std::size_t>(c.tokens_q()) * s.heads_q;
  const std::size_t guard = static_cast<std::size_t>(s.heads_q) * s.head_dim;
  tc::buffer<TO> o(o_elems + guard);
  tc::buffer<float> lse(lse_elems + s.heads_q);
  const strided_view<const T> qv = c.q_view();
  const output<TO> layout(s, c.tokens_q(), false);  // strides of O in the spec's layout
  const skim::cuda::device_view<const T> q{or_dummy(dc.q.data(), no_tokens<T>().data()), qv.token_stride,
                                            qv.head_stride};
  const skim::cuda::device_view<TO> ov{o.data(), layout.view.token_stride, layout.view.head_stride};
  const skim::cuda::device_attention_args<T, KV, Index, TO> a{
      .prob = dc.prob(s), .q = q, .kv = kv, .index = index, .o = ov, .lse = lse.data()};
  const skim::cuda::prefill e{.kernel = kernel};
  REQUIRE(e.workspace_bytes(a.prob) == 0);
  const status st = e.run(a, {}, nullptr);
  INFO("prefill (" << name_of(kernel) << "): " << std::string(st.message()));
  REQUIRE(st.ok());
  SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());

  device_result<TO> r;
  r.o = o.download();
  r.lse = lse.download();
  r.guard_intact = all_ones(r.o, o_elems) && all_ones(r.lse, lse_elems);
  r.o.resize(o_elems);
  r.lse.resize(lse_elems);
  r.error_bits = dc.error_bits();
  return r;
}

// Runs prefill on the device with the case's K/V storage (spec.paged).
template <class TO, class T, class Index>
device_result<TO> run_prefill_on(const random_case<T, T>& c, tc::device_case<T, T>& dc, const Index& index,
                                 prefill_kernel kernel) {
  if (c.spec.paged) {
    auto kv = dc.paged(c);
    kv.page_indices = or_dummy(kv.page_indices, no_tokens<std::int32_t>().data());
    return run_prefill_with<TO>(c, dc, kv, index, kernel);
  }
  auto kv = dc.contiguous(c.spec);
  kv.k = or_dummy(kv.k, no_tokens<T>().data());
  kv.v = or_dummy(kv.v, no_tokens<T>().data());
  return run_prefill_with<TO>(c, dc, kv, index, kernel);
}

// The same with a stored selection in the given form.
template <class TO, class T>
device_result<TO> run_prefill(const random_case<T, T>& c, tc::device_case<T, T>& dc, const device_index& idx,
                              index_form form, prefill_kernel kernel) {
  return form == index_form::csr ? run_prefill_on<TO>(c, dc, idx.csr(), kernel)
                                 : run_prefill_on<TO>(c, dc, idx.table(), kernel);
}

// The reference's O and lse on the case's contiguous K/V and a CPU index (any skim::block_index).
template <class TO, class T, class Index>
void run_reference_on(const random_case<T, T>& c, const Index& index, output<TO>& ref) {
  attention_args<T, contiguous_kv<T>, Index, TO> a{
      .prob = c.prob(), .q = c.q_view(), .kv = c.contiguous(), .index = index, .o = ref.view, .lse = ref.lse};
  const status st = run_executor(exec::reference{}, a);
  INFO("reference: " << std::string(st.message()));
  REQUIRE(st.ok());
}

template <class TO, class T>
void run_reference(const random_case<T, T>& c, const csr_storage& csr, output<TO>& ref) {
  run_reference_on(c, csr.view(), ref);
}

// Compares a device result with the reference's output, row by row.
template <class TO, class T>
void check_against(const random_case<T, T>& c, const device_result<TO>& got, const output<TO>& ref) {
  output<TO> view(c.spec, c.tokens_q());
  std::copy(got.o.begin(), got.o.end(), view.o.begin());
  std::copy(got.lse.begin(), got.lse.end(), view.lse.begin());
  check(compare(c.prob(), view.view, ref.view, std::span<const float>(view.lse), std::span<const float>(ref.lse),
                prefill_tolerance<T>, lse_tolerance));
  CHECK(got.guard_intact);
}

// One random case end to end: reference, device run, comparison, error word 0.
template <class T, class TO>
void check_case(const case_spec& spec, std::mt19937& rng, double density, index_form form) {
  const random_case<T, T> c(spec, rng);
  const problem p = c.prob();
  const csr_storage csr = random_selection(p, rng, density);
  REQUIRE(csr.view().validate(p).ok());
  INFO(spec.describe() << ", density " << density << (form == index_form::csr ? ", csr" : ", table"));

  output<TO> ref(spec, c.tokens_q());
  run_reference(c, csr, ref);
  tc::device_case<T, T> dc(c);
  const device_index idx(csr, uniform(rng, 0, 2));
  for (const prefill_kernel k : kernels_for(spec)) {
    INFO("kernel " << name_of(k));
    const device_result<TO> got = run_prefill<TO>(c, dc, idx, form, k);
    check_against(c, got, ref);
    CHECK(got.error_bits == 0u);
  }
}

case_spec small_spec(std::int32_t d, std::int32_t bq, std::int32_t bk, std::int32_t heads_q, std::int32_t heads_kv,
                     std::vector<sequence_lengths> seqs, mask_kind mask = mask_kind::causal, bool paged = false) {
  case_spec s;
  s.head_dim = d;
  s.block_q = bq;
  s.block_kv = bk;
  s.heads_q = heads_q;
  s.heads_kv = heads_kv;
  s.seqs = std::move(seqs);
  s.mask = mask;
  s.paged = paged;
  s.page_size = 16;
  return s;
}

// Implicit indices and unions, each as a CPU index (the reference's) and the device index built
// from the same numbers: dense (causal_all), sink + window, and a routed selection (table or CSR)
// with a sink and a window, merged on the fly.
enum class implicit_kind { causal_all, sink_window, table_sink_window, csr_sink_window };

const char* name_of(implicit_kind k) {
  switch (k) {
    case implicit_kind::causal_all: return "causal_all";
    case implicit_kind::sink_window: return "sink + window";
    case implicit_kind::table_sink_window: return "table + sink + window";
    default: return "csr + sink + window";
  }
}

// Calls f(cpu_index, device_index) for the kind, over `csr` / `idx` (the same selection).
template <class F>
void with_implicit(implicit_kind kind, std::int32_t sink, std::int32_t window, const csr_storage& csr,
                   const device_index& idx, F&& f) {
  namespace sc = skim::cuda;
  const index::sink cs{sink};
  const index::sliding_window cw{window};
  const sc::device_sink ds{sink};
  const sc::device_sliding_window dw{window};
  switch (kind) {
    case implicit_kind::causal_all: f(index::causal_all{}, sc::device_causal_all{}); break;
    case implicit_kind::sink_window: f(index::make_union(cs, cw), sc::make_device_union(ds, dw)); break;
    case implicit_kind::table_sink_window:
      f(index::make_union(csr.view(), cs, cw), sc::make_device_union(idx.table(), ds, dw));
      break;
    default: f(index::make_union(csr.view(), cs, cw), sc::make_device_union(idx.csr(), ds, dw)); break;
  }
}

// One random case over an implicit index: reference over the CPU index, device run over the
// device one, comparison, error word 0. bf16 only (each index type is a kernel of its own).
template <class TO>
void check_implicit_case(const case_spec& spec, std::mt19937& rng, implicit_kind kind, std::int32_t sink,
                         std::int32_t window) {
  const random_case<bf16, bf16> c(spec, rng);
  const problem p = c.prob();
  const csr_storage csr = random_selection(p, rng, 0.2);
  INFO(spec.describe() << ", " << name_of(kind) << ", sink " << sink << ", window " << window);
  tc::device_case<bf16, bf16> dc(c);
  const device_index idx(csr, uniform(rng, 0, 2));
  with_implicit(kind, sink, window, csr, idx, [&](const auto& cpu, const auto& dev) {
    REQUIRE(cpu.validate(p).ok());
    output<TO> ref(spec, c.tokens_q());
    run_reference_on(c, cpu, ref);
    for (const prefill_kernel k : kernels_for(spec)) {
      INFO("kernel " << name_of(k));
      const device_result<TO> got = run_prefill_on<TO>(c, dc, dev, k);
      check_against(c, got, ref);
      CHECK(got.error_bits == 0u);
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Quantised K/V: 8-bit codes with scales per (sequence, block, kv head) or per kv head
// (support/quantized_case.hpp), against the reference over the dequantised values.

// The case's codes on the device in its layout (spec.paged, kv_head_major), with their scales.
template <class Code>
struct device_codes {
  tc::buffer<Code> k, v, k_pages, v_pages;
  tc::buffer<float> k_scales, v_scales;
  const quantized_host<Code>& host;

  template <class T>
  device_codes(const random_case<T, T>& c, const quantized_host<Code>& qh)
      : k(stored(c, qh.k, false)), v(stored(c, qh.v, false)), k_pages(stored(c, qh.k_pages, true)),
        v_pages(stored(c, qh.v_pages, true)), k_scales(qh.k_scales), v_scales(qh.v_scales), host(qh) {}

  template <class T>
  static std::vector<Code> stored(const random_case<T, T>& c, const std::vector<Code>& x, bool pages) {
    if (!c.spec.kv_head_major) return x;
    const std::int64_t d = c.spec.head_dim, h = c.spec.heads_kv;
    const std::int64_t tokens = pages ? c.spec.page_size : static_cast<std::int64_t>(x.size()) / (d * h);
    return heads_outside(x, pages ? c.num_pages : 1, tokens, h, d);
  }
  template <class Source>
  [[nodiscard]] skim::cuda::device_quantized_kv<Source> with_scales(const Source& codes) const {
    return {codes, k_scales.data(), v_scales.data(), host.seq_stride, host.block_stride, host.head_stride};
  }
  // The source in the layouts of dc's 16-bit one (the same strides, in codes).
  template <class T>
  [[nodiscard]] auto paged(const random_case<T, T>& c, const tc::device_case<T, T>& dc) const {
    const auto ps = dc.paged(c);
    return with_scales(skim::cuda::device_paged_kv<Code>{
        .k_pages = or_dummy(k_pages.data(), no_tokens<Code>().data()),
        .v_pages = or_dummy(v_pages.data(), no_tokens<Code>().data()), .num_pages = ps.num_pages,
        .page_size = ps.page_size, .page_stride = ps.page_stride, .token_stride = ps.token_stride,
        .head_stride = ps.head_stride, .page_indptr = ps.page_indptr,
        .page_indices = or_dummy(ps.page_indices, no_tokens<std::int32_t>().data())});
  }
  template <class T>
  [[nodiscard]] auto contiguous(const case_spec& s, const tc::device_case<T, T>& dc) const {
    const auto cs = dc.contiguous(s);
    return with_scales(skim::cuda::device_contiguous_kv<Code>{
        .k = or_dummy(k.data(), no_tokens<Code>().data()), .v = or_dummy(v.data(), no_tokens<Code>().data()),
        .token_stride = cs.token_stride, .head_stride = cs.head_stride});
  }
};

// One random case with Q of type T and quantised K/V (Code): the reference over the dequantised
// fp32 K/V, then mma_sync and the automatic choice (which must take mma_sync), error word 0.
template <class T, class Code>
void check_quantized_case(const case_spec& spec, std::mt19937& rng, double density, index_form form) {
  const random_case<T, T> c(spec, rng);
  const problem p = c.prob();
  const csr_storage csr = random_selection(p, rng, density);
  tc::device_case<T, T> dc(c);
  const bool per_block = chance(rng, 0.6);
  const std::int32_t max_blocks = dc.prob(spec).max_kv_blocks() + uniform(rng, 0, 2);
  const quantized_host<Code> qh(c, rng, per_block, max_blocks);
  INFO(spec.describe() << ", density " << density << (form == index_form::csr ? ", csr" : ", table")
                       << (per_block ? ", scales per block" : ", scales per head"));

  output<float> ref(spec, c.tokens_q());
  const std::int32_t tokens_kv = c.cu_kv.back();
  const contiguous_kv<float> rkv{
      .k = strided_view<const float>::token_major(qh.kf.data(), tokens_kv, spec.heads_kv, spec.head_dim),
      .v = strided_view<const float>::token_major(qh.vf.data(), tokens_kv, spec.heads_kv, spec.head_dim),
      .cu_seqlens_kv = {}};
  const attention_args<T, contiguous_kv<float>, index::block_csr, float> ra{
      .prob = p, .q = c.q_view(), .kv = rkv, .index = csr.view(), .o = ref.view, .lse = ref.lse};
  REQUIRE(run_executor(exec::reference{}, ra).ok());

  const device_codes<Code> codes(c, qh);
  const device_index idx(csr, uniform(rng, 0, 2));
  for (const prefill_kernel k : kernels_for(spec)) {
    INFO("kernel " << name_of(k));
    const auto run = [&](const auto& kv) {
      return form == index_form::csr ? run_prefill_with<float>(c, dc, kv, idx.csr(), k)
                                     : run_prefill_with<float>(c, dc, kv, idx.table(), k);
    };
    const device_result<float> got = spec.paged ? run(codes.paged(c, dc)) : run(codes.contiguous(spec, dc));
    check_against(c, got, ref);
    CHECK(got.error_bits == 0u);
  }
}

}  // namespace

TEST_CASE("prefill small cases match the reference") {
  // Every tile shape once, partial first and last blocks, an empty sequence, a query block with
  // no visible key (q_len > kv_len), fp16 and bf16, paged and contiguous, table and CSR.
  std::mt19937 rng(0x5e11u);
  const std::vector<sequence_lengths> seqs{{70, 130}, {0, 5}, {64, 64}, {9, 3}};
  check_case<bf16, float>(small_spec(64, 64, 64, 2, 1, seqs), rng, 1.0, index_form::csr);
  check_case<bf16, bf16>(small_spec(128, 128, 64, 4, 1, seqs, mask_kind::causal, true), rng, 0.6,
                                 index_form::table);
  check_case<f16, f16>(small_spec(64, 64, 128, 2, 2, seqs, mask_kind::none), rng, 1.0, index_form::table);
  check_case<f16, float>(small_spec(128, 128, 128, 1, 1, {{200, 260}}, mask_kind::causal, true), rng, 1.0,
                          index_form::csr);
  check_case<bf16, float>(small_spec(128, 64, 128, 8, 1, {{33, 300}}, mask_kind::none, true), rng, 0.5,
                              index_form::csr);
  check_case<f16, float>(small_spec(64, 128, 64, 1, 1, {{129, 129}, {1, 77}}), rng, 1.0, index_form::table);
}

TEST_CASE_TEMPLATE("prefill matches reference on random shapes", TT, types<bf16, bf16, float>,
                   types<bf16, bf16, bf16>, types<f16, f16, f16>, types<f16, f16, float>) {
  using T = typename TT::q;
  using TO = typename TT::o;
  for (std::uint32_t i = 0; i < 14; ++i) {
    const std::uint32_t seed = 0xb10c0u + 131u * i + static_cast<std::uint32_t>(std::is_same_v<T, f16> * 7 + sizeof(TO));
    std::mt19937 rng(seed);
    const case_spec spec = prefill_spec(rng, 4e7);
    const double density = pick(rng, {0.15, 0.4, 1.0});
    const index_form form = chance(rng, 0.5) ? index_form::csr : index_form::table;
    INFO("seed " << seed);
    check_case<T, TO>(spec, rng, density, form);
  }
}

TEST_CASE("prefill over many tiles: a long causal sequence, sparse and dense") {
  // Thousands of keys per row: the double-buffered pipeline runs tens of iterations per CTA.
  for (const double density : {0.25, 1.0}) {
    std::mt19937 rng(0x1096u);
    case_spec s = small_spec(64, 128, 64, 2, 1, {{1900, 2000}, {700, 700}});
    check_case<bf16, float>(s, rng, density, index_form::csr);
    s.paged = true;
    s.page_size = 32;
    check_case<f16, f16>(s, rng, density, index_form::table);
  }
}

TEST_CASE("prefill is deterministic: two runs are bit-identical") {
  std::mt19937 rng(0xde7u);
  const case_spec spec = small_spec(128, 128, 64, 8, 2, {{300, 420}, {65, 65}});
  const random_case<bf16, bf16> c(spec, rng);
  const csr_storage csr = random_selection(c.prob(), rng, 0.5);
  tc::device_case<bf16, bf16> dc(c);
  const device_index idx(csr, 1);
  for (const prefill_kernel k : kernels_for(spec)) {
    INFO("kernel " << name_of(k));
    const auto a = run_prefill<float>(c, dc, idx, index_form::csr, k);
    const auto b = run_prefill<float>(c, dc, idx, index_form::csr, k);
    const auto t = run_prefill<float>(c, dc, idx, index_form::table, k);  // same ids, other storage
    CHECK(std::memcmp(a.o.data(), b.o.data(), a.o.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(a.o.data(), t.o.data(), a.o.size() * sizeof(float)) == 0);
  }
}

// Bad device content in a case's selection (and its pages, when paged): every kernel that applies
// skips it, reports it, and computes what the reference computes without it.
void check_bad_input(const case_spec& spec, std::uint32_t seed) {
  std::mt19937 rng(seed);
  const random_case<f16, f16> c(spec, rng);
  const problem p = c.prob();
  const csr_storage clean = random_selection(p, rng, 0.7);
  output<float> ref(spec, c.tokens_q());
  run_reference(c, clean, ref);  // what the kernel must still compute: the bad entries skipped
  tc::device_case<f16, f16> dc(c);

  std::vector<row_info> rows;
  REQUIRE(for_each_row(p, [&](const row_info& r) { rows.push_back(r); }).ok());
  const auto edit = [&](auto&& change) {  // a copy of the clean selection with one row changed
    csr_storage bad;
    for (const row_info& r : rows) {
      std::vector<std::int32_t> ids(clean.col_idx.begin() + clean.row_ptr[r.row],
                                    clean.col_idx.begin() + clean.row_ptr[r.row + 1]);
      change(r, ids);
      bad.col_idx.insert(bad.col_idx.end(), ids.begin(), ids.end());
      bad.row_ptr.push_back(static_cast<std::int32_t>(bad.col_idx.size()));
    }
    return bad;
  };
  for (const prefill_kernel k : kernels_for(spec)) {
    INFO("kernel " << name_of(k));
    const auto run_both_forms = [&](const csr_storage& bad, std::uint32_t expected_bit) {
      const device_index idx(bad, 0);
      for (const index_form form : {index_form::csr, index_form::table}) {
        INFO((form == index_form::csr ? "csr" : "table"));
        const auto got = run_prefill<float>(c, dc, idx, form, k);
        CHECK((got.error_bits & expected_bit) != 0u);
        check_against(c, got, ref);
      }
    };
    {
      INFO("an id past the row's visible blocks, and a negative one");
      bool done = false;
      run_both_forms(edit([&](const row_info& r, std::vector<std::int32_t>& ids) {
                       if (done) return;
                       ids.insert(ids.begin(), -1);
                       ids.push_back(r.visible_blocks);
                       done = true;
                     }),
                     skim::cuda::bad_block_id);
    }
    {
      INFO("a repeated id and a descending pair");
      bool done = false;
      run_both_forms(edit([&](const row_info&, std::vector<std::int32_t>& ids) {
                       if (done || ids.size() < 2) return;
                       ids.push_back(ids.back());   // counted twice if not skipped
                       ids.push_back(ids.front());  // below the previous id
                       done = true;
                     }),
                     skim::cuda::bad_order);
    }
    {
      INFO("a table count above the width, a CSR range past col_idx");
      device_index idx(clean, 0);
      // Count of the widest row raised past the width: clamped to the width, i.e. the same ids.
      std::vector<std::int32_t> count = idx.count.download();
      const auto widest = std::max_element(count.begin(), count.end()) - count.begin();
      count[static_cast<std::size_t>(widest)] = idx.width + 5;
      idx.count.upload(count);
      auto got = run_prefill<float>(c, dc, idx, index_form::table, k);
      CHECK((got.error_bits & skim::cuda::bad_count) != 0u);
      check_against(c, got, ref);
      // The last row's end moved past col_idx: clamped to capacity, the same ids.
      std::vector<std::int32_t> row_ptr = clean.row_ptr;
      row_ptr.back() += 3;
      idx.row_ptr.upload(row_ptr);
      got = run_prefill<float>(c, dc, idx, index_form::csr, k);
      CHECK((got.error_bits & skim::cuda::bad_count) != 0u);
      check_against(c, got, ref);
    }
    if (spec.paged) {
      INFO("a page outside the pool");
      std::vector<std::int32_t> pages = c.page_indices;
      // Every page of sequence 0 (so whichever blocks the selection reads, one is bad).
      for (std::int32_t i = c.page_indptr[0]; i < c.page_indptr[1]; ++i) pages[static_cast<std::size_t>(i)] = c.num_pages + 3;
      dc.page_indices.upload(pages);
      const device_index idx(clean, 0);
      const auto got = run_prefill<float>(c, dc, idx, index_form::csr, k);
      dc.page_indices.upload(c.page_indices);
      CHECK((got.error_bits & skim::cuda::bad_page) != 0u);
      CHECK((got.error_bits & ~static_cast<std::uint32_t>(skim::cuda::bad_page)) == 0u);
      // The keys on bad pages are skipped: sequence 0's rows attend nothing (O 0, lse -inf), the
      // others are unchanged.
      output<float> ref_skipped(spec, c.tokens_q());
      run_reference(c, edit([](const row_info& r, std::vector<std::int32_t>& ids) { if (r.seq == 0) ids.clear(); }),
                    ref_skipped);
      check_against(c, got, ref_skipped);
    }
  }
}

TEST_CASE("prefill small bad input: ids, order, counts and pages are skipped and reported") {
  // Paged K/V with query blocks of 64 (the mma_sync kernel), then contiguous K/V with blocks of 128
  // (every kernel).
  check_bad_input(small_spec(64, 64, 64, 4, 2, {{150, 200}, {64, 130}}, mask_kind::causal, true), 0xbad1u);
  check_bad_input(small_spec(64, 128, 64, 4, 2, {{150, 200}, {64, 130}}), 0xbad9u);
}

TEST_CASE("prefill small implicit indices: causal_all, sink + window, table/CSR + sink + window") {
  // Partial blocks, an empty sequence, q_len > kv_len, GQA, paged and contiguous, both masks.
  std::mt19937 rng(0x51e0u);
  const std::vector<sequence_lengths> seqs{{70, 130}, {0, 5}, {64, 64}, {9, 3}};
  check_implicit_case<float>(small_spec(64, 64, 64, 4, 1, seqs), rng, implicit_kind::causal_all, 0, 0);
  check_implicit_case<bf16>(small_spec(128, 64, 64, 2, 2, seqs, mask_kind::none, true), rng,
                            implicit_kind::causal_all, 0, 0);
  check_implicit_case<float>(small_spec(64, 64, 64, 8, 1, {{300, 333}, {0, 0}}), rng, implicit_kind::sink_window, 1, 2);
  check_implicit_case<float>(small_spec(64, 128, 64, 2, 1, seqs, mask_kind::none, true), rng,
                             implicit_kind::sink_window, 2, 1);
  check_implicit_case<float>(small_spec(64, 64, 64, 4, 2, {{200, 260}, {0, 7}}), rng, implicit_kind::table_sink_window,
                             1, 1);
  check_implicit_case<bf16>(small_spec(128, 64, 128, 2, 1, seqs, mask_kind::causal, true), rng,
                            implicit_kind::csr_sink_window, 1, 2);
  check_implicit_case<float>(small_spec(64, 64, 64, 1, 1, {{129, 129}}), rng, implicit_kind::sink_window, 0, 0);
}

TEST_CASE("prefill small head_shared: one row per query block, read by every index head") {
  // GQA (kv-head scope: index_heads = heads_kv) and query-head scope, partial blocks, paged.
  std::mt19937 rng(0x5a4eu);
  const std::vector<sequence_lengths> seqs{{70, 130}, {0, 5}, {64, 64}, {9, 3}};
  for (case_spec spec : {small_spec(64, 64, 64, 4, 2, seqs), small_spec(128, 64, 128, 8, 2, seqs, mask_kind::causal, true)}) {
    for (const index_scope scope : {index_scope::kv_head, index_scope::query_head}) {
      spec.scope = scope;
      const random_case<bf16, bf16> c(spec, rng);
      const problem p = c.prob();
      const std::int32_t heads = p.index_heads();
      const csr_storage shared = random_selection(index::head_shared<index::block_csr>::shared_problem(p), rng, 0.4);
      INFO(spec.describe() << ", index heads " << heads);
      const index::head_shared<index::block_csr> cpu{shared.view(), heads};
      REQUIRE(cpu.validate(p).ok());
      output<float> ref(spec, c.tokens_q());
      run_reference_on(c, cpu, ref);
      tc::device_case<bf16, bf16> dc(c);
      const device_index idx(shared, 1);
      for (const prefill_kernel k : kernels_for(spec)) {
        INFO("kernel " << name_of(k));
        const auto table = run_prefill_on<float>(c, dc, skim::cuda::device_head_shared<skim::cuda::device_block_table>{
                                                            idx.table(), heads}, k);
        check_against(c, table, ref);
        CHECK(table.error_bits == 0u);
        const auto csr = run_prefill_on<float>(c, dc, skim::cuda::device_head_shared<skim::cuda::device_block_csr>{
                                                          idx.csr(), heads}, k);
        CHECK(std::memcmp(csr.o.data(), table.o.data(), table.o.size() * sizeof(float)) == 0);
        CHECK(csr.error_bits == 0u);
      }
    }
  }
}

TEST_CASE("prefill over implicit indices matches the reference on random shapes") {
  for (std::uint32_t i = 0; i < 16; ++i) {
    const std::uint32_t seed = 0x1e71u + 97u * i;
    std::mt19937 rng(seed);
    case_spec spec = prefill_spec(rng, 4e7);
    const auto kind = static_cast<implicit_kind>(i % 4);
    const std::int32_t sink = uniform(rng, 0, 2);
    const std::int32_t window = uniform(rng, 0, 4);
    INFO("seed " << seed);
    if (i % 2 == 0) {
      check_implicit_case<float>(spec, rng, kind, sink, window);
    } else {
      check_implicit_case<bf16>(spec, rng, kind, sink, window);
    }
  }
}

TEST_CASE("prefill over a long sequence: sink + window and causal_all over many tiles") {
  std::mt19937 rng(0x10e6u);
  case_spec s = small_spec(64, 128, 64, 2, 1, {{1900, 2000}, {700, 700}});
  check_implicit_case<float>(s, rng, implicit_kind::sink_window, 1, 4);
  check_implicit_case<float>(s, rng, implicit_kind::causal_all, 0, 0);
  s.paged = true;
  s.page_size = 32;
  check_implicit_case<float>(s, rng, implicit_kind::table_sink_window, 2, 3);
}

TEST_CASE("prefill small bad input under a union: the table part's bad ids and counts are skipped and reported") {
  std::mt19937 rng(0xbad2u);
  const case_spec spec = small_spec(64, 128, 64, 4, 2, {{150, 200}, {64, 130}});
  const random_case<bf16, bf16> c(spec, rng);
  const problem p = c.prob();
  const csr_storage clean = random_selection(p, rng, 0.5);
  const index::sink sink{1};
  const index::sliding_window window{1};
  output<float> ref(spec, c.tokens_q());
  run_reference_on(c, index::make_union(clean.view(), sink, window), ref);
  tc::device_case<bf16, bf16> dc(c);

  // Row 0 gets a negative id and one past its visible blocks; the union passes both on, the kernel
  // skips them.
  std::vector<row_info> rows;
  REQUIRE(for_each_row(p, [&](const row_info& r) { rows.push_back(r); }).ok());
  csr_storage bad;
  for (const row_info& r : rows) {
    std::vector<std::int32_t> ids(clean.col_idx.begin() + clean.row_ptr[r.row],
                                  clean.col_idx.begin() + clean.row_ptr[r.row + 1]);
    if (r.row == 0) {
      ids.insert(ids.begin(), -1);
      ids.push_back(r.visible_blocks);
    }
    bad.col_idx.insert(bad.col_idx.end(), ids.begin(), ids.end());
    bad.row_ptr.push_back(static_cast<std::int32_t>(bad.col_idx.size()));
  }
  const skim::cuda::device_sink ds{1};
  const skim::cuda::device_sliding_window dw{1};
  for (const prefill_kernel k : kernels_for(spec)) {
    INFO("kernel " << name_of(k));
    {
      const device_index idx(bad, 0);
      const auto got = run_prefill_on<float>(c, dc, skim::cuda::make_device_union(idx.table(), ds, dw), k);
      CHECK((got.error_bits & skim::cuda::bad_block_id) != 0u);
      CHECK((got.error_bits & ~static_cast<std::uint32_t>(skim::cuda::bad_block_id)) == 0u);
      check_against(c, got, ref);
    }
    {
      // A count past the width: clamped to the width (the same ids), reported as bad_count.
      device_index idx(clean, 0);
      std::vector<std::int32_t> count = idx.count.download();
      const auto widest = std::max_element(count.begin(), count.end()) - count.begin();
      count[static_cast<std::size_t>(widest)] = idx.width + 5;
      idx.count.upload(count);
      const auto got = run_prefill_on<float>(c, dc, skim::cuda::make_device_union(idx.table(), ds, dw), k);
      CHECK(got.error_bits == static_cast<std::uint32_t>(skim::cuda::bad_count));
      check_against(c, got, ref);
    }
  }
}

TEST_CASE("prefill host checks: unsupported shapes and misaligned views") {
  std::mt19937 rng(0x4057u);
  const skim::cuda::prefill e;
  skim::cuda::device_problem p{.batch = 0, .heads_q = 2, .heads_kv = 1, .head_dim = 96, .block_q = 64, .block_kv = 64};
  status st = e.can_implement(p);
  CHECK(st.code() == status_code::unsupported);
  CHECK(std::string(st.message()).find("head_dim 96") != std::string::npos);
  p.head_dim = 64;
  p.block_q = 32;
  CHECK(e.can_implement(p).code() == status_code::unsupported);
  p.block_q = 128;
  p.block_kv = 256;
  CHECK(e.can_implement(p).code() == status_code::unsupported);
  p.block_kv = 128;
  CHECK(e.can_implement(p).ok());

  // run() refuses the same shape, and a Q view whose rows are not 16-byte aligned.
  case_spec spec = small_spec(96, 64, 64, 2, 1, {{10, 10}});
  {
    const random_case<bf16, bf16> c(spec, rng);
    tc::device_case<bf16, bf16> dc(c);
    tc::buffer<float> o(static_cast<std::size_t>(c.tokens_q()) * spec.heads_q * spec.head_dim);
    const device_index idx(random_selection(c.prob(), rng, 1.0), 0);
    const skim::cuda::device_attention_args<bf16, skim::cuda::device_contiguous_kv<bf16>,
                                            skim::cuda::device_block_csr, float>
        a{.prob = dc.prob(spec), .q = {dc.q.data(), 96 * 2, 96}, .kv = dc.contiguous(spec), .index = idx.csr(),
          .o = {o.data(), 96 * 2, 96}};
    st = e.run(a, {}, nullptr);
    CHECK(st.code() == status_code::unsupported);
    CHECK(std::string(st.message()).find("head_dim 96") != std::string::npos);
  }
  spec.head_dim = 64;
  {
    const random_case<bf16, bf16> c(spec, rng);
    tc::device_case<bf16, bf16> dc(c);
    tc::buffer<float> o(static_cast<std::size_t>(c.tokens_q()) * spec.heads_q * spec.head_dim);
    const device_index idx(random_selection(c.prob(), rng, 1.0), 0);
    skim::cuda::device_attention_args<bf16, skim::cuda::device_contiguous_kv<bf16>,
                                      skim::cuda::device_block_csr, float>
        a{.prob = dc.prob(spec), .q = {dc.q.data(), 64 * 2, 64}, .kv = dc.contiguous(spec), .index = idx.csr(),
          .o = {o.data(), 64 * 2, 64}};
    a.q.token_stride = 64 * 2 + 4;  // rows no longer on 16 bytes
    st = e.run(a, {}, nullptr);
    CHECK(st.code() == status_code::unsupported);
    a.q.token_stride = 64 * 2;
    st = e.run(a, {}, nullptr);
    CHECK(st.ok());
    SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
    CHECK(dc.error_bits() == 0u);

    // An implicit index with a negative size is refused by run(), naming the value and the part.
    namespace sc = skim::cuda;
    const auto u = sc::make_device_union(idx.table(), sc::device_sink{-1}, sc::device_sliding_window{2});
    const sc::device_attention_args<bf16, sc::device_contiguous_kv<bf16>, std::remove_const_t<decltype(u)>, float> b{
        .prob = a.prob, .q = a.q, .kv = a.kv, .index = u, .o = a.o};
    st = e.run(b, {}, nullptr);
    CHECK(st.code() == status_code::invalid_argument);
    CHECK(std::string(st.message()) == "union part 1: union part 0: sink blocks -1 < 0");
  }
}

TEST_CASE("prefill small kernel choice: wgmma is refused where it does not apply, automatic takes it where it does") {
  std::mt19937 rng(0x90a0u);
  const skim::cuda::prefill wgmma{.kernel = prefill_kernel::wgmma};
  skim::cuda::device_problem p{.batch = 0, .heads_q = 2, .heads_kv = 1, .head_dim = 64, .block_q = 64, .block_kv = 64};
  status st = wgmma.can_implement(p);
  CHECK(st.code() == status_code::unsupported);
  CHECK(std::string(st.message()) == "prefill (wgmma): block_q 64 is not 128");
  p.block_q = 128;
  CHECK(wgmma.can_implement(p).ok());

  for (const bool paged : {true, false}) {
    INFO((paged ? "paged" : "contiguous"));
    const case_spec spec = small_spec(64, 128, 64, 4, 2, {{150, 200}, {0, 7}, {64, 130}}, mask_kind::causal, paged);
    const random_case<bf16, bf16> c(spec, rng);
    const csr_storage csr = random_selection(c.prob(), rng, 0.5);
    tc::device_case<bf16, bf16> dc(c);
    const device_index idx(csr, 0);
    const auto run_with = [&](prefill_kernel k) {
      const auto go = [&](auto kv) {
        tc::buffer<float> o(static_cast<std::size_t>(c.tokens_q()) * spec.heads_q * spec.head_dim);
        const skim::cuda::device_attention_args<bf16, decltype(kv), skim::cuda::device_block_csr, float> a{
            .prob = dc.prob(spec), .q = {dc.q.data(), 64 * 4, 64}, .kv = kv, .index = idx.csr(),
            .o = {o.data(), 64 * 4, 64}};
        const status s = skim::cuda::prefill{.kernel = k}.run(a, {}, nullptr);
        SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
        return std::pair{s, s.ok() ? o.download() : std::vector<float>{}};
      };
      return paged ? go(dc.paged(c)) : go(dc.contiguous(spec));
    };
    const auto [ws, wo] = run_with(prefill_kernel::wgmma);
    const auto [as, ao] = run_with(prefill_kernel::automatic);
    const auto [ms, mo] = run_with(prefill_kernel::mma_sync);
    REQUIRE(as.ok());
    REQUIRE(ms.ok());
    CHECK(dc.error_bits() == 0u);
    if (paged || !tc::is_sm90()) {
      CHECK(ws.code() == status_code::unsupported);
      CHECK(std::string(ws.message()).find("prefill (wgmma): needs contiguous K/V") == 0);
      CHECK(ao == mo);  // automatic took mma_sync
    } else {
      REQUIRE(ws.ok());
      CHECK(ao == wo);  // automatic took wgmma
    }
  }
}

// Quantised K/V (int8, fp8 e4m3) under bf16 and fp16 Q: random shapes (every tile shape, GQA,
// varlen, prefix caching, both masks and scopes), contiguous and paged, token- and head-major, scales
// per block or per head, table and CSR.
TEST_CASE_TEMPLATE("prefill quantized K/V matches the reference on random shapes", Code, std::int8_t, skim::fp8_e4m3) {
  for (std::uint32_t i = 0; i < 10; ++i) {
    const std::uint32_t seed = 0x8a00u + 17u * i + (std::is_same_v<Code, std::int8_t> ? 0u : 5000u);
    std::mt19937 rng(seed);
    const case_spec spec = prefill_spec(rng, 3e7);
    const double density = pick(rng, {0.15, 0.4, 1.0});
    const index_form form = chance(rng, 0.5) ? index_form::csr : index_form::table;
    INFO("seed " << seed);
    if (i % 2 == 0) {
      check_quantized_case<bf16, Code>(spec, rng, density, form);
    } else {
      check_quantized_case<f16, Code>(spec, rng, density, form);
    }
  }
}

// A small fixed quantised case for compute-sanitizer: both codes and Q types, both sources, every
// tile shape once, partial blocks, an empty sequence, a query block with no visible key.
TEST_CASE("prefill small quantized: both codes, sources and tile shapes") {
  std::mt19937 rng(0x8a8au);
  const std::vector<sequence_lengths> seqs{{70, 130}, {0, 5}, {64, 64}, {9, 3}};
  check_quantized_case<bf16, skim::fp8_e4m3>(small_spec(64, 64, 64, 2, 1, seqs), rng, 1.0, index_form::csr);
  check_quantized_case<f16, std::int8_t>(small_spec(128, 128, 64, 4, 1, seqs, mask_kind::causal, true), rng, 0.6,
                                         index_form::table);
  check_quantized_case<bf16, std::int8_t>(small_spec(64, 128, 128, 2, 2, seqs, mask_kind::none), rng, 1.0,
                                          index_form::table);
  check_quantized_case<f16, skim::fp8_e4m3>(small_spec(128, 64, 128, 8, 1, {{33, 300}}, mask_kind::causal, true),
                                            rng, 0.5, index_form::csr);
  // block_q 128, contiguous: the wgmma kernel's tiles too on sm_90 (kernels_for), partial last tiles.
  check_quantized_case<f16, skim::fp8_e4m3>(small_spec(128, 128, 128, 4, 1, seqs), rng, 0.7, index_form::table);
  check_quantized_case<bf16, std::int8_t>(small_spec(64, 128, 64, 6, 2, seqs), rng, 1.0, index_form::csr);
}

// A long causal sequence over quantised K/V: tens of tiles per CTA through the double-buffered codes.
TEST_CASE("prefill quantized over many tiles") {
  std::mt19937 rng(0x8a10u);
  case_spec s = small_spec(128, 128, 64, 2, 1, {{1500, 1700}, {300, 300}});
  check_quantized_case<bf16, skim::fp8_e4m3>(s, rng, 1.0, index_form::csr);
  s.paged = true;
  s.page_size = 32;
  check_quantized_case<f16, std::int8_t>(s, rng, 0.3, index_form::table);
}

TEST_CASE("prefill quantized host errors: scales, alignment, wgmma") {
  std::mt19937 rng(0x8a0eu);
  const case_spec spec = small_spec(64, 128, 64, 2, 1, {{40, 100}});
  const random_case<bf16, bf16> c(spec, rng);
  tc::device_case<bf16, bf16> dc(c);
  const quantized_host<skim::fp8_e4m3> qh(c, rng, false, 0);
  const device_codes<skim::fp8_e4m3> codes(c, qh);
  const device_index idx(random_selection(c.prob(), rng, 1.0), 0);
  tc::buffer<float> o(static_cast<std::size_t>(c.tokens_q()) * spec.heads_q * spec.head_dim);
  using source = skim::cuda::device_quantized_kv<skim::cuda::device_contiguous_kv<skim::fp8_e4m3>>;
  const auto run = [&](const source& kv, prefill_kernel k) {
    const skim::cuda::device_attention_args<bf16, source, skim::cuda::device_block_csr, float> a{
        .prob = dc.prob(spec), .q = {dc.q.data(), 64 * 2, 64}, .kv = kv, .index = idx.csr(), .o = {o.data(), 64 * 2, 64}};
    return skim::cuda::prefill{.kernel = k}.run(a, {}, nullptr);
  };
  const source good = codes.contiguous(spec, dc);
  auto null_scales = good;
  null_scales.k_scales = nullptr;
  status st = run(null_scales, prefill_kernel::automatic);
  CHECK(st.code() == status_code::invalid_argument);
  CHECK(std::string(st.message()).find("scales") != std::string::npos);
  auto misaligned = good;
  misaligned.codes.token_stride = 64 + 8;  // 16-bit rows would be aligned; 8 codes are not 16 bytes
  st = run(misaligned, prefill_kernel::mma_sync);
  CHECK(st.code() == status_code::unsupported);
  CHECK(std::string(st.message()).find("multiples of 16") != std::string::npos);
  st = run(good, prefill_kernel::wgmma);  // contiguous codes: the wgmma kernel's where it is built
  if (tc::is_sm90()) {
    CHECK(st.ok());
  } else {
    CHECK(st.code() == status_code::unsupported);
    CHECK(std::string(st.message()).find("contiguous K/V") != std::string::npos);
  }
  REQUIRE(run(good, prefill_kernel::automatic).ok());
  SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
  CHECK(dc.error_bits() == 0u);
}
