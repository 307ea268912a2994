#include "skim/index/block_csr.hpp"

#include <doctest/doctest.h>

#include <limits>

#include "index/index_testing.hpp"

using namespace skim;
using namespace skim_test;
using skim::index::order;

TEST_CASE("block_csr: cursor yields the model's rows and validates, random problems") {
  SKIM_RANDOM_CASE(rng);
  for (int trial = 0; trial < 60; ++trial) {
    const problem_case pc = random_problem(rng);
    const problem p = pc.get();
    INFO(describe(pc));
    REQUIRE(validate(p).ok());
    const model m = random_model(p, rng);
    owned_csr c = make_csr(as_rows(m));
    CHECK(read_rows(p, c.view()) == as_rows(m));
    const status s = c.view().validate(p);
    CHECK_MESSAGE(s.ok(), s.message());
    // Spare capacity past row_ptr[rows] is allowed and never read.
    c.col_idx.resize(c.col_idx.size() + static_cast<std::size_t>(uniform(rng, 0, 3)), -9);
    CHECK(c.view().validate(p).ok());
    CHECK(read_rows(p, c.view()) == as_rows(m));
  }
}

TEST_CASE("block_csr: both index scopes") {
  problem_case pc = fixed_case();  // a copy: owns its own cu_seqlens
  pc.heads_q = 6;
  pc.heads_kv = 2;
  for (const index_scope scope : {index_scope::kv_head, index_scope::query_head}) {
    pc.scope = scope;
    const problem p = pc.get();
    const std::size_t rows = scope == index_scope::kv_head ? 6 : 18;
    std::vector<std::vector<std::int32_t>> rr(rows);
    for (std::size_t r = 0; r < rows; ++r) {
      for (std::int32_t j = 0; j < static_cast<std::int32_t>(r % 4); ++j) rr[r].push_back(j + 1);
    }
    const owned_csr c = make_csr(rr);
    CHECK(c.view().validate(p).ok());
    CHECK(read_rows(p, c.view()) == rr);
    problem other = p;
    other.scope = scope == index_scope::kv_head ? index_scope::query_head : index_scope::kv_head;
    CHECK(c.view().validate(other).code() == status_code::shape_mismatch);
  }
}

namespace {

std::vector<std::vector<std::int32_t>> fixed_rows() { return {{0, 8}, {}, {1, 3, 9}, {2}, {0, 4}, {1, 2, 3, 4}}; }

void check_error(const status& s, status_code code, std::string_view message) {
  CHECK(s.code() == code);
  CHECK(msg(s) == message);
}

}  // namespace

TEST_CASE("block_csr: invalid ids get exact messages") {
  const problem p = fixed_case().get();
  auto rows = fixed_rows();
  REQUIRE(make_csr(rows).view().validate(p).ok());
  rows[5] = {1, 2, 5};
  check_error(make_csr(rows).view().validate(p, order::any), status_code::invalid_index,
              "block id 5 >= kv blocks 5 of sequence 1 in row 5 (position 2)");
  rows = fixed_rows();
  rows[1] = {3, 9};
  check_error(make_csr(rows).view().validate(p), status_code::invalid_index,
              "block id 9 >= visible blocks 9 in row 1 (position 1): in the future under causality");
  rows = fixed_rows();
  rows[0] = {-1};
  check_error(make_csr(rows).view().validate(p, order::any), status_code::invalid_index,
              "block id -1 < 0 in row 0 (position 0)");
  rows = fixed_rows();
  rows[4] = {0, 0, 4};
  check_error(make_csr(rows).view().validate(p), status_code::invalid_index,
              "duplicate block id 0 in row 4 (positions 0 and 1)");
  CHECK(make_csr(rows).view().validate(p, order::any).ok());
  rows[4] = {0, 4, 1};
  check_error(make_csr(rows).view().validate(p), status_code::invalid_index,
              "unsorted block ids in row 4: 1 at position 2 after 4");
  CHECK(make_csr(rows).view().validate(p, order::any).ok());
}

