#pragma once
// skim_llama's quantised K/V cache: int8 or fp8 e4m3 codes with one float scale per (block of
// block_kv keys, kv head), the layout skim::quantized_kv reads (core/quantized.hpp).
//
// Codes and scales. Per layer, K and V codes [max_tokens, kv_heads, head_dim] (token-major, as
// forward.hpp's float cache) and scales [max_blocks, kv_heads]: the value of element e of key t is
// scale(t / block_kv, head) · to_float(code[t, head, e]). A block's scale is absmax / code_max over
// its keys' elements of that head (code_max: 127 for int8, 448 for fp8 e4m3); a block of zeros takes
// scale 1 and zero codes. int8 codes round to nearest (ties to even) and are clamped to ±127; fp8
// codes are fp8_e4m3::from_float (nearest, ties to even, saturating at ±448).
//
// Round trip (quantize_block): |x − scale · to_float(code)| ≤
//   int8: scale / 2 + absmax · 2^-22
//   fp8:  max(|x| · 2^-4, scale · 2^-10) + absmax · 2^-22
// (half a step of the code, plus the float rounding of x / scale and of the product).
//
// The open block. Keys arrive in order: a prefill stores many at once, a decode step one. A block
// whose block_kv keys are all stored is *closed*: its codes and scale are written once, from its
// keys, and never change again. The last block of a sequence may be *open* (fewer keys so far):
// its keys are also kept in full precision (at most block_kv rows per layer and kv head, K and V),
// and each append re-quantises the whole open block from them, scale included. So the codes of a
// block, once closed, are exactly those of quantising its block_kv keys at once, whichever way they
// arrived; while open, its codes may change with every key. append() allocates nothing.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "skim/core/dtypes.hpp"
#include "skim/core/quantized.hpp"
#include "skim/core/status.hpp"
#include "skim/core/views.hpp"

namespace skim_llama {

// What the engine's K/V cache stores (engine_options::kv, the spec's kv= key).
enum class kv_format : std::uint8_t { fp32, int8, fp8 };

[[nodiscard]] constexpr const char* kv_format_name(kv_format f) noexcept {
  return f == kv_format::int8 ? "int8" : f == kv_format::fp8 ? "fp8" : "fp32";
}

// The largest code magnitude: a block's absmax maps to it.
template <skim::quantized_code Code>
inline constexpr float code_max = std::is_same_v<Code, std::int8_t> ? 127.0f : 448.0f;

template <skim::quantized_code Code>
[[nodiscard]] inline float code_value(Code c) noexcept {
  if constexpr (std::is_same_v<Code, std::int8_t>) {
    return static_cast<float>(c);
  } else {
    return c.to_float();
  }
}

template <skim::quantized_code Code>
[[nodiscard]] inline Code encode(float y) noexcept {
  if constexpr (std::is_same_v<Code, std::int8_t>) {
    const float r = std::nearbyint(y);  // the default rounding mode: nearest, ties to even
    return static_cast<std::int8_t>(std::clamp(r, -127.0f, 127.0f));
  } else {
    return skim::fp8_e4m3::from_float(y);
  }
}

// Quantises `rows` rows of head_dim floats (row r at x + r · x_stride) into codes (row r at
// out + r · out_stride) under one scale, which it returns: absmax / code_max, or 1 for a block of
// zeros. Non-finite inputs are the caller's to avoid (a NaN or infinity makes the scale one too).
template <skim::quantized_code Code>
[[nodiscard]] inline float quantize_block(const float* x, std::size_t x_stride, std::int32_t rows, std::int32_t head_dim,
                                          Code* out, std::size_t out_stride) noexcept {
  float absmax = 0.0f;
  for (std::int32_t r = 0; r < rows; ++r) {
    const float* row = x + static_cast<std::size_t>(r) * x_stride;
    for (std::int32_t e = 0; e < head_dim; ++e) absmax = std::max(absmax, std::fabs(row[e]));
  }
  const float scale = absmax > 0.0f ? absmax / code_max<Code> : 1.0f;
  for (std::int32_t r = 0; r < rows; ++r) {
    const float* row = x + static_cast<std::size_t>(r) * x_stride;
    Code* o = out + static_cast<std::size_t>(r) * out_stride;
    for (std::int32_t e = 0; e < head_dim; ++e) o[e] = encode<Code>(row[e] / scale);
  }
  return scale;
}

// The codes of `layers` layers of up to max_tokens keys each, with their scales and open blocks.
// All storage is allocated here, once. @pre every argument > 0.
template <skim::quantized_code Code>
class quantized_cache {
 public:
  quantized_cache(std::int32_t layers, std::int32_t max_tokens, std::int32_t kv_heads, std::int32_t head_dim,
                  std::int32_t block_kv)
      : layers_(layers), max_tokens_(max_tokens), kv_heads_(kv_heads), head_dim_(head_dim), block_kv_(block_kv),
        max_blocks_((max_tokens + block_kv - 1) / block_kv),
        k_(static_cast<std::size_t>(layers) * max_tokens * row()), v_(k_.size()),
        k_scales_(static_cast<std::size_t>(layers) * max_blocks_ * kv_heads, 1.0f), v_scales_(k_scales_.size(), 1.0f),
        open_k_(static_cast<std::size_t>(layers) * block_kv * row()), open_v_(open_k_.size()),
        stored_(static_cast<std::size_t>(layers), 0) {}

