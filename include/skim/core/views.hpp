#pragma once
// Views of Q, K, V and O, and the two ways K/V can be stored: contiguous (packed varlen)
// and paged.
//
// A strided_view addresses element (token, head, d) at data[token*token_stride + head*head_stride + d]:
// the head dimension is always contiguous; token-major [tokens, heads, dim] (the default) and
// head-major [heads, tokens, dim] layouts differ only in the two strides.
//
// A K/V source maps (sequence, token within the sequence, kv head) to a row of head_dim elements.
// Executors read K/V only through a source, and only after the source has checked, in
// validate(), that every row it can be asked for lies inside the caller's buffers.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

#include "skim/core/dtypes.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"

namespace skim {

// Whether K/V rows of head_dim elements at token · token_stride + head · head_stride never overlap,
// for `tokens` tokens a head: token-major (heads inside a token) or head-major (a head's tokens
// inside the head). One head: its stride is never multiplied. The CPU and GPU paged sources check
// their pages with it (tokens = page_size), the GPU's contiguous source with tokens = 1 (the host
// cannot see how many tokens it holds).
[[nodiscard]] constexpr bool kv_rows_apart(std::int64_t token_stride, std::int64_t head_stride, std::int64_t tokens,
                                           std::int32_t head_dim, std::int32_t heads_kv) noexcept {
  const bool token_major = head_stride >= head_dim && token_stride >= head_stride * heads_kv;
  const bool head_major = token_stride >= head_dim && (heads_kv <= 1 || head_stride >= token_stride * tokens);
  return token_major || head_major;
}
// Elements one page of page_size tokens spans, in either layout (the least page stride).
[[nodiscard]] constexpr std::int64_t kv_page_extent(std::int64_t token_stride, std::int64_t head_stride,
                                                    std::int32_t page_size, std::int32_t heads_kv) noexcept {
  const std::int64_t tokens = token_stride * page_size;
  const std::int64_t heads = heads_kv > 1 ? head_stride * heads_kv : 0;
  return tokens > heads ? tokens : heads;
}

template <class T>
struct strided_view {
  T* data = nullptr;
  std::int32_t tokens = 0;
  std::int32_t heads = 0;
  std::int32_t head_dim = 0;
  std::int64_t token_stride = 0;  // elements between consecutive tokens
  std::int64_t head_stride = 0;   // elements between consecutive heads

  [[nodiscard]] SKIM_FORCEINLINE T* row(std::int64_t token, std::int32_t head) const noexcept {
    return data + token * token_stride + head * head_stride;
  }
  // Token-major [tokens, heads, head_dim], densely packed.
  [[nodiscard]] static constexpr strided_view token_major(T* data, std::int32_t tokens, std::int32_t heads,
                                                          std::int32_t head_dim) noexcept {
    return {data, tokens, heads, head_dim, static_cast<std::int64_t>(heads) * head_dim, head_dim};
  }
  // Head-major [heads, tokens, head_dim], densely packed.
  [[nodiscard]] static constexpr strided_view head_major(T* data, std::int32_t tokens, std::int32_t heads,
                                                         std::int32_t head_dim) noexcept {
    return {data, tokens, heads, head_dim, head_dim, static_cast<std::int64_t>(tokens) * head_dim};
  }
  // Byte range [first, last) the view can address (for overlap checks); empty view -> {data, data}.
  [[nodiscard]] std::pair<const std::byte*, const std::byte*> extent() const noexcept {
    const auto* base = reinterpret_cast<const std::byte*>(data);
    if (tokens <= 0 || heads <= 0 || head_dim <= 0) return {base, base};
    const std::int64_t last = (tokens - 1) * token_stride + (heads - 1) * head_stride + head_dim;
    return {base, base + last * static_cast<std::int64_t>(sizeof(T))};
  }
};

// Checks that a view has the expected shape, data where it has elements, non-negative strides and
// element alignment. Inputs may alias themselves (a broadcast K with token_stride 0 is fine);
// check_args() (attention_args.hpp) additionally rejects an *output* whose rows overlap.
template <class T>
[[nodiscard]] status check_view(const strided_view<T>& v, std::int32_t tokens, std::int32_t heads,
                                std::int32_t head_dim, const char* name) noexcept {
  if (v.tokens != tokens || v.heads != heads || v.head_dim != head_dim) {
    return status::error(status_code::shape_mismatch, "%s is [%d, %d, %d], expected [%d, %d, %d]", name,
                         v.tokens, v.heads, v.head_dim, tokens, heads, head_dim);
  }
  if (tokens > 0 && heads > 0 && head_dim > 0 && v.data == nullptr) {
    return status::error(status_code::invalid_argument, "%s data is null", name);
  }
  if (v.token_stride < 0 || v.head_stride < 0) {
    return status::error(status_code::invalid_argument, "%s has negative strides (token %lld, head %lld)",
                         name, static_cast<long long>(v.token_stride), static_cast<long long>(v.head_stride));
  }
  if (reinterpret_cast<std::uintptr_t>(v.data) % alignof(T) != 0) {
    return status::error(status_code::misaligned, "%s data %p is not aligned to %zu bytes", name,
                         static_cast<const void*>(v.data), alignof(T));
  }
  return status::success();
}

// K and V of a packed (varlen) batch: sequence b's keys are tokens [cu_seqlens_kv[b], cu_seqlens_kv[b+1]).
template <element T>
struct contiguous_kv {
  using value_type = T;
  strided_view<const T> k;  // [tokens_kv, heads_kv, head_dim]
  strided_view<const T> v;  // [tokens_kv, heads_kv, head_dim]
  std::span<const std::int32_t> cu_seqlens_kv{};  // the problem's; set by the executor via bind()

