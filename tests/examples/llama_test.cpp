// The stories260K engine core against the real checkpoint (shared/models, outside the repo).
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "../../examples/llama/forward.hpp"
#include "../../examples/llama/model.hpp"
#include "../../examples/llama/models_dir.hpp"
#include "../../examples/llama/tokenizer.hpp"
#include "examples/real_model.hpp"

namespace fs = std::filesystem;
using namespace skim_llama;
using namespace skim::test::real;

namespace {

// llama2.c's encode() as written there: rescan every pair after each merge. O(n^2).
std::vector<int> encode_llama2c(const tokenizer& tk, const std::string& text) {
  std::vector<int> ids = {tokenizer::bos, tk.find(" ")};
  std::string cp;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) cp.clear();
    cp += text[i];
    if (i + 1 < text.size() && (static_cast<unsigned char>(text[i + 1]) & 0xC0) == 0x80 && cp.size() < 4) continue;
    if (const int id = tk.find(cp); id >= 0) {
      ids.push_back(id);
    } else {
      for (const char c : cp) ids.push_back(static_cast<unsigned char>(c) + 3);
    }
    cp.clear();
  }
  for (;;) {
    float best = -1e10f;
    int best_id = -1, best_at = -1;
    for (std::size_t i = 0; i + 1 < ids.size(); ++i) {
      const int id = tk.find(tk.piece(ids[i]) + tk.piece(ids[i + 1]));
      if (id >= 0 && tk.score(id) > best) {
        best = tk.score(id);
        best_id = id;
        best_at = static_cast<int>(i);
      }
    }
    if (best_at < 0) break;
    ids[best_at] = best_id;
    ids.erase(ids.begin() + best_at + 1);
  }
  return ids;
}

double mean_loss(std::span<const float> logits, std::span<const int> ids, int vocab) {
  double total = 0;
  for (std::size_t t = 0; t + 1 < ids.size(); ++t) {
    const float* r = logits.data() + t * vocab;
    const float mx = *std::max_element(r, r + vocab);
    double z = 0;
    for (int j = 0; j < vocab; ++j) z += std::exp(static_cast<double>(r[j] - mx));
    total += std::log(z) - (r[ids[t + 1]] - mx);
  }
  return total / static_cast<double>(ids.size() - 1);
}

fs::path temp_dir() {
  const fs::path d = fs::temp_directory_path() / ("skim_llama_test_" + std::to_string(std::random_device{}()));
  fs::create_directories(d);
  return d;
}

}  // namespace

TEST_CASE("llama: the checkpoint loads with its known config" * doctest::skip(model_missing())) {
  const config& c = real_model().m.cfg;
  CHECK(c.dim == 64);
  CHECK(c.hidden_dim == 172);
  CHECK(c.n_layers == 5);
  CHECK(c.n_heads == 8);
  CHECK(c.n_kv_heads == 4);
  CHECK(c.vocab_size == 512);
  CHECK(c.seq_len == 512);
  CHECK(c.shared_classifier);
  CHECK(c.head_dim() == 8);
  CHECK(real_model().tok.vocab_size() == 512);
}

TEST_CASE("llama: greedy generation from BOS tells the known story" * doctest::skip(model_missing())) {
  const auto& [m, tok] = real_model();
  kv_cache cache(m.cfg, m.cfg.seq_len);
  std::vector<float> logits(m.cfg.vocab_size);
  std::vector<int> out;
  int t = tokenizer::bos;
  for (int i = 0; i < 40; ++i) {
    REQUIRE(forward(m, cache, std::span(&t, 1), logits).ok());
    t = argmax(logits);
    if (t == tokenizer::bos) break;
    out.push_back(t);
  }
  const std::string text = tok.decode(out);
  CHECK_MESSAGE(text.starts_with("Once upon a time, there was a little girl named Lily."), text);
}

