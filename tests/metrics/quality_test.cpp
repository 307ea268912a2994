// metrics/quality.hpp — recall@t, coverage and output error: by hand on a tiny case, against a
// brute force on random cases (varlen, GQA, both index scopes, paged), and the status cases.
#include "skim/metrics/quality.hpp"

#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "metrics/metrics_testing.hpp"
#include "skim/index/block_csr.hpp"
#include "skim/index/causal_all.hpp"

using namespace skim;
using namespace skim::metrics;
using metrics_test::fresh_seed;

namespace {

// The tiny case: 2 queries, 5 keys, head_dim 1, scale 1, bq = bk = 2 (blocks {0, 1}, {2, 3}, {4}).
// k_j = ln w_j with w = 1, 2, 3, 4, 6, so query 0 (q = 1, sees keys 0..3) has α ∝ 1, 2, 3, 4
// (α = .1, .2, .3, .4) and query 1 (q = 2, sees keys 0..4) has α ∝ 1, 4, 9, 16, 36 (sum 66).
struct tiny {
  std::array<std::int32_t, 2> cu_q{0, 2}, cu_kv{0, 5};
  std::array<float, 2> q{1.0f, 2.0f};
  std::array<float, 5> k{0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f), std::log(6.0f)};
  std::array<float, 5> v{1.0f, -1.0f, 2.0f, 0.5f, -3.0f};
  [[nodiscard]] problem prob() const {
    return {.heads_q = 1, .heads_kv = 1, .head_dim = 1, .block_q = 2, .block_kv = 2, .softmax_scale = 1.0f,
            .cu_seqlens_q = cu_q, .cu_seqlens_kv = cu_kv};
  }
  [[nodiscard]] strided_view<const float> q_view() const {
    return strided_view<const float>::token_major(q.data(), 2, 1, 1);
  }
  [[nodiscard]] contiguous_kv<float> kv() const {
    return {.k = strided_view<const float>::token_major(k.data(), 5, 1, 1),
            .v = strided_view<const float>::token_major(v.data(), 5, 1, 1)};
  }
};

constexpr std::array<std::int32_t, 4> tiny_t{1, 2, 3, 8};

template <class Index>
std::vector<query_row> rows_of(const tiny& c, const Index& index, std::vector<std::vector<double>>& recalls) {
  std::vector<query_row> rows;
  const status s = for_each_query_row(c.prob(), c.q_view(), c.kv(), index, tiny_t, [&](const query_row& r) {
    rows.push_back(r);
    recalls.emplace_back(r.recall.begin(), r.recall.end());
  });
  REQUIRE_MESSAGE(s.ok(), s.message());
  return rows;
}

constexpr double hand_eps = 1e-6;  // k_j = ln w_j rounded to float

}  // namespace

