// skim-llama's quantised K/V cache (examples/llama/kv_quant.hpp): the quantiser's round-trip bound,
// the open block's re-quantisation against quantising the completed block at once, and the engine
// with kv=int8 / kv=fp8 on the real stories260K checkpoint against its fp32 cache.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "examples/real_model.hpp"
#include "llama/engine.hpp"
#include "llama/kv_quant.hpp"

using namespace skim_llama;
using namespace skim::test::real;

namespace {

// Random rows whose magnitude varies by row and holds a few outliers: never zeros or constants.
std::vector<float> random_rows(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> mag(-3.0f, 2.0f);
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = normal(rng) * std::exp(mag(rng));
    if (i % 97 == 5) x[i] *= 20.0f;
  }
  return x;
}

// The bound kv_quant.hpp states for one element.
template <class Code>
float bound(float x, float scale, float absmax) {
  const float slack = absmax * 0x1p-22f;
  if constexpr (std::is_same_v<Code, std::int8_t>) {
    return scale * 0.5f + slack;
  } else {
    return std::max(std::fabs(x) * 0x1p-4f, scale * 0x1p-10f) + slack;
  }
}

template <class Code>
void check_round_trip() {
  constexpr int rows = 4, dim = 64;
  for (std::uint32_t seed = 1; seed <= 50; ++seed) {
    const std::vector<float> x = random_rows(rows * dim, seed);
    std::vector<Code> codes(x.size());
    const float scale = quantize_block<Code>(x.data(), dim, rows, dim, codes.data(), dim);
    float absmax = 0, worst = 0, largest_code = 0;
    for (const float v : x) absmax = std::max(absmax, std::fabs(v));
    REQUIRE(absmax > 0);
    CHECK(scale == doctest::Approx(absmax / code_max<Code>).epsilon(1e-6));
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float back = scale * code_value(codes[i]);
      const float err = std::fabs(x[i] - back);
      CHECK_MESSAGE(err <= bound<Code>(x[i], scale, absmax), "element ", i, " of seed ", seed, ": ", x[i], " -> ", back);
      worst = std::max(worst, err / scale);
      largest_code = std::max(largest_code, std::fabs(code_value(codes[i])));
    }
    CHECK(largest_code == code_max<Code>);  // the block's absmax takes the largest code
    if constexpr (std::is_same_v<Code, std::int8_t>) CHECK(worst > 0.3f);  // the bound is half a step, and it is used
  }
}

