// Bad input gets a status naming the bad value, from check_args, the workspace check and the
// per-id checks of both executors.
#include "skim/core/attention_args.hpp"

#include <doctest/doctest.h>

#include <array>
#include <cstdio>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "skim/exec/cpu/reference.hpp"
#include "skim/exec/cpu/scalar.hpp"
#include "skim/index/causal_all.hpp"
#include "support/random_case.hpp"

using namespace skim;
using namespace skim::test;

namespace {

// A test-only index whose every row yields the same listed ids, and whose validate() lies (always
// ok): the executors' own per-id checks must catch what it yields.
struct listed_index {
  std::array<std::int32_t, 4> ids{};
  std::int32_t count = 0;

  struct cursor_type {
    const std::int32_t* at = nullptr;
    const std::int32_t* end = nullptr;
    [[nodiscard]] bool done() const noexcept { return at == end; }
    [[nodiscard]] std::int32_t id() const noexcept { return *at; }
    void next() noexcept { ++at; }
  };
  [[nodiscard]] cursor_type cursor(const row_info&) const noexcept { return {ids.data(), ids.data() + count}; }
  [[nodiscard]] status validate(const problem&) const noexcept { return status::success(); }
};
static_assert(block_index<listed_index>);

// 8 queries, 24 keys, bq = bk = 8, one head: the single row sees blocks 0, 1, 2.
struct small_case {
  std::array<std::int32_t, 2> cu_q{0, 8}, cu_kv{0, 24};
  std::vector<float> q, k, v, o;
  std::vector<float> lse;
  problem p{.heads_q = 1, .heads_kv = 1, .head_dim = 4, .block_q = 8, .block_kv = 8, .cu_seqlens_q = cu_q,
            .cu_seqlens_kv = cu_kv};

  small_case() : q(8 * 4), k(24 * 4), v(24 * 4), o(8 * 4), lse(8) {
    std::mt19937 rng(0x57a7u);
    fill_normal(rng, q);
    fill_normal(rng, k);
    fill_normal(rng, v);
  }
  small_case(const small_case&) = delete;

  template <class Index>
  [[nodiscard]] attention_args<float, contiguous_kv<float>, Index, float> args(Index index) {
    return {.prob = p, .q = strided_view<const float>::token_major(q.data(), 8, 1, 4),
            .kv = {.k = strided_view<const float>::token_major(k.data(), 24, 1, 4),
                   .v = strided_view<const float>::token_major(v.data(), 24, 1, 4)},
            .index = index, .o = strided_view<float>::token_major(o.data(), 8, 1, 4), .lse = lse};
  }
};

std::string format(const char* fmt, const void* a, const void* b, const void* c, const void* d) {
  char buf[status::max_message];
  std::snprintf(buf, sizeof buf, fmt, a, b, c, d);
  return buf;
}

}  // namespace

TEST_CASE_TEMPLATE("executors reject bad block ids with the id and the row", E, exec::reference, exec::scalar) {
  small_case c;
  const auto expect = [&](listed_index index, std::string_view message) {
    const status s = run_executor(E{}, c.args(index));
    CHECK(s.code() == status_code::invalid_index);
    CHECK(std::string_view(s.message()) == message);
  };
  expect({{0, 3}, 2}, "block id 3 >= visible blocks 3 in row 0");
  expect({{1, 0}, 2}, "block id 0 after 1 in row 0 (ids must ascend strictly)");
  expect({{0, 2, 2}, 3}, "block id 2 after 2 in row 0 (ids must ascend strictly)");
  expect({{-1, 0}, 2}, "block id -1 < 0 in row 0");
  expect({{0, 1000000}, 2}, "block id 1000000 >= visible blocks 3 in row 0");
  // The same index with valid ids runs.
  CHECK(run_executor(E{}, c.args(listed_index{{0, 2}, 2})).ok());
}

TEST_CASE("visible_blocks, not kv_blocks, bounds an id: a future block is rejected") {
  // 16 queries, 24 keys, bq 8: row 0's queries see at most 8 + 7 + 1 = 16 keys, 2 blocks of 3.
  small_case c;
  c.cu_q = {0, 16};
  c.q.resize(16 * 4);
  c.o.resize(16 * 4);
  c.lse.resize(16);
  auto a = c.args(listed_index{{2}, 1});
  a.q.tokens = 16;
  a.o.tokens = 16;
  const status s = run_executor(exec::scalar{}, a);
  CHECK(std::string_view(s.message()) == "block id 2 >= visible blocks 2 in row 0");
}

