// index::sink{n}: the first n blocks of the sequence, clipped to what the row sees; n < 0 reads
// nothing and fails validate(). Random geometries against a brute-force list.
#include "skim/index/sink.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "index/index_testing.hpp"

using namespace skim;
using namespace skim_test;

static_assert(block_index<index::sink>);

TEST_CASE("sink: each row reads [0, min(n, visible blocks)) of a brute-force geometry") {
  SKIM_RANDOM_CASE(rng);
  std::int64_t clipped = 0, unclipped = 0;
  for (int trial = 0; trial < 80; ++trial) {
    const problem_case pc = random_problem(rng);
    const std::int32_t n = uniform(rng, 0, 12);
    INFO(describe(pc), ", sink ", n);
    check_rule(pc, index::sink{n}, [n](std::int32_t visible) { return id_range(0, std::min(n, visible)); }, rng);
    for (const std::int32_t v : brute_visible_blocks(pc)) (v < n ? clipped : unclipped) += v > 0;
  }
  CHECK(clipped > 10);    // rows that see fewer blocks than the sink holds
  CHECK(unclipped > 10);  // and rows that see more
}

TEST_CASE("sink: a negative count reads nothing and is rejected by validate") {
  const problem p = fixed_case().get();
  for (const std::int32_t n : {-1, -7}) {
    const index::sink s{n};
    CHECK(read_rows(p, s) == std::vector<std::vector<std::int32_t>>(6));
    const status st = s.validate(p);
    CHECK(st.code() == status_code::invalid_argument);
    CHECK(msg(st) == "sink blocks " + std::to_string(n) + " < 0");
  }
  // sink{0} is valid and empty.
  CHECK(index::sink{0}.validate(p).ok());
  CHECK(read_rows(p, index::sink{0}) == std::vector<std::vector<std::int32_t>>(6));
}
