#include "skim/pipeline.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "skim/exec/cpu/reference.hpp"
#include "skim/exec/cpu/scalar.hpp"
#include "skim/index/causal_all.hpp"
#include "skim/route/pooled_router.hpp"
#include "skim/select/reserved.hpp"
#include "skim/select/select_all.hpp"
#include "skim/select/threshold.hpp"
#include "skim/select/top_k.hpp"
#include "skim/summarize/max_bound.hpp"
#include "skim/summarize/mean_pool.hpp"
#include "support/allocation_counter.hpp"
#include "support/compare.hpp"
#include "support/random_case.hpp"
#include "support/seed.hpp"

using namespace skim;
using namespace skim::test;

namespace {

using max_bound_topk =
    sparse_attention<summarize::max_bound, route::pooled_router, select::reserved<select::top_k>, exec::scalar>;

// Buffers the pipeline writes: summaries, the selected table, the workspace.
template <class Pipeline>
struct pipeline_buffers {
  std::vector<float> summaries;
  std::vector<std::int32_t> ids, count;
  std::int32_t width = 0;
  aligned_workspace ws;

  pipeline_buffers(const Pipeline& s, const problem& p)
      : summaries(static_cast<std::size_t>(s.summary_floats(p)), 7.0f),
        width(s.table_width(p)),
        ws(s.workspace_bytes(p)) {
    ids.assign(static_cast<std::size_t>(s.selected_rows(p) * width), 99);
    count.assign(static_cast<std::size_t>(s.selected_rows(p)), 99);
  }
  [[nodiscard]] index::mutable_block_table table() { return {.ids = ids, .count = count, .width = width}; }
};

// The pipeline's arguments for case c on K/V source kv: O into o, summaries built, selection into buf.
template <class KV, class Pipeline>
[[nodiscard]] pipeline_args<float, KV, float> args_for(const problem& p, const random_case<float, float>& c,
                                                       const KV& kv, output<float>& o, pipeline_buffers<Pipeline>& buf) {
  return {.prob = p, .q = c.q_view(), .kv = kv, .o = o.view, .lse = o.lse, .summaries = buf.summaries,
          .mode = summaries_mode::build, .selected = buf.table()};
}

max_bound_topk random_pipeline(std::mt19937& rng) {
  max_bound_topk s;
  s.router = {.pool = pick(rng, {route::query_pool::last, route::query_pool::mean, route::query_pool::max}),
              .reduce = pick(rng, {route::group_reduce::max, route::group_reduce::mean, route::group_reduce::sum})};
  s.selector = {.sink = uniform(rng, 0, 2), .local = uniform(rng, 0, 2), .recency = chance(rng, 0.5),
                .dynamic = {.k = uniform(rng, 0, 4)}};
  return s;
}

// 30 random cases, each with a random pipeline (share_heads as given): f(spec, case, problem, pipeline).
template <class F>
void for_each_trial(bool share_heads, F&& f) {
  for (int trial = 0; trial < 30; ++trial) {
    const std::uint32_t seed = next_seed();
    std::mt19937 rng(seed);
    case_spec spec = random_spec(rng, 2e6);
    spec.softmax_scale = 0.0f;  // routers need a positive scale
    const random_case<float, float> c(spec, rng);
    const problem p = c.prob();
    max_bound_topk s = random_pipeline(rng);
    s.share_heads = share_heads;
    INFO("seed ", seed, " ", spec.describe());
    REQUIRE(s.can_implement(p).ok());
    f(spec, c, p, s);
  }
}

}  // namespace

