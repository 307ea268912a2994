#include "skim/select/select_all.hpp"

#include <doctest/doctest.h>

#include <numeric>

#include "index/index_testing.hpp"
#include "select/select_testing.hpp"
#include "skim/select/reserved.hpp"
#include "skim/select/threshold.hpp"
#include "skim/select/top_k.hpp"

using namespace skim;
using select_test::aligned_bytes;
using select_test::check_error;
using skim::select::reserved;
using skim::select::select_input;
using skim::select::threshold;
using skim::select::threshold_mode;
using skim::select::top_k;
using skim_test::owned_csr;
using skim_test::owned_table;

namespace {

struct scored_case {
  skim_test::problem_case pc;
  std::int64_t stride = 0;
  std::vector<float> scores, prior;
  [[nodiscard]] select_input input() const {
    return {.scores = scores, .score_stride = stride, .prior = prior, .prior_stride = stride};
  }
};

scored_case random_scored(std::mt19937& rng) {
  scored_case c;
  c.pc = skim_test::random_problem(rng);
  const problem p = c.pc.get();
  c.stride = p.max_kv_blocks() + select_test::uniform(rng, 0, 3);
  const auto n = static_cast<std::size_t>(p.index_rows() * c.stride);
  c.scores = select_test::random_scores(rng, n);
  c.prior = select_test::random_scores(rng, n);
  return c;
}

// Runs select_all into a table of width max_count and into a csr of exactly enough capacity.
template <selector S>
void check_select_all(const S& sel, const scored_case& c, std::mt19937& rng) {
  const problem p = c.pc.get();
  const auto rows = static_cast<std::size_t>(p.index_rows());
  const std::int32_t width = select::max_count(sel, p);
  owned_table t;
  t.width = width;
  t.ids.assign(rows * static_cast<std::size_t>(width), 77);
  t.count.assign(rows, 77);
  aligned_bytes ws(select::workspace_bytes(sel, p));
  const status st = select::select_all(sel, p, c.input(), t.mut(), ws.bytes);
  REQUIRE_MESSAGE(st.ok(), st.message());
  const status valid = t.view().validate(p);
  CHECK_MESSAGE(valid.ok(), valid.message());
  for (std::size_t i = 0; i < t.ids.size(); ++i) {  // padding is written too
    if (static_cast<std::int32_t>(i % static_cast<std::size_t>(width)) >= t.count[i / static_cast<std::size_t>(width)]) {
      CHECK(t.ids[i] == index::mutable_block_table::pad);
    }
  }

  // Rows one by one, in shuffled order, with select_row: the same table.
  std::vector<row_info> infos;
  REQUIRE(for_each_row(p, [&](const row_info& r) { infos.push_back(r); }).ok());
  std::shuffle(infos.begin(), infos.end(), rng);
  owned_table u = t;
  std::fill(u.ids.begin(), u.ids.end(), index::mutable_block_table::pad);
  for (const row_info& r : infos) {
    const auto row = static_cast<std::size_t>(r.row);
    const auto off = row * static_cast<std::size_t>(c.stride);
    const row_scores in{.row = r, .scores = std::span<const float>(c.scores).subspan(off, static_cast<std::size_t>(c.stride)),
                        .prior = std::span<const float>(c.prior).subspan(off, static_cast<std::size_t>(c.stride))};
    REQUIRE(sel.select_row(in, std::span(u.ids).subspan(row * static_cast<std::size_t>(width), static_cast<std::size_t>(width)),
                           u.count[row], ws.bytes).ok());
  }
  CHECK(u.ids == t.ids);
  CHECK(u.count == t.count);

  // csr with exactly the capacity needed, then one less (when there is any id).
  const auto nnz = static_cast<std::size_t>(std::accumulate(t.count.begin(), t.count.end(), std::int64_t{0}));
  owned_csr c1;
  c1.row_ptr.assign(rows + 1, -5);
  c1.col_idx.assign(nnz, -5);
  const status sc = select::select_all(sel, p, c.input(), c1.mut(), ws.bytes);
  REQUIRE_MESSAGE(sc.ok(), sc.message());
  const status vc = c1.view().validate(p);
  CHECK_MESSAGE(vc.ok(), vc.message());
  CHECK(skim_test::read_rows(p, c1.view()) == skim_test::read_rows(p, t.view()));
  if (nnz > 0) {
    c1.col_idx.pop_back();
    const status full = select::select_all(sel, p, c.input(), c1.mut(), ws.bytes);
    CHECK(full.code() == status_code::shape_mismatch);
    CHECK(std::string(full.message()).find("block_csr col_idx capacity " + std::to_string(nnz - 1) + " exceeded") == 0);
  }
}

}  // namespace

