// exec::simd<Arch> against exec::reference, for every xsimd arch this translation unit is compiled
// for: the default build tests simd<xsimd::default_arch> (sse2 on x86-64); tests/CMakeLists.txt
// builds this file again with -mavx2 -mfma and with -mavx512f ... (skim_simd_avx2_tests,
// skim_simd_avx512_tests), and for aarch64 under qemu (neon64).
//
// Same random cases as scalar_test.cpp (all dtypes, paged and varlen, GQA 1/4/8, odd head dims,
// partial blocks, decode rows, both index scopes) plus stored index formats, decode splits, thread
// counts (bit-identical for 1, 2 and 16 threads, and for items run in any order) and allocation,
// and decode with fused kv heads (a head-invariant index: one item reads every kv head's tiles).
#include "skim/exec/cpu/simd.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "skim/core/quantized.hpp"
#include "skim/exec/cpu/reference.hpp"
#include "skim/index/block_csr.hpp"
#include "skim/index/block_table.hpp"
#include "skim/index/block_union.hpp"
#include "skim/index/causal_all.hpp"
#include "skim/index/convert.hpp"
#include "skim/index/head_invariant.hpp"
#include "skim/index/sink.hpp"
#include "skim/index/sliding_window.hpp"
#include "support/allocation_counter.hpp"
#include "support/compare.hpp"
#include "support/executor_cases.hpp"
#include "support/random_case.hpp"

using namespace skim;
using namespace skim::test;

namespace {

#ifndef SKIM_SIMD_TEST_SCALE
#define SKIM_SIMD_TEST_SCALE 1.0  // share of the random cases to run (the qemu build runs fewer)
#endif

// A binary built for an arch this CPU lacks would die of SIGILL: say so and exit 77 (CTest's skip).
#if XSIMD_WITH_AVX512F || XSIMD_WITH_AVX2
const bool cpu_has_compiled_arch = [] {
  const auto cpu = xsimd::available_architectures();
  if ((XSIMD_WITH_AVX512F && !(cpu.avx512f && cpu.avx512dq)) || (XSIMD_WITH_AVX2 && !cpu.avx2) ||
      (XSIMD_WITH_FMA3_AVX2 && !cpu.fma3_avx2)) {
    std::puts("simd_test: this CPU lacks the arch the binary was built for; skipped");
    std::exit(77);
  }
  return true;
}();
#endif

[[nodiscard]] int scaled(int cases) { return std::max(1, static_cast<int>(cases * SKIM_SIMD_TEST_SCALE)); }

// Calls f.template operator()<Arch>() for each arch compiled into this TU.
template <class F>
void for_each_arch(F&& f) {
  bool any = false;
#if XSIMD_WITH_AVX512F
  f.template operator()<xsimd::avx512f>();
  any = true;
#endif
#if XSIMD_WITH_AVX2
  f.template operator()<xsimd::avx2>();
  any = true;
#endif
#if XSIMD_WITH_NEON64
  f.template operator()<xsimd::neon64>();
  any = true;
#endif
  if (!any) f.template operator()<xsimd::default_arch>();
}

template <class Arch>
std::string arch_name() {
  return Arch::name();
}

template <class T>
bool same_bytes(const std::vector<T>& x, const std::vector<T>& y) {
  return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(T)) == 0);
}

// Runs simd<Arch> with `threads` threads and a NaN-filled workspace sized for them.
template <class Arch, class Args>
status run_simd(const exec::simd<Arch>& e, const Args& a, std::int32_t threads) {
  aligned_workspace ws(e.workspace_bytes(a.prob, threads));
  return threads == 1 ? e.run(a, ws.bytes) : e.run(a, ws.bytes, threads);
}

