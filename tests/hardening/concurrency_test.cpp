// Concurrency: what skim documents as shareable between threads, shared by 2-8 threads at once,
// each on its own random problem with its own workspace and outputs, gives bit for bit what the same
// calls give on one thread.
//
//  - exec::simd (prefill units, decode units, decode rows split into chunks, fused kv heads) and
//    exec::scalar are const values without state of their own (docs/design.md §11): every thread
//    calls the same executor objects, run(args, ws) and run(args, ws, threads).
//  - sparse_attention::run is const: one pipeline object (one selection per head, and share_heads),
//    with summaries, table and workspace per thread.
//  - decode_step: "distinct sequences may run on distinct threads at once" (decode_step.hpp): one
//    planned object, one sequence per thread, every step's O and selected ids.
//  - exec::simd's work items (prepare, run_items with a slot per worker) driven by a pool that is
//    not skim's (N std::threads pulling shuffled ranges of items), and skim::parallel_for called
//    from several threads at once.
// Workers only compute and store; the checks run on the main thread after the join (doctest's
// assertions are not thread-safe). scripts/test also builds this file under ThreadSanitizer
// (skim_tsan_tests), where an unsynchronised access fails the run even when the bits agree.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <xsimd/xsimd.hpp>

#include "skim/core/attention_args.hpp"
#include "skim/core/parallel.hpp"
#include "skim/decode_step.hpp"
#include "skim/exec/cpu/scalar.hpp"
#include "skim/exec/cpu/simd.hpp"
#include "skim/index/causal_all.hpp"
#include "skim/pipeline.hpp"
#include "skim/route/pooled_router.hpp"
#include "skim/select/reserved.hpp"
#include "skim/select/top_k.hpp"
#include "skim/summarize/max_bound.hpp"
#include "support/executor_cases.hpp"
#include "support/random_case.hpp"
#include "support/seed.hpp"

using namespace skim;
using namespace skim::test;

namespace {

using simd_t = exec::simd<xsimd::default_arch>;

// Runs f(i) for i in [0, n) on n std::threads; each waits until all have started, so the calls overlap.
template <class F>
void on_threads(int n, F&& f) {
  std::atomic<int> started{0};
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    pool.emplace_back([&, i] {
      started.fetch_add(1);
      while (started.load() < n) std::this_thread::yield();
      f(i);
    });
  }
  for (std::thread& t : pool) t.join();
}

template <class T>
[[nodiscard]] bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// Some element is finite and non-zero, and not every element is the same: the call computed something.
[[nodiscard]] bool varied(const std::vector<float>& x) {
  const bool some = std::any_of(x.begin(), x.end(), [](float v) { return std::isfinite(v) && v != 0.0f; });
  return some && std::adjacent_find(x.begin(), x.end(), [](float a, float b) { return a != b; }) != x.end();
}

// One random problem for the executors: its Q/K/V (contiguous or paged), and its index (a random
// CSR selection, or causal_all: head-invariant, so exec::simd runs its decode units fused).
struct executor_task {
  random_case<float, float> c;
  csr_storage csr;
  bool use_csr = true;
  std::string what;
};

// Task i's shape: prefill (random_spec's mix: partial blocks, GQA, varlen with empty sequences),
// decode (at most 4 queries per sequence, rows long enough to split into chunks at a small
// decode_chunk_keys), or fused decode (causal_all over two kv heads: exec::simd runs the kv heads
// of a query block in one item).
enum class shape : int { prefill, decode, fused_decode };
[[nodiscard]] shape shape_of(int i) {
  return i % 2 == 1 ? shape::prefill : i % 4 == 0 ? shape::decode : shape::fused_decode;
}

executor_task make_task(std::mt19937& rng, shape kind) {
  const bool decode = kind != shape::prefill;
  case_spec s;
  if (decode) {
    s.heads_kv = kind == shape::fused_decode ? 2 : uniform(rng, 1, 2);
    s.heads_q = s.heads_kv * pick(rng, {1, 4, 8});
    s.head_dim = pick(rng, {8, 13, 33, 64, 128});
    s.block_q = uniform(rng, 1, 4);
    s.block_kv = pick(rng, {1, 4, 7, 16, 32});
    s.mask = chance(rng, 0.8) ? mask_kind::causal : mask_kind::none;
    s.scope = chance(rng, 0.75) ? index_scope::kv_head : index_scope::query_head;
    s.seqs.clear();
    const std::int32_t batch = uniform(rng, 1, 4);
    for (std::int32_t b = 0; b < batch; ++b) s.seqs.push_back({uniform(rng, 1, 4), uniform(rng, 1, 1500)});
    s.paged = chance(rng, 0.5);
    s.page_size = pick(rng, {3, 16, 17});
  } else {
    s = random_spec(rng, 3e6);
  }
  executor_task t{random_case<float, float>(s, rng), {}, kind != shape::fused_decode && chance(rng, 0.8), {}};
  const double density = pick(rng, {0.1, 0.5, 1.0});
  if (t.use_csr) t.csr = random_selection(t.c.prob(), rng, density);
  t.what = std::string(kind == shape::prefill ? "prefill " : kind == shape::decode ? "decode " : "fused decode ") +
           s.describe() +
           (t.use_csr ? " csr " + std::to_string(density) : std::string(" causal_all"));
  return t;
}

