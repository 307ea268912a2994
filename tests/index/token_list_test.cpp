#include "skim/index/token_list.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "index/index_testing.hpp"

using namespace skim;
using namespace skim_test;

namespace {

// Keys the last query of query block i of sequence b sees, from the problem's lengths alone.
std::int32_t visible_keys_of_block(const problem_case& c, std::int32_t b, std::int32_t i) {
  const std::int32_t n_q = c.cq[b + 1] - c.cq[b];
  const std::int32_t n_kv = c.ck[b + 1] - c.ck[b];
  if (c.mask == mask_kind::none) return n_kv;
  const std::int32_t last = std::min((i + 1) * c.block_q, n_q) - 1;
  return std::clamp(last + n_kv - n_q + 1, 0, n_kv);
}

struct owned_list {
  std::vector<std::int32_t> positions, count;
  std::int32_t width = 0;
  [[nodiscard]] index::token_list view() const { return {positions, count, width}; }
  [[nodiscard]] index::mutable_token_list mut() { return {positions, count, width}; }
};

owned_list make_list(const std::vector<std::vector<std::int32_t>>& rows, std::int32_t extra_width = 0) {
  owned_list t;
  std::size_t w = 0;
  for (const auto& r : rows) w = std::max(w, r.size());
  t.width = static_cast<std::int32_t>(w) + extra_width;
  t.positions.assign(rows.size() * static_cast<std::size_t>(t.width), -7);  // padding must not matter
  for (std::size_t r = 0; r < rows.size(); ++r) {
    std::copy(rows[r].begin(), rows[r].end(), t.positions.begin() + static_cast<std::ptrdiff_t>(r * t.width));
    t.count.push_back(static_cast<std::int32_t>(rows[r].size()));
  }
  return t;
}

// Rows of random sorted positions in [0, visible keys), enumerated without row_info, with the
// visible keys of each row.
struct random_rows {
  std::vector<std::vector<std::int32_t>> rows;
  std::vector<std::int32_t> visible;
};
random_rows make_random_rows(const problem_case& c, std::mt19937& rng) {
  random_rows out;
  const std::int32_t heads = c.scope == index_scope::kv_head ? c.heads_kv : c.heads_q;
  const double densities[] = {0.0, 0.05, 0.4, 1.0};
  const double density = densities[uniform(rng, 0, 3)];
  std::bernoulli_distribution keep(density);
  for (std::size_t b = 0; b + 1 < c.cq.size(); ++b) {
    const std::int32_t n_q = c.cq[b + 1] - c.cq[b];
    const std::int32_t blocks = (n_q + c.block_q - 1) / c.block_q;
    for (std::int32_t i = 0; i < blocks; ++i) {
      const std::int32_t v = visible_keys_of_block(c, static_cast<std::int32_t>(b), i);
      for (std::int32_t h = 0; h < heads; ++h) {
        std::vector<std::int32_t> row;
        for (std::int32_t j = 0; j < v; ++j) {
          if (keep(rng)) row.push_back(j);
        }
        out.rows.push_back(row);
        out.visible.push_back(v);
      }
    }
  }
  return out;
}

std::vector<std::vector<std::int32_t>> read_list(const problem& p, const index::token_list& l) {
  std::vector<std::vector<std::int32_t>> rows(static_cast<std::size_t>(p.index_rows()));
  REQUIRE(for_each_row(p, [&](const row_info& r) {
            const auto s = l.row(r);
            rows[static_cast<std::size_t>(r.row)].assign(s.begin(), s.end());
          }).ok());
  return rows;
}

void check_error(const status& s, status_code code, std::string_view message) {
  CHECK(s.code() == code);
  CHECK(std::string_view(s.message()) == message);
}

}  // namespace

TEST_CASE("token_list: random valid lists validate and read back; every bad entry is refused") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed ", seed);
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 80; ++trial) {
    const problem_case pc = random_problem(rng);
    const problem p = pc.get();
    INFO(describe(pc));
    REQUIRE(validate(p).ok());
    const random_rows rr = make_random_rows(pc, rng);
    REQUIRE(rr.rows.size() == static_cast<std::size_t>(p.index_rows()));
    owned_list l = make_list(rr.rows, uniform(rng, 0, 2));
    const status ok = l.view().validate(p);
    CHECK_MESSAGE(ok.ok(), ok.message());
    CHECK(read_list(p, l.view()) == rr.rows);
    // The row's last visible key is accepted, the next one is not (the bound is exact).
    for (std::size_t r = 0; r < rr.rows.size(); ++r) {
      const std::int32_t v = rr.visible[r];
      if (v == 0 || l.width == 0) continue;
      owned_list edge = l;
      const std::size_t at = r * static_cast<std::size_t>(edge.width);
      edge.count[r] = 1;
      edge.positions[at] = v - 1;
      CHECK(edge.view().validate(p).ok());
      edge.positions[at] = v;
      CHECK(edge.view().validate(p).code() == status_code::invalid_index);
      edge.positions[at] = -1;
      CHECK(edge.view().validate(p).code() == status_code::invalid_index);
      break;
    }
    // A duplicate or a swap in a row of two or more is refused.
    for (std::size_t r = 0; r < rr.rows.size(); ++r) {
      if (rr.rows[r].size() < 2) continue;
      owned_list bad = l;
      const std::size_t at = r * static_cast<std::size_t>(bad.width);
      std::swap(bad.positions[at], bad.positions[at + 1]);
      CHECK(bad.view().validate(p).code() == status_code::invalid_index);
      bad.positions[at] = bad.positions[at + 1];
      CHECK(bad.view().validate(p).code() == status_code::invalid_index);
      break;
    }
  }
}

