// The CPU executors' conformance suite: every executor of this binary (executors.hpp: reference,
// scalar, simd<Arch> per compiled arch, the runtime dispatch) against exec::reference in double
// precision on random shapes — all element types, odd and common head dims, partial blocks, GQA
// 1/4/8 under both index scopes, varlen with empty sequences, decode rows, paged and head-major
// storage, implicit and stored indices, fully masked rows — and what every executor promises
// beside the numbers: bits independent of the workspace's contents, the thread count, the K/V
// storage and the index form, and no allocation. The cases come from fixed seeds: every run sees
// the same data.
#include <doctest/doctest.h>

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "exec/cpu/executors.hpp"
#include "skim/index/block_csr.hpp"
#include "skim/index/block_table.hpp"
#include "skim/index/block_union.hpp"
#include "skim/index/causal_all.hpp"
#include "skim/index/convert.hpp"
#include "skim/index/dense_block_mask.hpp"
#include "skim/index/sink.hpp"
#include "skim/index/sliding_window.hpp"
#include "support/allocation_counter.hpp"
#include "support/compare.hpp"
#include "support/executor_cases.hpp"
#include "support/random_case.hpp"

using namespace skim;
using namespace skim::test;

TEST_CASE_TEMPLATE("executors match reference: random shapes, implicit indices", E, SKIM_TEST_EXECUTORS) {
  const std::string walk = "random shapes";
  std::int64_t ran = 0;
  for_each_type<types<float, float, float>, types<half, half, float>, types<bfloat16, bfloat16, float>,
                types<half, half, half>, types<bfloat16, bfloat16, bfloat16>, types<float, bfloat16, float>,
                types<bfloat16, half, float>>([&]<class T>() {
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
      // Small decode chunks (simd), so that decode rows of these short sequences are split too.
      exec_options options;
      options.decode_chunk_keys = pick(rng, {1, 50, 200, 2048});
      INFO("seed " << seed << ": " << spec.describe() << (with_lse ? "" : ", no lse") << ", chunk keys "
                   << options.decode_chunk_keys);
      with_implicit_index(rng, [&](const auto& index, const std::string& name) {
        INFO("index " << name);
        const conform_options o{.with_lse = with_lse, .exec = options, .threads = i % 4 == 0};
        const conform_result r = conform<E, TO>(c, index, o, walk, std::to_string(seed) + " " + name);
        ran += r.ran;
        worst = std::max(worst, r.cmp.max_rel_o);
      });
    }
    MESSAGE(element_name<TQ> << "/" << element_name<TKV> << "/" << element_name<TO> << ": worst relative error "
                             << worst << " (tolerance " << output_tolerance<TO> << ")");
  });
  CHECK(ran > 0);  // simd_dispatched: the half/half/float cases over contiguous K/V and causal_all
}

TEST_CASE_TEMPLATE("executors match reference: head_dim 1..256", E, SKIM_TEST_EXECUTORS_ANY_ARGS) {
  exec_options options;
  options.decode_chunk_keys = 16;
  std::int64_t ran = 0;
  for_each_head_dim_case(
      [&](std::uint32_t seed, const case_spec& spec, std::mt19937& rng) {
        const random_case<float, float> c(spec, rng);
        INFO("seed " << seed << ": " << spec.describe());
        ran += conform<E, float>(c, index::causal_all{}, {.exec = options}, "head dims", std::to_string(seed)).ran;
      },
      SKIM_SIMD_TEST_SCALE < 1.0 ? 7 : 1);
  CHECK(ran > 0);
}

