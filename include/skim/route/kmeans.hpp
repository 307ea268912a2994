#pragma once
// kmeans: content routing by k-means over each sequence's keys (Routing Transformer style). The keys
// of a (sequence, kv head) are clustered; a query probes its nearest centroids (largest q·c) and the
// key blocks holding their keys become candidates. The output is the router's: a score per key block
// per index row, scores [index_rows, max_kv_blocks], -inf where a row cannot or need not look, which
// any selector (select/top_k.hpp, select/threshold.hpp) turns into block ids (docs/design.md §7).
//
// State, per (sequence b, kv head h), C = clusters, d = head_dim, all in caller-provided spans
// (kmeans::basic_state; kmeans::layout gives a batch's sizes and offsets):
//   centroids  [batch, heads_kv, C, d] fp32   centroid c of (b, h) at ((b·heads_kv + h)·C + c)·d
//   counts     [batch, heads_kv, C]    int32  keys held by each centroid
//   membership [total_kv_blocks, heads_kv, C] int32: entry (block j of b, h, c) at
//              ((kv_block_offset(b) + j)·heads_kv + h)·C + c counts the keys of block j held by c.
// The membership is the CSR of "blocks per centroid" in dense form. A real CSR would hold only the
// non-zero (block, centroid) pairs (at most min(block_kv, C) per block, and often 1 or 2) but a
// decode append would then insert into the middle of a centroid's list; the dense table costs
// 4·C bytes per (key block, kv head) (256 B at C = 64: 1/16 of a 16-key bf16 block of d = 128),
// grows at its end as blocks are added (a sequence's blocks are contiguous and block-major, so an
// engine may keep one span per sequence with room for future blocks), makes an append O(1) on it
// and a block's test "does c hold a key of j" one load.
// A sequence's slices (layout::sequence) are centroids [heads_kv, C, d], counts [heads_kv, C] and
// membership [kv_blocks(b), heads_kv, C]. Invariants after build and every append:
// counts[h][c] = Σ_j membership[j][h][c], Σ_c membership[j][h][c] = keys of block j, Σ_c counts[h][c]
// = keys of the sequence. After build a centroid with no key is all zeros; nothing reads it.
//
// build(p, K, options, state, workspace), per (sequence, kv head), from that sequence's keys of that
// kv head only (n keys, as fp32; dist2(x, y) = Σ_i (x_i − y_i)² in fp32 in dimension order):
//  1. k-means++ seeding with a fixed seed. Draw i of kv head h is
//       u_i = (splitmix64(options.seed + (h << 32) + i) >> 11) · 2^-53, a double in [0, 1)
//     (the sequence's position in the batch does not enter: a sequence gets the same clusters
//     wherever it sits). Seed 0 is key floor(u_0 · n) (clamped to n − 1). Then for c = 1, 2, ...,
//     C − 1: D(t) = min over the seeds so far of dist2(key t, seed) (fp32), total = Σ_t D(t) summed in
//     key order in double; if !(total > 0) seeding stops (every key coincides with a seed: fewer
//     distinct keys than clusters); else seed c is the first key t with Σ_{t' <= t} D(t') > u_c ·
//     total (same double sums), or, if none (only for non-finite keys), the first key of largest D.
//     Keys of D = 0 are never picked, so seeds are distinct keys; clusters past the seeds stay empty.
//  2. options.iterations (>= 1) Lloyd iterations over the live clusters (the seeds, at first): assign
//     every key to the nearest live centroid by dist2, ties to the lower centroid, then set each
//     centroid to the mean of its keys (fp32 sums in key order, divided by the count); a cluster
//     left with no key dies (zeros; it is never assigned again in this build).
//  3. counts and membership are the last iteration's assignment, so every non-empty centroid is the
//     fp32 mean of exactly the keys it holds (q·c is then the mean q·k of its keys). Fewer keys than
//     clusters (or duplicate keys) leave the extra clusters empty; a sequence with no key leaves all
//     of its clusters empty.
// Why Euclidean assignment rather than max dot product: keys are not normalised, and under max q·c
// assignment a centroid of large norm takes every key, however far. What the router needs is
// that q·c predicts q·k for every key c holds: q·k = q·c + q·(k − c), whose error |q|·|k − c|
// is what Euclidean k-means makes small for every query at once.
// Cost: (1 + options.iterations) · C · n · d distance terms (3 flops each) per (sequence, kv head);
// K is read C + iterations times. Scratch (build_workspace_bytes): max_b seq_len_kv(b) + (C + 1)·d
// floats and C int32.
//
// append(p, K, site): decode adds key `position` of sequence `seq` (every kv head) to the sequence's
// state. Per kv head: the key goes to the lowest empty cluster if there is one (so a state that held
// fewer keys than clusters keeps every key its own cluster, as build would), else to the nearest
// centroid by dist2 (ties to the lower); that centroid moves by the running mean, in fp32,
//   n = counts[c] + 1,  centroid[i] += (key[i] − centroid[i]) / n   (i in order),  counts[c] = n
// (for n = 1 the centroid is set to the key), and membership[block][h][c] += 1, the block's row
// being zeroed first when the key is slot 0 of its block. Earlier keys are not reassigned: centroids
// drift as keys arrive, and a rebuild (build over the cache) re-clusters. Keys must come in position
// order after a build of the prefix, or from an empty state (counts all 0; centroids and membership
// may hold anything): append checks that each kv head's counts add up to `position`.
// Cost per decode step and kv head: 3·C·d flops for the distances + 3·d for the update; reads
// 4·C·(d + 1) bytes of state and the key, writes 4·(d + 2) bytes (4·C more for a new block's row).
// No scratch.
//
// Errors: every call checks its problem, options, spans and workspace before reading anything and
// names the bad value. No allocation anywhere; results depend on the inputs only (not on the
// workspace's content, nor on the thread count). The router over this state: route/kmeans_router.hpp.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <span>
#include <type_traits>