TEST_CASE("llama: prefill equals token-by-token decode" * doctest::skip(model_missing())) {
  const auto& [m, tok] = real_model();
  std::vector<int> ids = tok.encode(read_text(models_dir() / "tinystories_sample.txt"));
  ids.resize(96);
  const int vocab = m.cfg.vocab_size;
  std::vector<float> prefill(ids.size() * vocab), step(vocab);
  kv_cache a(m.cfg, 128), b(m.cfg, 128);
  // Half the prompt as one prefill, then the rest in a second chunk: chunked prefill too.
  REQUIRE(forward(m, a, std::span(ids).first(40), std::span(prefill).first(40 * vocab)).ok());
  REQUIRE(forward(m, a, std::span(ids).subspan(40), std::span(prefill).subspan(40 * vocab)).ok());
  CHECK(a.tokens == 96);
  float worst = 0;
  for (std::size_t t = 0; t < ids.size(); ++t) {
    REQUIRE(forward(m, b, std::span(ids).subspan(t, 1), step).ok());
    for (int j = 0; j < vocab; ++j) worst = std::max(worst, std::abs(step[j] - prefill[t * vocab + j]));
  }
  CHECK(worst < 1e-4f);
  // The same K up to float rounding: a prefill's products are GEMMs, a decode step's GEMVs, which
  // sum in another order (forward.hpp).
  float k_worst = 0;
  for (std::size_t i = 0; i < a.k.size(); ++i) k_worst = std::max(k_worst, std::abs(a.k[i] - b.k[i]));
  MESSAGE("max |K prefill - K decode| = ", k_worst);
  CHECK(k_worst < 1e-4f);
}

TEST_CASE("llama: mean next-token loss over real TinyStories text" * doctest::skip(model_missing())) {
  const auto& [m, tok] = real_model();
  std::vector<int> ids = tok.encode(read_text(models_dir() / "tinystories_more.txt"));
  REQUIRE(ids.size() >= 512);
  ids.resize(512);
  std::vector<float> logits(ids.size() * m.cfg.vocab_size);
  kv_cache cache(m.cfg, 512);
  REQUIRE(forward(m, cache, ids, logits).ok());
  const double loss = mean_loss(logits, ids, m.cfg.vocab_size);
  MESSAGE("mean next-token loss over the first 512 tokens of tinystories_more.txt: ", loss, " nats");
  CHECK(loss > 0.9);
  CHECK(loss < 1.6);
}

TEST_CASE("llama: attention is pluggable and the hook sees Q, K after RoPE and V" * doctest::skip(model_missing())) {
  const auto& [m, tok] = real_model();
  const std::vector<int> ids = tok.encode("Once upon a time");
  const int n = static_cast<int>(ids.size());
  int calls = 0, hooks = 0;
  forward_options opt;
  opt.attention = [&](const attention_args& a) {
    ++calls;
    CHECK(a.n_q == n);
    CHECK(a.n_kv == n);
    CHECK(a.heads_q == 8);
    CHECK(a.heads_kv == 4);
    CHECK(a.q.size() == static_cast<std::size_t>(n) * 8 * 8);
    CHECK(a.k.size() == static_cast<std::size_t>(n) * 4 * 8);
    return dense_attention(a);
  };
  kv_cache cache(m.cfg, n);
  opt.on_qkv = [&](const qkv_view& x) {
    ++hooks;
    CHECK(x.n == n);
    CHECK(std::equal(x.k.begin(), x.k.end(), cache.k_at(x.layer, 0)));  // K enters the cache after RoPE
    CHECK(std::equal(x.v.begin(), x.v.end(), cache.v_at(x.layer, 0)));
  };
  std::vector<float> logits(ids.size() * m.cfg.vocab_size), dense(logits.size());
  REQUIRE(forward(m, cache, ids, logits, opt).ok());
  CHECK(calls == m.cfg.n_layers);
  CHECK(hooks == m.cfg.n_layers);
  kv_cache plain(m.cfg, n);
  REQUIRE(forward(m, plain, ids, dense).ok());
  CHECK(logits == dense);

  // A failing attention stops the pass and its status comes back.
  opt.attention = [](const attention_args& a) {
    return skim::status::error(skim::status_code::unsupported, "no executor for layer %d", a.layer);
  };
  opt.on_qkv = {};
  kv_cache c2(m.cfg, n);
  CHECK(std::string(forward(m, c2, ids, logits, opt).message()) == "no executor for layer 0");
  CHECK(std::string(forward(m, plain, ids, dense).message()) == "kv cache holds " + std::to_string(n) + " of " + std::to_string(n) +
                                                                    " tokens, " + std::to_string(n) + " more do not fit");
  const int bad = 512;
  CHECK(std::string(forward(m, c2, std::span(&bad, 1), {}).message()) == "token 512 at 0 outside vocab 512");
}

