// skim::route::kmeans (build, append) and kmeans_router against slow implementations written here
// from the header's definitions: k-means++ seeding recomputing every distance to every seed, Lloyd
// over per-key assignments, the running-mean append, and a scorer that sorts every candidate. All
// of them use the documented fp32 arithmetic, so the comparisons are bit for bit (no tolerance).
// Plus: a planted-cluster case routed through select::top_k against a sliding window, determinism,
// no allocation, and the statuses.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "skim/core/workspace.hpp"
#include "skim/route/kmeans.hpp"
#include "skim/route/kmeans_router.hpp"
#include "skim/select/top_k.hpp"
#include "support/allocation_counter.hpp"
#include "support/seed.hpp"

using namespace skim;
using route::kmeans_router;
using route::query_pool;
namespace km = skim::route::kmeans;

namespace {

constexpr float neg_inf = -std::numeric_limits<float>::infinity();

std::uint32_t fresh_seed() { return skim::test::next_seed(); }
std::int32_t uniform(std::mt19937& rng, std::int32_t lo, std::int32_t hi) {  // [lo, hi]
  return std::uniform_int_distribution<std::int32_t>(lo, hi)(rng);
}
template <class T>
T pick(std::mt19937& rng, std::initializer_list<T> values) {
  return values.begin()[uniform(rng, 0, static_cast<std::int32_t>(values.size()) - 1)];
}
bool chance(std::mt19937& rng, double p) { return std::bernoulli_distribution(p)(rng); }
std::string show(const status& s) { return std::string(to_string(s.code())) + ": " + s.message(); }

// offset + spread * N(0, 1), offset and spread random per call (keys neither centred nor unit).
std::vector<float> random_values(std::mt19937& rng, std::size_t n) {
  const float offset = std::uniform_real_distribution<float>(-1.5f, 1.5f)(rng);
  const float spread = std::uniform_real_distribution<float>(0.2f, 2.0f)(rng);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = offset + spread * normal(rng);
  return v;
}

// Aligned scratch filled with a byte pattern (0xff: NaN floats, -1 ints).
struct dirty_workspace {
  workspace_buffer buffer;
  explicit dirty_workspace(std::size_t n, unsigned char fill = 0xff) : buffer(n) {
    if (n > 0) std::memset(buffer.span().data(), fill, n);
  }
  [[nodiscard]] std::span<std::byte> span() const { return buffer.span(); }
};

// A batch's state in owned vectors, pre-filled with garbage (NaN centroids, odd counts).
struct owned_state {
  std::int32_t clusters = 0;
  std::vector<float> centroids;
  std::vector<std::int32_t> counts, membership;
  owned_state(const km::layout& l, std::size_t extra = 0)
      : clusters(l.clusters),
        centroids(static_cast<std::size_t>(l.centroid_floats()) + extra, std::numeric_limits<float>::quiet_NaN()),
        counts(static_cast<std::size_t>(l.count_entries()) + extra, 0x5a5a5a5a),
        membership(static_cast<std::size_t>(l.membership_entries()) + extra, 0x5a5a5a5a) {}
  [[nodiscard]] km::state view() { return {clusters, centroids, counts, membership}; }
  [[nodiscard]] km::const_state cview() const { return {clusters, centroids, counts, membership}; }
};

// A case: varlen batch (one sequence possibly empty, one with fewer keys than clusters, ragged last
// blocks), GQA, either scope, causal or not; K token-major in TK, Q token-major in TQ.
template <element TQ = float, element TK = float>
struct kcase {
  std::int32_t heads_q = 1, heads_kv = 1, head_dim = 1, block_q = 1, block_kv = 1, clusters = 1;
  mask_kind mask = mask_kind::causal;
  index_scope scope = index_scope::kv_head;
  float softmax_scale = 0.0f;
  std::vector<std::int32_t> cu_q{0}, cu_kv{0};
  std::vector<TQ> q;
  std::vector<TK> k;

  kcase() = default;
  explicit kcase(std::mt19937& rng) {
    head_dim = pick(rng, {1, 3, 5, 8, 13, 33, 64});
    heads_kv = uniform(rng, 1, 3);
    heads_q = heads_kv * pick(rng, {1, 2, 4, 8});
    block_q = pick(rng, {1, 3, 5, 8, 16});
    block_kv = pick(rng, {1, 3, 4, 7, 16});
    clusters = pick(rng, {1, 2, 3, 5, 8, 16});
    mask = chance(rng, 0.6) ? mask_kind::causal : mask_kind::none;
    scope = chance(rng, 0.6) ? index_scope::kv_head : index_scope::query_head;
    softmax_scale = chance(rng, 0.5) ? 0.0f : std::uniform_real_distribution<float>(0.05f, 2.0f)(rng);
    const std::int32_t batch = uniform(rng, 1, 4);
    const std::int32_t few = uniform(rng, 0, batch - 1);  // fewer keys than clusters
    const std::int32_t empty = batch > 1 ? uniform(rng, 0, batch - 1) : -1;
    for (std::int32_t b = 0; b < batch; ++b) {
      std::int32_t lkv = uniform(rng, 1, 90);
      if (b == few) lkv = uniform(rng, 1, std::max(1, clusters - 1));
      std::int32_t lq = chance(rng, 0.4) ? 1 : uniform(rng, 1, std::max(1, lkv));
      if (b == empty) {
        switch (uniform(rng, 0, 2)) {
          case 0: lq = 0; lkv = 0; break;
          case 1: lq = 0; break;
          default: lkv = 0; break;
        }
      }
      if (lkv > 0 && lkv % block_kv == 0 && block_kv > 1 && chance(rng, 0.7)) ++lkv;  // ragged last block
      cu_q.push_back(cu_q.back() + lq);
      cu_kv.push_back(cu_kv.back() + lkv);
    }
    set_values(rng);
  }
  void set_values(std::mt19937& rng) {
    const auto qv = random_values(rng, static_cast<std::size_t>(cu_q.back()) * heads_q * head_dim);
    q.resize(qv.size());
    for (std::size_t i = 0; i < qv.size(); ++i) q[i] = from_float<TQ>(qv[i]);
    const auto kv = random_values(rng, static_cast<std::size_t>(cu_kv.back()) * heads_kv * head_dim);
    k.resize(kv.size());
    for (std::size_t i = 0; i < kv.size(); ++i) k[i] = from_float<TK>(kv[i]);
  }
  [[nodiscard]] problem prob() const {
    return problem{.heads_q = heads_q, .heads_kv = heads_kv, .head_dim = head_dim, .block_q = block_q,
                   .block_kv = block_kv, .mask = mask, .softmax_scale = softmax_scale, .cu_seqlens_q = cu_q,
                   .cu_seqlens_kv = cu_kv, .scope = scope};
  }
  [[nodiscard]] strided_view<const TQ> q_view() const {
    return strided_view<const TQ>::token_major(q.data(), cu_q.back(), heads_q, head_dim);
  }
  [[nodiscard]] contiguous_kv<TK> kv() const {
    return {.k = strided_view<const TK>::token_major(k.data(), cu_kv.back(), heads_kv, head_dim),
            .v = strided_view<const TK>::token_major(k.data(), cu_kv.back(), heads_kv, head_dim),
            .cu_seqlens_kv = {}};
  }
  [[nodiscard]] std::int32_t n_kv(std::int32_t b) const { return cu_kv[b + 1] - cu_kv[b]; }
  [[nodiscard]] std::int32_t batch() const { return static_cast<std::int32_t>(cu_q.size()) - 1; }
  // Keys of (b, h) as fp32 rows.
  [[nodiscard]] std::vector<std::vector<float>> keys(std::int32_t b, std::int32_t h) const {
    std::vector<std::vector<float>> out;
    for (std::int32_t t = 0; t < n_kv(b); ++t) {
      const TK* row = k.data() + (static_cast<std::size_t>(cu_kv[b] + t) * heads_kv + h) * head_dim;
      std::vector<float> x(static_cast<std::size_t>(head_dim));
      for (std::int32_t i = 0; i < head_dim; ++i) x[i] = to_float(row[i]);
      out.push_back(x);
    }
    return out;
  }
  [[nodiscard]] std::string describe() const {
    std::ostringstream s;
    s << "heads " << heads_q << "/" << heads_kv << " d " << head_dim << " bq " << block_q << " bk " << block_kv
      << " C " << clusters << (mask == mask_kind::causal ? " causal" : " no-mask")
      << (scope == index_scope::kv_head ? " kv-head rows" : " query-head rows") << " scale " << softmax_scale << " "
      << element_name<TQ> << "/" << element_name<TK> << " seqs";
    for (std::int32_t b = 0; b < batch(); ++b) s << " " << cu_q[b + 1] - cu_q[b] << "x" << n_kv(b);
    return s.str();
  }
};

// ---- The slow, obviously-correct versions. ----

float slow_dist2(const std::vector<float>& x, const std::vector<float>& y) {
  float acc = 0.0f;
  for (std::size_t i = 0; i < x.size(); ++i) acc += (x[i] - y[i]) * (x[i] - y[i]);
  return acc;
}

double slow_draw(std::uint64_t seed, std::int32_t h, std::uint64_t i) {
  std::uint64_t z = seed + (static_cast<std::uint64_t>(h) << 32) + i;
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) / 9007199254740992.0;  // 2^53
}

