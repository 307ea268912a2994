#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "skim/summarize/max_bound.hpp"
#include "skim/summarize/mean_pool.hpp"
#include "skim/summarize/multi_centroid.hpp"
#include "summarize/summarize_testing.hpp"

using namespace skim;
using namespace summarize_test;
using skim::summarize::mean_pool;
using skim::summarize::multi_centroid;

namespace {

// Brute force: the clustering multi_centroid<M, steps> documents, written out plainly.
// Returns the cluster of every key (-1 never happens for len >= 1).
std::vector<int> reference_clusters(const std::vector<float>& keys, int len, int bk, int d, int m, int steps) {
  std::vector<int> cluster(len);
  for (int s = 0; s < len; ++s) {
    for (int c = 0; c < m; ++c) {
      if (static_cast<long>(c) * bk / m <= s && s < static_cast<long>(c + 1) * bk / m) cluster[s] = c;
    }
  }
  if (len < bk) return cluster;  // a ragged block is never refined
  std::vector<float> centroid(static_cast<std::size_t>(m) * d, 0.0f);
  std::vector<bool> live(m, false);
  for (int step = 0; step < steps; ++step) {
    for (int c = 0; c < m; ++c) {  // centroids of the current clusters; an emptied one keeps its old value
      std::vector<float> sum(d, 0.0f);
      int n = 0;
      for (int s = 0; s < len; ++s) {
        if (cluster[s] != c) continue;
        for (int i = 0; i < d; ++i) sum[i] += keys[s * d + i];
        ++n;
      }
      if (step == 0) live[c] = n > 0;
      if (n == 0) continue;
      for (int i = 0; i < d; ++i) centroid[c * d + i] = sum[i] * (1.0f / static_cast<float>(n));
    }
    for (int s = 0; s < len; ++s) {
      int best = -1;
      float best_d2 = 0.0f;
      for (int c = 0; c < m; ++c) {
        if (!live[c]) continue;
        float d2 = 0.0f;
        for (int i = 0; i < d; ++i) d2 += (keys[s * d + i] - centroid[c * d + i]) * (keys[s * d + i] - centroid[c * d + i]);
        if (best < 0 || d2 < best_d2) best = c, best_d2 = d2;
      }
      cluster[s] = best;
    }
  }
  return cluster;
}

struct clusters_f64 {
  std::vector<std::vector<double>> mean;  // [m][d], empty for an empty cluster
  std::vector<int> count;
  double sse = 0.0;  // Σ squared distance of each key to its cluster mean
};
clusters_f64 summarize_clusters(const std::vector<float>& keys, const std::vector<int>& cluster, int m, int d) {
  clusters_f64 r;
  r.mean.assign(m, {});
  r.count.assign(m, 0);
  for (std::size_t s = 0; s < cluster.size(); ++s) {
    auto& mu = r.mean[cluster[s]];
    if (mu.empty()) mu.assign(d, 0.0);
    for (int i = 0; i < d; ++i) mu[i] += keys[s * d + i];
    ++r.count[cluster[s]];
  }
  for (int c = 0; c < m; ++c) {
    for (auto& x : r.mean[c]) x /= r.count[c];
  }
  for (std::size_t s = 0; s < cluster.size(); ++s) {
    for (int i = 0; i < d; ++i) {
      const double e = keys[s * d + i] - r.mean[cluster[s]][i];
      r.sse += e * e;
    }
  }
  return r;
}

template <std::int32_t M, std::int32_t Steps>
void check_against_reference(std::mt19937& rng, int iters) {
  using S = multi_centroid<M, Steps>;
  for (int iter = 0; iter < iters; ++iter) {
    const block_case c = random_block(rng);
    INFO("M " << M << " steps " << Steps << " iter " << iter << " block_kv " << c.block_kv << " d " << c.d
              << " len " << c.len);
    const std::vector<float> keys = random_values(rng, static_cast<std::size_t>(c.len) * c.d);
    const std::vector<float> record = block_record<S>(keys, c.len, c.block_kv, c.d);
    REQUIRE(record.size() == static_cast<std::size_t>(M) * c.d + M);
    const auto cluster = reference_clusters(keys, c.len, c.block_kv, c.d, M, Steps);
    const clusters_f64 want = summarize_clusters(keys, cluster, M, c.d);
    for (std::int32_t k = 0; k < M; ++k) CHECK(record[M * c.d + k] == static_cast<float>(want.count[k]));
    for (int query = 0; query < 4; ++query) {
      const std::vector<float> q = random_values(rng, static_cast<std::size_t>(c.d));
      double best = -std::numeric_limits<double>::infinity(), magnitude = 1.0;
      for (std::int32_t k = 0; k < M; ++k) {
        if (want.count[k] == 0) continue;
        best = std::max(best, dot_f64(q.data(), want.mean[k].data(), c.d));
        for (std::int32_t i = 0; i < c.d; ++i) magnitude += std::abs(q[i] * want.mean[k][i]) + std::abs(q[i]) * 3.0;
      }
      CHECK(std::abs(S::score(record.data(), q.data(), c.d) - best) <= 1e-5 * magnitude);
    }
    // Lloyd never makes the clustering worse than the sub-chunk partition it starts from.
    if (c.len == c.block_kv) {
      const auto start = summarize_clusters(keys, reference_clusters(keys, c.len, c.block_kv, c.d, M, 0), M, c.d);
      CHECK(want.sse <= start.sse * (1.0 + 1e-5) + 1e-6);
    }
  }
}

}  // namespace

