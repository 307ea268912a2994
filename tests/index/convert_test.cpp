#include "skim/index/convert.hpp"

#include <doctest/doctest.h>


#include "index/index_testing.hpp"
#include "skim/index/block_union.hpp"
#include "skim/index/causal_all.hpp"
#include "skim/index/sliding_window.hpp"

using namespace skim;
using namespace skim_test;

namespace {

// A stored form produced by a conversion, owning its buffers.
struct converted {
  owned_table table;
  owned_csr csr;
  owned_mask mask;
};

enum class form { table, csr, mask };
constexpr form forms[] = {form::table, form::csr, form::mask};
const char* name(form f) { return f == form::table ? "block_table" : f == form::csr ? "block_csr" : "dense_mask"; }

// Converts idx into form f through the generic functions, sizes queried first.
template <block_index I>
converted convert_to(const problem& p, const I& idx, form f) {
  converted out;
  if (f == form::table) {
    out.table.width = index::max_row_count(p, idx);
    out.table.ids.assign(static_cast<std::size_t>(p.index_rows() * out.table.width), 12345);
    out.table.count.assign(static_cast<std::size_t>(p.index_rows()), 12345);
    const status s = index::to_block_table(p, idx, out.table.width, out.table.ids, out.table.count);
    REQUIRE_MESSAGE(s.ok(), s.message());
  } else if (f == form::csr) {
    out.csr.row_ptr.assign(static_cast<std::size_t>(p.index_rows()) + 1, 12345);
    out.csr.col_idx.assign(static_cast<std::size_t>(index::count_nnz(p, idx)), 12345);
    const status s = index::to_csr(p, idx, out.csr.row_ptr, out.csr.col_idx);
    REQUIRE_MESSAGE(s.ok(), s.message());
  } else {
    out.mask.words.assign(static_cast<std::size_t>(index::dense_mask_words(p)), ~std::uint64_t{0});
    out.mask.cols = p.max_kv_blocks();
    const status s = index::to_dense_mask(p, idx, out.mask.words);
    REQUIRE_MESSAGE(s.ok(), s.message());
  }
  return out;
}

std::vector<std::vector<std::int32_t>> rows_of(const problem& p, const converted& c, form f) {
  if (f == form::table) return read_rows(p, c.table.view());
  if (f == form::csr) return read_rows(p, c.csr.view());
  return read_rows(p, c.mask.view());
}

status validate_form(const problem& p, const converted& c, form f) {
  if (f == form::table) return c.table.view().validate(p);
  if (f == form::csr) return c.csr.view().validate(p);
  return c.mask.view().validate(p);
}

void check_error(const status& s, status_code code, std::string_view message) {
  CHECK(s.code() == code);
  CHECK(msg(s) == message);
}

}  // namespace

TEST_CASE("convert: every pair of stored forms round-trips to the same set, random problems") {
  SKIM_RANDOM_CASE(rng);
  for (int trial = 0; trial < 40; ++trial) {
    const problem_case pc = random_problem(rng);
    const problem p = pc.get();
    INFO(describe(pc));
    const model m = random_model(p, rng);
    const auto expected = as_rows(m);
    const owned_table t = make_table(expected, uniform(rng, 0, 2));
    const owned_csr c = make_csr(expected);
    const owned_mask mk = make_mask(expected, p.max_kv_blocks());
    CHECK(index::count_nnz(p, t.view()) == model_nnz(m));
    CHECK(index::max_row_count(p, c.view()) == model_width(m));
    for (const form from : forms) {
      for (const form to : forms) {
        INFO(name(from), " -> ", name(to));
        converted there;
        if (from == form::table) there = convert_to(p, t.view(), to);
        if (from == form::csr) there = convert_to(p, c.view(), to);
        if (from == form::mask) there = convert_to(p, mk.view(), to);
        CHECK(rows_of(p, there, to) == expected);
        CHECK(validate_form(p, there, to).ok());  // canonical in, canonical out
        // ... and back.
        converted back;
        if (to == form::table) back = convert_to(p, there.table.view(), from);
        if (to == form::csr) back = convert_to(p, there.csr.view(), from);
        if (to == form::mask) back = convert_to(p, there.mask.view(), from);
        CHECK(rows_of(p, back, from) == expected);
      }
    }
  }
}

