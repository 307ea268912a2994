// skim::route::pooled_router against a brute-force router written from the definitions (in double,
// from the raw keys, not from the records), on random varlen batches with summaries built by
// skim::summarize::build; plus the causal future, both entry points agreeing, fp16/bf16 queries and
// every status the router returns.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "skim/concepts/router.hpp"
#include "skim/core/workspace.hpp"
#include "skim/route/pooled_router.hpp"
#include "skim/summarize/build.hpp"
#include "skim/summarize/lsh_buckets.hpp"
#include "skim/summarize/max_bound.hpp"
#include "skim/summarize/mean_pool.hpp"
#include "skim/summarize/multi_centroid.hpp"
#include "support/seed.hpp"

using namespace skim;
using route::group_reduce;
using route::pooled_router;
using route::query_pool;

namespace {

constexpr float neg_inf = -std::numeric_limits<float>::infinity();
using lsh = summarize::lsh_buckets<4, 3>;  // few buckets: most blocks collide, scores spread
constexpr query_pool all_pools[] = {query_pool::last, query_pool::mean, query_pool::max};
constexpr group_reduce all_reduces[] = {group_reduce::max, group_reduce::mean, group_reduce::sum};

std::uint32_t fresh_seed() { return skim::test::next_seed(); }  // support/seed.hpp
std::int32_t uniform(std::mt19937& rng, std::int32_t lo, std::int32_t hi) {  // [lo, hi]
  return std::uniform_int_distribution<std::int32_t>(lo, hi)(rng);
}
template <class T>
T pick(std::mt19937& rng, std::initializer_list<T> values) {
  return values.begin()[uniform(rng, 0, static_cast<std::int32_t>(values.size()) - 1)];
}
bool chance(std::mt19937& rng, double p) { return std::bernoulli_distribution(p)(rng); }

// offset + spread * N(0, 1), offset and spread random per call: keys are not centred (mean_pool scores
// are not all near 0) and never constant.
std::vector<float> random_values(std::mt19937& rng, std::size_t n) {
  const float offset = std::uniform_real_distribution<float>(-1.5f, 1.5f)(rng);
  const float spread = std::uniform_real_distribution<float>(0.2f, 2.0f)(rng);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = offset + spread * normal(rng);
  return v;
}

// One routing case: a varlen batch (1..4 sequences; with 2 or more one is empty: no queries, no keys
// or both; one has a ragged last key block when block_kv > 1), GQA 1/4/8, either index scope, causal
// or not, Q token- or head-major in TQ, K token-major fp32.
template <element TQ>
struct routing_case {
  std::int32_t heads_q = 1, heads_kv = 1, head_dim = 1, block_q = 1, block_kv = 1;
  mask_kind mask = mask_kind::causal;
  index_scope scope = index_scope::kv_head;
  float softmax_scale = 0.0f;
  bool q_head_major = false;
  std::vector<std::int32_t> cu_q{0}, cu_kv{0};
  std::vector<TQ> q;     // [tokens_q, heads_q, head_dim] or [heads_q, tokens_q, head_dim]
  std::vector<float> k;  // [tokens_kv, heads_kv, head_dim]