// What one call left: its status and every output bit.
struct result {
  bool ok = false;
  std::string message;
  std::vector<float> o, lse;
};

// Calls f(args) with the task's attention_args over `out` (the K/V storage and the index the task asks for).
template <class F>
void with_args(const executor_task& t, output<float>& out, F&& f) {
  const problem p = t.c.prob();
  t.c.with_kv([&](const auto& kv) {
    const auto go = [&](const auto& index) {
      using KV = std::remove_cvref_t<decltype(kv)>;
      using Index = std::remove_cvref_t<decltype(index)>;
      f(attention_args<float, KV, Index, float>{
          .prob = p, .q = t.c.q_view(), .kv = kv, .index = index, .o = out.view, .lse = out.lse});
    };
    if (t.use_csr) {
      go(t.csr.view());
    } else {
      go(index::causal_all{});
    }
  });
}

// The executor calls each task is run through.
enum class call : int { scalar, simd, simd_threads, count };
constexpr std::int32_t inner_threads = 3;  // run(args, ws, threads): parallel_for inside each caller

result run_call(const exec::scalar& scalar, const simd_t& simd, const executor_task& t, call which) {
  output<float> out(t.c.spec, t.c.tokens_q());
  status st;
  with_args(t, out, [&](const auto& a) {
    if (which == call::scalar) {
      aligned_workspace ws(scalar.workspace_bytes(a.prob));
      st = scalar.run(a, ws.bytes);
    } else if (which == call::simd) {
      aligned_workspace ws(simd.workspace_bytes(a.prob));
      st = simd.run(a, ws.bytes);
    } else {
      aligned_workspace ws(simd.workspace_bytes(a.prob, inner_threads));
      st = simd.run(a, ws.bytes, inner_threads);
    }
  });
  return {st.ok(), st.message(), std::move(out.o), std::move(out.lse)};
}

}  // namespace

TEST_CASE("concurrency: threads sharing exec::simd and exec::scalar get the single-threaded bits") {
  const std::uint32_t seed = next_seed();
  INFO("seed ", seed);
  std::mt19937 rng(seed);
  const exec::scalar scalar;
  const simd_t simd{.decode_chunk_keys = 64};  // long decode rows split into many chunks
  std::vector<executor_task> tasks;
  for (int i = 0; i < 16; ++i) tasks.push_back(make_task(rng, shape_of(i)));
  constexpr auto calls = static_cast<std::size_t>(call::count);

  // Call j is executor j / tasks on task j % tasks. Alone, one call after another:
  const std::size_t n = tasks.size();
  std::vector<result> want(calls * n);
  int computed = 0;
  for (std::size_t j = 0; j < want.size(); ++j) {
    want[j] = run_call(scalar, simd, tasks[j % n], static_cast<call>(j / n));
    INFO(tasks[j % n].what, ", call ", j / n);
    REQUIRE_MESSAGE(want[j].ok, want[j].message);
    computed += varied(want[j].o);
  }
  CHECK(computed >= static_cast<int>(want.size()) / 2);

  // Every call again, spread round-robin over the threads: the threads run the same executor's
  // method at the same time, each on another task, through the same executor object.
  for (const int threads : {2, uniform(rng, 3, 7), 8}) {
    INFO(threads, " threads");
    std::vector<result> got(want.size());
    on_threads(threads, [&](int w) {
      for (std::size_t j = static_cast<std::size_t>(w); j < got.size(); j += static_cast<std::size_t>(threads)) {
        got[j] = run_call(scalar, simd, tasks[j % n], static_cast<call>(j / n));
      }
    });
    for (std::size_t j = 0; j < want.size(); ++j) {
      INFO(tasks[j % n].what, ", call ", j / n);
      CHECK_MESSAGE(got[j].ok, got[j].message);
      CHECK(same_bits(got[j].o, want[j].o));
      CHECK(same_bits(got[j].lse, want[j].lse));
    }
  }
}

