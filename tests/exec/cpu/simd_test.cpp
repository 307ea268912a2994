// exec::simd<Arch>'s own promises, for every xsimd arch this translation unit is compiled for
// (executors.hpp: simd<default_arch> in skim_tests; tests/CMakeLists.txt builds this file again with
// -mavx2 -mfma and with -mavx512f ..., and for aarch64 under qemu): decode with fused kv heads (a
// head-invariant index: one item reads every kv head's tiles), the runs of consecutive small blocks
// a decode tile takes, the per-id checks of run_items and of split decode rows, int8 and fp8 e4m3
// K/V, and the fp8 loads of every code. What every CPU executor promises (random shapes and index
// forms against the reference, workspace, threads, storage, allocation) is conformance_test.cpp's.
#include "skim/exec/cpu/simd.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "exec/cpu/executors.hpp"
#include "skim/core/quantized.hpp"
#include "skim/exec/cpu/reference.hpp"
#include "skim/index/block_csr.hpp"
#include "skim/index/block_table.hpp"
#include "skim/index/block_union.hpp"
#include "skim/index/causal_all.hpp"
#include "skim/index/head_invariant.hpp"
#include "skim/index/head_shared.hpp"
#include "skim/index/sink.hpp"
#include "skim/index/sliding_window.hpp"
#include "support/compare.hpp"
#include "support/executor_cases.hpp"
#include "support/random_case.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

using namespace skim;
using namespace skim::test;

