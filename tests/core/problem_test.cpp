#include <doctest/doctest.h>

#include <array>
#include <string_view>

#include "skim/core/problem.hpp"

using namespace skim;

TEST_CASE("make_row_info: causal bottom-right geometry") {
  // 10 queries against 37 keys, bq 4, bk 8: offset 27; query i sees keys [0, i + 28).
  std::array<std::int32_t, 2> cq{0, 10}, ck{0, 37};
  problem p{.heads_q = 4, .heads_kv = 2, .head_dim = 8, .block_q = 4, .block_kv = 8, .cu_seqlens_q = cq,
            .cu_seqlens_kv = ck};
  REQUIRE(validate(p).ok());
  CHECK(p.q_blocks(0) == 3);
  CHECK(p.kv_blocks(0) == 5);
  const row_info r0 = make_row_info(p, 0, 0, 0, 1);
  CHECK(r0.row == 1);
  CHECK(r0.visible_keys(0, p.mask) == 28);
  CHECK(r0.visible_keys(3, p.mask) == 31);
  CHECK(r0.full_blocks == 3);     // 28 keys -> 3 complete blocks for every query
  CHECK(r0.visible_blocks == 4);  // last query sees 31 keys
  const row_info r2 = make_row_info(p, 0, 0, 2, 0);
  CHECK(r2.q_begin == 8);
  CHECK(r2.q_end == 10);
  CHECK(r2.visible_blocks == 5);
  CHECK(r2.full_blocks == 4);  // block 4 is the ragged tail (keys 32..36): partial
}

TEST_CASE("make_row_info: more queries than keys leaves early rows fully masked") {
  std::array<std::int32_t, 2> cq{0, 20}, ck{0, 5};
  problem p{.heads_q = 1, .heads_kv = 1, .head_dim = 4, .block_q = 4, .block_kv = 4, .cu_seqlens_q = cq,
            .cu_seqlens_kv = ck};
  const row_info r0 = make_row_info(p, 0, 0, 0, 0);
  CHECK(r0.visible_blocks == 0);
  CHECK(r0.full_blocks == 0);
  const row_info r4 = make_row_info(p, 0, 0, 4, 0);  // queries 16..19 see keys [0, q - 14)
  CHECK(r4.visible_blocks == 2);
  CHECK(r4.full_blocks == 0);
}

TEST_CASE("validate(problem) names the bad value") {
  std::array<std::int32_t, 2> cq{0, 4}, ck{0, 4};
  problem p{.heads_q = 6, .heads_kv = 4, .head_dim = 8, .cu_seqlens_q = cq, .cu_seqlens_kv = ck};
  const status s = validate(p);
  CHECK(s.code() == status_code::invalid_argument);
  CHECK(std::string_view(s.message()) == "heads_q 6 is not a multiple of heads_kv 4");
  std::array<std::int32_t, 3> bad{0, 5, 3};
  std::array<std::int32_t, 3> ck3{0, 1, 2};
  problem p2{.heads_q = 1, .heads_kv = 1, .head_dim = 8, .cu_seqlens_q = bad, .cu_seqlens_kv = ck3};
  CHECK(std::string_view(validate(p2).message()) == "cu_seqlens_q[2] = 3 < cu_seqlens_q[1] = 5 (must not decrease)");
}