TEST_CASE("block_csr: bad row_ptr and sizes get exact messages") {
  const problem p = fixed_case().get();
  owned_csr c = make_csr(fixed_rows());  // row_ptr {0, 2, 2, 5, 6, 8, 12}
  REQUIRE(c.row_ptr == std::vector<std::int32_t>{0, 2, 2, 5, 6, 8, 12});
  c.row_ptr[0] = 1;
  check_error(c.view().validate(p, order::any), status_code::invalid_index, "row_ptr[0] = 1, must be 0");
  c.row_ptr[0] = 0;
  c.row_ptr[3] = 1;
  check_error(c.view().validate(p, order::any), status_code::invalid_index,
              "row_ptr[3] = 1 < row_ptr[2] = 2 (must not decrease)");
  c.row_ptr[3] = 5;
  c.row_ptr[6] = 13;
  check_error(c.view().validate(p, order::any), status_code::invalid_index, "row_ptr[6] = 13 > col_idx size 12");
  c.row_ptr[6] = 12;
  REQUIRE(c.view().validate(p).ok());
  index::block_csr short_ptr{std::span<const std::int32_t>(c.row_ptr).first(6), c.col_idx};
  check_error(short_ptr.validate(p), status_code::shape_mismatch, "block_csr row_ptr has 6 entries, needs rows 6 + 1");
  problem bad = p;
  bad.heads_kv = 0;
  check_error(c.view().validate(bad), status_code::invalid_argument, "heads_kv 0 <= 0");
}

TEST_CASE("block_csr: cursor stays inside its spans for garbage row_ptr") {
  const problem p = fixed_case().get();
  owned_csr c = make_csr(fixed_rows());
  c.row_ptr = {-4, 3, 1, std::numeric_limits<std::int32_t>::max(), std::numeric_limits<std::int32_t>::min(), 10, 40};
  const auto rows = read_rows(p, c.view());
  CHECK(rows[0] == std::vector<std::int32_t>(c.col_idx.begin(), c.col_idx.begin() + 3));  // [-4, 3) -> [0, 3)
  CHECK(rows[1].empty());                                                                  // [3, 1): reversed
  CHECK(rows[2] == std::vector<std::int32_t>(c.col_idx.begin() + 1, c.col_idx.end()));      // [1, max) -> [1, 12)
  CHECK(rows[3].empty());                                                                  // [12, min)
  CHECK(rows[4] == std::vector<std::int32_t>(c.col_idx.begin(), c.col_idx.begin() + 10));  // [min, 10) -> [0, 10)
  CHECK(rows[5] == std::vector<std::int32_t>(c.col_idx.begin() + 10, c.col_idx.end()));    // [10, 40) -> [10, 12)
  // row_ptr too short for the problem: rows past it are empty.
  index::block_csr cut{std::span<const std::int32_t>(c.row_ptr).first(3), c.col_idx};
  const auto cut_rows = read_rows(p, cut);
  CHECK(cut_rows[1].empty());
  CHECK(cut_rows[2].empty());
  CHECK(cut_rows[0].size() == 3);
  index::block_csr empty{};
  CHECK(read_rows(p, empty) == std::vector<std::vector<std::int32_t>>(6));
}

TEST_CASE("block_csr: a mutable CSR is an index and converts to the read-only view") {
  const problem p = fixed_case().get();
  owned_csr c = make_csr(fixed_rows());
  const index::mutable_block_csr mc = c.mut();
  const index::block_csr view = mc;
  CHECK(view.row_ptr.data() == c.row_ptr.data());
  CHECK(read_rows(p, mc) == fixed_rows());
  c.col_idx[0] = 5;  // row 0 becomes {5, 8}: unsorted-free but now valid only if sorted
  CHECK(read_rows(p, view)[0] == std::vector<std::int32_t>{5, 8});
  CHECK(view.validate(p).ok());
}
