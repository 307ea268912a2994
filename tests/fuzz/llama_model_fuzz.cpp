// Fuzz target: skim-llama's llama2.c checkpoint loader (examples/llama/model.hpp, parse()) on
// arbitrary bytes.
//
// parse() must never read outside its span or crash, and an error must carry a message naming
// the input. An accepted checkpoint must have a config in its documented ranges (every field in
// [1, 2^20], heads | dim, kv_heads | heads, an even head dim) equal to the header, a file size of
// exactly 28 + 4 × weight_floats(), storage holding the file's floats bit for bit, and every
// tensor a span of the documented size at its documented place inside storage.
//
// Most random headers imply a size the input cannot match, so each input is also tried a second
// way: its first 28 bytes as the header and, when the implied weights are small, a file of
// exactly that size (the rest of the input, then zeros) — such a file must be accepted iff the
// header's head checks pass.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string_view>
#include <vector>

#include "../../examples/llama/model.hpp"
#include "fuzz_input.hpp"

namespace {

using namespace skim_llama;

void check_model(std::span<const std::byte> bytes, const model& m) {
  std::array<std::int32_t, 7> h{};
  std::memcpy(h.data(), bytes.data(), header_bytes);
  const config& c = m.cfg;
  for (const int v : {c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, c.seq_len}) {
    SKIM_FUZZ_CHECK(v >= 1 && v <= (1 << 20), "config field %d out of range", v);
  }
  SKIM_FUZZ_CHECK(c.dim == h[0] && c.hidden_dim == h[1] && c.n_layers == h[2] && c.n_heads == h[3] &&
                      c.n_kv_heads == h[4] && c.seq_len == h[6],
                  "config differs from the header");
  SKIM_FUZZ_CHECK(c.shared_classifier == (h[5] > 0) && c.vocab_size == (h[5] > 0 ? h[5] : -static_cast<std::int64_t>(h[5])),
                  "vocab_size %d from header %d", c.vocab_size, h[5]);
  SKIM_FUZZ_CHECK(c.dim % c.n_heads == 0 && c.n_heads % c.n_kv_heads == 0 && c.head_dim() % 2 == 0,
                  "head checks: dim %d, heads %d, kv heads %d", c.dim, c.n_heads, c.n_kv_heads);
  const std::uint64_t floats = weight_floats(c);
  SKIM_FUZZ_CHECK(bytes.size() == header_bytes + 4 * floats && m.storage.size() == floats, "file %zu bytes, storage %zu floats",
                  bytes.size(), m.storage.size());
  SKIM_FUZZ_CHECK(floats == 0 || std::memcmp(m.storage.data(), bytes.data() + header_bytes, 4 * floats) == 0,
                  "storage differs from the file");
  // Walk the documented layout: each tensor must be the next span of its size.
  const float* const base = m.storage.data();
  std::size_t at = 0;
  const auto expect = [&](std::span<const float> s, std::size_t n, const char* what) {
    SKIM_FUZZ_CHECK(s.data() == base + at && s.size() == n, "%s at %td size %zu, expected %zu size %zu", what, s.data() - base,
                    s.size(), at, n);
    at += n;
  };
  const std::size_t d = c.dim, hid = c.hidden_dim, hd = c.head_dim(), q = c.n_heads * hd, kv = c.n_kv_heads * hd;
  SKIM_FUZZ_CHECK(m.layers.size() == static_cast<std::size_t>(c.n_layers), "%zu layers", m.layers.size());
  expect(m.token_embedding, c.vocab_size * d, "token_embedding");
  for (const auto& w : m.layers) expect(w.rms_att, d, "rms_att");
  for (const auto& w : m.layers) expect(w.wq, q * d, "wq");
  for (const auto& w : m.layers) expect(w.wk, kv * d, "wk");
  for (const auto& w : m.layers) expect(w.wv, kv * d, "wv");
  for (const auto& w : m.layers) expect(w.wo, d * q, "wo");
  for (const auto& w : m.layers) expect(w.rms_ffn, d, "rms_ffn");
  for (const auto& w : m.layers) expect(w.w1, hid * d, "w1");
  for (const auto& w : m.layers) expect(w.w2, d * hid, "w2");
  for (const auto& w : m.layers) expect(w.w3, hid * d, "w3");
  expect(m.rms_final, d, "rms_final");
  at += static_cast<std::size_t>(c.seq_len) * hd;  // the legacy RoPE tables
  if (c.shared_classifier) {
    SKIM_FUZZ_CHECK(m.classifier.data() == m.token_embedding.data() && m.classifier.size() == m.token_embedding.size(),
                    "shared classifier is not the embedding");
  } else {
    expect(m.classifier, c.vocab_size * d, "classifier");
  }
  SKIM_FUZZ_CHECK(at == m.storage.size(), "tensors end at %zu of %zu floats", at, m.storage.size());
}

// Parses `bytes`; true iff accepted (then every invariant above was checked).
bool parse_and_check(std::span<const std::byte> bytes) {
  model m;
  const skim::status s = parse(bytes, m, "fuzz.bin");
  if (!s.ok()) {
    SKIM_FUZZ_CHECK(std::string_view(s.message()).starts_with("fuzz.bin: "), "message without the name: %s", s.message());
    SKIM_FUZZ_CHECK(m.storage.empty() && m.layers.empty(), "a rejected file filled the model");
    return false;
  }
  check_model(bytes, m);
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  parse_and_check(bytes);
  if (size < header_bytes) return 0;

  // The same header with a file of exactly the size it implies, when that is small.
  std::array<std::int32_t, 7> h{};
  std::memcpy(h.data(), data, header_bytes);
  const config c{.dim = h[0], .hidden_dim = h[1], .n_layers = h[2], .n_heads = h[3], .n_kv_heads = h[4],
                 .vocab_size = h[5] == std::numeric_limits<std::int32_t>::min() ? 0 : h[5] < 0 ? -h[5] : h[5],
                 .seq_len = h[6], .shared_classifier = h[5] > 0};
  const std::uint64_t floats = weight_floats(c);
  if (floats == 0 || floats > (1u << 16)) return 0;
  std::vector<std::byte> file(header_bytes + 4 * floats);
  std::memcpy(file.data(), data, std::min(size, file.size()));
  const bool heads_ok = c.dim % c.n_heads == 0 && c.n_heads % c.n_kv_heads == 0 && c.head_dim() % 2 == 0;
  SKIM_FUZZ_CHECK(parse_and_check(file) == heads_ok, "a file of the implied size (%zu bytes) was %s", file.size(),
                  heads_ok ? "rejected" : "accepted");
  return 0;
}
