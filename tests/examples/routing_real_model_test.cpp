// Routing on real attention: the stories260K checkpoint's own Q, K (after RoPE) and V over 512
// tokens of TinyStories text, routed by skim's pipeline and measured by skim::metrics against
// dense attention.
#include <doctest/doctest.h>

#include <cstdio>
#include <vector>

#include "../../examples/llama/forward.hpp"
#include "examples/real_model.hpp"
#include "skim/exec/cpu/scalar.hpp"
#include "skim/metrics/quality.hpp"
#include "skim/pipeline.hpp"
#include "skim/route/pooled_router.hpp"
#include "skim/select/reserved.hpp"
#include "skim/select/top_k.hpp"
#include "skim/summarize/max_bound.hpp"
#include "skim/summarize/mean_pool.hpp"
#include "skim/summarize/multi_centroid.hpp"
#include "skim/summarize/probe_max.hpp"

using namespace skim;
using namespace skim::test::real;

namespace {

constexpr int tokens = 512;   // the model's trained context
constexpr int min_position = 128;

// Each layer's Q [tokens, 8, 8], K and V [tokens, 4, 8], captured during one prefill.
struct layer_qkv {
  std::vector<float> q, k, v;
};

const std::vector<layer_qkv>& real_qkv() {
  static const std::vector<layer_qkv>* layers = [] {
    const auto& [m, tok] = real_model();
    std::vector<int> ids = tok.encode(read_text(models_dir() / "tinystories_more.txt"));
    REQUIRE(ids.size() >= static_cast<std::size_t>(tokens));
    ids.resize(tokens);
    auto* out = new std::vector<layer_qkv>(static_cast<std::size_t>(m.cfg.n_layers));
    skim_llama::forward_options opt;
    opt.on_qkv = [&](const skim_llama::qkv_view& x) {
      (*out)[static_cast<std::size_t>(x.layer)] = {{x.q.begin(), x.q.end()}, {x.k.begin(), x.k.end()}, {x.v.begin(), x.v.end()}};
    };
    skim_llama::kv_cache cache(m.cfg, tokens);
    std::vector<float> logits(static_cast<std::size_t>(tokens) * m.cfg.vocab_size);
    REQUIRE(skim_llama::forward(m, cache, ids, logits, opt).ok());
    return out;
  }();
  return *layers;
}

// Mean coverage and mean error over all layers, heads and queries at positions >= min_position,
// of the pipeline `S` with 16-key blocks, one query per row, the query's own block kept (recency)
// plus the top `k` other blocks by S's score.
template <summarizer S>
std::pair<double, double> coverage_of(std::int32_t k) {
  using pipeline = sparse_attention<S, route::pooled_router, select::reserved<select::top_k>, exec::scalar>;
  const pipeline sparse{.router = {.pool = route::query_pool::last, .reduce = route::group_reduce::max},
                        .selector = {.sink = 0, .local = 0, .recency = true, .dynamic = {.k = k}}};
  const std::int32_t cu[] = {0, tokens};
  const problem p{.heads_q = 8, .heads_kv = 4, .head_dim = 8, .block_q = 1, .block_kv = 16,
                  .cu_seqlens_q = cu, .cu_seqlens_kv = cu, .scope = index_scope::query_head};
  REQUIRE(sparse.can_implement(p).ok());
  std::vector<float> summaries(static_cast<std::size_t>(sparse.summary_floats(p)));
  const std::int32_t width = sparse.table_width(p);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(p.index_rows() * width)), count(p.index_rows());
  workspace_buffer ws(sparse.workspace_bytes(p));
  std::vector<float> o(static_cast<std::size_t>(tokens) * 8 * 8);
  double coverage = 0, error = 0;
  long rows = 0;
  for (const layer_qkv& l : real_qkv()) {
    const auto q = strided_view<const float>::token_major(l.q.data(), tokens, 8, 8);
    const contiguous_kv<float> kv{.k = strided_view<const float>::token_major(l.k.data(), tokens, 4, 8),
                                  .v = strided_view<const float>::token_major(l.v.data(), tokens, 4, 8)};
    const index::mutable_block_table table{.ids = ids, .count = count, .width = width};
    const pipeline_args<float, contiguous_kv<float>, float> a{
        .prob = p, .q = q, .kv = kv, .o = strided_view<float>::token_major(o.data(), tokens, 8, 8),
        .summaries = summaries, .selected = table};
    const status s = sparse.run(a, ws.span());
    REQUIRE_MESSAGE(s.ok(), s.message());
    const std::int32_t recall_at[] = {8};
    REQUIRE(metrics::for_each_query_row(p, q, kv, index::block_table(table), recall_at,
                                        [&](const metrics::query_row& r) {
                                          if (r.query < min_position) return;
                                          coverage += r.coverage;
                                          error += r.error;
                                          ++rows;
                                        })
                .ok());
  }
  REQUIRE(rows == 5L * 8 * (tokens - min_position));
  return {coverage / rows, error / rows};
}

}  // namespace

TEST_CASE("routing on the real checkpoint: own block + top 8 by max_bound covers >= 97% of the attention mass" *
          doctest::skip(model_missing())) {
  const auto [coverage, error] = coverage_of<summarize::max_bound>(8);
  MESSAGE("max_bound, own block + top 8 of 16-key blocks: mean mass coverage ", coverage, ", mean output error ", error);
  CHECK(coverage >= 0.97);
  // A smaller budget must cover less: the measurement can tell budgets apart.
  const auto [coverage_2, error_2] = coverage_of<summarize::max_bound>(2);
  MESSAGE("max_bound, own block + top 2: mean mass coverage ", coverage_2, ", mean output error ", error_2);
  CHECK(coverage_2 < coverage);
  CHECK(error_2 > error);
}

TEST_CASE("routing on the real checkpoint: every summarizer, own block + top 8" * doctest::skip(model_missing())) {
  const auto mean = coverage_of<summarize::mean_pool>(8);
  const auto probes = coverage_of<summarize::probe_max<4>>(8);
  const auto centroids = coverage_of<summarize::multi_centroid<4>>(8);
  MESSAGE("mean_pool coverage ", mean.first, ", probe_max<4> ", probes.first, ", multi_centroid<4> ", centroids.first);
  CHECK(mean.first >= 0.95);  // about the same as max_bound on this model
  CHECK(probes.first >= 0.9);
  CHECK(centroids.first >= 0.9);
}