  explicit routing_case(std::mt19937& rng) {
    head_dim = pick(rng, {1, 3, 8, 16, 33, 64, 128});
    heads_kv = uniform(rng, 1, 2);
    heads_q = heads_kv * pick(rng, {1, 4, 8});
    block_q = pick(rng, {1, 3, 5, 8, 16, 17});
    block_kv = pick(rng, {1, 3, 4, 7, 16, 32});
    mask = chance(rng, 0.6) ? mask_kind::causal : mask_kind::none;
    scope = chance(rng, 0.6) ? index_scope::kv_head : index_scope::query_head;
    softmax_scale = chance(rng, 0.5) ? 0.0f : std::uniform_real_distribution<float>(0.05f, 2.0f)(rng);
    q_head_major = chance(rng, 0.3);
    const std::int32_t batch = uniform(rng, 1, 4);
    const std::int32_t empty = batch > 1 ? uniform(rng, 0, batch - 1) : -1;
    std::vector<std::int32_t> nq, nkv;
    for (std::int32_t b = 0; b < batch; ++b) {
      std::int32_t lq = 0, lkv = uniform(rng, 1, 80);
      switch (uniform(rng, 0, 3)) {
        case 0: lq = 1; break;                                      // decode
        case 1: lq = uniform(rng, 1, 60); lkv = uniform(rng, 1, lq); break;  // queries >= keys
        default: lq = uniform(rng, 1, lkv); break;
      }
      if (b == empty) {
        switch (uniform(rng, 0, 2)) {
          case 0: lq = 0; lkv = 0; break;  // nothing
          case 1: lq = 0; break;           // keys but no query: no rows
          default: lkv = 0; break;         // queries seeing no key: rows of -inf
        }
      }
      nq.push_back(lq);
      nkv.push_back(lkv);
    }
    const bool ragged = std::any_of(nkv.begin(), nkv.end(), [&](std::int32_t n) { return n % block_kv != 0; });
    if (!ragged && block_kv > 1) {
      for (auto& n : nkv) {
        if (n > 0) {
          n += uniform(rng, 1, block_kv - 1);
          break;
        }
      }
    }
    for (std::int32_t b = 0; b < batch; ++b) {
      cu_q.push_back(cu_q.back() + nq[b]);
      cu_kv.push_back(cu_kv.back() + nkv[b]);
    }
    const auto qv = random_values(rng, static_cast<std::size_t>(cu_q.back()) * heads_q * head_dim);
    q.resize(qv.size());
    for (std::size_t i = 0; i < qv.size(); ++i) q[i] = from_float<TQ>(qv[i]);
    k = random_values(rng, static_cast<std::size_t>(cu_kv.back()) * heads_kv * head_dim);
  }

