// Bad API use gets a status with an exact message, on every executor (extends
// tests/exec/cpu/status_test.cpp, which covers block ids, head-count basics, LSE size, Q shape, output
// overlapping Q/V/K, and the scalar workspace): zero-sized and misaligned workspaces on simd,
// misaligned Q/K/V/O, views whose heads disagree with the problem, negative strides, an O whose
// rows overlap each other, paged strides that overlap rows, and too-small selector / conversion
// outputs.
#include <doctest/doctest.h>

#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "skim/core/attention_args.hpp"
#include "skim/exec/cpu/reference.hpp"
#include "skim/exec/cpu/scalar.hpp"
#include "skim/exec/cpu/simd.hpp"
#include "skim/index/block_table.hpp"
#include "skim/index/causal_all.hpp"
#include "skim/index/convert.hpp"
#include "skim/select/select_all.hpp"
#include "skim/select/top_k.hpp"
#include "support/random_case.hpp"

using namespace skim;
using namespace skim::test;

namespace {

using simd_default = exec::simd<xsimd::default_arch>;

std::string printed(const char* fmt, ...) {
  char buf[status::max_message];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  return buf;
}

// 8 queries, 24 keys, 4 query heads on 2 kv heads, head_dim 4, blocks of 8.
struct api_case {
  std::vector<std::int32_t> cu_q{0, 8}, cu_kv{0, 24};
  std::vector<float> q = std::vector<float>(8 * 4 * 4 + 1), k = std::vector<float>(24 * 2 * 4 + 1),
                     v = std::vector<float>(24 * 2 * 4 + 1), o = std::vector<float>(8 * 4 * 4 + 1),
                     lse = std::vector<float>(8 * 4);
  problem p{.heads_q = 4, .heads_kv = 2, .head_dim = 4, .block_q = 8, .block_kv = 8, .cu_seqlens_q = cu_q,
            .cu_seqlens_kv = cu_kv};
  api_case() {
    std::mt19937 rng(0xa91u);
    fill_normal(rng, q);
    fill_normal(rng, k);
    fill_normal(rng, v);
  }
  api_case(const api_case&) = delete;
  [[nodiscard]] attention_args<float, contiguous_kv<float>, index::causal_all, float> args() {
    return {.prob = p, .q = strided_view<const float>::token_major(q.data(), 8, 4, 4),
            .kv = {.k = strided_view<const float>::token_major(k.data(), 24, 2, 4),
                   .v = strided_view<const float>::token_major(v.data(), 24, 2, 4)},
            .index = {}, .o = strided_view<float>::token_major(o.data(), 8, 4, 4), .lse = lse};
  }
};

template <class E>
std::string message_of(const E& e, const attention_args<float, contiguous_kv<float>, index::causal_all, float>& a) {
  return run_executor(e, a).message();
}

}  // namespace

TEST_CASE_TEMPLATE("bad API use: views and strides", E, exec::reference, exec::scalar, simd_default) {
  api_case c;
  auto a = c.args();
  REQUIRE(run_executor(E{}, a).ok());

  SUBCASE("heads_q not a multiple of heads_kv, and views that disagree with the problem's heads") {
    a.prob.heads_kv = 3;
    CHECK(message_of(E{}, a) == "heads_q 4 is not a multiple of heads_kv 3");
    CHECK(E{}.can_implement(a.prob).code() == status_code::invalid_argument);
    a.prob.heads_kv = 4;  // valid problem, but K and V hold 2 kv heads
    CHECK(message_of(E{}, a) == "K is [24, 2, 4], expected [24, 4, 4]");
    a.prob.heads_kv = 2;
    a.o.heads = 2;
    CHECK(message_of(E{}, a) == "O is [8, 2, 4], expected [8, 4, 4]");
  }
  SUBCASE("misaligned Q, K, V, O") {
    const auto off = [](auto* p) { return reinterpret_cast<decltype(p)>(reinterpret_cast<std::byte*>(p) + 1); };
    auto b = a;
    b.q.data = off(c.q.data());
    CHECK(message_of(E{}, b) == printed("Q data %p is not aligned to 4 bytes", static_cast<const void*>(b.q.data)));
    b = a;
    b.kv.k.data = off(c.k.data());
    CHECK(message_of(E{}, b) == printed("K data %p is not aligned to 4 bytes", static_cast<const void*>(b.kv.k.data)));
    b = a;
    b.kv.v.data = off(c.v.data());
    CHECK(message_of(E{}, b) == printed("V data %p is not aligned to 4 bytes", static_cast<const void*>(b.kv.v.data)));
    b = a;
    b.o.data = off(c.o.data());
    CHECK(message_of(E{}, b) == printed("O data %p is not aligned to 4 bytes", static_cast<const void*>(b.o.data)));
  }
  SUBCASE("null data and negative strides") {
    a.kv.v.data = nullptr;
    CHECK(message_of(E{}, a) == "V data is null");
    a = c.args();
    a.q.token_stride = -16;
    CHECK(message_of(E{}, a) == "Q has negative strides (token -16, head 4)");
  }
  SUBCASE("O overlapping K, and O whose own rows overlap") {
    a.o.data = c.k.data() + 8;
    CHECK(message_of(E{}, a) == printed("O [%p, %p) overlaps K [%p, %p)", static_cast<void*>(c.k.data() + 8),
                                        static_cast<void*>(c.k.data() + 8 + 128), static_cast<void*>(c.k.data()),
                                        static_cast<void*>(c.k.data() + 192)));
    a = c.args();
    a.o.token_stride = 0;  // every token writes the same 4 rows
    CHECK(message_of(E{}, a) == "O strides (token 0, head 4) make rows of head_dim 4 overlap");
    a = c.args();
    a.o.head_stride = 2;  // heads half on top of each other
    CHECK(message_of(E{}, a) == "O strides (token 16, head 2) make rows of head_dim 4 overlap");
    a = c.args();
    a.o = strided_view<float>::head_major(c.o.data(), 8, 4, 4);  // other layouts are fine
    CHECK(run_executor(E{}, a).ok());
    a.o.token_stride = 5;  // padded rows: fine too
    a.o.head_stride = 40;
    std::vector<float> big(4 * 40);
    a.o.data = big.data();
    CHECK(run_executor(E{}, a).ok());
  }
}

