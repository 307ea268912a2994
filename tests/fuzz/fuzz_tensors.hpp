#pragma once
// Q, K, V and outputs for the fuzz targets that run executors (index_fuzz, token_list_fuzz):
// small values in [-2, 2) from a seed the input picks, K/V contiguous or in pages (each sequence's
// own pages, sometimes a hostile page table), outputs NaN-filled; and run(), which calls an
// executor over a pattern-filled workspace exactly as big as it asks.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "fuzz_input.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"
#include "skim/core/views.hpp"
#include "skim/core/workspace.hpp"

namespace skim::fuzz {

struct tensors {
  std::vector<float> q, k, v, k_pages, v_pages, o_scalar, o_ref, lse_scalar, lse_ref;
  std::vector<std::int32_t> page_indptr, page_indices;
  std::int32_t num_pages = 0, page_size = 1;
  bool paged = false;

  tensors(fuzz_input& in, const problem& p) {
    const auto nonneg = [](std::int64_t x) { return static_cast<std::size_t>(x < 0 ? 0 : x); };
    const std::int32_t hq = std::max(p.heads_q, 0), hkv = std::max(p.heads_kv, 0), d = std::max(p.head_dim, 0);
    std::uint32_t seed = in.u8() * 2654435761u + 1;
    const auto next = [&seed] {
      seed = seed * 1664525u + 1013904223u;
      return static_cast<float>(static_cast<std::int32_t>(seed >> 24) - 128) / 64.0f;  // [-2, 2)
    };
    q.resize(nonneg(p.tokens_q()) * hq * d);
    k.resize(nonneg(p.tokens_kv()) * hkv * d);
    v.resize(k.size());
    for (float& x : q) x = next();
    for (float& x : k) x = next();
    for (float& x : v) x = next();
    o_scalar.assign(q.size(), std::numeric_limits<float>::quiet_NaN());
    o_ref = o_scalar;
    lse_scalar.assign(nonneg(p.tokens_q()) * hq, std::numeric_limits<float>::quiet_NaN());
    lse_ref = lse_scalar;

    paged = in.flag();
    if (!paged || !validate(p).ok()) return;
    // Pages: each sequence's own ones in order, a spare or two; sometimes a hostile page table.
    page_size = in.in(1, 5);
    const std::uint8_t hostile = in.u8();
    page_indptr.assign(1, 0);
    for (std::int32_t b = 0; b < p.batch(); ++b) {
      const std::int32_t needed = (p.seq_len_kv(b) + page_size - 1) / page_size;
      for (std::int32_t i = 0; i < needed; ++i) page_indices.push_back(num_pages++);
      page_indptr.push_back(static_cast<std::int32_t>(page_indices.size()));
    }
    num_pages += in.in(0, 2);
    if (hostile >= 160 && !page_indices.empty()) {  // entries anywhere, also out of range and shared
      for (std::int32_t& e : page_indices) e = in.flag(4) ? in.id() : in.in(0, std::max(num_pages - 1, 0));
    }
    if (hostile >= 240) page_indptr.back() -= 1;  // one page short (or a decreasing indptr)
    const std::size_t page_elems = static_cast<std::size_t>(page_size) * hkv * d;
    k_pages.resize(static_cast<std::size_t>(num_pages) * page_elems);
    v_pages.resize(k_pages.size());
    for (float& x : k_pages) x = next();
    for (float& x : v_pages) x = next();
  }

  template <class F>
  void with_kv(const problem& p, F&& f) const {
    if (paged && !page_indptr.empty()) {
      f(paged_kv<float>::packed(k_pages.data(), v_pages.data(), num_pages, page_size, p.heads_kv, p.head_dim,
                                page_indptr, page_indices));
    } else {
      f(contiguous_kv<float>{
          .k = strided_view<const float>::token_major(k.data(), p.tokens_kv(), p.heads_kv, p.head_dim),
          .v = strided_view<const float>::token_major(v.data(), p.tokens_kv(), p.heads_kv, p.head_dim)});
    }
  }
};

// Runs one executor; the workspace is pattern-filled (NaN floats) and exactly as big as asked.
template <class E, class Args>
status run(const E& e, const Args& a) {
  const std::size_t bytes = e.workspace_bytes(a.prob);
  std::vector<std::byte> storage(bytes + workspace_alignment, std::byte{0xff});
  const auto addr = reinterpret_cast<std::uintptr_t>(storage.data());
  const std::size_t skip = (workspace_alignment - addr % workspace_alignment) % workspace_alignment;
  return e.run(a, std::span<std::byte>(storage.data() + skip, bytes));
}

}  // namespace skim::fuzz