  [[nodiscard]] std::int32_t block_kv() const noexcept { return block_kv_; }
  [[nodiscard]] std::int32_t kv_heads() const noexcept { return kv_heads_; }
  [[nodiscard]] std::int32_t head_dim() const noexcept { return head_dim_; }
  [[nodiscard]] std::int32_t max_tokens() const noexcept { return max_tokens_; }
  // Keys of `layer` stored so far.
  [[nodiscard]] std::int32_t stored(std::int32_t layer) const noexcept { return stored_[static_cast<std::size_t>(layer)]; }

  // Stores the K and V rows of keys [first, first + n) of `layer` (k, v: [n, kv_heads, head_dim]);
  // keys from first + n on are dropped (stored(layer) becomes first + n). first may be
  //   - stored(layer): the next key (a decode step, or the rest of a prefill);
  //   - a block boundary at or below it (0: a new sequence): the keys from first on are rewritten;
  //   - a key of the open block (the block of stored(layer)), whose full-precision keys are kept.
  // A first inside a closed block is refused (its full-precision keys are gone), as are a layer out
  // of range, K and V of different sizes or not whole rows, and keys past max_tokens: a status
  // naming the values, the cache unchanged. Blocks the call closes are quantised once, from all
  // their keys; the open block, if any, is re-quantised from its full-precision keys.
  [[nodiscard]] skim::status append(std::int32_t layer, std::int32_t first, std::span<const float> k,
                                    std::span<const float> v) noexcept {
    const std::size_t rw = row();
    if (layer < 0 || layer >= layers_) {
      return skim::status::error(skim::status_code::invalid_argument, "layer %d outside [0, %d)", layer, layers_);
    }
    if (k.size() != v.size() || k.size() % rw != 0) {
      return skim::status::error(skim::status_code::shape_mismatch, "K has %zu floats, V %zu: need the same multiple of %zu",
                                 k.size(), v.size(), rw);
    }
    const std::size_t n = k.size() / rw;
    const std::int32_t had = stored(layer);
    if (first < 0 || first > had || (first % block_kv_ != 0 && first / block_kv_ != had / block_kv_)) {
      return skim::status::error(skim::status_code::invalid_argument,
                                 "layer %d: keys from %d cannot be stored after %d (the next key, a block boundary below it "
                                 "or a key of the open block)", layer, first, had);
    }
    if (n > static_cast<std::size_t>(max_tokens_ - first)) {  // first <= had <= max_tokens_
      return skim::status::error(skim::status_code::invalid_argument, "layer %d holds %d of %d keys, %zu more from %d do not fit",
                                 layer, had, max_tokens_, n, first);
    }
    const std::int32_t end = first + static_cast<std::int32_t>(n);
    for (std::int32_t t = first; t < end;) {
      const std::int32_t b = t / block_kv_, b0 = b * block_kv_, b1 = std::min(b0 + block_kv_, end);
      const float* src_k = k.data() + static_cast<std::size_t>(t - first) * rw;
      const float* src_v = v.data() + static_cast<std::size_t>(t - first) * rw;
      if (t == b0 && b1 == b0 + block_kv_) {
        quantize(layer, b, src_k, src_v, block_kv_);  // a whole block in this call: closed at once
      } else {
        // The open block, or one this call closes whose first keys came earlier: its keys so far
        // are in the full-precision rows; add this call's and quantise the block from all of them.
        float* ok = open_k(layer), *ov = open_v(layer);
        std::copy_n(src_k, static_cast<std::size_t>(b1 - t) * rw, ok + static_cast<std::size_t>(t - b0) * rw);
        std::copy_n(src_v, static_cast<std::size_t>(b1 - t) * rw, ov + static_cast<std::size_t>(t - b0) * rw);
        quantize(layer, b, ok, ov, b1 - b0);
      }
      t = b1;
    }
    stored_[static_cast<std::size_t>(layer)] = end;
    return skim::status::success();
  }