// Each shape twice, with the same draws: float and half Q/K/V, the same index (float: full_suite).
TEST_CASE_TEMPLATE("executors match reference: block sizes, odd and common, with partial last blocks", E,
                   SKIM_TEST_EXECUTORS) {
  std::int64_t ran = 0;
  for_each_block_size_case(
      [&](int n, std::uint32_t seed, const case_spec& spec, std::mt19937& rng) {
        std::mt19937 rng_half = rng;
        INFO("seed " << seed << ": " << spec.describe());
        if constexpr (full_suite) {
          const random_case<float, float> f(spec, rng);
          with_implicit_index(rng, [&](const auto& index, const std::string& name) {
            INFO("float, index " << name);
            ran += conform<E, float>(f, index, {}, "block sizes", std::to_string(seed) + " " + name).ran;
          });
        }
        const random_case<half, half> h(spec, rng_half);
        with_implicit_index(rng_half, [&](const auto& index, const std::string& name) {
          INFO("half, index " << name);
          const std::string key = std::to_string(seed) + " " + name;
          ran += conform<E, float>(h, index, {.threads = n % 8 == 0}, "block sizes", key).ran;
        });
      },
      SKIM_SIMD_TEST_SCALE < 1.0 ? 4 : 1);
  CHECK(ran > 0);
}

TEST_CASE_TEMPLATE("executors match reference: GQA 1, 4, 8, both index scopes, paged and not, decode rows", E,
                   SKIM_TEST_EXECUTORS_ANY_ARGS) {
  exec_options options;
  options.decode_chunk_keys = 64;  // simd: 4 blocks per chunk, so the decode rows split into 5 and 4 chunks
  std::int64_t ran = 0;
  for_each_gqa_case([&](std::uint32_t seed, const case_spec& spec, std::mt19937& rng) {
    const random_case<bfloat16, bfloat16> c(spec, rng);
    INFO("seed " << seed << ": " << spec.describe());
    const conform_options o{.exec = options, .threads = true};
    ran += conform<E, float>(c, index::causal_all{}, o, "gqa", std::to_string(seed) + " causal_all").ran;
    ran += conform<E, float>(c, index::sliding_window{2}, o, "gqa", std::to_string(seed) + " sliding_window 2").ran;
  });
  CHECK(ran > 0);
}

TEST_CASE_TEMPLATE("executors: fully masked rows give exactly o = 0 and lse = -inf", E, SKIM_TEST_EXECUTORS_ANY_ARGS) {
  std::mt19937 rng(0xe3e3u);
  case_spec spec;
  spec.heads_q = 4;
  spec.heads_kv = 2;
  spec.head_dim = 24;
  spec.block_q = 4;
  spec.block_kv = 8;
  // 30 queries against 10 keys (the first 20 see nothing), a sequence without keys, a prefill
  // sequence, a decode row without keys; and sink{0}: no row sees anything.
  spec.seqs = {{30, 10}, {5, 0}, {6, 20}, {1, 0}};
  spec.o_head_major = is_reference<E>;  // the reference: not the canonical form, so it is run
  const random_case<float, float> c(spec, rng);
  const conform_options o{.threads = true};
  const conform_result r = conform<E, float>(c, index::causal_all{}, o, "masked", "causal_all");
  REQUIRE(r.ran);
  CHECK(r.cmp.empty_rows == (20 + 5 + 1) * spec.heads_q);
  const conform_result none = conform<E, float>(c, index::sink{0}, o, "masked", "sink 0");
  REQUIRE(none.ran);
  CHECK(none.cmp.empty_rows == none.cmp.rows);
}