// One (sequence, kv head): centroids [C][d], counts [C], the cluster of every key.
struct slow_head {
  std::vector<std::vector<float>> centroids;
  std::vector<std::int32_t> counts;
  std::vector<std::int32_t> cluster;
};

slow_head slow_kmeans(const std::vector<std::vector<float>>& keys, std::int32_t C, std::int32_t iterations,
                      std::uint64_t seed, std::int32_t h, std::int32_t d) {
  const auto n = static_cast<std::int32_t>(keys.size());
  slow_head r;
  r.centroids.assign(C, std::vector<float>(d, 0.0f));
  r.counts.assign(C, 0);
  r.cluster.assign(n, -1);
  if (n == 0) return r;
  // k-means++: every distance recomputed against every seed so far.
  std::vector<std::int32_t> seeds{std::min(n - 1, static_cast<std::int32_t>(slow_draw(seed, h, 0) * n))};
  while (static_cast<std::int32_t>(seeds.size()) < C) {
    std::vector<float> D(n);
    for (std::int32_t t = 0; t < n; ++t) {
      D[t] = std::numeric_limits<float>::infinity();
      for (std::int32_t s : seeds) D[t] = std::min(D[t], slow_dist2(keys[t], keys[s]));
    }
    double total = 0;
    for (float x : D) total += x;
    if (!(total > 0)) break;
    const double target = slow_draw(seed, h, seeds.size()) * total;
    double cum = 0;
    std::int32_t chosen = -1;
    for (std::int32_t t = 0; t < n && chosen < 0; ++t) {
      cum += D[t];
      if (cum > target) chosen = t;
    }
    REQUIRE(chosen >= 0);  // finite keys
    REQUIRE(D[chosen] > 0);
    seeds.push_back(chosen);
  }
  std::vector<bool> live(C, false);
  for (std::size_t c = 0; c < seeds.size(); ++c) {
    r.centroids[c] = keys[seeds[c]];
    live[c] = true;
  }
  for (std::int32_t it = 0; it < iterations; ++it) {
    for (std::int32_t t = 0; t < n; ++t) {
      std::int32_t best = -1;
      for (std::int32_t c = 0; c < C; ++c) {
        if (live[c] && (best < 0 || slow_dist2(keys[t], r.centroids[c]) < slow_dist2(keys[t], r.centroids[best]))) best = c;
      }
      r.cluster[t] = best;
    }
    for (std::int32_t c = 0; c < C; ++c) {
      std::vector<float> sum(d, 0.0f);
      std::int32_t count = 0;
      for (std::int32_t t = 0; t < n; ++t) {
        if (r.cluster[t] != c) continue;
        for (std::int32_t i = 0; i < d; ++i) sum[i] += keys[t][i];
        ++count;
      }
      r.counts[c] = count;
      live[c] = count > 0;
      for (std::int32_t i = 0; i < d; ++i) r.centroids[c][i] = count > 0 ? sum[i] / static_cast<float>(count) : 0.0f;
    }
  }
  return r;
}

// The running-mean append, on a slow_head (the key's block is the caller's business).
std::int32_t slow_append(slow_head& s, const std::vector<float>& key) {
  const auto C = static_cast<std::int32_t>(s.counts.size());
  std::int32_t target = -1;
  for (std::int32_t c = 0; c < C && target < 0; ++c) {
    if (s.counts[c] == 0) target = c;
  }
  if (target < 0) {
    target = 0;
    for (std::int32_t c = 1; c < C; ++c) {
      if (slow_dist2(key, s.centroids[c]) < slow_dist2(key, s.centroids[target])) target = c;
    }
  }
  const std::int32_t n = ++s.counts[target];
  for (std::size_t i = 0; i < key.size(); ++i) {
    s.centroids[target][i] = n == 1 ? key[i] : s.centroids[target][i] + (key[i] - s.centroids[target][i]) / static_cast<float>(n);
  }
  s.cluster.push_back(target);
  return target;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }
// Bit equality of two float vectors (memcmp is not called on an empty vector's null data).
bool same_vector_bits(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
}