TEST_CASE("quality: the tiny case by hand, block 1 selected") {
  const tiny c;
  const std::array<std::int32_t, 2> row_ptr{0, 1};
  const std::array<std::int32_t, 1> ids{1};  // keys 2, 3
  std::vector<std::vector<double>> rec;
  const auto rows = rows_of(c, index::block_csr{row_ptr, ids}, rec);
  REQUIRE(rows.size() == 2);
  // Query 0: α = .1 .2 .3 .4; o_dense = .7, o_sparse = (.3·2 + .4·.5) / .7 = 8/7.
  CHECK(rows[0].visible_keys == 4);
  CHECK(rows[0].selected_keys == 2);
  CHECK(rows[0].coverage == doctest::Approx(0.7).epsilon(hand_eps));
  CHECK(rows[0].error == doctest::Approx(31.0 / 49.0).epsilon(hand_eps));  // |8/7 − 7/10| / (7/10)
  CHECK(rec[0] == std::vector<double>{1.0, 1.0, 2.0 / 3.0, 0.5});  // top keys 3, 2, 1, 0
  // Query 1: α = (1, 4, 9, 16, 36) / 66; o_dense = −85/66, o_sparse = (18 + 8) / 25.
  CHECK(rows[1].visible_keys == 5);
  CHECK(rows[1].coverage == doctest::Approx(25.0 / 66.0).epsilon(hand_eps));
  CHECK(rows[1].error == doctest::Approx(3841.0 / 2125.0).epsilon(hand_eps));
  CHECK(rec[1] == std::vector<double>{0.0, 0.5, 2.0 / 3.0, 0.4});  // top keys 4, 3, 2, 1, 0

  quality_report r;
  const std::array<std::int32_t, 2> ts{1, 8};
  REQUIRE(measure(c.prob(), c.q_view(), c.kv(), index::block_csr{row_ptr, ids}, {.recall_at = ts}, r).ok());
  CHECK(r.rows == 2);
  CHECK(r.rows_without_keys == 0);
  CHECK(r.recall_at == std::vector<std::int32_t>{1, 8});
  CHECK(r.recall[0].mean == 0.5);
  CHECK(r.recall[0].worst == 0.0);
  CHECK(r.recall[1].mean == doctest::Approx(0.45));
  CHECK(r.coverage.mean == doctest::Approx((0.7 + 25.0 / 66.0) / 2).epsilon(hand_eps));
  CHECK(r.coverage.worst == doctest::Approx(25.0 / 66.0).epsilon(hand_eps));
  CHECK(r.error.worst == doctest::Approx(3841.0 / 2125.0).epsilon(hand_eps));
  // Cost: one row, one tile of 2 keys, both visible to both queries.
  CHECK(r.cost.index_rows == 1);
  CHECK(r.cost.tiles == 1);
  CHECK(r.cost.keys_read == 2);
  CHECK(r.cost.pairs_read == 4);
  CHECK(r.cost.pairs_needed == 4);
  CHECK(r.cost.tiles_per_row.worst == 1.0);
  REQUIRE(r.heads.size() == 1);
  CHECK(r.worst_coverage_head.layer == 0);
  CHECK(r.worst_coverage_head.head == 0);
}

TEST_CASE("quality: the tiny case by hand, a selection query 0 cannot see") {
  const tiny c;
  const std::array<std::int32_t, 2> row_ptr{0, 1};
  const std::array<std::int32_t, 1> ids{2};  // key 4: beyond query 0's keys 0..3
  std::vector<std::vector<double>> rec;
  const auto rows = rows_of(c, index::block_csr{row_ptr, ids}, rec);
  CHECK(rows[0].selected_keys == 0);
  CHECK(rows[0].coverage == 0.0);
  CHECK(rows[0].error == 1.0);  // o_sparse = 0
  CHECK(rec[0] == std::vector<double>{0.0, 0.0, 0.0, 0.0});
  CHECK(rows[1].coverage == doctest::Approx(36.0 / 66.0).epsilon(hand_eps));
  CHECK(rows[1].error == doctest::Approx(113.0 / 85.0).epsilon(hand_eps));  // |−3 + 85/66| / (85/66)
  CHECK(rec[1] == std::vector<double>{1.0, 0.5, 1.0 / 3.0, 0.2});
}

TEST_CASE("quality: ties go to the lower key index") {
  // All keys equal: α = 1/5 each; the top-2 are keys 0 and 1.
  tiny c;
  c.k = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
  const std::array<std::int32_t, 2> row_ptr{0, 1};
  for (const std::int32_t blk : {0, 1}) {
    const std::array<std::int32_t, 1> ids{blk};
    std::vector<std::vector<double>> rec;
    (void)rows_of(c, index::block_csr{row_ptr, ids}, rec);
    CHECK(rec[1][1] == (blk == 0 ? 1.0 : 0.0));
  }
}

TEST_CASE("quality: causal_all gives coverage 1, error ~0, recall 1 on random cases") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed ", seed);
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 25; ++trial) {
    const test::case_spec spec = test::random_spec(rng, 3e5);
    INFO(spec.describe());
    const test::random_case<float, float> rc(spec, rng);
    std::int64_t rows = 0, without = 0;
    const status s = rc.with_kv([&](const auto& kv) {
      return for_each_query_row(rc.prob(), rc.q_view(), kv, index::causal_all{}, default_recall_at,
                                [&](const query_row& r) {
                                  ++rows;
                                  if (!r.has_keys()) {
                                    ++without;
                                    return;
                                  }
                                  CHECK(r.selected_keys == r.visible_keys);
                                  CHECK(r.coverage == doctest::Approx(1.0).epsilon(1e-12));
                                  // Two double softmaxes over the same keys, normalised at different
                                  // points: the error is rounding, ~1e-16 · n · Σ α|v| / |o_dense|, and
                                  // with d = 1 random values can cancel o_dense down to 1e-5 of Σ α|v|
                                  // (seed 1268500808: 1.3e-9). A key left out shows in the two checks
                                  // above.
                                  CHECK(r.error <= 1e-6);
                                  for (double x : r.recall) CHECK(x == 1.0);
                                });
    });
    REQUIRE_MESSAGE(s.ok(), s.message());
    CHECK(rows == static_cast<std::int64_t>(rc.tokens_q()) * spec.heads_q);
  }
}

