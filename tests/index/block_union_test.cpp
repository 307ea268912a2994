#include "skim/index/block_union.hpp"

#include <doctest/doctest.h>

#include "index/index_testing.hpp"
#include "skim/index/causal_all.hpp"
#include "skim/index/sink.hpp"
#include "skim/index/sliding_window.hpp"

using namespace skim;
using namespace skim_test;

namespace {

// The model of an implicit rule: what its cursor yields, collected as sets.
template <block_index I>
model model_of(const problem& p, const I& idx) {
  model m(static_cast<std::size_t>(p.index_rows()));
  const auto rows = read_rows(p, idx);
  for (std::size_t r = 0; r < rows.size(); ++r) m[r].insert(rows[r].begin(), rows[r].end());
  return m;
}

model set_union(model a, const model& b) {
  for (std::size_t r = 0; r < a.size(); ++r) a[r].insert(b[r].begin(), b[r].end());
  return a;
}

}  // namespace

TEST_CASE("block_union: the merge is the set union, each id once, random problems") {
  SKIM_RANDOM_CASE(rng);
  for (int trial = 0; trial < 60; ++trial) {
    const problem_case pc = random_problem(rng);
    const problem p = pc.get();
    INFO(describe(pc));
    const model m1 = random_model(p, rng);
    const model m2 = random_model(p, rng);
    const owned_table t = make_table(as_rows(m1));
    const owned_csr c = make_csr(as_rows(m2));
    const index::sink snk{uniform(rng, 0, 3)};
    const index::sliding_window win{uniform(rng, 0, 3)};
    const model expected = set_union(set_union(set_union(m1, m2), model_of(p, snk)), model_of(p, win));

    const auto u = index::make_union(t.view(), c.view(), snk, win);
    const auto got = read_rows(p, u);
    CHECK(got == as_rows(expected));  // as_rows is sorted and unique: so must the merge be
    const status s = u.validate(p);
    CHECK_MESSAGE(s.ok(), s.message());

    // Overlapping parts: a part united with itself and with a superset adds nothing twice.
    const auto self = index::make_union(c.view(), c.view(), index::causal_all{});
    CHECK(read_rows(p, self) == as_rows(model_of(p, index::causal_all{})));
    const auto twice = index::make_union(t.view(), t.view());
    CHECK(read_rows(p, twice) == as_rows(m1));
    // Unions nest.
    const auto nested = index::make_union(index::make_union(t.view(), snk), index::make_union(c.view(), win));
    CHECK(read_rows(p, nested) == as_rows(expected));
  }
}

TEST_CASE("block_union: a single part and empty parts") {
  const problem p = fixed_case().get();
  const std::vector<std::vector<std::int32_t>> rows{{0, 8}, {}, {1, 3, 9}, {2}, {0, 4}, {1, 2, 3, 4}};
  const owned_csr c = make_csr(rows);
  const owned_csr empty = make_csr(std::vector<std::vector<std::int32_t>>(6));
  CHECK(read_rows(p, index::make_union(c.view())) == rows);
  CHECK(read_rows(p, index::make_union(empty.view(), c.view(), empty.view())) == rows);
  CHECK(read_rows(p, index::make_union(empty.view(), index::sink{0})) == std::vector<std::vector<std::int32_t>>(6));
  const index::block_union<index::sink, index::sliding_window> u{};
  CHECK(read_rows(p, u)[4] == std::vector<std::int32_t>{0, 4});  // sink 1 and window 1 of a 5-block row
  index::union_cursor<index::range_cursor> dflt;
  CHECK(dflt.done());
}

TEST_CASE("block_union: validate names the failing part") {
  const problem p = fixed_case().get();
  const std::vector<std::vector<std::int32_t>> good{{0, 8}, {}, {1, 3, 9}, {2}, {0, 4}, {1, 2, 3, 4}};
  auto bad = good;
  bad[2] = {3, 3};
  const owned_csr g = make_csr(good);
  const owned_csr b = make_csr(bad);
  const status s = index::make_union(g.view(), b.view()).validate(p);
  CHECK(s.code() == status_code::invalid_index);
  CHECK(msg(s) == "union part 1: duplicate block id 3 in row 2 (positions 0 and 1)");
  const status s2 = index::make_union(index::sink{-2}, g.view()).validate(p);
  CHECK(s2.code() == status_code::invalid_argument);
  CHECK(msg(s2) == "union part 0: sink blocks -2 < 0");
  CHECK(index::make_union(g.view(), index::sink{2}).validate(p).ok());
}

TEST_CASE("block_union: broken parts cannot make the merge repeat or go back") {
  const problem p = fixed_case().get();
  const owned_csr a = make_csr({{5, 5, 1, 7}, {}, {}, {}, {}, {}});
  const owned_csr b = make_csr({{2, 5, 6}, {}, {}, {}, {}, {}});
  const auto rows = read_rows(p, index::make_union(a.view(), b.view()));
  CHECK(rows[0] == std::vector<std::int32_t>{2, 5, 6, 7});
  CHECK(!index::make_union(a.view(), b.view()).validate(p).ok());
}
