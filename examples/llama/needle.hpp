#pragma once
// skim_llama needles — retrieval prompts over real text, for `skim-llama needle` and the tests.
//
// A needle is one line `#define KEY_xxxx "vvvvvvvv"` (xxxx: 4 random upper-case letters or digits,
// vvvvvvvv: 8 random letters or digits, both from a seeded generator) planted at a depth of a
// haystack of real text; the prompt ends with the line's prefix `#define KEY_xxxx "` on a line of
// its own, and a model that retrieves answers with the value. kcode18M was trained on such lines.
//
// The haystack is a run of tokens of a corpus split into files at form-feed lines (the held-out
// kernel_val.c.txt: each file encoded on its own, starting with BOS, as in training). Lines are
// spliced at newline tokens: the tokenizer never merges a newline with its neighbours (it is a
// byte token), so the needle's tokens are those of the line encoded alone and the haystack's are
// unchanged. Layout of a prompt of `length` tokens:
//   BOS, haystack[0, p), needle line + "\n", haystack[p, h), "\n", question
// where p is the first line start at or after depth × h, and h fills the length.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "llama/tokenizer.hpp"

namespace skim_llama {

// The corpus as one token stream: every file's tokens, each file starting with BOS.
struct corpus {
  std::vector<int> tokens;
  int newline = -1;  // the newline's token

  [[nodiscard]] static corpus encode(const tokenizer& tok, std::string_view text) {
    corpus c;
    c.newline = tok.find("\n") >= 0 ? tok.find("\n") : '\n' + tokenizer::byte_offset;
    std::size_t at = 0;
    while (at < text.size()) {
      std::size_t end = text.find("\f\n", at);
      if (end == std::string_view::npos) end = text.size();
      if (end > at) {
        const std::vector<int> ids = tok.encode(text.substr(at, end - at), true);
        c.tokens.insert(c.tokens.end(), ids.begin(), ids.end());
      }
      at = end + 2;
    }
    return c;
  }
};

// The tokens of `line` as they appear after a newline: the line is encoded behind one, and the
// tokens after it are kept (so no dummy prefix or BOS leaks in).
[[nodiscard]] inline std::vector<int> line_tokens(const tokenizer& tok, int newline, const std::string& line) {
  const std::vector<int> ids = tok.encode("x\n" + line, false);
  const auto nl = std::find(ids.begin(), ids.end(), newline);
  return nl == ids.end() ? std::vector<int>{} : std::vector<int>(nl + 1, ids.end());
}

struct needle {
  std::string key, value;
  int length = 0;        // prompt tokens
  double depth = 0.0;    // requested depth of the needle in the haystack
  int needle_at = 0;     // token position of the needle line in the prompt
  std::vector<int> prompt;
  std::vector<int> question;  // the prompt's last tokens, `#define KEY_xxxx "` (decoded one by one in decode mode)

  // The distance from the needle to the end of the prompt, in tokens.
  [[nodiscard]] int distance() const { return length - needle_at; }
  // Whether a greedy answer (decoded text) is the value: the value's characters, then the quote.
  [[nodiscard]] bool found(std::string_view answer) const { return answer.starts_with(value + "\""); }
};

// Builds a needle prompt of `length` tokens at `depth` in [0, 1] from corpus text starting at a
// random line, or nothing if the corpus is too short. Deterministic for a given generator state.
[[nodiscard]] inline std::optional<needle> make_needle(const tokenizer& tok, const corpus& c, int length, double depth,
                                                      std::mt19937_64& rng) {
  static constexpr std::string_view key_chars = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  static constexpr std::string_view value_chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  needle n;
  n.length = length;
  n.depth = depth;
  for (int i = 0; i < 4; ++i) n.key += key_chars[rng() % key_chars.size()];
  for (int i = 0; i < 8; ++i) n.value += value_chars[rng() % value_chars.size()];
  const std::string prefix = "#define KEY_" + n.key + " \"";
  std::vector<int> line = line_tokens(tok, c.newline, prefix + n.value + "\"");
  line.push_back(c.newline);
  n.question = line_tokens(tok, c.newline, prefix);
  const int hay = length - 1 - static_cast<int>(line.size()) - 1 - static_cast<int>(n.question.size());
  if (hay < 16 || c.tokens.size() < static_cast<std::size_t>(hay) + 2) return std::nullopt;
  // A random line start with `hay` tokens after it.
  std::size_t start = rng() % (c.tokens.size() - static_cast<std::size_t>(hay) - 1);
  while (start > 0 && c.tokens[start - 1] != c.newline && c.tokens[start - 1] != tokenizer::bos) --start;
  const std::span<const int> h = std::span<const int>(c.tokens).subspan(start, static_cast<std::size_t>(hay));
  auto p = static_cast<std::size_t>(depth * hay);
  while (p < h.size() && p > 0 && h[p - 1] != c.newline) ++p;
  n.prompt.push_back(tokenizer::bos);
  n.prompt.insert(n.prompt.end(), h.begin(), h.begin() + static_cast<std::ptrdiff_t>(p));
  n.needle_at = static_cast<int>(n.prompt.size());
  n.prompt.insert(n.prompt.end(), line.begin(), line.end());
  n.prompt.insert(n.prompt.end(), h.begin() + static_cast<std::ptrdiff_t>(p), h.end());
  n.prompt.push_back(c.newline);
  n.prompt.insert(n.prompt.end(), n.question.begin(), n.question.end());
  return n;
}

}  // namespace skim_llama