TEST_CASE_TEMPLATE("executors: bit-identical whatever the workspace held, the thread count or the order of items", E,
                   SKIM_TEST_EXECUTORS_ANY_ARGS) {
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
  exec_options options;
  options.decode_chunk_keys = 128;
  const E e = make_executor<E>(options);
  INFO("executor " << executor_name(e));
  output<float> first(spec, c.tokens_q());
  attention_args<half, paged_kv<half>, index::causal_all, float> a{
      .prob = p, .q = c.q_view(), .kv = c.paged(), .index = {}, .o = first.view, .lse = first.lse};
  REQUIRE(run_on(e, a, 1, std::byte{0xff}).ok());
  CHECK(first.o[0] != first.o[first.o.size() / 2]);  // not a constant: the output varies across rows
  std::vector<std::int32_t> thread_counts{1};
  if constexpr (threaded<E>) thread_counts = {1, 2, 3, 16};
  for (const std::int32_t threads : thread_counts) {
    INFO("threads " << threads << ", workspace of zeros");
    output<float> again(spec, c.tokens_q());
    a.o = again.view;
    a.lse = again.lse;
    REQUIRE(run_on(e, a, threads, std::byte{0x00}).ok());
    CHECK(same_bytes(first.o, again.o));
    CHECK(same_bytes(first.lse, again.lse));
  }
  if constexpr (is_simd<E>) {
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
  }
}

// Same values, same order of operations: contiguous, token-major pages and head-major pages
// ([pages, heads_kv, page_size, head_dim]) give the same bits, prefill and decode rows alike.
TEST_CASE_TEMPLATE("executors: contiguous, paged and head-major paged storage of the same K/V give the same bits", E,
                   SKIM_TEST_EXECUTORS_ANY_ARGS) {
  const E e = make_executor<E>();
  INFO("executor " << executor_name(e));
  std::mt19937 rng(0x9a9eu);
  case_spec spec;
  spec.heads_q = 4;
  spec.heads_kv = 1;
  spec.head_dim = 40;
  spec.block_q = 16;
  spec.block_kv = 16;
  spec.seqs = {{50, 120}, {1, 77}};
  spec.page_size = 5;
  random_case<float, float> c(spec, rng);
  const problem p = c.prob();
  output<float> contiguous(spec, c.tokens_q()), paged(spec, c.tokens_q());
  attention_args<float, contiguous_kv<float>, index::causal_all, float> ac{
      .prob = p, .q = c.q_view(), .kv = c.contiguous(), .index = {}, .o = contiguous.view, .lse = contiguous.lse};
  attention_args<float, paged_kv<float>, index::causal_all, float> ap{
      .prob = p, .q = c.q_view(), .kv = c.paged(), .index = {}, .o = paged.view, .lse = paged.lse};
  REQUIRE(run_on(e, ac).ok());
  REQUIRE(run_on(e, ap).ok());
  CHECK(same_bytes(contiguous.o, paged.o));
  CHECK(same_bytes(contiguous.lse, paged.lse));
  spec.heads_q = 6;
  spec.heads_kv = 3;
  random_case<float, float> g(spec, rng);
  const problem pg = g.prob();
  const std::vector<float> k_hm = g.head_major_pages(g.k_pages), v_hm = g.head_major_pages(g.v_pages);
  output<float> token_pages(spec, g.tokens_q()), head_pages(spec, g.tokens_q());
  attention_args<float, paged_kv<float>, index::causal_all, float> at{
      .prob = pg, .q = g.q_view(), .kv = g.paged(), .index = {}, .o = token_pages.view, .lse = token_pages.lse};
  attention_args<float, paged_kv<float>, index::causal_all, float> ah{.prob = pg, .q = g.q_view(),
                                                                     .kv = g.paged_head_major(k_hm, v_hm), .index = {},
                                                                     .o = head_pages.view, .lse = head_pages.lse};
  REQUIRE(run_on(e, at).ok());
  REQUIRE(run_on(e, ah).ok());
  CHECK(same_bytes(token_pages.o, head_pages.o));

  // Random decode and prefill rows over head-major pages (threaded executors on 2 threads there).
  for (int i = 0; i < scaled(8); ++i) {
    const std::uint32_t seed = 0x4a9eu + static_cast<std::uint32_t>(i);
    std::mt19937 r(seed);
    case_spec s;
    s.heads_kv = pick(r, {1, 2, 3});
    s.heads_q = s.heads_kv * pick(r, {1, 4});
    s.head_dim = pick(r, {16, 40, 128});
    s.block_q = pick(r, {1, 16});
    s.block_kv = pick(r, {16, 32});
    s.seqs = {{1, uniform(r, 100, 600)}, {uniform(r, 2, 40), uniform(r, 40, 300)}, {0, 5}};
    s.paged = true;
    s.page_size = pick(r, {8, 16, 24});
    const random_case<half, half> h(s, r);
    const problem ph = h.prob();
    INFO("seed " << seed << ": " << s.describe());
    const std::vector<half> kh = h.head_major_pages(h.k_pages), vh = h.head_major_pages(h.v_pages);
    output<float> tokens(s, h.tokens_q()), heads(s, h.tokens_q());
    attention_args<half, paged_kv<half>, index::causal_all, float> a{
        .prob = ph, .q = h.q_view(), .kv = h.paged(), .index = {}, .o = tokens.view, .lse = tokens.lse};
    REQUIRE(run_on(e, a, 1).ok());
    a.kv = h.paged_head_major(kh, vh);
    a.o = heads.view;
    a.lse = heads.lse;
    REQUIRE(run_on(e, a, 2).ok());
    CHECK(same_bytes(tokens.o, heads.o));
    CHECK(same_bytes(tokens.lse, heads.lse));
  }
}

