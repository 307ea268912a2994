#include "skim/index/order.hpp"

#include <doctest/doctest.h>

#include "index/index_testing.hpp"

using namespace skim;
using namespace skim_test;

TEST_CASE("order: the shared id checks, with and without a position") {
  const problem p = fixed_case().get();
  const row_info r = make_row_info(p, 0, 0, 0, 1);  // row 1: seq 0, 10 kv blocks, 9 visible
  REQUIRE(r.row == 1);
  CHECK(index::detail::check_id_range(r, 8, 3).ok());
  CHECK(msg(index::detail::check_id_range(r, 9, -1)) ==
        "block id 9 >= visible blocks 9 in row 1: in the future under causality");
  CHECK(msg(index::detail::check_id_range(r, 10, -1)) == "block id 10 >= kv blocks 10 of sequence 0 in row 1");
  CHECK(msg(index::detail::check_id_range(r, -1, -1)) == "block id -1 < 0 in row 1");
  CHECK(index::detail::check_id_range(r, -1, 0).code() == status_code::invalid_index);
  const std::int32_t ids[] = {2, 5, 5};
  CHECK(index::detail::check_row_ids(r, ids, ids + 2, index::order::canonical).ok());
  CHECK(msg(index::detail::check_row_ids(r, ids, ids + 3, index::order::canonical)) ==
        "duplicate block id 5 in row 1 (positions 1 and 2)");
  CHECK(index::detail::check_row_ids(r, ids, ids + 3, index::order::any).ok());
}

TEST_CASE("order: mask_kind none makes every block of the sequence visible") {
  problem_case pc = fixed_case();  // a copy: owns its own cu_seqlens
  pc.mask = mask_kind::none;
  const problem p = pc.get();
  const row_info r = make_row_info(p, 0, 0, 0, 0);
  CHECK(index::detail::check_id_range(r, 9, 0).ok());
  CHECK(msg(index::detail::check_id_range(r, 10, 0)) ==
        "block id 10 >= kv blocks 10 of sequence 0 in row 0 (position 0)");
  // The same table is canonical without causality and in the future with it.
  const owned_table t = make_table({{9}, {}, {}, {}, {}, {}});
  CHECK(index::validate(p, t.view(), index::order::canonical).ok());
  CHECK(msg(index::validate(fixed_case().get(), t.view(), index::order::any)) ==
        "block id 9 >= visible blocks 9 in row 0 (position 0): in the future under causality");
}