TEST_CASE("llama: the tokenizer matches llama2.c and round-trips text" * doctest::skip(model_missing())) {
  const auto& tok = real_model().tok;
  const std::string text = read_text(models_dir() / "tinystories_sample.txt").substr(0, 1500);
  const std::vector<int> ids = tok.encode(text);
  CHECK(ids == encode_llama2c(tok, text));
  CHECK(ids.front() == tokenizer::bos);
  CHECK(tok.decode(ids) == text);
  const std::string odd = "Ünïcödé ☃ and\ttabs\n\nnew lines";  // byte fallback
  CHECK(tok.decode(tok.encode(odd)) == odd);
  CHECK(tok.encode("") == std::vector<int>{tokenizer::bos});
  CHECK(tok.encode("", false, true) == std::vector<int>{tokenizer::eos});
}

TEST_CASE("llama: a wrong or truncated file gives a clear error" * doctest::skip(model_missing())) {
  const fs::path dir = models_dir();
  const fs::path tmp = temp_dir();
  const std::string full = read_text(dir / "stories260K.bin");
  const auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(tmp / name, std::ios::binary) << bytes;
    return tmp / name;
  };
  model m;
  const fs::path cut = write("cut.bin", full.substr(0, 100000));
  CHECK(std::string(load(cut, m).message()) == cut.string() + ": file holds 100000 bytes, header (dim 64, 5 layers, vocab 512) needs 1056540");
  const fs::path tiny = write("tiny.bin", full.substr(0, 20));
  CHECK(std::string(load(tiny, m).message()) == tiny.string() + ": file holds 20 bytes, too short for the 28-byte header");
  std::string bad_heads = full;
  bad_heads[12] = 3;  // n_heads 3
  const fs::path heads = write("heads.bin", bad_heads);
  CHECK(std::string(load(heads, m).message()) ==
        heads.string() + ": bad header: dim 64, n_heads 3, n_kv_heads 4 (need heads | dim, kv_heads | heads, even head dim)");
  std::string negative = full;
  negative[8] = '\xff', negative[9] = '\xff', negative[10] = '\xff', negative[11] = '\xff';  // n_layers -1
  const fs::path neg = write("neg.bin", negative);
  CHECK(std::string(load(neg, m).message()) == neg.string() +
                                                   ": bad header: dim 64, hidden_dim 172, n_layers -1, n_heads 8, n_kv_heads 4, vocab_size 512, seq_len 512");
  CHECK(std::string(load(tmp / "missing.bin", m).message()) == (tmp / "missing.bin").string() + ": cannot open (No such file or directory)");

  tokenizer tk;
  const std::string tok_bytes = read_text(dir / "tok512.bin");
  const fs::path tcut = write("tok.bin", tok_bytes.substr(0, 3000));
  const skim::status s = tokenizer::load(tcut, 512, tk);
  CHECK_FALSE(s.ok());
  CHECK(std::string(s.message()).starts_with(tcut.string() + ": "));
  CHECK(std::string(tokenizer::load(dir / "tok512.bin", 500, tk).message()).find("bytes after the last token") != std::string::npos);
  fs::remove_all(tmp);
}