// The state's slices of (b, h) equal the slow head: centroids and counts bit for bit, membership
// equal to the per-block histogram of the slow assignment, and the invariants of the header.
template <element TQ, element TK>
void check_head(const kcase<TQ, TK>& c, const km::layout& l, const owned_state& st, std::int32_t b, std::int32_t h,
                const slow_head& want, bool empty_centroids_zero = true) {
  const std::int32_t C = c.clusters, d = c.head_dim;
  INFO("sequence " << b << ", kv head " << h);
  std::int64_t held = 0;
  for (std::int32_t k = 0; k < C; ++k) {
    INFO("cluster " << k);
    const std::size_t ci = static_cast<std::size_t>(l.count_offset(b) + h * C + k);
    CHECK(st.counts[ci] == want.counts[k]);
    held += st.counts[ci];
    for (std::int32_t i = 0; i < d && (empty_centroids_zero || want.counts[k] > 0); ++i) {
      const float got = st.centroids[static_cast<std::size_t>(l.centroid_offset(b) + (h * C + k) * d + i)];
      INFO("dim " << i << ": got " << got << ", want " << want.centroids[k][i]);
      CHECK(same_bits(got, want.centroids[k][i]));
    }
  }
  CHECK(held == c.n_kv(b));
  for (std::int32_t j = 0; j < l.kv_blocks(b); ++j) {
    std::int32_t in_block = 0;
    for (std::int32_t k = 0; k < C; ++k) {
      std::int32_t expect = 0;
      for (std::int32_t t = j * c.block_kv; t < std::min((j + 1) * c.block_kv, c.n_kv(b)); ++t) expect += want.cluster[t] == k;
      const std::int32_t got = st.membership[static_cast<std::size_t>(l.membership_offset(b) + (j * c.heads_kv + h) * C + k)];
      INFO("block " << j << ", cluster " << k);
      CHECK(got == expect);
      in_block += got;
    }
    CHECK(in_block == std::min((j + 1) * c.block_kv, c.n_kv(b)) - j * c.block_kv);
  }
}

template <element TQ, element TK>
owned_state build_state(const kcase<TQ, TK>& c, const km::options& opt, unsigned char ws_fill = 0xff) {
  const problem p = c.prob();
  const km::layout l = km::make_layout(p, c.clusters);
  owned_state st(l);
  dirty_workspace ws(km::build_workspace_bytes(p, c.clusters), ws_fill);
  const status s = km::build(p, c.kv(), opt, st.view(), ws.span());
  REQUIRE_MESSAGE(s.ok(), show(s));
  return st;
}

template <element TK>
void check_build_case(std::uint32_t seed) {
  std::mt19937 rng(seed);
  const kcase<float, TK> c(rng);
  const km::options opt{.iterations = pick(rng, {1, 2, 3, 5}), .seed = rng()};
  INFO("seed " << seed << ": " << c.describe() << ", iterations " << opt.iterations);
  const problem p = c.prob();
  const km::layout l = km::make_layout(p, c.clusters);
  // Entries past the layout's sizes are left alone.
  owned_state st(l, 3);
  dirty_workspace ws(km::build_workspace_bytes(p, c.clusters));
  const status s = km::build(p, c.kv(), opt, st.view(), ws.span());
  REQUIRE_MESSAGE(s.ok(), show(s));
  CHECK(std::isnan(st.centroids.back()));
  CHECK(st.counts.back() == 0x5a5a5a5a);
  CHECK(st.membership.back() == 0x5a5a5a5a);
  for (std::int32_t b = 0; b < c.batch(); ++b) {
    for (std::int32_t h = 0; h < c.heads_kv; ++h) {
      check_head(c, l, st, b, h, slow_kmeans(c.keys(b, h), c.clusters, opt.iterations, opt.seed, h, c.head_dim));
    }
  }
}

}  // namespace

TEST_CASE("route::kmeans::build equals a slow k-means++ and Lloyd, bit for bit") {
  for (int i = 0; i < 40; ++i) check_build_case<float>(fresh_seed());
  for (int i = 0; i < 8; ++i) check_build_case<half>(fresh_seed());
  for (int i = 0; i < 8; ++i) check_build_case<bfloat16>(fresh_seed());
}

TEST_CASE("route::kmeans::build: fewer distinct keys than clusters leaves the rest empty; 0 keys, all empty") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  kcase<> c;
  c.head_dim = 7;
  c.block_kv = 4;
  c.clusters = 8;
  c.cu_q = {0, 1, 2};
  c.cu_kv = {0, 30, 30};  // 30 keys, 3 distinct vectors; an empty second sequence
  c.set_values(rng);
  for (std::int32_t t = 3; t < 30; ++t) std::copy_n(c.k.begin() + (t % 3) * 7, 7, c.k.begin() + t * 7);
  const km::options opt{.iterations = 3, .seed = rng()};
  const owned_state st = build_state(c, opt);
  const km::layout l = km::make_layout(c.prob(), c.clusters);
  std::int32_t nonempty = 0;
  for (std::int32_t k = 0; k < 8; ++k) nonempty += st.counts[k] > 0;
  CHECK(nonempty == 3);
  for (std::int32_t k = 0; k < 8; ++k) {
    if (st.counts[k] == 0) {
      for (std::int32_t i = 0; i < 7; ++i) CHECK(st.centroids[k * 7 + i] == 0.0f);
    } else {
      CHECK(st.counts[k] == 10);
    }
  }
  for (std::int32_t k = 0; k < 8; ++k) CHECK(st.counts[static_cast<std::size_t>(l.count_offset(1) + k)] == 0);
  check_head(c, l, st, 0, 0, slow_kmeans(c.keys(0, 0), 8, 3, opt.seed, 0, 7));
}

