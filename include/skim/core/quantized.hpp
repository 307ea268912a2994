#pragma once
// Quantised K/V: codes of type Code (std::int8_t, or skim::fp8_e4m3) with a float scale per
// (key block, kv head), as quantised KV caches store them: the value of element e of key t is
// scale(block of t, head) · to_float(code[t, head, e]), to_float of an int8 code being its integer.
//
//   skim::int8_kv kv{.k = k_view, .v = v_view, .k_scales = ks, .v_scales = vs};   // or skim::fp8_kv
//   // k_view, v_view: strided_view<const Code> [tokens_kv, heads_kv, head_dim]
//   // ks, vs: [total_kv_blocks, heads_kv] floats, key blocks numbered batch-wide as
//   //         problem::kv_block_offset(b) + t / block_kv (the numbering of summaries)
//
// int8_kv = quantized_kv<std::int8_t> and fp8_kv = quantized_kv<fp8_e4m3> share one layout, one
// validation and one scale numbering; only the code differs. fp8 codes are E4M3FN
// (core/dtypes.hpp): a NaN code (0x7f, 0xff) is a NaN value, whatever its scale.
//
// A quantised source is a kv_source whose value_type is its Code and which says
// `static constexpr bool quantized = true`; executors then read k_scale()/v_scale() with each row.
// Executors that do not know about quantisation (exec::scalar, exec::reference) fail to compile on
// it (skim::to_float takes elements only, and neither code is one) rather than ignore the scales;
// exec::simd supports both codes. To check an executor against the reference, give the reference
// the dequantised values as fp32 (scale · to_float(code) rounded to float, the product simd forms
// too): tests/exec/cpu/simd_test.cpp does.

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "skim/config.hpp"
#include "skim/core/dtypes.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"
#include "skim/core/views.hpp"

namespace skim {

// Whether a K/V source stores quantised rows with scales.
template <class S>
inline constexpr bool is_quantized_kv = requires { requires S::quantized; };

// The codes a quantised source may hold.
template <class T>
concept quantized_code = std::is_same_v<T, std::int8_t> || std::is_same_v<T, fp8_e4m3>;

template <quantized_code Code>
struct quantized_kv {
  using value_type = Code;
  static constexpr bool quantized = true;

  strided_view<const Code> k;         // [tokens_kv, heads_kv, head_dim]
  strided_view<const Code> v;         // [tokens_kv, heads_kv, head_dim]
  std::span<const float> k_scales{};  // [total_kv_blocks, heads_kv]
  std::span<const float> v_scales{};  // [total_kv_blocks, heads_kv]
  // Set by bind() from the problem.
  std::span<const std::int32_t> cu_seqlens_kv{};
  std::int32_t block_kv = 0;
  std::int32_t heads_kv = 0;

  [[nodiscard]] status validate(const problem& p) const noexcept {
    SKIM_TRY(check_view(k, p.tokens_kv(), p.heads_kv, p.head_dim, "K"));
    SKIM_TRY(check_view(v, p.tokens_kv(), p.heads_kv, p.head_dim, "V"));
    const std::int64_t n = p.total_kv_blocks() * p.heads_kv;
    for (auto [s, name] : {std::pair{k_scales, "k_scales"}, std::pair{v_scales, "v_scales"}}) {
      if (static_cast<std::int64_t>(s.size()) != n) {
        return status::error(status_code::shape_mismatch, "%s has %zu entries, expected total_kv_blocks * heads_kv = %lld",
                             name, s.size(), static_cast<long long>(n));
      }
    }
    return status::success();
  }
  [[nodiscard]] quantized_kv bind(const problem& p) const noexcept {
    quantized_kv c = *this;
    c.cu_seqlens_kv = p.cu_seqlens_kv;
    c.block_kv = p.block_kv;
    c.heads_kv = p.heads_kv;
    return c;
  }
  // @pre validate() succeeded and the source is bound; 0 <= t < seq_len_kv(b), 0 <= h < heads_kv.
  [[nodiscard]] SKIM_FORCEINLINE const Code* k_row(std::int32_t b, std::int32_t t, std::int32_t h) const noexcept {
    return k.row(static_cast<std::int64_t>(cu_seqlens_kv[b]) + t, h);
  }
  [[nodiscard]] SKIM_FORCEINLINE const Code* v_row(std::int32_t b, std::int32_t t, std::int32_t h) const noexcept {
    return v.row(static_cast<std::int64_t>(cu_seqlens_kv[b]) + t, h);
  }
  // Scale of key t's block (O(b): executors ask once per tile).
  [[nodiscard]] float k_scale(std::int32_t b, std::int32_t t, std::int32_t h) const noexcept {
    return k_scales[scale_index(b, t, h)];
  }
  [[nodiscard]] float v_scale(std::int32_t b, std::int32_t t, std::int32_t h) const noexcept {
    return v_scales[scale_index(b, t, h)];
  }

 private:
  [[nodiscard]] std::size_t scale_index(std::int32_t b, std::int32_t t, std::int32_t h) const noexcept {
    std::int64_t block = t / block_kv;
    for (std::int32_t s = 0; s < b; ++s) block += (cu_seqlens_kv[s + 1] - cu_seqlens_kv[s] + block_kv - 1) / block_kv;
    return static_cast<std::size_t>(block * heads_kv + h);
  }
};

using int8_kv = quantized_kv<std::int8_t>;
using fp8_kv = quantized_kv<fp8_e4m3>;

static_assert(kv_source<int8_kv> && kv_source<fp8_kv>);
static_assert(is_quantized_kv<int8_kv> && is_quantized_kv<fp8_kv>);

}  // namespace skim