namespace {

// fixed_case(): bq = bk = 4, heads 2/2; rows 0, 1 see 36 keys, rows 2, 3 see 40 (seq 0: 8 queries,
// 40 keys), rows 4, 5 see 20 (seq 1: 4 queries, 20 keys).
std::vector<std::vector<std::int32_t>> fixed_rows() { return {{0, 35}, {}, {1, 3, 39}, {2}, {0, 19}, {1, 2, 3, 4}}; }

status validate_with(const std::vector<std::vector<std::int32_t>>& rows) {
  return make_list(rows).view().validate(fixed_case().get());
}

}  // namespace

TEST_CASE("token_list: bad positions get exact messages") {
  REQUIRE(validate_with(fixed_rows()).ok());
  auto rows = fixed_rows();
  rows[4] = {0, 20};
  check_error(validate_with(rows), status_code::invalid_index,
              "token position 20 >= keys 20 of sequence 1 in row 4 (position 1)");
  rows = fixed_rows();
  rows[0] = {36};
  check_error(validate_with(rows), status_code::invalid_index,
              "token position 36 >= visible keys 36 in row 0 (position 0): in the future under causality");
  rows = fixed_rows();
  rows[3] = {0, 1, -2};
  check_error(validate_with(rows), status_code::invalid_index, "token position -2 < 0 in row 3 (position 2)");
  rows = fixed_rows();
  rows[2] = {1, 3, 3};
  check_error(validate_with(rows), status_code::invalid_index,
              "duplicate token position 3 in row 2 (positions 1 and 2)");
  rows[2] = {4, 2};
  check_error(validate_with(rows), status_code::invalid_index,
              "unsorted token positions in row 2: 2 at position 1 after 4");
  // Without causality every key of the sequence is visible.
  problem_case none = fixed_case();
  none.mask = mask_kind::none;
  rows = fixed_rows();
  rows[0] = {36, 39};
  CHECK(make_list(rows).view().validate(none.get()).ok());
}

TEST_CASE("token_list: bad counts and sizes get exact messages") {
  const problem p = fixed_case().get();
  owned_list t = make_list(fixed_rows());
  REQUIRE(t.width == 4);
  t.count[5] = -1;
  check_error(t.view().validate(p), status_code::invalid_index, "count -1 < 0 in row 5");
  t.count[5] = 0;
  t.count[1] = 5;
  check_error(t.view().validate(p), status_code::invalid_index, "count 5 > width 4 in row 1");
  t.count[1] = 0;
  REQUIRE(t.view().validate(p).ok());
  const index::token_list short_count{t.positions, std::span<const std::int32_t>(t.count).first(5), 4};
  check_error(short_count.validate(p), status_code::shape_mismatch,
              "token_list count has 5 entries, problem has 6 rows");
  const index::token_list short_positions{std::span<const std::int32_t>(t.positions).first(23), t.count, 4};
  check_error(short_positions.validate(p), status_code::shape_mismatch,
              "token_list positions has 23 entries, needs rows 6 x width 4");
  const index::token_list negative_width{t.positions, t.count, -1};
  check_error(negative_width.validate(p), status_code::invalid_argument, "token_list width -1 < 0");
  problem bad = p;
  bad.head_dim = 0;
  check_error(t.view().validate(bad), status_code::invalid_argument, "head_dim 0 <= 0");
}

TEST_CASE("token_list: row() stays inside its spans for garbage counts and rows") {
  const problem p = fixed_case().get();
  owned_list t = make_list(fixed_rows());
  t.count = {-5, std::numeric_limits<std::int32_t>::max(), 3, 4, 2, 9};
  const auto rows = read_list(p, t.view());
  CHECK(rows[0].empty());
  CHECK(rows[1] == std::vector<std::int32_t>(t.positions.begin() + 4, t.positions.begin() + 8));
  CHECK(rows[5] == std::vector<std::int32_t>(t.positions.begin() + 20, t.positions.begin() + 24));
  const index::token_list cut{std::span<const std::int32_t>(t.positions).first(22), t.count, 4};
  CHECK(read_list(p, cut)[5] == std::vector<std::int32_t>(t.positions.begin() + 20, t.positions.begin() + 22));
  const index::token_list none{std::span<const std::int32_t>(t.positions).first(8), t.count, 4};
  CHECK(read_list(p, none)[4].empty());
  row_info beyond;
  beyond.row = 6;
  CHECK(t.view().row(beyond).empty());
  beyond.row = -1;
  CHECK(t.view().row(beyond).empty());
}

TEST_CASE("token_list: a mutable list converts to the read-only view of the same memory") {
  const problem p = fixed_case().get();
  owned_list t = make_list(fixed_rows());
  const index::mutable_token_list m = t.mut();
  const index::token_list view = m;
  CHECK(view.positions.data() == t.positions.data());
  t.positions[0] = 3;
  CHECK(read_list(p, view)[0] == std::vector<std::int32_t>{3, 35});
  CHECK(index::row_visible_keys(make_row_info(p, 0, 0, 0, 0), p.mask) == 36);
  CHECK(index::row_visible_keys(make_row_info(p, 0, 0, 1, 1), p.mask) == 40);
  CHECK(index::row_visible_keys(make_row_info(p, 2, 1, 0, 0), p.mask) == 20);
}