TEST_CASE("pipeline: the selected table is the router's scores through the selector, and O is exact over it") {
  for_each_trial(false, [](const case_spec& spec, const random_case<float, float>& c, const problem& p,
                           const max_bound_topk& s) {
    pipeline_buffers buf(s, p);
    output<float> o(spec, c.tokens_q());
    stage_times times;
    c.with_kv([&](const auto& kv) {
      using kv_t = std::remove_cvref_t<decltype(kv)>;
      const auto a = args_for(p, c, kv, o, buf);
      allocation_counter counter;
      const status st = s.run(a, buf.ws.bytes, &times);
      CHECK(counter.stop() == 0);  // summarize, score, select and execute allocate nothing
      REQUIRE_MESSAGE(st.ok(), st.message());

      // The same stages by hand: build, score every row, select_all.
      std::vector<float> records(buf.summaries.size());
      aligned_workspace sws(summarize::workspace_bytes<summarize::max_bound>(p));
      REQUIRE(summarize::build<summarize::max_bound>(p, kv, records, sws.bytes).ok());
      CHECK(records == buf.summaries);
      std::vector<float> scores(static_cast<std::size_t>(p.index_rows() * p.max_kv_blocks()));
      aligned_workspace rws(s.router.workspace_bytes(p));
      REQUIRE(s.router.score<summarize::max_bound>(p, c.q_view(), records, scores, rws.bytes).ok());
      std::vector<std::int32_t> ids(buf.ids.size()), count(buf.count.size());
      aligned_workspace selws(select::workspace_bytes(s.selector, p));
      const index::mutable_block_table want{.ids = ids, .count = count, .width = buf.width};
      REQUIRE(select::select_all(s.selector, p, {.scores = scores, .score_stride = p.max_kv_blocks()}, want,
                                 selws.bytes)
                  .ok());
      CHECK(count == buf.count);
      CHECK(ids == buf.ids);

      // O against the reference over the table the pipeline executed.
      output<float> ref(spec, c.tokens_q());
      const attention_args<float, kv_t, index::block_table, float> ra{
          .prob = p, .q = c.q_view(), .kv = kv, .index = index::block_table(buf.table()), .o = ref.view, .lse = ref.lse};
      REQUIRE(exec::reference{}.run(ra, {}).ok());
      check(compare(p, o.view, ref.view, std::span<const float>(o.lse), std::span<const float>(ref.lse),
                    output_tolerance<float>));
    });
    CHECK(times.total() >= 0.0);
  });
}

namespace {

// share_heads: the run's selection equals the stages done by hand (every row's scores, relative to
// the row's best finite score under head_pool::relative, the maximum over each query block's heads,
// one selection each on the shared problem), its O the reference's over that selection, and a prior
// is refused.
template <class Pipeline>
void check_share_heads(const case_spec& spec, const random_case<float, float>& c, const problem& p,
                       const Pipeline& s) {
  REQUIRE(s.selected_rows(p) == p.total_q_blocks());
  INFO((s.pool == head_pool::relative ? "relative pool" : "max pool"));

  pipeline_buffers buf(s, p);
  output<float> o(spec, c.tokens_q());
  c.with_kv([&](const auto& kv) {
    using kv_t = std::remove_cvref_t<decltype(kv)>;
    const auto a = args_for(p, c, kv, o, buf);
    allocation_counter counter;
    const status st = s.run(a, buf.ws.bytes);
    CHECK(counter.stop() == 0);
    REQUIRE_MESSAGE(st.ok(), std::string(st.message()));

    // By hand: every row's scores (relative: less the row's best finite one), the maximum over each
    // query block's heads, one selection each.
    const std::int32_t stride = p.max_kv_blocks();
    std::vector<float> scores(static_cast<std::size_t>(p.index_rows() * stride));
    aligned_workspace rws(s.router.workspace_bytes(p));
    REQUIRE(s.router.template score<summarize::max_bound>(p, c.q_view(), buf.summaries, scores, rws.bytes).ok());
    std::vector<float> pooled(static_cast<std::size_t>(p.total_q_blocks() * stride), 0.0f);
    REQUIRE(for_each_row(p, [&](const row_info& r) {
              const auto first = scores.begin() + r.row * stride;
              float best = 0.0f;
              if (s.pool == head_pool::relative) {
                std::vector<float> finite;
                std::copy_if(first, first + r.visible_blocks, std::back_inserter(finite),
                             [](float x) { return std::isfinite(x); });
                if (!finite.empty()) best = *std::max_element(finite.begin(), finite.end());
              }
              for (std::int32_t j = 0; j < r.visible_blocks; ++j) {
                const float x = scores[static_cast<std::size_t>(r.row * stride + j)] - best;
                float& m = pooled[static_cast<std::size_t>(r.row / p.index_heads() * stride + j)];
                m = r.head == 0 || x > m || std::isnan(m) ? x : m;
              }
            }).ok());
    using shared = index::head_shared<index::block_table>;
    const problem one = shared::shared_problem(p);
    std::vector<std::int32_t> ids(buf.ids.size()), count(buf.count.size());
    aligned_workspace selws(select::workspace_bytes(s.selector, one));
    const index::mutable_block_table want{.ids = ids, .count = count, .width = buf.width};
    REQUIRE(select::select_all(s.selector, one, {.scores = pooled, .score_stride = stride}, want, selws.bytes).ok());
    CHECK(count == buf.count);
    CHECK(ids == buf.ids);

    // O against the reference, every head over its query block's row.
    output<float> ref(spec, c.tokens_q());
    const attention_args<float, kv_t, shared, float> ra{
        .prob = p, .q = c.q_view(), .kv = kv,
        .index = shared{.rows = index::block_table(buf.table()), .index_heads = p.index_heads()}, .o = ref.view,
        .lse = ref.lse};
    REQUIRE(exec::reference{}.run(ra, {}).ok());
    check(compare(p, o.view, ref.view, std::span<const float>(o.lse), std::span<const float>(ref.lse),
                  output_tolerance<float>));

    // A prior is per index head: share_heads refuses one.
    if (p.index_rows() * stride > 0) {
      std::vector<float> prior(static_cast<std::size_t>(p.index_rows() * stride), 0.0f);
      auto with_prior = a;
      with_prior.prior = prior;
      CHECK(s.run(with_prior, buf.ws.bytes).code() == status_code::unsupported);
    }
  });
}

}  // namespace