TEST_CASE("route::kmeans::append after build equals the running-mean update, membership consistent") {
  for (int n = 0; n < 24; ++n) {
    const std::uint32_t seed = fresh_seed();
    std::mt19937 rng(seed);
    const kcase<float, float> c(rng);
    const km::options opt{.iterations = pick(rng, {1, 2, 4}), .seed = rng()};
    INFO("seed " << seed << ": " << c.describe());
    const problem p = c.prob();
    const km::layout l = km::make_layout(p, c.clusters);
    // The prefix: each sequence's first n0[b] keys (0 for some), built into a state of their own.
    kcase<float, float> pre = c;
    std::vector<std::int32_t> n0(c.batch());
    pre.cu_kv = {0};
    pre.k.clear();
    for (std::int32_t b = 0; b < c.batch(); ++b) {
      n0[b] = chance(rng, 0.2) ? 0 : uniform(rng, 0, c.n_kv(b));
      pre.cu_kv.push_back(pre.cu_kv.back() + n0[b]);
      const auto first = c.k.begin() + static_cast<std::ptrdiff_t>(c.cu_kv[b]) * c.heads_kv * c.head_dim;
      pre.k.insert(pre.k.end(), first, first + static_cast<std::ptrdiff_t>(n0[b]) * c.heads_kv * c.head_dim);
    }
    pre.cu_q.assign(c.cu_q.size(), 0);
    pre.q.clear();
    const owned_state built = build_state(pre, opt);
    const km::layout l0 = km::make_layout(pre.prob(), c.clusters);
    // Into the full layout: centroids and counts have the same offsets; membership moves, and the rows
    // of blocks still to come hold garbage.
    owned_state st(l);
    st.centroids = built.centroids;
    st.counts = built.counts;
    for (std::int32_t b = 0; b < c.batch(); ++b) {
      std::copy_n(built.membership.begin() + l0.membership_offset(b), l0.kv_blocks(b) * l0.block_membership(),
                  st.membership.begin() + l.membership_offset(b));
    }
    std::vector<std::vector<slow_head>> want(c.batch());
    for (std::int32_t b = 0; b < c.batch(); ++b) {
      for (std::int32_t h = 0; h < c.heads_kv; ++h) {
        want[b].push_back(slow_kmeans(pre.keys(b, h), c.clusters, opt.iterations, opt.seed, h, c.head_dim));
      }
    }
    // Append the rest, round robin over the sequences.
    std::vector<std::int32_t> next = n0;
    status failed;
    skim::test::allocation_counter counter;
    for (bool more = true; more && failed.ok();) {
      more = false;
      for (std::int32_t b = 0; b < c.batch() && failed.ok(); ++b) {
        if (next[b] >= c.n_kv(b)) continue;
        failed = km::append(p, c.kv(), {.seq = b, .position = next[b], .sequence = l.sequence(st.view(), b)});
        ++next[b];
        more = true;
      }
    }
    const long allocations = counter.stop();
    REQUIRE_MESSAGE(failed.ok(), show(failed));
    CHECK(allocations == 0);
    for (std::int32_t b = 0; b < c.batch(); ++b) {
      for (std::int32_t h = 0; h < c.heads_kv; ++h) {
        const auto keys = c.keys(b, h);
        for (std::int32_t t = n0[b]; t < c.n_kv(b); ++t) (void)slow_append(want[b][h], keys[t]);
        check_head(c, l, st, b, h, want[b][h]);
      }
    }
  }
}

TEST_CASE("route::kmeans::append_newest equals append per sequence, and checks every state first") {
  for (int n = 0; n < 8; ++n) {
    const std::uint32_t seed = fresh_seed();
    std::mt19937 rng(seed);
    const kcase<float, float> c(rng);
    INFO("seed " << seed << ": " << c.describe());
    const problem p = c.prob();
    const km::layout l = km::make_layout(p, c.clusters);
    // Both states hold every sequence's keys but the newest, appended one by one from empty.
    owned_state one(l), batch(l);
    std::fill(one.counts.begin(), one.counts.end(), 0);  // empty: centroids and membership stay garbage
    for (std::int32_t b = 0; b < c.batch(); ++b) {
      for (std::int32_t t = 0; t + 1 < c.n_kv(b); ++t) {
        REQUIRE(km::append(p, c.kv(), {.seq = b, .position = t, .sequence = l.sequence(one.view(), b)}).ok());
      }
    }
    batch.centroids = one.centroids;
    batch.counts = one.counts;
    batch.membership = one.membership;
    std::vector<km::state> seqs;
    for (std::int32_t b = 0; b < c.batch(); ++b) seqs.push_back(l.sequence(batch.view(), b));
    for (std::int32_t b = 0; b < c.batch(); ++b) {
      if (c.n_kv(b) == 0) continue;
      REQUIRE(km::append(p, c.kv(), {.seq = b, .position = c.n_kv(b) - 1, .sequence = l.sequence(one.view(), b)}).ok());
    }
    skim::test::allocation_counter counter;
    const status s = km::append_newest(p, c.kv(), std::span<const km::state>(seqs));
    const long allocations = counter.stop();
    REQUIRE_MESSAGE(s.ok(), show(s));
    CHECK(allocations == 0);
    CHECK(same_vector_bits(one.centroids, batch.centroids));
    CHECK(one.counts == batch.counts);
    CHECK(one.membership == batch.membership);
    // From an empty state (garbage centroids and membership), the running-mean rule of every key.
    for (std::int32_t b = 0; b < c.batch(); ++b) {
      for (std::int32_t h = 0; h < c.heads_kv; ++h) {
        slow_head want{std::vector<std::vector<float>>(c.clusters, std::vector<float>(c.head_dim, 0.0f)),
                       std::vector<std::int32_t>(c.clusters, 0), {}};
        for (const auto& key : c.keys(b, h)) (void)slow_append(want, key);
        check_head(c, l, one, b, h, want, false);  // empty clusters keep their garbage
      }
    }
    // Now every state is one key ahead of what a second call expects: it fails, changing nothing
    // (unless no sequence has keys).
    if (p.tokens_kv() > 0) {
      const std::vector<std::int32_t> before = batch.counts;
      CHECK(km::append_newest(p, c.kv(), std::span<const km::state>(seqs)).code() == status_code::invalid_argument);
      CHECK(batch.counts == before);
    }
    CHECK(km::append_newest(p, c.kv(), std::span<const km::state>(seqs).first(seqs.size() - 1)).code() ==
          status_code::shape_mismatch);
  }
}