TEST_CASE("select::select_all: table and csr are canonical, row-order independent, and agree") {
  SKIM_SELECT_RANDOM_CASE(rng);
  for (int trial = 0; trial < 40; ++trial) {
    const scored_case c = random_scored(rng);
    INFO(skim_test::describe(c.pc), " stride ", c.stride);
    const std::int32_t k = select_test::uniform(rng, 0, 6);
    check_select_all(top_k{.k = k}, c, rng);
    check_select_all(threshold{.mode = threshold_mode::mass, .tau = 0.8f, .k_min = 1, .k_max = k + 1}, c, rng);
    check_select_all(threshold{.mode = threshold_mode::relative, .tau = 1.0f}, c, rng);
    check_select_all(reserved<top_k>{.sink = 1, .local = 2, .importance = 0.5f, .dynamic = {.k = k}}, c, rng);
  }
}

TEST_CASE("select::select_all: bad shapes give exact statuses") {
  const skim_test::problem_case& pc = skim_test::fixed_case();  // 6 rows, max kv blocks 10
  const problem p = pc.get();
  std::vector<float> scores(60, 0.0f);
  owned_table t;
  t.width = 2;
  t.ids.assign(12, 0);
  t.count.assign(6, 0);
  aligned_bytes ws(select::workspace_bytes(top_k{.k = 3}, p));
  const top_k sel{.k = 3};
  check_error(select::select_all(sel, p, {.scores = scores, .score_stride = 9}, t.mut(), ws.bytes),
              status_code::shape_mismatch, "score_stride 9 < max kv blocks 10");
  check_error(select::select_all(sel, p, {.scores = std::span(scores).first(59), .score_stride = 10}, t.mut(), ws.bytes),
              status_code::shape_mismatch, "scores has 59 entries < index rows 6 x score_stride 10");
  check_error(select::select_all(sel, p, {.scores = scores, .score_stride = 10, .prior = scores, .prior_stride = 11},
                                 t.mut(), ws.bytes),
              status_code::shape_mismatch, "prior has 60 entries < index rows 6 x prior_stride 11");
  check_error(select::select_all(sel, p, {.scores = scores, .score_stride = 10}, t.mut(), ws.bytes),
              status_code::shape_mismatch, "row 0 selects 3 blocks > block_table width 2 (size it with max_count)");
  owned_table bad = t;
  bad.count.pop_back();
  check_error(select::select_all(top_k{.k = 2}, p, {.scores = scores, .score_stride = 10}, bad.mut(), ws.bytes),
              status_code::shape_mismatch, "block_table count has 5 entries, problem has 6 rows");
  owned_csr c;
  c.row_ptr.assign(6, 0);
  check_error(select::select_all(sel, p, {.scores = scores, .score_stride = 10}, c.mut(), ws.bytes),
              status_code::shape_mismatch, "block_csr row_ptr has 6 entries, needs rows 6 + 1");
  c.row_ptr.assign(7, 0);
  c.col_idx.assign(8, 0);
  check_error(select::select_all(sel, p, {.scores = scores, .score_stride = 10}, c.mut(), ws.bytes),
              status_code::shape_mismatch, "block_csr col_idx capacity 8 exceeded in row 2: rows up to it need 9 ids");
  check_error(select::select_all(top_k{.k = -1}, p, {.scores = scores, .score_stride = 10}, t.mut(), ws.bytes),
              status_code::invalid_argument, "top_k k -1 < 0");
  const status small = select::select_all(sel, p, {.scores = scores, .score_stride = 10}, c.mut(), ws.bytes.first(8));
  CHECK(small.code() == status_code::workspace_too_small);
}
