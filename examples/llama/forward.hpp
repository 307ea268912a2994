#pragma once
// skim_llama::forward — the float forward pass of a Llama checkpoint, for a whole prompt at
// once (prefill) or one token at a time (decode), with a KV cache.
//
// Per layer (llama2.c's math): x += wo · attention(rope(wq · rms(x)), rope(wk · rms(x)), wv · rms(x))
//                              x += w2 · (silu(w1 · rms(x)) * (w3 · rms(x)))
// then logits = classifier · rms(x). RoPE rotates interleaved pairs (x[2i], x[2i+1]) of each
// head by pos · theta^(-2i/head_dim).
//
// The projections and the classifier are matrix products over all tokens of the call at once
// (Eigen), split into fixed slices of output features run on forward_options::threads threads: a
// slice's result depends on the slice only, so the logits are the same bits for any thread count.
// A prefill's products and a decode step's round differently (a GEMM sums in another order than a
// GEMV), so prefill and token-by-token decode agree to float rounding, not bit for bit.
//
// Attention is a pluggable callable taking skim's layout and causal rule (docs/design.md §2, §3):
// Q [n_q, heads_q, head_dim], K and V [n_kv, heads_kv, head_dim] (this layer's cache),
// query i sees key j iff j <= i + n_kv - n_q. dense_attention is the default; an engine
// swaps in skim's executors without touching the rest. A hook sees each layer's Q and K
// after RoPE and V, for the tokens of the current call.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <span>
#include <vector>

#include <Eigen/Core>

#include "model.hpp"
#include "skim/core/host_buffer.hpp"
#include "skim/core/parallel.hpp"

namespace skim_llama {

// [layers][max_tokens][kv_heads][head_dim] for K and for V; `tokens` of them are filled.
// A cache made with float_rows = false counts tokens but holds no rows (k and v empty): the K and V
// of a forward pass then go to forward_options::store_kv (e.g. an engine's quantised cache).
// The rows live in skim::host_buffer: huge pages where the kernel gives them, which decode's
// scattered reads of K and V want (docs/performance.md, "CPU: huge pages").
struct kv_cache {
  int max_tokens = 0;
  int tokens = 0;
  int kv_heads = 0, head_dim = 0;
  skim::host_buffer<float> k, v;
  bool rows = true;  // false: k and v are empty, the rows live elsewhere (forward_options::store_kv)

  kv_cache() = default;
  kv_cache(const config& c, int max_tokens_, bool float_rows = true)
      : max_tokens(max_tokens_), kv_heads(c.n_kv_heads), head_dim(c.head_dim()),
        k(float_rows ? static_cast<std::size_t>(c.n_layers) * max_tokens_ * c.kv_dim() : 0), v(k.size()), rows(float_rows) {}

  [[nodiscard]] bool holds_rows() const { return rows; }