TEST_CASE("quality: random sub-selections against brute force (varlen, GQA, both scopes, fp16/bf16)") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed ", seed);
  std::mt19937 rng(seed);
  const std::array<std::int32_t, 4> ts{1, 3, 8, 32};
  const auto run = [&](const auto& rc) {
    const problem p = rc.prob();
    const metrics_test::owned_csr c = metrics_test::random_csr(p, rng, test::pick(rng, {0.2, 0.5, 0.8}));
    const auto want = rc.with_kv([&](const auto& kv) {
      return metrics_test::brute_force(p, rc.q_view(), kv, c.selected, ts);
    });
    std::int64_t rows = 0;
    const status s = rc.with_kv([&](const auto& kv) {
      return for_each_query_row(p, rc.q_view(), kv, c.view(), ts, [&](const query_row& r) {
        ++rows;
        const auto& w = want[static_cast<std::size_t>(r.token) * p.heads_q + r.head];
        REQUIRE(r.visible_keys == w.visible);
        if (!r.has_keys()) return;
        CHECK(r.coverage == doctest::Approx(w.coverage).epsilon(1e-10));
        CHECK(r.error == doctest::Approx(w.error).epsilon(1e-8));
        for (std::size_t t = 0; t < ts.size(); ++t) CHECK(r.recall[t] == w.recall[t]);
      });
    });
    REQUIRE_MESSAGE(s.ok(), s.message());
    CHECK(rows == static_cast<std::int64_t>(rc.tokens_q()) * p.heads_q);
  };
  for (int trial = 0; trial < 25; ++trial) {
    const test::case_spec spec = test::random_spec(rng, 3e5);
    INFO(spec.describe());
    if (trial % 3 == 0) {
      run(test::random_case<half, bfloat16>(spec, rng));
    } else if (trial % 3 == 1) {
      run(test::random_case<bfloat16, half>(spec, rng));
    } else {
      run(test::random_case<float, float>(spec, rng));
    }
  }
}

TEST_CASE("quality: coverage of a sub-selection is the brute-force sum, and reports pool rows") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed ", seed);
  std::mt19937 rng(seed);
  test::case_spec spec;
  spec.heads_q = 4;
  spec.heads_kv = 2;
  spec.head_dim = 16;
  spec.block_q = 5;
  spec.block_kv = 7;
  spec.seqs = {{19, 40}, {1, 33}};
  const test::random_case<float, float> rc(spec, rng);
  const problem p = rc.prob();
  const metrics_test::owned_csr c = metrics_test::random_csr(p, rng, 0.4);
  const auto want = metrics_test::brute_force(p, rc.q_view(), rc.contiguous(), c.selected, default_recall_at);
  quality_report r;
  REQUIRE(measure(p, rc.q_view(), rc.contiguous(), c.view(), {}, r).ok());
  std::vector<double> cov, err;
  for (const auto& w : want) {
    cov.push_back(w.coverage);
    err.push_back(w.error);
  }
  const tail_summary tc = summarize_tail(cov, tail_side::low_is_bad);
  const tail_summary te = summarize_tail(err, tail_side::high_is_bad);
  CHECK(r.rows == 20 * 4);
  CHECK(r.coverage.mean == doctest::Approx(tc.mean).epsilon(1e-10));
  CHECK(r.coverage.p1 == doctest::Approx(tc.p1).epsilon(1e-10));
  CHECK(r.coverage.worst == doctest::Approx(tc.worst).epsilon(1e-10));
  CHECK(r.error.p1 == doctest::Approx(te.p1).epsilon(1e-8));
  CHECK(r.error.worst == doctest::Approx(te.worst).epsilon(1e-8));
  // Per-head means, and the worst head by mean coverage.
  REQUIRE(r.heads.size() == 4);
  double worst = 2.0;
  std::int32_t worst_head = -1;
  for (std::int32_t h = 0; h < 4; ++h) {
    double sum = 0.0;
    for (std::int32_t t = 0; t < 20; ++t) sum += want[static_cast<std::size_t>(t * 4 + h)].coverage;
    CHECK(r.heads[static_cast<std::size_t>(h)].head == h);
    CHECK(r.heads[static_cast<std::size_t>(h)].rows == 20);
    CHECK(r.heads[static_cast<std::size_t>(h)].coverage == doctest::Approx(sum / 20).epsilon(1e-10));
    if (sum / 20 < worst) worst = sum / 20, worst_head = h;
  }
  CHECK(r.worst_coverage_head.head == worst_head);
  CHECK(r.worst_coverage_head.mean == doctest::Approx(worst).epsilon(1e-10));
}

