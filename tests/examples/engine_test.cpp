// skim-llama's engine (examples/llama/engine.hpp) on the real stories260K checkpoint: every
// attention call through skim, checked against the known story, a float64 re-implementation of
// the forward pass, and dense decoding.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "examples/real_model.hpp"
#include "examples/reference_forward.hpp"
#include "llama/engine.hpp"

using namespace skim_llama;
using namespace skim::test::real;

namespace {

engine_options spec(const char* s) {
  engine_options o;
  const std::string e = parse_attention(s, o);
  REQUIRE_MESSAGE(e.empty(), e);
  return o;
}

std::string story(const tokenizer& tok, const std::vector<int>& ids) {
  std::string s;
  int prev = tokenizer::bos;
  for (const int t : ids) {
    s += tok.decode(prev, t);
    prev = t;
  }
  return s;
}

std::vector<int> greedy(const model& m, const char* s, const std::vector<int>& prompt, int n) {
  engine e(m, spec(s), static_cast<int>(prompt.size()) + n);
  std::vector<int> out;
  const skim::status st = e.generate(prompt, n, out);
  REQUIRE_MESSAGE(st.ok(), st.message());
  return out;
}

}  // namespace

TEST_CASE("engine: dense attention through skim tells the known story from BOS" * doctest::skip(model_missing())) {
  const auto& [m, tok] = real_model();
  const std::vector<int> out = greedy(m, "dense", {tokenizer::bos}, 16);
  CHECK(story(tok, out).starts_with("Once upon a time, there was a little girl named Lily."));
}

