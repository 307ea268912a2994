// Numeric hostility: non-finite values in Q, K, V; scores near the top of float's range; extreme
// head_dim; empty and one-token sequences; blocks larger than the sequence.
//
// Contract tested (documented in docs/reliability.md):
//  - A NaN in Q row (t, h) makes only output row (t, h) non-finite.
//  - A NaN anywhere in key j's K row makes every output row that *sees* key j (causally visible
//    and in a selected block) non-finite; a NaN in V[j][e] makes element e of those rows NaN. Rows
//    that do not see key j are bit-identical to a run without the NaN.
//  - ±inf in K or V: rows that do not see that key are bit-identical to a clean run; rows that see
//    it may be non-finite (q·k = ±inf or inf - inf in the softmax).
//  - Huge finite scores (|scale·q·k| ~ 1e30, with every partial product finite in fp32): the online
//    softmax never overflows — the output is finite and matches the double reference (the softmax
//    is then a hard max) and lse ~ the max score. Scores beyond float's range (products > 3.4e38)
//    are the caller's duty.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "skim/core/attention_args.hpp"
#include "skim/exec/cpu/reference.hpp"
#include "skim/exec/cpu/scalar.hpp"
#include "skim/exec/cpu/simd.hpp"
#include "skim/index/block_union.hpp"
#include "skim/index/causal_all.hpp"
#include "skim/index/sink.hpp"
#include "skim/index/sliding_window.hpp"
#include "support/compare.hpp"
#include "support/random_case.hpp"

using namespace skim;
using namespace skim::test;

namespace {

using simd_default = exec::simd<xsimd::default_arch>;
constexpr float nan_f = std::numeric_limits<float>::quiet_NaN();
constexpr float inf_f = std::numeric_limits<float>::infinity();

// One sequence, 20 queries over 40 keys (causal: query i sees keys j <= i + 20), 2 query heads on
// one kv head, head_dim 8, blocks of 8; index = sink 1 + window 2, so some rows skip some blocks.
struct one_sequence {
  case_spec spec;
  random_case<float, float> c;
  one_sequence() : spec(make_spec()), c(spec, rng()) {}
  static case_spec make_spec() {
    case_spec s;
    s.heads_q = 2;
    s.heads_kv = 1;
    s.head_dim = 8;
    s.block_q = 8;
    s.block_kv = 8;
    s.seqs = {{20, 40}};
    return s;
  }
  static std::mt19937& rng() {
    static std::mt19937 r(0xbadf00du);
    return r;
  }
};

using sparse_index = index::block_union<index::sink, index::sliding_window>;
const sparse_index sparse{{index::sink{1}, index::sliding_window{2}}};

template <class E>
void run(const E& e, const random_case<float, float>& c, output<float>& out) {
  const attention_args<float, contiguous_kv<float>, sparse_index, float> a{
      .prob = c.prob(), .q = c.q_view(), .kv = c.contiguous(), .index = sparse, .o = out.view, .lse = out.lse};
  const status s = run_executor(e, a);
  REQUIRE_MESSAGE(s.ok(), s.message());
}

// Does query q (of the one sequence) see key j through `sparse`?
bool sees(const problem& p, std::int32_t q, std::int32_t j) {
  const row_info r = make_row_info(p, 0, 0, q / p.block_q, 0);
  if (j >= r.visible_keys(q, p.mask)) return false;
  for (auto c = sparse.cursor(r); !c.done(); c.next()) {
    if (c.id() == j / p.block_kv) return true;
  }
  return false;
}


bool row_finite(const output<float>& o, std::int32_t t, std::int32_t h, std::int32_t d) {
  const float* x = o.view.row(t, h);
  for (std::int32_t e = 0; e < d; ++e) {
    if (!std::isfinite(x[e])) return false;
  }
  return true;
}

bool row_same(const output<float>& a, const output<float>& b, std::int32_t t, std::int32_t h, std::int32_t d) {
  return std::memcmp(a.view.row(t, h), b.view.row(t, h), sizeof(float) * d) == 0;
}

}  // namespace

