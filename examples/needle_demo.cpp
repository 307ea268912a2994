// skim-demo — a needle in a haystack, end to end on the CPU.
//
// A long synthetic context (8192 keys, head dim 128, 8 query heads, 2 kv heads) with the three
// kinds of structure real attention has: an attention sink at the start, a local window that
// follows each query, and a few "needle" keys planted far back that some query blocks look for.
// The last 1024 tokens are the queries (a chunked prefill, causal, bottom-right aligned).
//
// skim's scalar executor runs over the union sink ∪ window ∪ a block_table holding the needle
// blocks, and the demo prints, per configuration:
//   density   share of the causal query-key pairs the index reads
//   exact     relative error against skim's double-precision reference over the *same* index
//             (the executor is exact: this is fp32 rounding)
//   vs dense  relative error against dense attention over every causal block (what the sparse
//             selection costs in accuracy)
//   time      median wall time of the sparse run, and the speed-up over the same executor
//             over all causal blocks (one thread both)
//
// Until skim's router and selectors choose the needle blocks themselves, the demo hands them over
// as a block_table: the point here is that the executor reads exactly the blocks it is given.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <span>
#include <string_view>
#include <vector>

#include "skim/core/attention_args.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/views.hpp"
#include "skim/core/workspace.hpp"
#include "skim/exec/cpu/reference.hpp"
#include "skim/exec/cpu/scalar.hpp"
#include "skim/index/block_table.hpp"
#include "skim/index/block_union.hpp"
#include "skim/index/causal_all.hpp"
#include "skim/index/sink.hpp"
#include "skim/index/sliding_window.hpp"