TEST_CASE("concurrency: exec::simd's work items on a foreign thread pool equal run() on one thread") {
  const std::uint32_t seed = next_seed();
  INFO("seed ", seed);
  std::mt19937 rng(seed);
  const simd_t simd{.decode_chunk_keys = 32};
  for (int i = 0; i < 8; ++i) {
    const executor_task t = make_task(rng, shape_of(i));
    INFO(t.what);
    const result want = run_call(exec::scalar{}, simd, t, call::simd);
    REQUIRE_MESSAGE(want.ok, want.message);
    const std::int64_t items = simd.item_count(t.c.prob());

    // The pool: N workers, worker w runs with slot w, each pulling the next range of a shuffled
    // list of item ranges (items run in any order, on any thread, each once).
    const int workers = uniform(rng, 2, 8);
    std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
    for (std::int64_t first = 0; first < items;) {
      const std::int64_t last = std::min(items, first + uniform(rng, 1, 5));
      ranges.emplace_back(first, last);
      first = last;
    }
    std::shuffle(ranges.begin(), ranges.end(), rng);
    INFO(workers, " workers, ", items, " items in ", ranges.size(), " ranges");

    output<float> out(t.c.spec, t.c.tokens_q());
    std::vector<status> statuses(static_cast<std::size_t>(workers));
    status prepared;
    with_args(t, out, [&](const auto& a) {
      aligned_workspace ws(simd.workspace_bytes(a.prob, workers));
      prepared = simd.prepare(a, ws.bytes, workers);
      if (!prepared.ok()) return;
      std::atomic<std::size_t> next{0};
      on_threads(workers, [&](int w) {
        status& st = statuses[static_cast<std::size_t>(w)];
        for (std::size_t r = next.fetch_add(1); r < ranges.size() && st.ok(); r = next.fetch_add(1)) {
          st = simd.run_items(a, ws.bytes, ranges[r].first, ranges[r].second, w);
        }
      });
    });
    REQUIRE_MESSAGE(prepared.ok(), prepared.message());
    for (const status& st : statuses) CHECK_MESSAGE(st.ok(), st.message());
    CHECK(same_bits(out.o, want.o));
    CHECK(same_bits(out.lse, want.lse));
  }
}

TEST_CASE("concurrency: parallel_for called from several threads at once runs each call's items once") {
  const std::uint32_t seed = next_seed();
  INFO("seed ", seed);
  std::mt19937 rng(seed);
  const int callers = uniform(rng, 2, 8);
  std::vector<std::int64_t> n(static_cast<std::size_t>(callers));
  std::vector<std::int32_t> threads(n.size());
  for (std::size_t c = 0; c < n.size(); ++c) {
    n[c] = uniform(rng, 50, 400);
    threads[c] = uniform(rng, 1, 6);
  }
  // Item i of caller c: a value of (c, i) alone, summed into a per-item slot so a repeat shows.
  const auto value = [](std::size_t c, std::int64_t i) {
    std::uint64_t x = (static_cast<std::uint64_t>(c) << 32) + static_cast<std::uint64_t>(i) + 0x9e3779b97f4a7c15ull;
    for (int r = 0; r < 4; ++r) x = (x ^ (x >> 31)) * 0xbf58476d1ce4e5b9ull;
    return x;
  };
  std::vector<std::vector<std::uint64_t>> want(n.size()), got(n.size());
  for (std::size_t c = 0; c < n.size(); ++c) {
    want[c].assign(static_cast<std::size_t>(n[c]), 0);
    for (std::int64_t i = 0; i < n[c]; ++i) want[c][static_cast<std::size_t>(i)] = value(c, i);
    got[c].assign(want[c].size(), 0);
  }
  on_threads(callers, [&](int w) {
    const auto c = static_cast<std::size_t>(w);
    parallel_for(n[c], threads[c], [&](std::int32_t, std::int64_t first, std::int64_t) {
      got[c][static_cast<std::size_t>(first)] += value(c, first);  // each item is its own element
    });
  });
  for (std::size_t c = 0; c < n.size(); ++c) {
    INFO("caller ", c, ": ", n[c], " items on ", threads[c], " threads");
    CHECK(got[c] == want[c]);
  }
}

