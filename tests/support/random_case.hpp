#pragma once
// Random attention cases for executor tests: a random problem shape, fresh random Q/K/V, the
// K/V in both contiguous and paged storage, and output buffers pre-filled with NaN so that a row an
// executor forgets to write fails the comparison.
//
// Every case owns a std::mt19937 seeded by the caller; tests INFO the seed so a failure can be
// replayed by running that one seed.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "skim/core/dtypes.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"
#include "skim/core/views.hpp"
#include "skim/core/workspace.hpp"

namespace skim::test {

struct sequence_lengths {
  std::int32_t q = 0;
  std::int32_t kv = 0;
};

struct case_spec {
  std::int32_t heads_q = 1;
  std::int32_t heads_kv = 1;
  std::int32_t head_dim = 8;
  std::int32_t block_q = 16;
  std::int32_t block_kv = 16;
  mask_kind mask = mask_kind::causal;
  index_scope scope = index_scope::kv_head;
  float softmax_scale = 0.0f;
  // One sequence of one query and one key (built by count, not from a braced list: GCC 12 warns,
  // falsely, that the list's array may be used uninitialized where the copy is inlined).
  std::vector<sequence_lengths> seqs = std::vector<sequence_lengths>(1, sequence_lengths{1, 1});
  bool paged = false;
  std::int32_t page_size = 16;
  bool q_head_major = false;  // Q as [heads, tokens, dim] instead of [tokens, heads, dim]
  bool o_head_major = false;
  bool kv_head_major = false;  // the CUDA tests' K/V storage: [heads, tokens, dim] (pages [heads, page_size, dim])

  [[nodiscard]] std::string describe() const {
    std::ostringstream s;
    s << "heads " << heads_q << "/" << heads_kv << " d " << head_dim << " bq " << block_q << " bk " << block_kv
      << (mask == mask_kind::causal ? " causal" : " no-mask")
      << (scope == index_scope::kv_head ? " kv-head-index" : " query-head-index") << " scale " << softmax_scale
      << (paged ? " paged(" + std::to_string(page_size) + ")" : std::string(" contiguous"))
      << (q_head_major ? " Q head-major" : "") << (o_head_major ? " O head-major" : "")
      << (kv_head_major ? " K/V head-major" : "") << " seqs";
    for (const auto& l : seqs) s << " " << l.q << "x" << l.kv;
    return s.str();
  }
};

template <class T>
[[nodiscard]] T pick(std::mt19937& rng, std::initializer_list<T> values) {
  std::uniform_int_distribution<std::size_t> d(0, values.size() - 1);
  return values.begin()[d(rng)];
}

[[nodiscard]] inline std::int32_t uniform(std::mt19937& rng, std::int32_t lo, std::int32_t hi) {
  return std::uniform_int_distribution<std::int32_t>(lo, hi)(rng);
}

[[nodiscard]] inline bool chance(std::mt19937& rng, double p) { return std::bernoulli_distribution(p)(rng); }

// A random shape covering what executors must handle: odd and common head dims, independent
// block sizes (odd small ones too), GQA ratios 1, 4, 8, varlen batches with empty sequences, more
// queries than keys and decode rows, paged K/V with page sizes unlike block_kv.
// `work` bounds tokens_q · tokens_kv · heads_q · head_dim so the double reference stays quick.
[[nodiscard]] inline case_spec random_spec(std::mt19937& rng, double work = 6e6) {
  case_spec s;
  s.head_dim = pick(rng, {1, 2, 3, 5, 8, 13, 16, 32, 33, 64, 72, 80, 96, 100, 128, 160, 256});
  s.heads_kv = uniform(rng, 1, 2);
  s.heads_q = s.heads_kv * pick(rng, {1, 4, 8});
  s.block_q = pick(rng, {1, 3, 5, 7, 13, 16, 17, 24, 32, 48, 64, 100, 128});
  s.block_kv = pick(rng, {1, 3, 5, 7, 13, 16, 17, 24, 32, 48, 64, 100, 128});
  s.mask = chance(rng, 0.7) ? mask_kind::causal : mask_kind::none;
  s.scope = chance(rng, 0.75) ? index_scope::kv_head : index_scope::query_head;
  s.softmax_scale = chance(rng, 0.5) ? 0.0f
                                     : std::uniform_real_distribution<float>(0.3f, 3.0f)(rng) /
                                           std::sqrt(static_cast<float>(s.head_dim));
  const std::int32_t batch = uniform(rng, 1, 4);
  const double per_seq = work / (static_cast<double>(s.heads_q) * s.head_dim * batch);
  const std::int32_t max_len = std::clamp(static_cast<std::int32_t>(std::sqrt(per_seq)), 4, 300);
  s.seqs.clear();
  for (std::int32_t b = 0; b < batch; ++b) {
    sequence_lengths l;
    const int kind = uniform(rng, 0, 9);
    l.kv = uniform(rng, 1, max_len);
    if (kind == 0) {
      l = {0, chance(rng, 0.5) ? 0 : l.kv};  // empty sequence (queries, and maybe keys)
    } else if (kind == 1) {
      l.q = 1;  // decode
    } else if (kind == 2) {
      l.q = uniform(rng, 1, max_len);
      l.kv = uniform(rng, 0, std::max(0, l.q - 1));  // more queries than keys
    } else {
      l.q = uniform(rng, 1, l.kv);
    }
    s.seqs.push_back(l);
  }
  s.paged = chance(rng, 0.5);
  do {
    s.page_size = pick(rng, {1, 3, 8, 16, 17, 32, 64});
  } while (s.page_size == s.block_kv);
  s.q_head_major = chance(rng, 0.25);
  s.o_head_major = chance(rng, 0.25);
  return s;
}

// Fills with N(0, 1) values rounded to T.
template <element T>
void fill_normal(std::mt19937& rng, std::vector<T>& x) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  for (T& e : x) e = from_float<T>(n(rng));
}