// run() never allocates, on its error paths neither. The reference, the oracle, is the one
// executor that does: its instance checks that the counter sees that, so a zero elsewhere means
// something.
TEST_CASE_TEMPLATE("executors: run allocates nothing, and a too small workspace is a status", E, SKIM_TEST_EXECUTORS) {
  if constexpr (is_reference<E>) {
    allocation_counter counter;
    int* volatile p = new int(42);
    delete p;
    CHECK(counter.stop() == 1);
  }
  std::int64_t ran = 0;
  for (std::uint32_t seed = 0xa110u; seed < 0xa110u + static_cast<std::uint32_t>(scaled(12)); ++seed) {
    std::mt19937 rng(seed);
    const case_spec spec = random_spec(rng, 1e6);
    const random_case<half, half> c(spec, rng);
    INFO("seed " << seed << ": " << spec.describe());
    output<float> o(spec, c.tokens_q());
    exec_options options;
    options.decode_chunk_keys = 32;
    const E e = make_executor<E>(options);
    INFO("executor " << executor_name(e));
    c.with_kv([&](auto kv) {
      const auto run_counted = [&](const auto& index) {
        using args = attention_args<half, decltype(kv), std::remove_cvref_t<decltype(index)>, float>;
        if constexpr (runs_args<E, args>) {
          const args a{.prob = c.prob(), .q = c.q_view(), .kv = kv, .index = index, .o = o.view, .lse = o.lse};
          aligned_workspace ws(e.workspace_bytes(c.prob()));
          allocation_counter counter;
          const status s = e.run(a, ws.bytes);
          const long n = counter.stop();
          REQUIRE(s.ok());
          ++ran;
          if constexpr (is_reference<E>) {
            CHECK(n > 0);
          } else {
            CHECK(n == 0);
            allocation_counter counter_err;
            const status too_small = e.run(a, ws.bytes.first(ws.bytes.size() / 2));
            CHECK(counter_err.stop() == 0);
            CHECK(!too_small.ok());
          }
        }
      };
      run_counted(index::causal_all{});
      run_counted(index::sink{1});
      run_counted(index::sliding_window{2});
    });
  }
  CHECK(ran > 0);
}

