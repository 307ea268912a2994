// metrics/cost.hpp — tiles, keys read, pairs read and needed: by hand, and against brute force.
#include "skim/metrics/cost.hpp"

#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "metrics/metrics_testing.hpp"
#include "skim/index/causal_all.hpp"

using namespace skim;
using namespace skim::metrics;

TEST_CASE("cost: a 2-query, 5-key causal row by hand") {
  // bq = bk = 2: blocks {0, 1}, {2, 3}, {4}; query 0 sees keys 0..3, query 1 sees 0..4.
  const std::array<std::int32_t, 2> cu_q{0, 2}, cu_kv{0, 5};
  const problem p{.heads_q = 1, .heads_kv = 1, .head_dim = 1, .block_q = 2, .block_kv = 2,
                  .cu_seqlens_q = cu_q, .cu_seqlens_kv = cu_kv};
  const std::array<std::int32_t, 2> row_ptr{0, 2};
  const std::array<std::int32_t, 2> ids{1, 2};
  cost_totals t;
  REQUIRE(measure_cost(p, index::block_csr{row_ptr, ids}, t).ok());
  CHECK(t.index_rows == 1);
  CHECK(t.tiles == 2);
  CHECK(t.keys_read == 3);     // 2 + 1 (the ragged tail)
  CHECK(t.pairs_read == 6);    // 3 keys × 2 queries
  CHECK(t.pairs_needed == 5);  // query 0: keys 2, 3; query 1: keys 2, 3, 4
  const cost_summary s = summarize(t);
  CHECK(s.utilisation() == doctest::Approx(5.0 / 6.0));
  CHECK(s.tiles_per_row.mean == 2.0);
  CHECK(s.tiles_per_row.worst == 2.0);

  cost_totals all;
  REQUIRE(measure_cost(p, index::causal_all{}, all).ok());
  CHECK(all.tiles == 3);
  CHECK(all.keys_read == 5);
  CHECK(all.pairs_read == 10);
  CHECK(all.pairs_needed == 9);  // 4 + 5 visible pairs
}

TEST_CASE("cost: random problems against brute force") {
  const std::uint32_t seed = metrics_test::fresh_seed();
  INFO("seed ", seed);
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 40; ++trial) {
    const test::case_spec spec = test::random_spec(rng, 2e5);
    INFO(spec.describe());
    const test::random_case<float, float> rc(spec, rng);
    const problem p = rc.prob();
    const metrics_test::owned_csr c = metrics_test::random_csr(p, rng, 0.5);
    cost_totals t;
    const status s = measure_cost(p, c.view(), t);
    REQUIRE_MESSAGE(s.ok(), s.message());

    // Brute force over (sequence, query block, index head, block, query, key).
    std::int64_t rows = 0, tiles = 0, keys = 0, pairs_read = 0, pairs_needed = 0, max_tiles = 0;
    for (std::int32_t b = 0; b < p.batch(); ++b) {
      const std::int32_t nq = p.seq_len_q(b), nk = p.seq_len_kv(b);
      for (std::int32_t i = 0; i * p.block_q < nq; ++i) {
        for (std::int32_t h = 0; h < p.index_heads(); ++h, ++rows) {
          const auto& sel = c.selected[static_cast<std::size_t>(rows)];
          std::int64_t row_tiles = 0;
          for (std::size_t blk = 0; blk < sel.size(); ++blk) {
            if (!sel[blk]) continue;
            ++row_tiles;
            for (std::int32_t j = static_cast<std::int32_t>(blk) * p.block_kv;
                 j < std::min<std::int32_t>(nk, (static_cast<std::int32_t>(blk) + 1) * p.block_kv); ++j) {
              ++keys;
              for (std::int32_t qi = i * p.block_q; qi < std::min(nq, (i + 1) * p.block_q); ++qi) {
                ++pairs_read;
                if (p.mask == mask_kind::none || j <= qi + nk - nq) ++pairs_needed;
              }
            }
          }
          tiles += row_tiles;
          max_tiles = std::max(max_tiles, row_tiles);
        }
      }
    }
    CHECK(t.index_rows == rows);
    CHECK(t.tiles == tiles);
    CHECK(t.keys_read == keys);
    CHECK(t.pairs_read == pairs_read);
    CHECK(t.pairs_needed == pairs_needed);
    if (rows > 0) CHECK(summarize(t).tiles_per_row.worst == static_cast<double>(max_tiles));
  }
}

TEST_CASE("cost: a bad index costs a status and adds nothing") {
  const std::array<std::int32_t, 2> cu_q{0, 2}, cu_kv{0, 5};
  const problem p{.heads_q = 1, .heads_kv = 1, .head_dim = 1, .block_q = 2, .block_kv = 2,
                  .cu_seqlens_q = cu_q, .cu_seqlens_kv = cu_kv};
  const std::array<std::int32_t, 2> row_ptr{0, 1};
  const std::array<std::int32_t, 1> ids{3};
  cost_totals t;
  const status s = measure_cost(p, index::block_csr{row_ptr, ids}, t);
  CHECK(s.code() == status_code::invalid_index);
  CHECK(std::string(s.message()) == "block id 3 >= kv blocks 3 of sequence 0 in row 0 (position 0)");
  CHECK(t.index_rows == 0);
  CHECK(t.tiles_per_row.empty());
}