TEST_CASE("quality: paged K/V gives exactly what contiguous K/V gives") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed ", seed);
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 15; ++trial) {
    const test::case_spec spec = test::random_spec(rng, 2e5);
    INFO(spec.describe());
    const test::random_case<float, half> rc(spec, rng);
    const problem p = rc.prob();
    const metrics_test::owned_csr c = metrics_test::random_csr(p, rng, 0.5);
    quality_report a, b;
    REQUIRE(measure(p, rc.q_view(), rc.contiguous(), c.view(), {}, a).ok());
    REQUIRE(measure(p, rc.q_view(), rc.paged(), c.view(), {}, b).ok());
    CHECK(a.rows == b.rows);
    CHECK(a.rows_without_keys == b.rows_without_keys);
    const auto same = [](const tail_summary& x, const tail_summary& y) {
      CHECK(x.count == y.count);
      if (x.count == 0) return;
      CHECK(x.mean == y.mean);
      CHECK(x.p1 == y.p1);
      CHECK(x.p5 == y.p5);
      CHECK(x.p50 == y.p50);
      CHECK(x.worst == y.worst);
    };
    same(a.coverage, b.coverage);
    same(a.error, b.error);
    for (std::size_t t = 0; t < a.recall.size(); ++t) same(a.recall[t], b.recall[t]);
  }
}

TEST_CASE("quality: varlen with empty sequences and rows that see no key") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed ", seed);
  std::mt19937 rng(seed);
  test::case_spec spec;
  spec.heads_q = 2;
  spec.heads_kv = 1;
  spec.head_dim = 8;
  spec.block_q = 3;
  spec.block_kv = 4;
  // Sequence 3 has 4 queries and 2 keys: under causality its queries 0, 1 see nothing.
  spec.seqs = {{3, 5}, {0, 0}, {0, 4}, {4, 2}, {2, 7}, {1, 0}};
  const test::random_case<float, float> rc(spec, rng);
  const problem p = rc.prob();
  quality_report r;
  REQUIRE(measure(p, rc.q_view(), rc.contiguous(), index::causal_all{}, {}, r).ok());
  // Rows without keys: sequence 3's queries 0, 1 and sequence 5's only query, for both heads.
  CHECK(r.rows_without_keys == 3 * 2);
  CHECK(r.rows == (3 + 4 + 2 + 1) * 2 - 6);
  CHECK(r.coverage.worst == doctest::Approx(1.0).epsilon(1e-12));
  CHECK(r.error.worst <= 1e-12);
  CHECK(r.heads.size() == 2);
  CHECK(r.heads[0].rows_without_keys == 3);
  // Index rows: q blocks 1 + 0 + 0 + 2 + 1 + 1 = 5; sequence 5's row and sequence 3's first (queries
  // 0..2, only query 2 sees key 0) read 0 and 1 tiles.
  CHECK(r.cost.index_rows == 5);
  CHECK(r.cost.pairs_needed == (3 + 4 + 5) + (1 + 2) + (6 + 7) + 0);  // visible pairs per query

  // Against brute force with a sub-selection too.
  const metrics_test::owned_csr c = metrics_test::random_csr(p, rng, 0.5);
  const auto want = metrics_test::brute_force(p, rc.q_view(), rc.contiguous(), c.selected, default_recall_at);
  const status s = for_each_query_row(p, rc.q_view(), rc.contiguous(), c.view(), default_recall_at,
                                      [&](const query_row& row) {
                                        const auto& w = want[static_cast<std::size_t>(row.token) * 2 + row.head];
                                        CHECK(row.visible_keys == w.visible);
                                        if (!row.has_keys()) {
                                          CHECK(std::isnan(row.coverage));
                                          return;
                                        }
                                        CHECK(row.coverage == doctest::Approx(w.coverage).epsilon(1e-10));
                                      });
  CHECK(s.ok());
}