// Decode rows of a head-invariant index (implicit rules, or a stored row per query block shared by
// its heads: index::head_shared) run fused (every kv head in index head 0's items); the
// same selection stored per head (a CSR: not head-invariant) runs per head. Each kv group's rows go
// through the same tile kernels in the same order either way, so with one index per kv head the
// outputs are bit-identical; both also match the reference (and 2 and 16 threads, items in reverse).
TEST_CASE_TEMPLATE("simd fused decode: a head-invariant index gives the bits of the same selection stored per head", E,
                   SKIM_TEST_SIMD_EXECUTORS) {
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
    exec_options options;
    options.decode_chunk_keys = pick(rng, {1, 64, 100, 2048});
    INFO("seed " << seed << ": " << spec.describe() << ", chunk keys " << options.decode_chunk_keys);
    const auto check_fused = [&](const auto& implicit, const char* name) {
      INFO("index " << name);
      REQUIRE(conform<E, float>(c, implicit, {.exec = options, .threads = i % 2 == 0}, "fused decode",
                                std::to_string(seed) + " " + name)
                  .ran);
      csr_storage csr;
      REQUIRE(for_each_row(p, [&](const row_info& r) {
                std::set<std::int32_t> ids;
                for (auto cur = implicit.cursor(r); !cur.done(); cur.next()) ids.insert(cur.id());
                csr.add_row(ids);
              }).ok());
      c.with_kv([&](auto kv) {
        {
          const E e = make_executor<E>(options);
          output<float> fused(spec, c.tokens_q()), per_head(spec, c.tokens_q());
          attention_args<half, decltype(kv), std::remove_cvref_t<decltype(implicit)>, float> a{
              .prob = p, .q = c.q_view(), .kv = kv, .index = implicit, .o = fused.view, .lse = fused.lse};
          REQUIRE(run_on(e, a, 1).ok());
          attention_args<half, decltype(kv), index::block_csr, float> b{
              .prob = p, .q = c.q_view(), .kv = kv, .index = csr.view(), .o = per_head.view, .lse = per_head.lse};
          REQUIRE(run_on(e, b, 1).ok());
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
        }
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

// A decode unit's ids become groups of at most `most` rising ids, consecutive or not, each run with
// the group after it (empty after the last), in order; no ids, no groups.
TEST_CASE("simd decode: block_groups takes rising ids `most` a group, in order, each group knowing the next") {
  using ids = std::vector<std::int32_t>;
  using group = std::pair<ids, ids>;  // a group's ids, the next group's
  const auto groups_of = [](std::int32_t most, const ids& in) {
    std::vector<group> out;
    exec::detail::block_groups groups{most, [&](std::span<const std::int32_t> g, std::span<const std::int32_t> next) {
                                        out.push_back({ids(g.begin(), g.end()), ids(next.begin(), next.end())});
                                      }};
    for (const std::int32_t id : in) groups.add(id);
    groups.flush();
    return out;
  };
  const ids in{0, 1, 2, 3, 4, 5, 9, 10, 12, 13, 14};
  CHECK(groups_of(4, in) == std::vector<group>{{{0, 1, 2, 3}, {4, 5, 9, 10}}, {{4, 5, 9, 10}, {12, 13, 14}}, {{12, 13, 14}, {}}});
  CHECK(groups_of(2, in) == std::vector<group>{{{0, 1}, {2, 3}}, {{2, 3}, {4, 5}}, {{4, 5}, {9, 10}}, {{9, 10}, {12, 13}},
                                               {{12, 13}, {14}}, {{14}, {}}});
  CHECK(groups_of(1, in).size() == in.size());
  CHECK(groups_of(1, in)[5] == group{{5}, {9}});
  CHECK(groups_of(16, {7}) == std::vector<group>{{{7}, {}}});
  CHECK(groups_of(3, {7, 8, 20}) == std::vector<group>{{{7, 8, 20}, {}}});
  CHECK(groups_of(3, {7, 8, 20, 21}) == std::vector<group>{{{7, 8, 20}, {21}}, {{21}, {}}});
  // Ids that do not rise (an index out of canonical order) start a new group.
  CHECK(groups_of(4, {5, 6, 2, 3, 3}) == std::vector<group>{{{5, 6}, {2, 3}}, {{2, 3}, {3}}, {{3}, {}}});
  CHECK(groups_of(4, {}).empty());
}

TEST_CASE_TEMPLATE("simd reports a bad block id as a status, per id, like scalar", E, SKIM_TEST_SIMD_EXECUTORS) {
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
  {
    const E e;
    attention_args<float, contiguous_kv<float>, index::block_csr, float> a{
        .prob = p, .q = c.q_view(), .kv = c.contiguous(), .index = bad, .o = o.view, .lse = o.lse};
    const status s = run_executor(e, a);
    CHECK(s.code() == status_code::invalid_index);
    aligned_workspace ws(e.workspace_bytes(p));
    // run_items skips validate(): the per-id check still stops it.
    const status items = e.run_items(a, ws.bytes, 0, e.item_count(p));
    CHECK(items.code() == status_code::invalid_index);
    MESSAGE(std::string(items.message()));
  }
}

TEST_CASE_TEMPLATE("simd: a split decode row checks every chunk's ids, each against the one before it", E,
                   SKIM_TEST_SIMD_EXECUTORS) {
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
  for (const auto& bad_case : {std::pair{std::vector<std::int32_t>{0, 1, 2, 3, 4, 6, 7, 5, 8, 9, 18}, "chunk 3"},
                                std::pair{std::vector<std::int32_t>{0, 1, 2, 3, 4, 6, 7, 8, 8, 9, 18}, "chunk 4"},
                                std::pair{std::vector<std::int32_t>{0, 1, 2, 3, 4, 6, 7, 8, 9, 19}, "the end"}}) {
    // Named copies, not a structured binding: INFO's lambda captures them (clang 14 cannot capture bindings).
    const std::vector<std::int32_t>& ids = bad_case.first;
    const std::string where = bad_case.second;
    INFO("bad id at " << where);
    const std::vector<std::int32_t> row_ptr{0, static_cast<std::int32_t>(ids.size())};
    const index::block_csr bad{row_ptr, ids};
    {
      E e;
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
    }
  }
}

namespace {

// The Arch of exec::simd<Arch>.
template <class E>
struct arch_of;
template <class Arch>
struct arch_of<exec::simd<Arch>> {
  using type = Arch;
};

// Random quantised K/V of codes Code against the reference given the dequantised values: random
// shapes (random_spec: odd and partial blocks, GQA, varlen, empty and fully masked rows), random
// codes and random scales per (block, head) of values of about unit variance; decode chunks of 1,
// 64 and 2048 keys; 1 and 2 threads bit-identical; a short scale array is a status.
// - int8: codes in [-127, 127], scales in [0.004, 0.012];
// - fp8 e4m3: every finite code (all but 0x7f and 0xff, subnormals and -0 included), scales in
//   [0.005, 0.015] (uniform codes are log-spread up to 448: their RMS is about 100).
template <class E, class Code>
void check_quantized_against_reference(std::uint32_t first_seed, int cases) {
  using kv_type = quantized_kv<Code>;
  for (int i = 0; i < cases; ++i) {
    const std::uint32_t seed = first_seed + static_cast<std::uint32_t>(i);
    std::mt19937 rng(seed);
    case_spec spec = random_spec(rng);
    spec.paged = false;  // quantized_kv is contiguous (packed varlen)
    const random_case<float, float> c(spec, rng);
    const problem p = c.prob();
    INFO("seed " << seed << ": " << spec.describe());
    // Codes, then scales per (block, head); the reference reads the dequantised values
    // scale · to_float(code), rounded to float as simd forms them.
    std::vector<Code> k8(c.k.size()), v8(c.v.size());
    float lo = 0.004f, hi = 0.012f;
    if constexpr (std::is_same_v<Code, std::int8_t>) {
      std::uniform_int_distribution<int> q8(-127, 127);
      for (auto& x : k8) x = static_cast<std::int8_t>(q8(rng));
      for (auto& x : v8) x = static_cast<std::int8_t>(q8(rng));
    } else {
      std::uniform_int_distribution<int> code(0, 253);  // 254 finite codes: 0x7f and 0xff skipped
      const auto draw = [&] {
        const int u = code(rng);
        return fp8_e4m3::from_bits(static_cast<std::uint8_t>(u < 0x7f ? u : u + 1));
      };
      for (auto& x : k8) x = draw();
      for (auto& x : v8) x = draw();
      lo = 0.005f;
      hi = 0.015f;
    }
    const auto value = [](Code x) {
      if constexpr (std::is_same_v<Code, std::int8_t>) return static_cast<float>(x);
      else return x.to_float();
    };
    std::vector<float> ks(static_cast<std::size_t>(p.total_kv_blocks() * p.heads_kv)), vs(ks.size());
    std::uniform_real_distribution<float> sd(lo, hi);
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
            kf[at + e] = ks[sc] * value(k8[at + e]);
            vf[at + e] = vs[sc] * value(v8[at + e]);
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
    const kv_type kv{.k = strided_view<const Code>::token_major(k8.data(), tokens_kv, p.heads_kv, p.head_dim),
                     .v = strided_view<const Code>::token_major(v8.data(), tokens_kv, p.heads_kv, p.head_dim),
                     .k_scales = ks, .v_scales = vs};
    {
      E e;
      e.decode_chunk_keys = pick(rng, {1, 64, 2048});
      output<float> got(spec, c.tokens_q());
      attention_args<float, kv_type, index::causal_all, float> a{
          .prob = p, .q = c.q_view(), .kv = kv, .index = {}, .o = got.view, .lse = got.lse};
      const status s = run_on(e, a, 1);
      INFO(std::string(s.message()));
      REQUIRE(s.ok());
      check(compare(p, got.view, ref.view, std::span<const float>(got.lse), std::span<const float>(ref.lse),
                    output_tolerance<float>));
      output<float> again(spec, c.tokens_q());
      a.o = again.view;
      a.lse = again.lse;
      REQUIRE(run_on(e, a, 2).ok());
      CHECK(same_bytes(got.o, again.o));
    }
    // A scale array of the wrong size is a status.
    if (vs.empty()) continue;
    kv_type short_scales = kv;
    short_scales.v_scales = std::span<const float>(vs).first(vs.size() - 1);
    output<float> o(spec, c.tokens_q());
    attention_args<float, kv_type, index::causal_all, float> bad{
        .prob = p, .q = c.q_view(), .kv = short_scales, .index = {}, .o = o.view, .lse = o.lse};
    CHECK(run_on(E{}, bad, 1).code() == status_code::shape_mismatch);
  }
}

}  // namespace

TEST_CASE_TEMPLATE("simd matches reference on int8 K/V with a scale per (block, kv head)", E,
                   SKIM_TEST_SIMD_EXECUTORS) {
  check_quantized_against_reference<E, std::int8_t>(0x18a0u, scaled(30));
}

TEST_CASE_TEMPLATE("simd matches reference on fp8 e4m3 K/V with a scale per (block, kv head)", E,
                   SKIM_TEST_SIMD_EXECUTORS) {
  check_quantized_against_reference<E, fp8_e4m3>(0xf8a0u, scaled(30));
}

namespace {

// While alive, the FPU flushes denormal results to zero and reads denormal operands as zero
// (x86: MXCSR FTZ and DAZ; AArch64: FPCR.FZ), as an engine built with -ffast-math runs.
struct flush_denormals {
#if defined(__x86_64__) || defined(__i386__)
  unsigned saved = _mm_getcsr();
  flush_denormals() noexcept { _mm_setcsr(saved | 0x8040u); }
  ~flush_denormals() { _mm_setcsr(saved); }
#elif defined(__aarch64__)
  std::uint64_t saved = fpcr();
  flush_denormals() noexcept { set_fpcr(saved | (std::uint64_t{1} << 24)); }
  ~flush_denormals() { set_fpcr(saved); }
  static std::uint64_t fpcr() noexcept {
    std::uint64_t r;
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(r));
    return r;
  }
  static void set_fpcr(std::uint64_t r) noexcept { __asm__ __volatile__("msr fpcr, %0" : : "r"(r)); }
#endif
  flush_denormals(const flush_denormals&) = delete;
  flush_denormals& operator=(const flush_denormals&) = delete;
};

// The full and the partial (n lanes) load at p. Not inlined, so that the loads stay between the
// mode switches of a caller's flush_denormals.
template <class Arch>
[[gnu::noinline]] void load_lanes(const fp8_e4m3* p, std::int32_t n, float* full, float* part) {
  exec::simd_detail::load_float<Arch>(p).store_aligned(full);
  exec::simd_detail::load_float_partial<Arch>(p, n).store_aligned(part);
}

}  // namespace

// The arch's fp8 load (a register's worth) and the partial load (fewer lanes, zeros after) give
// fp8_e4m3::to_float's bits for every code in every lane (NaN codes a NaN, -0 a -0), from aligned
// and unaligned addresses, also with denormals flushed (no denormal is formed on the way); and
// to_float is the E4M3FN value, computed here independently.
TEST_CASE_TEMPLATE("simd load_float reads every fp8 e4m3 code in every lane as fp8_e4m3::to_float", E,
                   SKIM_TEST_SIMD_EXECUTORS) {
  using Arch = typename arch_of<E>::type;
  constexpr std::int32_t w = exec::simd_arch::width<Arch>;
  for (int code = 0; code < 256; ++code) {
    const fp8_e4m3 x = fp8_e4m3::from_bits(static_cast<std::uint8_t>(code));
    const int exp = (code >> 3) & 0xf, mant = code & 7;
    const double magnitude = exp == 0 ? std::ldexp(mant, -9) : std::ldexp(8 + mant, exp - 10);
    const double expected = (code & 0x80) ? -magnitude : magnitude;
    INFO("code " << code);
    if ((code & 0x7f) == 0x7f) CHECK(std::isnan(x.to_float()));
    else CHECK(std::bit_cast<std::uint32_t>(x.to_float()) == std::bit_cast<std::uint32_t>(static_cast<float>(expected)));
  }
  // Lane i of start s holds code (s + 37·i) mod 256: over the 256 starts every lane sees every code.
  alignas(64) std::array<fp8_e4m3, 64 + 3> codes{};
  std::int64_t lanes = 0, bad = 0;
  std::string first_bad;
  for (const bool flush : {false, true}) {
    for (const std::int32_t offset : {0, 1, 3}) {
      const fp8_e4m3* p = codes.data() + offset;
      for (int s = 0; s < 256; ++s) {
        for (std::int32_t i = 0; i < w; ++i) codes[static_cast<std::size_t>(offset + i)].bits = static_cast<std::uint8_t>(s + 37 * i);
        alignas(64) float full[w], part[w];
        const std::int32_t n = s % w;
        if (flush) {
          const flush_denormals guard;
          load_lanes<Arch>(p, n, full, part);
        } else {
          load_lanes<Arch>(p, n, full, part);
        }
        for (std::int32_t i = 0; i < w; ++i) {
          ++lanes;
          const float want = p[i].to_float();
          const bool nan_code = (p[i].bits & 0x7f) == 0x7f;
          const bool ok_full = std::bit_cast<std::uint32_t>(full[i]) == std::bit_cast<std::uint32_t>(want) &&
                               std::isnan(full[i]) == nan_code;
          const bool ok_part = i < n ? std::bit_cast<std::uint32_t>(part[i]) == std::bit_cast<std::uint32_t>(want)
                                     : std::bit_cast<std::uint32_t>(part[i]) == 0u;
          if (!(ok_full && ok_part) && bad++ == 0) {
            first_bad = "code " + std::to_string(p[i].bits) + " in lane " + std::to_string(i) + " at offset " +
                        std::to_string(offset) + (flush ? " (denormals flushed)" : "") + ": " + std::to_string(full[i]) +
                        " (partial " + std::to_string(part[i]) + "), expected " + std::to_string(want);
          }
        }
      }
    }
  }
  INFO("lanes " << lanes << ", first mismatch: " << first_bad);
  CHECK(bad == 0);
}
