#include "skim/index/dense_block_mask.hpp"

#include <doctest/doctest.h>

#include <limits>

#include "index/index_testing.hpp"

using namespace skim;
using namespace skim_test;
using skim::index::order;

TEST_CASE("dense_block_mask: cursor yields the model's rows and validates, random problems") {
  SKIM_RANDOM_CASE(rng);
  for (int trial = 0; trial < 60; ++trial) {
    const problem_case pc = random_problem(rng);
    const problem p = pc.get();
    INFO(describe(pc));
    REQUIRE(validate(p).ok());
    const model m = random_model(p, rng);
    // Sometimes more columns than the problem needs (a mask allocated for a longer batch).
    const std::int32_t cols = p.max_kv_blocks() + (uniform(rng, 0, 1) ? uniform(rng, 0, 70) : 0);
    const owned_mask mk = make_mask(as_rows(m), cols);
    CHECK(read_rows(p, mk.view()) == as_rows(m));
    const status s = mk.view().validate(p);
    CHECK_MESSAGE(s.ok(), s.message());
    CHECK(index::validate(p, mk.view(), order::any).ok());
    CHECK(mk.view().words_per_row() == (cols + 63) / 64);
  }
}

TEST_CASE("dense_block_mask: cursor crosses words and reads bit 63") {
  problem_case pc;
  pc.mask = mask_kind::none;
  pc.block_kv = 1;
  pc.block_q = 1;
  pc.add_sequence(2, 150);
  const problem p = pc.get();
  std::vector<std::uint64_t> words(2 * 3, 0);
  words[0] = ~std::uint64_t{0};  // row 0: ids 0..63
  words[3 + 1] = std::uint64_t{1} << 63 | 1;  // row 1: ids 64 and 127
  words[3 + 2] = std::uint64_t{1} << 21;      // row 1: id 149
  const index::dense_block_mask mk = index::dense_block_mask::for_problem(p, words);
  CHECK(mk.cols == 150);
  std::vector<std::int32_t> all(64);
  for (int i = 0; i < 64; ++i) all[static_cast<std::size_t>(i)] = i;
  const auto rows = read_rows(p, mk);
  CHECK(rows[0] == all);
  CHECK(rows[1] == std::vector<std::int32_t>{64, 127, 149});
  CHECK(mk.validate(p).ok());
}

namespace {

void check_error(const status& s, status_code code, std::string_view message) {
  CHECK(s.code() == code);
  CHECK(msg(s) == message);
}

}  // namespace

TEST_CASE("dense_block_mask: invalid bits and sizes get exact messages") {
  const problem p = fixed_case().get();  // 6 rows, 10 columns: one word per row
  std::vector<std::uint64_t> words(6, 0);
  words[2] = 0b1111111111;  // row 2 sees all 10 blocks
  index::dense_block_mask mk = index::dense_block_mask::for_problem(p, words);
  REQUIRE(mk.validate(p).ok());
  words[4] = std::uint64_t{1} << 7;  // seq 1 has 5 kv blocks
  check_error(mk.validate(p), status_code::invalid_index, "block id 7 >= kv blocks 5 of sequence 1 in row 4");
  words[4] = 0;
  words[1] = std::uint64_t{1} << 9;  // row 1 sees 9
  check_error(mk.validate(p, order::any), status_code::invalid_index,
              "block id 9 >= visible blocks 9 in row 1: in the future under causality");
  words[1] = std::uint64_t{1} << 40;  // past the 10 columns, past the sequence too
  check_error(mk.validate(p), status_code::invalid_index, "block id 40 >= kv blocks 10 of sequence 0 in row 1");
  words[1] = 0;
  // Fewer columns than the sequence has blocks: a bit past cols (but visible) is padding.
  const index::dense_block_mask narrow{words, 3};
  check_error(narrow.validate(p), status_code::invalid_index, "bit 3 set beyond the 3 mask columns in row 2");
  const index::dense_block_mask short_words{std::span<const std::uint64_t>(words).first(5), 10};
  check_error(short_words.validate(p), status_code::shape_mismatch,
              "dense_block_mask words has 5 entries, needs rows 6 x words per row 1");
  const index::dense_block_mask wide{words, 65};
  check_error(wide.validate(p), status_code::shape_mismatch,
              "dense_block_mask words has 6 entries, needs rows 6 x words per row 2");
  const index::dense_block_mask negative{words, -1};
  check_error(negative.validate(p), status_code::invalid_argument, "dense_block_mask cols -1 < 0");
}

TEST_CASE("dense_block_mask: cursor stays inside its span") {
  const problem p = fixed_case().get();
  std::vector<std::uint64_t> words(6, ~std::uint64_t{0});
  // Two words per row claimed, 6 words present: rows 0..2 whole, rows 3..5 empty.
  const index::dense_block_mask wide{words, 100};
  const auto rows = read_rows(p, wide);
  CHECK(rows[2].size() == 128);
  CHECK(rows[3].empty());
  CHECK(rows[5].empty());
  // A span ending inside a row: the row is scanned up to the end of the span.
  const index::dense_block_mask cut{std::span<const std::uint64_t>(words).first(5), 100};
  CHECK(read_rows(p, cut)[2].size() == 64);
  row_info r;
  r.row = std::numeric_limits<std::int64_t>::max();
  CHECK(wide.cursor(r).done());
  r.row = -3;
  CHECK(wide.cursor(r).done());
  const index::dense_block_mask zero_cols{words, 0};
  r.row = 0;
  CHECK(zero_cols.cursor(r).done());
}
