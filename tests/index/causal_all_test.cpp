// index::causal_all: every block the row can see, [0, visible blocks), on random geometries
// (varlen with empty sequences, both masks, odd block sizes, both index scopes).
#include "skim/index/causal_all.hpp"

#include <doctest/doctest.h>

#include "index/index_testing.hpp"

using namespace skim;
using namespace skim_test;

static_assert(block_index<index::causal_all>);
static_assert(skippable_cursor<decltype(index::causal_all{}.cursor(row_info{}))>);

TEST_CASE("causal_all: each row reads [0, visible blocks) of a brute-force geometry") {
  SKIM_RANDOM_CASE(rng);
  std::int64_t rows_with_ids = 0, rows_short_of_kv = 0;  // the property was exercised both ways
  for (int trial = 0; trial < 80; ++trial) {
    const problem_case pc = random_problem(rng);
    INFO(describe(pc));
    check_rule(pc, index::causal_all{}, [](std::int32_t visible) { return id_range(0, visible); }, rng);
    const problem p = pc.get();
    REQUIRE(for_each_row(p, [&](const row_info& r) {
              rows_with_ids += r.visible_blocks > 0;
              rows_short_of_kv += r.visible_blocks < r.kv_blocks;
            }).ok());
  }
  CHECK(rows_with_ids > 100);
  CHECK(rows_short_of_kv > 10);  // causal rows that see only part of their sequence
}

TEST_CASE("causal_all: a fixed varlen causal case, by hand") {
  // fixed_case(): seq 0 rows 0, 1 see 9 blocks, rows 2, 3 see 10; seq 1 rows 4, 5 see 5.
  const problem p = fixed_case().get();
  const std::vector<std::vector<std::int32_t>> want{id_range(0, 9), id_range(0, 9),  id_range(0, 10),
                                                    id_range(0, 10), id_range(0, 5), id_range(0, 5)};
  CHECK(read_rows(p, index::causal_all{}) == want);
  // Under mask_kind::none every row reads its whole sequence.
  problem_case none = fixed_case();
  none.mask = mask_kind::none;
  const std::vector<std::vector<std::int32_t>> all{id_range(0, 10), id_range(0, 10), id_range(0, 10),
                                                   id_range(0, 10), id_range(0, 5),  id_range(0, 5)};
  CHECK(read_rows(none.get(), index::causal_all{}) == all);
}
