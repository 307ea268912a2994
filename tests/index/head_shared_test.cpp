#include "skim/index/head_shared.hpp"

#include <doctest/doctest.h>

#include "index/index_testing.hpp"
#include "skim/index/head_invariant.hpp"

using namespace skim;
using namespace skim_test;

static_assert(block_index<index::head_shared<index::block_table>>);
static_assert(block_index<index::head_shared<index::block_csr>>);
static_assert(index::head_invariant_v<index::head_shared<index::block_table>>);
static_assert(index::head_invariant_v<const index::head_shared<index::block_csr>&>);

TEST_CASE("head_shared: every index head of a query block reads its block's row, random problems") {
  SKIM_RANDOM_CASE(rng);
  for (int trial = 0; trial < 60; ++trial) {
    const problem_case pc = random_problem(rng);
    const problem p = pc.get();
    INFO(describe(pc));
    REQUIRE(validate(p).ok());
    using shared_table = index::head_shared<index::block_table>;
    const problem one = shared_table::shared_problem(p);
    REQUIRE(one.index_rows() == p.total_q_blocks());
    const model m = random_model(one, rng);  // one row per query block
    const owned_table t = make_table(as_rows(m), uniform(rng, 0, 2));
    const shared_table shared{.rows = t.view(), .index_heads = p.index_heads()};

    std::vector<std::vector<std::int32_t>> want(static_cast<std::size_t>(p.index_rows()));
    REQUIRE(for_each_row(p, [&](const row_info& r) {
              const auto& ids = m[static_cast<std::size_t>(r.row / p.index_heads())];
              want[static_cast<std::size_t>(r.row)].assign(ids.begin(), ids.end());
            }).ok());
    CHECK(read_rows(p, shared) == want);
    const status s = shared.validate(p);
    CHECK_MESSAGE(s.ok(), s.message());
  }
}

TEST_CASE("head_shared: validate names the head count and the shared row's bad id") {
  problem_case pc = fixed_case();  // 2 sequences, 3 query blocks, heads 2/2
  pc.heads_q = 4;
  for (const index_scope scope : {index_scope::kv_head, index_scope::query_head}) {
    pc.scope = scope;
    const problem p = pc.get();
    // Query blocks 0, 1 (sequence 0) see 9 and 10 blocks, block 2 (sequence 1) sees 5.
    owned_table t = make_table({{0, 8}, {9}, {4}});
    index::head_shared<index::block_table> shared{.rows = t.view(), .index_heads = p.index_heads()};
    CHECK(shared.validate(p).ok());

    shared.index_heads = p.index_heads() + 1;
    const status heads = shared.validate(p);
    CHECK(heads.code() == status_code::shape_mismatch);
    CHECK(std::string_view(heads.message()).find("index_heads") != std::string_view::npos);

    shared.index_heads = p.index_heads();
    t.ids[0] = 9;  // query block 0 sees blocks [0, 9)
    shared.rows = t.view();
    const status bad = shared.validate(p);
    CHECK(bad.code() == status_code::invalid_index);
    CHECK_MESSAGE(std::string_view(bad.message()).find("row 0") != std::string_view::npos, bad.message());
  }
}
