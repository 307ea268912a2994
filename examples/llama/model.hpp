#pragma once
// skim_llama::model — a Llama checkpoint in llama2.c's legacy (v0) format.
//
// File layout (all little-endian):
//   header  7 × int32: dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
//           (vocab_size > 0: the classifier is the token embedding; < 0: a separate
//           classifier follows, |vocab_size| rows)
//   float32 weights, each tensor stacked over layers, row-major [out, in]:
//     token_embedding [vocab, dim]
//     rms_att [L, dim]  wq [L, heads*hd, dim]  wk [L, kv_heads*hd, dim]  wv [L, kv_heads*hd, dim]
//     wo [L, dim, heads*hd]  rms_ffn [L, dim]  w1 [L, hidden, dim]  w2 [L, dim, hidden]
//     w3 [L, hidden, dim]  rms_final [dim]
//     two legacy RoPE tables [seq_len, hd/2] each (skipped: RoPE is computed)
//     classifier [vocab, dim] only if not shared
// load() checks the header and that the file size is exactly what it implies.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "../common/read_file.hpp"
#include "skim/core/status.hpp"

namespace skim_llama {

using skim::status;
using skim::status_code;

struct config {
  int dim = 0;         // model width
  int hidden_dim = 0;  // FFN width
  int n_layers = 0;
  int n_heads = 0;     // query heads
  int n_kv_heads = 0;  // key/value heads (GQA: n_heads is a multiple)
  int vocab_size = 0;
  int seq_len = 0;     // trained context length
  bool shared_classifier = true;

  [[nodiscard]] int head_dim() const { return dim / n_heads; }
  [[nodiscard]] int kv_dim() const { return n_kv_heads * head_dim(); }
};

struct layer_weights {
  std::span<const float> rms_att;  // [dim]
  std::span<const float> wq;       // [heads*hd, dim]
  std::span<const float> wk;       // [kv_heads*hd, dim]
  std::span<const float> wv;       // [kv_heads*hd, dim]
  std::span<const float> wo;       // [dim, heads*hd]
  std::span<const float> rms_ffn;  // [dim]
  std::span<const float> w1;       // [hidden, dim]  gate
  std::span<const float> w2;       // [dim, hidden]  down
  std::span<const float> w3;       // [hidden, dim]  up
};

struct model {
  config cfg;
  std::vector<float> storage;             // every weight of the file; the spans point here
  std::span<const float> token_embedding;  // [vocab, dim]
  std::vector<layer_weights> layers;       // [n_layers]
  std::span<const float> rms_final;        // [dim]
  std::span<const float> classifier;       // [vocab, dim]