  [[nodiscard]] problem prob() const {
    return problem{.heads_q = heads_q, .heads_kv = heads_kv, .head_dim = head_dim, .block_q = block_q,
                   .block_kv = block_kv, .mask = mask, .softmax_scale = softmax_scale, .cu_seqlens_q = cu_q,
                   .cu_seqlens_kv = cu_kv, .scope = scope};
  }
  [[nodiscard]] strided_view<const TQ> q_view() const {
    return q_head_major ? strided_view<const TQ>::head_major(q.data(), cu_q.back(), heads_q, head_dim)
                        : strided_view<const TQ>::token_major(q.data(), cu_q.back(), heads_q, head_dim);
  }
  [[nodiscard]] contiguous_kv<float> kv() const {
    return {.k = strided_view<const float>::token_major(k.data(), cu_kv.back(), heads_kv, head_dim),
            .v = strided_view<const float>::token_major(k.data(), cu_kv.back(), heads_kv, head_dim),
            .cu_seqlens_kv = {}};
  }
  // Query (sequence b, token t, query head h) as doubles.
  [[nodiscard]] std::vector<double> query(std::int32_t b, std::int32_t t, std::int32_t h) const {
    const TQ* row = q_view().row(cu_q[b] + t, h);
    std::vector<double> out(static_cast<std::size_t>(head_dim));
    for (std::int32_t i = 0; i < head_dim; ++i) out[i] = to_float(row[i]);
    return out;
  }
  [[nodiscard]] const float* key(std::int32_t b, std::int32_t t, std::int32_t h) const {
    return k.data() + (static_cast<std::size_t>(cu_kv[b] + t) * heads_kv + h) * head_dim;
  }
  [[nodiscard]] std::string describe() const {
    std::ostringstream s;
    s << "heads " << heads_q << "/" << heads_kv << " d " << head_dim << " bq " << block_q << " bk " << block_kv
      << (mask == mask_kind::causal ? " causal" : " no-mask")
      << (scope == index_scope::kv_head ? " kv-head rows" : " query-head rows") << " scale " << softmax_scale
      << (q_head_major ? " Q head-major" : "") << " " << element_name<TQ> << " seqs";
    for (std::size_t b = 0; b + 1 < cu_q.size(); ++b) s << " " << cu_q[b + 1] - cu_q[b] << "x" << cu_kv[b + 1] - cu_kv[b];
    return s.str();
  }
};

// A summary's score of one block from its raw keys, in double, and a magnitude bounding the fp32
// rounding error's scale (|q|·|k| terms; mean_pool sums keys, so their mean absolute value).
struct estimate {
  double value = 0;
  double magnitude = 0;
};
template <class S>
estimate brute_block_score(const std::vector<double>& q, const std::vector<double>& q_abs,
                           const std::vector<const float*>& keys, std::int32_t d) {
  estimate e;
  if constexpr (std::is_same_v<S, lsh>) {
    // Collisions of the raw (unprepared) query with every key, round by round; a count, so the
    // only rounding is the router's scaling of it.
    const std::vector<float> qf(q.begin(), q.end());
    for (int r = 0; r < S::rounds; ++r) {
      const std::int32_t want = S::bucket(r, qf.data(), d);
      for (const float* k : keys) e.value += S::bucket(r, k, d) == want ? 1.0 : 0.0;
    }
    e.magnitude = e.value;
    return e;
  }
  for (std::int32_t i = 0; i < d; ++i) {
    if constexpr (std::is_same_v<S, summarize::mean_pool>) {
      double mean = 0, mean_abs = 0;
      for (const float* k : keys) {
        mean += k[i];
        mean_abs += std::abs(k[i]);
      }
      mean /= static_cast<double>(keys.size());
      mean_abs /= static_cast<double>(keys.size());
      e.value += q[i] * mean;
      e.magnitude += q_abs[i] * mean_abs;
    } else {
      double lo = keys[0][i], hi = keys[0][i];
      for (const float* k : keys) {
        lo = std::min<double>(lo, k[i]);
        hi = std::max<double>(hi, k[i]);
      }
      e.value += std::max(q[i] * lo, q[i] * hi);
      e.magnitude += q_abs[i] * std::max(std::abs(lo), std::abs(hi));
    }
  }
  return e;
}

// The router's definition, row by row, written independently of the library: the scores
// [index_rows, max_kv_blocks] (future and padding -inf) and a tolerance per entry.
template <class S, element TQ>
void brute_scores(const routing_case<TQ>& c, query_pool pool, group_reduce reduce, std::vector<double>& want,
                  std::vector<double>& tol) {
  const problem p = c.prob();
  const std::int32_t width = p.max_kv_blocks();
  const std::int32_t d = c.head_dim, g = c.heads_q / c.heads_kv;
  const double scale = p.scale();
  want.assign(static_cast<std::size_t>(p.index_rows() * width), -std::numeric_limits<double>::infinity());
  tol.assign(want.size(), 0.0);
  std::int64_t row = 0;
  for (std::int32_t b = 0; b + 1 < static_cast<std::int32_t>(c.cu_q.size()); ++b) {
    const std::int32_t n_q = c.cu_q[b + 1] - c.cu_q[b], n_kv = c.cu_kv[b + 1] - c.cu_kv[b];
    // Keys query t sees: [0, sees(t)).
    auto sees = [&](std::int32_t t) {
      if (c.mask == mask_kind::none) return n_kv;
      return std::clamp(t + n_kv - n_q + 1, 0, n_kv);
    };
    for (std::int32_t first = 0; first < n_q; first += c.block_q) {
      const std::int32_t last = std::min(first + c.block_q, n_q) - 1;
      for (std::int32_t ih = 0; ih < p.index_heads(); ++ih, ++row) {
        std::vector<std::int32_t> heads;
        if (c.scope == index_scope::kv_head) {
          for (std::int32_t h = ih * g; h < (ih + 1) * g; ++h) heads.push_back(h);
        } else {
          heads.push_back(ih);
        }
        const std::int32_t kvh = heads[0] / g;
        for (std::int32_t j = 0; j * c.block_kv < sees(last); ++j) {
          std::vector<const float*> keys;
          for (std::int32_t t = j * c.block_kv; t < std::min((j + 1) * c.block_kv, n_kv); ++t) keys.push_back(c.key(b, t, kvh));
          double acc = reduce == group_reduce::max ? -std::numeric_limits<double>::infinity() : 0.0;
          double mag = 0;
          for (std::int32_t h : heads) {
            // The query vectors this head pools, each with its |q| for the tolerance.
            std::vector<std::vector<double>> qs, qas;
            if (pool == query_pool::last) {
              qs.push_back(c.query(b, last, h));
              qas.push_back(qs.back());
            } else if (pool == query_pool::mean) {
              std::vector<double> m(static_cast<std::size_t>(d), 0.0), ma(m);
              for (std::int32_t t = first; t <= last; ++t) {
                const auto x = c.query(b, t, h);
                for (std::int32_t i = 0; i < d; ++i) {
                  m[i] += x[i] / (last - first + 1);
                  ma[i] += std::abs(x[i]) / (last - first + 1);
                }
              }
              qs.push_back(m);
              qas.push_back(ma);
            } else {
              for (std::int32_t t = first; t <= last; ++t) {
                if (j * c.block_kv >= sees(t)) continue;  // query t sees no key of block j
                qs.push_back(c.query(b, t, h));
                qas.push_back(qs.back());
              }
            }
            double s = -std::numeric_limits<double>::infinity(), s_mag = 0;
            for (std::size_t v = 0; v < qs.size(); ++v) {
              std::vector<double> qa = qas[v];
              for (double& x : qa) x = std::abs(x);
              const estimate e = brute_block_score<S>(qs[v], qa, keys, d);
              s = std::max(s, e.value);
              s_mag = std::max(s_mag, e.magnitude);
            }
            acc = reduce == group_reduce::max ? std::max(acc, s) : acc + s;
            mag += s_mag;
          }
          if (reduce == group_reduce::mean) acc /= static_cast<double>(heads.size());
          const std::size_t at = static_cast<std::size_t>(row * width + j);
          want[at] = acc * scale;
          // fp32: d products and sums, bk key sums, bq query sums, each ~6e-8 relative to the magnitude.
          tol[at] = 1e-6 * (8 + d + c.block_kv + c.block_q) * mag * scale + 1e-30;
        }
      }
    }
  }
}

std::string show(const status& s) { return std::string(to_string(s.code())) + ": " + s.message(); }

template <class S>
std::vector<float> build_records(const problem& p, const contiguous_kv<float>& kv) {
  std::vector<float> records(static_cast<std::size_t>(summarize::make_summary_layout<S>(p).floats()),
                             std::numeric_limits<float>::quiet_NaN());
  workspace_buffer ws(summarize::workspace_bytes<S>(p));
  const status s = summarize::build<S>(p, kv, records, ws.span());
  REQUIRE_MESSAGE(s.ok(), show(s));
  return records;
}

// Aligned scratch filled with 0xff bytes (NaN floats): a router relying on zeroed scratch fails.
struct dirty_workspace {
  workspace_buffer buffer;
  explicit dirty_workspace(std::size_t n) : buffer(n) {
    if (n > 0) std::memset(buffer.span().data(), 0xff, n);
  }
  [[nodiscard]] std::span<std::byte> span() const { return buffer.span(); }
};

// score() against the brute force; then score_row() for every row, into a span wider than the row,
// must give the same bits, with -inf past the visible blocks.
template <class S, element TQ>
void check_case(std::uint32_t seed, query_pool pool, group_reduce reduce) {
  std::mt19937 rng(seed);
  const routing_case<TQ> c(rng);
  const problem p = c.prob();
  INFO("seed " << seed << ": pool " << route::to_string(pool) << ", reduce " << route::to_string(reduce) << ", "
               << (std::is_same_v<S, summarize::mean_pool> ? "mean_pool"
                   : std::is_same_v<S, lsh>                 ? "lsh_buckets"
                                                            : "max_bound")
               << ", " << c.describe());
  const std::vector<float> records = build_records<S>(p, c.kv());
  const pooled_router router{.pool = pool, .reduce = reduce};
  dirty_workspace ws(router.workspace_bytes(p));
  const std::int32_t width = p.max_kv_blocks();
  std::vector<float> got(static_cast<std::size_t>(p.index_rows() * width), std::numeric_limits<float>::quiet_NaN());
  const status s = router.score<S>(p, c.q_view(), records, got, ws.span());
  REQUIRE_MESSAGE(s.ok(), show(s));

  std::vector<double> want, tol;
  brute_scores<S>(c, pool, reduce, want, tol);
  REQUIRE(want.size() == got.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("row " << i / static_cast<std::size_t>(width) << ", block " << i % static_cast<std::size_t>(width)
                << ": got " << got[i] << ", want " << want[i]);
    if (std::isinf(want[i])) {
      REQUIRE(got[i] == neg_inf);
    } else {
      REQUIRE(std::isfinite(got[i]));
      REQUIRE(std::abs(got[i] - want[i]) <= tol[i]);
    }
  }

  const summarize::summary_layout l = summarize::make_summary_layout<S>(p);
  const status walk = for_each_row(p, [&](const row_info& r) -> status {
    const std::span<const float> seq_records(records.data() + l.sequence_offset(r.seq),
                                             static_cast<std::size_t>(l.sequence_floats(r.seq)));
    std::vector<float> one(static_cast<std::size_t>(r.kv_blocks) + 3, std::numeric_limits<float>::quiet_NaN());
    SKIM_TRY(router.score_row<S>(p, r, c.q_view(), seq_records, one, ws.span()));
    for (std::size_t j = 0; j < one.size(); ++j) {
      INFO("score_row, row " << r.row << ", block " << j);
      if (j < static_cast<std::size_t>(r.visible_blocks)) {
        CHECK(std::memcmp(&one[j], &got[static_cast<std::size_t>(r.row * width) + j], sizeof(float)) == 0);
      } else {
        CHECK(one[j] == neg_inf);
      }
    }
    return status::success();
  });
  REQUIRE_MESSAGE(walk.ok(), show(walk));
}

// A fixed problem for the targeted tests: one sequence, q_len x kv_len, block sizes 4.
struct small_case {
  std::vector<std::int32_t> cu_q, cu_kv;
  std::vector<float> q, k;
  problem p;
  small_case(std::mt19937& rng, std::int32_t n_q, std::int32_t n_kv, mask_kind mask, std::int32_t heads_q = 4,
             std::int32_t heads_kv = 2, std::int32_t d = 8)
      : cu_q{0, n_q}, cu_kv{0, n_kv} {
    p = problem{.heads_q = heads_q, .heads_kv = heads_kv, .head_dim = d, .block_q = 4, .block_kv = 4, .mask = mask,
                .cu_seqlens_q = cu_q, .cu_seqlens_kv = cu_kv};
    q = random_values(rng, static_cast<std::size_t>(n_q) * heads_q * d);
    k = random_values(rng, static_cast<std::size_t>(n_kv) * heads_kv * d);
  }
  [[nodiscard]] strided_view<const float> q_view() const {
    return strided_view<const float>::token_major(q.data(), p.tokens_q(), p.heads_q, p.head_dim);
  }
  [[nodiscard]] contiguous_kv<float> kv() const {
    return {.k = strided_view<const float>::token_major(k.data(), p.tokens_kv(), p.heads_kv, p.head_dim),
            .v = strided_view<const float>::token_major(k.data(), p.tokens_kv(), p.heads_kv, p.head_dim),
            .cu_seqlens_kv = {}};
  }
};

}  // namespace