namespace {

using pipeline_t =
    sparse_attention<summarize::max_bound, route::pooled_router, select::reserved<select::top_k>, simd_t>;

// Everything one pipeline call writes.
struct pipeline_result {
  bool ok = false;
  std::string message;
  std::vector<float> o, lse, summaries;
  std::vector<std::int32_t> ids, count;
};

pipeline_result run_pipeline(const pipeline_t& pipe, const executor_task& t) {
  const problem p = t.c.prob();
  output<float> out(t.c.spec, t.c.tokens_q());
  pipeline_result r;
  r.summaries.assign(static_cast<std::size_t>(pipe.summary_floats(p)), 7.0f);
  const std::int32_t width = pipe.table_width(p);
  r.ids.assign(static_cast<std::size_t>(pipe.selected_rows(p) * width), -5);
  r.count.assign(static_cast<std::size_t>(pipe.selected_rows(p)), -5);
  aligned_workspace ws(pipe.workspace_bytes(p));
  status st;
  t.c.with_kv([&](const auto& kv) {
    using KV = std::remove_cvref_t<decltype(kv)>;
    st = pipe.run(pipeline_args<float, KV, float>{.prob = p, .q = t.c.q_view(), .kv = kv, .o = out.view,
                                                  .lse = out.lse, .summaries = r.summaries,
                                                  .mode = summaries_mode::build,
                                                  .selected = {.ids = r.ids, .count = r.count, .width = width}},
                  ws.bytes);
  });
  r.ok = st.ok();
  r.message = st.message();
  r.o = std::move(out.o);
  r.lse = std::move(out.lse);
  return r;
}

[[nodiscard]] bool same(const pipeline_result& a, const pipeline_result& b) {
  return same_bits(a.o, b.o) && same_bits(a.lse, b.lse) && same_bits(a.summaries, b.summaries) && a.ids == b.ids &&
         a.count == b.count;
}

}  // namespace

TEST_CASE("concurrency: threads sharing one sparse_attention pipeline get the single-threaded bits") {
  const std::uint32_t seed = next_seed();
  INFO("seed ", seed);
  std::mt19937 rng(seed);
  pipeline_t per_head, shared_heads;
  per_head.executor.decode_chunk_keys = 64;
  per_head.router = {
      .pool = pick(rng, {route::query_pool::last, route::query_pool::mean, route::query_pool::max}),
      .reduce = pick(rng, {route::group_reduce::max, route::group_reduce::mean, route::group_reduce::sum})};
  per_head.selector = {.sink = uniform(rng, 0, 2), .local = uniform(rng, 0, 2), .recency = chance(rng, 0.5),
                       .dynamic = {.k = uniform(rng, 1, 6)}};
  shared_heads = per_head;
  shared_heads.share_heads = true;
  const pipeline_t* const pipes[] = {&per_head, &shared_heads};

  std::vector<executor_task> tasks;
  for (int i = 0; i < 8; ++i) {
    executor_task t = make_task(rng, shape_of(i));
    t.c.spec.softmax_scale = 0.0f;  // routers need a positive scale: the default one
    tasks.push_back(std::move(t));
  }
  std::vector<pipeline_result> want(2 * tasks.size());
  int computed = 0;
  for (std::size_t j = 0; j < want.size(); ++j) {
    want[j] = run_pipeline(*pipes[j % 2], tasks[j / 2]);
    INFO(tasks[j / 2].what, j % 2 == 1 ? ", share_heads" : "");
    REQUIRE_MESSAGE(want[j].ok, want[j].message);
    computed += varied(want[j].o);
  }
  CHECK(computed >= static_cast<int>(want.size()) / 2);

  const int threads = uniform(rng, 2, 8);
  INFO(threads, " threads");
  std::vector<pipeline_result> got(want.size());
  on_threads(threads, [&](int w) {
    for (std::size_t j = static_cast<std::size_t>(w); j < got.size(); j += static_cast<std::size_t>(threads)) {
      got[j] = run_pipeline(*pipes[j % 2], tasks[j / 2]);
    }
  });
  for (std::size_t j = 0; j < want.size(); ++j) {
    INFO(tasks[j / 2].what, j % 2 == 1 ? ", share_heads" : "");
    CHECK_MESSAGE(got[j].ok, got[j].message);
    CHECK(same(got[j], want[j]));
  }
}