// The stored forms of one random selection (block_csr, block_table, dense_block_mask) hold the same
// ids in the same order, so each executor gives the same bits on each (and the reference too).
// Over three element types (full_suite), and on random shapes with decode splits.
TEST_CASE_TEMPLATE("executors match reference on block_csr, block_table and dense_block_mask", E,
                   SKIM_TEST_EXECUTORS_ANY_ARGS) {
  const std::string walk = "stored";
  std::int64_t ran = 0;
  const auto check_same = [](const conform_result& x, const conform_result& y) {
    if (!x.ran || !y.ran) return;
    CHECK(x.o == y.o);
    CHECK(x.lse == y.lse);
  };
  using stored_types =
      std::tuple<types<float, float, float>, types<bfloat16, bfloat16, float>, types<half, half, half>>;
  if constexpr (full_suite) for_each_type_in<stored_types>([&]<class T>() {
    using TQ = typename T::q;
    using TKV = typename T::kv;
    using TO = typename T::o;
    for (std::uint32_t i = 0; i < static_cast<std::uint32_t>(scaled(20)); ++i) {
      const std::uint32_t seed = 0x570e0u + 101u * i + static_cast<std::uint32_t>(sizeof(TQ) * 7 + sizeof(TO));
      std::mt19937 rng(seed);
      const case_spec spec = random_spec(rng, 4e6);
      const random_case<TQ, TKV> c(spec, rng);
      const problem p = c.prob();
      const double density = pick(rng, {0.1, 0.3, 0.6, 1.0});
      INFO("seed " << seed << ": " << spec.describe() << ", density " << density);

      const csr_storage csr = random_selection(p, rng, density);
      REQUIRE(csr.view().validate(p).ok());
      const std::int32_t width = index::max_row_count(p, csr.view());
      std::vector<std::int32_t> table_ids(static_cast<std::size_t>(p.index_rows() * width)),
          table_count(static_cast<std::size_t>(p.index_rows()));
      REQUIRE(index::to_block_table(p, csr.view(), width, table_ids, table_count).ok());
      const index::block_table table{table_ids, table_count, width};
      std::vector<std::uint64_t> words(static_cast<std::size_t>(index::dense_mask_words(p)));
      REQUIRE(index::to_dense_mask(p, csr.view(), words).ok());
      const index::dense_block_mask mask = index::dense_block_mask::for_problem(p, words);

      const std::string key = std::to_string(seed);
      const conform_result by_csr = conform<E, TO>(c, csr.view(), {}, walk, key + " csr");
      const conform_result by_table = conform<E, TO>(c, table, {}, walk, key + " table");
      const conform_result by_mask = conform<E, TO>(c, mask, {}, walk, key + " mask");
      ran += by_csr.ran;
      check_same(by_table, by_csr);
      check_same(by_mask, by_csr);
      const auto& ref_csr = oracle<TO>(c, csr.view(), walk, key + " csr");
      CHECK(same_bytes(oracle<TO>(c, table, walk, key + " table").o, ref_csr.o));
      CHECK(same_bytes(oracle<TO>(c, mask, walk, key + " mask").o, ref_csr.o));
      CHECK(same_bytes(oracle<TO>(c, mask, walk, key + " mask").lse, ref_csr.lse));
    }
  });
  // Random selections over all shapes, decode splits of every size (simd), several threads.
  for (int i = 0; i < scaled(30); ++i) {
    const std::uint32_t seed = 0x5e1ecu + static_cast<std::uint32_t>(i);
    std::mt19937 rng(seed);
    const case_spec spec = random_spec(rng);
    const random_case<half, half> c(spec, rng);
    const problem p = c.prob();
    const csr_storage csr = random_selection(p, rng, std::uniform_real_distribution<double>(0.05, 0.9)(rng));
    exec_options options;
    options.decode_chunk_keys = pick(rng, {1, 64, 2048});
    INFO("seed " << seed << ": " << spec.describe() << ", chunk keys " << options.decode_chunk_keys);
    const std::string key = std::to_string(seed);
    const conform_result by_csr =
        conform<E, float>(c, csr.view(), {.exec = options, .threads = i % 3 == 0}, walk, key + " csr");
    ran += by_csr.ran;
    std::int32_t width = 1;
    for (std::size_t r = 0; r + 1 < csr.row_ptr.size(); ++r) width = std::max(width, csr.row_ptr[r + 1] - csr.row_ptr[r]);
    std::vector<std::int32_t> ids(static_cast<std::size_t>(p.index_rows()) * width, -1),
        counts(static_cast<std::size_t>(p.index_rows()));
    for (std::size_t r = 0; r < counts.size(); ++r) {
      counts[r] = csr.row_ptr[r + 1] - csr.row_ptr[r];
      for (std::int32_t k = 0; k < counts[r]; ++k) ids[r * width + k] = csr.col_idx[static_cast<std::size_t>(csr.row_ptr[r] + k)];
    }
    const index::block_table table{.ids = ids, .count = counts, .width = width};
    check_same(conform<E, float>(c, table, {.exec = options}, walk, key + " table"), by_csr);
  }
  CHECK(ran > 0);
}