// Reference once, then every arch (1 thread against the reference; 2 and 16 threads bit-identical).
template <class TO, class TQ, class TKV, class Index>
comparison simd_vs_reference(const random_case<TQ, TKV>& c, const Index& index, bool with_lse = true,
                             exec::simd<xsimd::default_arch> options = {}, bool threads = true) {
  const problem p = c.prob();
  comparison worst;
  c.with_kv([&](auto kv) {
    output<TO> ref(c.spec, c.tokens_q(), with_lse);
    attention_args<TQ, decltype(kv), Index, TO> a{
        .prob = p, .q = c.q_view(), .kv = kv, .index = index, .o = ref.view, .lse = ref.lse};
    const status rs = run_executor(exec::reference{}, a);
    INFO("reference: " << std::string(rs.message()));
    REQUIRE(rs.ok());
    for_each_arch([&]<class Arch>() {
      INFO("arch " << arch_name<Arch>());
      exec::simd<Arch> e;
      e.decode_chunk_keys = options.decode_chunk_keys;
      e.decode_max_queries = options.decode_max_queries;
      output<TO> got(c.spec, c.tokens_q(), with_lse);
      a.o = got.view;
      a.lse = got.lse;
      const status ss = run_simd(e, a, 1);
      INFO("simd: " << std::string(ss.message()));
      REQUIRE(ss.ok());
      const comparison r = compare(p, got.view, ref.view, std::span<const float>(got.lse),
                                   std::span<const float>(ref.lse), output_tolerance<TO>);
      check(r);
      if (r.max_rel_o > worst.max_rel_o) worst = r;
      if (worst.rows == 0) worst = r;
      if (!threads) return;
      for (std::int32_t n : {2, 16}) {
        output<TO> again(c.spec, c.tokens_q(), with_lse);
        a.o = again.view;
        a.lse = again.lse;
        REQUIRE(run_simd(e, a, n).ok());
        INFO("threads " << n);
        CHECK(same_bytes(got.o, again.o));
        CHECK(same_bytes(got.lse, again.lse));
      }
    });
  });
  return worst;
}



}  // namespace

TEST_CASE_TEMPLATE("simd matches reference: random shapes, implicit indices", T, types<float, float, float>,
                   types<half, half, float>, types<bfloat16, bfloat16, float>, types<half, half, half>,
                   types<bfloat16, bfloat16, bfloat16>, types<float, bfloat16, float>, types<bfloat16, half, float>) {
  using TQ = typename T::q;
  using TKV = typename T::kv;
  using TO = typename T::o;
  const int cases = scaled(std::same_as<TQ, float> && std::same_as<TKV, float> ? 60 : 25);
  double worst = 0.0;
  for (int i = 0; i < cases; ++i) {
    const std::uint32_t seed = 0x51a0u + 7919u * static_cast<std::uint32_t>(i) +
                               1000003u * static_cast<std::uint32_t>(sizeof(TQ) + 3 * sizeof(TKV) + 5 * sizeof(TO));
    std::mt19937 rng(seed);
    const case_spec spec = random_spec(rng);
    const random_case<TQ, TKV> c(spec, rng);
    const bool with_lse = chance(rng, 0.85);
    // Small decode chunks so that decode rows of these short sequences are split too.
    exec::simd<xsimd::default_arch> options;
    options.decode_chunk_keys = pick(rng, {1, 50, 200, 2048});
    const std::string desc = spec.describe();
    INFO("seed " << seed << ": " << desc << (with_lse ? "" : ", no lse") << ", chunk keys "
                 << options.decode_chunk_keys);
    with_implicit_index(rng, [&](const auto& index, const std::string& name) {
      INFO("index " << name);
      const comparison r = simd_vs_reference<TO>(c, index, with_lse, options, i % 4 == 0);
      worst = std::max(worst, r.max_rel_o);
    });
  }
  const std::string types_name = std::string(element_name<TQ>) + "/" + element_name<TKV> + "/" + element_name<TO>;
  MESSAGE(types_name << ": worst relative error " << worst << " (tolerance " << output_tolerance<TO> << ")");
}

TEST_CASE("simd matches reference: head_dim 1..256") {
  exec::simd<xsimd::default_arch> options;
  options.decode_chunk_keys = 16;
  for_each_head_dim_case(
      [&](std::uint32_t seed, const case_spec& spec, std::mt19937& rng) {
        const random_case<float, float> c(spec, rng);
        INFO("seed " << seed << ": " << spec.describe());
        (void)simd_vs_reference<float>(c, index::causal_all{}, true, options, false);
      },
      SKIM_SIMD_TEST_SCALE < 1.0 ? 7 : 1);
}