TEST_CASE("engine: dense logits match a float64 forward pass" * doctest::skip(model_missing())) {
  const auto& [m, tok] = real_model();
  std::vector<int> ids = tok.encode("Once upon a time, there was a little dog. He liked to run in the park with his ball.");
  REQUIRE(ids.size() >= 20);
  const std::vector<double> want = reference_logits(m, ids);
  // Prefill, with blocks, and each routing family at a budget that keeps every key (vertical-slash:
  // more columns than keys).
  for (const char* s : {"dense", "policy=skim,budget=1,block=4", "policy=skim,router=kmeans,clusters=8,budget=1",
                        "policy=skim,router=tokens,budget=1",
                        "policy=skim,router=vertical_slash,block=4,bq=8,columns=1000,diagonals=0"}) {
    engine e(m, spec(s), static_cast<int>(ids.size()));
    std::vector<float> got(ids.size() * static_cast<std::size_t>(m.cfg.vocab_size));
    REQUIRE(e.run(ids, got).ok());
    double worst = 0;
    for (std::size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
    MESSAGE(std::string(s), ": max |logit - float64 logit| = ", worst);
    CHECK(worst < 2e-3);
  }
  // Token by token (decode path: summaries, k-means state appended) gives the same logits; so does
  // a prefill of half the tokens followed by decode steps.
  for (const char* s : {"policy=skim,budget=1,block=4", "policy=skim,router=kmeans,clusters=8,budget=1",
                        "policy=skim,router=tokens,budget=1"}) {
    for (const std::size_t prefill : {std::size_t{1}, ids.size() / 2}) {
      INFO("spec ", std::string(s), ", prefill ", prefill);
      engine e(m, spec(s), static_cast<int>(ids.size()));
      const auto v = static_cast<std::size_t>(m.cfg.vocab_size);
      std::vector<float> first(prefill * v), row(v);
      REQUIRE(e.run(std::span<const int>(ids).first(prefill), first).ok());
      double worst = 0;
      for (std::size_t j = 0; j < first.size(); ++j) worst = std::max(worst, std::abs(first[j] - want[j]));
      for (std::size_t t = prefill; t < ids.size(); ++t) {
        REQUIRE(e.run(std::span<const int>(ids).subspan(t, 1), row).ok());
        for (std::size_t j = 0; j < v; ++j) worst = std::max(worst, std::abs(row[j] - want[t * v + j]));
      }
      CHECK(worst < 2e-3);
    }
  }
}

TEST_CASE("engine: sparse attention with a budget covering every block reproduces dense tokens" * doctest::skip(model_missing())) {
  const auto& [m, tok] = real_model();
  const std::vector<int> prompt = tok.encode("Tom had a red ball.");
  const std::vector<int> dense = greedy(m, "dense", prompt, 96);
  for (const char* s : {"policy=skim,summarizer=max_bound,block=16,budget=1",
                        "policy=skim,summarizer=mean_pool,block=8,bq=4,budget=1,sink=1",
                        "policy=skim,summarizer=multi_centroid,centroids=2,block=16,k=1000",
                        "policy=skim,summarizer=probe_max,probes=4,block=16,select=threshold,tau=0,mode=absolute,k_min=1000"}) {
    INFO("spec ", std::string(s));  // CAPTURE would print the pointer
    CHECK(greedy(m, s, prompt, 96) == dense);
  }
}

TEST_CASE("engine: recency-only, random and evicting baselines run and read less" * doctest::skip(model_missing())) {
  const auto& [m, tok] = real_model();
  std::vector<int> ids = tok.encode(read_text(models_dir() / "tinystories_sample.txt"));
  ids.resize(256);
  double dense_nll = 0;
  for (const char* s : {"dense", "policy=skim,budget=0.25,sink=1", "policy=recency,budget=0.25,sink=1",
                        "policy=random,budget=0.25,sink=1,seed=7", "policy=dense,evict=attention_mass,keep=0.5",
                        "policy=dense,evict=recency,keep=0.5", "policy=dense,evict=summary_score,keep=0.5",
                        "policy=skim,router=kmeans,clusters=16,probe=2,budget=0.25",
                        "policy=skim,router=tokens,budget=0.25",
                        "policy=skim,router=vertical_slash,block=16,sink=1,local=1,columns=8,diagonals=8"}) {
    INFO("spec ", std::string(s));  // CAPTURE would print the pointer
    engine e(m, spec(s), static_cast<int>(ids.size()));
    std::vector<float> logits(ids.size() * static_cast<std::size_t>(m.cfg.vocab_size));
    const skim::status st = e.run(ids, logits);
    REQUIRE_MESSAGE(st.ok(), st.message());
    const double nll = next_token_nll(logits, ids, m.cfg.vocab_size);
    MESSAGE(std::string(s), ": loss ", nll, " nats, keys read / causal ", e.stats.density(), ", eviction loss ", e.stats.eviction_loss());
    CHECK(std::isfinite(nll));
    if (std::string(s) == "dense") {
      dense_nll = nll;
      CHECK(e.stats.density() == 1.0);
    } else {
      CHECK(e.stats.density() < 0.6);
      CHECK(nll < dense_nll + 1.0);  // degraded, not broken
    }
  }
}

TEST_CASE("engine: bad attention specs are rejected with a message") {
  engine_options o;
  CHECK(parse_attention("policy=fancy", o).find("unknown policy") != std::string::npos);
  CHECK(parse_attention("policy=skim,evict=recency", o).find("eviction runs with policy=dense") != std::string::npos);
  CHECK(parse_attention("policy=skim,summarizer=nope", o).find("unknown summarizer") != std::string::npos);
  CHECK(parse_attention("router=kmeans", o).find("run with policy=skim") != std::string::npos);
  CHECK(parse_attention("policy=recency,router=tokens", o).find("run with policy=skim") != std::string::npos);
  CHECK(parse_attention("policy=skim,router=tokens,select=threshold,tau=0", o).find("no threshold") != std::string::npos);
  CHECK(parse_attention("policy=skim,router=kmeans,importance=0.5", o).find("no importance") != std::string::npos);
  CHECK(parse_attention("policy=skim,router=vertical_slash,budget=0.5", o).find("vertical_slash") != std::string::npos);
  CHECK(parse_attention("policy=skim,budget=0.25", o).empty());
  CHECK(o.sparse.block == skim::defaults::block_kv);  // what a spec leaves out is skim::defaults'
  CHECK(o.sparse.bq == 1);
  CHECK(o.sparse.summarizer == skim_eval::summarizer_kind::multi_centroid);
  CHECK(o.sparse.reduce == skim::defaults::reduce);
  CHECK(o.sparse.sink == skim::defaults::sink_blocks);
  CHECK(o.sparse.local == skim::defaults::local_blocks);
}