TEST_CASE_TEMPLATE("bad API use: workspace", E, exec::scalar, simd_default) {
  api_case c;
  const auto a = c.args();
  const E e;
  const std::size_t need = e.workspace_bytes(a.prob);
  REQUIRE(need > 0);
  const status zero = e.run(a, {});
  CHECK(zero.code() == status_code::workspace_too_small);
  CHECK(std::string_view(zero.message()) == "workspace has 0 bytes, needs " + std::to_string(need));
  aligned_workspace ws(need + 64);
  const status misaligned = e.run(a, ws.bytes.subspan(8, need));
  CHECK(misaligned.code() == status_code::misaligned);
  CHECK(std::string_view(misaligned.message()) ==
        printed("workspace %p is not aligned to 64 bytes", static_cast<void*>(ws.bytes.data() + 8)));
  CHECK(e.run(a, ws.bytes.first(need)).ok());
}

TEST_CASE("bad API use: reference needs no workspace, so an empty one is fine") {
  api_case c;
  CHECK(exec::reference{}.workspace_bytes(c.p) == 0);
  CHECK(exec::reference{}.run(c.args(), {}).ok());
}

TEST_CASE("bad API use: paged strides that overlap rows") {
  std::mt19937 rng(0x9a6eu);
  case_spec spec;
  spec.heads_q = 2;
  spec.heads_kv = 2;
  spec.head_dim = 8;
  spec.seqs = {{4, 20}};
  spec.page_size = 8;
  random_case<float, float> c(spec, rng);
  output<float> out(spec, c.tokens_q());
  auto kv = c.paged();
  kv.head_stride = 4;  // two heads' rows overlap
  const attention_args<float, paged_kv<float>, index::causal_all, float> a{
      .prob = c.prob(), .q = c.q_view(), .kv = kv, .index = {}, .o = out.view, .lse = out.lse};
  const status s = run_executor(exec::scalar{}, a);
  CHECK(s.code() == status_code::invalid_argument);
  CHECK(std::string_view(s.message()) ==
        "paged K/V strides (page 128, token 16, head 4) overlap rows of head_dim 8, heads_kv 2, page_size 8");
}

TEST_CASE("bad API use: too-small outputs of selectors and conversions") {
  const std::vector<std::int32_t> cu_q{0, 32}, cu_kv{0, 32};
  const problem p{.heads_q = 1, .heads_kv = 1, .head_dim = 4, .block_q = 8, .block_kv = 8, .cu_seqlens_q = cu_q,
                  .cu_seqlens_kv = cu_kv};
  const select::top_k sel{.k = 3};
  std::vector<float> scores(static_cast<std::size_t>(p.index_rows()) * 4, 1.0f);
  workspace_buffer ws(select::workspace_bytes(sel, p));
  // A table narrower than max_count.
  std::vector<std::int32_t> ids(p.index_rows() * 2), count(p.index_rows());
  const status narrow = select::select_all(sel, p, {.scores = scores, .score_stride = 4},
                                           index::mutable_block_table{ids, count, 2}, ws.span());
  CHECK(narrow.code() == status_code::shape_mismatch);
  CHECK(std::string_view(narrow.message()) == "row 2 selects 3 blocks > block_table width 2 (size it with max_count)");
  // Scores shorter than rows x stride.
  std::vector<std::int32_t> ids3(p.index_rows() * 3);
  const status short_scores = select::select_all(sel, p, {.scores = std::span<const float>(scores).first(15),
                                                          .score_stride = 4},
                                                 index::mutable_block_table{ids3, count, 3}, ws.span());
  CHECK(std::string_view(short_scores.message()) == "scores has 15 entries < index rows 4 x score_stride 4");
  // select_row into a too-small out: shape_mismatch, count = what the row needs.
  row_scores row{.scores = scores};
  row.row.visible_blocks = 4;
  row.row.kv_blocks = 4;
  std::vector<std::int32_t> out(2, -1);
  std::int32_t n = 0;
  const status small = sel.select_row(row, out, n, ws.span());
  CHECK(small.code() == status_code::shape_mismatch);
  CHECK(std::string_view(small.message()) == "row 0 selects 3 blocks, out has room for 2");
  CHECK(n == 3);
  CHECK(out == std::vector<std::int32_t>{-1, -1});
  // to_csr into a col_idx one short.
  const index::causal_all all;
  std::vector<std::int32_t> row_ptr(p.index_rows() + 1), col(index::count_nnz(p, all) - 1);
  const status csr = index::to_csr(p, all, row_ptr, col);
  CHECK(std::string_view(csr.message()) == "to_csr col_idx_out has 9 entries, too few for row 3");
}
