#pragma once
// skim_llama::tokenizer — llama2.c's BPE tokenizer (SentencePiece-style pieces with byte fallback).
//
// File layout: int32 max_token_length, then per token (vocab_size of them, taken from the
// model's config): float score, int32 length, `length` bytes. Ids 0, 1, 2 are <unk>, <s>
// (BOS), </s> (EOS); ids 3..258 are the byte pieces "<0x00>".."<0xFF>".
//
// encode() gives exactly llama2.c's result (its encode(): dummy " " prefix, UTF-8 code points
// looked up whole or split into byte tokens, then repeatedly merge the adjacent pair whose
// merged piece has the best score, the leftmost on ties), but keeps candidate pairs in a
// heap, so a long text costs O(n log n) instead of llama2.c's O(n^2) rescans.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <queue>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../common/read_file.hpp"
#include "skim/core/status.hpp"

namespace skim_llama {

class tokenizer {
 public:
  static constexpr int bos = 1;
  static constexpr int eos = 2;
  static constexpr int byte_offset = 3;  // id of the byte piece <0x00>

  // Reads a tokenizer file; messages name `path` as given. See parse() for the checks.
  [[nodiscard]] static skim::status load(const std::filesystem::path& path, int vocab_size, tokenizer& out) {
    std::vector<std::byte> bytes;
    SKIM_TRY(skim::examples::read_file(path, bytes));
    return parse(bytes, vocab_size, out, path.string());
  }

  // Parses an in-memory tokenizer file of `vocab_size` tokens (from the model's config);
  // `name` labels messages. Rejects, naming the bad value: a vocab_size below 259 (the byte
  // pieces need ids 3..258: encode() falls back to them), a max_token_length outside
  // [1, file bytes], a file too short for vocab_size entries of 8 bytes, a truncated entry, a
  // score that is NaN or infinite, a length that is negative, past the end of the file or over
  // max_token_length, ids 3..258 that are not the byte pieces "<0x00>".."<0xFF>", and bytes
  // after the last token. Never reads outside `bytes`; on an error `out` is left as it was.
  [[nodiscard]] static skim::status parse(std::span<const std::byte> bytes, int vocab_size, tokenizer& out,
                                          const std::string& name) {
    const auto fail = [&](const char* what, long long a, long long b) {
      return skim::status::error(skim::status_code::invalid_argument, "%s: %s (%lld, %lld)", name.c_str(), what, a, b);
    };
    const std::string_view raw(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    const auto file_bytes = static_cast<long long>(raw.size());
    std::size_t at = 0;
    const auto read_i32 = [&](std::int32_t& v) {
      if (raw.size() - at < 4) return false;
      std::memcpy(&v, raw.data() + at, 4);
      at += 4;
      return true;
    };
    if (vocab_size < byte_offset + 256) return fail("bad vocab_size, need 259 or more (vocab_size, file bytes)", vocab_size, file_bytes);
    std::int32_t max_len = 0;
    if (!read_i32(max_len)) return fail("too short for max_token_length (file bytes, needed)", file_bytes, 4);
    if (max_len <= 0 || max_len > file_bytes) return fail("bad max_token_length (value, file bytes)", max_len, file_bytes);
    // Each entry takes 8 bytes or more: check before allocating vocab_size pieces.
    if (static_cast<std::uint64_t>(vocab_size) > (raw.size() - 4) / 8) {
      return fail("file too short for vocab_size tokens of 8 bytes or more (vocab_size, file bytes)", vocab_size, file_bytes);
    }
    tokenizer t;
    t.max_token_length_ = max_len;
    t.pieces_.assign(static_cast<std::size_t>(vocab_size), {});
    t.scores_.assign(static_cast<std::size_t>(vocab_size), 0.0f);
    for (int i = 0; i < vocab_size; ++i) {
      std::int32_t score_bits = 0, len = 0;
      const auto entry = static_cast<long long>(at);
      if (!read_i32(score_bits) || !read_i32(len)) return fail("truncated token entry (token, offset)", i, entry);
      float score = 0;
      std::memcpy(&score, &score_bits, 4);
      if (!std::isfinite(score)) return fail("score is NaN or infinite (token, score bits)", i, static_cast<std::uint32_t>(score_bits));
      if (len < 0 || static_cast<std::size_t>(len) > raw.size() - at) return fail("bad token length (token, length)", i, len);
      if (len > max_len) return fail("token length over max_token_length (token, length)", i, len);
      t.scores_[i] = score;
      t.pieces_[i].assign(raw.substr(at, static_cast<std::size_t>(len)));
      at += static_cast<std::size_t>(len);
      if (i >= byte_offset && i < byte_offset + 256 && t.pieces_[i] != byte_piece(i - byte_offset)) {
        return fail("not the byte piece <0xHH> its id needs (token, length)", i, len);
      }
      t.ids_.emplace(t.pieces_[i], i);  // duplicates keep the lowest id
    }
    if (at != raw.size()) return fail("bytes after the last token (vocab_size, extra bytes)", vocab_size, static_cast<long long>(raw.size() - at));
    out = std::move(t);
    return skim::status::success();
  }

  // The byte piece of byte b: "<0x41>" for 'A' (uppercase hex, as llama2.c and SentencePiece).
  [[nodiscard]] static std::string byte_piece(int b) {
    constexpr char hex[] = "0123456789ABCDEF";
    return {'<', '0', 'x', hex[(b >> 4) & 15], hex[b & 15], '>'};
  }

  [[nodiscard]] int vocab_size() const { return static_cast<int>(pieces_.size()); }
  [[nodiscard]] const std::string& piece(int id) const { return pieces_.at(static_cast<std::size_t>(id)); }
  [[nodiscard]] float score(int id) const { return scores_.at(static_cast<std::size_t>(id)); }
  [[nodiscard]] int find(std::string_view piece) const {
    const auto it = ids_.find(std::string(piece));
    return it == ids_.end() ? -1 : it->second;
  }

  // The text of `token` when it follows `prev` (llama2.c's decode()): a leading space is
  // dropped right after BOS, and byte pieces "<0xHH>" become the byte. An id outside the
  // vocabulary decodes to nothing.
  [[nodiscard]] std::string decode(int prev, int token) const {
    if (token < 0 || token >= vocab_size()) return {};
    std::string_view p = piece(token);
    if (prev == bos && !p.empty() && p.front() == ' ') p.remove_prefix(1);
    if (p.size() == 6 && p.starts_with("<0x") && p.back() == '>') {
      const auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; };
      const int hi = hex(p[3]), lo = hex(p[4]);
      if (hi >= 0 && lo >= 0) return std::string(1, static_cast<char>(hi * 16 + lo));
    }
    return std::string(p);
  }

