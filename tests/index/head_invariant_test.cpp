// index::head_invariant_v: true for the implicit rules, head_shared and unions of head-invariant
// parts, false for the stored forms and by default; an engine may specialise it. Where it is true
// the promise is checked: on random geometries every index head of a query block reads the same ids.
#include "skim/index/head_invariant.hpp"

#include <doctest/doctest.h>

#include <string>
#include <type_traits>

#include "index/index_testing.hpp"
#include "skim/index/block_csr.hpp"
#include "skim/index/block_table.hpp"
#include "skim/index/dense_block_mask.hpp"

using namespace skim;
using namespace skim_test;

namespace {

struct own_index {  // an engine's index that ignores the head, declared so below
  [[nodiscard]] index::range_cursor cursor(const row_info& r) const noexcept {
    return {0, r.visible_blocks > 0 ? 1 : 0};
  }
  [[nodiscard]] status validate(const problem&) const noexcept { return status::success(); }
};
struct other_index : own_index {};  // not declared: false, whatever its cursor does

// Every row reads the ids of the row of its query block's head 0.
template <block_index I>
void check_same_ids_per_head(const problem& p, const I& idx) {
  const auto rows = read_rows(p, idx);
  const std::int64_t heads = p.index_heads();
  for (std::size_t r = 0; r < rows.size(); ++r) {
    INFO("row ", r);
    CHECK(rows[r] == rows[r - r % static_cast<std::size_t>(heads)]);
  }
}

}  // namespace

template <>
struct skim::index::head_invariant<own_index> : std::true_type {};

static_assert(index::head_invariant_v<index::causal_all>);
static_assert(index::head_invariant_v<index::sink> && index::head_invariant_v<const index::sink&>);
static_assert(index::head_invariant_v<index::sliding_window> && index::head_invariant_v<index::sliding_window&&>);
static_assert(index::head_invariant_v<index::head_shared<index::block_table>>);
static_assert(index::head_invariant_v<index::head_shared<index::block_csr>>);
static_assert(index::head_invariant_v<index::block_union<index::sink, index::sliding_window, index::causal_all>>);
static_assert(index::head_invariant_v<index::block_union<index::sink, index::head_shared<index::block_csr>>>);
static_assert(!index::head_invariant_v<index::block_csr>);
static_assert(!index::head_invariant_v<index::block_table>);
static_assert(!index::head_invariant_v<index::dense_block_mask>);
static_assert(!index::head_invariant_v<index::block_union<index::sink, index::block_csr>>);
static_assert(!index::head_invariant_v<index::block_union<index::block_table, index::sliding_window>>);
static_assert(index::head_invariant_v<own_index> && index::head_invariant_v<const own_index&>);
static_assert(!index::head_invariant_v<other_index>);

TEST_CASE("head_invariant: the rules it declares invariant read the same ids on every index head") {
  SKIM_RANDOM_CASE(rng);
  std::int64_t multi_head_rows = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const problem_case pc = random_problem(rng);
    const problem p = pc.get();
    const std::int32_t n = uniform(rng, 0, 6), w = uniform(rng, 0, 6);
    INFO(describe(pc), ", sink ", n, ", window ", w);
    REQUIRE(validate(p).ok());
    if (p.index_heads() > 1) multi_head_rows += p.index_rows();
    check_same_ids_per_head(p, index::causal_all{});
    check_same_ids_per_head(p, index::sink{n});
    check_same_ids_per_head(p, index::sliding_window{w});
    check_same_ids_per_head(p, index::make_union(index::sink{n}, index::sliding_window{w}));
    check_same_ids_per_head(p, own_index{});
    // head_shared over a random stored selection of one row per query block.
    using shared_table = index::head_shared<index::block_table>;
    const model m = random_model(shared_table::shared_problem(p), rng);
    const owned_table t = make_table(as_rows(m));
    check_same_ids_per_head(p, shared_table{.rows = t.view(), .index_heads = p.index_heads()});
  }
  CHECK(multi_head_rows > 100);  // problems with several index heads per query block were drawn
}
