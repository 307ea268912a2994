// exec::scalar against exec::reference on random shapes, element types and implicit indices.
#include "skim/exec/cpu/scalar.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>

#include "skim/exec/cpu/reference.hpp"
#include "skim/index/causal_all.hpp"
#include "skim/index/sink.hpp"
#include "skim/index/sliding_window.hpp"
#include "support/compare.hpp"
#include "support/executor_cases.hpp"
#include "support/random_case.hpp"

using namespace skim;
using namespace skim::test;

namespace {

// Runs reference and scalar on one case and index; checks scalar against reference.
template <class TO, class TQ, class TKV, class Index>
comparison scalar_vs_reference(const random_case<TQ, TKV>& c, const Index& index, bool with_lse = true) {
  const problem p = c.prob();
  comparison result;
  c.with_kv([&](auto kv) {
    output<TO> ref(c.spec, c.tokens_q(), with_lse), got(c.spec, c.tokens_q(), with_lse);
    attention_args<TQ, decltype(kv), Index, TO> a{
        .prob = p, .q = c.q_view(), .kv = kv, .index = index, .o = ref.view, .lse = ref.lse};
    const status rs = run_executor(exec::reference{}, a);
    INFO("reference: " << std::string(rs.message()));
    REQUIRE(rs.ok());
    a.o = got.view;
    a.lse = got.lse;
    const status ss = run_executor(exec::scalar{}, a);
    INFO("scalar: " << std::string(ss.message()));
    REQUIRE(ss.ok());
    result = compare(p, got.view, ref.view, std::span<const float>(got.lse), std::span<const float>(ref.lse),
                     output_tolerance<TO>);
    check(result);
  });
  return result;
}


}  // namespace

TEST_CASE_TEMPLATE("scalar matches reference: random shapes, implicit indices", T, types<float, float, float>,
                   types<half, half, float>, types<bfloat16, bfloat16, float>, types<half, half, half>,
                   types<bfloat16, bfloat16, bfloat16>, types<float, bfloat16, float>, types<bfloat16, half, float>) {
  using TQ = typename T::q;
  using TKV = typename T::kv;
  using TO = typename T::o;
  const int cases = std::same_as<TQ, float> && std::same_as<TKV, float> ? 60 : 25;
  double worst = 0.0;
  for (int i = 0; i < cases; ++i) {
    const std::uint32_t seed = 0x5ca1a0u + 7919u * static_cast<std::uint32_t>(i) +
                               1000003u * static_cast<std::uint32_t>(sizeof(TQ) + 3 * sizeof(TKV) + 5 * sizeof(TO));
    std::mt19937 rng(seed);
    const case_spec spec = random_spec(rng);
    const random_case<TQ, TKV> c(spec, rng);
    const bool with_lse = chance(rng, 0.85);
    const std::string desc = spec.describe();
    INFO("seed " << seed << ": " << desc << (with_lse ? "" : ", no lse"));
    with_implicit_index(rng, [&](const auto& index, const std::string& name) {
      INFO("index " << name);
      const comparison r = scalar_vs_reference<TO>(c, index, with_lse);
      worst = std::max(worst, r.max_rel_o);
    });
  }
  const std::string types_name = std::string(element_name<TQ>) + "/" + element_name<TKV> + "/" + element_name<TO>;
  MESSAGE(types_name << ": worst relative error " << worst << " (tolerance " << output_tolerance<TO> << ")");
}

TEST_CASE("scalar matches reference: every head_dim 1..256") {
  for_each_head_dim_case([](std::uint32_t seed, const case_spec& spec, std::mt19937& rng) {
    const random_case<float, float> c(spec, rng);
    INFO("seed " << seed << ": " << spec.describe());
    (void)scalar_vs_reference<float>(c, index::causal_all{});
  });
}

TEST_CASE("scalar matches reference: block sizes 16..128 and odd, independently, with partial last blocks") {
  for_each_block_size_case([](int, std::uint32_t seed, const case_spec& spec, std::mt19937& rng) {
    const random_case<float, float> c(spec, rng);
    INFO("seed " << seed << ": " << spec.describe());
    with_implicit_index(rng, [&](const auto& index, const std::string& name) {
      INFO("index " << name);
      (void)scalar_vs_reference<float>(c, index);
    });
  });
}

TEST_CASE("scalar matches reference: GQA 1, 4, 8 with per-kv-head and per-query-head indices, paged and not") {
  for_each_gqa_case([](std::uint32_t seed, const case_spec& spec, std::mt19937& rng) {
    const random_case<bfloat16, bfloat16> c(spec, rng);
    INFO("seed " << seed << ": " << spec.describe());
    (void)scalar_vs_reference<float>(c, index::causal_all{});
    (void)scalar_vs_reference<float>(c, index::sliding_window{2});
  });
}