#include "skim/core/dtypes.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"
#include "skim/core/views.hpp"
#include "skim/core/workspace.hpp"

namespace skim::route {

namespace kmeans {

// Options of build().
struct options {
  std::int32_t iterations = 4;                // Lloyd iterations, >= 1
  std::uint64_t seed = 0x6b6d65616e73ull;     // k-means++ draws (see the header)

  [[nodiscard]] status validate() const noexcept {
    if (iterations < 1) {
      return status::error(status_code::invalid_argument, "kmeans iterations %d < 1", iterations);
    }
    return status::success();
  }
};

// The state spans (see the header). T is float (build, append) or const float (the router).
template <class T>
struct basic_state {
  using count_type = std::conditional_t<std::is_const_v<T>, const std::int32_t, std::int32_t>;
  std::int32_t clusters = 0;                // C >= 1
  std::span<T> centroids{};                 // [.., heads_kv, C, head_dim]
  std::span<count_type> counts{};           // [.., heads_kv, C]
  std::span<count_type> membership{};       // [blocks, heads_kv, C]

  // A writable state reads as a read-only one. (A template, so that the read-only instantiation
  // does not declare a conversion to itself.)
  template <class U = T>
    requires(!std::is_const_v<U>)
  constexpr operator basic_state<const U>() const noexcept {
    return {clusters, centroids, counts, membership};
  }
};
using state = basic_state<float>;
using const_state = basic_state<const float>;

// Sizes and offsets of a batch's state (see the header).
struct layout {
  std::int32_t clusters = 0;
  std::int32_t heads_kv = 0;
  std::int32_t head_dim = 0;
  std::int32_t block_kv = 0;
  std::int64_t total_kv_blocks = 0;
  std::span<const std::int32_t> cu_seqlens_kv{};  // the problem's (not copied)