namespace {

constexpr std::int32_t keys = 8192;
constexpr std::int32_t queries = 1024;
constexpr std::int32_t heads_q = 8;
constexpr std::int32_t heads_kv = 2;
constexpr std::int32_t dim = 128;
constexpr std::int32_t needles_per_head = 3;

// Strengths of the planted structure, in units of the scaled score q·k/sqrt(d).
// Real attention is peaked: a few keys hold most of the mass, and the thousands of others share
// the rest. These make the haystack (every key's noise) hold about 1% of a query's mass.
constexpr float sink_score = 10.0f;
constexpr float local_score = 8.0f;
constexpr float needle_score = 14.0f;
constexpr float query_noise = 0.35f;  // per-element standard deviations
constexpr float key_noise = 0.5f;

struct haystack {
  std::vector<float> q, k, v;                     // token-major
  std::vector<std::int32_t> needle_pos;           // [heads_kv, needles_per_head]
};

std::vector<float> unit_vector(std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<float> u(dim);
  double n = 0;
  for (float& x : u) {
    x = nd(rng);
    n += double(x) * x;
  }
  for (float& x : u) x = static_cast<float>(x / std::sqrt(n));
  return u;
}

// Builds Q, K, V. Per kv head: a sink direction shared by the first keys and every query, a slowly
// drifting "position" direction shared by a key and the queries near it, and needle directions:
// query block i of kv head g looks for needle i % needles_per_head of g.
haystack build(std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  haystack h;
  h.q.resize(std::size_t(queries) * heads_q * dim);
  h.k.resize(std::size_t(keys) * heads_kv * dim);
  h.v.resize(h.k.size());
  const float root_d = std::sqrt(float(dim));
  const float sink_amp = std::sqrt(sink_score * root_d), local_amp = std::sqrt(local_score * root_d);
  const float needle_amp = std::sqrt(needle_score * root_d);
  constexpr std::int32_t drift = 96;  // tokens between anchor directions of the position signal
  std::uniform_int_distribution<std::int32_t> far_back(64, keys - queries - 512);

  for (std::int32_t g = 0; g < heads_kv; ++g) {
    const std::vector<float> sink_dir = unit_vector(rng);
    std::vector<std::vector<float>> anchors;
    for (std::int32_t a = 0; a <= keys / drift + 1; ++a) anchors.push_back(unit_vector(rng));
    const auto position = [&](std::int32_t t, std::int32_t e) {
      const float w = float(t % drift) / drift;
      return (1 - w) * anchors[t / drift][e] + w * anchors[t / drift + 1][e];
    };
    std::vector<std::vector<float>> needle_dir;
    for (std::int32_t n = 0; n < needles_per_head; ++n) {
      needle_dir.push_back(unit_vector(rng));
      h.needle_pos.push_back(far_back(rng));
    }
    for (std::int32_t t = 0; t < keys; ++t) {
      float* k = h.k.data() + (std::size_t(t) * heads_kv + g) * dim;
      float* v = h.v.data() + (std::size_t(t) * heads_kv + g) * dim;
      for (std::int32_t e = 0; e < dim; ++e) {
        k[e] = key_noise * nd(rng) + local_amp * position(t, e) + (t < 4 ? sink_amp * sink_dir[e] : 0.0f);
        v[e] = nd(rng);
      }
      for (std::int32_t n = 0; n < needles_per_head; ++n) {
        if (h.needle_pos[std::size_t(g) * needles_per_head + n] != t) continue;
        for (std::int32_t e = 0; e < dim; ++e) k[e] = key_noise * nd(rng) + needle_amp * needle_dir[n][e];
      }
    }
    for (std::int32_t i = 0; i < queries; ++i) {
      const std::int32_t t = keys - queries + i;  // the query's own position
      const std::int32_t n = (i / 64) % needles_per_head;
      for (std::int32_t hh = g * (heads_q / heads_kv); hh < (g + 1) * (heads_q / heads_kv); ++hh) {
        float* q = h.q.data() + (std::size_t(i) * heads_q + hh) * dim;
        for (std::int32_t e = 0; e < dim; ++e) {
          q[e] = query_noise * nd(rng) + local_amp * position(t, e) + sink_amp * sink_dir[e] + needle_amp * needle_dir[n][e];
        }
      }
    }
  }
  return h;
}

double relative_error(std::span<const float> a, std::span<const float> ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

template <class F>
double median_seconds(int runs, F&& f) {
  std::vector<double> t;
  for (int r = 0; r < runs; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void require_ok(const skim::status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "skim-demo: %s: %s\n", what, s.message());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--runs" && i + 1 < argc) {
      runs = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: skim-demo [--runs N]\n");
      return 2;
    }
  }

  const haystack h = build(2026);
  const std::int32_t bq = 64, bk = 64;
  const std::int32_t cu_q[2] = {0, queries}, cu_kv[2] = {0, keys};
  const skim::problem p{.heads_q = heads_q, .heads_kv = heads_kv, .head_dim = dim, .block_q = bq, .block_kv = bk,
                        .mask = skim::mask_kind::causal, .cu_seqlens_q = cu_q, .cu_seqlens_kv = cu_kv};
  require_ok(skim::validate(p), "problem");

  const auto q = skim::strided_view<const float>::token_major(h.q.data(), queries, heads_q, dim);
  const skim::contiguous_kv<float> kv{.k = skim::strided_view<const float>::token_major(h.k.data(), keys, heads_kv, dim),
                                      .v = skim::strided_view<const float>::token_major(h.v.data(), keys, heads_kv, dim)};
  const skim::exec::scalar scalar;
  const skim::workspace_buffer workspace_memory(scalar.workspace_bytes(p));
  const std::span<std::byte> workspace = workspace_memory.span();

  // Every row of kv head g holds g's needle blocks (sorted, unique): what a router would find.
  const std::int64_t rows = p.index_rows();
  std::vector<std::int32_t> ids(static_cast<std::size_t>(rows) * needles_per_head);
  std::vector<std::int32_t> count(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int32_t g = std::int32_t(r % heads_kv);
    std::vector<std::int32_t> blocks;
    for (std::int32_t n = 0; n < needles_per_head; ++n) blocks.push_back(h.needle_pos[std::size_t(g) * needles_per_head + n] / bk);
    std::sort(blocks.begin(), blocks.end());
    blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
    std::copy(blocks.begin(), blocks.end(), ids.begin() + r * needles_per_head);
    count[std::size_t(r)] = std::int32_t(blocks.size());
  }
  const skim::index::block_table needles{.ids = ids, .count = count, .width = needles_per_head};

  // Dense: the same executor over every causal block.
  std::vector<float> dense_o(h.q.size());
  const auto dense_out = skim::strided_view<float>::token_major(dense_o.data(), queries, heads_q, dim);
  const skim::attention_args<float, skim::contiguous_kv<float>, skim::index::causal_all, float> dense_args{
      .prob = p, .q = q, .kv = kv, .index = {}, .o = dense_out};
  const double dense_s = median_seconds(runs, [&] { require_ok(scalar.run(dense_args, workspace), "dense run"); });
  double causal_pairs = 0;
  for (std::int32_t i = 0; i < queries; ++i) causal_pairs += keys - queries + i + 1;
  std::printf("skim-demo: %d keys, %d queries (chunked prefill), head dim %d, %d query heads, %d kv heads, bq = bk = %d\n",
              keys, queries, dim, heads_q, heads_kv, bk);
  std::printf("needles per kv head at tokens:");
  for (std::int32_t pos : h.needle_pos) std::printf(" %d", pos);
  std::printf("\ndense (scalar over all causal blocks): %.3f s, %.1f GFLOP/s on %.0f causal pairs per head\n\n",
              dense_s, 4.0 * causal_pairs * dim * heads_q / dense_s * 1e-9, causal_pairs);

  std::printf("%-34s %8s %10s %10s %9s %8s\n", "index", "density", "exact", "vs dense", "time", "speed-up");
  const auto report = [&](const char* name, const auto& index) {
    using index_t = std::remove_cvref_t<decltype(index)>;
    std::vector<float> o(h.q.size()), ref(h.q.size());
    const skim::attention_args<float, skim::contiguous_kv<float>, index_t, float> args{
        .prob = p, .q = q, .kv = kv, .index = index,
        .o = skim::strided_view<float>::token_major(o.data(), queries, heads_q, dim)};
    const double s = median_seconds(runs, [&] { require_ok(scalar.run(args, workspace), name); });
    auto ref_args = args;
    ref_args.o = skim::strided_view<float>::token_major(ref.data(), queries, heads_q, dim);
    require_ok(skim::exec::reference{}.run(ref_args, {}), "reference");
    // Pairs read: for each row, the keys of its blocks that its queries see.
    double pairs = 0;
    require_ok(skim::for_each_row(p, [&](const skim::row_info& r) {
                 for (auto c = index.cursor(r); !c.done(); c.next()) {
                   for (std::int32_t qq = r.q_begin; qq < r.q_end; ++qq) {
                     const std::int32_t seen = std::min(r.visible_keys(qq, p.mask) - c.id() * bk, bk);
                     pairs += std::max(seen, 0);
                   }
                 }
               }),
               "walk");
    std::printf("%-34s %7.2f%% %10.1e %10.1e %7.3f s %7.1fx\n", name, 100.0 * pairs / (causal_pairs * heads_kv),
                relative_error(o, ref), relative_error(o, dense_o), s, dense_s / s);
  };
  using skim::index::make_union;
  using skim::index::sink;
  using skim::index::sliding_window;
  report("sink(1) + window(4)", make_union(sink{1}, sliding_window{4}));
  report("sink(1) + window(4) + needles", make_union(sink{1}, sliding_window{4}, needles));
  report("sink(1) + window(8) + needles", make_union(sink{1}, sliding_window{8}, needles));
  report("sink(2) + window(16) + needles", make_union(sink{2}, sliding_window{16}, needles));
  std::printf("\n'exact' is fp32 rounding against the double-precision reference over the same blocks;\n"
              "'vs dense' is what reading only those blocks costs. Without the needle blocks the\n"
              "queries lose what they were looking for.\n");
  return 0;
}