TEST_CASE("simd matches reference: block sizes, odd and common, with partial last blocks") {
  for_each_block_size_case(
      [](int n, std::uint32_t seed, const case_spec& spec, std::mt19937& rng) {
        const random_case<half, half> c(spec, rng);
        INFO("seed " << seed << ": " << spec.describe());
        with_implicit_index(rng, [&](const auto& index, const std::string& name) {
          INFO("index " << name);
          (void)simd_vs_reference<float>(c, index, true, {}, n % 8 == 0);
        });
      },
      SKIM_SIMD_TEST_SCALE < 1.0 ? 4 : 1);
}

TEST_CASE("simd matches reference: GQA 1, 4, 8, both index scopes, paged and not, decode rows") {
  exec::simd<xsimd::default_arch> options;
  options.decode_chunk_keys = 64;  // 4 blocks per chunk: the decode rows split into 5 and 4 chunks
  for_each_gqa_case([&](std::uint32_t seed, const case_spec& spec, std::mt19937& rng) {
    const random_case<bfloat16, bfloat16> c(spec, rng);
    INFO("seed " << seed << ": " << spec.describe());
    (void)simd_vs_reference<float>(c, index::causal_all{}, true, options);
    (void)simd_vs_reference<float>(c, index::sliding_window{2}, true, options);
  });
}

// Head-major pages ([pages, heads_kv, page_size, head_dim]) hold the same values as token-major ones:
// every arch gives the same bits on both (prefill and decode rows, fused decode included).
TEST_CASE("simd: head-major pages give the bits of token-major pages") {
  for (int i = 0; i < scaled(8); ++i) {
    const std::uint32_t seed = 0x4a9eu + static_cast<std::uint32_t>(i);
    std::mt19937 rng(seed);
    case_spec spec;
    spec.heads_kv = pick(rng, {1, 2, 3});
    spec.heads_q = spec.heads_kv * pick(rng, {1, 4});
    spec.head_dim = pick(rng, {16, 40, 128});
    spec.block_q = pick(rng, {1, 16});
    spec.block_kv = pick(rng, {16, 32});
    spec.seqs = {{1, uniform(rng, 100, 600)}, {uniform(rng, 2, 40), uniform(rng, 40, 300)}, {0, 5}};
    spec.paged = true;
    spec.page_size = pick(rng, {8, 16, 24});
    const random_case<half, half> c(spec, rng);
    const problem p = c.prob();
    INFO("seed " << seed << ": " << spec.describe());
    const std::vector<half> k_hm = c.head_major_pages(c.k_pages), v_hm = c.head_major_pages(c.v_pages);
    for_each_arch([&]<class Arch>() {
      INFO("arch " << arch_name<Arch>());
      const exec::simd<Arch> e;
      output<float> token_pages(spec, c.tokens_q()), head_pages(spec, c.tokens_q());
      attention_args<half, paged_kv<half>, index::causal_all, float> a{
          .prob = p, .q = c.q_view(), .kv = c.paged(), .index = {}, .o = token_pages.view, .lse = token_pages.lse};
      REQUIRE(run_simd(e, a, 1).ok());
      a.kv = c.paged_head_major(k_hm, v_hm);
      a.o = head_pages.view;
      a.lse = head_pages.lse;
      REQUIRE(run_simd(e, a, 2).ok());
      CHECK(same_bytes(token_pages.o, head_pages.o));
      CHECK(same_bytes(token_pages.lse, head_pages.lse));
    });
  }
}