TEST_CASE("summarize::multi_centroid sub-chunks are [floor(c * block_kv / M), floor((c + 1) * block_kv / M))") {
  using S3 = multi_centroid<3>;
  for (std::int32_t bk : {1, 2, 3, 4, 5, 7, 16, 64, 100}) {
    for (std::int32_t s = 0; s < bk; ++s) {
      const std::int32_t c = S3::sub_chunk(s, bk);
      INFO("block_kv " << bk << " slot " << s);
      CHECK(c >= 0);
      CHECK(c < 3);
      CHECK(c * bk / 3 <= s);
      CHECK(s < (c + 1) * bk / 3);
    }
  }
  CHECK(S3::sub_chunk(9, 10) == 2);
  CHECK(S3::sub_chunk(6, 10) == 2);
  CHECK(S3::sub_chunk(5, 10) == 1);
}

TEST_CASE("summarize::multi_centroid matches a brute-force sub-chunk + Lloyd clustering") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  check_against_reference<1, 2>(rng, 40);
  check_against_reference<2, 1>(rng, 60);
  check_against_reference<3, 2>(rng, 80);
  check_against_reference<4, 3>(rng, 80);
  check_against_reference<4, 0>(rng, 30);
  check_against_reference<8, 2>(rng, 40);
}

TEST_CASE("summarize::multi_centroid: Lloyd moves keys across a sub-chunk boundary to their own cluster") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  constexpr std::int32_t bk = 16, d = 12;
  using S = multi_centroid<2, 2>;
  for (int iter = 0; iter < 20; ++iter) {
    // Keys 0..a-1 near centre A, a..15 near centre B (a != 8, so the sub-chunks mix them).
    const std::int32_t a = uniform(rng, 0, 1) ? uniform(rng, 3, 6) : uniform(rng, 10, 13);
    INFO("iter " << iter << " a " << a);
    const std::vector<float> ca = random_values(rng, d), cb = random_values(rng, d);
    std::vector<float> keys(bk * d);
    std::normal_distribution<float> noise(0.0f, 0.01f);
    float sep = 0.0f;
    for (std::int32_t i = 0; i < d; ++i) sep += (ca[i] - cb[i]) * (ca[i] - cb[i]);
    REQUIRE(sep > 0.5f);
    for (std::int32_t s = 0; s < bk; ++s) {
      for (std::int32_t i = 0; i < d; ++i) keys[s * d + i] = (s < a ? ca[i] : cb[i]) + noise(rng);
    }
    const auto record = block_record<S>(keys, bk, bk, d);
    CHECK(record[2 * d] == static_cast<float>(a));
    CHECK(record[2 * d + 1] == static_cast<float>(bk - a));
    const std::vector<float> q = random_values(rng, d);
    const clusters_f64 want = summarize_clusters(keys, [&] {
      std::vector<int> cl(bk);
      for (std::int32_t s = 0; s < bk; ++s) cl[s] = s < a ? 0 : 1;
      return cl;
    }(), 2, d);
    const double best = std::max(dot_f64(q.data(), want.mean[0].data(), d), dot_f64(q.data(), want.mean[1].data(), d));
    CHECK(S::score(record.data(), q.data(), d) == doctest::Approx(best).epsilon(1e-4));
  }
}

TEST_CASE("summarize::multi_centroid<1> scores the block mean, like mean_pool") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (int iter = 0; iter < 50; ++iter) {
    const block_case c = random_block(rng);
    const std::vector<float> keys = random_values(rng, static_cast<std::size_t>(c.len) * c.d);
    const std::vector<float> q = random_values(rng, static_cast<std::size_t>(c.d));
    const auto one = block_record<multi_centroid<1>>(keys, c.len, c.block_kv, c.d);
    const auto mean = block_record<mean_pool>(keys, c.len, c.block_kv, c.d);
    // One cluster holds every key, summed in slot order both times: same sums, same count.
    CHECK(std::equal(one.begin(), one.end(), mean.begin()));
    CHECK(multi_centroid<1>::score(one.data(), q.data(), c.d) == mean_pool::score(mean.data(), q.data(), c.d));
  }
}