  model() = default;
  model(const model&) = delete;  // the spans would point into the source's storage
  model& operator=(const model&) = delete;
  model(model&&) = default;  // vector moves keep their buffer, so the spans stay valid
  model& operator=(model&&) = default;
};

inline constexpr float rope_theta = 10000.0f;
inline constexpr float rms_eps = 1e-5f;
inline constexpr std::size_t header_bytes = 7 * sizeof(std::int32_t);

namespace detail {
// Saturating 64-bit arithmetic: a result past 2^64 - 1 stays at 2^64 - 1 (never wraps).
inline constexpr std::uint64_t saturated = std::numeric_limits<std::uint64_t>::max();
[[nodiscard]] constexpr std::uint64_t mul(std::uint64_t a, std::uint64_t b) { return a != 0 && b > saturated / a ? saturated : a * b; }
[[nodiscard]] constexpr std::uint64_t add(std::uint64_t a, std::uint64_t b) { return b > saturated - a ? saturated : a + b; }
}  // namespace detail

// Weight floats the config implies (legacy RoPE tables included), 0 if a value is out of
// range (each must be in [1, 2^20]), or 2^64 - 1 if the count passes 64 bits. Every product
// and sum is checked: with each dimension at 2^20 the count itself fits, but 4 × it (the
// bytes) does not, and without the head checks (n_kv_heads > n_heads) even the count can pass.
[[nodiscard]] inline std::uint64_t weight_floats(const config& c) {
  constexpr int cap = 1 << 20;
  for (const int v : {c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, c.seq_len}) {
    if (v <= 0 || v > cap) return 0;
  }
  using detail::add, detail::mul;
  const std::uint64_t d = c.dim, h = c.hidden_dim, l = c.n_layers, v = c.vocab_size, hd = c.dim / c.n_heads;
  const std::uint64_t q = mul(c.n_heads, hd), kv = mul(c.n_kv_heads, hd);
  std::uint64_t layer = add(d, mul(d, q));   // rms_att, wq
  layer = add(layer, mul(mul(2, d), kv));     // wk, wv
  layer = add(layer, mul(q, d));              // wo
  layer = add(layer, add(d, mul(mul(3, d), h)));  // rms_ffn, w1, w2, w3
  std::uint64_t n = add(mul(v, d), mul(l, layer));  // token embedding, the layers
  n = add(n, add(d, mul(c.seq_len, hd)));          // rms_final, two RoPE tables of hd/2
  if (!c.shared_classifier) n = add(n, mul(v, d));
  return n;
}

// Parses an in-memory checkpoint; `name` labels messages.
[[nodiscard]] inline status parse(std::span<const std::byte> bytes, model& out, const std::string& name) {
  const char* file = name.c_str();
  if (bytes.size() < header_bytes) {
    return status::error(status_code::invalid_argument, "%s: file holds %zu bytes, too short for the %zu-byte header", file,
                         bytes.size(), header_bytes);
  }
  std::array<std::int32_t, 7> h{};
  std::memcpy(h.data(), bytes.data(), header_bytes);  // little-endian hosts only, as llama2.c
  config c{.dim = h[0], .hidden_dim = h[1], .n_layers = h[2], .n_heads = h[3], .n_kv_heads = h[4],
           .vocab_size = h[5] == std::numeric_limits<std::int32_t>::min() ? 0 : h[5] < 0 ? -h[5] : h[5],  // 0: reported below
           .seq_len = h[6], .shared_classifier = h[5] > 0};
  const std::uint64_t floats = weight_floats(c);
  if (floats == 0) {
    return status::error(status_code::invalid_argument,
                         "%s: bad header: dim %d, hidden_dim %d, n_layers %d, n_heads %d, n_kv_heads %d, vocab_size %d, seq_len %d",
                         file, h[0], h[1], h[2], h[3], h[4], h[5], h[6]);
  }
  if (c.dim % c.n_heads != 0 || c.n_heads % c.n_kv_heads != 0 || c.head_dim() % 2 != 0) {
    return status::error(status_code::invalid_argument,
                         "%s: bad header: dim %d, n_heads %d, n_kv_heads %d (need heads | dim, kv_heads | heads, even head dim)", file,
                         c.dim, c.n_heads, c.n_kv_heads);
  }
  // 28 + 4n is a multiple of 4, so a saturated 2^64 - 1 cannot be a real size.
  const std::uint64_t expected = detail::add(header_bytes, detail::mul(4, floats));
  if (expected == detail::saturated || bytes.size() != expected) {
    const char* own = c.shared_classifier ? "" : ", own classifier";
    if (expected == detail::saturated) {
      return status::error(status_code::invalid_argument, "%s: file holds %zu bytes, header (dim %d, %d layers, vocab %d%s) needs over 2^64",
                           file, bytes.size(), c.dim, c.n_layers, c.vocab_size, own);
    }
    return status::error(status_code::invalid_argument, "%s: file holds %zu bytes, header (dim %d, %d layers, vocab %d%s) needs %llu", file,
                         bytes.size(), c.dim, c.n_layers, c.vocab_size, own, static_cast<unsigned long long>(expected));
  }

  out.cfg = c;
  out.storage.resize(static_cast<std::size_t>(floats));
  std::memcpy(out.storage.data(), bytes.data() + header_bytes, 4 * out.storage.size());
  std::size_t at = 0;
  const auto take = [&](std::size_t n) {
    std::span<const float> s(out.storage.data() + at, n);
    at += n;
    return s;
  };
  const std::size_t d = c.dim, hid = c.hidden_dim, l = c.n_layers, q = c.n_heads * c.head_dim(), kv = c.kv_dim();
  out.token_embedding = take(c.vocab_size * d);
  out.layers.assign(l, {});
  // Each tensor is stacked over layers, so walk tensor by tensor.
  for (auto& w : out.layers) w.rms_att = take(d);
  for (auto& w : out.layers) w.wq = take(q * d);
  for (auto& w : out.layers) w.wk = take(kv * d);
  for (auto& w : out.layers) w.wv = take(kv * d);
  for (auto& w : out.layers) w.wo = take(d * q);
  for (auto& w : out.layers) w.rms_ffn = take(d);
  for (auto& w : out.layers) w.w1 = take(hid * d);
  for (auto& w : out.layers) w.w2 = take(d * hid);
  for (auto& w : out.layers) w.w3 = take(hid * d);
  out.rms_final = take(d);
  (void)take(static_cast<std::size_t>(c.seq_len) * c.head_dim());  // legacy RoPE tables
  out.classifier = c.shared_classifier ? out.token_embedding : take(c.vocab_size * d);
  return status::success();
}

// Reads a checkpoint file; messages name `path` as given.
[[nodiscard]] inline status load(const std::filesystem::path& path, model& out) {
  std::vector<std::byte> bytes;
  SKIM_TRY(skim::examples::read_file(path, bytes));
  return parse(bytes, out, path.string());
}

}  // namespace skim_llama
