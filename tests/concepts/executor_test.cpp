// The executor concept: the executors satisfy it; a type missing a requirement does not.
#include "skim/concepts/executor.hpp"

#include <doctest/doctest.h>

#include "skim/core/attention_args.hpp"
#include "skim/exec/cpu/reference.hpp"
#include "skim/exec/cpu/scalar.hpp"
#include "skim/index/sink.hpp"
#include "skim/index/sliding_window.hpp"

using namespace skim;

namespace {
using args_f32 = attention_args<float, contiguous_kv<float>, index::sink, float>;
using args_mixed = attention_args<bfloat16, paged_kv<half>, index::sliding_window, bfloat16>;

struct throwing_run {  // run() not noexcept
  std::size_t workspace_bytes(const problem&) const noexcept { return 0; }
  status can_implement(const problem&) const noexcept { return {}; }
  status run(const args_f32&, std::span<std::byte>) const { return {}; }
};
struct no_can_implement {
  std::size_t workspace_bytes(const problem&) const noexcept { return 0; }
  status run(const args_f32&, std::span<std::byte>) const noexcept { return {}; }
};
}  // namespace

static_assert(executor<exec::reference, args_f32>);
static_assert(executor<exec::reference, args_mixed>);
static_assert(executor<exec::scalar, args_f32>);
static_assert(executor<exec::scalar, args_mixed>);
static_assert(!executor<throwing_run, args_f32>);
static_assert(!executor<no_can_implement, args_f32>);

TEST_CASE("attention_args: designated initialisers, lse optional") {
  const float q[4] = {1, 2, 3, 4};
  float o[4] = {};
  const std::int32_t cu[2] = {0, 1};
  const args_f32 a{.prob = {.heads_q = 1, .heads_kv = 1, .head_dim = 4, .cu_seqlens_q = cu, .cu_seqlens_kv = cu},
                   .q = strided_view<const float>::token_major(q, 1, 1, 4),
                   .kv = {.k = strided_view<const float>::token_major(q, 1, 1, 4),
                          .v = strided_view<const float>::token_major(q, 1, 1, 4)},
                   .index = {.blocks = 2},
                   .o = strided_view<float>::token_major(o, 1, 1, 4)};
  CHECK(a.lse.empty());
  CHECK(a.index.blocks == 2);
  CHECK(check_args(a).ok());
  CHECK(exec::scalar{}.can_implement(a.prob).ok());
}