namespace {

// The router's definition, plainly: every row, every block; scores [index_rows, max_kv_blocks].
template <element TQ, element TK>
std::vector<float> brute_scores(const kcase<TQ, TK>& c, const owned_state& st, std::int32_t probe, query_pool pool) {
  const problem p = c.prob();
  const km::layout l = km::make_layout(p, c.clusters);
  const std::int32_t width = p.max_kv_blocks(), C = c.clusters, d = c.head_dim, g = c.heads_q / c.heads_kv;
  std::vector<float> out(static_cast<std::size_t>(p.index_rows() * width), neg_inf);
  std::int64_t row = 0;
  for (std::int32_t b = 0; b < c.batch(); ++b) {
    const std::int32_t n_q = c.cu_q[b + 1] - c.cu_q[b], n_kv = c.n_kv(b);
    for (std::int32_t first = 0; first < n_q; first += c.block_q) {
      const std::int32_t last = std::min(first + c.block_q, n_q) - 1;
      const std::int32_t sees = c.mask == mask_kind::none ? n_kv : std::clamp(last + n_kv - n_q + 1, 0, n_kv);
      const std::int32_t visible = (sees + c.block_kv - 1) / c.block_kv;
      for (std::int32_t ih = 0; ih < p.index_heads(); ++ih, ++row) {
        std::vector<std::int32_t> heads;
        for (std::int32_t h = 0; h < c.heads_q; ++h) {
          if (c.scope == index_scope::kv_head ? h / g == ih : h == ih) heads.push_back(h);
        }
        const std::int32_t kvh = heads[0] / g;
        const auto mem = [&](std::int32_t j, std::int32_t k) {
          return st.membership[static_cast<std::size_t>(l.membership_offset(b) + (j * c.heads_kv + kvh) * C + k)];
        };
        std::vector<float> merged(static_cast<std::size_t>(C), neg_inf);  // m(c): best over the heads probing c
        for (std::int32_t h : heads) {
          std::vector<float> qv(d, 0.0f);
          if (pool == query_pool::last) {
            for (std::int32_t i = 0; i < d; ++i) qv[i] = to_float(c.q[(static_cast<std::size_t>(c.cu_q[b] + last) * c.heads_q + h) * d + i]);
          } else {
            for (std::int32_t t = first; t <= last; ++t) {
              for (std::int32_t i = 0; i < d; ++i) qv[i] += to_float(c.q[(static_cast<std::size_t>(c.cu_q[b] + t) * c.heads_q + h) * d + i]);
            }
            for (float& x : qv) x /= static_cast<float>(last - first + 1);
          }
          std::vector<std::pair<float, std::int32_t>> ranked;  // (score, cluster) of the candidates
          for (std::int32_t k = 0; k < C; ++k) {
            bool holds_visible = false;
            for (std::int32_t j = 0; j < visible; ++j) holds_visible = holds_visible || mem(j, k) > 0;
            if (!holds_visible) continue;
            float s = 0.0f;
            for (std::int32_t i = 0; i < d; ++i) s += qv[i] * st.centroids[static_cast<std::size_t>(l.centroid_offset(b) + (kvh * C + k) * d + i)];
            ranked.emplace_back(std::isnan(s) ? neg_inf : s, k);
          }
          std::sort(ranked.begin(), ranked.end(), [](const auto& x, const auto& y) {
            return x.first > y.first || (x.first == y.first && x.second < y.second);
          });
          ranked.resize(std::min<std::size_t>(ranked.size(), static_cast<std::size_t>(probe)));
          for (const auto& [s, k] : ranked) merged[static_cast<std::size_t>(k)] = std::max(merged[static_cast<std::size_t>(k)], s);
        }
        std::vector<std::int32_t> listed;  // clusters some head probed (a -inf one scores as none), rank order
        for (std::int32_t k = 0; k < C; ++k) {
          if (merged[static_cast<std::size_t>(k)] != neg_inf) listed.push_back(k);
        }
        std::sort(listed.begin(), listed.end(), [&](std::int32_t x, std::int32_t y) {
          const float mx = merged[static_cast<std::size_t>(x)], my = merged[static_cast<std::size_t>(y)];
          return mx > my || (mx == my && x < y);
        });
        for (std::int32_t j = 0; j < visible; ++j) {
          float best = neg_inf, sum = 0.0f;
          for (const std::int32_t k : listed) {
            if (mem(j, k) <= 0) continue;
            const float m = merged[static_cast<std::size_t>(k)];
            if (best == neg_inf) best = m;
            sum += static_cast<float>(mem(j, k)) * std::exp((m - best) * p.scale());
          }
          float& o = out[static_cast<std::size_t>(row * width + j)];
          if (best != neg_inf) o = std::isinf(best) ? best * p.scale() : best * p.scale() + std::log(sum);
        }
      }
    }
  }
  return out;
}

template <element TQ>
void check_router_case(std::uint32_t seed) {
  std::mt19937 rng(seed);
  const kcase<TQ, float> c(rng);
  const kmeans_router router{.probe = pick(rng, {1, 2, 3, 100}),
                             .pool = chance(rng, 0.5) ? query_pool::last : query_pool::mean};
  INFO("seed " << seed << ": " << c.describe() << ", probe " << router.probe << ", pool "
               << route::to_string(router.pool));
  const problem p = c.prob();
  const owned_state st = build_state(c, km::options{.iterations = 2, .seed = rng()});
  const std::int32_t width = p.max_kv_blocks();
  std::vector<float> got(static_cast<std::size_t>(p.index_rows() * width), std::numeric_limits<float>::quiet_NaN());
  dirty_workspace ws(router.workspace_bytes(p, c.clusters));
  {
    skim::test::allocation_counter counter;
    const status s = router.score(p, c.q_view(), st.cview(), got, ws.span());
    const long allocations = counter.stop();
    REQUIRE_MESSAGE(s.ok(), show(s));
    CHECK(allocations == 0);
  }
  const std::vector<float> want = brute_scores(c, st, router.probe, router.pool);
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("row " << i / static_cast<std::size_t>(width) << ", block " << i % static_cast<std::size_t>(width) << ": got "
                << got[i] << ", want " << want[i]);
    REQUIRE(same_bits(got[i], want[i]));
  }
  // Deterministic: another workspace content gives the same bits.
  dirty_workspace clean(router.workspace_bytes(p, c.clusters), 0x00);
  std::vector<float> again(got.size(), 0.0f);
  REQUIRE(router.score(p, c.q_view(), st.cview(), again, clean.span()).ok());
  CHECK(same_vector_bits(again, got));
  // score_row into a wider span: the same bits, -inf past the visible blocks.
  const km::layout l = km::make_layout(p, c.clusters);
  const status walk = for_each_row(p, [&](const row_info& r) -> status {
    std::vector<float> one(static_cast<std::size_t>(r.kv_blocks) + 2, std::numeric_limits<float>::quiet_NaN());
    skim::test::allocation_counter counter;
    SKIM_TRY(router.score_row(p, r, c.q_view(), l.sequence(st.cview(), r.seq), one, ws.span()));
    CHECK(counter.stop() == 0);
    for (std::size_t j = 0; j < one.size(); ++j) {
      INFO("score_row, row " << r.row << ", block " << j);
      if (j < static_cast<std::size_t>(r.visible_blocks)) {
        CHECK(same_bits(one[j], got[static_cast<std::size_t>(r.row * width) + j]));
      } else {
        CHECK(one[j] == neg_inf);
      }
    }
    return status::success();
  });
  REQUIRE_MESSAGE(walk.ok(), show(walk));
}

}  // namespace