  [[nodiscard]] status validate(const problem& p) const noexcept {
    SKIM_TRY(check_view(k, p.tokens_kv(), p.heads_kv, p.head_dim, "K"));
    SKIM_TRY(check_view(v, p.tokens_kv(), p.heads_kv, p.head_dim, "V"));
    return status::success();
  }
  [[nodiscard]] contiguous_kv bind(const problem& p) const noexcept {
    contiguous_kv c = *this;
    c.cu_seqlens_kv = p.cu_seqlens_kv;
    return c;
  }
  // @pre validate() succeeded, 0 <= t < seq_len_kv(b), 0 <= h < heads_kv.
  [[nodiscard]] SKIM_FORCEINLINE const T* k_row(std::int32_t b, std::int32_t t, std::int32_t h) const noexcept {
    return k.row(static_cast<std::int64_t>(cu_seqlens_kv[b]) + t, h);
  }
  [[nodiscard]] SKIM_FORCEINLINE const T* v_row(std::int32_t b, std::int32_t t, std::int32_t h) const noexcept {
    return v.row(static_cast<std::int64_t>(cu_seqlens_kv[b]) + t, h);
  }
};

// Paged K/V: pages of page_size tokens, token-major [pages, page_size, heads_kv, head_dim] or
// head-major [pages, heads_kv, page_size, head_dim] (FlashInfer's NHD and HND), each for K and V,
// and a per-sequence page table in CSR form (FlashInfer's layout): sequence b's logical token t lives
// in physical page page_indices[page_indptr[b] + t / page_size], slot t % page_size.
// Pages may be shared between sequences (a common prefix); a page table entry must be in [0, num_pages).
template <element T>
struct paged_kv {
  using value_type = T;
  const T* k_pages = nullptr;
  const T* v_pages = nullptr;
  std::int32_t num_pages = 0;
  std::int32_t page_size = 0;   // tokens per page
  std::int64_t page_stride = 0;   // elements between pages (>= a page's extent)
  std::int64_t token_stride = 0;  // elements between tokens of a page
  std::int64_t head_stride = 0;   // elements between heads (rows of head_dim elements never overlap)
  std::span<const std::int32_t> page_indptr{};   // [batch + 1]
  std::span<const std::int32_t> page_indices{};  // [page_indptr[batch]]

  // Dense [pages, page_size, heads_kv, head_dim] layout.
  [[nodiscard]] static constexpr paged_kv packed(const T* k, const T* v, std::int32_t num_pages,
                                                 std::int32_t page_size, std::int32_t heads_kv,
                                                 std::int32_t head_dim, std::span<const std::int32_t> indptr,
                                                 std::span<const std::int32_t> indices) noexcept {
    const std::int64_t hs = head_dim;
    const std::int64_t ts = hs * heads_kv;
    return {k, v, num_pages, page_size, ts * page_size, ts, hs, indptr, indices};
  }
  // Dense [pages, heads_kv, page_size, head_dim] layout.
  [[nodiscard]] static constexpr paged_kv packed_head_major(const T* k, const T* v, std::int32_t num_pages,
                                                            std::int32_t page_size, std::int32_t heads_kv,
                                                            std::int32_t head_dim, std::span<const std::int32_t> indptr,
                                                            std::span<const std::int32_t> indices) noexcept {
    const std::int64_t ts = head_dim;
    const std::int64_t hs = ts * page_size;
    return {k, v, num_pages, page_size, hs * heads_kv, ts, hs, indptr, indices};
  }

