// The README's quick start, compiled with every build so it cannot rot: block-sparse attention
// of one sequence over sink ∪ local window ∪ a block table an engine chose, on the CPU.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <skim/skim.hpp>

int main() {
  // One sequence: 256 queries (prefill) over 256 keys, GQA 8 query heads on 2 kv heads.
  const std::int32_t n = 256, heads_q = 8, heads_kv = 2, dim = 64;
  const std::int32_t cu_q[] = {0, n}, cu_kv[] = {0, n};
  const skim::problem p{.heads_q = heads_q, .heads_kv = heads_kv, .head_dim = dim,
                        .block_q = 32, .block_kv = 32, .mask = skim::mask_kind::causal,
                        .cu_seqlens_q = cu_q, .cu_seqlens_kv = cu_kv};

  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::vector<float> q(n * heads_q * dim), k(n * heads_kv * dim), v(k.size()), o(q.size());
  for (auto* t : {&q, &k, &v})
    for (float& x : *t) x = nd(rng);

  // The engine's own choice: block 3 for every row that can see it (one row per query block and
  // kv head, row = q_block * heads_kv + kv_head). A row that cannot see block 3 lists nothing.
  std::vector<std::int32_t> ids(p.index_rows(), 3), count(p.index_rows());
  const skim::status walk = skim::for_each_row(p, [&](const skim::row_info& r) { count[r.row] = r.visible_blocks > 3; });
  auto index = skim::index::make_union(skim::index::sink{1}, skim::index::sliding_window{2},
                                             skim::index::block_table{.ids = ids, .count = count, .width = 1});

  const skim::attention_args<float, skim::contiguous_kv<float>, decltype(index), float> args{
      .prob = p,
      .q = skim::strided_view<const float>::token_major(q.data(), n, heads_q, dim),
      .kv = {.k = skim::strided_view<const float>::token_major(k.data(), n, heads_kv, dim),
             .v = skim::strided_view<const float>::token_major(v.data(), n, heads_kv, dim)},
      .index = index,
      .o = skim::strided_view<float>::token_major(o.data(), n, heads_q, dim)};

  const skim::exec::scalar exec;
  if (skim::status s = exec.can_implement(p); !s.ok() || !walk.ok()) return std::puts(s.message()), 1;
  skim::workspace_buffer workspace(exec.workspace_bytes(p));  // allocate once, outside the hot path
  if (skim::status s = exec.run(args, workspace.span()); !s.ok()) {
    std::fprintf(stderr, "skim: %s\n", s.message());  // e.g. "block id 9 >= visible blocks 2 in row 1"
    return 1;
  }

  // The same blocks through the double-precision reference.
  std::vector<float> ref(o.size());
  auto ref_args = args;
  ref_args.o = skim::strided_view<float>::token_major(ref.data(), n, heads_q, dim);
  if (skim::status s = skim::exec::reference{}.run(ref_args, {}); !s.ok()) return std::puts(s.message()), 1;
  double err = 0, norm = 0;
  for (std::size_t i = 0; i < o.size(); ++i) err += (o[i] - ref[i]) * (o[i] - ref[i]), norm += ref[i] * ref[i];
  std::printf("scalar vs reference over sink + window + table: relative error %.1e\n", std::sqrt(err / norm));
  return 0;
}
