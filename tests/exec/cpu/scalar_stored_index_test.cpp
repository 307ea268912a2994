// exec::scalar against exec::reference on the stored index formats (block_csr, block_table,
// dense_block_mask) holding the same random selection, and on block_union with overlapping parts
// compared with the same set given once.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "skim/exec/cpu/reference.hpp"
#include "skim/exec/cpu/scalar.hpp"
#include "skim/index/block_csr.hpp"
#include "skim/index/block_table.hpp"
#include "skim/index/block_union.hpp"
#include "skim/index/convert.hpp"
#include "skim/index/dense_block_mask.hpp"
#include "skim/index/sink.hpp"
#include "skim/index/sliding_window.hpp"
#include "support/compare.hpp"
#include "support/executor_cases.hpp"
#include "support/random_case.hpp"

using namespace skim;
using namespace skim::test;

namespace {


template <class TO, class TQ, class TKV, class Index>
void run_both(const random_case<TQ, TKV>& c, const Index& index, output<TO>& ref, output<TO>& got) {
  c.with_kv([&](auto kv) {
    attention_args<TQ, decltype(kv), Index, TO> a{
        .prob = c.prob(), .q = c.q_view(), .kv = kv, .index = index, .o = ref.view, .lse = ref.lse};
    const status rs = run_executor(exec::reference{}, a);
    INFO("reference: " << std::string(rs.message()));
    REQUIRE(rs.ok());
    a.o = got.view;
    a.lse = got.lse;
    const status ss = run_executor(exec::scalar{}, a);
    INFO("scalar: " << std::string(ss.message()));
    REQUIRE(ss.ok());
  });
}

template <class TO>
bool same_bits(const output<TO>& a, const output<TO>& b) {
  const auto same = [](const auto& x, const auto& y) {  // memcmp must not see the null data of an empty vector
    return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0);
  };
  return same(a.o, b.o) && same(a.lse, b.lse);
}

}  // namespace

TEST_CASE_TEMPLATE("scalar matches reference on block_csr, block_table and dense_block_mask", T,
                   types<float, float, float>, types<bfloat16, bfloat16, float>, types<half, half, half>) {
  using TQ = typename T::q;
  using TKV = typename T::kv;
  using TO = typename T::o;
  for (std::uint32_t i = 0; i < 20; ++i) {
    const std::uint32_t seed = 0x570e0u + 101u * i + static_cast<std::uint32_t>(sizeof(TQ) * 7 + sizeof(TO));
    std::mt19937 rng(seed);
    const case_spec spec = random_spec(rng, 4e6);
    const random_case<TQ, TKV> c(spec, rng);
    const problem p = c.prob();
    const double density = pick(rng, {0.1, 0.3, 0.6, 1.0});
    const std::string desc = spec.describe();
    INFO("seed " << seed << ": " << desc << ", density " << density);

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

    output<TO> ref(spec, c.tokens_q()), got_csr(spec, c.tokens_q());
    run_both(c, csr.view(), ref, got_csr);
    const comparison r = compare(p, got_csr.view, ref.view, std::span<const float>(got_csr.lse),
                                 std::span<const float>(ref.lse), output_tolerance<TO>);
    check(r);

    // The same selection in another form: the same ids in the same order, so bit-identical results.
    output<TO> ref_table(spec, c.tokens_q()), got_table(spec, c.tokens_q());
    run_both(c, table, ref_table, got_table);
    CHECK(same_bits(ref_table, ref));
    CHECK(same_bits(got_table, got_csr));
    output<TO> ref_mask(spec, c.tokens_q()), got_mask(spec, c.tokens_q());
    run_both(c, mask, ref_mask, got_mask);
    CHECK(same_bits(ref_mask, ref));
    CHECK(same_bits(got_mask, got_csr));
  }
}

TEST_CASE("block_union with overlapping parts equals the same set given once") {
  std::int64_t overlapping_rows = 0;  // rows where some id is held by two parts, over all cases
  for (std::uint32_t i = 0; i < 30; ++i) {
    const std::uint32_t seed = 0x0410u + 37u * i;
    std::mt19937 rng(seed);
    const case_spec spec = random_spec(rng, 4e6);
    const random_case<float, half> c(spec, rng);
    const problem p = c.prob();
    const std::int32_t sink_blocks = uniform(rng, 0, 3), window_blocks = uniform(rng, 0, 3);
    const double density = pick(rng, {0.1, 0.3, 0.6});
    const std::string desc = spec.describe();
    INFO("seed " << seed << ": " << desc << ", sink " << sink_blocks << ", window " << window_blocks << ", density "
                 << density);

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

    output<float> ref_once(spec, c.tokens_q()), got_once(spec, c.tokens_q());
    run_both(c, once.view(), ref_once, got_once);
    output<float> ref_union(spec, c.tokens_q()), got_union(spec, c.tokens_q());
    run_both(c, u, ref_union, got_union);
    // Nothing counted twice: the union walks exactly the set's ids, in the same order.
    CHECK(same_bits(ref_union, ref_once));
    CHECK(same_bits(got_union, got_once));
    check(compare(p, got_union.view, ref_once.view, std::span<const float>(got_union.lse),
                  std::span<const float>(ref_once.lse), output_tolerance<float>));
  }
  CHECK(overlapping_rows > 100);  // the property was exercised, not just empty unions
}