TEST_CASE("route::kmeans_router equals a brute-force scorer bit for bit; score_row agrees; no allocation") {
  for (int i = 0; i < 40; ++i) check_router_case<float>(fresh_seed());
  for (int i = 0; i < 6; ++i) check_router_case<half>(fresh_seed());
  for (int i = 0; i < 6; ++i) check_router_case<bfloat16>(fresh_seed());
}

TEST_CASE("route::kmeans: build and its scores are deterministic whatever the workspace held") {
  for (int n = 0; n < 6; ++n) {
    const std::uint32_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    const kcase<> c(rng);
    const km::options opt{.iterations = 3, .seed = rng()};
    const owned_state a = build_state(c, opt, 0xff);
    const owned_state b = build_state(c, opt, 0x00);
    CHECK(same_vector_bits(a.centroids, b.centroids));
    CHECK(a.counts == b.counts);
    CHECK(a.membership == b.membership);
    // build itself does not allocate (owned_state and the workspace above do, outside it).
    const problem p = c.prob();
    owned_state st(km::make_layout(p, c.clusters));
    dirty_workspace ws(km::build_workspace_bytes(p, c.clusters));
    skim::test::allocation_counter inside;
    const status s = km::build(p, c.kv(), opt, st.view(), ws.span());
    const long allocations = inside.stop();
    REQUIRE_MESSAGE(s.ok(), show(s));
    CHECK(allocations == 0);
    CHECK(st.membership == a.membership);
  }
}

TEST_CASE("route::kmeans_router on a hand-made state: probe ties go to the lower cluster, heads by max") {
  // One kv head, two query heads, d = 2; 8 keys in 4 blocks of 2, block j held by cluster j.
  //   centroids c0 (0, 5), c1 (10, 0), c2 (0, -5), c3 (-10, 0); probe 2, scale 0.5.
  //   head 0, q (1, 0):  s = 0, 10, 0, -10 -> probes c1, then c0 (tied with c2: the lower id);
  //   head 1, q (0, -1): s = -5, 0, 5, 0   -> probes c2, then c1 (tied with c3).
  //   blocks: 0 -> 0 (head 0's c0), 1 -> 10, 2 -> 5 (head 1's c2), 3 -> none probed: -inf.
  const std::vector<std::int32_t> cu_q{0, 1}, cu_kv{0, 8};
  const problem p{.heads_q = 2, .heads_kv = 1, .head_dim = 2, .block_q = 1, .block_kv = 2, .softmax_scale = 0.5f,
                  .cu_seqlens_q = cu_q, .cu_seqlens_kv = cu_kv};
  std::vector<float> centroids{0, 5, 10, 0, 0, -5, -10, 0};
  std::vector<std::int32_t> counts{2, 2, 2, 2};
  std::vector<std::int32_t> membership(16, 0);
  for (std::int32_t j = 0; j < 4; ++j) membership[j * 4 + j] = 2;
  const std::vector<float> q{1, 0, 0, -1};
  const auto qv = strided_view<const float>::token_major(q.data(), 1, 2, 2);
  const km::const_state st{4, centroids, counts, membership};
  const kmeans_router router{.probe = 2};
  dirty_workspace ws(router.workspace_bytes(p, 4));
  std::vector<float> scores(4, 1.0f);
  REQUIRE(router.score(p, qv, st, scores, ws.span()).ok());
  // Each block's 2 keys lie in one cluster: score = scale · s + log 2.
  const float log2 = std::log(2.0f);
  CHECK(scores[0] == 0.0f + log2);
  CHECK(scores[1] == 5.0f + log2);
  CHECK(scores[2] == 2.5f + log2);
  CHECK(scores[3] == neg_inf);
  // probe 4 reaches c3 through head 0 (s = -10) and head 1 (s = 0): block 3 scores 0 + log 2.
  REQUIRE(kmeans_router{.probe = 4}.score(p, qv, st, scores, ws.span()).ok());
  CHECK(scores[3] == 0.0f + log2);
  // top-2 on the probe-2 scores takes the two nearest centroids' blocks.
  REQUIRE(router.score(p, qv, st, scores, ws.span()).ok());
  const select::top_k top{.k = 2};
  std::vector<std::int32_t> ids(2);
  std::int32_t count = 0;
  dirty_workspace sel_ws(top.workspace_bytes(4));
  REQUIRE(top.select_row({.row = make_row_info(p, 0, 0, 0, 0), .scores = scores}, ids, count, sel_ws.span()).ok());
  CHECK(count == 2);
  CHECK(ids == std::vector<std::int32_t>{1, 2});
  // A block split over two probed clusters sums their mass: block 1 now holds one key of c1 (head 0's
  // s = 10) and one of c0 (s = 0): 0.5 · 10 + log(1 + exp(0.5 · (0 - 10))).
  membership[1 * 4 + 1] = 1;
  membership[1 * 4 + 0] = 1;
  counts = {3, 1, 2, 2};
  REQUIRE(router.score(p, qv, st, scores, ws.span()).ok());
  CHECK(scores[1] == 5.0f + std::log(1.0f + std::exp(-5.0f)));
  CHECK(scores[0] == 0.0f + log2);
}

TEST_CASE("route::kmeans::build reads paged K as it reads contiguous K") {
  for (int n = 0; n < 6; ++n) {
    const std::uint32_t seed = fresh_seed();
    std::mt19937 rng(seed);
    const kcase<> c(rng);
    INFO("seed " << seed << ": " << c.describe());
    const problem p = c.prob();
    const std::int32_t page = pick(rng, {1, 3, 5, 16});
    const std::int32_t row = c.heads_kv * c.head_dim;
    std::vector<std::int32_t> indptr{0}, indices;
    std::vector<float> pages;
    for (std::int32_t b = 0; b < c.batch(); ++b) {
      for (std::int32_t first = 0; first < c.n_kv(b); first += page) {
        indices.push_back(static_cast<std::int32_t>(indices.size()));
        for (std::int32_t t = first; t < first + page; ++t) {
          for (std::int32_t i = 0; i < row; ++i) {
            pages.push_back(t < c.n_kv(b) ? c.k[static_cast<std::size_t>(c.cu_kv[b] + t) * row + i] : 1e30f);
          }
        }
      }
      indptr.push_back(static_cast<std::int32_t>(indices.size()));
    }
    const auto paged = paged_kv<float>::packed(pages.data(), pages.data(), static_cast<std::int32_t>(indices.size()),
                                               page, c.heads_kv, c.head_dim, indptr, indices);
    const km::options opt{.iterations = 2, .seed = rng()};
    const owned_state want = build_state(c, opt);
    owned_state got(km::make_layout(p, c.clusters));
    dirty_workspace ws(km::build_workspace_bytes(p, c.clusters));
    const status s = km::build(p, paged, opt, got.view(), ws.span());
    REQUIRE_MESSAGE(s.ok(), show(s));
    CHECK(same_vector_bits(got.centroids, want.centroids));
    CHECK(got.counts == want.counts);
    CHECK(got.membership == want.membership);
  }
}