TEST_CASE("pipeline: share_heads selects once per query block on the heads' pooled scores") {
  for_each_trial(true, [](const case_spec& spec, const random_case<float, float>& c, const problem& p,
                          max_bound_topk s) {
    s.pool = spec.head_dim % 2 == 0 ? head_pool::relative : head_pool::max;  // both, over the trials
    check_share_heads(spec, c, p, s);
  });
}

TEST_CASE("pipeline: share_heads with a threshold selector (its tau against the pooled scores)") {
  using max_bound_threshold =
      sparse_attention<summarize::max_bound, route::pooled_router, select::reserved<select::threshold>, exec::scalar>;
  std::mt19937 rng(next_seed());
  for_each_trial(true, [&](const case_spec& spec, const random_case<float, float>& c, const problem& p,
                           const max_bound_topk& topk) {
    max_bound_threshold s;
    s.router = topk.router;
    s.share_heads = true;
    s.pool = chance(rng, 0.7) ? head_pool::relative : head_pool::max;
    select::threshold t;
    t.mode = pick(rng, {select::threshold_mode::absolute, select::threshold_mode::relative, select::threshold_mode::mass});
    t.tau = t.mode == select::threshold_mode::mass ? 0.5f + 0.5f * static_cast<float>(uniform(rng, 0, 10)) / 10.0f
                                                   : static_cast<float>(uniform(rng, 0, 30)) / 10.0f -
                                                         (t.mode == select::threshold_mode::absolute ? 1.5f : 0.0f);
    t.k_min = uniform(rng, 0, 2);
    t.k_max = t.k_min + uniform(rng, 0, 4);
    s.selector = {.sink = topk.selector.sink, .local = topk.selector.local, .recency = topk.selector.recency,
                  .dynamic = t};
    INFO("threshold mode ", static_cast<int>(t.mode), " tau ", t.tau, " k_min ", t.k_min, " k_max ", t.k_max);
    REQUIRE(s.can_implement(p).ok());
    check_share_heads(spec, c, p, s);
  });
}