  [[nodiscard]] std::size_t layer_stride() const { return static_cast<std::size_t>(max_tokens) * kv_heads * head_dim; }
  [[nodiscard]] float* k_at(int layer, int token) { return k.data() + layer * layer_stride() + static_cast<std::size_t>(token) * kv_heads * head_dim; }
  [[nodiscard]] float* v_at(int layer, int token) { return v.data() + layer * layer_stride() + static_cast<std::size_t>(token) * kv_heads * head_dim; }
};

struct attention_args {
  int layer = 0;
  int n_q = 0;   // new query tokens
  int n_kv = 0;  // keys visible to the last query: cached + new
  int heads_q = 0, heads_kv = 0, head_dim = 0;
  float scale = 0.0f;            // 1/sqrt(head_dim)
  std::span<const float> q{};    // [n_q, heads_q, head_dim]
  std::span<const float> k{};    // [n_kv, heads_kv, head_dim]; empty where store_kv keeps K/V
  std::span<const float> v{};    // [n_kv, heads_kv, head_dim]; empty where store_kv keeps K/V
  std::span<float> out{};        // [n_q, heads_q, head_dim]
};

using attention_fn = std::function<skim::status(const attention_args&)>;
// Takes the K (after RoPE) and V rows [n, kv_heads, head_dim] of keys [first, first + n) of a layer,
// before that layer's attention call.
using kv_store_fn = std::function<skim::status(int layer, int first, std::span<const float> k, std::span<const float> v)>;

// Q, K after RoPE and V of one layer for the tokens [first_token, first_token + n) of a call.
struct qkv_view {
  int layer = 0, first_token = 0, n = 0;
  std::span<const float> q{};  // [n, heads_q, head_dim]
  std::span<const float> k{};  // [n, heads_kv, head_dim]
  std::span<const float> v{};  // [n, heads_kv, head_dim]
};
using qkv_hook = std::function<void(const qkv_view&)>;

// Causal softmax attention in float, one query row at a time (llama2.c's loop). Reads a's float
// K/V: refuses a call whose k or v is short (a cache whose rows went to store_kv has none).
[[nodiscard]] inline skim::status dense_attention(const attention_args& a) {
  const std::size_t kv_floats = static_cast<std::size_t>(a.n_kv) * a.heads_kv * a.head_dim;
  if (a.k.size() < kv_floats || a.v.size() < kv_floats) {
    return skim::status::error(skim::status_code::shape_mismatch, "dense_attention reads %zu floats of K and of V, given %zu and %zu",
                               kv_floats, a.k.size(), a.v.size());
  }
  const int group = a.heads_q / a.heads_kv;
  std::vector<float> p(static_cast<std::size_t>(a.n_kv));
  for (int i = 0; i < a.n_q; ++i) {
    const int visible = i + a.n_kv - a.n_q + 1;  // keys 0..visible-1
    for (int h = 0; h < a.heads_q; ++h) {
      const float* q = &a.q[(static_cast<std::size_t>(i) * a.heads_q + h) * a.head_dim];
      const int hk = h / group;
      float m = -INFINITY;
      for (int j = 0; j < visible; ++j) {
        const float* k = &a.k[(static_cast<std::size_t>(j) * a.heads_kv + hk) * a.head_dim];
        float s = 0.0f;
        for (int d = 0; d < a.head_dim; ++d) s += q[d] * k[d];
        p[j] = s * a.scale;
        m = std::max(m, p[j]);
      }
      float l = 0.0f;
      for (int j = 0; j < visible; ++j) l += p[j] = std::exp(p[j] - m);
      float* o = &a.out[(static_cast<std::size_t>(i) * a.heads_q + h) * a.head_dim];
      std::fill(o, o + a.head_dim, 0.0f);
      for (int j = 0; j < visible; ++j) {
        const float* v = &a.v[(static_cast<std::size_t>(j) * a.heads_kv + hk) * a.head_dim];
        for (int d = 0; d < a.head_dim; ++d) o[d] += p[j] / l * v[d];
      }
    }
  }
  return skim::status::success();
}

struct forward_options {
  attention_fn attention = dense_attention;
  qkv_hook on_qkv = {};  // optional
  // Optional: where the new K and V go instead of the cache's float rows (which it must then lack:
  // kv_cache(c, n, false)); the attention call's k and v are then empty, its attention_fn reading
  // K/V from wherever store_kv put them.
  kv_store_fn store_kv = {};
  int threads = 1;       // for the projections and the classifier (attention_fn runs its own)
};

namespace detail {

// Output features per slice of matmul(): the unit of work handed to a thread.
inline constexpr int matmul_slice = 128;
// Below this many multiply-adds a product runs on the calling thread (spawning costs more).
inline constexpr double matmul_parallel_work = 4e6;

// out[t, r] = Σ_c x[t, c] · w[r, c] for x [n, cols], w [rows, cols] and out [n, rows], all row-major.
inline void matmul(float* out, const float* x, std::span<const float> w, int n, int rows, int cols, int threads) {
  using matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const Eigen::Map<const matrix> xs(x, n, cols);
  const int slices = (rows + matmul_slice - 1) / matmul_slice;
  const double work = static_cast<double>(n) * rows * cols;
  skim::parallel_for(slices, work < matmul_parallel_work ? 1 : threads, [&](std::int32_t, std::int64_t s, std::int64_t) {
    const int r0 = static_cast<int>(s) * matmul_slice, rn = std::min(matmul_slice, rows - r0);
    const Eigen::Map<const matrix> ws(w.data() + static_cast<std::size_t>(r0) * cols, rn, cols);
    Eigen::Map<matrix, 0, Eigen::OuterStride<>> os(out + r0, n, rn, Eigen::OuterStride<>(rows));
    os.noalias() = xs * ws.transpose();
  });
}

inline void rmsnorm(float* out, const float* x, std::span<const float> w, int n) {
  float ss = 0.0f;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + rms_eps);
  for (int i = 0; i < n; ++i) out[i] = w[i] * (inv * x[i]);
}

// Rotates the interleaved pairs of `heads` heads of one token at position pos.
inline void rope(float* x, int heads, int head_dim, int pos) {
  for (int h = 0; h < heads; ++h) {
    for (int i = 0; i < head_dim; i += 2) {
      const float freq = 1.0f / std::pow(rope_theta, static_cast<float>(i) / static_cast<float>(head_dim));
      const float angle = static_cast<float>(pos) * freq;
      const float c = std::cos(angle), s = std::sin(angle);
      float* p = x + h * head_dim + i;
      const float a = p[0], b = p[1];
      p[0] = a * c - b * s;
      p[1] = a * s + b * c;
    }
  }
}

}  // namespace detail