TEST_CASE_TEMPLATE("numerics: NaN or inf in Q/K/V reaches only the rows that see it", E, exec::reference,
                   exec::scalar, simd_default) {
  one_sequence base;
  const problem p = base.c.prob();
  const std::int32_t d = base.spec.head_dim, hq = base.spec.heads_q;
  output<float> clean(base.spec, 20);
  run(E{}, base.c, clean);

  SUBCASE("NaN in one Q row: only that output row") {
    random_case<float, float> c = base.c;
    c.q[(7 * hq + 1) * d + 3] = nan_f;  // token 7, head 1
    output<float> out(base.spec, 20);
    run(E{}, c, out);
    for (std::int32_t t = 0; t < 20; ++t) {
      for (std::int32_t h = 0; h < hq; ++h) {
        CAPTURE(t);
        CAPTURE(h);
        if (t == 7 && h == 1) {
          CHECK(!row_finite(out, t, h, d));
        } else {
          CHECK(row_same(out, clean, t, h, d));
        }
      }
    }
  }
  // Keys: in the sink block; in block 1, which no row selects; in block 2, selected by some rows; in
  // partial tiles (causally masked for some rows of a selected block); the last key.
  for (const std::int32_t key : {3, 12, 20, 27, 39}) {
    for (const bool in_v : {false, true}) {
      for (const float bad : {nan_f, inf_f}) {
        CAPTURE(key);
        CAPTURE(in_v);
        CAPTURE(bad);
        random_case<float, float> c = base.c;
        (in_v ? c.v : c.k)[static_cast<std::size_t>(key) * d + 5] = bad;
        output<float> out(base.spec, 20);
        run(E{}, c, out);
        std::int32_t seeing = 0;
        for (std::int32_t t = 0; t < 20; ++t) {
          for (std::int32_t h = 0; h < hq; ++h) {
            CAPTURE(t);
            if (!sees(p, t, key)) {
              CHECK(row_same(out, clean, t, h, d));  // untouched, bit for bit
              continue;
            }
            ++seeing;
            if (std::isnan(bad)) {
              CHECK(!row_finite(out, t, h, d));  // a NaN key or value poisons every row that sees it
              if (in_v) CHECK(std::isnan(out.view.row(t, h)[5]));
            }
          }
        }
        CHECK((seeing > 0) == (key != 12));  // block 1 is in no row; every other key is seen
      }
    }
  }
}

TEST_CASE_TEMPLATE("numerics: scores of magnitude 1e30 do not overflow the online softmax", E, exec::scalar,
                   simd_default) {
  // q = 1e15·e0, k_j = 1e15·c_j·e0 with distinct c_j in [-1, 1]: scale·q·k_j ~ 1e30·c_j / sqrt(d).
  // Every product is finite in fp32 (1e30 < 3.4e38); the softmax is a hard max: o = V of the best
  // visible key, lse = its score. Reference (double) and executor must agree and stay finite.
  case_spec spec = one_sequence::make_spec();
  spec.heads_q = 1;
  spec.seqs = {{5, 29}, {1, 9}};
  std::mt19937 rng(0x1e30u);
  random_case<float, float> c(spec, rng);
  const std::int32_t d = spec.head_dim;
  for (std::size_t t = 0; t < c.q.size() / d; ++t) {
    for (std::int32_t e = 0; e < d; ++e) c.q[t * d + e] = e == 0 ? (t % 2 ? 1e15f : -1e15f) : 0.0f;
  }
  for (std::size_t j = 0; j < c.k.size() / d; ++j) {
    for (std::int32_t e = 0; e < d; ++e) {
      c.k[j * d + e] = e == 0 ? 1e15f * (static_cast<float>((j * 7919) % 61) / 30.0f - 1.0f) : 1.0f;
    }
  }
  const problem p = c.prob();
  for (const bool causal_all : {true, false}) {
    CAPTURE(causal_all);
    output<float> out(spec, c.tokens_q()), ref(spec, c.tokens_q());
    if (causal_all) {
      const attention_args<float, contiguous_kv<float>, index::causal_all, float> a{
          .prob = p, .q = c.q_view(), .kv = c.contiguous(), .index = {}, .o = out.view, .lse = out.lse};
      REQUIRE(run_executor(E{}, a).ok());
      auto r = a;
      r.o = ref.view;
      r.lse = ref.lse;
      REQUIRE(run_executor(exec::reference{}, r).ok());
    } else {
      const attention_args<float, contiguous_kv<float>, sparse_index, float> a{
          .prob = p, .q = c.q_view(), .kv = c.contiguous(), .index = sparse, .o = out.view, .lse = out.lse};
      REQUIRE(run_executor(E{}, a).ok());
      auto r = a;
      r.o = ref.view;
      r.lse = ref.lse;
      REQUIRE(run_executor(exec::reference{}, r).ok());
    }
    for (float x : out.o) CHECK(std::isfinite(x));
    for (float x : out.lse) CHECK(std::isfinite(x));
    check(compare(p, out.view, ref.view, out.lse, ref.lse, 1e-5, 1e-5));
  }
}