TEST_CASE("pipeline: a budget that covers every block gives dense attention") {
  std::mt19937 rng(424242u);
  case_spec spec = random_spec(rng, 2e6);
  spec.softmax_scale = 0.0f;
  spec.seqs = {{40, 97}, {0, 5}, {1, 33}};
  const random_case<float, float> c(spec, rng);
  const problem p = c.prob();
  max_bound_topk s;
  s.selector = {.sink = 0, .local = 0, .recency = false, .dynamic = {.k = p.max_kv_blocks()}};
  pipeline_buffers buf(s, p);
  output<float> o(spec, c.tokens_q()), dense(spec, c.tokens_q());
  c.with_kv([&](const auto& kv) {
    using kv_t = std::remove_cvref_t<decltype(kv)>;
    const pipeline_args<float, kv_t, float> a{.prob = p, .q = c.q_view(), .kv = kv, .o = o.view, .lse = o.lse,
                                              .summaries = buf.summaries, .selected = buf.table()};
    REQUIRE(s.run(a, buf.ws.bytes).ok());
    const attention_args<float, kv_t, index::causal_all, float> d{
        .prob = p, .q = c.q_view(), .kv = kv, .index = {}, .o = dense.view, .lse = dense.lse};
    REQUIRE(run_executor(exec::scalar{}, d).ok());
  });
  CHECK(o.o == dense.o);  // same executor, same blocks in the same order: the same bits
  CHECK(o.lse == dense.lse);
}

TEST_CASE("pipeline: decode with append_newest matches a rebuild at every step, without allocating") {
  const std::uint32_t seed = next_seed();
  std::mt19937 rng(seed);
  INFO("seed ", seed);
  // Two sequences decoding together; K/V grow one token per step.
  const std::int32_t heads_q = 8, heads_kv = 2, dim = 24, bk = 8, start = 13, steps = 20;
  std::vector<float> k_all(static_cast<std::size_t>(2 * (start + steps) * heads_kv * dim));
  std::vector<float> v_all(k_all.size()), q_all(static_cast<std::size_t>(2 * steps * heads_q * dim));
  fill_normal(rng, k_all);
  fill_normal(rng, v_all);
  fill_normal(rng, q_all);
  const std::int32_t cap = start + steps;  // tokens per sequence in the [2, cap] K/V storage
  max_bound_topk s;
  s.router = {.pool = route::query_pool::last, .reduce = route::group_reduce::max};
  s.selector = {.sink = 1, .local = 1, .recency = true, .dynamic = {.k = 2}};
  std::vector<float> kept;  // summaries carried across steps, as an engine keeps them
  for (std::int32_t step = 0; step < steps; ++step) {
    const std::int32_t n = start + step + 1;
    // Paged view of the two sequences: one page per sequence, each `cap` tokens long.
    const std::int32_t cu_q[] = {0, 1, 2}, cu_kv[] = {0, n, 2 * n}, indptr[] = {0, 1, 2}, pages[] = {1, 0};
    const problem p{.heads_q = heads_q, .heads_kv = heads_kv, .head_dim = dim, .block_q = 4, .block_kv = bk,
                    .cu_seqlens_q = cu_q, .cu_seqlens_kv = cu_kv};
    const auto kv = paged_kv<float>::packed(k_all.data(), v_all.data(), 2, cap, heads_kv, dim, indptr, pages);
    const auto q = strided_view<const float>::token_major(q_all.data() + step * 2 * heads_q * dim, 2, heads_q, dim);
    std::vector<float> o(static_cast<std::size_t>(2 * heads_q * dim)), o_ref(o.size());
    // The summaries of sequence b live at the batch layout: grow `kept` to this step's layout.
    const std::int64_t floats = s.summary_floats(p);
    if (step == 0) {
      kept.assign(static_cast<std::size_t>(floats), 0.0f);
      const std::int32_t cu_kv0[] = {0, n - 1, 2 * (n - 1)};
      problem p0 = p;
      p0.cu_seqlens_kv = cu_kv0;
      aligned_workspace w0(summarize::workspace_bytes<summarize::max_bound>(p0));
      std::vector<float> first(static_cast<std::size_t>(s.summary_floats(p0)));
      REQUIRE(summarize::build<summarize::max_bound>(p0, kv, first, w0.bytes).ok());
      // Re-lay the prefix's records into this step's layout (sequence 1 starts later when blocks grow).
      const auto l0 = summarize::make_summary_layout<summarize::max_bound>(p0);
      const auto l1 = summarize::make_summary_layout<summarize::max_bound>(p);
      for (std::int32_t b = 0; b < 2; ++b) {
        std::copy_n(first.begin() + l0.sequence_offset(b), l0.sequence_floats(b), kept.begin() + l1.sequence_offset(b));
      }
    } else {
      const std::int32_t cu_prev[] = {0, n - 1, 2 * (n - 1)};
      problem pp = p;
      pp.cu_seqlens_kv = cu_prev;
      const auto lp = summarize::make_summary_layout<summarize::max_bound>(pp);
      const auto l1 = summarize::make_summary_layout<summarize::max_bound>(p);
      std::vector<float> grown(static_cast<std::size_t>(floats), 0.0f);
      for (std::int32_t b = 0; b < 2; ++b) {
        std::copy_n(kept.begin() + lp.sequence_offset(b), lp.sequence_floats(b), grown.begin() + l1.sequence_offset(b));
      }
      kept = grown;
    }
    pipeline_buffers buf(s, p), rebuilt(s, p);
    const pipeline_args<float, paged_kv<float>, float> a{
        .prob = p, .q = q, .kv = kv, .o = strided_view<float>::token_major(o.data(), 2, heads_q, dim),
        .summaries = kept, .mode = summaries_mode::append_newest, .selected = buf.table()};
    {
      allocation_counter counter;
      const status st = s.run(a, buf.ws.bytes);
      CHECK(counter.stop() == 0);
      REQUIRE_MESSAGE(st.ok(), st.message());
    }
    auto b = a;
    b.summaries = rebuilt.summaries;
    b.mode = summaries_mode::build;
    b.selected = rebuilt.table();
    b.o = strided_view<float>::token_major(o_ref.data(), 2, heads_q, dim);
    REQUIRE(s.run(b, rebuilt.ws.bytes).ok());
    INFO("step ", step);
    CHECK(kept == rebuilt.summaries);
    CHECK(buf.count == rebuilt.count);
    CHECK(buf.ids == rebuilt.ids);
    CHECK(o == o_ref);
  }
}

