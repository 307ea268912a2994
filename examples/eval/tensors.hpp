#pragma once
// skim-eval's inputs: Q, K, V read from .npy, their layout inferred, and one layer's views.
//
// Accepted layouts (float32 or float16 .npy, C order; npy.hpp reads them):
//   [tokens, heads, dim]          one layer, token-major (the library's own layout)
//   [layers, heads, tokens, dim]  head-major per layer (what skim-dump-qkv writes)
// Q and K/V must have the same rank and agree in layers, tokens and dim; K and V must have the
// same shape; heads_q must be a multiple of heads_kv (the GQA group size is inferred from it).

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "../common/npy.hpp"
#include "skim/core/views.hpp"

namespace skim_eval {

// Layout of one tensor.
struct tensor_shape {
  std::int32_t layers = 1;
  std::int32_t heads = 0;
  std::int32_t tokens = 0;
  std::int32_t dim = 0;
  bool per_layer = false;  // [layers, heads, tokens, dim] (else [tokens, heads, dim])
};

// The attention problem the three tensors describe.
struct input_shape {
  std::int32_t layers = 0;
  std::int32_t tokens = 0;
  std::int32_t heads_q = 0;
  std::int32_t heads_kv = 0;
  std::int32_t dim = 0;
  bool per_layer = false;
  [[nodiscard]] std::int32_t group_size() const noexcept { return heads_q / heads_kv; }
};

// Infers the layout of an array of `shape` named `name` (for messages). Returns "" or the error.
[[nodiscard]] inline std::string infer_tensor_shape(const std::vector<std::int64_t>& shape, std::string_view name,
                                                    tensor_shape& out) {
  const std::string text = std::string(name) + " has shape " + skim::npy::detail::shape_text(shape);
  if (shape.size() != 3 && shape.size() != 4) {
    return text + ": expected [tokens, heads, dim] or [layers, heads, tokens, dim]";
  }
  for (const std::int64_t d : shape) {
    if (d > INT32_MAX) return text + ": a dimension exceeds 2^31 - 1";
  }
  tensor_shape t;
  if (shape.size() == 3) {
    t = {.layers = 1, .heads = static_cast<std::int32_t>(shape[1]), .tokens = static_cast<std::int32_t>(shape[0]),
         .dim = static_cast<std::int32_t>(shape[2]), .per_layer = false};
  } else {
    t = {.layers = static_cast<std::int32_t>(shape[0]), .heads = static_cast<std::int32_t>(shape[1]),
         .tokens = static_cast<std::int32_t>(shape[2]), .dim = static_cast<std::int32_t>(shape[3]), .per_layer = true};
  }
  if (t.layers == 0 || t.heads == 0 || t.tokens == 0 || t.dim == 0) return text + ": a dimension is 0";
  out = t;
  return {};
}

// Infers the problem from the three shapes. Returns "" or the error naming the disagreement.
[[nodiscard]] inline std::string infer_input_shape(const std::vector<std::int64_t>& q,
                                                   const std::vector<std::int64_t>& k,
                                                   const std::vector<std::int64_t>& v, input_shape& out) {
  using skim::npy::detail::shape_text;
  tensor_shape tq, tk, tv;
  if (std::string e = infer_tensor_shape(q, "Q", tq); !e.empty()) return e;
  if (std::string e = infer_tensor_shape(k, "K", tk); !e.empty()) return e;
  if (std::string e = infer_tensor_shape(v, "V", tv); !e.empty()) return e;
  if (k != v) return "K " + shape_text(k) + " and V " + shape_text(v) + " differ in shape";
  const std::string both = "Q " + shape_text(q) + " and K " + shape_text(k);
  if (q.size() != k.size()) return both + " differ in rank (use one layout for all three)";
  if (tq.layers != tk.layers) {
    return both + " differ in layers (" + std::to_string(tq.layers) + " vs " + std::to_string(tk.layers) + ")";
  }
  if (tq.tokens != tk.tokens) {
    return both + " differ in tokens (" + std::to_string(tq.tokens) + " vs " + std::to_string(tk.tokens) + ")";
  }
  if (tq.dim != tk.dim) {
    return both + " differ in head dim (" + std::to_string(tq.dim) + " vs " + std::to_string(tk.dim) + ")";
  }
  if (tq.heads % tk.heads != 0) {
    return both + ": heads_q " + std::to_string(tq.heads) + " is not a multiple of heads_kv " +
           std::to_string(tk.heads) + " (GQA)";
  }
  out = {.layers = tq.layers, .tokens = tq.tokens, .heads_q = tq.heads, .heads_kv = tk.heads, .dim = tq.dim,
         .per_layer = tq.per_layer};
  return {};
}

struct inputs {
  input_shape shape;
  skim::npy::array q, k, v;

  // Layer `layer` of a tensor with `heads` heads as a [tokens, heads, dim] view.
  [[nodiscard]] skim::strided_view<const float> view(const skim::npy::array& a, std::int32_t heads,
                                                     std::int32_t layer) const noexcept {
    using view_t = skim::strided_view<const float>;
    if (!shape.per_layer) return view_t::token_major(a.data.data(), shape.tokens, heads, shape.dim);
    const std::int64_t per_layer = static_cast<std::int64_t>(heads) * shape.tokens * shape.dim;
    return view_t::head_major(a.data.data() + layer * per_layer, shape.tokens, heads, shape.dim);
  }
  [[nodiscard]] skim::strided_view<const float> q_view(std::int32_t layer) const noexcept {
    return view(q, shape.heads_q, layer);
  }
  [[nodiscard]] skim::strided_view<const float> k_view(std::int32_t layer) const noexcept {
    return view(k, shape.heads_kv, layer);
  }
  [[nodiscard]] skim::strided_view<const float> v_view(std::int32_t layer) const noexcept {
    return view(v, shape.heads_kv, layer);
  }
};

// Reads and checks the three files. Returns "" or the error (npy.hpp's message names the file).
[[nodiscard]] inline std::string load_inputs(const std::string& q_path, const std::string& k_path,
                                             const std::string& v_path, inputs& out) {
  inputs in;
  for (const auto& [path, array] : {std::pair{&q_path, &in.q}, std::pair{&k_path, &in.k}, std::pair{&v_path, &in.v}}) {
    if (const skim::status s = skim::npy::read(*path, *array); !s.ok()) return s.message();
  }
  if (std::string e = infer_input_shape(in.q.shape, in.k.shape, in.v.shape, in.shape); !e.empty()) return e;
  out = std::move(in);
  return {};
}

}  // namespace skim_eval