TEST_CASE("quality: GQA with a per-kv-head index: the group shares its kv head's selection") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed ", seed);
  std::mt19937 rng(seed);
  test::case_spec spec;
  spec.heads_q = 8;
  spec.heads_kv = 2;
  spec.head_dim = 8;
  spec.block_q = 4;
  spec.block_kv = 4;
  spec.seqs = {{6, 10}};
  const test::random_case<float, float> rc(spec, rng);
  const problem p = rc.prob();
  // kv head 0: every visible block; kv head 1: nothing.
  std::vector<std::int32_t> row_ptr{0}, ids;
  REQUIRE(for_each_row(p, [&](const row_info& row) {
            if (row.head == 0) {
              for (std::int32_t id = 0; id < row.visible_blocks; ++id) ids.push_back(id);
            }
            row_ptr.push_back(static_cast<std::int32_t>(ids.size()));
          }).ok());
  quality_report r;
  REQUIRE(measure(p, rc.q_view(), rc.contiguous(), index::block_csr{row_ptr, ids}, {}, r).ok());
  REQUIRE(r.heads.size() == 8);
  for (const head_quality& h : r.heads) {
    INFO("head ", h.head);
    CHECK(h.rows == 6);
    CHECK(h.coverage == doctest::Approx(h.head < 4 ? 1.0 : 0.0).epsilon(1e-12));
    CHECK(h.error == doctest::Approx(h.head < 4 ? 0.0 : 1.0).epsilon(1e-12));
    for (double x : h.recall) CHECK(x == (h.head < 4 ? 1.0 : 0.0));
  }
  CHECK(r.worst_coverage_head.head == 4);  // ties go to the first
  CHECK(r.worst_error_head.head == 4);
  CHECK(r.worst_recall_head[0].head == 4);
  CHECK(r.cost.index_rows == 2 * 2);  // 2 q blocks × 2 kv heads: costs are per index row
}

TEST_CASE("quality: an accumulator over layers; the per-(layer, head) table") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed ", seed);
  std::mt19937 rng(seed);
  test::case_spec spec;
  spec.heads_q = 2;
  spec.heads_kv = 1;
  spec.head_dim = 8;
  spec.block_q = 4;
  spec.block_kv = 4;
  spec.seqs = {{9, 21}};
  const test::random_case<float, float> l0(spec, rng), l1(spec, rng);
  const problem p = l0.prob();
  const metrics_test::owned_csr c = metrics_test::random_csr(p, rng, 0.3);
  const std::array<std::int32_t, 2> ts{4, 16};
  quality_accumulator acc({.recall_at = ts});
  REQUIRE(acc.add(0, p, l0.q_view(), l0.contiguous(), index::causal_all{}).ok());
  REQUIRE(acc.add(1, p, l1.q_view(), l1.paged(), c.view()).ok());
  const quality_report r = acc.summary();
  CHECK(r.rows == 2 * 9 * 2);
  REQUIRE(r.heads.size() == 4);
  CHECK(r.heads[0].layer == 0);
  CHECK(r.heads[3].layer == 1);
  CHECK(r.heads[3].head == 1);
  CHECK(r.worst_coverage_head.layer == 1);  // layer 0 is dense: coverage 1
  CHECK(r.worst_error_head.layer == 1);

  const auto want = metrics_test::brute_force(p, l1.q_view(), l1.contiguous(), c.selected, ts);
  std::vector<double> cov(9 * 2, 1.0);  // layer 0's rows
  for (const auto& w : want) cov.push_back(w.coverage);
  const tail_summary tc = summarize_tail(cov, tail_side::low_is_bad);
  CHECK(r.coverage.mean == doctest::Approx(tc.mean).epsilon(1e-10));
  CHECK(r.coverage.p5 == doctest::Approx(tc.p5).epsilon(1e-10));
  CHECK(r.cost.index_rows == 3 + 3);

  const std::string table = head_table_markdown(r);
  CHECK(table.rfind("| layer | head | rows | coverage | error | recall@4 | recall@16 |\n", 0) == 0);
  CHECK(table.find("| 0 | 1 | 9 | 1.0000 |") != std::string::npos);
  CHECK(std::count(table.begin(), table.end(), '\n') == 2 + 4);
}

