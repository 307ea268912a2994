// index::sliding_window{n}: the newest n blocks the row sees, [max(0, visible - n), visible);
// n < 0 reads nothing and fails validate(). Random geometries against a brute-force list.
#include "skim/index/sliding_window.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "index/index_testing.hpp"

using namespace skim;
using namespace skim_test;

static_assert(block_index<index::sliding_window>);

TEST_CASE("sliding_window: each row reads its newest n visible blocks of a brute-force geometry") {
  SKIM_RANDOM_CASE(rng);
  std::int64_t clipped = 0, sliding = 0;
  for (int trial = 0; trial < 80; ++trial) {
    const problem_case pc = random_problem(rng);
    const std::int32_t n = uniform(rng, 0, 12);
    INFO(describe(pc), ", window ", n);
    check_rule(pc, index::sliding_window{n},
               [n](std::int32_t visible) { return id_range(std::max(0, visible - n), visible); }, rng);
    for (const std::int32_t v : brute_visible_blocks(pc)) (v <= n ? clipped : sliding) += v > 0;
  }
  CHECK(clipped > 10);  // windows reaching back to block 0
  CHECK(sliding > 10);  // windows that start past block 0
}

TEST_CASE("sliding_window: under causality the newest block holds the row's diagonal") {
  // fixed_case() (causal, bq = bk = 4): query block i of sequence 0 (8 queries, 40 keys) ends at
  // query 4i + 3, which sees keys up to 4i + 3 + 32: block i + 8 holds the diagonal.
  const problem p = fixed_case().get();
  const std::vector<std::vector<std::int32_t>> want{{7, 8}, {7, 8}, {8, 9}, {8, 9}, {3, 4}, {3, 4}};
  CHECK(read_rows(p, index::sliding_window{2}) == want);
}

TEST_CASE("sliding_window: a negative count reads nothing and is rejected by validate") {
  const problem p = fixed_case().get();
  for (const std::int32_t n : {-1, -3}) {
    const index::sliding_window w{n};
    CHECK(read_rows(p, w) == std::vector<std::vector<std::int32_t>>(6));
    const status st = w.validate(p);
    CHECK(st.code() == status_code::invalid_argument);
    CHECK(msg(st) == "sliding_window blocks " + std::to_string(n) + " < 0");
  }
  CHECK(index::sliding_window{0}.validate(p).ok());
  CHECK(read_rows(p, index::sliding_window{0}) == std::vector<std::vector<std::int32_t>>(6));
}