namespace {

using step_t = decode_step<simd_t>;

// One sequence's decode: its K/V cache, its prefill length and one query per step.
struct sequence_script {
  std::vector<float> k, v;             // [max_seqlen_kv, heads_kv, head_dim]
  std::int32_t prefill = 0;
  std::vector<std::vector<float>> q;   // per step: [heads_q, head_dim]
};

// What every step of one sequence left: statuses, O and the selected table.
struct sequence_result {
  std::vector<std::string> errors;
  std::vector<float> o;                // the steps' outputs, one after another
  std::vector<std::int32_t> ids, count;
};

void run_sequence(step_t& step, std::int32_t seq, const sequence_script& s, sequence_result& r) {
  const decode_step_config& c = step.config();
  const auto kv = [&](std::int32_t n) {
    return contiguous_kv<float>{.k = strided_view<const float>::token_major(s.k.data(), n, c.heads_kv, c.head_dim),
                                .v = strided_view<const float>::token_major(s.v.data(), n, c.heads_kv, c.head_dim)};
  };
  if (const status st = step.prefill(seq, kv(s.prefill), s.prefill); !st.ok()) r.errors.emplace_back(st.message());
  std::vector<float> o(static_cast<std::size_t>(c.heads_q) * static_cast<std::size_t>(c.head_dim));
  std::int32_t n = s.prefill;
  for (const std::vector<float>& q : s.q) {
    ++n;
    if (const status st = step.run(seq, std::span<const float>(q), kv(n), n, std::span<float>(o)); !st.ok()) {
      r.errors.emplace_back(st.message());
    }
    r.o.insert(r.o.end(), o.begin(), o.end());
    const index::block_table sel = step.selected(seq);
    r.ids.insert(r.ids.end(), sel.ids.begin(), sel.ids.end());
    r.count.insert(r.count.end(), sel.count.begin(), sel.count.end());
  }
}

}  // namespace

TEST_CASE("concurrency: decode_step runs distinct sequences on distinct threads as it runs them in turn") {
  const std::uint32_t seed = next_seed();
  INFO("seed ", seed);
  std::mt19937 rng(seed);
  const int threads = uniform(rng, 2, 8);
  decode_step_config c;
  c.heads_kv = uniform(rng, 1, 2);
  c.heads_q = c.heads_kv * pick(rng, {1, 2, 4});
  c.head_dim = pick(rng, {16, 33, 64});
  c.block_kv = pick(rng, {defaults::block_kv, 3, 8});
  c.max_seqlen_kv = uniform(rng, 80, 240);
  c.sequences = threads;
  c.top_k = uniform(rng, 1, 6);
  c.sink_blocks = uniform(rng, 0, 2);
  c.local_blocks = uniform(rng, 0, 3);
  INFO(threads, " threads, heads ", c.heads_q, "/", c.heads_kv, ", d ", c.head_dim, ", bk ", c.block_kv, ", max ",
       c.max_seqlen_kv, ", top_k ", c.top_k);

  std::vector<sequence_script> scripts(static_cast<std::size_t>(threads));
  const std::size_t cache = static_cast<std::size_t>(c.max_seqlen_kv) * c.heads_kv * c.head_dim;
  for (sequence_script& s : scripts) {
    s.k.resize(cache);
    s.v.resize(cache);
    fill_normal(rng, s.k);
    fill_normal(rng, s.v);
    s.prefill = uniform(rng, 0, c.max_seqlen_kv / 2);
    s.q.resize(static_cast<std::size_t>(std::min(24, c.max_seqlen_kv - s.prefill)));
    for (std::vector<float>& q : s.q) {
      q.resize(static_cast<std::size_t>(c.heads_q) * c.head_dim);
      fill_normal(rng, q);
    }
  }
  const simd_t executor{.decode_chunk_keys = 32};  // rows past 32 keys split into chunks

  step_t alone(executor);
  REQUIRE(alone.plan(c).ok());
  std::vector<sequence_result> want(scripts.size());
  for (std::size_t s = 0; s < scripts.size(); ++s) {
    run_sequence(alone, static_cast<std::int32_t>(s), scripts[s], want[s]);
  }

  step_t shared(executor);
  REQUIRE(shared.plan(c).ok());
  std::vector<sequence_result> got(scripts.size());
  on_threads(threads, [&](int w) {
    const auto s = static_cast<std::size_t>(w);
    run_sequence(shared, w, scripts[s], got[s]);
  });

  for (std::size_t s = 0; s < scripts.size(); ++s) {
    INFO("sequence ", s, ": prefill ", scripts[s].prefill, ", ", scripts[s].q.size(), " steps");
    CHECK(want[s].errors.empty());
    CHECK(got[s].errors.empty());
    CHECK(varied(want[s].o));
    CHECK(same_bits(got[s].o, want[s].o));
    CHECK(got[s].ids == want[s].ids);
    CHECK(got[s].count == want[s].count);
  }
}