// The loaders on in-memory files (no checkpoint needed): a micro model and tokenizer built
// here, then one bad field at a time.
namespace {

// v's bytes appended (resize + memcpy: g++ 12 at -O3 misreads an insert from a local's address as
// an overflow, -Wstringop-overflow).
template <class T>
void put(std::vector<std::byte>& out, T v) {
  const std::size_t at = out.size();
  out.resize(at + sizeof v);
  std::memcpy(out.data() + at, &v, sizeof v);
}

std::vector<std::byte> micro_model(std::array<std::int32_t, 7> h, std::size_t floats) {
  std::vector<std::byte> b;
  for (const std::int32_t v : h) put(b, v);
  for (std::size_t i = 0; i < floats; ++i) put(b, static_cast<float>(i));
  return b;
}

// dim 8, hidden 12, 1 layer, 2 heads (head dim 4), 1 kv head, vocab 5, seq_len 3.
constexpr std::array<std::int32_t, 7> micro_header{8, 12, 1, 2, 1, 5, 3};
constexpr std::size_t micro_floats = 5 * 8 + (8 + 8 * 8 + 2 * 8 * 4 + 8 * 8) + (8 + 3 * 8 * 12) + 8 + 3 * 4;

std::string message(const skim::status& s) { return s.ok() ? "ok" : s.message(); }

struct token_entry {
  float score;
  std::string piece;
  std::int32_t length;  // as written; normally piece.size()
};

std::vector<token_entry> micro_vocab() {
  std::vector<token_entry> v = {{0, "<unk>", 5}, {0, "\n<s>\n", 5}, {0, "\n</s>\n", 6}};
  for (int b = 0; b < 256; ++b) v.push_back({0, tokenizer::byte_piece(b), 6});
  for (const char* p : {" ", "a", "b", "ab", " ab"}) v.push_back({-static_cast<float>(v.size()), p, static_cast<std::int32_t>(std::strlen(p))});
  return v;
}

std::vector<std::byte> tokenizer_file(std::int32_t max_len, const std::vector<token_entry>& v) {
  std::vector<std::byte> b;
  put(b, max_len);
  for (const token_entry& t : v) {
    put(b, t.score);
    put(b, t.length);
    for (const char c : t.piece) b.push_back(static_cast<std::byte>(c));
  }
  return b;
}

}  // namespace

TEST_CASE("llama: parse() reads a micro checkpoint from memory") {
  const std::vector<std::byte> b = micro_model(micro_header, micro_floats);
  model m;
  REQUIRE(message(parse(b, m, "micro.bin")) == "ok");
  CHECK(m.cfg.dim == 8);
  CHECK(m.cfg.kv_dim() == 4);
  CHECK(m.storage.size() == micro_floats);
  REQUIRE(m.layers.size() == 1);
  CHECK(m.token_embedding.data() == m.storage.data());
  CHECK(m.layers[0].rms_att[0] == 40.0f);  // right after the 5 × 8 embedding
  CHECK(m.classifier.data() == m.token_embedding.data());
  CHECK(m.rms_final.data() + 8 + 12 == m.storage.data() + m.storage.size());  // then the RoPE tables
}