  // Decodes a token sequence; the first token is decoded as if it followed BOS.
  [[nodiscard]] std::string decode(std::span<const int> tokens) const {
    std::string s;
    int prev = bos;
    for (const int t : tokens) {
      if (t != bos) s += decode(prev, t);
      prev = t;
    }
    return s;
  }

  // llama2.c's encode(text, bos, eos).
  [[nodiscard]] std::vector<int> encode(std::string_view text, bool add_bos = true, bool add_eos = false) const {
    std::vector<int> ids;
    if (add_bos) ids.push_back(bos);
    if (!text.empty() && find(" ") >= 0) ids.push_back(find(" "));  // add_dummy_prefix
    // Code points (at most 4 bytes each) as pieces, or their bytes as byte tokens.
    std::string cp;
    for (std::size_t i = 0; i < text.size(); ++i) {
      if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) cp.clear();
      cp += text[i];
      const bool continues = i + 1 < text.size() && (static_cast<unsigned char>(text[i + 1]) & 0xC0) == 0x80;
      if (continues && cp.size() < 4) continue;
      if (const int id = find(cp); id >= 0) {
        ids.push_back(id);
      } else {
        for (const char c : cp) ids.push_back(static_cast<unsigned char>(c) + byte_offset);
      }
      cp.clear();
    }
    merge_pairs(ids);
    if (add_eos) ids.push_back(eos);
    return ids;
  }

 private:
  // A candidate merge of the symbols at positions left and right (right follows left).
  struct candidate {
    float score;
    int left, right;
    int left_id, right_id;  // the ids when pushed: a later merge of either side makes it stale
    int merged_id;
    bool operator<(const candidate& o) const {  // max-heap: best score, then leftmost
      return score != o.score ? score < o.score : left > o.left;
    }
  };

  void merge_pairs(std::vector<int>& ids) const {
    const int n = static_cast<int>(ids.size());
    std::vector<int> next(n), prev(n);
    for (int i = 0; i < n; ++i) next[i] = i + 1, prev[i] = i - 1;  // next == n: end
    std::priority_queue<candidate> heap;
    const auto push = [&](int l, int r) {
      if (l < 0 || r >= n) return;
      const std::string& a = pieces_[ids[l]];
      const std::string& b = pieces_[ids[r]];
      if (static_cast<int>(a.size() + b.size()) > max_token_length_) return;
      const int m = find(a + b);
      if (m >= 0 && scores_[m] > -1e10f) heap.push({scores_[m], l, r, ids[l], ids[r], m});  // -1e10: llama2.c's floor
    };
    for (int i = 0; i + 1 < n; ++i) push(i, i + 1);
    while (!heap.empty()) {
      const candidate c = heap.top();
      heap.pop();
      if (ids[c.left] != c.left_id || ids[c.right] != c.right_id || next[c.left] != c.right) continue;  // stale
      ids[c.left] = c.merged_id;
      ids[c.right] = -1;  // dead
      next[c.left] = next[c.right];
      if (next[c.left] < n) prev[next[c.left]] = c.left;
      push(prev[c.left], c.left);
      push(c.left, next[c.left]);
    }
    std::erase(ids, -1);
  }

  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int> ids_;
  int max_token_length_ = 0;
};

}  // namespace skim_llama