TEST_CASE("scalar: fully masked rows give exactly o = 0 and lse = -inf") {
  std::mt19937 rng(0xe3e3u);
  case_spec spec;
  spec.heads_q = 4;
  spec.heads_kv = 2;
  spec.head_dim = 24;
  spec.block_q = 4;
  spec.block_kv = 8;
  // 30 queries against 10 keys: the first 20 queries see nothing; a sequence without keys; sink{0}.
  spec.seqs = {{30, 10}, {5, 0}, {6, 20}};
  const random_case<float, float> c(spec, rng);
  const comparison r = scalar_vs_reference<float>(c, index::causal_all{});
  CHECK(r.empty_rows == (20 + 5) * spec.heads_q);
  const comparison none = scalar_vs_reference<float>(c, index::sink{0});
  CHECK(none.empty_rows == none.rows);
}

TEST_CASE("scalar is deterministic: bit-identical output whatever the workspace held") {
  std::mt19937 rng(0xde7u);
  case_spec spec;
  spec.heads_q = 8;
  spec.heads_kv = 2;
  spec.head_dim = 80;
  spec.block_q = 16;
  spec.block_kv = 32;
  spec.seqs = {{90, 200}, {33, 33}};
  spec.paged = true;
  spec.page_size = 24;
  const random_case<half, half> c(spec, rng);
  const problem p = c.prob();
  output<float> first(spec, c.tokens_q()), second(spec, c.tokens_q());
  attention_args<half, paged_kv<half>, index::causal_all, float> a{
      .prob = p, .q = c.q_view(), .kv = c.paged(), .index = {}, .o = first.view, .lse = first.lse};
  REQUIRE(run_executor(exec::scalar{}, a, std::byte{0xff}).ok());
  a.o = second.view;
  a.lse = second.lse;
  REQUIRE(run_executor(exec::scalar{}, a, std::byte{0x00}).ok());
  CHECK(std::memcmp(first.o.data(), second.o.data(), first.o.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(first.lse.data(), second.lse.data(), first.lse.size() * sizeof(float)) == 0);
  // Not a constant: the output varies across rows.
  CHECK(first.o[0] != first.o[first.o.size() / 2]);
}

TEST_CASE("scalar and reference agree on contiguous and paged storage of the same K/V") {
  std::mt19937 rng(0x9a9eu);
  case_spec spec;
  spec.heads_q = 4;
  spec.heads_kv = 1;
  spec.head_dim = 40;
  spec.block_q = 16;
  spec.block_kv = 16;
  spec.seqs = {{50, 120}, {1, 77}};
  spec.page_size = 5;
  random_case<float, float> c(spec, rng);
  const problem p = c.prob();
  output<float> contiguous(spec, c.tokens_q()), paged(spec, c.tokens_q());
  attention_args<float, contiguous_kv<float>, index::causal_all, float> ac{
      .prob = p, .q = c.q_view(), .kv = c.contiguous(), .index = {}, .o = contiguous.view, .lse = contiguous.lse};
  attention_args<float, paged_kv<float>, index::causal_all, float> ap{
      .prob = p, .q = c.q_view(), .kv = c.paged(), .index = {}, .o = paged.view, .lse = paged.lse};
  REQUIRE(run_executor(exec::scalar{}, ac).ok());
  REQUIRE(run_executor(exec::scalar{}, ap).ok());
  // Same values, same order of operations: bit-identical.
  CHECK(std::memcmp(contiguous.o.data(), paged.o.data(), paged.o.size() * sizeof(float)) == 0);
  // And through head-major pages ([pages, heads_kv, page_size, head_dim]).
  spec.heads_q = 6;
  spec.heads_kv = 3;
  random_case<float, float> g(spec, rng);
  const problem pg = g.prob();
  const std::vector<float> k_hm = g.head_major_pages(g.k_pages), v_hm = g.head_major_pages(g.v_pages);
  output<float> token_pages(spec, g.tokens_q()), head_pages(spec, g.tokens_q());
  attention_args<float, paged_kv<float>, index::causal_all, float> at{
      .prob = pg, .q = g.q_view(), .kv = g.paged(), .index = {}, .o = token_pages.view, .lse = token_pages.lse};
  attention_args<float, paged_kv<float>, index::causal_all, float> ah{.prob = pg, .q = g.q_view(),
                                                                     .kv = g.paged_head_major(k_hm, v_hm), .index = {},
                                                                     .o = head_pages.view, .lse = head_pages.lse};
  REQUIRE(run_executor(exec::scalar{}, at).ok());
  REQUIRE(run_executor(exec::scalar{}, ah).ok());
  CHECK(std::memcmp(token_pages.o.data(), head_pages.o.data(), head_pages.o.size() * sizeof(float)) == 0);
}