TEST_CASE("llama: parse() rejects truncated, padded and out-of-range checkpoints") {
  model m;
  const std::vector<std::byte> good = micro_model(micro_header, micro_floats);
  std::vector<std::byte> b(good.begin(), good.end() - 4);
  CHECK(message(parse(b, m, "cut.bin")) == "cut.bin: file holds 2248 bytes, header (dim 8, 1 layers, vocab 5) needs 2252");
  b = good;
  b.push_back(std::byte{0});
  CHECK(message(parse(b, m, "pad.bin")) == "pad.bin: file holds 2253 bytes, header (dim 8, 1 layers, vocab 5) needs 2252");
  auto h = micro_header;
  h[5] = -5;  // a separate classifier: 40 floats more
  CHECK(message(parse(micro_model(h, micro_floats + 40), m, "own.bin")) == "ok");
  CHECK_FALSE(m.cfg.shared_classifier);
  CHECK(m.classifier.data() == m.storage.data() + micro_floats);
  CHECK(message(parse(micro_model(h, micro_floats), m, "own.bin")) ==
        "own.bin: file holds 2252 bytes, header (dim 8, 1 layers, vocab 5, own classifier) needs 2412");
  h = micro_header;
  h[5] = std::numeric_limits<std::int32_t>::min();
  CHECK(message(parse(micro_model(h, 0), m, "min.bin")) ==
        "min.bin: bad header: dim 8, hidden_dim 12, n_layers 1, n_heads 2, n_kv_heads 1, vocab_size -2147483648, seq_len 3");
  h = micro_header;
  h[1] = (1 << 20) + 1;
  CHECK(message(parse(micro_model(h, 0), m, "big.bin")) ==
        "big.bin: bad header: dim 8, hidden_dim 1048577, n_layers 1, n_heads 2, n_kv_heads 1, vocab_size 5, seq_len 3");
  h = micro_header;
  h[3] = 8;  // head dim 1: odd
  CHECK(message(parse(micro_model(h, 0), m, "odd.bin")) ==
        "odd.bin: bad header: dim 8, n_heads 8, n_kv_heads 1 (need heads | dim, kv_heads | heads, even head dim)");
}

TEST_CASE("llama: weight_floats() saturates instead of wrapping") {
  constexpr std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
  // n_kv_heads > n_heads (rejected after the count): 2 × dim × kv × layers is 2^81.
  CHECK(weight_floats({.dim = 1 << 20, .hidden_dim = 1, .n_layers = 1 << 20, .n_heads = 1, .n_kv_heads = 1 << 20,
                       .vocab_size = 1, .seq_len = 1}) == max);
  // Every dimension at its cap still counts exactly.
  const config top{.dim = 1 << 20, .hidden_dim = 1 << 20, .n_layers = 1 << 20, .n_heads = 1 << 20, .n_kv_heads = 1 << 20,
                   .vocab_size = 1 << 20, .seq_len = 1 << 20};
  CHECK(weight_floats(top) == (1ull << 40) + (1ull << 20) * ((1ull << 20) + 4 * (1ull << 40) + (1ull << 20) + 3 * (1ull << 40)) +
                                  (1ull << 20) + (1ull << 20));
}

TEST_CASE("llama: a header whose byte count passes 2^64 is rejected, not wrapped to the file size") {
  // 2^62 + 1048580 floats: 28 + 4 × that wrapped to 4194348, so a 4 MB file of this header
  // was accepted and storage.resize(2^62 + ...) threw.
  const std::array<std::int32_t, 7> h{1 << 20, 950273, 624268, 1 << 19, 1 << 19, 417604, 2};
  const config c{.dim = h[0], .hidden_dim = h[1], .n_layers = h[2], .n_heads = h[3], .n_kv_heads = h[4], .vocab_size = h[5],
                 .seq_len = h[6]};
  CHECK(weight_floats(c) == (1ull << 62) + 1048580);
  std::vector<std::byte> b(4194348);
  std::memcpy(b.data(), h.data(), 28);
  model m;
  CHECK(message(parse(b, m, "wrap.bin")) ==
        "wrap.bin: file holds 4194348 bytes, header (dim 1048576, 624268 layers, vocab 417604) needs over 2^64");
  CHECK(m.storage.empty());
}

TEST_CASE("llama: tokenizer::parse() reads a micro tokenizer from memory") {
  const std::vector<token_entry> v = micro_vocab();
  tokenizer tk;
  REQUIRE(message(tokenizer::parse(tokenizer_file(6, v), static_cast<int>(v.size()), tk, "tok.bin")) == "ok");
  CHECK(tk.vocab_size() == 264);
  CHECK(tk.piece(3 + 'A') == "<0x41>");
  CHECK(tk.find(" ab") == 263);
  CHECK(tk.encode("ab") == std::vector<int>{tokenizer::bos, 263});
  CHECK(tk.encode("b\xc3\xa9") == std::vector<int>{tokenizer::bos, 259, 261, 3 + 0xc3, 3 + 0xa9});
  CHECK(tk.decode(tk.encode("b\xc3\xa9")) == "b\xc3\xa9");
}