// Runs `tokens` through the model after the cache's tokens, appending their K and V.
// logits: [tokens.size(), vocab] for every position, [vocab] for the last one only, or empty to skip
// the classifier.
// Prefill is one call with the whole prompt; decode is one call per token.
[[nodiscard]] inline skim::status forward(const model& m, kv_cache& cache, std::span<const int> tokens, std::span<float> logits,
                                          const forward_options& opt = {}) {
  const config& c = m.cfg;
  const int n = static_cast<int>(tokens.size());
  const int dim = c.dim, hd = c.head_dim(), qdim = c.n_heads * hd, kvd = c.kv_dim(), hid = c.hidden_dim;
  if (cache.kv_heads != c.n_kv_heads || cache.head_dim != hd) {
    return skim::status::error(skim::status_code::shape_mismatch, "kv cache has %d kv heads of dim %d, model %d of dim %d",
                               cache.kv_heads, cache.head_dim, c.n_kv_heads, hd);
  }
  if (cache.holds_rows() == static_cast<bool>(opt.store_kv)) {
    return skim::status::error(skim::status_code::invalid_argument, opt.store_kv ? "store_kv given for a cache with float rows"
                                                                                 : "the cache holds no float rows and no store_kv is given");
  }
  if (cache.tokens + n > cache.max_tokens) {
    return skim::status::error(skim::status_code::invalid_argument, "kv cache holds %d of %d tokens, %d more do not fit",
                               cache.tokens, cache.max_tokens, n);
  }
  const bool last_only = logits.size() == static_cast<std::size_t>(c.vocab_size) && n > 1;
  if (!logits.empty() && !last_only && logits.size() != static_cast<std::size_t>(n) * c.vocab_size) {
    return skim::status::error(skim::status_code::shape_mismatch, "logits hold %zu floats, need %d tokens x vocab %d (or vocab alone)",
                               logits.size(), n, c.vocab_size);
  }
  for (int t = 0; t < n; ++t) {
    if (tokens[t] < 0 || tokens[t] >= c.vocab_size) {
      return skim::status::error(skim::status_code::invalid_argument, "token %d at %d outside vocab %d", tokens[t], t, c.vocab_size);
    }
  }
  if (n == 0) return skim::status::success();

  const int first = cache.tokens;
  const auto row = [](std::vector<float>& v, int t, int width) { return v.data() + static_cast<std::size_t>(t) * width; };
  std::vector<float> x(static_cast<std::size_t>(n) * dim), xb(x.size()), q(static_cast<std::size_t>(n) * qdim), att(q.size());
  std::vector<float> h1(static_cast<std::size_t>(n) * hid), h3(h1.size()), k_new(static_cast<std::size_t>(n) * kvd), v_new(k_new.size());
  for (int t = 0; t < n; ++t) {
    std::copy_n(m.token_embedding.data() + static_cast<std::size_t>(tokens[t]) * dim, dim, row(x, t, dim));
  }

  const int th = opt.threads;
  for (int l = 0; l < c.n_layers; ++l) {
    const layer_weights& w = m.layers[l];
    for (int t = 0; t < n; ++t) detail::rmsnorm(row(xb, t, dim), row(x, t, dim), w.rms_att, dim);
    detail::matmul(q.data(), xb.data(), w.wq, n, qdim, dim, th);
    detail::matmul(k_new.data(), xb.data(), w.wk, n, kvd, dim, th);
    detail::matmul(v_new.data(), xb.data(), w.wv, n, kvd, dim, th);
    for (int t = 0; t < n; ++t) {
      detail::rope(row(q, t, qdim), c.n_heads, hd, first + t);
      detail::rope(row(k_new, t, kvd), c.n_kv_heads, hd, first + t);
    }
    const std::size_t kv_len = static_cast<std::size_t>(first + n) * kvd;
    std::span<const float> k_all, v_all;
    if (opt.store_kv) {
      SKIM_TRY(opt.store_kv(l, first, k_new, v_new));
    } else {
      std::copy(k_new.begin(), k_new.end(), cache.k_at(l, first));
      std::copy(v_new.begin(), v_new.end(), cache.v_at(l, first));
      k_all = std::span<const float>(cache.k_at(l, 0), kv_len);
      v_all = std::span<const float>(cache.v_at(l, 0), kv_len);
    }
    if (opt.on_qkv) opt.on_qkv({.layer = l, .first_token = first, .n = n, .q = q, .k = k_new, .v = v_new});

    SKIM_TRY(opt.attention({.layer = l, .n_q = n, .n_kv = first + n, .heads_q = c.n_heads, .heads_kv = c.n_kv_heads, .head_dim = hd,
                            .scale = 1.0f / std::sqrt(static_cast<float>(hd)), .q = q, .k = k_all, .v = v_all, .out = att}));

    detail::matmul(xb.data(), att.data(), w.wo, n, dim, qdim, th);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += xb[i];
    for (int t = 0; t < n; ++t) detail::rmsnorm(row(xb, t, dim), row(x, t, dim), w.rms_ffn, dim);
    detail::matmul(h1.data(), xb.data(), w.w1, n, hid, dim, th);
    detail::matmul(h3.data(), xb.data(), w.w3, n, hid, dim, th);
    for (std::size_t i = 0; i < h1.size(); ++i) h1[i] = h1[i] / (1.0f + std::exp(-h1[i])) * h3[i];  // SwiGLU: silu(gate) · up
    detail::matmul(xb.data(), h1.data(), w.w2, n, dim, hid, th);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += xb[i];
  }
  cache.tokens += n;

  if (!logits.empty()) {
    const int from = last_only ? n - 1 : 0;
    for (int t = from; t < n; ++t) detail::rmsnorm(row(xb, t, dim), row(x, t, dim), m.rms_final, dim);
    detail::matmul(logits.data(), row(xb, from, dim), m.classifier, n - from, c.vocab_size, dim, th);
  }
  return skim::status::success();
}

// Index of the largest logit (the lowest index on ties).
[[nodiscard]] inline int argmax(std::span<const float> logits) {
  return static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace skim_llama