static_assert(router<pooled_router, summarize::mean_pool>);
static_assert(router<pooled_router, summarize::max_bound>);

TEST_CASE("route::pooled_router matches a brute-force router for every pool x reduce (mean_pool, fp32 Q)") {
  for (query_pool pool : all_pools) {
    for (group_reduce reduce : all_reduces) {
      for (int i = 0; i < 8; ++i) check_case<summarize::mean_pool, float>(fresh_seed(), pool, reduce);
    }
  }
}

TEST_CASE("route::pooled_router matches a brute-force router for every pool x reduce (max_bound, fp32 Q)") {
  for (query_pool pool : all_pools) {
    for (group_reduce reduce : all_reduces) {
      for (int i = 0; i < 8; ++i) check_case<summarize::max_bound, float>(fresh_seed(), pool, reduce);
    }
  }
}

// lsh_buckets prepares each pooled query once (its bucket ids) and scores by lookups: the router's
// scores must be the collision counts of the raw query. Mean pooling is left out: its fp32 mean and
// the brute force's double mean may fall on either side of a hyperplane.
TEST_CASE("route::pooled_router with a prepared query (lsh_buckets) counts the raw query's collisions") {
  for (query_pool pool : {query_pool::last, query_pool::max}) {
    for (group_reduce reduce : all_reduces) {
      for (int i = 0; i < 8; ++i) check_case<lsh, float>(fresh_seed(), pool, reduce);
      check_case<lsh, half>(fresh_seed(), pool, reduce);
    }
  }
}

