// The README's C++ snippets, compiled and run as they are printed there (between the snippet
// markers; docs/snippets_test.cpp checks that every ```cpp block of the README and docs/ is one of
// these). Around each: the data it assumes, and a check that it did what the README says.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <span>
#include <vector>

#include <skim/skim.hpp>

#include "support/random_case.hpp"

namespace {

// The quick start: block-sparse attention over sink ∪ local window ∪ blocks the engine chose.
skim::status quick_start(std::int32_t n, std::span<const std::int32_t> ids, std::span<const std::int32_t> count,
                         const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                         std::vector<float>& o) {
  // snippet begin
  const std::int32_t cu_q[] = {0, n}, cu_kv[] = {0, n};          // one sequence; varlen = more entries
  const skim::problem p{.heads_q = 8, .heads_kv = 2, .head_dim = 64,
                        .block_q = 32, .block_kv = 32, .mask = skim::mask_kind::causal,
                        .cu_seqlens_q = cu_q, .cu_seqlens_kv = cu_kv};
  auto index = skim::index::make_union(skim::index::sink{1}, skim::index::sliding_window{2},
                                       skim::index::block_table{.ids = ids, .count = count, .width = 1});
  const skim::attention_args<float, skim::contiguous_kv<float>, decltype(index), float> args{
      .prob = p,
      .q = skim::strided_view<const float>::token_major(q.data(), n, 8, 64),
      .kv = {.k = skim::strided_view<const float>::token_major(k.data(), n, 2, 64),
             .v = skim::strided_view<const float>::token_major(v.data(), n, 2, 64)},
      .index = index,
      .o = skim::strided_view<float>::token_major(o.data(), n, 8, 64)};

  const skim::exec::scalar exec;
  skim::workspace_buffer workspace(exec.workspace_bytes(p));     // once, outside the hot path
  if (skim::status s = exec.run(args, workspace.span()); !s.ok())
    std::fprintf(stderr, "skim: %s\n", s.message());           // "block id 9 >= visible blocks 2 in row 1"
  // snippet end
  return exec.run(args, workspace.span());
}

// An engine's decode step: prefill summaries, then one routed step per token.
skim::status decode_loop(const skim::contiguous_kv<float>& cache, std::int32_t n, std::int32_t tokens,
                         std::span<const float> q, std::span<float> o, std::int32_t& final_n) {
  // snippet begin
  skim::decode_step<skim::exec::scalar> step;                 // any executor; defaults' summaries
  SKIM_TRY(step.plan({.heads_q = 8, .heads_kv = 2, .head_dim = 64, .max_seqlen_kv = 4096,
                      .sequences = 1, .top_k = 64}));         // 64 blocks of 4 keys + sink + local
  SKIM_TRY(step.prefill(0, cache, n));                        // after prefill: keys [0, n) summarised
  for (int t = 0; t < tokens; ++t) {                          // each token: K/V row n written, then
    SKIM_TRY(step.run(0, q, cache, ++n, o));                  // summarise it, route, select, attend
  }
  // snippet end
  final_n = n;
  return skim::status::success();
}

}  // namespace

TEST_CASE("README quick start runs and attends over the blocks it names") {
  std::mt19937 rng(2026);
  const std::int32_t n = 100;  // 4 blocks of 32, the last partial
  std::vector<float> q(std::size_t(n) * 8 * 64), k(std::size_t(n) * 2 * 64), v(k.size()), o(q.size());
  skim::test::fill_normal(rng, q);
  skim::test::fill_normal(rng, k);
  skim::test::fill_normal(rng, v);
  // Rows: 4 query blocks x 2 kv heads; each names block 0 (also the sink: the union keeps it once).
  const std::vector<std::int32_t> ids(8, 0), count(8, 1);
  REQUIRE(quick_start(n, ids, count, q, k, v, o).ok());
  // Against the reference over the same union.
  std::vector<float> ref(o.size());
  const std::int32_t cu[] = {0, n};
  const skim::problem p{.heads_q = 8, .heads_kv = 2, .head_dim = 64, .block_q = 32, .block_kv = 32,
                        .mask = skim::mask_kind::causal, .cu_seqlens_q = cu, .cu_seqlens_kv = cu};
  auto index = skim::index::make_union(skim::index::sink{1}, skim::index::sliding_window{2},
                                       skim::index::block_table{.ids = ids, .count = count, .width = 1});
  const skim::attention_args<float, skim::contiguous_kv<float>, decltype(index), float> a{
      .prob = p, .q = skim::strided_view<const float>::token_major(q.data(), n, 8, 64),
      .kv = {.k = skim::strided_view<const float>::token_major(k.data(), n, 2, 64),
             .v = skim::strided_view<const float>::token_major(v.data(), n, 2, 64)},
      .index = index, .o = skim::strided_view<float>::token_major(ref.data(), n, 8, 64)};
  REQUIRE(skim::exec::reference{}.run(a, {}).ok());
  for (std::size_t i = 0; i < o.size(); ++i) REQUIRE(o[i] == doctest::Approx(ref[i]).epsilon(1e-5));
}

TEST_CASE("README decode step runs token by token over a growing cache") {
  std::mt19937 rng(4096);
  const std::int32_t capacity = 700, n0 = 600, tokens = 5;
  std::vector<float> k(std::size_t(capacity) * 2 * 64), v(k.size()), q(8 * 64), o(q.size(), -1.0f);
  skim::test::fill_normal(rng, k);
  skim::test::fill_normal(rng, v);
  skim::test::fill_normal(rng, q);
  const skim::contiguous_kv<float> cache{
      .k = skim::strided_view<const float>::token_major(k.data(), capacity, 2, 64),
      .v = skim::strided_view<const float>::token_major(v.data(), capacity, 2, 64)};
  std::int32_t n = 0;
  const skim::status st = decode_loop(cache, n0, tokens, q, o, n);
  REQUIRE_MESSAGE(st.ok(), st.message());
  CHECK(n == n0 + tokens);
  for (const float x : o) REQUIRE(std::isfinite(x));
  CHECK(o != std::vector<float>(o.size(), -1.0f));
}
