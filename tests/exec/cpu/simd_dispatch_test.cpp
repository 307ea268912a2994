// exec::simd_dispatch (skim/exec/cpu/dispatch.hpp): this TU is built with the baseline flags; the
// avx2 and avx512f entries come from TUs built with their own flags (SKIM_TEST_DISPATCH_AVX2/_AVX512
// say which were built). The dispatcher must pick the best arch the CPU has, and its output must match
// the reference and the baseline simd<default_arch>.
#include "skim/exec/cpu/dispatch.hpp"

#include <doctest/doctest.h>

#include <random>
#include <string>
#include <vector>

#include "exec/cpu/simd_dispatch_args.hpp"
#include "skim/exec/cpu/reference.hpp"
#include "support/compare.hpp"
#include "support/random_case.hpp"

using namespace skim;
using namespace skim::test;

TEST_CASE("simd_dispatch picks the best compiled arch the CPU has, and computes attention") {
  std::vector<exec::simd_entry<dispatch_args>> table;
#if defined(SKIM_TEST_DISPATCH_AVX512)
  table.push_back(simd_entry_avx512());
#endif
#if defined(SKIM_TEST_DISPATCH_AVX2)
  table.push_back(simd_entry_avx2());
#endif
  table.push_back(exec::make_simd_entry<xsimd::default_arch, dispatch_args>());  // baseline, always runs
  const exec::simd_dispatch<dispatch_args> dispatch{table};
  REQUIRE(dispatch.chosen() != nullptr);
  const std::string chosen = dispatch.arch();
  MESSAGE("dispatch chose " << chosen << " among " << table.size() << " compiled arches");
  const auto cpu = xsimd::available_architectures();
#if defined(SKIM_TEST_DISPATCH_AVX512)
  if (cpu.avx512f && cpu.avx512dq) CHECK(chosen == "avx512f");
#endif
#if defined(SKIM_TEST_DISPATCH_AVX2)
  if (cpu.avx2 && cpu.fma3_avx2 && !(cpu.avx512f && cpu.avx512dq)) CHECK(chosen == "avx2");
#endif
  (void)cpu;

  // An entry the CPU lacks is never chosen.
  exec::simd_entry<dispatch_args> fake = table.back();
  fake.arch = "no-such-arch";
  fake.version = 1u << 30;
  const exec::simd_entry<dispatch_args> with_fake[] = {fake, table.back()};
  CHECK(exec::simd_dispatch<dispatch_args>::select(with_fake) == &with_fake[1]);

  std::mt19937 rng(0xd15au);
  case_spec spec;
  spec.heads_q = 8;
  spec.heads_kv = 2;
  spec.head_dim = 72;
  spec.block_q = 16;
  spec.block_kv = 32;
  spec.seqs = {{100, 180}, {1, 300}};
  const random_case<half, half> c(spec, rng);
  output<float> ref(spec, c.tokens_q()), got(spec, c.tokens_q());
  dispatch_args a{.prob = c.prob(), .q = c.q_view(), .kv = c.contiguous(), .index = {}, .o = ref.view, .lse = ref.lse};
  REQUIRE(run_executor(exec::reference{}, a).ok());
  a.o = got.view;
  a.lse = got.lse;
  for (std::int32_t threads : {1, 2}) {
    aligned_workspace ws(dispatch.workspace_bytes(a.prob, threads));
    const status s = dispatch.run(a, ws.bytes, threads);
    INFO(std::string(s.message()));
    REQUIRE(s.ok());
    check(compare(a.prob, got.view, ref.view, std::span<const float>(got.lse), std::span<const float>(ref.lse),
                  output_tolerance<float>));
  }
}
