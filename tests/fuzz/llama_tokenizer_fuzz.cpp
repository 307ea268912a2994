// Fuzz target: skim-llama's llama2.c tokenizer loader (examples/llama/tokenizer.hpp,
// tokenizer::parse()) on arbitrary bytes, then encode() and decode() on what it accepts.
//
// Input: one byte choosing vocab_size (250 + b for b < 240, so 250..489 with the byte-piece
// floor of 259 inside; a hostile value otherwise), then the tokenizer file. parse() must never
// read outside its span or crash, and an error must carry a message naming the input and leave
// the tokenizer as it was. An accepted file must give exactly vocab_size tokens whose scores are
// finite and whose pieces are, in order, the length-prefixed byte runs of the file (re-read here
// independently), each at most max_token_length long, with ids 3..258 the byte pieces; then
// encoding the file's own bytes and a few fixed texts must give ids inside the vocabulary, BOS
// and EOS where asked, and decode() must take them back without failing.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../../examples/llama/tokenizer.hpp"
#include "fuzz_input.hpp"

namespace {

using skim_llama::tokenizer;

void check_encode(const tokenizer& tk, std::string_view text) {
  const int n = tk.vocab_size();
  for (const bool bos : {false, true}) {
    const std::vector<int> ids = tk.encode(text, bos, !bos);
    SKIM_FUZZ_CHECK(!ids.empty() || text.empty(), "no ids for %zu bytes of text", text.size());
    if (bos) SKIM_FUZZ_CHECK(ids.front() == tokenizer::bos, "no BOS first");
    if (!bos) SKIM_FUZZ_CHECK(!ids.empty() && ids.back() == tokenizer::eos, "no EOS last");
    for (const int id : ids) SKIM_FUZZ_CHECK(id >= 0 && id < n, "id %d outside the vocabulary of %d", id, n);
    (void)tk.decode(ids);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  constexpr std::array<int, 16> hostile = {0, -1, std::numeric_limits<int>::min(), std::numeric_limits<int>::max(), 1,
                                           3, 258, 259, 260, 1 << 20, 1 << 30, 511, 512, 1000, 4096, -259};
  const int vocab = data[0] < 240 ? 250 + data[0] : hostile[data[0] - 240];
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data + 1), size - 1);
  tokenizer tk;
  const skim::status s = tokenizer::parse(bytes, vocab, tk, "fuzz.tok");
  if (!s.ok()) {
    SKIM_FUZZ_CHECK(std::string_view(s.message()).starts_with("fuzz.tok: "), "message without the name: %s", s.message());
    SKIM_FUZZ_CHECK(tk.vocab_size() == 0, "a rejected file filled the tokenizer");
    return 0;
  }
  SKIM_FUZZ_CHECK(vocab >= 259 && tk.vocab_size() == vocab, "vocab_size %d, asked for %d", tk.vocab_size(), vocab);

  // Re-read the file: every piece must be its run of bytes, in order, and nothing may follow.
  const std::uint8_t* p = data + 1;
  const std::size_t n = size - 1;
  const auto i32 = [&](std::size_t at) {
    std::int32_t v = 0;
    SKIM_FUZZ_CHECK(at + 4 <= n, "read past the file at %zu", at);
    std::memcpy(&v, p + at, 4);
    return v;
  };
  const std::int32_t max_len = i32(0);
  SKIM_FUZZ_CHECK(max_len >= 1, "max_token_length %d", max_len);
  std::size_t at = 4;
  for (int i = 0; i < vocab; ++i) {
    const std::int32_t score_bits = i32(at), len = i32(at + 4);
    at += 8;
    SKIM_FUZZ_CHECK(len >= 0 && len <= max_len && at + static_cast<std::size_t>(len) <= n, "token %d: length %d", i, len);
    const std::string& piece = tk.piece(i);
    SKIM_FUZZ_CHECK(piece.size() == static_cast<std::size_t>(len) && std::memcmp(piece.data(), p + at, piece.size()) == 0,
                    "token %d: piece differs from the file", i);
    at += piece.size();
    float score = 0;
    std::memcpy(&score, &score_bits, 4);
    SKIM_FUZZ_CHECK(std::isfinite(score) && std::memcmp(&score, &score_bits, 4) == 0 && tk.score(i) == score,
                    "token %d: score", i);
    if (i >= tokenizer::byte_offset && i < tokenizer::byte_offset + 256) {
      SKIM_FUZZ_CHECK(piece == tokenizer::byte_piece(i - tokenizer::byte_offset) &&
                          tk.decode(0, i) == std::string(1, static_cast<char>(i - tokenizer::byte_offset)),
                      "token %d is not its byte piece", i);
    }
    SKIM_FUZZ_CHECK(tk.find(piece) >= 0 && tk.find(piece) <= i && tk.piece(tk.find(piece)) == piece, "token %d: find()", i);
  }
  SKIM_FUZZ_CHECK(at == n, "%zu bytes after the last token accepted", n - at);

  check_encode(tk, std::string_view(reinterpret_cast<const char*>(data), std::min<std::size_t>(size, 1024)));
  constexpr std::array<std::string_view, 8> texts = {
      "", " ", "a", "ab", "hello world", "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", "\xff\xfe\x80 <0x41>", std::string_view("\0x\0", 3)};
  for (const std::string_view text : texts) check_encode(tk, text);
  return 0;
}
