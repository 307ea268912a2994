// skim-demo — a needle in a haystack, end to end on the CPU: summarize, route, select, execute.
//
// A long synthetic context (8192 keys, head dim 128, 8 query heads, 2 kv heads) with the three
// kinds of structure real attention has: an attention sink at the start, a local window that
// follows each query, and a few "needle" keys planted far back that some query blocks look for.
// The last 1024 tokens are the queries (a chunked prefill, causal, bottom-right aligned).
//
// For a few block sizes and budgets, skim's pipeline with skim::defaults' routing (multi_centroid<2>
// summaries, a router pooling each query block and summing a kv head's query heads, top-k with sink /
// local / recency reserved; the scalar executor) chooses the blocks itself, and the demo prints per
// configuration:
//   density   share of the causal query-key pairs the chosen blocks hold
//   needle    share of (query, head) rows whose chosen blocks hold the needle the query looks for
//   recall@8  share of each row's 8 highest-scoring keys inside its chosen blocks (sampled rows)
//   coverage  share of the dense attention mass inside the chosen blocks: exp(lse_sparse - lse_dense)
//   error     relative L2 error of the output against dense attention over every causal block
//   time      median wall time of the whole sparse step (all four stages), and the speed-up over
//             the same executor over every causal block (one thread both)
// and, once, the executor's exactness against skim's double-precision reference over the blocks
// it was given.

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
#include "skim/defaults.hpp"
#include "skim/exec/cpu/reference.hpp"
#include "skim/exec/cpu/scalar.hpp"
#include "skim/index/block_table.hpp"
#include "skim/index/causal_all.hpp"
#include "skim/pipeline.hpp"
#include "skim/route/pooled_router.hpp"
#include "skim/select/reserved.hpp"
#include "skim/select/top_k.hpp"