TEST_CASE("route::kmeans: on planted clusters, top-k picks the query's cluster's blocks and beats a window") {
  for (int n = 0; n < 8; ++n) {
    const std::uint32_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    // 4 orthogonal centres of norm 8 (Gram-Schmidt of random vectors) in d = 32; 48 blocks of 16 keys,
    // each block's keys from one centre (+ 0.05 N(0, 1) noise); the target centre holds 10 blocks, at
    // random places, never the newest. One decode query, near the target centre.
    constexpr std::int32_t d = 32, bk = 16, blocks = 48, planted = 4, target_blocks = 10;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<std::vector<float>> centre(planted, std::vector<float>(d));
    for (std::int32_t a = 0; a < planted; ++a) {
      for (float& x : centre[a]) x = normal(rng);
      for (std::int32_t b = 0; b < a; ++b) {
        float dot = 0.0f;
        for (std::int32_t i = 0; i < d; ++i) dot += centre[a][i] * centre[b][i];
        for (std::int32_t i = 0; i < d; ++i) centre[a][i] -= dot * centre[b][i];
      }
      float norm = 0.0f;
      for (float x : centre[a]) norm += x * x;
      for (float& x : centre[a]) x /= std::sqrt(norm);
    }
    for (auto& c : centre) {
      for (float& x : c) x *= 8.0f;
    }
    std::vector<std::int32_t> order(blocks - 1);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<std::int32_t> owner(blocks);
    for (std::int32_t j = 0; j < blocks; ++j) owner[j] = 1 + uniform(rng, 0, planted - 2);  // not the target (0)
    std::set<std::int32_t> want;
    for (std::int32_t k = 0; k < target_blocks; ++k) {
      owner[order[k]] = 0;
      want.insert(order[k]);
    }
    kcase<> c;
    c.head_dim = d;
    c.block_kv = bk;
    c.block_q = 1;
    c.clusters = 8;
    c.heads_q = 2;  // GQA 2: both heads query near the target
    c.heads_kv = 1;
    c.cu_q = {0, 1};
    c.cu_kv = {0, blocks * bk};
    for (std::int32_t t = 0; t < blocks * bk; ++t) {
      for (std::int32_t i = 0; i < d; ++i) c.k.push_back(centre[owner[t / bk]][i] + 0.05f * normal(rng));
    }
    for (std::int32_t h = 0; h < 2; ++h) {
      for (std::int32_t i = 0; i < d; ++i) c.q.push_back(centre[0][i] + 0.1f * normal(rng));
    }
    const problem p = c.prob();
    const owned_state st = build_state(c, km::options{.iterations = 4, .seed = rng()});
    // probe 5: every planted centre holds at least one of the 8 centroids, so the target holds at most 5.
    const kmeans_router router{.probe = 5};
    dirty_workspace ws(router.workspace_bytes(p, c.clusters));
    std::vector<float> scores(blocks);
    REQUIRE(router.score(p, c.q_view(), st.cview(), scores, ws.span()).ok());
    const select::top_k top{.k = target_blocks};
    std::vector<std::int32_t> ids(target_blocks);
    std::int32_t count = 0;
    dirty_workspace sel_ws(top.workspace_bytes(blocks));
    const row_info r = make_row_info(p, 0, 0, 0, 0);
    REQUIRE(top.select_row({.row = r, .scores = scores}, ids, count, sel_ws.span()).ok());
    REQUIRE(count == target_blocks);
    CHECK(std::set<std::int32_t>(ids.begin(), ids.end()) == want);  // recall 1

    // Attention mass (double, over both heads) kept by the selection and by the newest 10 blocks.
    const auto coverage = [&](const std::set<std::int32_t>& sel) {
      double kept = 0.0;
      for (std::int32_t h = 0; h < 2; ++h) {
        std::vector<double> logit(static_cast<std::size_t>(blocks * bk));
        double m = -INFINITY;
        for (std::int32_t t = 0; t < blocks * bk; ++t) {
          double s = 0.0;
          for (std::int32_t i = 0; i < d; ++i) s += static_cast<double>(c.q[h * d + i]) * c.k[t * d + i];
          logit[t] = s * p.scale();
          m = std::max(m, logit[t]);
        }
        double all = 0.0, in = 0.0;
        for (std::int32_t t = 0; t < blocks * bk; ++t) {
          all += std::exp(logit[t] - m);
          if (sel.count(t / bk) != 0) in += std::exp(logit[t] - m);
        }
        kept += in / all / 2.0;
      }
      return kept;
    };
    std::set<std::int32_t> window;
    for (std::int32_t j = blocks - target_blocks; j < blocks; ++j) window.insert(j);
    const double routed = coverage(want), local = coverage(window);
    INFO("coverage: routed " << routed << ", window " << local);
    CHECK(routed > 0.99);
    CHECK(routed > local);  // the window misses a target block: the newest is never one
  }
}