  [[nodiscard]] status validate(const problem& p) const noexcept {
    if (page_size <= 0) return status::error(status_code::invalid_argument, "page_size %d <= 0", page_size);
    if (num_pages < 0) return status::error(status_code::invalid_argument, "num_pages %d < 0", num_pages);
    if (!kv_rows_apart(token_stride, head_stride, page_size, p.head_dim, p.heads_kv) ||
        page_stride < kv_page_extent(token_stride, head_stride, page_size, p.heads_kv)) {
      return status::error(status_code::invalid_argument,
                           "paged K/V strides (page %lld, token %lld, head %lld) overlap rows of head_dim %d, "
                           "heads_kv %d, page_size %d",
                           static_cast<long long>(page_stride), static_cast<long long>(token_stride),
                           static_cast<long long>(head_stride), p.head_dim, p.heads_kv, page_size);
    }
    if (num_pages > 0 && (k_pages == nullptr || v_pages == nullptr)) {
      return status::error(status_code::invalid_argument, "paged K/V pages are null with num_pages %d", num_pages);
    }
    if (page_indptr.size() != static_cast<std::size_t>(p.batch()) + 1) {
      return status::error(status_code::shape_mismatch, "page_indptr has %zu entries, expected batch + 1 = %d",
                           page_indptr.size(), p.batch() + 1);
    }
    if (page_indptr[0] != 0) return status::error(status_code::invalid_argument, "page_indptr[0] = %d, must be 0", page_indptr[0]);
    for (std::int32_t b = 0; b < p.batch(); ++b) {
      const std::int32_t first = page_indptr[b], last = page_indptr[b + 1];
      if (last < first) {
        return status::error(status_code::invalid_argument, "page_indptr[%d] = %d < page_indptr[%d] = %d", b + 1,
                             last, b, first);
      }
      if (static_cast<std::size_t>(last) > page_indices.size()) {
        return status::error(status_code::shape_mismatch, "page_indptr[%d] = %d > page_indices size %zu", b + 1,
                             last, page_indices.size());
      }
      const std::int64_t needed = (static_cast<std::int64_t>(p.seq_len_kv(b)) + page_size - 1) / page_size;
      if (last - first < needed) {
        return status::error(status_code::shape_mismatch, "sequence %d has %d pages, needs %lld for %d keys",
                             b, last - first, static_cast<long long>(needed), p.seq_len_kv(b));
      }
      for (std::int32_t i = first; i < first + needed; ++i) {
        if (page_indices[i] < 0 || page_indices[i] >= num_pages) {
          return status::error(status_code::invalid_index, "page_indices[%d] = %d out of [0, %d) for sequence %d",
                               i, page_indices[i], num_pages, b);
        }
      }
    }
    return status::success();
  }
  [[nodiscard]] paged_kv bind(const problem&) const noexcept { return *this; }

  // @pre validate() succeeded, 0 <= t < seq_len_kv(b), 0 <= h < heads_kv.
  [[nodiscard]] SKIM_FORCEINLINE std::int64_t offset(std::int32_t b, std::int32_t t, std::int32_t h) const noexcept {
    const std::int32_t page = page_indices[page_indptr[b] + t / page_size];
    return page * page_stride + (t % page_size) * token_stride + h * head_stride;
  }
  [[nodiscard]] SKIM_FORCEINLINE const T* k_row(std::int32_t b, std::int32_t t, std::int32_t h) const noexcept {
    return k_pages + offset(b, t, h);
  }
  [[nodiscard]] SKIM_FORCEINLINE const T* v_row(std::int32_t b, std::int32_t t, std::int32_t h) const noexcept {
    return v_pages + offset(b, t, h);
  }
};

// A K/V source: validated against a problem, then read row by row. Quantised sources (int8 rows
// with scales, core/quantized.hpp) declare `static constexpr bool quantized = true`.
template <class S>
concept kv_source = (element<typename S::value_type> || requires { requires S::quantized; }) && requires(const S& s, const problem& p) {
  { s.validate(p) } -> std::same_as<status>;
  { s.bind(p) } -> std::same_as<S>;
  { s.k_row(0, 0, 0) } -> std::same_as<const typename S::value_type*>;
  { s.v_row(0, 0, 0) } -> std::same_as<const typename S::value_type*>;
};

static_assert(kv_source<contiguous_kv<float>>);
static_assert(kv_source<paged_kv<half>>);

}  // namespace skim