TEST_CASE("simd matches reference: stored indices (block_csr, block_table) with random selections") {
  for (int i = 0; i < scaled(30); ++i) {
    const std::uint32_t seed = 0x5e1ecu + static_cast<std::uint32_t>(i);
    std::mt19937 rng(seed);
    const case_spec spec = random_spec(rng);
    const random_case<half, half> c(spec, rng);
    const problem p = c.prob();
    const csr_storage csr = random_selection(p, rng, std::uniform_real_distribution<double>(0.05, 0.9)(rng));
    INFO("seed " << seed << ": " << spec.describe());
    exec::simd<xsimd::default_arch> options;
    options.decode_chunk_keys = pick(rng, {1, 64, 2048});
    (void)simd_vs_reference<float>(c, csr.view(), true, options, i % 3 == 0);
    // The same selection as a block_table.
    std::int32_t width = 1;
    for (std::size_t r = 0; r + 1 < csr.row_ptr.size(); ++r) width = std::max(width, csr.row_ptr[r + 1] - csr.row_ptr[r]);
    std::vector<std::int32_t> ids(static_cast<std::size_t>(p.index_rows()) * width, -1), counts(static_cast<std::size_t>(p.index_rows()));
    for (std::size_t r = 0; r < counts.size(); ++r) {
      counts[r] = csr.row_ptr[r + 1] - csr.row_ptr[r];
      for (std::int32_t k = 0; k < counts[r]; ++k) ids[r * width + k] = csr.col_idx[static_cast<std::size_t>(csr.row_ptr[r] + k)];
    }
    const index::block_table table{.ids = ids, .count = counts, .width = width};
    (void)simd_vs_reference<float>(c, table, true, options, false);
  }
}

static_assert(index::head_invariant_v<index::causal_all> && index::head_invariant_v<const index::sink&> &&
              index::head_invariant_v<index::sliding_window> &&
              index::head_invariant_v<index::block_union<index::sink, index::sliding_window, index::causal_all>>);
static_assert(!index::head_invariant_v<index::block_csr> && !index::head_invariant_v<index::block_table> &&
              !index::head_invariant_v<index::block_union<index::sink, index::block_csr>>);