TEST_CASE("route::kmeans statuses name the bad value and its place") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  kcase<> c;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.head_dim = 8;
  c.block_q = 4;
  c.block_kv = 4;
  c.clusters = 3;
  c.cu_q = {0, 8};
  c.cu_kv = {0, 10};  // 3 kv blocks
  c.set_values(rng);
  const problem p = c.prob();
  const km::layout l = km::make_layout(p, 3);
  CHECK(l.centroid_floats() == 48);
  CHECK(l.count_entries() == 6);
  CHECK(l.membership_entries() == 18);
  CHECK(l.bytes() == 4 * (48 + 6 + 18));
  owned_state st(l);
  const std::size_t bytes = km::build_workspace_bytes(p, 3);
  dirty_workspace ws(bytes + workspace_alignment);
  const km::options opt{};
  REQUIRE(km::build(p, c.kv(), opt, st.view(), ws.span()).ok());

  auto expect = [](const status& s, status_code code, std::string_view message) {
    CHECK(s.code() == code);
    CHECK(std::string_view(s.message()) == message);
  };
  // build
  problem bad = p;
  bad.head_dim = 0;
  expect(km::build(bad, c.kv(), opt, st.view(), ws.span()), status_code::invalid_argument, "head_dim 0 <= 0");
  CHECK(km::build_workspace_bytes(bad, 3) == 0);
  expect(km::build(p, c.kv(), km::options{.iterations = 0}, st.view(), ws.span()), status_code::invalid_argument,
         "kmeans iterations 0 < 1");
  km::state s = st.view();
  s.clusters = 0;
  expect(km::build(p, c.kv(), opt, s, ws.span()), status_code::invalid_argument, "kmeans clusters 0 < 1");
  s = st.view();
  s.centroids = s.centroids.first(47);
  expect(km::build(p, c.kv(), opt, s, ws.span()), status_code::shape_mismatch,
         "kmeans state: centroids has 47 floats, needs 48");
  s = st.view();
  s.counts = s.counts.first(5);
  expect(km::build(p, c.kv(), opt, s, ws.span()), status_code::shape_mismatch,
         "kmeans state: counts has 5 entries, needs 6");
  s = st.view();
  s.membership = s.membership.first(17);
  expect(km::build(p, c.kv(), opt, s, ws.span()), status_code::shape_mismatch,
         "kmeans state: membership has 17 entries, needs 18");
  expect(km::build(p, c.kv(), opt, st.view(), ws.span().first(bytes - 1)), status_code::workspace_too_small,
         ("workspace has " + std::to_string(bytes - 1) + " bytes, needs " + std::to_string(bytes)).c_str());
  CHECK(km::build(p, c.kv(), opt, st.view(), ws.span().subspan(4, bytes)).code() == status_code::misaligned);
  auto short_kv = c.kv();
  short_kv.k.tokens = 9;
  expect(km::build(p, short_kv, opt, st.view(), ws.span()), status_code::shape_mismatch,
         "K is [9, 2, 8], expected [10, 2, 8]");

  // append: a state holding 10 keys takes key 10 of a sequence of 11.
  const std::vector<std::int32_t> cu_kv11{0, 11};
  problem p11 = p;
  p11.cu_seqlens_kv = cu_kv11;
  std::vector<float> k11 = c.k;
  k11.insert(k11.end(), c.k.begin(), c.k.begin() + 16);
  const contiguous_kv<float> kv11{.k = strided_view<const float>::token_major(k11.data(), 11, 2, 8),
                                  .v = strided_view<const float>::token_major(k11.data(), 11, 2, 8)};
  owned_state grown(km::make_layout(p11, 3));
  std::copy(st.centroids.begin(), st.centroids.end(), grown.centroids.begin());
  std::copy(st.counts.begin(), st.counts.end(), grown.counts.begin());
  std::copy(st.membership.begin(), st.membership.end(), grown.membership.begin());
  const km::append_site site{.seq = 0, .position = 10, .sequence = grown.view()};
  km::append_site a = site;
  a.seq = 1;
  expect(km::append(p11, kv11, a), status_code::invalid_argument, "kmeans append sequence 1 out of [0, 1)");
  a = site;
  a.position = 11;
  expect(km::append(p11, kv11, a), status_code::invalid_argument,
         "kmeans append position 11 out of [0, 11) keys of sequence 0");
  a = site;
  a.position = 9;
  expect(km::append(p11, kv11, a), status_code::invalid_argument,
         "kmeans state of sequence 0 kv head 0 holds 10 keys, append expects 9");
  a = site;
  a.sequence.membership = a.sequence.membership.first(17);
  expect(km::append(p11, kv11, a), status_code::shape_mismatch,
         "kmeans state of sequence 0: membership has 17 entries, needs 18");
  a = site;
  a.sequence.clusters = -2;
  expect(km::append(p11, kv11, a), status_code::invalid_argument, "kmeans clusters -2 < 1");
  REQUIRE(km::append(p11, kv11, site).ok());
  expect(km::append(p11, kv11, site), status_code::invalid_argument,
         "kmeans state of sequence 0 kv head 0 holds 11 keys, append expects 10");

  // router
  const kmeans_router router{.probe = 2};
  const std::size_t rbytes = router.workspace_bytes(p, 3);
  // queries [2, 8], scores [2, 3], merged scores [3], ranked [2, 3], flags [3], merged list [3]
  CHECK(rbytes == 5 * 64 + 12);
  dirty_workspace rws(rbytes);
  std::vector<float> scores(12, 0.0f);  // 4 rows x 3 blocks
  REQUIRE(router.score(p, c.q_view(), st.cview(), scores, rws.span()).ok());
  expect(kmeans_router{.probe = 0}.can_implement(p), status_code::invalid_argument, "kmeans_router probe 0 < 1");
  expect(kmeans_router{.pool = query_pool::max}.can_implement(p), status_code::unsupported,
         "kmeans_router query_pool 2 is not last or mean");
  bad = p;
  bad.softmax_scale = -1.0f;
  expect(router.score(bad, c.q_view(), st.cview(), scores, rws.span()), status_code::unsupported,
         "softmax_scale -1 < 0: the nearest centroids are the largest logits only for a positive scale");
  expect(router.score(p, c.q_view(), grown.cview(), scores, rws.span()), status_code::invalid_argument,
         "kmeans state of sequence 0 kv head 0 holds 11 keys, the sequence has 10");
  km::const_state cs = st.cview();
  cs.membership = cs.membership.first(10);
  expect(router.score(p, c.q_view(), cs, scores, rws.span()), status_code::shape_mismatch,
         "kmeans state: membership has 10 entries, needs 18");
  expect(router.score(p, c.q_view(), st.cview(), std::span(scores).first(11), rws.span()), status_code::shape_mismatch,
         "scores has 11 floats, needs 12 (4 index rows x 3 max kv blocks)");
  expect(router.score(p, c.q_view(), st.cview(), scores, rws.span().first(rbytes - 1)),
         status_code::workspace_too_small, "workspace has 331 bytes, needs 332");
  const auto q_short = strided_view<const float>::token_major(c.q.data(), 7, 4, 8);
  expect(router.score(p, q_short, st.cview(), scores, rws.span()), status_code::shape_mismatch,
         "Q is [7, 4, 8], expected [8, 4, 8]");
  const row_info good = make_row_info(p, 0, 0, 1, 1);
  std::vector<float> one(3, 0.0f);
  REQUIRE(router.score_row(p, good, c.q_view(), st.cview(), one, rws.span()).ok());
  row_info r = good;
  r.visible_blocks = 2;
  expect(router.score_row(p, r, c.q_view(), st.cview(), one, rws.span()), status_code::invalid_argument,
         "row 3: geometry (queries [4, 8), 10 keys, 2 visible of 3 kv blocks) differs from make_row_info's ([4, 8), 10, 3 of 3)");
  cs = st.cview();
  cs.centroids = cs.centroids.first(40);
  expect(router.score_row(p, good, c.q_view(), cs, one, rws.span()), status_code::shape_mismatch,
         "kmeans state of sequence 0: centroids has 40 floats, needs 48");
  expect(router.score_row(p, good, c.q_view(), st.cview(), std::span(one).first(2), rws.span()),
         status_code::shape_mismatch, "scores of row 3 has 2 floats, needs kv blocks 3");
}