TEST_CASE("llama: tokenizer::parse() names the bad value of a malformed file") {
  const std::vector<token_entry> good = micro_vocab();
  const int n = static_cast<int>(good.size());
  tokenizer tk;
  const auto parse_with = [&](std::int32_t max_len, const std::vector<token_entry>& v, int vocab = 264) {
    return message(tokenizer::parse(tokenizer_file(max_len, v), vocab, tk, "t.bin"));
  };
  // Below 259 tokens encode() would index byte pieces past the vocabulary.
  CHECK(parse_with(6, {good.begin(), good.begin() + 100}, 100) == "t.bin: bad vocab_size, need 259 or more (vocab_size, file bytes) (100, 1402)");
  CHECK(parse_with(6, good, 265) == "t.bin: truncated token entry (token, offset) (264, 3676)");
  // A huge vocab_size is rejected before vocab_size pieces are allocated.
  CHECK(parse_with(6, good, std::numeric_limits<std::int32_t>::max()) ==
        "t.bin: file too short for vocab_size tokens of 8 bytes or more (vocab_size, file bytes) (2147483647, 3676)");
  CHECK(parse_with(6, good, 460) ==
        "t.bin: file too short for vocab_size tokens of 8 bytes or more (vocab_size, file bytes) (460, 3676)");
  CHECK(parse_with(6, good, 459) == "t.bin: truncated token entry (token, offset) (264, 3676)");
  CHECK(parse_with(6, good, 263) == "t.bin: bytes after the last token (vocab_size, extra bytes) (263, 11)");
  CHECK(parse_with(0, good) == "t.bin: bad max_token_length (value, file bytes) (0, 3676)");
  CHECK(parse_with(-1, good) == "t.bin: bad max_token_length (value, file bytes) (-1, 3676)");
  CHECK(parse_with(5000, good) == "t.bin: bad max_token_length (value, file bytes) (5000, 3676)");
  CHECK(parse_with(5, good) == "t.bin: token length over max_token_length (token, length) (2, 6)");
  std::vector<token_entry> v = good;
  v[7].score = std::numeric_limits<float>::quiet_NaN();
  CHECK(parse_with(6, v) == "t.bin: score is NaN or infinite (token, score bits) (7, 2143289344)");
  v = good;
  v[260].score = -std::numeric_limits<float>::infinity();
  CHECK(parse_with(6, v) == "t.bin: score is NaN or infinite (token, score bits) (260, 4286578688)");
  v = good;
  v[1].length = -1;
  CHECK(parse_with(6, v) == "t.bin: bad token length (token, length) (1, -1)");
  v = good;
  v.back().length = std::numeric_limits<std::int32_t>::max();
  CHECK(parse_with(6, v) == "t.bin: bad token length (token, length) (263, 2147483647)");
  v = good;
  v[3 + 'A'].piece = "<0x61>";
  CHECK(parse_with(6, v) == "t.bin: not the byte piece <0xHH> its id needs (token, length) (68, 6)");
  const std::vector<std::byte> whole = tokenizer_file(6, good);
  CHECK(message(tokenizer::parse(std::span(whole).first(2), n, tk, "t.bin")) ==
        "t.bin: too short for max_token_length (file bytes, needed) (2, 4)");
  CHECK(message(tokenizer::parse(std::span(whole).first(whole.size() - 1), n, tk, "t.bin")) ==
        "t.bin: bad token length (token, length) (263, 3)");
  CHECK(tk.vocab_size() == 0);  // every failure left it as it was
}