template <class Code>
void check_open_block() {
  constexpr int layers = 2, heads = 2, dim = 8, block = 4, tokens = 23;  // 5 closed blocks and an open one of 3
  const std::size_t row = heads * dim;
  const std::vector<float> k = random_rows(tokens * row, 7), v = random_rows(tokens * row, 8);
  const auto rows = [&](const std::vector<float>& x, int first, int n) {
    return std::span<const float>(x).subspan(static_cast<std::size_t>(first) * row, static_cast<std::size_t>(n) * row);
  };
  quantized_cache<Code> at_once(layers, 32, heads, dim, block), one_by_one(layers, 32, heads, dim, block),
      chunks(layers, 32, heads, dim, block);
  for (int l = 0; l < layers; ++l) {
    REQUIRE(at_once.append(l, 0, rows(k, 0, tokens), rows(v, 0, tokens)).ok());
    for (int t = 0; t < tokens; ++t) REQUIRE(one_by_one.append(l, t, rows(k, t, 1), rows(v, t, 1)).ok());
    for (int t = 0; t < tokens;) {  // 3, then 5, 3, 5 ...: chunks that start and end inside blocks
      const int n = std::min(t % 2 == 0 ? 3 : 5, tokens - t);
      REQUIRE(chunks.append(l, t, rows(k, t, n), rows(v, t, n)).ok());
      t += n;
    }
  }
  for (const quantized_cache<Code>* c : {&one_by_one, &chunks}) {
    for (int l = 0; l < layers; ++l) {
      CHECK(c->stored(l) == tokens);
      for (int b = 0; b * block < tokens; ++b) {
        for (int h = 0; h < heads; ++h) {
          CHECK(c->k_scale(l, b, h) == at_once.k_scale(l, b, h));
          CHECK(c->v_scale(l, b, h) == at_once.v_scale(l, b, h));
        }
      }
      for (int t = 0; t < tokens; ++t) {
        for (std::size_t e = 0; e < row; ++e) {
          CHECK(c->k_at(l, t)[e] == at_once.k_at(l, t)[e]);
          CHECK(c->v_at(l, t)[e] == at_once.v_at(l, t)[e]);
        }
      }
    }
  }
  // A completed block's codes are quantize_block's over its keys; an open block's, over the keys so far.
  for (const int b : {0, 3, 5}) {
    const int n = std::min(block, tokens - b * block);
    for (int h = 0; h < heads; ++h) {
      std::vector<Code> want(static_cast<std::size_t>(n) * row);
      const float scale = quantize_block<Code>(k.data() + b * block * row + h * dim, row, n, dim, want.data() + h * dim, row);
      CHECK(one_by_one.k_scale(1, b, h) == scale);
      for (int r = 0; r < n; ++r) {
        for (int e = 0; e < dim; ++e) CHECK(one_by_one.k_at(1, b * block + r)[h * dim + e] == want[r * row + h * dim + e]);
      }
    }
  }
  // The open block's codes change as keys arrive: block 5 with 3 keys is not block 5 with 2.
  quantized_cache<Code> two(1, 32, heads, dim, block);
  REQUIRE(two.append(0, 0, rows(k, 0, 22), rows(v, 0, 22)).ok());
  bool differs = false;
  for (int h = 0; h < heads; ++h) differs |= two.k_scale(0, 5, h) != one_by_one.k_scale(0, 5, h);
  CHECK(differs);  // key 22 is the block's largest for some head (random data, checked for these seeds)
  // Dequantised values are scale · code.
  std::vector<float> dk(tokens * row), dv(tokens * row);
  one_by_one.dequantize(0, 0, tokens, dk.data(), dv.data());
  CHECK(dk[7 * row + dim + 3] == one_by_one.k_scale(0, 1, 1) * code_value(one_by_one.k_at(0, 7)[dim + 3]));
  CHECK(dv[22 * row + 5] == one_by_one.v_scale(0, 5, 0) * code_value(one_by_one.v_at(0, 22)[5]));
}

}  // namespace

TEST_CASE("kv_quant: int8 and fp8 codes round-trip random blocks within the stated bound") {
  check_round_trip<std::int8_t>();
  check_round_trip<skim::fp8_e4m3>();
}

TEST_CASE("kv_quant: a block of zeros takes a positive scale and zero codes") {
  std::vector<float> x(32, 0.0f);
  std::vector<std::int8_t> c(32, 5);
  CHECK(quantize_block<std::int8_t>(x.data(), 8, 4, 8, c.data(), 8) > 0.0f);
  CHECK(std::all_of(c.begin(), c.end(), [](std::int8_t v) { return v == 0; }));
}

TEST_CASE("kv_quant: the open block re-quantised key by key ends with the codes of the block at once") {
  check_open_block<std::int8_t>();
  check_open_block<skim::fp8_e4m3>();
}

TEST_CASE("kv_quant: append refuses keys that would rewrite a closed block or overflow the cache") {
  quantized_cache<std::int8_t> c(1, 8, 1, 4, 4);
  const std::vector<float> x = random_rows(6 * 4, 3);
  REQUIRE(c.append(0, 0, std::span<const float>(x).first(24), std::span<const float>(x).first(24)).ok());
  const std::span<const float> one = std::span<const float>(x).first(4);
  const skim::status inside = c.append(0, 2, one, one);  // block 0 is closed: its keys are gone
  CHECK(!inside.ok());
  CHECK(std::string(inside.message()).find("keys from 2 cannot be stored after 6") != std::string::npos);
  CHECK(c.append(0, 5, one, one).ok());  // inside the open block: rewrites key 5
  CHECK(c.append(0, 4, one, one).ok());  // a block boundary
  CHECK(!c.append(0, 8, one, one).ok());  // beyond the next key
  const skim::status full = c.append(0, 4, std::span<const float>(x).first(20), std::span<const float>(x).first(20));
  CHECK(std::string(full.message()).find("do not fit") != std::string::npos);
  CHECK(!c.append(0, 0, std::span<const float>(x).first(3), std::span<const float>(x).first(3)).ok());  // not whole rows
  CHECK(!c.append(1, 0, one, one).ok());
}