TEST_CASE_TEMPLATE("executors report bad arguments", E, exec::reference, exec::scalar) {
  small_case c;
  auto a = c.args(index::causal_all{});
  REQUIRE(run_executor(E{}, a).ok());

  SUBCASE("head counts") {
    a.prob.heads_kv = 3;
    const status s = run_executor(E{}, a);
    CHECK(s.code() == status_code::invalid_argument);
    CHECK(std::string_view(s.message()) == "heads_q 1 is not a multiple of heads_kv 3");
    a.prob.heads_kv = 0;
    CHECK(std::string_view(run_executor(E{}, a).message()) == "heads_kv 0 <= 0");
    CHECK(E{}.can_implement(a.prob).code() == status_code::invalid_argument);
  }
  SUBCASE("lse of the wrong size") {
    a.lse = std::span<float>(c.lse).first(5);
    const status s = run_executor(E{}, a);
    CHECK(s.code() == status_code::shape_mismatch);
    CHECK(std::string_view(s.message()) == "lse has 5 entries, expected tokens_q * heads_q = 8 (or 0 to skip it)");
    a.lse = {};  // no lse: fine
    CHECK(run_executor(E{}, a).ok());
  }
  SUBCASE("Q of the wrong shape") {
    a.q.head_dim = 3;
    CHECK(std::string_view(run_executor(E{}, a).message()) == "Q is [8, 1, 3], expected [8, 1, 4]");
  }
  SUBCASE("output overlapping Q") {
    a.o.data = c.q.data() + 4;  // O's rows 0..6 are Q's rows 1..7
    a.q = strided_view<const float>::token_major(c.q.data(), 8, 1, 4);
    const status s = run_executor(E{}, a);
    CHECK(s.code() == status_code::invalid_argument);
    const std::string expected = format("O [%p, %p) overlaps Q [%p, %p)", c.q.data() + 4, c.q.data() + 36,
                                        c.q.data(), c.q.data() + 32);
    CHECK(std::string_view(s.message()) == expected);
  }
  SUBCASE("output overlapping V, lse overlapping K, lse overlapping O") {
    a.o.data = c.v.data() + 64;  // the last 8 key rows of V
    CHECK(std::string_view(run_executor(E{}, a).message()).find("O [") == 0);
    CHECK(std::string_view(run_executor(E{}, a).message()).find("overlaps V") != std::string_view::npos);
    a.o.data = c.o.data();
    a.lse = std::span<float>(c.k.data() + 10, 8);
    CHECK(std::string_view(run_executor(E{}, a).message()).find("overlaps K") != std::string_view::npos);
    a.lse = std::span<float>(c.o.data() + 24, 8);
    CHECK(std::string_view(run_executor(E{}, a).message()).find("overlaps O") != std::string_view::npos);
    a.lse = std::span<float>(c.o.data() + 32, 0);  // empty: overlaps nothing
    CHECK(run_executor(E{}, a).ok());
  }
}

TEST_CASE("check_args: output overlapping paged K pages is rejected") {
  std::mt19937 rng(0x9a6eu);
  case_spec spec;
  spec.heads_q = 2;
  spec.head_dim = 8;
  spec.seqs = {{4, 20}};
  spec.page_size = 8;
  random_case<float, float> c(spec, rng);
  attention_args<float, paged_kv<float>, index::causal_all, float> a{
      .prob = c.prob(), .q = c.q_view(), .kv = c.paged(), .index = {},
      .o = strided_view<float>::token_major(const_cast<float*>(c.k_pages.data()) + 8, 4, 2, 8),
      .lse = {}};
  const status s = check_args(a);
  CHECK(s.code() == status_code::invalid_argument);
  CHECK(std::string_view(s.message()).find("overlaps K") != std::string_view::npos);
}

TEST_CASE("scalar: workspace too small or misaligned") {
  small_case c;
  const auto a = c.args(index::causal_all{});
  const exec::scalar e;
  const std::size_t need = e.workspace_bytes(a.prob);
  REQUIRE(need > 0);
  aligned_workspace ws(need + 64);

  const status small = e.run(a, ws.bytes.first(need - 1));
  CHECK(small.code() == status_code::workspace_too_small);
  CHECK(std::string_view(small.message()) ==
        "workspace has " + std::to_string(need - 1) + " bytes, needs " + std::to_string(need));
  CHECK(e.run(a, {}).code() == status_code::workspace_too_small);

  const status misaligned = e.run(a, ws.bytes.subspan(4, need));
  CHECK(misaligned.code() == status_code::misaligned);
  CHECK(std::string_view(misaligned.message()) ==
        format("workspace %p is not aligned to 64 bytes", ws.bytes.data() + 4, nullptr, nullptr, nullptr));

  CHECK(e.run(a, ws.bytes.first(need)).ok());
}

TEST_CASE("scalar: workspace_bytes follows the shape and never fails") {
  const exec::scalar e;
  problem p{.heads_q = 8, .heads_kv = 2, .head_dim = 128, .block_q = 64, .block_kv = 64};
  const std::size_t grouped = e.workspace_bytes(p);
  p.scope = index_scope::query_head;
  const std::size_t per_head = e.workspace_bytes(p);
  CHECK(grouped > per_head);  // a group unit holds 4 heads' rows
  p.block_kv = 128;
  CHECK(e.workspace_bytes(p) > per_head);
  p.heads_kv = 0;
  CHECK(e.workspace_bytes(p) == 0);
  p.heads_kv = 3;
  CHECK(e.workspace_bytes(p) == 0);
}
