#pragma once
// Test support for skim's CUDA policies: device buffers, a random_case (tests/support/) mirrored on
// the device, so every kernel is compared with exec::reference on the same inputs, and the decode
// tests' copy of a kernel's O and lse with its row-by-row check against the reference's.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <skim/cuda.cuh>

#include "support/random_case.hpp"
#include "support/seed.hpp"

namespace skim::test::cuda {

#define SKIM_CUDA_REQUIRE(expr)                                                    \
  do {                                                                             \
    const cudaError_t skim_e_ = (expr);                                            \
    REQUIRE_MESSAGE(skim_e_ == cudaSuccess, #expr ": ", cudaGetErrorString(skim_e_)); \
  } while (0)

// Device memory of n elements of T, freed on destruction. Poisoned (0xff bytes: NaN for float
// and 16-bit floats) on allocation so an element a kernel forgets to write fails the comparison.
template <class T>
class buffer {
 public:
  buffer() = default;
  explicit buffer(std::size_t n) : n_(n) {
    if (n_ > 0) {
      SKIM_CUDA_REQUIRE(cudaMalloc(&p_, n_ * sizeof(T)));
      poison();
    }
  }
  explicit buffer(const std::vector<T>& host) : buffer(host.size()) { upload(host); }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
  buffer(buffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }
  buffer& operator=(buffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~buffer() {
    if (p_ != nullptr) cudaFree(p_);
  }

  void upload(const std::vector<T>& host) {
    REQUIRE(host.size() == n_);
    if (n_ > 0) SKIM_CUDA_REQUIRE(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  [[nodiscard]] std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_ > 0) SKIM_CUDA_REQUIRE(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  void poison() {
    if (n_ > 0) SKIM_CUDA_REQUIRE(cudaMemset(p_, 0xff, n_ * sizeof(T)));
  }
  [[nodiscard]] T* data() const noexcept { return p_; }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  // The first `bytes` bytes as a workspace span (at most the buffer's size).
  [[nodiscard]] std::span<std::byte> bytes(std::size_t bytes) const noexcept {
    return {reinterpret_cast<std::byte*>(p_), std::min(bytes, n_ * sizeof(T))};
  }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

// Whether the current device is sm_90 (H100, H200), where prefill's wgmma kernel applies.
inline bool is_sm90() {
  skim::cuda::device_facts d;
  return skim::cuda::current_device(d, "is_sm90").ok() && d.major == 9 && d.minor == 0;
}

// A random_case's inputs on the device: cu_seqlens, Q, K/V (contiguous and paged), an error word.
// K/V are stored as spec.kv_head_major says (the host case keeps them token-major).
template <class TQ, class TKV>
struct device_case {
  buffer<std::int32_t> cu_q, cu_kv, page_indptr, page_indices;
  buffer<TQ> q;
  buffer<TKV> k, v, k_pages, v_pages;
  buffer<std::uint32_t> error;
  std::int32_t max_q = 0, max_kv = 0;

  explicit device_case(const random_case<TQ, TKV>& c)
      : cu_q(c.cu_q), cu_kv(c.cu_kv), page_indptr(c.page_indptr), page_indices(c.page_indices), q(c.q),
        k(stored(c, c.k, false)), v(stored(c, c.v, false)), k_pages(stored(c, c.k_pages, true)),
        v_pages(stored(c, c.v_pages, true)), error(1) {
    SKIM_CUDA_REQUIRE(cudaMemset(error.data(), 0, sizeof(std::uint32_t)));
    for (const auto& l : c.spec.seqs) {
      max_q = std::max(max_q, l.q);
      max_kv = std::max(max_kv, l.kv);
    }
  }

  [[nodiscard]] skim::cuda::device_problem prob(const case_spec& s) const {
    return {.batch = static_cast<std::int32_t>(s.seqs.size()), .heads_q = s.heads_q, .heads_kv = s.heads_kv,
            .head_dim = s.head_dim, .block_q = s.block_q, .block_kv = s.block_kv, .mask = s.mask,
            .softmax_scale = s.softmax_scale, .scope = s.scope, .cu_seqlens_q = cu_q.data(),
            .cu_seqlens_kv = cu_kv.data(), .max_seqlen_q = max_q, .max_seqlen_kv = max_kv, .error = error.data()};
  }
  [[nodiscard]] skim::cuda::device_contiguous_kv<TKV> contiguous(const case_spec& s) const {
    const std::int64_t d = s.head_dim;
    if (s.kv_head_major) {  // at least one token's room a head, so that the strides stay ordered
      const std::int64_t tokens = std::max<std::int64_t>(1, static_cast<std::int64_t>(k.size()) / (d * s.heads_kv));
      return {.k = k.data(), .v = v.data(), .token_stride = d, .head_stride = d * tokens};
    }
    return {.k = k.data(), .v = v.data(), .token_stride = d * s.heads_kv, .head_stride = d};
  }
  [[nodiscard]] skim::cuda::device_paged_kv<TKV> paged(const random_case<TQ, TKV>& c) const {
    const std::int64_t d = c.spec.head_dim;
    const std::int64_t page = d * c.spec.heads_kv * c.spec.page_size;
    const bool hm = c.spec.kv_head_major;
    return {.k_pages = k_pages.data(), .v_pages = v_pages.data(), .num_pages = c.num_pages,
            .page_size = c.spec.page_size, .page_stride = page, .token_stride = hm ? d : d * c.spec.heads_kv,
            .head_stride = hm ? d * c.spec.page_size : d, .page_indptr = page_indptr.data(),
            .page_indices = page_indices.data()};
  }
  // K/V values (contiguous, or pages) in the layout the device holds.
  [[nodiscard]] static std::vector<TKV> stored(const random_case<TQ, TKV>& c, const std::vector<TKV>& x, bool pages) {
    if (!c.spec.kv_head_major) return x;
    const std::int64_t d = c.spec.head_dim, h = c.spec.heads_kv;
    const std::int64_t tokens = pages ? c.spec.page_size : static_cast<std::int64_t>(x.size()) / (d * h);
    const std::int64_t groups = pages ? c.num_pages : 1;
    return heads_outside(x, groups, tokens, h, d);
  }
  // The device error word (then cleared).
  [[nodiscard]] std::uint32_t error_bits() {
    std::uint32_t bits = 0;
    SKIM_CUDA_REQUIRE(cudaMemcpy(&bits, error.data(), sizeof bits, cudaMemcpyDeviceToHost));
    SKIM_CUDA_REQUIRE(cudaMemset(error.data(), 0, sizeof bits));
    return bits;
  }
};

// A kernel's O (token-major [tokens_q, heads_q, head_dim]) and lse, copied back, and the device
// error word of the run.
template <class TO>
struct gpu_output {
  std::vector<TO> o;
  std::vector<float> lse;
  std::uint32_t error = 0;

  // The first `rows` (token, head) rows of O and lse (the buffers may hold more: one row at least).
  [[nodiscard]] static gpu_output fetch(const buffer<TO>& o, const buffer<float>& lse, std::size_t rows,
                                        std::int32_t head_dim, std::uint32_t error) {
    gpu_output out{o.download(), lse.download(), error};
    out.o.resize(rows * static_cast<std::size_t>(head_dim));
    out.lse.resize(rows);
    return out;
  }
};

// Checks g against the reference's fp32 O and lse, per (token, head): a row the reference leaves
// empty (lse -inf) must be exactly o = 0, lse = -inf; otherwise the relative L2 error of o, over
// max(|o_ref|, 0.05·sqrt(head_dim)), must be <= tol and |Δlse| <= tol_lse · max(1, |lse_ref|).
// NaN (an element a kernel did not write) fails. Reports the first failing row.
template <class TO>
void check_against(const case_spec& s, const gpu_output<TO>& g, const output<float>& ref, std::int32_t tokens_q,
                   double tol, double tol_lse = 1e-3) {
  const std::int32_t d = s.head_dim;
  const double floor = 0.05 * std::sqrt(static_cast<double>(d));
  std::int64_t failures = 0, empty = 0;
  double max_rel = 0.0, max_dlse = 0.0;
  std::string first;
  for (std::int32_t t = 0; t < tokens_q; ++t) {
    for (std::int32_t h = 0; h < s.heads_q; ++h) {
      const std::size_t row = static_cast<std::size_t>(t) * s.heads_q + h;
      const float rl = ref.lse[row], gl = g.lse[row];
      double err = 0.0, norm = 0.0;
      bool zero = true;
      for (std::int32_t e = 0; e < d; ++e) {
        const double x = to_float(g.o[row * d + e]), y = ref.o[row * d + e];
        err += (x - y) * (x - y);
        norm += y * y;
        zero = zero && x == 0.0;
      }
      std::string what;
      if (rl == -INFINITY) {
        ++empty;
        if (!zero) what = "row with no visible key has non-zero (or NaN) o";
        else if (!(gl == -INFINITY)) what = "row with no visible key has lse " + std::to_string(gl);
      } else {
        const double rel = std::sqrt(err) / std::max(std::sqrt(norm), floor);
        const double dl = std::abs(static_cast<double>(gl) - rl);
        max_rel = std::max(max_rel, std::isnan(rel) ? INFINITY : rel);
        max_dlse = std::max(max_dlse, std::isnan(dl) ? INFINITY : dl);
        if (!(rel <= tol)) what = "relative error of o " + std::to_string(rel);
        else if (!(dl <= tol_lse * std::max(1.0, std::abs(static_cast<double>(rl)))))
          what = "lse " + std::to_string(gl) + " vs reference " + std::to_string(rl);
      }
      if (!what.empty() && failures++ == 0) first = "token " + std::to_string(t) + " head " + std::to_string(h) + ": " + what;
    }
  }
  INFO("rows " << tokens_q * s.heads_q << ", tolerance " << tol << ", empty " << empty << ", max rel o " << max_rel
               << ", max |dlse| " << max_dlse << ", failures " << failures << ", first: " << first);
  CHECK(failures == 0);
}

}  // namespace skim::test::cuda