TEST_CASE("quality: status cases name the bad value and its place") {
  const tiny c;
  const std::array<std::int32_t, 2> row_ptr{0, 1};
  const std::array<std::int32_t, 1> ids{1};
  const index::block_csr index{row_ptr, ids};
  quality_report r;
  r.rows = 77;  // untouched on failure

  SUBCASE("bad t") {
    const std::array<std::int32_t, 3> ts{8, 0, 4};
    const status s = measure(c.prob(), c.q_view(), c.kv(), index, {.recall_at = ts}, r);
    CHECK(s.code() == status_code::invalid_argument);
    CHECK(std::string(s.message()) == "recall_at[1] = 0 < 1");
    const std::array<std::int32_t, 1> neg{-3};
    CHECK(std::string(measure(c.prob(), c.q_view(), c.kv(), index, {.recall_at = neg}, r).message()) ==
          "recall_at[0] = -3 < 1");
  }
  SUBCASE("Q shape mismatch") {
    const auto q = strided_view<const float>::token_major(c.q.data(), 1, 1, 1);
    const status s = measure(c.prob(), q, c.kv(), index, {}, r);
    CHECK(s.code() == status_code::shape_mismatch);
    CHECK(std::string(s.message()) == "Q is [1, 1, 1], expected [2, 1, 1]");
  }
  SUBCASE("K shape mismatch") {
    contiguous_kv<float> kv = c.kv();
    kv.k.tokens = 4;
    const status s = measure(c.prob(), c.q_view(), kv, index, {}, r);
    CHECK(s.code() == status_code::shape_mismatch);
    CHECK(std::string(s.message()) == "K is [4, 1, 1], expected [5, 1, 1]");
  }
  SUBCASE("index with the wrong row count") {
    const std::array<std::int32_t, 3> bad_ptr{0, 1, 1};
    const status s = measure(c.prob(), c.q_view(), c.kv(), index::block_csr{bad_ptr, ids}, {}, r);
    CHECK(s.code() == status_code::shape_mismatch);
    CHECK(std::string(s.message()) == "block_csr row_ptr has 3 entries, needs rows 1 + 1");
  }
  SUBCASE("an index whose validate() lies is caught id by id") {
    struct lying_index {
      [[nodiscard]] index::range_cursor cursor(const row_info&) const noexcept { return {2, 4}; }
      [[nodiscard]] status validate(const problem&) const noexcept { return status::success(); }
    };
    const status s = measure(c.prob(), c.q_view(), c.kv(), lying_index{}, {}, r);
    CHECK(s.code() == status_code::invalid_index);
    CHECK(std::string(s.message()) == "block id 3 >= visible blocks 3 in row 0");
  }
  SUBCASE("negative layer; a failed add leaves the accumulator unchanged") {
    quality_accumulator acc;
    const status s = acc.add(-1, c.prob(), c.q_view(), c.kv(), index);
    CHECK(s.code() == status_code::invalid_argument);
    CHECK(std::string(s.message()) == "layer -1 < 0");
    const std::array<std::int32_t, 2> bad_ptr{0, 2};
    const std::array<std::int32_t, 2> bad_ids{1, 1};
    CHECK(!acc.add(0, c.prob(), c.q_view(), c.kv(), index::block_csr{bad_ptr, bad_ids}).ok());
    const quality_report e = acc.summary();
    CHECK(e.rows == 0);
    CHECK(e.heads.empty());
    CHECK(e.cost.index_rows == 0);
    CHECK(e.coverage.count == 0);
  }
  CHECK(r.rows == 77);
}