TEST_CASE("pipeline: bad sizes get a status naming them") {
  const std::int32_t cu_q[] = {0, 10}, cu_kv[] = {0, 40};
  const problem p{.heads_q = 2, .heads_kv = 1, .head_dim = 4, .block_q = 4, .block_kv = 8, .cu_seqlens_q = cu_q,
                  .cu_seqlens_kv = cu_kv};
  std::mt19937 rng(5u);
  std::vector<float> q(10 * 2 * 4), k(40 * 4), v(40 * 4), o(q.size());
  fill_normal(rng, q);
  fill_normal(rng, k);
  fill_normal(rng, v);
  max_bound_topk s;
  s.selector = {.sink = 1, .local = 1, .dynamic = {.k = 1}};
  pipeline_buffers buf(s, p);
  pipeline_args<float, contiguous_kv<float>, float> a{
      .prob = p, .q = strided_view<const float>::token_major(q.data(), 10, 2, 4),
      .kv = {.k = strided_view<const float>::token_major(k.data(), 40, 1, 4),
             .v = strided_view<const float>::token_major(v.data(), 40, 1, 4)},
      .o = strided_view<float>::token_major(o.data(), 10, 2, 4), .summaries = buf.summaries, .selected = buf.table()};
  REQUIRE(s.run(a, buf.ws.bytes).ok());
  auto small = a;
  small.summaries = small.summaries.first(3);
  CHECK(std::string_view(s.run(small, buf.ws.bytes).message()) == "summaries has 3 floats, needs 40");
  auto narrow = a;
  narrow.selected.width = 1;
  CHECK(std::string_view(s.run(narrow, buf.ws.bytes).message()) ==
        "selected block_table width 1 < 3 the selector may choose");
  auto bad_selector = s;
  bad_selector.selector.dynamic.k = -2;
  CHECK(std::string_view(bad_selector.run(a, buf.ws.bytes).message()) == "top_k k -2 < 0");
}