TEST_CASE_TEMPLATE("numerics: head_dim 1 and 256, empty and one-token sequences, blocks larger than the sequence",
                   E, exec::scalar, simd_default) {
  std::mt19937 rng(0x256u);
  for (const std::int32_t d : {1, 256}) {
    for (const std::int32_t block : {1, 16, 256, 300}) {
      for (const mask_kind mask : {mask_kind::causal, mask_kind::none}) {
        case_spec spec;
        spec.heads_q = 4;
        spec.heads_kv = 2;
        spec.head_dim = d;
        spec.block_q = block;
        spec.block_kv = block == 300 ? 7 : block;  // bq > sequence, bk small: independent sizes
        spec.mask = mask;
        // Empty queries, empty keys, both empty, one token, one query over many keys, more queries than keys.
        spec.seqs = {{0, 0}, {0, 5}, {3, 0}, {1, 1}, {1, 0}, {0, 1}, {1, 40}, {9, 4}, {13, 13}};
        for (const bool paged : {false, true}) {
          spec.paged = paged;
          spec.page_size = 3;
          CAPTURE(spec.describe());
          const random_case<float, float> c(spec, rng);
          const problem p = c.prob();
          output<float> out(spec, c.tokens_q()), ref(spec, c.tokens_q());
          c.with_kv([&](auto kv) {
            using KV = decltype(kv);
            const attention_args<float, KV, index::causal_all, float> a{
                .prob = p, .q = c.q_view(), .kv = kv, .index = {}, .o = out.view, .lse = out.lse};
            REQUIRE(run_executor(E{}, a).ok());
            auto r = a;
            r.o = ref.view;
            r.lse = ref.lse;
            REQUIRE(run_executor(exec::reference{}, r).ok());
          });
          check(compare(p, out.view, ref.view, out.lse, ref.lse, output_tolerance<float>));
          // Sequences with no key, and causal queries before the first key: o = 0, lse = -inf.
          for (std::int32_t b = 0; b < p.batch(); ++b) {
            const std::int32_t nq = p.seq_len_q(b), nkv = p.seq_len_kv(b);
            for (std::int32_t i = 0; i < nq; ++i) {
              const bool sees_nothing = nkv == 0 || (mask == mask_kind::causal && i + nkv - nq < 0);
              if (!sees_nothing) continue;
              for (std::int32_t h = 0; h < spec.heads_q; ++h) {
                const std::int32_t t = p.cu_seqlens_q[b] + i;
                CHECK(out.lse[t * spec.heads_q + h] == -inf_f);
                for (std::int32_t e = 0; e < d; ++e) CHECK(out.view.row(t, h)[e] == 0.0f);
              }
            }
          }
        }
      }
    }
  }
}
