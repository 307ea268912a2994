#pragma once
// A Llama forward pass in double, written from llama2.c's math without forward.hpp, for the tests
// that check skim-llama's engine against it.
#include <cmath>
#include <span>
#include <vector>

#include "../../examples/llama/model.hpp"

namespace skim::test::real {

using skim_llama::config;
using skim_llama::layer_weights;
using skim_llama::model;
using skim_llama::rms_eps;
using skim_llama::rope_theta;

// The Llama forward pass in double, written from llama2.c's math without forward.hpp: all
// positions at once, full causal softmax per (query, head), returns logits [n, vocab].
inline std::vector<double> reference_logits(const model& m, const std::vector<int>& ids) {
  const config& c = m.cfg;
  const int n = static_cast<int>(ids.size()), D = c.dim, H = c.n_heads, KVH = c.n_kv_heads, hd = c.head_dim(), F = c.hidden_dim;
  const auto mv = [](const std::vector<double>& x, std::span<const float> w, int rows, int cols) {
    std::vector<double> y(static_cast<std::size_t>(rows), 0.0);
    for (int r = 0; r < rows; ++r) {
      for (int k = 0; k < cols; ++k) y[r] += static_cast<double>(w[static_cast<std::size_t>(r) * cols + k]) * x[k];
    }
    return y;
  };
  const auto rms = [&](const std::vector<double>& x, std::span<const float> w) {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double inv = 1.0 / std::sqrt(ss / D + static_cast<double>(rms_eps));
    std::vector<double> y(x.size());
    for (int i = 0; i < D; ++i) y[i] = w[i] * x[i] * inv;
    return y;
  };
  const auto rope = [&](std::vector<double>& v, int pos) {
    for (std::size_t h = 0; h < v.size() / hd; ++h) {
      for (int i = 0; i < hd; i += 2) {
        const double a = pos * std::pow(static_cast<double>(rope_theta), -static_cast<double>(i) / hd);
        double& x0 = v[h * hd + i];
        double& x1 = v[h * hd + i + 1];
        const double r0 = x0 * std::cos(a) - x1 * std::sin(a), r1 = x0 * std::sin(a) + x1 * std::cos(a);
        x0 = r0;
        x1 = r1;
      }
    }
  };
  std::vector<std::vector<double>> x(static_cast<std::size_t>(n));
  for (int t = 0; t < n; ++t) {
    x[t].assign(m.token_embedding.begin() + static_cast<std::ptrdiff_t>(ids[t]) * D,
                m.token_embedding.begin() + static_cast<std::ptrdiff_t>(ids[t] + 1) * D);
  }
  for (const layer_weights& w : m.layers) {
    std::vector<std::vector<double>> q(n), k(n), v(n);
    for (int t = 0; t < n; ++t) {
      const auto xb = rms(x[t], w.rms_att);
      q[t] = mv(xb, w.wq, H * hd, D);
      k[t] = mv(xb, w.wk, KVH * hd, D);
      v[t] = mv(xb, w.wv, KVH * hd, D);
      rope(q[t], t);
      rope(k[t], t);
    }
    for (int t = 0; t < n; ++t) {
      std::vector<double> att(static_cast<std::size_t>(H * hd), 0.0);
      for (int h = 0; h < H; ++h) {
        const int g = h / (H / KVH);
        std::vector<double> s(static_cast<std::size_t>(t + 1));
        double mx = -INFINITY, z = 0;
        for (int j = 0; j <= t; ++j) {
          double d = 0;
          for (int e = 0; e < hd; ++e) d += q[t][h * hd + e] * k[j][g * hd + e];
          s[j] = d / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[j]);
        }
        for (double& e : s) z += (e = std::exp(e - mx));
        for (int j = 0; j <= t; ++j) {
          for (int e = 0; e < hd; ++e) att[h * hd + e] += s[j] / z * v[j][g * hd + e];
        }
      }
      const auto o = mv(att, w.wo, D, H * hd);
      for (int i = 0; i < D; ++i) x[t][i] += o[i];
      const auto xb = rms(x[t], w.rms_ffn);
      auto a = mv(xb, w.w1, F, D);
      const auto b = mv(xb, w.w3, F, D);
      for (int i = 0; i < F; ++i) a[i] = a[i] / (1.0 + std::exp(-a[i])) * b[i];
      const auto down = mv(a, w.w2, D, F);
      for (int i = 0; i < D; ++i) x[t][i] += down[i];
    }
  }
  std::vector<double> logits;
  for (int t = 0; t < n; ++t) {
    const auto l = mv(rms(x[t], m.rms_final), m.classifier, c.vocab_size, D);
    logits.insert(logits.end(), l.begin(), l.end());
  }
  return logits;
}

}  // namespace skim::test::real
