#pragma once
// Quantised K/V for tests: random 8-bit codes (std::int8_t, skim::fp8_e4m3) in a random_case's
// layouts, with scales per (sequence, block, kv head) or per kv head, and the dequantised fp32 K/V
// (fp32(scale · value), one rounding) that the reference and the CPU summarizers read.
#include <algorithm>
#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

#include "skim/core/dtypes.hpp"
#include "support/random_case.hpp"

namespace skim::test {

[[nodiscard]] inline float code_value(std::int8_t c) { return static_cast<float>(c); }
[[nodiscard]] inline float code_value(skim::fp8_e4m3 c) { return c.to_float(); }

// A random code: int8 over its whole range; e4m3 mostly a rounded N(0, 16²), sometimes any finite
// code (subnormals and ±448 included).
template <class Code>
[[nodiscard]] Code random_code(std::mt19937& rng) {
  if constexpr (std::is_same_v<Code, std::int8_t>) {
    return static_cast<std::int8_t>(uniform(rng, -128, 127));
  } else {
    if (chance(rng, 0.1)) {
      std::int32_t b = 0x7f;
      while ((b & 0x7f) == 0x7f) b = uniform(rng, 0, 255);
      return skim::fp8_e4m3::from_bits(static_cast<std::uint8_t>(b));
    }
    return skim::fp8_e4m3::from_float(16.0f * std::normal_distribution<float>(0.0f, 1.0f)(rng));
  }
}

// Codes in c's layouts (contiguous and pages, the pages holding the same codes for the sequences'
// keys and random codes elsewhere), scales, and the dequantised fp32 K/V the reference reads.
template <class Code>
struct quantized_host {
  std::vector<Code> k, v, k_pages, v_pages;
  std::vector<float> k_scales, v_scales;
  std::int64_t seq_stride = 0, block_stride = 0, head_stride = 1;
  std::vector<float> kf, vf;  // [tokens_kv, heads_kv, head_dim]: scale · value(code)

  template <class TQ, class TKV>
  quantized_host(const random_case<TQ, TKV>& c, std::mt19937& rng, bool per_block, std::int32_t max_blocks) {
    const case_spec& s = c.spec;
    const std::int64_t hd = static_cast<std::int64_t>(s.heads_kv) * s.head_dim;
    const auto batch = static_cast<std::int32_t>(s.seqs.size());
    const float unit = std::is_same_v<Code, std::int8_t> ? 1.0f / 48.0f : 1.0f / 16.0f;  // values about N(0, 1)
    const std::size_t n_scales = per_block ? static_cast<std::size_t>(batch) * max_blocks * s.heads_kv
                                           : static_cast<std::size_t>(s.heads_kv);
    for (auto* sc : {&k_scales, &v_scales}) {
      sc->resize(n_scales);
      for (float& x : *sc) x = unit * std::uniform_real_distribution<float>(0.25f, 2.0f)(rng);
    }
    if (per_block) {
      seq_stride = static_cast<std::int64_t>(max_blocks) * s.heads_kv;
      block_stride = s.heads_kv;
    }
    for (auto* x : {&k, &v}) {
      x->resize(c.k.size());
      for (Code& e : *x) e = random_code<Code>(rng);
    }
    for (auto* x : {&k_pages, &v_pages}) {
      x->resize(c.k_pages.size());
      for (Code& e : *x) e = random_code<Code>(rng);
    }
    kf.resize(k.size());
    vf.resize(v.size());
    for (std::int32_t b = 0; b < batch; ++b) {
      for (std::int32_t t = 0; t < c.cu_kv[b + 1] - c.cu_kv[b]; ++t) {
        const std::int64_t row = (c.cu_kv[b] + t) * hd;
        const std::int32_t page = c.page_indices[static_cast<std::size_t>(c.page_indptr[b] + t / s.page_size)];
        const std::int64_t dst = (static_cast<std::int64_t>(page) * s.page_size + t % s.page_size) * hd;
        std::copy_n(k.begin() + row, hd, k_pages.begin() + dst);
        std::copy_n(v.begin() + row, hd, v_pages.begin() + dst);
        for (std::int32_t h = 0; h < s.heads_kv; ++h) {
          const std::int64_t si = b * seq_stride + (t / s.block_kv) * block_stride + h * head_stride;
          for (std::int32_t e = 0; e < s.head_dim; ++e) {
            const std::int64_t x = row + static_cast<std::int64_t>(h) * s.head_dim + e;
            kf[x] = k_scales[si] * code_value(k[x]);  // one rounding: fp32(scale · value), as documented
            vf[x] = v_scales[si] * code_value(v[x]);
          }
        }
      }
    }
  }
};

}  // namespace skim::test