#if !defined(SKIM_TEST_ARCH_BUILD)  // full_suite only
TEST_CASE_TEMPLATE("executors: block_union with overlapping parts equals the same set given once", E,
                   SKIM_TEST_EXECUTORS_ANY_ARGS) {
  std::int64_t overlapping_rows = 0;  // rows where some id is held by two parts, over all cases
  for (std::uint32_t i = 0; i < static_cast<std::uint32_t>(scaled(30)); ++i) {
    const std::uint32_t seed = 0x0410u + 37u * i;
    std::mt19937 rng(seed);
    const case_spec spec = random_spec(rng, 4e6);
    const random_case<float, half> c(spec, rng);
    const problem p = c.prob();
    const std::int32_t sink_blocks = uniform(rng, 0, 3), window_blocks = uniform(rng, 0, 3);
    const double density = pick(rng, {0.1, 0.3, 0.6});
    INFO("seed " << seed << ": " << spec.describe() << ", sink " << sink_blocks << ", window " << window_blocks
                 << ", density " << density);

    // Dynamic part: random blocks, overlapping the sink and the window on purpose.
    const csr_storage dynamic = random_selection(p, rng, density);
    const auto u = index::make_union(index::sink{sink_blocks}, index::sliding_window{window_blocks}, dynamic.view());
    REQUIRE(u.validate(p).ok());

    // The same set, computed here row by row and given once.
    csr_storage once;
    REQUIRE(for_each_row(p, [&](const row_info& r) {
              std::set<std::int32_t> ids;
              std::int64_t listed = 0;
              for (std::int32_t id = 0; id < std::min(sink_blocks, r.visible_blocks); ++id, ++listed) ids.insert(id);
              for (std::int32_t id = std::max(0, r.visible_blocks - window_blocks); id < r.visible_blocks; ++id, ++listed) {
                ids.insert(id);
              }
              for (std::int32_t k = dynamic.row_ptr[r.row]; k < dynamic.row_ptr[r.row + 1]; ++k, ++listed) {
                ids.insert(dynamic.col_idx[k]);
              }
              overlapping_rows += listed > static_cast<std::int64_t>(ids.size());
              once.add_row(ids);
            }).ok());
    REQUIRE(once.view().validate(p).ok());

    // Nothing counted twice: the union walks exactly the set's ids, in the same order.
    const std::string key = std::to_string(seed);
    const conform_result by_once = conform<E, float>(c, once.view(), {}, "union", key + " once");
    const conform_result by_union = conform<E, float>(c, u, {}, "union", key + " union");
    if (by_once.ran && by_union.ran) {
      CHECK(by_union.o == by_once.o);
      CHECK(by_union.lse == by_once.lse);
    }
    const auto& ref_once = oracle<float>(c, once.view(), "union", key + " once");
    CHECK(same_bytes(oracle<float>(c, u, "union", key + " union").o, ref_once.o));
  }
  CHECK(overlapping_rows > 100);  // the property was exercised, not just empty unions
}
#endif