// Decode rows of a head-invariant index (implicit rules, or a stored row per query block shared by
// its heads: index::head_shared) run fused (every kv head in index head 0's items); the
// same selection stored per head (a CSR: not head-invariant) runs per head. Each kv group's rows go
// through the same tile kernels in the same order either way, so with one index per kv head the
// outputs are bit-identical; both also match the reference (and 2 and 16 threads, items in reverse).
TEST_CASE("simd fused decode: a head-invariant index gives the bits of the same selection stored per head") {
  for (int i = 0; i < scaled(24); ++i) {
    const std::uint32_t seed = 0xf05eu + static_cast<std::uint32_t>(i);
    std::mt19937 rng(seed);
    case_spec spec;
    spec.heads_kv = pick(rng, {2, 3, 4});
    spec.heads_q = spec.heads_kv * pick(rng, {1, 3, 4});
    spec.head_dim = pick(rng, {16, 40, 64, 128});
    spec.block_q = pick(rng, {1, 2, 4, 16});
    spec.block_kv = pick(rng, {7, 16, 32});
    spec.mask = chance(rng, 0.8) ? mask_kind::causal : mask_kind::none;
    // Decode rows (1..4 queries), long and short, a partial last block, an empty sequence.
    spec.seqs = {{1, uniform(rng, 200, 700)}, {uniform(rng, 2, 4), uniform(rng, 30, 400)}, {1, uniform(rng, 1, 20)},
                 {0, 0}, {1, 1}};
    spec.paged = chance(rng, 0.4);
    spec.page_size = pick(rng, {16, 24});
    const random_case<half, half> c(spec, rng);
    const problem p = c.prob();
    exec::simd<xsimd::default_arch> options;
    options.decode_chunk_keys = pick(rng, {1, 64, 100, 2048});
    INFO("seed " << seed << ": " << spec.describe() << ", chunk keys " << options.decode_chunk_keys);
    const auto check_fused = [&](const auto& implicit, const char* name) {
      INFO("index " << name);
      (void)simd_vs_reference<float>(c, implicit, true, options, i % 2 == 0);
      csr_storage csr;
      REQUIRE(for_each_row(p, [&](const row_info& r) {
                std::set<std::int32_t> ids;
                for (auto cur = implicit.cursor(r); !cur.done(); cur.next()) ids.insert(cur.id());
                csr.add_row(ids);
              }).ok());
      c.with_kv([&](auto kv) {
        for_each_arch([&]<class Arch>() {
          INFO("arch " << arch_name<Arch>());
          exec::simd<Arch> e;
          e.decode_chunk_keys = options.decode_chunk_keys;
          output<float> fused(spec, c.tokens_q()), per_head(spec, c.tokens_q());
          attention_args<half, decltype(kv), std::remove_cvref_t<decltype(implicit)>, float> a{
              .prob = p, .q = c.q_view(), .kv = kv, .index = implicit, .o = fused.view, .lse = fused.lse};
          REQUIRE(run_simd(e, a, 1).ok());
          attention_args<half, decltype(kv), index::block_csr, float> b{
              .prob = p, .q = c.q_view(), .kv = kv, .index = csr.view(), .o = per_head.view, .lse = per_head.lse};
          REQUIRE(run_simd(e, b, 1).ok());
          CHECK(same_bytes(fused.o, per_head.o));
          CHECK(same_bytes(fused.lse, per_head.lse));
          // An engine's pool: items in reverse order, on two slots (the empty items included).
          output<float> items(spec, c.tokens_q());
          a.o = items.view;
          a.lse = items.lse;
          aligned_workspace ws(e.workspace_bytes(p, 2));
          REQUIRE(e.prepare(a, ws.bytes, 2).ok());
          for (std::int64_t k = e.item_count(p) - 1; k >= 0; --k) {
            REQUIRE(e.run_items(a, ws.bytes, k, k + 1, static_cast<std::int32_t>(k % 2)).ok());
          }
          CHECK(same_bytes(fused.o, items.o));
          CHECK(same_bytes(fused.lse, items.lse));
        });
      });
    };
    check_fused(index::causal_all{}, "causal_all");
    check_fused(index::sliding_window{uniform(rng, 1, 5)}, "sliding_window");
    check_fused(index::make_union(index::sink{1}, index::sliding_window{2}), "sink 1 + sliding_window 2");
    // A stored selection shared by the heads of each query block: half of its visible blocks.
    using shared_table = index::head_shared<index::block_table>;
    std::vector<std::vector<std::int32_t>> rows;
    REQUIRE(for_each_row(shared_table::shared_problem(p), [&](const row_info& r) {
              rows.emplace_back();
              for (std::int32_t j = 0; j < r.visible_blocks; ++j) {
                if (chance(rng, 0.5)) rows.back().push_back(j);
              }
            }).ok());
    std::int32_t width = 1;
    for (const auto& r : rows) width = std::max(width, static_cast<std::int32_t>(r.size()));
    std::vector<std::int32_t> ids(rows.size() * static_cast<std::size_t>(width), index::block_table::pad), count;
    for (std::size_t r = 0; r < rows.size(); ++r) {
      std::copy(rows[r].begin(), rows[r].end(), ids.begin() + static_cast<std::ptrdiff_t>(r * static_cast<std::size_t>(width)));
      count.push_back(static_cast<std::int32_t>(rows[r].size()));
    }
    check_fused(shared_table{.rows = {ids, count, width}, .index_heads = p.index_heads()}, "head_shared block_table");
  }
}

TEST_CASE("simd: fully masked rows give exactly o = 0 and lse = -inf") {
  std::mt19937 rng(0xe3e3u);
  case_spec spec;
  spec.heads_q = 4;
  spec.heads_kv = 2;
  spec.head_dim = 24;
  spec.block_q = 4;
  spec.block_kv = 8;
  spec.seqs = {{30, 10}, {5, 0}, {6, 20}, {1, 0}};
  const random_case<float, float> c(spec, rng);
  const comparison r = simd_vs_reference<float>(c, index::causal_all{});
  CHECK(r.empty_rows == (20 + 5 + 1) * spec.heads_q);
  const comparison none = simd_vs_reference<float>(c, index::sink{0});
  CHECK(none.empty_rows == none.rows);
}