TEST_CASE("kv_quant: bad kv options give a clear error") {
  engine_options o;
  CHECK(parse_attention("kv=int4", o).find("unknown kv 'int4' (fp32, int8, fp8)") != std::string::npos);
  CHECK(parse_attention("kv=int8,exec=scalar", o).find("exec=simd") != std::string::npos);
  CHECK(parse_attention("policy=skim,router=tokens,kv=fp8", o).find("kv=fp8 runs with block summaries") != std::string::npos);
  CHECK(parse_attention("policy=skim,router=kmeans,kv=int8", o).find("block summaries") != std::string::npos);
  CHECK(parse_attention("policy=dense,evict=recency,kv=int8", o).find("eviction") != std::string::npos);
  REQUIRE(parse_attention("policy=skim,budget=0.125,kv=fp8", o).empty());
  CHECK(o.kv == kv_format::fp8);
  REQUIRE(parse_attention("dense", o).empty());
  CHECK(o.kv == kv_format::fp32);
}

namespace {

engine_options spec(const char* s) {
  engine_options o;
  const std::string e = parse_attention(s, o);
  REQUIRE_MESSAGE(e.empty(), e);
  return o;
}

std::vector<int> story_ids(const tokenizer& tok) {
  const std::string text = read_text(models_dir() / "tinystories_sample.txt");
  std::vector<int> ids = tok.encode(text.substr(0, 2000));
  ids.resize(std::min<std::size_t>(ids.size(), 256));
  return ids;
}

// Prefill logits (every position) of ids under a spec, and their mean next-token loss.
std::vector<float> logits_of(const model& m, const char* s, const std::vector<int>& ids, double& nll) {
  engine e(m, spec(s), static_cast<int>(ids.size()));
  std::vector<float> logits(ids.size() * static_cast<std::size_t>(m.cfg.vocab_size));
  const skim::status st = e.run(ids, logits);
  REQUIRE_MESSAGE(st.ok(), st.message());
  nll = next_token_nll(logits, ids, m.cfg.vocab_size);
  return logits;
}

// Relative L2 distance of two logit arrays.
double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * double(a[i] - b[i]), den += double(b[i]) * b[i];
  return std::sqrt(num / den);
}

}  // namespace

TEST_CASE("kv_quant: the engine's logits with an int8 or fp8 cache stay close to the fp32 cache's" * doctest::skip(model_missing())) {
  const auto& [m, tok] = real_model();
  const std::vector<int> ids = story_ids(tok);
  REQUIRE(ids.size() >= 200);
  struct pair_case {
    const char* fp32;
    const char* quant;
    double max_rel;   // relative L2 of the logits
    double max_dnll;  // |Δ mean loss| in nats
  };
  // stories260K's logits are large (docs/quality-kcode.md): fp8's 3 mantissa bits cost it several
  // times int8's error. Bounds about twice the measured values.
  // Measured: int8 0.020-0.021 and |Δ| <= 0.0072, fp8 0.045-0.046 and |Δ| <= 0.037.
  for (const pair_case& c : {pair_case{"dense", "kv=int8", 0.04, 0.015}, pair_case{"dense", "kv=fp8", 0.09, 0.06},
                             pair_case{"policy=skim,budget=0.25", "policy=skim,budget=0.25,kv=int8", 0.04, 0.015},
                             pair_case{"policy=skim,budget=0.25", "policy=skim,budget=0.25,kv=fp8", 0.09, 0.06},
                             pair_case{"policy=oracle,budget=0.25", "policy=oracle,budget=0.25,kv=int8", 0.04, 0.015}}) {
    const std::string name = c.quant;
    CAPTURE(name);
    double nll_f = 0, nll_q = 0;
    const std::vector<float> f = logits_of(m, c.fp32, ids, nll_f), q = logits_of(m, c.quant, ids, nll_q);
    const double d = rel_l2(q, f);
    MESSAGE(name, ": logits rel. L2 ", d, ", loss ", nll_q, " against ", nll_f);
    CHECK(d > 1e-5);  // the codes are read, not the floats
    CHECK(d < c.max_rel);
    CHECK(std::fabs(nll_q - nll_f) < c.max_dnll);
  }
}

