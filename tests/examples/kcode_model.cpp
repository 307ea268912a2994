// skim-llama's engine on kcode18M (head dim 64, GQA 4, 4096-token context; ../shared/models):
// the dense forward against a float64 one, and the default routed policy against dense on
// needles and perplexity. Its own binary (skim_model_tests), built for the host like skim-llama,
// so the model's products run at GEMM speed; skipped, with a message, without the model files.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "examples/real_model.hpp"
#include "examples/reference_forward.hpp"
#include "llama/engine.hpp"
#include "llama/needle.hpp"

using namespace skim_llama;
using namespace skim::test::real;
namespace fs = std::filesystem;

namespace {

bool kcode_missing() {
  static const bool missing = [] {
    if (model_missing()) return true;
    const fs::path dir = find_models().dir;
    for (const char* f : {"kcode18M.bin", "tok_kbpe.bin", "kernel_val.c.txt"}) {
      if (!fs::is_regular_file(dir / f)) {
        std::fprintf(stderr, "skim_model_tests: skipping the kcode18M cases: no %s in %s\n", f, dir.string().c_str());
        return true;
      }
    }
    return false;
  }();
  return missing;
}

struct kcode {
  model m;
  tokenizer tok;
  corpus text;
};

const kcode& kcode_model() {
  static const kcode* k = [] {
    auto* x = new kcode;
    const fs::path dir = models_dir();
    skim::status s = load(dir / "kcode18M.bin", x->m);
    REQUIRE_MESSAGE(s.ok(), s.message());
    s = tokenizer::load(dir / "tok_kbpe.bin", x->m.cfg.vocab_size, x->tok);
    REQUIRE_MESSAGE(s.ok(), s.message());
    x->text = corpus::encode(x->tok, read_text(dir / "kernel_val.c.txt"));
    return x;
  }();
  return *k;
}

engine_options spec(const char* s) {
  engine_options o;
  const std::string e = parse_attention(s, o);
  REQUIRE_MESSAGE(e.empty(), e);
  o.threads = 2;
  return o;
}

// Greedy answer to a needle's question from a dense prefill of its haystack, decoded by `e`.
bool answers(engine& e, const engine& prefilled, const kcode& k, const needle& n) {
  REQUIRE(e.start_from(prefilled.cache()).ok());
  std::vector<float> logits(static_cast<std::size_t>(k.m.cfg.vocab_size));
  for (const int t : n.question) REQUIRE(e.run(std::span<const int>(&t, 1), logits).ok());
  std::string text;
  int prev = n.question.back();
  for (int i = 0; i < 12; ++i) {
    const int next = argmax(logits);
    text += k.tok.decode(prev, next);
    prev = next;
    REQUIRE(e.run(std::span<const int>(&next, 1), logits).ok());
  }
  return n.found(text);
}

}  // namespace

TEST_CASE("kcode18M: the config and a float64 forward pass agree with the engine's dense logits" * doctest::skip(kcode_missing())) {
  const kcode& k = kcode_model();
  CHECK(k.m.cfg.head_dim() == 64);
  CHECK(k.m.cfg.n_heads / k.m.cfg.n_kv_heads == 4);
  CHECK(k.m.cfg.seq_len == 4096);
  const std::vector<int> ids(k.text.tokens.begin() + 5000, k.text.tokens.begin() + 5040);
  const std::vector<double> want = reference_logits(k.m, ids);
  engine e(k.m, spec("dense"), static_cast<int>(ids.size()));
  std::vector<float> got(ids.size() * static_cast<std::size_t>(k.m.cfg.vocab_size));
  REQUIRE(e.run(ids, got).ok());
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  MESSAGE("max |logit - float64 logit| = ", worst, " (largest |logit| ", scale, ")");
  CHECK(worst < 2e-3 * std::max(scale, 1.0));
}

TEST_CASE("kcode18M: the default routed policy at 1/8 finds the needles dense finds, the window none" * doctest::skip(kcode_missing())) {
  const kcode& k = kcode_model();
  constexpr int length = 4096;  // dense answers most needles only at long range (docs/quality-kcode.md)
  engine base(k.m, spec("dense"), length), dense(k.m, spec("dense"), length + 16), routed(k.m, spec("policy=skim,budget=0.125"), length + 16),
      window(k.m, spec("policy=recency,budget=0.125,sink=1,local=0"), length + 16);
  std::mt19937_64 rng(7);
  int asked = 0, found = 0, window_found = 0;
  for (const double depth : {0.3, 0.5, 0.7, 0.3, 0.5, 0.7}) {
    const std::optional<needle> n = make_needle(k.tok, k.text, length - 12, depth, rng);
    REQUIRE(n);
    base.reset();
    REQUIRE(base.run(std::span<const int>(n->prompt).first(n->prompt.size() - n->question.size()), {}).ok());
    if (!answers(dense, base, k, *n)) continue;  // counted only where dense finds it
    ++asked;
    found += answers(routed, base, k, *n);
    window_found += answers(window, base, k, *n);
  }
  MESSAGE("dense found ", asked, " of 6 needles; the routed policy ", found, ", the window ", window_found);
  REQUIRE(asked >= 3);
  // Seeded, so deterministic; the rates over many needles are docs/quality-kcode.md's.
  CHECK(found >= asked - 1);
  CHECK(window_found == 0);
}

TEST_CASE("kcode18M: perplexity under the default routed policy at 1/4 stays near dense" * doctest::skip(kcode_missing())) {
  const kcode& k = kcode_model();
  constexpr int window = 4096, from = 1024;  // as docs/quality-kcode.md measures
  std::vector<int> ids(k.text.tokens.begin() + 20000, k.text.tokens.begin() + 20000 + window);
  ids[0] = tokenizer::bos;
  const auto vocab = static_cast<std::size_t>(k.m.cfg.vocab_size);
  const auto loss = [&](const char* s) {
    engine e(k.m, spec(s), window);
    std::vector<float> logits(ids.size() * vocab);
    REQUIRE(e.run(ids, logits).ok());
    return next_token_nll(std::span<const float>(logits).subspan(from * vocab), std::span<const int>(ids).subspan(from), k.m.cfg.vocab_size);
  };
  const double dense = loss("dense"), routed = loss("policy=skim,budget=0.25"), window_only = loss("policy=recency,budget=0.25,sink=1");
  const double change = 100 * (std::exp(routed - dense) - 1), window_change = 100 * (std::exp(window_only - dense) - 1);
  MESSAGE("perplexity change at 1/4: routed ", change, "%, sink + window ", window_change, "%");
  CHECK(change < 1.0);
  CHECK(change < window_change);
}
