// skim::decode_step against the pipeline it packages: at every step of growing sequences, the same
// selected ids and the same output bits as sparse_attention built from scratch over the same keys;
// dense output at a budget that covers every block; no allocation after plan(); bad calls refused.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "skim/decode_step.hpp"
#include "skim/exec/cpu/reference.hpp"
#include "skim/exec/cpu/scalar.hpp"
#include "skim/index/causal_all.hpp"
#include "support/allocation_counter.hpp"
#include "support/random_case.hpp"
#include "support/seed.hpp"

namespace {

using namespace skim;
using step_t = decode_step<exec::scalar>;

struct sequence_data {
  std::vector<float> k, v;  // [max_len, heads_kv, head_dim]
};

struct fixture {
  decode_step_config c;
  std::vector<sequence_data> seqs;
  std::vector<float> q;  // one token's queries, redrawn per step

  fixture(std::mt19937& rng, std::int32_t top_k) {
    const std::int32_t group = test::uniform(rng, 1, 4);
    c.heads_kv = test::uniform(rng, 1, 2);
    c.heads_q = c.heads_kv * group;
    c.head_dim = test::chance(rng, 0.5) ? 64 : test::uniform(rng, 5, 40);
    c.block_kv = test::chance(rng, 0.5) ? defaults::block_kv : test::uniform(rng, 1, 9);
    c.max_seqlen_kv = test::uniform(rng, 40, 160);
    c.sequences = test::uniform(rng, 1, 3);
    c.top_k = top_k;
    c.local_blocks = test::uniform(rng, 0, 3);
    c.sink_blocks = test::uniform(rng, 0, 2);
    const std::size_t n = static_cast<std::size_t>(c.max_seqlen_kv) * c.heads_kv * c.head_dim;
    for (std::int32_t s = 0; s < c.sequences; ++s) {
      sequence_data d{std::vector<float>(n), std::vector<float>(n)};
      test::fill_normal(rng, d.k);
      test::fill_normal(rng, d.v);
      seqs.push_back(std::move(d));
    }
    q.resize(static_cast<std::size_t>(c.heads_q) * c.head_dim);
  }
  [[nodiscard]] contiguous_kv<float> kv(std::int32_t s, std::int32_t n) const {
    return {.k = strided_view<const float>::token_major(seqs[s].k.data(), n, c.heads_kv, c.head_dim),
            .v = strided_view<const float>::token_major(seqs[s].v.data(), n, c.heads_kv, c.head_dim)};
  }
};

// The pipeline over the same one-token problem, summaries built from all n keys.
struct expected {
  std::vector<float> o;
  std::vector<std::int32_t> ids, count;
  std::int32_t width = 0;
};
expected pipeline_from_scratch(const step_t& step, const fixture& f, std::int32_t s, std::int32_t n) {
  const decode_step_config& c = f.c;
  const std::int32_t cu_q[2] = {0, 1}, cu_kv[2] = {0, n};
  const problem p{.heads_q = c.heads_q, .heads_kv = c.heads_kv, .head_dim = c.head_dim, .block_q = 1,
                  .block_kv = c.block_kv, .mask = mask_kind::causal, .cu_seqlens_q = cu_q, .cu_seqlens_kv = cu_kv,
                  .scope = defaults::scope};
  const step_t::pipeline& pipe = step.stages();
  expected e;
  e.width = step.selected(s).width;
  e.o.resize(f.q.size());
  e.ids.resize(static_cast<std::size_t>(p.index_rows() * e.width));
  e.count.resize(static_cast<std::size_t>(p.index_rows()));
  std::vector<float> summaries(static_cast<std::size_t>(pipe.summary_floats(p)));
  const pipeline_args<float, contiguous_kv<float>, float> a{
      .prob = p,
      .q = strided_view<const float>::token_major(f.q.data(), 1, c.heads_q, c.head_dim),
      .kv = f.kv(s, n),
      .o = strided_view<float>::token_major(e.o.data(), 1, c.heads_q, c.head_dim),
      .summaries = summaries,
      .mode = summaries_mode::build,
      .selected = {.ids = e.ids, .count = e.count, .width = e.width}};
  const workspace_buffer ws(pipe.workspace_bytes(p));
  REQUIRE(pipe.run(a, ws.span()).ok());
  return e;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("decode_step: every step selects and attends as the pipeline built from scratch") {
  for (int trial = 0; trial < 12; ++trial) {
    const std::uint32_t seed = test::next_seed();
    std::mt19937 rng(seed);
    fixture f(rng, test::uniform(rng, 0, 6));
    const decode_step_config& c = f.c;
    INFO("trial ", trial, " (seed ", seed, "): heads ", c.heads_q, "/", c.heads_kv, ", d ", c.head_dim, ", bk ", c.block_kv,
         ", max ", c.max_seqlen_kv, ", top_k ", c.top_k, ", sink ", c.sink_blocks, ", local ", c.local_blocks);
    step_t step;
    REQUIRE(step.plan(c).ok());
    std::vector<std::int32_t> len(static_cast<std::size_t>(c.sequences));
    for (std::int32_t s = 0; s < c.sequences; ++s) {
      len[s] = test::uniform(rng, 0, c.max_seqlen_kv / 2);
      REQUIRE(step.prefill(s, f.kv(s, len[s]), len[s]).ok());
    }
    std::vector<float> o(f.q.size());
    for (int t = 0; t < 40; ++t) {
      const std::int32_t s = test::uniform(rng, 0, c.sequences - 1);  // sequences interleave
      if (len[s] == c.max_seqlen_kv) continue;
      const std::int32_t n = ++len[s];
      test::fill_normal(rng, f.q);
      INFO("sequence ", s, " at ", n, " keys");
      const std::int32_t view = test::chance(rng, 0.5) ? n : c.max_seqlen_kv;  // exact, or the whole cache
      const status st = step.run(s, std::span<const float>(f.q), f.kv(s, view), n, std::span<float>(o));
      REQUIRE_MESSAGE(st.ok(), st.message());
      const expected e = pipeline_from_scratch(step, f, s, n);
      const index::block_table got = step.selected(s);
      CHECK(std::vector<std::int32_t>(got.count.begin(), got.count.end()) == e.count);
      CHECK(std::vector<std::int32_t>(got.ids.begin(), got.ids.end()) == e.ids);
      CHECK(same_bits(o, e.o));
    }
  }
}

TEST_CASE("decode_step: a budget over every block gives dense attention, without allocating") {
  std::mt19937 rng(7);
  fixture f(rng, 1 << 20);
  const decode_step_config& c = f.c;
  step_t step;
  REQUIRE(step.plan(c).ok());
  const std::int32_t n0 = c.max_seqlen_kv - 8;
  REQUIRE(step.prefill(0, f.kv(0, n0), n0).ok());
  std::vector<float> o(f.q.size()), dense(f.q.size());
  for (std::int32_t n = n0 + 1; n <= c.max_seqlen_kv; ++n) {
    test::fill_normal(rng, f.q);
    test::allocation_counter counter;
    REQUIRE(step.run(0, std::span<const float>(f.q), f.kv(0, n), n, std::span<float>(o)).ok());
    CHECK(counter.stop() == 0);
    const std::int32_t cu_q[2] = {0, 1}, cu_kv[2] = {0, n};
    const problem p{.heads_q = c.heads_q, .heads_kv = c.heads_kv, .head_dim = c.head_dim, .block_q = 1,
                    .block_kv = c.block_kv, .mask = mask_kind::causal, .cu_seqlens_q = cu_q, .cu_seqlens_kv = cu_kv};
    const attention_args<float, contiguous_kv<float>, index::causal_all, float> a{
        .prob = p, .q = strided_view<const float>::token_major(f.q.data(), 1, c.heads_q, c.head_dim),
        .kv = f.kv(0, n), .index = {}, .o = strided_view<float>::token_major(dense.data(), 1, c.heads_q, c.head_dim)};
    REQUIRE(exec::reference{}.run(a, {}).ok());
    for (std::size_t i = 0; i < o.size(); ++i) CHECK(o[i] == doctest::Approx(dense[i]).epsilon(1e-5));
  }
}

TEST_CASE("decode_step: bad calls get a status naming the value") {
  std::mt19937 rng(11);
  fixture f(rng, 4);
  step_t step;
  std::vector<float> o(f.q.size());
  const auto run = [&](std::int32_t s, std::int32_t n) {
    return step.run(s, std::span<const float>(f.q), f.kv(0, std::max(n, 1)), n, std::span<float>(o));
  };
  CHECK(run(0, 1).code() == status_code::invalid_argument);  // before plan()
  decode_step_config bad = f.c;
  bad.sequences = 0;
  CHECK(step.plan(bad).code() == status_code::invalid_argument);
  bad = f.c;
  bad.top_k = -1;
  CHECK(step.plan(bad).code() == status_code::invalid_argument);
  REQUIRE(step.plan(f.c).ok());
  CHECK(run(f.c.sequences, 1).code() == status_code::invalid_argument);  // no such slot
  CHECK(run(-1, 1).code() == status_code::invalid_argument);
  CHECK(run(0, f.c.max_seqlen_kv + 1).code() == status_code::invalid_argument);
  REQUIRE(step.prefill(0, f.kv(0, 10), 10).ok());
  const status skipped = run(0, 12);  // key 10 never appended
  CHECK(skipped.code() == status_code::invalid_argument);
  CHECK(std::string(skipped.message()).find("10 keys") != std::string::npos);
  CHECK(run(0, 11).ok());
  CHECK(run(0, 11).code() == status_code::invalid_argument);  // a replay would append key 10 twice
  std::vector<float> short_o(o.size() - 1);
  CHECK(step.run(0, std::span<const float>(f.q), f.kv(0, 12), 12, std::span<float>(short_o)).code() ==
        status_code::shape_mismatch);
  step.reset(0);
  CHECK(step.summarized(0) == 0);
  CHECK(run(0, 1).ok());
}