TEST_CASE("kv_quant: token-by-token decode over a quantised cache follows the fp32 cache" * doctest::skip(model_missing())) {
  const auto& model_and_tok = real_model();
  const auto& m = model_and_tok.m;  // not a structured binding: clang 14 cannot capture one in a lambda
  std::vector<int> ids = story_ids(model_and_tok.tok);
  ids.resize(96);
  const auto v = static_cast<std::size_t>(m.cfg.vocab_size);
  const auto decode = [&](const char* s) {  // logits of every position, one token per call
    engine e(m, spec(s), static_cast<int>(ids.size()));
    std::vector<float> all(ids.size() * v);
    for (std::size_t t = 0; t < ids.size(); ++t) {
      const skim::status st = e.run(std::span<const int>(&ids[t], 1), std::span<float>(all).subspan(t * v, v));
      REQUIRE_MESSAGE(st.ok(), st.message());
    }
    return all;
  };
  for (const char* s : {"kv=int8", "policy=skim,budget=0.5,kv=int8", "policy=skim,budget=0.5,kv=fp8"}) {
    CAPTURE(s);
    std::string fp32 = s;
    fp32 = fp32 == "kv=int8" ? "dense" : fp32.substr(0, fp32.rfind(','));
    const double d = rel_l2(decode(s), decode(fp32.c_str()));
    CHECK(d > 1e-5);
    CHECK(d < (std::string(s).ends_with("fp8") ? 0.12 : 0.04));
  }
}

TEST_CASE("kv_quant: a quantised engine starts from a float cache; float-only backends refuse codes" * doctest::skip(model_missing())) {
  const auto& [m, tok] = real_model();
  std::vector<int> ids = story_ids(tok);
  ids.resize(64);
  const auto v = static_cast<std::size_t>(m.cfg.vocab_size);
  engine dense(m, spec("dense"), 80), same(m, spec("kv=int8"), 80), shared(m, spec("kv=int8"), 80);
  std::vector<float> a(v), b(v);
  REQUIRE(dense.run(std::span<const int>(ids).first(63), {}).ok());
  REQUIRE(same.run(std::span<const int>(ids).first(63), {}).ok());
  REQUIRE(shared.start_from(dense.cache()).ok());  // quantised as a prefill of the same rows
  // Layer 0's K/V do not depend on attention: the same floats in both prefills, hence the same codes.
  // (Later layers' differ: dense's rows come from fp32 attention.)
  const quantized_cache<std::int8_t>& x = *same.int8_cache();
  const quantized_cache<std::int8_t>& y = *shared.int8_cache();
  REQUIRE(x.stored(0) == 63);
  REQUIRE(y.stored(0) == 63);
  int differ = 0;
  for (int t = 0; t < 63; ++t) {
    for (int e = 0; e < x.kv_heads() * x.head_dim(); ++e) differ += x.k_at(0, t)[e] != y.k_at(0, t)[e] || x.v_at(0, t)[e] != y.v_at(0, t)[e];
  }
  CHECK(differ == 0);
  REQUIRE(dense.run(std::span<const int>(&ids[63], 1), a).ok());
  REQUIRE(shared.run(std::span<const int>(&ids[63], 1), b).ok());
  CHECK(shared.tokens() == 64);
  CHECK(rel_l2(b, a) > 1e-5);
  CHECK(rel_l2(b, a) < 0.04);
  const skim::status codes = dense.start_from(same.cache());
  CHECK(std::string(codes.message()).find("holds codes") != std::string::npos);

  // Options a parser refuses, built by hand: the backend refuses at run time, naming itself.
  engine_options o = spec("policy=skim,router=tokens,budget=0.5");
  o.kv = kv_format::int8;
  engine tokens(m, o, 80);
  const skim::status st = tokens.run(ids, {});
  REQUIRE(!st.ok());
  CHECK(std::string(st.message()).find("router=tokens reads K/V as floats and cannot run over a kv=int8 cache") != std::string::npos);
  engine_options sc = spec("dense,exec=scalar");
  sc.kv = kv_format::fp8;
  engine scalar(m, sc, 80);
  CHECK(std::string(scalar.run(ids, {}).message()).find("exec=scalar") != std::string::npos);
}
