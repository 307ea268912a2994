// Instructions of one decode call of exec::simd<Arch>, for counting under an emulator (qemu's
// `-one-insn-per-tb -d exec` logs one line per executed instruction): bench/insn-count runs it for
// NEON (aarch64, static) and for x86 (AVX2: the widest ISA qemu's x86 emulation decodes) and
// prints instructions per key and kv head, so the two paths compare without a hardware counter.
//
//   insn_decode KEYS CALLS    one query, 8 query heads on 2 kv heads, d 128, fp16 K/V, bk 32, every
//                             block (index::causal_all), CALLS calls on the same inputs
// The count of CALLS = 2 minus that of CALLS = 1 is one call's instructions, set-up excluded.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "skim/core/attention_args.hpp"
#include "skim/core/dtypes.hpp"
#include "skim/core/workspace.hpp"
#include "skim/exec/cpu/simd.hpp"
#include "skim/index/causal_all.hpp"

int main(int argc, char** argv) {
  if (argc != 3) return std::fputs("usage: insn_decode KEYS CALLS\n", stderr), 2;
  const std::int32_t n = std::atoi(argv[1]), calls = std::atoi(argv[2]);
  constexpr std::int32_t heads_q = 8, heads_kv = 2, dim = 128;
  const std::int32_t cu_q[] = {0, 1}, cu_kv[] = {0, n};
  const skim::problem p{.heads_q = heads_q, .heads_kv = heads_kv, .head_dim = dim, .block_q = 1, .block_kv = 32,
                        .cu_seqlens_q = cu_q, .cu_seqlens_kv = cu_kv};
  // Values in [-2, 2) from a linear congruential generator: random enough, and a set-up of few
  // instructions next to the calls'.
  std::uint32_t seed = 1;
  const auto next = [&seed] {
    seed = seed * 1664525u + 1013904223u;
    return static_cast<float>(static_cast<std::int32_t>(seed >> 24) - 128) / 64.0f;
  };
  std::vector<float> q(heads_q * dim), o(q.size());
  std::vector<skim::half> k(static_cast<std::size_t>(n) * heads_kv * dim), v(k.size());
  for (float& x : q) x = next();
  for (auto* t : {&k, &v})
    for (skim::half& x : *t) x = skim::from_float<skim::half>(next());
  const skim::attention_args<float, skim::contiguous_kv<skim::half>, skim::index::causal_all, float> args{
      .prob = p,
      .q = skim::strided_view<const float>::token_major(q.data(), 1, heads_q, dim),
      .kv = {.k = skim::strided_view<const skim::half>::token_major(k.data(), n, heads_kv, dim),
             .v = skim::strided_view<const skim::half>::token_major(v.data(), n, heads_kv, dim)},
      .index = {},
      .o = skim::strided_view<float>::token_major(o.data(), 1, heads_q, dim)};
  const skim::exec::simd<xsimd::default_arch> exec;
  skim::workspace_buffer ws(exec.workspace_bytes(p));
  for (std::int32_t c = 0; c < calls; ++c) {
    if (const skim::status s = exec.run(args, ws.span()); !s.ok()) return std::fprintf(stderr, "%s\n", s.message()), 1;
  }
  std::printf("%s o[0] %g\n", xsimd::default_arch::name(), static_cast<double>(o[0]));
  return 0;
}