  [[nodiscard]] constexpr problem keys() const noexcept {
    problem p;
    p.block_kv = block_kv;
    p.cu_seqlens_q = cu_seqlens_kv;  // only the batch size is read from it
    p.cu_seqlens_kv = cu_seqlens_kv;
    return p;
  }
  [[nodiscard]] constexpr std::int32_t batch() const noexcept { return keys().batch(); }
  [[nodiscard]] constexpr std::int32_t kv_blocks(std::int32_t b) const noexcept { return keys().kv_blocks(b); }
  [[nodiscard]] constexpr std::int64_t kv_block_offset(std::int32_t b) const noexcept {
    return keys().kv_block_offset(b);
  }
  // Per sequence: centroid floats, count entries; per key block: membership entries (all kv heads).
  [[nodiscard]] constexpr std::int64_t sequence_centroid_floats() const noexcept {
    return static_cast<std::int64_t>(heads_kv) * clusters * head_dim;
  }
  [[nodiscard]] constexpr std::int64_t sequence_counts() const noexcept {
    return static_cast<std::int64_t>(heads_kv) * clusters;
  }
  [[nodiscard]] constexpr std::int64_t block_membership() const noexcept {
    return static_cast<std::int64_t>(heads_kv) * clusters;
  }
  // Sizes of the batch's spans.
  [[nodiscard]] constexpr std::int64_t centroid_floats() const noexcept { return batch() * sequence_centroid_floats(); }
  [[nodiscard]] constexpr std::int64_t count_entries() const noexcept { return batch() * sequence_counts(); }
  [[nodiscard]] constexpr std::int64_t membership_entries() const noexcept {
    return total_kv_blocks * block_membership();
  }
  [[nodiscard]] constexpr std::int64_t bytes() const noexcept {
    return 4 * (centroid_floats() + count_entries() + membership_entries());
  }
  // Where sequence b's slices start.
  [[nodiscard]] constexpr std::int64_t centroid_offset(std::int32_t b) const noexcept {
    return b * sequence_centroid_floats();
  }
  [[nodiscard]] constexpr std::int64_t count_offset(std::int32_t b) const noexcept { return b * sequence_counts(); }
  [[nodiscard]] constexpr std::int64_t membership_offset(std::int32_t b) const noexcept {
    return kv_block_offset(b) * block_membership();
  }
  // Sequence b's slices of a batch state. @pre s has this layout's sizes (check_state).
  template <class T>
  [[nodiscard]] constexpr basic_state<T> sequence(const basic_state<T>& s, std::int32_t b) const noexcept {
    return {s.clusters, s.centroids.subspan(static_cast<std::size_t>(centroid_offset(b)),
                                            static_cast<std::size_t>(sequence_centroid_floats())),
            s.counts.subspan(static_cast<std::size_t>(count_offset(b)), static_cast<std::size_t>(sequence_counts())),
            s.membership.subspan(static_cast<std::size_t>(membership_offset(b)),
                                 static_cast<std::size_t>(kv_blocks(b) * block_membership()))};
  }
};

// @pre validate(p) is ok.
[[nodiscard]] constexpr layout make_layout(const problem& p, std::int32_t clusters) noexcept {
  layout l;
  l.clusters = clusters;
  l.heads_kv = p.heads_kv;
  l.head_dim = p.head_dim;
  l.block_kv = p.block_kv;
  l.total_kv_blocks = p.total_kv_blocks();
  l.cu_seqlens_kv = p.cu_seqlens_kv;
  return l;
}

namespace detail {

[[nodiscard]] inline status check_clusters(std::int32_t clusters) noexcept {
  if (clusters < 1) return status::error(status_code::invalid_argument, "kmeans clusters %d < 1", clusters);
  return status::success();
}

// The spans of a state against the sizes they need; seq < 0 names the batch state, else sequence
// seq's.
template <class T>
[[nodiscard]] status check_spans(const basic_state<T>& s, std::int64_t centroid_floats, std::int64_t counts,
                                 std::int64_t membership, std::int32_t seq) noexcept {
  char what[48] = "kmeans state";
  if (seq >= 0) std::snprintf(what, sizeof what, "kmeans state of sequence %d", seq);
  if (s.centroids.size() < static_cast<std::size_t>(centroid_floats)) {
    return status::error(status_code::shape_mismatch, "%s: centroids has %zu floats, needs %lld", what,
                         s.centroids.size(), static_cast<long long>(centroid_floats));
  }
  if (s.counts.size() < static_cast<std::size_t>(counts)) {
    return status::error(status_code::shape_mismatch, "%s: counts has %zu entries, needs %lld", what,
                         s.counts.size(), static_cast<long long>(counts));
  }
  if (s.membership.size() < static_cast<std::size_t>(membership)) {
    return status::error(status_code::shape_mismatch, "%s: membership has %zu entries, needs %lld", what,
                         s.membership.size(), static_cast<long long>(membership));
  }
  return status::success();
}

// A batch state against the layout of (p, s.clusters). @pre validate(p) is ok.
template <class T>
[[nodiscard]] status check_state(const problem& p, const basic_state<T>& s) noexcept {
  SKIM_TRY(check_clusters(s.clusters));
  const layout l = make_layout(p, s.clusters);
  return check_spans(s, l.centroid_floats(), l.count_entries(), l.membership_entries(), -1);
}

// Each kv head of a sequence's state holds exactly `keys` keys (its counts add up to them).
[[nodiscard]] inline status check_key_count(const const_state& s, std::int32_t heads_kv, std::int32_t seq,
                                            std::int32_t keys, const char* expected) noexcept {
  for (std::int32_t h = 0; h < heads_kv; ++h) {
    std::int64_t held = 0;
    for (std::int32_t c = 0; c < s.clusters; ++c) held += s.counts[static_cast<std::size_t>(h) * s.clusters + c];
    if (held != keys) {
      return status::error(status_code::invalid_argument,
                           "kmeans state of sequence %d kv head %d holds %lld keys, %s %d", seq, h,
                           static_cast<long long>(held), expected, keys);
    }
  }
  return status::success();
}

[[nodiscard]] constexpr std::uint64_t splitmix64(std::uint64_t z) noexcept {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Draw i of kv head h, in [0, 1).
[[nodiscard]] constexpr double draw(std::uint64_t seed, std::int32_t h, std::uint64_t i) noexcept {
  const std::uint64_t z = splitmix64(seed + (static_cast<std::uint64_t>(static_cast<std::uint32_t>(h)) << 32) + i);
  return static_cast<double>(z >> 11) * 0x1p-53;
}

// Σ_i (x_i − y_i)², fp32, i in order.
template <class T>
[[nodiscard]] SKIM_FORCEINLINE float dist2(const T* SKIM_RESTRICT x, const float* SKIM_RESTRICT y,
                                           std::int32_t d) noexcept {
  float acc = 0.0f;
  for (std::int32_t i = 0; i < d; ++i) {
    const float e = to_float(x[i]) - y[i];
    acc += e * e;
  }
  return acc;
}

// q·c, fp32, i in order.
[[nodiscard]] SKIM_FORCEINLINE float dot(const float* SKIM_RESTRICT q, const float* SKIM_RESTRICT c,
                                         std::int32_t d) noexcept {
  float acc = 0.0f;
  for (std::int32_t i = 0; i < d; ++i) acc += q[i] * c[i];
  return acc;
}

// Nearest centroid of `key` among those with live[c] != 0 (ties to the lower); -1 if none.
template <class T>
[[nodiscard]] std::int32_t nearest(const T* key, const float* centroids, const std::int32_t* live,
                                   std::int32_t clusters, std::int32_t d) noexcept {
  std::int32_t best = -1;
  float best_d2 = 0.0f;
  for (std::int32_t c = 0; c < clusters; ++c) {
    if (live != nullptr && live[c] == 0) continue;
    const float d2 = dist2(key, centroids + static_cast<std::int64_t>(c) * d, d);
    if (best < 0 || d2 < best_d2) {  // strict: ties stay with the lower centroid
      best = c;
      best_d2 = d2;
    }
  }
  return best;
}

struct build_scratch {
  std::span<float> min_d2;     // [max keys of a sequence]
  std::span<float> sums;       // [C, d]
  std::span<float> key;        // [d]
  std::span<std::int32_t> live;  // [C]
};

[[nodiscard]] inline build_scratch take_build_scratch(workspace_arena& arena, const problem& p,
                                                      std::int32_t clusters) noexcept {
  // Any value will do for input validate() rejects, as long as computing it is safe.
  const bool sane = p.head_dim > 0 && clusters > 0 && p.cu_seqlens_kv.size() >= 2;
  std::int32_t max_len = 0;
  if (sane) {
    for (std::size_t b = 1; b < p.cu_seqlens_kv.size(); ++b) {
      max_len = std::max(max_len, p.cu_seqlens_kv[b] - p.cu_seqlens_kv[b - 1]);
    }
  }
  const std::size_t c = sane ? static_cast<std::size_t>(clusters) : 0;
  const std::size_t d = sane ? static_cast<std::size_t>(p.head_dim) : 0;
  build_scratch s;
  s.min_d2 = arena.take<float>(static_cast<std::size_t>(max_len));
  s.sums = arena.take<float>(c * d);
  s.key = arena.take<float>(d);
  s.live = arena.take<std::int32_t>(c);
  return s;
}

// Clusters the n keys of (sequence b, kv head h) into seq's slices. @pre everything build checks.
template <class Kv>
void build_head(const problem& p, const Kv& kv, std::int32_t b, std::int32_t h, std::uint64_t seed,
                std::int32_t iterations, const state& seq, const build_scratch& s) noexcept {
  const std::int32_t d = p.head_dim;
  const std::int32_t C = seq.clusters;
  const std::int32_t n = p.seq_len_kv(b);
  const std::int64_t cd = static_cast<std::int64_t>(C) * d;
  float* centroids = seq.centroids.data() + h * cd;
  std::int32_t* counts = seq.counts.data() + static_cast<std::int64_t>(h) * C;
  // Block j's row at j·heads_kv·C. A sequence without blocks may hold an empty (null) span: no
  // arithmetic on it.
  std::int32_t* membership =
      seq.membership.empty() ? nullptr : seq.membership.data() + static_cast<std::int64_t>(h) * C;
  const std::int64_t block_stride = static_cast<std::int64_t>(p.heads_kv) * C;
  const std::int32_t blocks = p.kv_blocks(b);
  for (std::int32_t j = 0; j < blocks; ++j) {
    for (std::int32_t c = 0; c < C; ++c) membership[j * block_stride + c] = 0;
  }
  for (std::int64_t i = 0; i < cd; ++i) centroids[i] = 0.0f;
  for (std::int32_t c = 0; c < C; ++c) counts[c] = 0;
  if (n == 0) return;

  // 1. k-means++ seeding.
  float* min_d2 = s.min_d2.data();
  const auto seed_with = [&](std::int32_t c, std::int32_t t) noexcept {
    const auto* key = kv.k_row(b, t, h);
    float* ctr = centroids + static_cast<std::int64_t>(c) * d;
    for (std::int32_t i = 0; i < d; ++i) ctr[i] = to_float(key[i]);
  };
  std::int32_t first = static_cast<std::int32_t>(draw(seed, h, 0) * n);
  first = first < n ? first : n - 1;
  seed_with(0, first);
  for (std::int32_t t = 0; t < n; ++t) min_d2[t] = dist2(kv.k_row(b, t, h), centroids, d);
  std::int32_t seeded = 1;
  for (std::int32_t c = 1; c < C; ++c) {
    double total = 0.0;
    for (std::int32_t t = 0; t < n; ++t) total += min_d2[t];
    if (!(total > 0.0)) break;
    const double target = draw(seed, h, static_cast<std::uint64_t>(c)) * total;
    std::int32_t pick = -1;
    double cum = 0.0;
    for (std::int32_t t = 0; t < n; ++t) {
      cum += min_d2[t];
      if (cum > target) {
        pick = t;
        break;
      }
    }
    if (pick < 0) {  // total is not finite: the first key of largest distance
      pick = 0;
      for (std::int32_t t = 1; t < n; ++t) pick = min_d2[t] > min_d2[pick] ? t : pick;
    }
    seed_with(c, pick);
    seeded = c + 1;
    const float* ctr = centroids + static_cast<std::int64_t>(c) * d;
    for (std::int32_t t = 0; t < n; ++t) {
      const float x = dist2(kv.k_row(b, t, h), ctr, d);
      min_d2[t] = x < min_d2[t] ? x : min_d2[t];
    }
  }

  // 2. Lloyd iterations; 3. the last assignment is the membership.
  std::int32_t* live = s.live.data();
  for (std::int32_t c = 0; c < C; ++c) live[c] = c < seeded ? 1 : 0;
  float* sums = s.sums.data();
  float* key = s.key.data();
  for (std::int32_t it = 0; it < iterations; ++it) {
    const bool last = it + 1 == iterations;
    for (std::int64_t i = 0; i < cd; ++i) sums[i] = 0.0f;
    for (std::int32_t c = 0; c < C; ++c) counts[c] = 0;
    for (std::int32_t t = 0; t < n; ++t) {
      const auto* row = kv.k_row(b, t, h);
      for (std::int32_t i = 0; i < d; ++i) key[i] = to_float(row[i]);
      const std::int32_t c = nearest(static_cast<const float*>(key), centroids, live, C, d);
      SKIM_DASSERT(c >= 0);  // seed 0 stays live: it is nearest to its own key
      float* sum = sums + static_cast<std::int64_t>(c) * d;
      for (std::int32_t i = 0; i < d; ++i) sum[i] += key[i];
      ++counts[c];
      if (last) ++membership[(t / p.block_kv) * block_stride + c];
    }
    for (std::int32_t c = 0; c < C; ++c) {
      float* ctr = centroids + static_cast<std::int64_t>(c) * d;
      const float* sum = sums + static_cast<std::int64_t>(c) * d;
      live[c] = counts[c] > 0 ? 1 : 0;
      const float count = static_cast<float>(counts[c]);
      for (std::int32_t i = 0; i < d; ++i) ctr[i] = counts[c] > 0 ? sum[i] / count : 0.0f;
    }
  }
}

// Key `position` of sequence b, every kv head, into the sequence's state s (the append rule of the
// header). @pre everything append checks; kv is bound.
template <class Kv>
void append_key(const problem& p, const Kv& kv, std::int32_t b, std::int32_t position, const state& s) noexcept {
  const std::int32_t C = s.clusters;
  const std::int32_t d = p.head_dim;
  const std::int32_t block = position / p.block_kv;
  const bool new_block = position % p.block_kv == 0;
  for (std::int32_t h = 0; h < p.heads_kv; ++h) {
    float* centroids = s.centroids.data() + static_cast<std::int64_t>(h) * C * d;
    std::int32_t* counts = s.counts.data() + static_cast<std::int64_t>(h) * C;
    std::int32_t* row = s.membership.data() + (static_cast<std::int64_t>(block) * p.heads_kv + h) * C;
    if (new_block) {
      for (std::int32_t c = 0; c < C; ++c) row[c] = 0;
    }
    const auto* key = kv.k_row(b, position, h);
    std::int32_t target = -1;
    for (std::int32_t c = 0; c < C && target < 0; ++c) target = counts[c] == 0 ? c : -1;
    if (target < 0) target = nearest(key, centroids, nullptr, C, d);
    float* ctr = centroids + static_cast<std::int64_t>(target) * d;
    const std::int32_t count = counts[target] + 1;
    const float fcount = static_cast<float>(count);
    if (count == 1) {  // an empty cluster's centroid may hold anything: the key replaces it
      for (std::int32_t i = 0; i < d; ++i) ctr[i] = to_float(key[i]);
    } else {
      for (std::int32_t i = 0; i < d; ++i) ctr[i] += (to_float(key[i]) - ctr[i]) / fcount;
    }
    counts[target] = count;
    ++row[target];
  }
}

}  // namespace detail

// Bytes of workspace build() needs (depends on the shape only; never fails).
[[nodiscard]] inline std::size_t build_workspace_bytes(const problem& p, std::int32_t clusters) noexcept {
  workspace_arena measure;
  (void)detail::take_build_scratch(measure, p, clusters);
  return measure.bytes();
}

// Clusters every (sequence, kv head) of K into state (the batch layout of make_layout(p,
// state.clusters); entries past its sizes are left alone). Only K is read (V is validated with it).
template <kv_source Kv>
[[nodiscard]] status build(const problem& p, const Kv& kv, const options& opt, const state& s,
                           std::span<std::byte> workspace) noexcept {
  SKIM_TRY(validate(p));
  SKIM_TRY(kv.validate(p));
  SKIM_TRY(opt.validate());
  SKIM_TRY(detail::check_state(p, s));
  SKIM_TRY(check_workspace(workspace, build_workspace_bytes(p, s.clusters)));
  workspace_arena arena(workspace);
  const detail::build_scratch scratch = detail::take_build_scratch(arena, p, s.clusters);
  const layout l = make_layout(p, s.clusters);
  const Kv bound = kv.bind(p);
  for (std::int32_t b = 0; b < p.batch(); ++b) {
    const state seq = l.sequence(s, b);
    for (std::int32_t h = 0; h < p.heads_kv; ++h) {
      detail::build_head(p, bound, b, h, opt.seed, opt.iterations, seq, scratch);
    }
  }
  return status::success();
}

// Where a decode step's new key goes.
struct append_site {
  std::int32_t seq = 0;       // sequence b of the problem
  std::int32_t position = 0;  // the new key's position in sequence b, < seq_len_kv(b)
  state sequence{};           // sequence b's state: centroids [heads_kv, C, d], counts [heads_kv, C],
                              // membership [>= position / block_kv + 1, heads_kv, C] (layout::sequence,
                              // or an engine's own per-sequence spans with room for future blocks)
};

// Decode: adds key `position` of sequence `seq` (every kv head) to the sequence's state, as the
// header says. Checks p and kv (O(batch + pages)), the spans, and that each kv head holds exactly
// `position` keys (O(heads_kv · C)).
template <kv_source Kv>
[[nodiscard]] status append(const problem& p, const Kv& kv, const append_site& site) noexcept {
  SKIM_TRY(validate(p));
  SKIM_TRY(kv.validate(p));
  if (site.seq < 0 || site.seq >= p.batch()) {
    return status::error(status_code::invalid_argument, "kmeans append sequence %d out of [0, %d)", site.seq,
                         p.batch());
  }
  const std::int32_t n = p.seq_len_kv(site.seq);
  if (site.position < 0 || site.position >= n) {
    return status::error(status_code::invalid_argument,
                         "kmeans append position %d out of [0, %d) keys of sequence %d", site.position, n, site.seq);
  }
  const state& s = site.sequence;
  SKIM_TRY(detail::check_clusters(s.clusters));
  const std::int32_t block = site.position / p.block_kv;
  const layout l = make_layout(p, s.clusters);
  SKIM_TRY(detail::check_spans(s, l.sequence_centroid_floats(), l.sequence_counts(),
                               (static_cast<std::int64_t>(block) + 1) * l.block_membership(), site.seq));
  SKIM_TRY(detail::check_key_count(s, p.heads_kv, site.seq, site.position, "append expects"));
  detail::append_key(p, kv.bind(p), site.seq, site.position, s);
  return status::success();
}

// Decode step of a whole batch: for every sequence b with keys, adds its newest key (position
// seq_len_kv(b) − 1) to seq_states[b], as append() would; empty sequences are skipped. p and kv are
// checked once for the batch. seq_states: [batch], each as append_site::sequence for its sequence.
// Every sequence is checked before any is changed, so a failure leaves every state as it was.
template <kv_source Kv>
[[nodiscard]] status append_newest(const problem& p, const Kv& kv, std::span<const state> seq_states) noexcept {
  SKIM_TRY(validate(p));
  SKIM_TRY(kv.validate(p));
  if (seq_states.size() != static_cast<std::size_t>(p.batch())) {
    return status::error(status_code::shape_mismatch, "kmeans seq_states has %zu states, expected batch = %d",
                         seq_states.size(), p.batch());
  }
  for (std::int32_t b = 0; b < p.batch(); ++b) {
    const std::int32_t t = p.seq_len_kv(b) - 1;
    if (t < 0) continue;
    const state& s = seq_states[static_cast<std::size_t>(b)];
    SKIM_TRY(detail::check_clusters(s.clusters));
    const layout l = make_layout(p, s.clusters);
    SKIM_TRY(detail::check_spans(s, l.sequence_centroid_floats(), l.sequence_counts(),
                                 (static_cast<std::int64_t>(t / p.block_kv) + 1) * l.block_membership(), b));
    SKIM_TRY(detail::check_key_count(s, p.heads_kv, b, t, "append expects"));
  }
  const Kv bound = kv.bind(p);
  for (std::int32_t b = 0; b < p.batch(); ++b) {
    const std::int32_t t = p.seq_len_kv(b) - 1;
    if (t >= 0) detail::append_key(p, bound, b, t, seq_states[static_cast<std::size_t>(b)]);
  }
  return status::success();
}

}  // namespace kmeans

}  // namespace skim::route