TEST_CASE("simd: bit-identical whatever the workspace held, the thread count or the order of items") {
  std::mt19937 rng(0xde7u);
  case_spec spec;
  spec.heads_q = 8;
  spec.heads_kv = 2;
  spec.head_dim = 80;
  spec.block_q = 16;
  spec.block_kv = 32;
  spec.seqs = {{90, 200}, {1, 700}, {33, 33}, {2, 500}};
  spec.paged = true;
  spec.page_size = 24;
  const random_case<half, half> c(spec, rng);
  const problem p = c.prob();
  for_each_arch([&]<class Arch>() {
    INFO("arch " << arch_name<Arch>());
    exec::simd<Arch> e;
    e.decode_chunk_keys = 128;
    output<float> first(spec, c.tokens_q());
    attention_args<half, paged_kv<half>, index::causal_all, float> a{
        .prob = p, .q = c.q_view(), .kv = c.paged(), .index = {}, .o = first.view, .lse = first.lse};
    REQUIRE(run_executor(e, a, std::byte{0xff}).ok());
    CHECK(first.o[0] != first.o[first.o.size() / 2]);
    for (std::int32_t threads : {1, 2, 3, 16}) {
      output<float> again(spec, c.tokens_q());
      a.o = again.view;
      a.lse = again.lse;
      aligned_workspace ws(e.workspace_bytes(p, threads), std::byte{0x00});
      REQUIRE(e.run(a, ws.bytes, threads).ok());
      INFO("threads " << threads);
      CHECK(same_bytes(first.o, again.o));
      CHECK(same_bytes(first.lse, again.lse));
    }
    // An engine's pool: items in reverse order, alternating between two slots.
    output<float> items(spec, c.tokens_q());
    a.o = items.view;
    a.lse = items.lse;
    aligned_workspace ws(e.workspace_bytes(p, 2));
    REQUIRE(e.prepare(a, ws.bytes, 2).ok());
    const std::int64_t n = e.item_count(p);
    CHECK(n > p.total_q_blocks() * p.heads_kv);  // the decode rows are split
    for (std::int64_t i = n - 1; i >= 0; --i) REQUIRE(e.run_items(a, ws.bytes, i, i + 1, static_cast<std::int32_t>(i % 2)).ok());
    CHECK(same_bytes(first.o, items.o));
    CHECK(same_bytes(first.lse, items.lse));
    // Run again on the same workspace without prepare(): the merge counters were left at zero.
    REQUIRE(e.run_items(a, ws.bytes, 0, n, 1).ok());
    CHECK(same_bytes(first.o, items.o));
  });
}

TEST_CASE("simd::run allocates nothing, and rejects bad input like scalar") {
  for (std::uint32_t seed = 0xa110u; seed < 0xa110u + static_cast<std::uint32_t>(scaled(12)); ++seed) {
    std::mt19937 rng(seed);
    const case_spec spec = random_spec(rng, 1e6);
    const random_case<half, half> c(spec, rng);
    INFO("seed " << seed << ": " << spec.describe());
    output<float> o(spec, c.tokens_q());
    for_each_arch([&]<class Arch>() {
      INFO("arch " << arch_name<Arch>());
      exec::simd<Arch> e;
      e.decode_chunk_keys = 32;
      aligned_workspace ws(e.workspace_bytes(c.prob()));
      c.with_kv([&](auto kv) {
        const auto run_counted = [&](const auto& index) {
          attention_args<half, decltype(kv), std::remove_cvref_t<decltype(index)>, float> a{
              .prob = c.prob(), .q = c.q_view(), .kv = kv, .index = index, .o = o.view, .lse = o.lse};
          allocation_counter counter;
          const status s = e.run(a, ws.bytes);
          const long n = counter.stop();
          REQUIRE(s.ok());
          CHECK(n == 0);
          allocation_counter counter_err;
          const status too_small = e.run(a, ws.bytes.first(ws.bytes.size() / 2));
          CHECK(counter_err.stop() == 0);
          CHECK(!too_small.ok());
        };
        run_counted(index::causal_all{});
        run_counted(index::sink{1});
        run_counted(index::sliding_window{2});
      });
    });
  }
}