template <element T>
[[nodiscard]] constexpr T nan_of() noexcept {
  return from_float<T>(std::numeric_limits<float>::quiet_NaN());
}

// x as [groups][tokens][heads][dim] rewritten as [groups][heads][tokens][dim] (head-major K/V).
template <class T>
[[nodiscard]] std::vector<T> heads_outside(const std::vector<T>& x, std::int64_t groups, std::int64_t tokens,
                                           std::int64_t heads, std::int64_t dim) {
  std::vector<T> y(x.size());
  for (std::int64_t g = 0; g < groups; ++g)
    for (std::int64_t t = 0; t < tokens; ++t)
      for (std::int64_t h = 0; h < heads; ++h)
        std::copy_n(x.begin() + ((g * tokens + t) * heads + h) * dim, dim, y.begin() + ((g * heads + h) * tokens + t) * dim);
  return y;
}

// The inputs of one case. K/V exist in contiguous (token-major) and paged form with the same values.
template <element TQ, element TKV>
struct random_case {
  case_spec spec;
  std::vector<std::int32_t> cu_q, cu_kv;
  std::vector<TQ> q;         // layout per spec.q_head_major
  std::vector<TKV> k, v;     // [tokens_kv, heads_kv, head_dim]
  std::vector<TKV> k_pages, v_pages;  // [num_pages, page_size, heads_kv, head_dim]
  std::vector<std::int32_t> page_indptr, page_indices;
  std::int32_t num_pages = 0;

  random_case(const case_spec& s, std::mt19937& rng) : spec(s) {
    cu_q.push_back(0);
    cu_kv.push_back(0);
    for (const auto& l : s.seqs) {
      cu_q.push_back(cu_q.back() + l.q);
      cu_kv.push_back(cu_kv.back() + l.kv);
    }
    const std::size_t d = static_cast<std::size_t>(s.head_dim);
    q.resize(static_cast<std::size_t>(cu_q.back()) * s.heads_q * d);
    k.resize(static_cast<std::size_t>(cu_kv.back()) * s.heads_kv * d);
    v.resize(k.size());
    fill_normal(rng, q);
    fill_normal(rng, k);
    fill_normal(rng, v);

    // Pages: each sequence's pages, plus a few spare ones, at randomly permuted physical slots.
    std::int32_t needed = 0;
    for (const auto& l : s.seqs) needed += (l.kv + s.page_size - 1) / s.page_size;
    num_pages = needed + uniform(rng, 0, 3);
    std::vector<std::int32_t> slots(static_cast<std::size_t>(num_pages));
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
    const std::size_t page_elems = static_cast<std::size_t>(s.page_size) * s.heads_kv * d;
    k_pages.resize(static_cast<std::size_t>(num_pages) * page_elems);
    v_pages.resize(k_pages.size());
    fill_normal(rng, k_pages);  // spare pages and tails hold unrelated values, not zeros
    fill_normal(rng, v_pages);
    page_indptr.push_back(0);
    std::size_t next_slot = 0;
    for (std::size_t b = 0; b < s.seqs.size(); ++b) {
      const std::int32_t n_kv = s.seqs[b].kv;
      const std::int32_t pages = (n_kv + s.page_size - 1) / s.page_size;
      for (std::int32_t pg = 0; pg < pages; ++pg) page_indices.push_back(slots[next_slot++]);
      page_indptr.push_back(static_cast<std::int32_t>(page_indices.size()));
      for (std::int32_t t = 0; t < n_kv; ++t) {
        const std::int32_t page = page_indices[static_cast<std::size_t>(page_indptr[b] + t / s.page_size)];
        const std::size_t dst = static_cast<std::size_t>(page) * page_elems +
                                static_cast<std::size_t>(t % s.page_size) * s.heads_kv * d;
        const std::size_t src = static_cast<std::size_t>(cu_kv[b] + t) * s.heads_kv * d;
        std::copy_n(k.begin() + static_cast<std::ptrdiff_t>(src), s.heads_kv * d,
                    k_pages.begin() + static_cast<std::ptrdiff_t>(dst));
        std::copy_n(v.begin() + static_cast<std::ptrdiff_t>(src), s.heads_kv * d,
                    v_pages.begin() + static_cast<std::ptrdiff_t>(dst));
      }
    }
  }

