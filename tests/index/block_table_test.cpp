#include "skim/index/block_table.hpp"

#include <doctest/doctest.h>

#include <limits>

#include "index/index_testing.hpp"

using namespace skim;
using namespace skim_test;
using skim::index::order;

TEST_CASE("block_table: cursor yields the model's rows and validates, random problems") {
  SKIM_RANDOM_CASE(rng);
  for (int trial = 0; trial < 60; ++trial) {
    const problem_case pc = random_problem(rng);
    const problem p = pc.get();
    INFO(describe(pc));
    REQUIRE(validate(p).ok());
    const model m = random_model(p, rng);
    const owned_table t = make_table(as_rows(m), uniform(rng, 0, 2));
    CHECK(read_rows(p, t.view()) == as_rows(m));
    const status s = t.view().validate(p);
    CHECK_MESSAGE(s.ok(), s.message());
    CHECK(index::validate(p, t.view(), order::any).ok());
  }
}

TEST_CASE("block_table: both index scopes change the row count") {
  problem_case pc = fixed_case();  // a copy: owns its own cu_seqlens
  pc.heads_q = 4;
  pc.heads_kv = 2;
  for (const index_scope scope : {index_scope::kv_head, index_scope::query_head}) {
    pc.scope = scope;
    const problem p = pc.get();
    const std::size_t rows = scope == index_scope::kv_head ? 6 : 12;
    // Row r reads block r % 5 (every row sees at least 5 blocks).
    std::vector<std::vector<std::int32_t>> rr(rows);
    for (std::size_t r = 0; r < rows; ++r) rr[r] = {static_cast<std::int32_t>(r % 5)};
    const owned_table t = make_table(rr);
    CHECK(t.view().validate(p).ok());
    CHECK(read_rows(p, t.view()) == rr);
    // The same storage is the wrong size for the other scope.
    problem other = p;
    other.scope = scope == index_scope::kv_head ? index_scope::query_head : index_scope::kv_head;
    CHECK(t.view().validate(other).code() == status_code::shape_mismatch);
  }
}

namespace {

// Valid canonical rows for fixed_case(), width 4.
std::vector<std::vector<std::int32_t>> fixed_rows() { return {{0, 8}, {}, {1, 3, 9}, {2}, {0, 4}, {1, 2, 3, 4}}; }

status validate_with(std::vector<std::vector<std::int32_t>> rows, order o = order::canonical) {
  const owned_table t = make_table(rows);
  return t.view().validate(fixed_case().get(), o);
}

void check_error(const status& s, status_code code, std::string_view message) {
  CHECK(s.code() == code);
  CHECK(msg(s) == message);
}

}  // namespace

TEST_CASE("block_table: invalid ids get exact messages") {
  REQUIRE(validate_with(fixed_rows()).ok());
  auto rows = fixed_rows();
  rows[4] = {0, 7};  // seq 1 has 5 kv blocks
  check_error(validate_with(rows), status_code::invalid_index,
              "block id 7 >= kv blocks 5 of sequence 1 in row 4 (position 1)");
  check_error(validate_with(rows, order::any), status_code::invalid_index,
              "block id 7 >= kv blocks 5 of sequence 1 in row 4 (position 1)");
  rows = fixed_rows();
  rows[0] = {9};  // inside seq 0 (10 blocks) but row 0 sees 9
  check_error(validate_with(rows), status_code::invalid_index,
              "block id 9 >= visible blocks 9 in row 0 (position 0): in the future under causality");
  rows = fixed_rows();
  rows[3] = {0, 1, -2};
  check_error(validate_with(rows), status_code::invalid_index, "block id -2 < 0 in row 3 (position 2)");
  rows = fixed_rows();
  rows[2] = {1, 3, 3};
  check_error(validate_with(rows), status_code::invalid_index, "duplicate block id 3 in row 2 (positions 1 and 2)");
  CHECK(validate_with(rows, order::any).ok());
  rows[2] = {4, 2};
  check_error(validate_with(rows), status_code::invalid_index, "unsorted block ids in row 2: 2 at position 1 after 4");
  CHECK(validate_with(rows, order::any).ok());
}

TEST_CASE("block_table: bad counts and sizes get exact messages") {
  const problem p = fixed_case().get();
  owned_table t = make_table(fixed_rows());
  REQUIRE(t.width == 4);
  t.count[5] = -1;
  check_error(t.view().validate(p), status_code::invalid_index, "count -1 < 0 in row 5");
  check_error(t.view().validate(p, order::any), status_code::invalid_index, "count -1 < 0 in row 5");
  t.count[5] = 0;
  t.count[1] = 5;
  check_error(t.view().validate(p, order::any), status_code::invalid_index, "count 5 > width 4 in row 1");
  t.count[1] = 0;
  REQUIRE(t.view().validate(p).ok());

  index::block_table short_count{t.ids, std::span<const std::int32_t>(t.count).first(5), 4};
  check_error(short_count.validate(p), status_code::shape_mismatch,
              "block_table count has 5 entries, problem has 6 rows");
  index::block_table short_ids{std::span<const std::int32_t>(t.ids).first(23), t.count, 4};
  check_error(short_ids.validate(p), status_code::shape_mismatch,
              "block_table ids has 23 entries, needs rows 6 x width 4");
  index::block_table negative_width{t.ids, t.count, -1};
  check_error(negative_width.validate(p), status_code::invalid_argument, "block_table width -1 < 0");
}

TEST_CASE("block_table: cursor stays inside its spans for garbage counts and rows") {
  const problem p = fixed_case().get();
  owned_table t = make_table(fixed_rows());
  t.count = {-5, std::numeric_limits<std::int32_t>::max(), 3, 4, 2, 9};
  const auto rows = read_rows(p, t.view());
  CHECK(rows[0].empty());
  CHECK(rows[1] == std::vector<std::int32_t>(t.ids.begin() + 4, t.ids.begin() + 8));  // clamped to width
  CHECK(rows[5] == std::vector<std::int32_t>(t.ids.begin() + 20, t.ids.begin() + 24));
  // ids shorter than rows x width: the last row is cut at the end of ids, a row past it is empty.
  index::block_table cut{std::span<const std::int32_t>(t.ids).first(22), t.count, 4};
  const auto cut_rows = read_rows(p, cut);
  CHECK(cut_rows[5] == std::vector<std::int32_t>(t.ids.begin() + 20, t.ids.begin() + 22));
  index::block_table no_ids{std::span<const std::int32_t>(t.ids).first(8), t.count, 4};
  CHECK(read_rows(p, no_ids)[4].empty());
  row_info beyond;
  beyond.row = 6;
  CHECK(t.view().cursor(beyond).done());
  beyond.row = -1;
  CHECK(t.view().cursor(beyond).done());
}

TEST_CASE("block_table: a mutable table is an index and converts to the read-only view") {
  const problem p = fixed_case().get();
  owned_table t = make_table(fixed_rows());
  const index::mutable_block_table mt = t.mut();
  const index::block_table view = mt;
  CHECK(view.ids.data() == t.ids.data());
  CHECK(read_rows(p, mt) == fixed_rows());
  t.ids[0] = 3;  // row 0 becomes {3, 8}: the views see the caller's memory
  CHECK(read_rows(p, view)[0] == std::vector<std::int32_t>{3, 8});
}