TEST_CASE("simd reports a bad block id as a status, per id, like scalar") {
  std::mt19937 rng(0xbadu);
  case_spec spec;
  spec.heads_q = 2;
  spec.heads_kv = 1;
  spec.head_dim = 16;
  spec.seqs = {{40, 40}};
  const random_case<float, float> c(spec, rng);
  const problem p = c.prob();
  // Rows have 1, 2, 3 visible blocks; row 1 lists block 5.
  const std::vector<std::int32_t> row_ptr{0, 1, 3, 6}, col_idx{0, 0, 5, 0, 1, 2};
  const index::block_csr bad{row_ptr, col_idx};
  output<float> o(spec, c.tokens_q());
  for_each_arch([&]<class Arch>() {
    const exec::simd<Arch> e;
    attention_args<float, contiguous_kv<float>, index::block_csr, float> a{
        .prob = p, .q = c.q_view(), .kv = c.contiguous(), .index = bad, .o = o.view, .lse = o.lse};
    const status s = run_executor(e, a);
    CHECK(s.code() == status_code::invalid_index);
    aligned_workspace ws(e.workspace_bytes(p));
    // run_items skips validate(): the per-id check still stops it.
    const status items = e.run_items(a, ws.bytes, 0, e.item_count(p));
    CHECK(items.code() == status_code::invalid_index);
    MESSAGE(std::string(items.message()));
  });
}

TEST_CASE("simd: a split decode row checks every chunk's ids, each against the one before it") {
  std::mt19937 rng(0xc0ffee);
  case_spec spec;
  spec.heads_q = 2;
  spec.heads_kv = 1;
  spec.head_dim = 16;
  spec.seqs = {{1, 300}};  // one decode row of 19 blocks of 16 keys
  const random_case<float, float> c(spec, rng);
  const problem p = c.prob();
  output<float> o(spec, c.tokens_q());
  // Chunks of 2 blocks (positions 0-1, 2-3, ...). Position 7 (chunk 3's second id) goes back to
  // block 5, and position 8 (chunk 4's first id) is fine after it: chunk 4 must still see the 5
  // before it, and the item of chunk 3 catches 7 -> 5.
  for (const auto& [ids, where] : {std::pair{std::vector<std::int32_t>{0, 1, 2, 3, 4, 6, 7, 5, 8, 9, 18}, "chunk 3"},
                                   std::pair{std::vector<std::int32_t>{0, 1, 2, 3, 4, 6, 7, 8, 8, 9, 18}, "chunk 4"},
                                   std::pair{std::vector<std::int32_t>{0, 1, 2, 3, 4, 6, 7, 8, 9, 19}, "the end"}}) {
    INFO("bad id at " << std::string(where));
    const std::vector<std::int32_t> row_ptr{0, static_cast<std::int32_t>(ids.size())};
    const index::block_csr bad{row_ptr, ids};
    for_each_arch([&]<class Arch>() {
      exec::simd<Arch> e;
      e.decode_chunk_keys = 32;
      attention_args<float, contiguous_kv<float>, index::block_csr, float> a{
          .prob = p, .q = c.q_view(), .kv = c.contiguous(), .index = bad, .o = o.view, .lse = o.lse};
      aligned_workspace ws(e.workspace_bytes(p));
      REQUIRE(e.item_count(p) == 10);
      status first_bad;  // run_items skips validate(): the per-id checks of some item must stop it
      for (std::int64_t i = 0; i < e.item_count(p); ++i) {
        const status s = e.run_items(a, ws.bytes, i, i + 1);
        if (first_bad.ok() && !s.ok()) first_bad = s;
      }
      CHECK(first_bad.code() == status_code::invalid_index);
      MESSAGE(std::string(first_bad.message()));
    });
  }
}