namespace {

constexpr std::int32_t keys = 8192;
constexpr std::int32_t queries = 1024;
constexpr std::int32_t heads_q = 8;
constexpr std::int32_t heads_kv = 2;
constexpr std::int32_t dim = 128;
constexpr std::int32_t needles_per_head = 3;
// The local window skim::defaults reserves, in keys (its local_blocks blocks of block_kv keys).
constexpr std::int32_t local_keys = skim::defaults::local_blocks * skim::defaults::block_kv;

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

using sparse_step = skim::sparse_attention<skim::defaults::summarizer, skim::route::pooled_router,
                                           skim::select::reserved<skim::select::top_k>, skim::exec::scalar>;

struct quality {
  double needle = 0, recall = 0, coverage = 0, error = 0, density = 0;
};

// Quality of one sparse run against the dense one (docs/design.md §12: mass coverage, recall, error).
quality measure(const haystack& h, const skim::problem& p, const skim::index::block_table& selected,
                std::span<const float> o, std::span<const float> lse, std::span<const float> dense_o,
                std::span<const float> dense_lse) {
  quality r;
  const std::int32_t bk = p.block_kv, group = heads_q / heads_kv;
  // Coverage from the log-sum-exps: Σ_selected e^s / Σ_all e^s = e^(lse_sparse - lse_dense).
  for (std::size_t i = 0; i < lse.size(); ++i) r.coverage += std::exp(double(lse[i]) - dense_lse[i]);
  r.coverage /= double(lse.size());
  r.error = relative_error(o, dense_o);
  double pairs = 0, causal = 0, rows = 0, recall_rows = 0;
  std::vector<std::pair<float, std::int32_t>> scored;
  const skim::status walk = skim::for_each_row(p, [&](const skim::row_info& row) {
    std::vector<char> chosen(std::size_t(row.kv_blocks), 0);
    for (auto c = selected.cursor(row); !c.done(); c.next()) chosen[std::size_t(c.id())] = 1;
    const std::int32_t g = row.head;
    for (std::int32_t qq = row.q_begin; qq < row.q_end; ++qq) {
      const std::int32_t visible = row.visible_keys(qq, p.mask);
      causal += visible;
      for (std::int32_t j = 0; j < visible; ++j) pairs += chosen[std::size_t(j / bk)];
      const std::int32_t target = h.needle_pos[std::size_t(g) * needles_per_head + (qq / 64) % needles_per_head];
      r.needle += chosen[std::size_t(target / bk)];
      ++rows;
      if (qq % 16 != 0) continue;  // recall@8 on every 16th query, each head of the group
      for (std::int32_t hh = g * group; hh < (g + 1) * group; ++hh) {
        const float* q = h.q.data() + (std::size_t(qq) * heads_q + hh) * dim;
        scored.clear();
        for (std::int32_t j = 0; j < visible; ++j) {
          const float* k = h.k.data() + (std::size_t(j) * heads_kv + g) * dim;
          float s = 0;
          for (std::int32_t e = 0; e < dim; ++e) s += q[e] * k[e];
          scored.emplace_back(-s, j);
        }
        const std::size_t t = std::min<std::size_t>(8, scored.size());
        std::partial_sort(scored.begin(), scored.begin() + std::ptrdiff_t(t), scored.end());
        double hit = 0;
        for (std::size_t x = 0; x < t; ++x) hit += chosen[std::size_t(scored[x].second / bk)];
        r.recall += hit / double(t);
        ++recall_rows;
      }
    }
  });
  require_ok(walk, "walk");
  r.needle /= rows;
  r.recall /= recall_rows;
  r.density = pairs / causal;
  return r;
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
  const std::int32_t cu_q[2] = {0, queries}, cu_kv[2] = {0, keys};
  const auto q = skim::strided_view<const float>::token_major(h.q.data(), queries, heads_q, dim);
  const skim::contiguous_kv<float> kv{.k = skim::strided_view<const float>::token_major(h.k.data(), keys, heads_kv, dim),
                                      .v = skim::strided_view<const float>::token_major(h.v.data(), keys, heads_kv, dim)};
  const auto problem_for = [&](std::int32_t bk) {
    return skim::problem{.heads_q = heads_q, .heads_kv = heads_kv, .head_dim = dim, .block_q = 64, .block_kv = bk,
                         .mask = skim::mask_kind::causal, .cu_seqlens_q = cu_q, .cu_seqlens_kv = cu_kv};
  };

  // Dense: the same executor over every causal block.
  const skim::problem p64 = problem_for(64);
  const skim::exec::scalar scalar;
  std::vector<float> dense_o(h.q.size()), dense_lse(std::size_t(queries) * heads_q);
  const skim::attention_args<float, skim::contiguous_kv<float>, skim::index::causal_all, float> dense_args{
      .prob = p64, .q = q, .kv = kv, .index = {},
      .o = skim::strided_view<float>::token_major(dense_o.data(), queries, heads_q, dim), .lse = dense_lse};
  const skim::workspace_buffer dense_ws(scalar.workspace_bytes(p64));
  const double dense_s = median_seconds(runs, [&] { require_ok(scalar.run(dense_args, dense_ws.span()), "dense run"); });
  double causal_pairs = 0;
  for (std::int32_t i = 0; i < queries; ++i) causal_pairs += keys - queries + i + 1;
  std::printf("skim-demo: %d keys, %d queries (chunked prefill), head dim %d, %d query heads, %d kv heads, bq 64\n",
              keys, queries, dim, heads_q, heads_kv);
  std::printf("needles per kv head at tokens:");
  for (std::int32_t pos : h.needle_pos) std::printf(" %d", pos);
  std::printf("\ndense (scalar over all causal blocks): %.3f s, %.1f GFLOP/s on %.0f causal pairs per head\n", dense_s,
              4.0 * causal_pairs * dim * heads_q / dense_s * 1e-9, causal_pairs);
  std::printf("sparse: skim::defaults' routing (multi_centroid<2> summaries, mean-pooled queries, the GQA group's\n"
              "        scores summed, top-k + sink %d block + the newest %d keys)\n\n",
              skim::defaults::sink_blocks, local_keys);
  std::printf("%4s %7s %4s %8s %7s %9s %9s %8s %9s %8s\n", "bk", "budget", "k", "density", "needle", "recall@8",
              "coverage", "error", "time", "speed-up");

  double exactness = -1;
  for (const std::int32_t bk : {4, 8, 16}) {
    const skim::problem p = problem_for(bk);
    for (const std::int32_t share : {32, 16, 8}) {
      // A budget of 1/share of the sequence's blocks: sink and local reserved, the rest dynamic.
      const std::int32_t blocks = (keys / bk + share - 1) / share;
      sparse_step step;
      // The reserves of skim::defaults, the local window kept at the same number of keys at every bk.
      const std::int32_t local = std::max(1, local_keys / bk);
      const std::int32_t reserved = skim::defaults::sink_blocks + local;
      step.router = {.pool = skim::route::query_pool::mean, .reduce = skim::defaults::reduce};
      step.selector = {.sink = skim::defaults::sink_blocks, .local = local, .recency = true,
                       .dynamic = {.k = std::max(blocks - reserved, 1)}};
      require_ok(step.can_implement(p), "configuration");
      std::vector<float> summaries(std::size_t(step.summary_floats(p)));
      const std::int32_t width = step.table_width(p);
      std::vector<std::int32_t> ids(std::size_t(p.index_rows() * width)), count(std::size_t(p.index_rows()));
      std::vector<float> o(h.q.size()), lse(dense_lse.size());
      const skim::index::mutable_block_table table{.ids = ids, .count = count, .width = width};
      const skim::pipeline_args<float, skim::contiguous_kv<float>, float> args{
          .prob = p, .q = q, .kv = kv, .o = skim::strided_view<float>::token_major(o.data(), queries, heads_q, dim),
          .lse = lse, .summaries = summaries, .mode = skim::summaries_mode::build, .selected = table};
      const skim::workspace_buffer ws(step.workspace_bytes(p));
      skim::stage_times stages;
      const double s = median_seconds(runs, [&] { require_ok(step.run(args, ws.span(), &stages), "sparse step"); });
      const quality r = measure(h, p, table, o, lse, dense_o, dense_lse);
      std::printf("%4d %5s%-2d %4d %7.2f%% %6.1f%% %8.1f%% %8.2f%% %8.1e %7.3f s %7.1fx\n", bk, "1/", share,
                  step.selector.dynamic.k, 100 * r.density, 100 * r.needle, 100 * r.recall, 100 * r.coverage, r.error,
                  s, dense_s / s);
      if (exactness < 0) {
        // The executor reads exactly the chosen blocks: compare with the double-precision reference.
        std::vector<float> ref(o.size());
        const skim::attention_args<float, skim::contiguous_kv<float>, skim::index::block_table, float> ref_args{
            .prob = p, .q = q, .kv = kv, .index = table,
            .o = skim::strided_view<float>::token_major(ref.data(), queries, heads_q, dim)};
        require_ok(skim::exec::reference{}.run(ref_args, {}), "reference");
        exactness = relative_error(o, ref);
        std::printf("     stages of this step: summarize %.4f s, score %.4f s, select %.4f s, execute %.4f s\n",
                    stages.summarize, stages.score, stages.select, stages.execute);
      }
    }
  }
  std::printf("\nexecutor vs double-precision reference over the same blocks: relative error %.1e (fp32 rounding)\n",
              exactness);
  std::printf("'needle' is what routing must find: a query block that misses its needle block loses the\n"
              "answer it was looking for, whatever its coverage. Time includes every stage.\n"
              "multi_centroid scores a block by the better of its two cluster means: over blocks of %d keys (the\n"
              "default) a needle keeps a cluster of its own; over larger blocks it is averaged with random keys\n"
              "and lost (summarize::max_bound keeps it there, at a cost in perplexity on a real model).\n",
              skim::defaults::block_kv);
  return 0;
}