  [[nodiscard]] problem prob() const {
    return problem{.heads_q = spec.heads_q, .heads_kv = spec.heads_kv, .head_dim = spec.head_dim,
                   .block_q = spec.block_q, .block_kv = spec.block_kv, .mask = spec.mask,
                   .softmax_scale = spec.softmax_scale, .cu_seqlens_q = cu_q, .cu_seqlens_kv = cu_kv,
                   .scope = spec.scope};
  }
  [[nodiscard]] std::int32_t tokens_q() const { return cu_q.back(); }
  [[nodiscard]] strided_view<const TQ> q_view() const {
    return spec.q_head_major ? strided_view<const TQ>::head_major(q.data(), tokens_q(), spec.heads_q, spec.head_dim)
                             : strided_view<const TQ>::token_major(q.data(), tokens_q(), spec.heads_q, spec.head_dim);
  }
  [[nodiscard]] contiguous_kv<TKV> contiguous() const {
    return {.k = strided_view<const TKV>::token_major(k.data(), cu_kv.back(), spec.heads_kv, spec.head_dim),
            .v = strided_view<const TKV>::token_major(v.data(), cu_kv.back(), spec.heads_kv, spec.head_dim),
            .cu_seqlens_kv = {}};
  }
  [[nodiscard]] paged_kv<TKV> paged() const {
    return paged_kv<TKV>::packed(k_pages.data(), v_pages.data(), num_pages, spec.page_size, spec.heads_kv,
                                 spec.head_dim, page_indptr, page_indices);
  }
  // The same pages head-major, [num_pages, heads_kv, page_size, head_dim]: a copy of the values
  // (head_major_pages(k_pages), ...) viewed by paged_head_major().
  [[nodiscard]] std::vector<TKV> head_major_pages(const std::vector<TKV>& pages) const {
    return heads_outside(pages, num_pages, spec.page_size, spec.heads_kv, spec.head_dim);
  }
  [[nodiscard]] paged_kv<TKV> paged_head_major(const std::vector<TKV>& k_hm, const std::vector<TKV>& v_hm) const {
    return paged_kv<TKV>::packed_head_major(k_hm.data(), v_hm.data(), num_pages, spec.page_size, spec.heads_kv,
                                            spec.head_dim, page_indptr, page_indices);
  }
  // Calls f(kv source) with the storage the spec asks for.
  template <class F>
  decltype(auto) with_kv(F&& f) const {
    return spec.paged ? f(paged()) : f(contiguous());
  }
};

// An output buffer, NaN-filled, in the layout the spec asks for.
template <element TO>
struct output {
  std::vector<TO> o;
  std::vector<float> lse;
  strided_view<TO> view;

  output(const case_spec& s, std::int32_t tokens_q, bool with_lse = true)
      : o(static_cast<std::size_t>(tokens_q) * s.heads_q * s.head_dim, nan_of<TO>()),
        lse(with_lse ? static_cast<std::size_t>(tokens_q) * s.heads_q : 0, std::numeric_limits<float>::quiet_NaN()) {
    view = s.o_head_major ? strided_view<TO>::head_major(o.data(), tokens_q, s.heads_q, s.head_dim)
                          : strided_view<TO>::token_major(o.data(), tokens_q, s.heads_q, s.head_dim);
  }
  output(const output&) = delete;  // the view points into o
  output& operator=(const output&) = delete;
};

// Byte storage aligned to workspace_alignment, filled with a pattern (0xff bytes: NaN floats)
// so that an executor relying on zeroed scratch fails.
struct aligned_workspace {
  std::vector<std::byte> storage;
  std::span<std::byte> bytes;

  explicit aligned_workspace(std::size_t n, std::byte fill = std::byte{0xff}) : storage(n + workspace_alignment, fill) {
    void* p = storage.data();
    std::size_t space = storage.size();
    p = std::align(workspace_alignment, n == 0 ? 1 : n, p, space);
    bytes = {static_cast<std::byte*>(p), n};
  }
  aligned_workspace(const aligned_workspace&) = delete;
  aligned_workspace& operator=(const aligned_workspace&) = delete;
};

// Runs an executor with a fresh workspace of the size it asks for (pattern-filled, aligned).
template <class Executor, class Args>
[[nodiscard]] status run_executor(const Executor& e, const Args& args, std::byte fill = std::byte{0xff}) {
  aligned_workspace ws(e.workspace_bytes(args.prob), fill);
  return e.run(args, ws.bytes);
}

// Tolerance on per-row relative L2 error of O: fp32 accumulation against double, plus one rounding
// of the output to TO on each side.
template <element TO>
inline constexpr double output_tolerance = std::same_as<TO, float> ? 1e-5 : std::same_as<TO, half> ? 1e-5 + 0x1p-10
                                                                                                    : 1e-5 + 0x1p-7;

}  // namespace skim::test