TEST_CASE("simd matches reference on int8 K/V with a scale per (block, kv head)") {
  for (int i = 0; i < scaled(30); ++i) {
    const std::uint32_t seed = 0x18a0u + static_cast<std::uint32_t>(i);
    std::mt19937 rng(seed);
    case_spec spec = random_spec(rng);
    spec.paged = false;  // int8_kv is contiguous (packed varlen)
    const random_case<float, float> c(spec, rng);
    const problem p = c.prob();
    INFO("seed " << seed << ": " << spec.describe());
    // int8 data, scales per (block, head) in [0.004, 0.012] (values of about unit variance, like the fp cases); the reference reads the dequantised
    // values scale · q, rounded to float as simd forms them.
    std::vector<std::int8_t> k8(c.k.size()), v8(c.v.size());
    std::uniform_int_distribution<int> q8(-127, 127);
    for (auto& x : k8) x = static_cast<std::int8_t>(q8(rng));
    for (auto& x : v8) x = static_cast<std::int8_t>(q8(rng));
    std::vector<float> ks(static_cast<std::size_t>(p.total_kv_blocks() * p.heads_kv)), vs(ks.size());
    std::uniform_real_distribution<float> sd(0.004f, 0.012f);
    for (auto& x : ks) x = sd(rng);
    for (auto& x : vs) x = sd(rng);
    std::vector<float> kf(k8.size()), vf(v8.size());
    const std::size_t row = static_cast<std::size_t>(p.heads_kv) * p.head_dim;
    for (std::int32_t b = 0; b < p.batch(); ++b) {
      for (std::int32_t t = 0; t < p.seq_len_kv(b); ++t) {
        for (std::int32_t h = 0; h < p.heads_kv; ++h) {
          const std::size_t block = static_cast<std::size_t>(p.kv_block_offset(b) + t / p.block_kv);
          const std::size_t sc = block * p.heads_kv + h;
          const std::size_t at = static_cast<std::size_t>(p.cu_seqlens_kv[b] + t) * row + static_cast<std::size_t>(h) * p.head_dim;
          for (std::int32_t e = 0; e < p.head_dim; ++e) {
            kf[at + e] = ks[sc] * static_cast<float>(k8[at + e]);
            vf[at + e] = vs[sc] * static_cast<float>(v8[at + e]);
          }
        }
      }
    }
    const std::int32_t tokens_kv = p.tokens_kv();
    output<float> ref(spec, c.tokens_q());
    attention_args<float, contiguous_kv<float>, index::causal_all, float> ra{
        .prob = p, .q = c.q_view(),
        .kv = {.k = strided_view<const float>::token_major(kf.data(), tokens_kv, p.heads_kv, p.head_dim),
               .v = strided_view<const float>::token_major(vf.data(), tokens_kv, p.heads_kv, p.head_dim)},
        .index = {}, .o = ref.view, .lse = ref.lse};
    REQUIRE(run_executor(exec::reference{}, ra).ok());
    const int8_kv kv{.k = strided_view<const std::int8_t>::token_major(k8.data(), tokens_kv, p.heads_kv, p.head_dim),
                     .v = strided_view<const std::int8_t>::token_major(v8.data(), tokens_kv, p.heads_kv, p.head_dim),
                     .k_scales = ks, .v_scales = vs};
    for_each_arch([&]<class Arch>() {
      INFO("arch " << arch_name<Arch>());
      exec::simd<Arch> e;
      e.decode_chunk_keys = pick(rng, {1, 64, 2048});
      output<float> got(spec, c.tokens_q());
      attention_args<float, int8_kv, index::causal_all, float> a{
          .prob = p, .q = c.q_view(), .kv = kv, .index = {}, .o = got.view, .lse = got.lse};
      const status s = run_simd(e, a, 1);
      INFO(std::string(s.message()));
      REQUIRE(s.ok());
      check(compare(p, got.view, ref.view, std::span<const float>(got.lse), std::span<const float>(ref.lse),
                    output_tolerance<float>));
      output<float> again(spec, c.tokens_q());
      a.o = again.view;
      a.lse = again.lse;
      REQUIRE(run_simd(e, a, 2).ok());
      CHECK(same_bytes(got.o, again.o));
    });
    // A scale array of the wrong size is a status.
    if (vs.empty()) continue;
    int8_kv short_scales = kv;
    short_scales.v_scales = std::span<const float>(vs).first(vs.size() - 1);
    output<float> o(spec, c.tokens_q());
    attention_args<float, int8_kv, index::causal_all, float> bad{
        .prob = p, .q = c.q_view(), .kv = short_scales, .index = {}, .o = o.view, .lse = o.lse};
    CHECK(run_simd(exec::simd<xsimd::default_arch>{}, bad, 1).code() == status_code::shape_mismatch);
  }
}
