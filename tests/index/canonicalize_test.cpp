#include "skim/index/canonicalize.hpp"

#include <doctest/doctest.h>

#include <algorithm>

#include "index/index_testing.hpp"

using namespace skim;
using namespace skim_test;
using skim::index::order;

namespace {

// The model's rows made raw: each id repeated 1..3 times, shuffled.
std::vector<std::vector<std::int32_t>> raw_rows(const model& m, std::mt19937& rng) {
  std::vector<std::vector<std::int32_t>> rows;
  for (const auto& s : m) {
    std::vector<std::int32_t> r;
    for (std::int32_t id : s) r.insert(r.end(), static_cast<std::size_t>(uniform(rng, 1, 3)), id);
    std::shuffle(r.begin(), r.end(), rng);
    rows.push_back(std::move(r));
  }
  return rows;
}

void check_error(const status& s, status_code code, std::string_view message) {
  CHECK(s.code() == code);
  CHECK(msg(s) == message);
}

}  // namespace

TEST_CASE("canonicalize: block_table rows become sorted and unique, random problems") {
  SKIM_RANDOM_CASE(rng);
  for (int trial = 0; trial < 60; ++trial) {
    const problem_case pc = random_problem(rng);
    const problem p = pc.get();
    INFO(describe(pc));
    const model m = random_model(p, rng);
    owned_table t = make_table(raw_rows(m, rng), uniform(rng, 0, 2));
    REQUIRE(index::validate(p, t.view(), order::any).ok());
    const status s = index::canonicalize(p, t.mut());
    REQUIRE_MESSAGE(s.ok(), s.message());
    CHECK(read_rows(p, t.view()) == as_rows(m));
    CHECK(t.view().validate(p).ok());
    // Every slot past count is padding now.
    for (std::size_t r = 0; r < t.count.size(); ++r) {
      for (std::int32_t k = t.count[r]; k < t.width; ++k) {
        CHECK(t.ids[r * static_cast<std::size_t>(t.width) + static_cast<std::size_t>(k)] == index::block_table::pad);
      }
    }
  }
}

TEST_CASE("canonicalize: block_csr compacts col_idx and rewrites row_ptr, random problems") {
  SKIM_RANDOM_CASE(rng);
  for (int trial = 0; trial < 60; ++trial) {
    const problem_case pc = random_problem(rng);
    const problem p = pc.get();
    INFO(describe(pc));
    const model m = random_model(p, rng);
    owned_csr c = make_csr(raw_rows(m, rng));
    const std::size_t old_nnz = c.col_idx.size();
    c.col_idx.push_back(4242);  // capacity past row_ptr[rows]: untouched
    std::int64_t nnz = -1;
    const status s = index::canonicalize(p, c.mut(), nnz);
    REQUIRE_MESSAGE(s.ok(), s.message());
    CHECK(nnz == model_nnz(m));
    CHECK(c.row_ptr.back() == nnz);
    CHECK(read_rows(p, c.view()) == as_rows(m));
    CHECK(c.view().validate(p).ok());
    for (std::size_t k = static_cast<std::size_t>(nnz); k < old_nnz; ++k) {
      CHECK(c.col_idx[k] == index::block_table::pad);
    }
    CHECK(c.col_idx.back() == 4242);
  }
}

TEST_CASE("canonicalize: a fixed example, both forms") {
  const problem p = fixed_case().get();
  owned_csr c = make_csr({{8, 0, 8}, {3}, {9, 1, 9, 3}, {}, {4, 4, 4}, {1}});
  std::int64_t nnz = 0;
  REQUIRE(index::canonicalize(p, c.mut(), nnz).ok());
  CHECK(nnz == 8);
  CHECK(c.row_ptr == std::vector<std::int32_t>{0, 2, 3, 6, 6, 7, 8});
  CHECK(c.col_idx == std::vector<std::int32_t>{0, 8, 3, 1, 3, 9, 4, 1, -1, -1, -1, -1});
  owned_table t = make_table({{8, 0, 8}, {3}, {9, 1, 9, 3}, {}, {4, 4, 4}, {1}});
  REQUIRE(index::canonicalize(p, t.mut()).ok());
  CHECK(t.count == std::vector<std::int32_t>{2, 1, 3, 0, 1, 1});
  CHECK(std::vector<std::int32_t>(t.ids.begin(), t.ids.begin() + 4) == std::vector<std::int32_t>{0, 8, -1, -1});
  CHECK(std::vector<std::int32_t>(t.ids.begin() + 16, t.ids.begin() + 20) == std::vector<std::int32_t>{4, -1, -1, -1});
}

TEST_CASE("canonicalize: invalid input is reported and left untouched") {
  const problem p = fixed_case().get();
  owned_csr c = make_csr({{8, 0}, {}, {1}, {}, {6, 2}, {}});
  const owned_csr before = c;
  std::int64_t nnz = -5;
  check_error(index::canonicalize(p, c.mut(), nnz), status_code::invalid_index,
              "block id 6 >= kv blocks 5 of sequence 1 in row 4 (position 0)");
  CHECK(nnz == -5);
  CHECK(c.col_idx == before.col_idx);
  CHECK(c.row_ptr == before.row_ptr);
  c.row_ptr[2] = 1;
  check_error(index::canonicalize(p, c.mut(), nnz), status_code::invalid_index,
              "row_ptr[2] = 1 < row_ptr[1] = 2 (must not decrease)");

  owned_table t = make_table({{3, 1}, {}, {1}, {}, {2, 2}, {}});
  t.count[3] = -1;
  check_error(index::canonicalize(p, t.mut()), status_code::invalid_index, "count -1 < 0 in row 3");
  t.count[3] = 3;
  check_error(index::canonicalize(p, t.mut()), status_code::invalid_index, "count 3 > width 2 in row 3");
  CHECK(t.ids[0] == 3);  // untouched
  t.count[3] = 0;
  REQUIRE(index::canonicalize(p, t.mut()).ok());
  CHECK(t.count == std::vector<std::int32_t>{2, 0, 1, 0, 1, 0});
}