TEST_CASE("route::pooled_router reads fp16 and bf16 queries") {
  for (query_pool pool : all_pools) {
    for (group_reduce reduce : all_reduces) {
      for (int i = 0; i < 2; ++i) {
        check_case<summarize::mean_pool, half>(fresh_seed(), pool, reduce);
        check_case<summarize::max_bound, bfloat16>(fresh_seed(), pool, reduce);
        check_case<summarize::max_bound, half>(fresh_seed(), pool, reduce);
        check_case<summarize::mean_pool, bfloat16>(fresh_seed(), pool, reduce);
      }
    }
  }
}

TEST_CASE("route::pooled_router: causal future blocks are -inf, the diagonal block is a candidate") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  // 12 queries over 12 keys, blocks of 4: query block i sees key blocks [0, i]; block i is partial.
  for (mask_kind mask : {mask_kind::causal, mask_kind::none}) {
    const small_case c(rng, 12, 12, mask);
    const auto records = build_records<summarize::max_bound>(c.p, c.kv());
    for (query_pool pool : all_pools) {
      const pooled_router router{.pool = pool, .reduce = group_reduce::mean};
      INFO("pool " << route::to_string(pool) << (mask == mask_kind::causal ? ", causal" : ", no mask"));
      dirty_workspace ws(router.workspace_bytes(c.p));
      std::vector<float> s(static_cast<std::size_t>(c.p.index_rows() * 3), 0.0f);
      REQUIRE(router.score<summarize::max_bound>(c.p, c.q_view(), records, s, ws.span()).ok());
      for (std::int32_t qb = 0; qb < 3; ++qb) {
        for (std::int32_t h = 0; h < 2; ++h) {
          for (std::int32_t j = 0; j < 3; ++j) {
            const float x = s[static_cast<std::size_t>((qb * 2 + h) * 3 + j)];
            INFO("query block " << qb << ", kv head " << h << ", key block " << j << ": " << x);
            if (mask == mask_kind::causal && j > qb) {
              CHECK(x == neg_inf);
            } else {
              CHECK(std::isfinite(x));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("route::pooled_router: one query per block makes last, mean and max the same bits") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const small_case c(rng, 1, 13, mask_kind::causal, 8, 1, 16);  // decode, GQA 8, ragged last block
  const auto records = build_records<summarize::mean_pool>(c.p, c.kv());
  std::vector<std::vector<float>> out;
  for (query_pool pool : all_pools) {
    const pooled_router router{.pool = pool, .reduce = group_reduce::sum};
    dirty_workspace ws(router.workspace_bytes(c.p));
    out.emplace_back(4, 0.0f);
    REQUIRE(router.score<summarize::mean_pool>(c.p, c.q_view(), records, out.back(), ws.span()).ok());
    for (float x : out.back()) CHECK(std::isfinite(x));  // decode sees every key
  }
  CHECK(std::memcmp(out[0].data(), out[1].data(), 4 * sizeof(float)) == 0);
  CHECK(std::memcmp(out[0].data(), out[2].data(), 4 * sizeof(float)) == 0);
}

// The router's decode scores, bit for bit, as the contract spells them out from S::score: each head's
// score (NaN as -inf), summed in head order, times the scale. Its fast paths (score4: four heads side
// by side; score4_blocks: S::score4_blocks_per_call blocks a call, four heads as vector lanes,
// group sizes not a multiple of four finished head by head, the blocks after the last whole group
// one by one) must give these bits.
template <class S>
void check_decode_bits(std::mt19937& rng) {
  const std::int32_t heads_kv = pick(rng, {1, 2});
  const std::int32_t group = pick(rng, {1, 2, 4, 6, 8, 12});
  const std::int32_t d = pick(rng, {1, 3, 8, 13, 64, 128});
  const std::int32_t n_kv = uniform(rng, 1, 90);
  INFO("group " << group << ", heads_kv " << heads_kv << ", d " << d << ", keys " << n_kv);
  const small_case c(rng, 1, n_kv, mask_kind::causal, group * heads_kv, heads_kv, d);
  std::vector<float> records = build_records<S>(c.p, c.kv());
  const pooled_router router{.pool = query_pool::last, .reduce = group_reduce::sum};
  dirty_workspace ws(router.workspace_bytes(c.p));
  const std::int32_t blocks = c.p.kv_blocks(0);
  std::vector<float> got(static_cast<std::size_t>(heads_kv * blocks));
  REQUIRE(router.score<S>(c.p, c.q_view(), records, got, ws.span()).ok());
  const std::int64_t rf = S::record_floats(d);
  for (std::int32_t h = 0; h < heads_kv; ++h) {
    for (std::int32_t j = 0; j < blocks; ++j) {
      const float* record = records.data() + (static_cast<std::int64_t>(j) * heads_kv + h) * rf;
      float acc = 0.0f;
      for (std::int32_t g = 0; g < group; ++g) {
        const float x = S::score(record, c.q.data() + static_cast<std::int64_t>(h * group + g) * d, d);
        acc += x > neg_inf ? x : neg_inf;
      }
      const float want = acc == neg_inf ? neg_inf : acc * c.p.scale();
      const float have = got[static_cast<std::size_t>(h * blocks + j)];
      INFO("kv head " << h << ", block " << j);
      CHECK(std::memcmp(&want, &have, sizeof want) == 0);
    }
  }
}

TEST_CASE("route::pooled_router decode scores are S::score's bits (mean_pool, multi_centroid, max_bound)") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (int i = 0; i < 12; ++i) {
    check_decode_bits<summarize::mean_pool>(rng);
    check_decode_bits<summarize::multi_centroid<2>>(rng);
    check_decode_bits<summarize::multi_centroid<4>>(rng);
    check_decode_bits<summarize::max_bound>(rng);
  }
}

TEST_CASE("route::pooled_router: scores are in logit units (softmax scale applied)") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  small_case c(rng, 8, 16, mask_kind::none);
  const auto records = build_records<summarize::mean_pool>(c.p, c.kv());
  const pooled_router router{.pool = query_pool::last, .reduce = group_reduce::max};
  dirty_workspace ws(router.workspace_bytes(c.p));
  std::vector<float> unit(static_cast<std::size_t>(c.p.index_rows() * 4)), scaled(unit.size());
  c.p.softmax_scale = 1.0f;
  REQUIRE(router.score<summarize::mean_pool>(c.p, c.q_view(), records, unit, ws.span()).ok());
  c.p.softmax_scale = 0.25f;  // a power of two: exact
  REQUIRE(router.score<summarize::mean_pool>(c.p, c.q_view(), records, scaled, ws.span()).ok());
  for (std::size_t i = 0; i < unit.size(); ++i) CHECK(scaled[i] == unit[i] * 0.25f);
}

TEST_CASE("route::pooled_router statuses name the bad value and its place") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const small_case c(rng, 8, 10, mask_kind::causal);  // 2 query blocks x 2 kv heads, 3 kv blocks
  using S = summarize::mean_pool;
  const auto records = build_records<S>(c.p, c.kv());
  const pooled_router router{.pool = query_pool::max, .reduce = group_reduce::max};
  const std::size_t bytes = router.workspace_bytes(c.p);
  // [group 2, bq 4, prepared_query_capacity(d 8) = 16], max_block_group 8 x 2 scores, 2 x 8 interleaved query floats
  CHECK(bytes == (2 * 4 * 16 + 8 * 2 + 2 * 8) * sizeof(float));
  dirty_workspace ws(bytes + workspace_alignment);
  std::vector<float> scores(12, 0.0f);
  REQUIRE(router.score<S>(c.p, c.q_view(), records, scores, ws.span()).ok());

  auto expect = [](const status& s, status_code code, std::string_view message) {
    CHECK(s.code() == code);
    CHECK(std::string_view(s.message()) == message);
  };
  problem bad = c.p;
  bad.heads_q = 0;
  expect(router.score<S>(bad, c.q_view(), records, scores, ws.span()), status_code::invalid_argument, "heads_q 0 <= 0");
  CHECK(router.workspace_bytes(bad) == 0);  // safe for a rejected problem
  bad = c.p;
  bad.softmax_scale = -0.5f;
  expect(router.score<S>(bad, c.q_view(), records, scores, ws.span()), status_code::unsupported,
         "softmax_scale -0.5 < 0: summaries estimate the largest q.k, the largest logit only for a positive scale");
  expect(pooled_router{.pool = static_cast<query_pool>(7)}.can_implement(c.p), status_code::invalid_argument,
         "query_pool 7 is not last, mean or max");
  expect(pooled_router{.reduce = static_cast<group_reduce>(9)}.can_implement(c.p), status_code::invalid_argument,
         "group_reduce 9 is not max, mean or sum");

  const auto q_short = strided_view<const float>::token_major(c.q.data(), 7, 4, 8);
  expect(router.score<S>(c.p, q_short, records, scores, ws.span()), status_code::shape_mismatch,
         "Q is [7, 4, 8], expected [8, 4, 8]");
  expect(router.score<S>(c.p, c.q_view(), std::span(records).first(records.size() - 1), scores, ws.span()),
         status_code::shape_mismatch, "records has 53 floats, needs 54 (3 kv blocks x 2 kv heads x 9 floats)");
  expect(router.score<S>(c.p, c.q_view(), records, std::span(scores).first(11), ws.span()),
         status_code::shape_mismatch, "scores has 11 floats, needs 12 (4 index rows x 3 max kv blocks)");
  expect(router.score<S>(c.p, c.q_view(), records, scores, ws.span().first(bytes - 1)),
         status_code::workspace_too_small,
         "workspace has " + std::to_string(bytes - 1) + " bytes, needs " + std::to_string(bytes));
  const auto misaligned = ws.span().subspan(4, bytes);
  const status mis = router.score<S>(c.p, c.q_view(), records, scores, misaligned);
  CHECK(mis.code() == status_code::misaligned);

  // score_row: the row must be one make_row_info gives, and the spans the row's sizes.
  const row_info good = make_row_info(c.p, 0, 0, 1, 1);
  CHECK(good.row == 3);
  std::vector<float> one(3, 0.0f);
  REQUIRE(router.score_row<S>(c.p, good, c.q_view(), records, one, ws.span()).ok());
  row_info r = good;
  r.seq = 1;
  expect(router.score_row<S>(c.p, r, c.q_view(), records, one, ws.span()), status_code::invalid_argument,
         "row 3: sequence 1 out of [0, 1)");
  r = good;
  r.q_block = 2;
  expect(router.score_row<S>(c.p, r, c.q_view(), records, one, ws.span()), status_code::invalid_argument,
         "row 3: query block 2 out of [0, 2) of sequence 0");
  r = good;
  r.head = -1;
  expect(router.score_row<S>(c.p, r, c.q_view(), records, one, ws.span()), status_code::invalid_argument,
         "row 3: index head -1 out of [0, 2)");
  r = good;
  r.visible_blocks = 2;
  expect(router.score_row<S>(c.p, r, c.q_view(), records, one, ws.span()), status_code::invalid_argument,
         "row 3: geometry (queries [4, 8), 10 keys, 2 visible of 3 kv blocks) differs from make_row_info's ([4, 8), 10, 3 of 3)");
  expect(router.score_row<S>(c.p, good, c.q_view(), std::span(records).first(53), one, ws.span()),
         status_code::shape_mismatch,
         "records of sequence 0 has 53 floats, needs 54 (3 kv blocks x 2 kv heads x 9 floats) for row 3");
  expect(router.score_row<S>(c.p, good, c.q_view(), records, std::span(one).first(2), ws.span()),
         status_code::shape_mismatch, "scores of row 3 has 2 floats, needs kv blocks 3");
  expect(router.score_row<S>(c.p, good, c.q_view(), records, one, {}), status_code::workspace_too_small,
         "workspace has 0 bytes, needs " + std::to_string(bytes));
}
