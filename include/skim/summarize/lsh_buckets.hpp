#pragma once
// lsh_buckets<Rounds, Bits, Seed>: SimHash buckets of a block's keys; a block scores by how many of
// its keys share the query's bucket (the content-based routing of Reformer-style LSH attention).
//
// Hashing: Rounds independent hashes of Bits random hyperplanes each. Hyperplane b of round r is
// w_{r,b} in {-1, +1}^head_dim, its component e the sign given by the top bit of
// splitmix64(Seed + ((r · 16 + b) << 32) + e) (set bit: -1), so every machine and every call draws
// the same planes, and no table is stored. A vector x falls in bucket
//   bucket_r(x) = Σ_b [w_{r,b} · x > 0] · 2^b        (the products in double, in dimension order)
// which depends only on x's direction: a key scaled by any positive factor keeps its buckets.
//
// Record [Rounds · 2^Bits + 1] floats: for each round the count of the block's keys in each of its
// 2^Bits buckets (round-major), then the block's key count (exact up to 2^24 keys per block).
// score(record, q) = Σ_r count_r[bucket_r(q)]: the number of (key, round) pairs of the block that
// collide with q, in [0, Rounds · keys]. It is not an estimate of q·k: it ranks blocks by how many
// of their keys point where q points, so a selector should rank it (top_k), not read it as a logit
// (threshold's mass mode). A record holding no key scores -inf.
//
// Prepared query (the summarizer concept's requirements 7-9): prepare_query replaces a query by its
// Rounds bucket ids (as floats), and score_prepared adds up Rounds counts, so a router hashes each
// query vector once per row rather than once per block.
//
// Costs: append is Rounds · Bits signed sums over head_dim per key (each sign one splitmix64), and
// so is preparing a query; a prepared score is Rounds lookups. score() on a raw query hashes it on
// every call. A record is 4 · (Rounds · 2^Bits + 1) bytes: 260 at 4 rounds of 4 bits, against 516
// for mean_pool at head_dim 128. More bits split keys finer (fewer, closer collisions); more rounds
// lower the variance of the count.

#include <cstdint>

#include "skim/concepts/summarizer.hpp"
#include "skim/core/dtypes.hpp"
#include "skim/detail/dot.hpp"

namespace skim::summarize {

template <int Rounds = 4, int Bits = 4, std::uint64_t Seed = 0x5eedb10cull>
struct lsh_buckets {
  static_assert(Rounds >= 1 && Rounds <= 16, "lsh_buckets: 1 to 16 rounds");
  static_assert(Bits >= 1 && Bits <= 8, "lsh_buckets: 1 to 8 bits per round");

  static constexpr int rounds = Rounds;
  static constexpr int bits = Bits;
  static constexpr std::int64_t buckets = std::int64_t{1} << Bits;  // per round

  [[nodiscard]] static constexpr std::int64_t record_floats(std::int32_t) noexcept { return Rounds * buckets + 1; }
  [[nodiscard]] static constexpr std::int64_t workspace_floats(std::int32_t) noexcept { return 0; }

  // Whether component e of hyperplane b of round r is -1 (else +1).
  [[nodiscard]] static constexpr bool plane_negative(int r, int b, std::int32_t e) noexcept {
    std::uint64_t z = Seed + ((static_cast<std::uint64_t>(r) * 16u + static_cast<std::uint64_t>(b)) << 32) +
                      static_cast<std::uint64_t>(static_cast<std::uint32_t>(e));
    z += 0x9e3779b97f4a7c15ull;  // splitmix64
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (z >> 63) != 0;
  }

  // bucket_r(x), for x any element type (read as its fp32 value).
  template <class T>
  [[nodiscard]] static std::int32_t bucket(int r, const T* x, std::int32_t head_dim) noexcept {
    std::int32_t id = 0;
    for (int b = 0; b < Bits; ++b) {
      double p = 0.0;
      for (std::int32_t e = 0; e < head_dim; ++e) {
        const double v = static_cast<double>(to_float(x[e]));
        p += plane_negative(r, b, e) ? -v : v;
      }
      if (p > 0.0) id |= std::int32_t{1} << b;
    }
    return id;
  }

  static void init(float* record, std::int32_t) noexcept {
    for (std::int64_t i = 0; i < record_floats(0); ++i) record[i] = 0.0f;
  }

  template <element T>
  static void append(float* SKIM_RESTRICT record, const T* SKIM_RESTRICT key, std::int32_t, std::int32_t,
                     std::int32_t head_dim) noexcept {
    for (int r = 0; r < Rounds; ++r) record[r * buckets + bucket(r, key, head_dim)] += 1.0f;
    record[Rounds * buckets] += 1.0f;
  }

  template <class Keys>
  static void complete_block(float*, const Keys&, std::int32_t, std::int32_t, float*) noexcept {}

  [[nodiscard]] static float score(const float* record, const float* q, std::int32_t head_dim) noexcept {
    if (record[Rounds * buckets] == 0.0f) return detail::neg_inf;
    float collisions = 0.0f;  // integers below 2^24: exact in any order
    for (int r = 0; r < Rounds; ++r) collisions += record[r * buckets + bucket(r, q, head_dim)];
    return collisions;
  }

  [[nodiscard]] static constexpr std::int64_t query_floats(std::int32_t) noexcept { return Rounds; }

  // q [prepared_query_capacity(head_dim)]: its first Rounds floats become bucket_r(q), r = 0, 1, ...
  static void prepare_query(float* q, std::int32_t head_dim) noexcept {
    std::int32_t ids[Rounds];
    for (int r = 0; r < Rounds; ++r) ids[r] = bucket(r, q, head_dim);
    for (int r = 0; r < Rounds; ++r) q[r] = static_cast<float>(ids[r]);
  }

  // @pre prepared came from prepare_query (each id an integer in [0, 2^Bits)).
  [[nodiscard]] static float score_prepared(const float* record, const float* prepared, std::int32_t) noexcept {
    if (record[Rounds * buckets] == 0.0f) return detail::neg_inf;
    float collisions = 0.0f;
    for (int r = 0; r < Rounds; ++r) {
      // The mask keeps a broken id inside the round's counts.
      const std::int64_t id = static_cast<std::int64_t>(prepared[r]) & (buckets - 1);
      collisions += record[r * buckets + id];
    }
    return collisions;
  }
};
static_assert(summarizer<lsh_buckets<>>);
static_assert(prepares_query<lsh_buckets<>>);
static_assert(lsh_buckets<16, 8>::query_floats(1) <= prepared_query_capacity(1));

}  // namespace skim::summarize
