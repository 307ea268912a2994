#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "../../examples/eval/options.hpp"
#include "../../examples/eval/report.hpp"
#include "../../examples/eval/run.hpp"
#include "../../examples/eval/tensors.hpp"

namespace fs = std::filesystem;
using namespace skim_eval;

namespace {

std::string config_error(const std::string& spec) {
  config c;
  return parse_config(spec, c);
}

std::string options_error(std::vector<const char*> args) {
  args.insert(args.begin(), "skim-eval");
  options o;
  return parse_options(static_cast<int>(args.size()), args.data(), o);
}

// A scratch directory, removed at the end of the test.
struct temp_dir {
  fs::path path;
  explicit temp_dir(const std::string& name) {
    path = fs::temp_directory_path() / (name + "_" + std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::vector<float> normal(std::mt19937& rng, std::size_t n) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Random Q, K, V files in `dir`: the per-layer layout if layers > 0, else [tokens, heads, dim].
options write_inputs(const fs::path& dir, std::int32_t layers, std::int32_t tokens, std::int32_t heads_q,
                     std::int32_t heads_kv, std::int32_t dim, std::uint32_t seed) {
  std::mt19937 rng(seed);
  const std::int64_t l = layers > 0 ? layers : 1;
  const auto shape = [&](std::int32_t heads) {
    return layers > 0 ? std::vector<std::int64_t>{layers, heads, tokens, dim}
                      : std::vector<std::int64_t>{tokens, heads, dim};
  };
  options o;
  o.q_path = (dir / "q.npy").string();
  o.k_path = (dir / "k.npy").string();
  o.v_path = (dir / "v.npy").string();
  const auto nq = static_cast<std::size_t>(l * heads_q * tokens * dim);
  const auto nk = static_cast<std::size_t>(l * heads_kv * tokens * dim);
  std::vector<float> q = normal(rng, nq);
  for (float& x : q) x *= 2.0f;  // peakier attention than unit-variance scores
  REQUIRE(skim::npy::write(o.q_path, shape(heads_q), q).ok());
  REQUIRE(skim::npy::write(o.k_path, shape(heads_kv), normal(rng, nk)).ok());
  REQUIRE(skim::npy::write(o.v_path, shape(heads_kv), normal(rng, nk)).ok());
  o.repeat = 1;
  return o;
}

config parsed(const std::string& spec) {
  config c;
  const std::string e = parse_config(spec, c);
  REQUIRE_MESSAGE(e.empty(), e);
  return c;
}

// A spec with the keys it leaves out set as the end-to-end cases were written for (max_bound,
// bq = block, no sink or local, reduce max) rather than skim::defaults.
config classic(const std::string& spec) {
  config c = parsed(spec);
  const auto given = [&](const char* key) { return spec.find(key) != std::string::npos; };
  if (!given("summarizer=")) c.summarizer = summarizer_kind::max_bound;
  if (!given("bq=")) c.bq = 0;
  if (!given("sink=")) c.sink = 0;
  if (!given("local=")) c.local = 0;
  if (!given("reduce=")) c.reduce = skim::route::group_reduce::max;
  return c;
}

}  // namespace

TEST_CASE("skim-eval options: good configuration specs") {
  SUBCASE("defaults") {
    const config c = parsed("k=8");
    CHECK(c.summarizer == summarizer_kind::multi_centroid);  // skim::defaults
    CHECK(c.centroids == 2);
    CHECK(c.block == skim::defaults::block_kv);
    CHECK(c.block_q() == 1);
    CHECK(c.select == selector_kind::top_k);
    CHECK(c.k == 8);
    CHECK(!c.budget);
    CHECK(c.sink == skim::defaults::sink_blocks);
    CHECK(c.local == skim::defaults::local_blocks);
    CHECK(c.recency);
    CHECK(c.pool == skim::route::query_pool::last);
    CHECK(c.reduce == skim::defaults::reduce);
    CHECK(c.scope == skim::defaults::scope);
  }
  SUBCASE("every top_k key") {
    const config c = parsed(
        "summarizer=probe_max,probes=8,block=16,bq=32,select=top_k,budget=0.25,sink=1,local=2,recency=0,"
        "importance=0.5,pool=max,reduce=sum,scope=query");
    CHECK(c.spec.starts_with("summarizer=probe_max"));
    CHECK(c.summarizer == summarizer_kind::probe_max);
    CHECK(c.probes == 8);
    CHECK(c.block == 16);
    CHECK(c.block_q() == 32);
    CHECK(c.budget == doctest::Approx(0.25));
    CHECK(!c.k);
    CHECK(c.sink == 1);
    CHECK(c.local == 2);
    CHECK(!c.recency);
    CHECK(c.importance == doctest::Approx(0.5));
    CHECK(c.pool == skim::route::query_pool::max);
    CHECK(c.reduce == skim::route::group_reduce::sum);
    CHECK(c.scope == skim::index_scope::query_head);
    CHECK(!c.share);
    CHECK(parsed("k=8,share=1").share);
    CHECK(parsed("k=8,share=1").share_pool == skim::head_pool::relative);
    CHECK(parsed("k=8,share=max").share);
    CHECK(parsed("k=8,share=max").share_pool == skim::head_pool::max);
  }
  SUBCASE("lsh") {
    CHECK(parsed("summarizer=lsh,k=4").summarizer == summarizer_kind::lsh);
    CHECK(parsed("summarizer=lsh,k=4").rounds == 4);
    CHECK(parsed("summarizer=lsh,rounds=8,k=4").rounds == 8);
  }
  SUBCASE("routers") {
    CHECK(parsed("k=4").router == router_kind::pooled);
    const config km = parsed("router=kmeans,clusters=64,probe=8,iterations=2,pool=mean,budget=0.125");
    CHECK(km.router == router_kind::kmeans);
    CHECK(km.clusters == 64);
    CHECK(km.probe == 8);
    CHECK(km.iterations == 2);
    CHECK(km.pool == skim::route::query_pool::mean);
    const config vs = parsed("router=vertical_slash,columns=16,diagonals=32,last_q=8,sink=2,local=3,block=16,bq=64");
    CHECK(vs.router == router_kind::vertical_slash);
    CHECK(vs.columns == 16);
    CHECK(vs.diagonals == 32);
    CHECK(vs.last_q == 8);
    CHECK(vs.sink == 2);
    CHECK(vs.local == 3);
    CHECK(!vs.recency);
    const config tk = parsed("router=tokens,budget=0.125,sink=4,local=32");
    CHECK(tk.router == router_kind::tokens);
    CHECK(tk.block == 1);  // blocks of one key: the tokens
    CHECK(tk.sink == 4);
    CHECK(tk.local == 32);
    CHECK(!tk.recency);
  }
  SUBCASE("threshold") {
    const config c = parsed("summarizer=multi_centroid,centroids=4,select=threshold,mode=mass,tau=0.9,k_min=1,k_max=6");
    CHECK(c.summarizer == summarizer_kind::multi_centroid);
    CHECK(c.centroids == 4);
    CHECK(c.select == selector_kind::threshold);
    CHECK(c.mode == skim::select::threshold_mode::mass);
    CHECK(c.tau == doctest::Approx(0.9f));
    CHECK(c.k_min == 1);
    CHECK(c.k_max == 6);
  }
}

TEST_CASE("skim-eval options: each bad spec names its problem") {
  const std::string keys = std::string(config_keys);
  CHECK(config_error("select=topk") == "--config 'select=topk': unknown selector 'topk' (top_k, threshold)");
  CHECK(config_error("summarizer=quest,k=1") ==
        "--config 'summarizer=quest,k=1': unknown summarizer 'quest' (mean_pool, max_bound, probe_max, multi_centroid, lsh)");
  CHECK(config_error("k=8,foo=1") == "--config 'k=8,foo=1': unknown key 'foo' (" + keys + ")");
  CHECK(config_error("") == "--config '': empty configuration");
  CHECK(config_error("k=1,,sink=1") == "--config 'k=1,,sink=1': empty item (two commas, or a comma at an end)");
  CHECK(config_error("k=1,") == "--config 'k=1,': empty item (two commas, or a comma at an end)");
  CHECK(config_error("k") == "--config 'k': 'k' is not key=value");
  CHECK(config_error("k=") == "--config 'k=': key 'k' has no value");
  CHECK(config_error("k=8,k=4") == "--config 'k=8,k=4': key 'k' given twice");
  CHECK(config_error("k=x") == "--config 'k=x': k 'x' is not an integer");
  CHECK(config_error("k=8.5") == "--config 'k=8.5': k '8.5' is not an integer");
  CHECK(config_error("k=-1") == "--config 'k=-1': k -1 outside [0, 2147483647]");
  CHECK(config_error("k=1,block=0") == "--config 'k=1,block=0': block 0 outside [1, 65536]");
  CHECK(config_error("budget=1.5") == "--config 'budget=1.5': budget 1.5 outside (0, 1]");
  CHECK(config_error("budget=0") == "--config 'budget=0': budget 0 outside (0, 1]");
  CHECK(config_error("budget=nan") == "--config 'budget=nan': budget 'nan' is not a finite number");
  CHECK(config_error("summarizer=probe_max,probes=3,k=1") ==
        "--config 'summarizer=probe_max,probes=3,k=1': probes '3' unsupported (2, 4, 8)");
  CHECK(config_error("summarizer=multi_centroid,centroids=8,k=1") ==
        "--config 'summarizer=multi_centroid,centroids=8,k=1': centroids '8' unsupported (2, 4)");
  CHECK(config_error("probes=4,k=1") == "--config 'probes=4,k=1': probes needs summarizer=probe_max");
  CHECK(config_error("summarizer=lsh,rounds=6,k=1") == "--config 'summarizer=lsh,rounds=6,k=1': rounds '6' unsupported (4, 8)");
  CHECK(config_error("rounds=4,k=1") == "--config 'rounds=4,k=1': rounds needs summarizer=lsh");
  CHECK(config_error("summarizer=mean_pool,centroids=2,k=1") ==
        "--config 'summarizer=mean_pool,centroids=2,k=1': centroids needs summarizer=multi_centroid");
  CHECK(config_error("centroids=4,k=1").empty());  // the default summarizer is multi_centroid
  CHECK(config_error("k=1,budget=0.5") == "--config 'k=1,budget=0.5': k and budget exclude each other");
  CHECK(config_error("select=top_k") == "--config 'select=top_k': top_k needs k=N or budget=B");
  CHECK(config_error("k=1,tau=1") == "--config 'k=1,tau=1': tau needs select=threshold");
  CHECK(config_error("select=threshold") == "--config 'select=threshold': threshold needs tau");
  CHECK(config_error("select=threshold,tau=1,k=3") ==
        "--config 'select=threshold,tau=1,k=3': k needs select=top_k (threshold takes k_min, k_max)");
  CHECK(config_error("select=threshold,mode=mass,tau=2") ==
        "--config 'select=threshold,mode=mass,tau=2': threshold mass tau 2 outside (0, 1]");
  CHECK(config_error("select=threshold,mode=ratio,tau=2") ==
        "--config 'select=threshold,mode=ratio,tau=2': unknown threshold mode 'ratio' (absolute, relative, mass)");
  CHECK(config_error("select=threshold,tau=1,k_min=5,k_max=2") ==
        "--config 'select=threshold,tau=1,k_min=5,k_max=2': k_min 5 > k_max 2");
  CHECK(config_error("k=1,recency=2") == "--config 'k=1,recency=2': recency '2' is not 0 or 1");
  CHECK(config_error("k=1,importance=2") == "--config 'k=1,importance=2': importance 2 outside [0, 1]");
  CHECK(config_error("k=1,pool=min") == "--config 'k=1,pool=min': unknown pool 'min' (last, mean, max)");
  CHECK(config_error("k=1,reduce=min") == "--config 'k=1,reduce=min': unknown reduce 'min' (max, mean, sum)");
  CHECK(config_error("router=cluster,k=1") ==
        "--config 'router=cluster,k=1': unknown router 'cluster' (pooled, kmeans, vertical_slash, tokens)");
  CHECK(config_error("router=tokens,block=4,k=8") ==
        "--config 'router=tokens,block=4,k=8': router=tokens takes block=1 (its blocks are keys)");
  CHECK(config_error("router=tokens,select=threshold,tau=0") ==
        "--config 'router=tokens,select=threshold,tau=0': select does not apply to router=tokens (top_tokens selects)");
  CHECK(config_error("router=tokens,summarizer=lsh,k=1") ==
        "--config 'router=tokens,summarizer=lsh,k=1': summarizer needs router=pooled (not tokens)");
  CHECK(config_error("router=tokens") == "--config 'router=tokens': top_k needs k=N or budget=B");
  CHECK(config_error("clusters=8,k=1") == "--config 'clusters=8,k=1': clusters needs router=kmeans");
  CHECK(config_error("router=kmeans,clusters=0,k=1") == "--config 'router=kmeans,clusters=0,k=1': clusters 0 outside [1, 4096]");
  CHECK(config_error("router=kmeans,summarizer=max_bound,k=1") ==
        "--config 'router=kmeans,summarizer=max_bound,k=1': summarizer needs router=pooled (not kmeans)");
  CHECK(config_error("router=kmeans,pool=max,k=1") ==
        "--config 'router=kmeans,pool=max,k=1': router=kmeans takes pool=last or pool=mean");
  CHECK(config_error("columns=8,k=1") == "--config 'columns=8,k=1': columns needs router=vertical_slash");
  CHECK(config_error("router=vertical_slash,k=1") ==
        "--config 'router=vertical_slash,k=1': k does not apply to router=vertical_slash (it selects itself)");
  CHECK(config_error("router=vertical_slash,last_q=0") ==
        "--config 'router=vertical_slash,last_q=0': last_q 0 outside [1, 2147483647]");
  CHECK(config_error("router=vertical_slash").empty());
  CHECK(config_error("k=1,scope=all") == "--config 'k=1,scope=all': unknown scope 'all' (kv, query)");
  CHECK(config_error("k=1,share=2") == "--config 'k=1,share=2': share '2' is not 0, 1 or max");
  CHECK(config_error("k=1,importance=0.5,share=1") ==
        "--config 'k=1,importance=0.5,share=1': share=1 takes no importance (its prior is per index head)");
}

TEST_CASE("skim-eval options: the command line") {
  SUBCASE("good") {
    const char* args[] = {"skim-eval", "--q", "q.npy", "--k=k.npy", "--v", "v.npy", "--no-causal", "--recall", "4,64",
                          "--json", "--min-position", "128", "--repeat", "5", "--head-table",
                          "--config", "k=8", "--config", "summarizer=mean_pool,budget=0.5"};
    options o;
    const std::string e = parse_options(static_cast<int>(std::size(args)), args, o);
    REQUIRE_MESSAGE(e.empty(), e);
    CHECK(o.q_path == "q.npy");
    CHECK(o.k_path == "k.npy");
    CHECK(o.v_path == "v.npy");
    CHECK(!o.causal);
    CHECK(o.recall_at == std::vector<std::int32_t>{4, 64});
    CHECK(o.json);
    CHECK(o.head_table);
    CHECK(o.min_position == 128);
    CHECK(o.repeat == 5);
    REQUIRE(o.configs.size() == 2);
    CHECK(o.configs[1].summarizer == summarizer_kind::mean_pool);
  }
  SUBCASE("help needs nothing else") {
    const char* args[] = {"skim-eval", "--help"};
    options o;
    CHECK(parse_options(2, args, o).empty());
    CHECK(o.help);
  }
  CHECK(options_error({"--q", "q", "--k", "k", "--v", "v", "--config", "k=1", "--bogus"}) ==
        "unknown option '--bogus' (see --help)");
  CHECK(options_error({"--q"}) == "--q needs a value");
  CHECK(options_error({"--k", "k", "--v", "v", "--config", "k=1"}) == "missing --q (see --help)");
  CHECK(options_error({"--q", "q", "--k", "k", "--v", "v"}) == "no --config given (see --help)");
  CHECK(options_error({"--recall", "8,x"}) == "--recall '8,x': 'x' is not a positive integer");
  CHECK(options_error({"--recall", "0"}) == "--recall '0': '0' is not a positive integer");
  CHECK(options_error({"--min-position", "-1"}) == "--min-position '-1' is not an integer >= 0");
  CHECK(options_error({"--repeat", "0"}) == "--repeat '0' is not an integer >= 1");
  CHECK(options_error({"--json=yes"}) == "--json takes no value");
  CHECK(options_error({"--config", "select=topk"}) ==
        "--config 'select=topk': unknown selector 'topk' (top_k, threshold)");
}

TEST_CASE("skim-eval inputs: layouts, GQA ratio and mismatches") {
  input_shape s;
  SUBCASE("token-major, one layer") {
    REQUIRE(infer_input_shape({100, 8, 16}, {100, 2, 16}, {100, 2, 16}, s).empty());
    CHECK(s.layers == 1);
    CHECK(s.tokens == 100);
    CHECK(s.heads_q == 8);
    CHECK(s.heads_kv == 2);
    CHECK(s.group_size() == 4);
    CHECK(s.dim == 16);
    CHECK(!s.per_layer);
  }
  SUBCASE("per layer") {
    REQUIRE(infer_input_shape({5, 8, 512, 8}, {5, 4, 512, 8}, {5, 4, 512, 8}, s).empty());
    CHECK(s.layers == 5);
    CHECK(s.tokens == 512);
    CHECK(s.group_size() == 2);
    CHECK(s.per_layer);
  }
  CHECK(infer_input_shape({100, 8, 16}, {90, 2, 16}, {90, 2, 16}, s) ==
        "Q [100, 8, 16] and K [90, 2, 16] differ in tokens (100 vs 90)");
  CHECK(infer_input_shape({100, 8, 16}, {100, 2, 8}, {100, 2, 8}, s) ==
        "Q [100, 8, 16] and K [100, 2, 8] differ in head dim (16 vs 8)");
  CHECK(infer_input_shape({5, 8, 64, 8}, {4, 4, 64, 8}, {4, 4, 64, 8}, s) ==
        "Q [5, 8, 64, 8] and K [4, 4, 64, 8] differ in layers (5 vs 4)");
  CHECK(infer_input_shape({64, 8, 8}, {1, 4, 64, 8}, {1, 4, 64, 8}, s) ==
        "Q [64, 8, 8] and K [1, 4, 64, 8] differ in rank (use one layout for all three)");
  CHECK(infer_input_shape({64, 6, 8}, {64, 4, 8}, {64, 4, 8}, s) ==
        "Q [64, 6, 8] and K [64, 4, 8]: heads_q 6 is not a multiple of heads_kv 4 (GQA)");
  CHECK(infer_input_shape({64, 8, 8}, {64, 4, 8}, {64, 2, 8}, s) == "K [64, 4, 8] and V [64, 2, 8] differ in shape");
  CHECK(infer_input_shape({64, 8}, {64, 4, 8}, {64, 4, 8}, s) ==
        "Q has shape [64, 8]: expected [tokens, heads, dim] or [layers, heads, tokens, dim]");
  CHECK(infer_input_shape({64, 8, 8}, {0, 4, 8}, {0, 4, 8}, s) == "K has shape [0, 4, 8]: a dimension is 0");
}

TEST_CASE("skim-eval end to end: a budget that covers every block is dense attention") {
  const temp_dir dir("skim_eval_test");
  for (const std::int32_t layers : {0, 2}) {  // both layouts
    options o = write_inputs(dir.path, layers, 50, 4, 2, 8, 1234u + static_cast<std::uint32_t>(layers));
    o.min_position = 3;  // not a multiple of bq: measured through blocks of gcd(3, 8) = 1 query
    for (const char* spec : {"summarizer=mean_pool,block=8,budget=1,recency=0",
                             "summarizer=max_bound,block=8,budget=1,sink=1,local=2",
                             "summarizer=probe_max,probes=2,block=8,bq=16,budget=1",
                             "summarizer=multi_centroid,centroids=4,block=8,budget=1,scope=query",
                             "summarizer=max_bound,block=8,select=threshold,mode=relative,tau=1e9",
                             "summarizer=max_bound,block=8,budget=1,share=1",
                             "router=kmeans,clusters=4,probe=4,block=8,budget=1",  // every cluster probed
                             "router=vertical_slash,block=8,columns=50,diagonals=0,sink=0,local=0",
                             "router=tokens,budget=1,sink=2,local=3"}) {
      o.configs.push_back(classic(spec));
    }
    run_result r;
    const outcome out = run(o, r);
    REQUIRE_MESSAGE(out.ok(), out.error);
    REQUIRE(r.configs.size() == o.configs.size());
    for (const config_result& c : r.configs) {
      INFO(c.cfg.spec, " layers ", layers);
      const auto& q = c.quality;
      CHECK(q.rows == (50 - 3) * 4 * (layers > 0 ? layers : 1));
      CHECK(q.coverage.worst == doctest::Approx(1.0).epsilon(1e-12));
      CHECK(q.error.worst < 1e-6);
      for (const auto& t : q.recall) CHECK(t.worst == 1.0);
      CHECK(q.cost.keys_read == c.dense_cost.keys_read);  // every visible block is read
      CHECK(c.density() >= 1.0);                          // masked pairs of diagonal tiles are read too
      CHECK(c.times.total() > 0.0);
      CHECK(c.dense_seconds > 0.0);
    }
    CHECK(r.configs[0].dynamic_k == 7);  // ceil(1 × 7 blocks) − 0 reserved
    CHECK(r.configs[1].dynamic_k == 4);  // 7 − sink 1 − local 2
    CHECK(r.configs[4].dynamic_k == -1);
    CHECK(!to_json(r).empty());
  }
}

namespace {

using max_bound_pipeline = skim::sparse_attention<skim::summarize::max_bound, skim::route::pooled_router,
                                                  skim::select::reserved<skim::select::top_k>, skim::exec::scalar>;

// The pipeline run by hand on layer 0 of the inputs: one sequence of `tokens` queries and keys.
struct by_hand {
  skim::problem p;
  std::vector<float> summaries, out;
  std::vector<std::int32_t> ids, count;
  std::int32_t width = 0;

  by_hand(const inputs& in, const max_bound_pipeline& pipe, const std::int32_t (&cu)[2], std::int32_t heads_q,
          std::int32_t heads_kv)
      : p{.heads_q = heads_q, .heads_kv = heads_kv, .head_dim = 8, .block_q = 8, .block_kv = 8, .cu_seqlens_q = cu,
          .cu_seqlens_kv = cu},
        summaries(static_cast<std::size_t>(pipe.summary_floats(p))),
        out(static_cast<std::size_t>(cu[1]) * static_cast<std::size_t>(heads_q) * 8),
        ids(static_cast<std::size_t>(pipe.selected_rows(p) * pipe.table_width(p))),
        count(static_cast<std::size_t>(pipe.selected_rows(p))),
        width(pipe.table_width(p)) {
    skim::workspace_buffer ws(pipe.workspace_bytes(p));
    REQUIRE(pipe.run(skim::pipeline_args<float, skim::contiguous_kv<float>, float>{
                         .prob = p, .q = in.q_view(0), .kv = kv(in),
                         .o = skim::strided_view<float>::token_major(out.data(), cu[1], heads_q, 8),
                         .summaries = summaries, .selected = table()},
                     ws.span())
                .ok());
  }
  [[nodiscard]] skim::index::mutable_block_table table() { return {.ids = ids, .count = count, .width = width}; }
  [[nodiscard]] static skim::contiguous_kv<float> kv(const inputs& in) { return {.k = in.k_view(0), .v = in.v_view(0)}; }
};

}  // namespace

TEST_CASE("skim-eval end to end: a small budget loses mass, and min-position measures exactly the later queries") {
  const temp_dir dir("skim_eval_test");
  options o = write_inputs(dir.path, 1, 96, 4, 1, 8, 99u);
  o.recall_at = {4};
  o.configs = {classic("summarizer=max_bound,block=8,k=1,local=1")};
  run_result all, later;
  REQUIRE(run(o, all).ok());
  const auto& a = all.configs[0].quality;
  CHECK(a.rows == 96 * 4);
  CHECK(a.coverage.mean < 0.95);
  CHECK(a.cost.tiles_per_row.worst == 2.0);
  CHECK(all.configs[0].density() < 0.5);

  // Queries >= 37 against the per-row numbers of the full problem, recomputed by hand.
  o.min_position = 37;
  REQUIRE(run(o, later).ok());
  const auto& b = later.configs[0].quality;
  CHECK(b.rows == (96 - 37) * 4);

  inputs in;
  REQUIRE(load_inputs(o.q_path, o.k_path, o.v_path, in).empty());
  const std::int32_t cu[2] = {0, 96};
  by_hand h(in, max_bound_pipeline{.selector = {.local = 1, .dynamic = {.k = 1}}}, cu, 4, 1);
  const skim::problem& p = h.p;
  const skim::contiguous_kv<float> kv = by_hand::kv(in);
  const skim::index::mutable_block_table table = h.table();
  double coverage = 0.0, error = 0.0, recall = 0.0;
  std::int64_t rows = 0;
  const std::int32_t t[] = {4};
  REQUIRE(skim::metrics::for_each_query_row(p, in.q_view(0), kv, skim::index::block_table(table), t,
                                            [&](const skim::metrics::query_row& r) {
                                              if (r.query < 37) return;
                                              coverage += r.coverage;
                                              error += r.error;
                                              recall += r.recall[0];
                                              ++rows;
                                            })
              .ok());
  REQUIRE(rows == b.rows);
  CHECK(b.coverage.mean == doctest::Approx(coverage / static_cast<double>(rows)).epsilon(1e-12));
  CHECK(b.error.mean == doctest::Approx(error / static_cast<double>(rows)).epsilon(1e-12));
  CHECK(b.recall[0].mean == doctest::Approx(recall / static_cast<double>(rows)).epsilon(1e-12));
  // Cost: the index rows of query blocks 4..11 (block 4 holds queries 32..39), 4 query heads share one kv head.
  CHECK(b.cost.index_rows == 8);
}

TEST_CASE("skim-eval end to end: share=1 measures every head over its query block's one selection") {
  const temp_dir dir("skim_eval_test");
  options o = write_inputs(dir.path, 1, 80, 4, 2, 8, 7u);
  o.configs = {classic("summarizer=max_bound,block=8,k=2,local=1,share=1")};
  run_result r;
  REQUIRE(run(o, r).ok());
  const auto& q = r.configs[0].quality;
  REQUIRE(q.rows == 80 * 4);

  inputs in;
  REQUIRE(load_inputs(o.q_path, o.k_path, o.v_path, in).empty());
  const std::int32_t cu[2] = {0, 80};
  by_hand h(in, max_bound_pipeline{.selector = {.local = 1, .dynamic = {.k = 2}}, .share_heads = true}, cu, 4, 2);
  const skim::problem& p = h.p;
  REQUIRE(h.count.size() == 10);  // one row per query block, for both kv heads
  const skim::contiguous_kv<float> kv = by_hand::kv(in);
  double coverage = 0.0;
  std::int64_t rows = 0;
  const skim::index::head_shared<skim::index::block_table> shared{.rows = h.table(), .index_heads = p.index_heads()};
  REQUIRE(skim::metrics::for_each_query_row(p, in.q_view(0), kv, shared, {}, [&](const skim::metrics::query_row& row) {
            coverage += row.coverage;
            ++rows;
          }).ok());
  REQUIRE(rows == q.rows);
  CHECK(q.coverage.mean == doctest::Approx(coverage / static_cast<double>(rows)).epsilon(1e-12));
  CHECK(q.cost.index_rows == 20);  // cost counts the problem's rows: 10 query blocks x 2 kv heads
}

TEST_CASE("skim-eval end to end: bad files and shapes are bad input (exit status 2)") {
  const temp_dir dir("skim_eval_test");
  options o = write_inputs(dir.path, 0, 32, 4, 2, 8, 7u);
  o.configs = {classic("block=8,k=1")};
  run_result r;

  SUBCASE("truncated .npy") {
    const std::string bad = (dir.path / "bad.npy").string();
    std::vector<std::byte> bytes;
    REQUIRE(skim::examples::read_file(o.q_path, bytes).ok());
    bytes.resize(bytes.size() - 10);
    std::FILE* f = std::fopen(bad.c_str(), "wb");
    REQUIRE(f != nullptr);
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
    o.q_path = bad;
    const outcome out = run(o, r);
    CHECK(out.exit_code == 2);
    CHECK(out.error.starts_with(bad + ": "));
    CHECK(out.error.find('\n') == std::string::npos);
  }
  SUBCASE("missing file") {
    o.v_path = (dir.path / "none.npy").string();
    const outcome out = run(o, r);
    CHECK(out.exit_code == 2);
    CHECK(out.error.starts_with(o.v_path + ": cannot open"));
  }
  SUBCASE("shape mismatch") {
    std::mt19937 rng(3u);
    REQUIRE(skim::npy::write(o.k_path, std::vector<std::int64_t>{32, 3, 8}, normal(rng, 32 * 3 * 8)).ok());
    REQUIRE(skim::npy::write(o.v_path, std::vector<std::int64_t>{32, 3, 8}, normal(rng, 32 * 3 * 8)).ok());
    const outcome out = run(o, r);
    CHECK(out.exit_code == 2);
    CHECK(out.error == "Q [32, 4, 8] and K [32, 3, 8]: heads_q 4 is not a multiple of heads_kv 3 (GQA)");
  }
  SUBCASE("min-position past the end") {
    o.min_position = 32;
    const outcome out = run(o, r);
    CHECK(out.exit_code == 2);
    CHECK(out.error == "--min-position 32 >= tokens 32: no query to measure");
  }
}