  // The quantised source of `layer`'s first n_kv keys for a problem of one sequence of n_kv keys
  // with block_kv() keys per block: codes and exactly blocks(n_kv) · kv_heads scales each.
  // @pre n_kv <= stored(layer).
  [[nodiscard]] skim::quantized_kv<Code> view(std::int32_t layer, std::int32_t n_kv) const noexcept {
    const auto scales = static_cast<std::size_t>((n_kv + block_kv_ - 1) / block_kv_) * kv_heads_;
    return {.k = skim::strided_view<const Code>::token_major(k_at(layer, 0), n_kv, kv_heads_, head_dim_),
            .v = skim::strided_view<const Code>::token_major(v_at(layer, 0), n_kv, kv_heads_, head_dim_),
            .k_scales = std::span<const float>(k_scales_).subspan(scale_offset(layer, 0, 0), scales),
            .v_scales = std::span<const float>(v_scales_).subspan(scale_offset(layer, 0, 0), scales)};
  }

  // Dequantised K (and V, unless v_out is null) of keys [first, last) of `layer`, as the executors
  // read them (scale · to_float(code), rounded to float), into [last - first, kv_heads, head_dim].
  // @pre 0 <= first <= last <= stored(layer).
  void dequantize(std::int32_t layer, std::int32_t first, std::int32_t last, float* k_out, float* v_out) const noexcept {
    for (std::int32_t t = first; t < last; ++t) {
      const Code* k = k_at(layer, t);
      const Code* v = v_at(layer, t);
      const std::size_t to = static_cast<std::size_t>(t - first) * row();
      for (std::int32_t h = 0; h < kv_heads_; ++h) {
        const float ks = k_scale(layer, t / block_kv_, h), vs = v_scale(layer, t / block_kv_, h);
        for (std::size_t e = static_cast<std::size_t>(h) * head_dim_, end = e + head_dim_; e < end; ++e) {
          k_out[to + e] = ks * code_value(k[e]);
          if (v_out != nullptr) v_out[to + e] = vs * code_value(v[e]);
        }
      }
    }
  }

  // Key t's codes of every kv head, [kv_heads, head_dim]; its block's scales.
  [[nodiscard]] const Code* k_at(std::int32_t layer, std::int32_t t) const noexcept {
    return k_.data() + (static_cast<std::size_t>(layer) * max_tokens_ + t) * row();
  }
  [[nodiscard]] const Code* v_at(std::int32_t layer, std::int32_t t) const noexcept {
    return v_.data() + (static_cast<std::size_t>(layer) * max_tokens_ + t) * row();
  }
  [[nodiscard]] float k_scale(std::int32_t layer, std::int32_t block, std::int32_t h) const noexcept {
    return k_scales_[scale_offset(layer, block, h)];
  }
  [[nodiscard]] float v_scale(std::int32_t layer, std::int32_t block, std::int32_t h) const noexcept {
    return v_scales_[scale_offset(layer, block, h)];
  }

 private:
  [[nodiscard]] std::size_t row() const noexcept { return static_cast<std::size_t>(kv_heads_) * head_dim_; }
  [[nodiscard]] std::size_t scale_offset(std::int32_t layer, std::int32_t block, std::int32_t h) const noexcept {
    return (static_cast<std::size_t>(layer) * max_blocks_ + block) * kv_heads_ + h;
  }
  float* open_k(std::int32_t layer) noexcept { return open_k_.data() + static_cast<std::size_t>(layer) * block_kv_ * row(); }
  float* open_v(std::int32_t layer) noexcept { return open_v_.data() + static_cast<std::size_t>(layer) * block_kv_ * row(); }

  // Block b of `layer` from its first `rows` keys (K at k, V at v, rows of kv_heads · head_dim).
  void quantize(std::int32_t layer, std::int32_t b, const float* k, const float* v, std::int32_t rows) noexcept {
    const std::size_t rw = row();
    const std::size_t base = (static_cast<std::size_t>(layer) * max_tokens_ + static_cast<std::size_t>(b) * block_kv_) * rw;
    for (std::int32_t h = 0; h < kv_heads_; ++h) {
      const std::size_t off = static_cast<std::size_t>(h) * head_dim_;
      k_scales_[scale_offset(layer, b, h)] = quantize_block<Code>(k + off, rw, rows, head_dim_, k_.data() + base + off, rw);
      v_scales_[scale_offset(layer, b, h)] = quantize_block<Code>(v + off, rw, rows, head_dim_, v_.data() + base + off, rw);
    }
  }

  std::int32_t layers_, max_tokens_, kv_heads_, head_dim_, block_kv_, max_blocks_;
  std::vector<Code> k_, v_;                 // [layers, max_tokens, kv_heads, head_dim]
  std::vector<float> k_scales_, v_scales_;  // [layers, max_blocks, kv_heads]
  std::vector<float> open_k_, open_v_;      // [layers, block_kv, kv_heads, head_dim]: the open block's keys
  std::vector<std::int32_t> stored_;        // [layers]
};

}  // namespace skim_llama