TEST_CASE("summarize::multi_centroid: an empty record scores -inf; scratch is (M + 1) * head_dim + M floats") {
  std::vector<float> record(multi_centroid<4>::record_floats(6), 2.0f);
  multi_centroid<4>::init(record.data(), 6);
  const float q[6] = {1.0f, -1.0f, 2.0f, 0.5f, -3.0f, 0.25f};
  CHECK(multi_centroid<4>::score(record.data(), q, 6) == -std::numeric_limits<float>::infinity());
  CHECK(multi_centroid<4>::workspace_floats(6) == 5 * 6 + 4);
  CHECK(multi_centroid<4>::record_floats(6) == 4 * 6 + 4);
}

TEST_CASE("summarize::multi_centroid, mean_pool and max_bound score4_blocks: score()'s bits for 1, 2, 4 and 8 records, empty ones too") {
  // Records with keys next to empty ones, and partial blocks (multi_centroid: a cluster with no
  // key), against score() query by query and record by record.
  const std::int32_t d = 13;
  const float keys[3][d] = {{0.5f, -1.25f, 2.0f, 0.125f, -0.75f, 1.5f, 3.0f, -2.5f, 0.0625f, 1.0f, -0.5f, 0.25f, 2.25f},
                            {-1.0f, 0.75f, -0.25f, 1.75f, 0.5f, -2.0f, 0.375f, 1.25f, -1.5f, 0.625f, 2.5f, -0.125f, 1.0f},
                            {2.0f, 0.25f, -1.75f, -0.5f, 1.125f, 0.875f, -3.0f, 0.5f, 1.5f, -0.25f, 0.75f, 1.0f, -2.0f}};
  float q[4][d];
  for (int g = 0; g < 4; ++g) {
    for (std::int32_t i = 0; i < d; ++i) q[g][i] = 0.3f * static_cast<float>(g + 1) - 0.17f * static_cast<float>(i % 7);
  }
  float q4[4 * d];
  summarize::detail::interleave4(&q[0][0], d, d, q4);
  const auto check_blocks = [&]<int B>(auto summarizer, const std::vector<float> (&r)[B]) {
    using S = decltype(summarizer);
    const float* records[B];
    for (int b = 0; b < B; ++b) records[b] = r[b].data();
    float out[4 * B];
    S::template score4_blocks<B>(records, q4, d, out);
    for (int b = 0; b < B; ++b) {
      for (int g = 0; g < 4; ++g) {
        const float want = S::score(records[b], q[g], d);
        INFO("block " << b << " of " << B << ", query " << g);
        CHECK(std::memcmp(&out[4 * b + g], &want, sizeof(float)) == 0);
      }
    }
  };
  const auto record = [&](auto summarizer, int n_keys) {
    using S = decltype(summarizer);
    std::vector<float> r(static_cast<std::size_t>(S::record_floats(d)));
    std::vector<float> scratch(static_cast<std::size_t>(std::max<std::int64_t>(S::workspace_floats(d), 1)));
    S::init(r.data(), d);
    for (int t = 0; t < n_keys; ++t) S::append(r.data(), keys[t], t, 3, d);
    if (n_keys == 3) S::complete_block(r.data(), [&](std::int32_t slot) { return keys[slot]; }, 3, d, scratch.data());
    return r;
  };
  const auto check_all = [&](auto summarizer) {
    for (int a = 0; a <= 3; a += 1) {
      for (int b = 0; b <= 3; b += 3) {
        const std::vector<float> one[1] = {record(summarizer, a)};
        const std::vector<float> two[2] = {record(summarizer, a), record(summarizer, b)};
        const std::vector<float> four[4] = {record(summarizer, a), record(summarizer, b), record(summarizer, 3 - a),
                                            record(summarizer, 2)};
        const std::vector<float> eight[8] = {record(summarizer, a), record(summarizer, 3),     record(summarizer, b),
                                             record(summarizer, 1), record(summarizer, 0),     record(summarizer, 3 - a),
                                             record(summarizer, 2), record(summarizer, b)};
        check_blocks.template operator()<1>(summarizer, one);
        check_blocks.template operator()<2>(summarizer, two);
        check_blocks.template operator()<4>(summarizer, four);
        check_blocks.template operator()<8>(summarizer, eight);
      }
    }
  };
  check_all(multi_centroid<2>{});
  check_all(multi_centroid<4>{});
  check_all(mean_pool{});
  check_all(summarize::max_bound{});
  CHECK(multi_centroid<2>::score(record(multi_centroid<2>{}, 0).data(), q[0], d) == -std::numeric_limits<float>::infinity());
}