TEST_CASE("convert: unions and implicit rules materialise to their sets") {
  SKIM_RANDOM_CASE(rng);
  for (int trial = 0; trial < 40; ++trial) {
    const problem_case pc = random_problem(rng);
    const problem p = pc.get();
    INFO(describe(pc));
    const model m = random_model(p, rng);
    const owned_csr c = make_csr(as_rows(m));
    const index::sliding_window win{uniform(rng, 0, 4)};
    model expected = m;
    REQUIRE(for_each_row(p, [&](const row_info& r) {
              for (std::int32_t j = std::max(0, r.visible_blocks - win.blocks); j < r.visible_blocks; ++j) {
                expected[static_cast<std::size_t>(r.row)].insert(j);
              }
            }).ok());
    const auto u = index::make_union(c.view(), win);
    CHECK(index::count_nnz(p, u) == model_nnz(expected));
    for (const form to : forms) {
      INFO(name(to));
      const converted out = convert_to(p, u, to);
      CHECK(rows_of(p, out, to) == as_rows(expected));
      CHECK(validate_form(p, out, to).ok());
    }
    // causal_all: every visible block.
    const converted all = convert_to(p, index::causal_all{}, form::csr);
    REQUIRE(for_each_row(p, [&](const row_info& r) {
              const auto row = static_cast<std::size_t>(r.row);
              CHECK(all.csr.row_ptr[row + 1] - all.csr.row_ptr[row] == r.visible_blocks);
            }).ok());
  }
}

TEST_CASE("convert: block table output is padded, raw input stays raw") {
  const problem p = fixed_case().get();
  const owned_csr raw = make_csr({{8, 0, 8}, {}, {9}, {2, 1}, {0}, {4, 3, 2, 1}});
  std::vector<std::int32_t> ids(6 * 5, 77), count(6, 77);
  REQUIRE(index::to_block_table(p, raw.view(), 5, ids, count).ok());
  CHECK(count == std::vector<std::int32_t>{3, 0, 1, 2, 1, 4});
  CHECK(std::vector<std::int32_t>(ids.begin(), ids.begin() + 10) ==
        std::vector<std::int32_t>{8, 0, 8, -1, -1, -1, -1, -1, -1, -1});
  CHECK(ids[29] == index::block_table::pad);
  const index::block_table t{ids, count, 5};
  CHECK(t.validate(p, index::order::any).ok());
  CHECK(msg(t.validate(p)) == "unsorted block ids in row 0: 0 at position 1 after 8");
}

TEST_CASE("convert: bad sizes and ids get exact messages") {
  const problem p = fixed_case().get();
  const std::vector<std::vector<std::int32_t>> rows{{0, 8}, {}, {1, 3, 9}, {2}, {0, 4}, {1, 2, 3, 4}};
  const owned_csr c = make_csr(rows);
  std::vector<std::int32_t> ids(6 * 3), count(6), row_ptr(7), col_idx(12);
  check_error(index::to_block_table(p, c.view(), 3, ids, count), status_code::invalid_argument,
              "to_block_table row 5 has 4 blocks > width 3");
  check_error(index::to_block_table(p, c.view(), -1, ids, count), status_code::invalid_argument,
              "to_block_table width -1 < 0");
  check_error(index::to_block_table(p, c.view(), 4, ids, count), status_code::shape_mismatch,
              "to_block_table ids_out has 18 entries, needs rows 6 x width 4");
  check_error(index::to_block_table(p, c.view(), 3, ids, std::span<std::int32_t>(count).first(2)),
              status_code::shape_mismatch, "to_block_table count_out has 2 entries, problem has 6 rows");
  check_error(index::to_csr(p, c.view(), std::span<std::int32_t>(row_ptr).first(6), col_idx),
              status_code::shape_mismatch, "to_csr row_ptr_out has 6 entries, needs rows 6 + 1");
  check_error(index::to_csr(p, c.view(), row_ptr, std::span<std::int32_t>(col_idx).first(11)),
              status_code::shape_mismatch, "to_csr col_idx_out has 11 entries, too few for row 5");
  REQUIRE(index::to_csr(p, c.view(), row_ptr, col_idx).ok());
  CHECK(row_ptr == c.row_ptr);
  CHECK(col_idx == c.col_idx);
  std::vector<std::uint64_t> words(7);
  check_error(index::to_dense_mask(p, c.view(), words), status_code::shape_mismatch,
              "to_dense_mask words_out has 7 entries, needs rows 6 x words per row 1");

  // Ids a conversion cannot store (an unvalidated input) cost a status, never a write outside.
  const owned_csr bad = make_csr({{0, 8}, {}, {1, 3, 9}, {2}, {0, 4}, {1, 2, 300}});
  words.resize(6);
  check_error(index::to_dense_mask(p, bad.view(), words), status_code::invalid_index,
              "block id 300 >= kv blocks 5 of sequence 1 in row 5 (position 2)");
  const owned_csr future = make_csr({{0, 9}, {}, {}, {}, {}, {}});
  check_error(index::to_csr(p, future.view(), row_ptr, col_idx), status_code::invalid_index,
              "block id 9 >= visible blocks 9 in row 0 (position 1): in the future under causality");
  const owned_csr negative = make_csr({{}, {}, {}, {-3}, {}, {}});
  check_error(index::to_block_table(p, negative.view(), 3, ids, count), status_code::invalid_index,
              "block id -3 < 0 in row 3 (position 0)");
}
