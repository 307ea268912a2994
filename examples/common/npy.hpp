#pragma once
// skim::npy — read and write NumPy .npy files (the format of numpy.save).
//
// Reader contract:
//  - versions 1.0, 2.0 and 3.0; the header dict must hold exactly the keys 'descr',
//    'fortran_order' and 'shape' (in any order, as numpy writes them or by hand);
//  - descr '<f4' (float32) or '<f2' (float16, widened to float); C order only;
//  - the data must be exactly as long as the shape needs: a shorter file and a file with
//    bytes after the data are both errors. Trailing bytes are refused on purpose: they are
//    almost always a writer that disagrees with its own header (wrong dtype or shape), and
//    silently ignoring them would feed the wrong numbers to skim-eval.
//  - every malformed input gives a skim::status naming the file and the problem, e.g.
//    "q.npy: data holds 96 bytes, shape [4, 2, 8] of <f4 needs 256". parse() reads nothing
//    outside its span and allocates at most the float equivalent of the bytes it was given,
//    so it is safe on hostile input (the fuzz entry point).
//
// Writer: float32, C order, any shape (0-d included), version 1.0 (2.0 if the header needs
// more than 65535 bytes), header padded so the data starts on a 64-byte boundary.

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "read_file.hpp"
#include "skim/core/dtypes.hpp"
#include "skim/core/status.hpp"

namespace skim::npy {

// A dense C-order float array.
struct array {
  std::vector<std::int64_t> shape;  // [ndim]; empty for a 0-d (scalar) array
  std::vector<float> data;          // [product of shape]
};

namespace detail {

inline constexpr std::array<unsigned char, 6> magic = {0x93, 'N', 'U', 'M', 'P', 'Y'};
inline constexpr int max_dims = 64;  // numpy's NPY_MAXDIMS (newer numpy allows more; none here)

// Text of a shape for messages: "[4, 2, 8]".
inline std::string shape_text(std::span<const std::int64_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

inline std::uint32_t load_le(const std::byte* p, int bytes) noexcept {
  std::uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | std::to_integer<std::uint32_t>(p[i]);
  return v;
}

// Recursive-descent reader of the header dict, a Python literal such as
// {'descr': '<f4', 'fortran_order': False, 'shape': (4, 2, 8), }
// Every method stays inside `text`; errors are reported through `error`.
struct dict_reader {
  std::string_view text;
  std::size_t pos = 0;
  std::string error;  // empty while all is well

  bool fail(std::string what) {
    if (error.empty()) error = std::move(what) + " at header offset " + std::to_string(pos);
    return false;
  }
  void skip_space() {
    while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\t' || text[pos] == '\n' || text[pos] == '\r')) ++pos;
  }
  bool peek(char c) {
    skip_space();
    return pos < text.size() && text[pos] == c;
  }
  bool expect(char c) {
    if (!peek(c)) return fail(std::string("expected '") + c + "'");
    ++pos;
    return true;
  }
  bool read_string(std::string& out) {
    skip_space();
    if (pos >= text.size() || (text[pos] != '\'' && text[pos] != '"')) return fail("expected a quoted string");
    const char quote = text[pos++];
    const std::size_t end = text.find(quote, pos);
    if (end == std::string_view::npos) return fail("unterminated string");
    out.assign(text.substr(pos, end - pos));
    if (out.find('\\') != std::string::npos) return fail("escape sequences are not supported in strings");
    pos = end + 1;
    return true;
  }
  bool read_bool(bool& out) {
    skip_space();
    for (const auto& [word, value] : {std::pair{std::string_view("True"), true}, std::pair{std::string_view("False"), false}}) {
      if (text.substr(pos, word.size()) == word) {
        pos += word.size();
        out = value;
        return true;
      }
    }
    return fail("expected True or False");
  }
  // A non-negative integer that fits int64 (a Python 2 'L' suffix is accepted).
  bool read_dim(std::int64_t& out) {
    skip_space();
    if (pos < text.size() && text[pos] == '-') return fail("negative dimension");
    if (pos >= text.size() || text[pos] < '0' || text[pos] > '9') return fail("expected a dimension");
    std::int64_t v = 0;
    while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
      const int digit = text[pos] - '0';
      if (v > (std::numeric_limits<std::int64_t>::max() - digit) / 10) return fail("dimension overflows int64");
      v = v * 10 + digit;
      ++pos;
    }
    if (pos < text.size() && text[pos] == 'L') ++pos;
    out = v;
    return true;
  }
  // (), (n,), (a, b), (a, b,)
  bool read_shape(std::vector<std::int64_t>& out) {
    if (!expect('(')) return false;
    out.clear();
    while (!peek(')')) {
      if (static_cast<int>(out.size()) == max_dims) return fail("more than 64 dimensions");
      std::int64_t d = 0;
      if (!read_dim(d)) return false;
      out.push_back(d);
      if (peek(',')) {
        ++pos;
      } else if (!peek(')')) {
        return fail("expected ',' or ')' in shape");
      }
    }
    ++pos;  // ')'
    return true;
  }
};

}  // namespace detail

// Parses an in-memory .npy file; `name` only labels messages.
// @post on success `out` holds the array; on failure `out` is unspecified.
[[nodiscard]] inline status parse(std::span<const std::byte> bytes, array& out, std::string_view name = "<memory>") {
  const auto err = [&](const std::string& what) {
    return status::error(status_code::invalid_argument, "%.*s: %s", static_cast<int>(name.size()), name.data(), what.c_str());
  };
  const std::size_t size = bytes.size();
  const std::size_t magic_len = detail::magic.size();
  for (std::size_t i = 0; i < magic_len && i < size; ++i) {
    if (std::to_integer<unsigned char>(bytes[i]) != detail::magic[i]) return err("bad magic (not a .npy file)");
  }
  if (size < magic_len + 2) return err("truncated: " + std::to_string(size) + " bytes, shorter than the .npy preamble");
  const int major = std::to_integer<int>(bytes[6]);
  const int minor = std::to_integer<int>(bytes[7]);
  if (major < 1 || major > 3 || minor != 0) {
    return err("unsupported .npy version " + std::to_string(major) + "." + std::to_string(minor) + " (need 1.0, 2.0 or 3.0)");
  }
  const int len_bytes = major == 1 ? 2 : 4;
  const std::size_t preamble = magic_len + 2 + static_cast<std::size_t>(len_bytes);
  if (size < preamble) return err("truncated: " + std::to_string(size) + " bytes, shorter than the .npy preamble");
  const std::size_t header_len = detail::load_le(bytes.data() + magic_len + 2, len_bytes);
  if (header_len > size - preamble) {
    return err("header length " + std::to_string(header_len) + " reaches beyond the file (" + std::to_string(size - preamble) +
               " bytes after the preamble)");
  }
  const std::string_view header(reinterpret_cast<const char*>(bytes.data() + preamble), header_len);

  // The dict, then only whitespace (numpy pads with spaces and ends with '\n').
  detail::dict_reader r{.text = header, .pos = 0, .error = {}};
  std::string descr;
  bool fortran = false;
  std::vector<std::int64_t> shape;
  bool seen_descr = false, seen_fortran = false, seen_shape = false;
  if (r.expect('{')) {
    while (!r.peek('}') && r.error.empty()) {
      std::string key;
      if (!r.read_string(key) || !r.expect(':')) break;
      bool* seen = key == "descr" ? &seen_descr : key == "fortran_order" ? &seen_fortran : key == "shape" ? &seen_shape : nullptr;
      if (!seen) {
        r.fail("unknown key '" + key + "'");
        break;
      }
      if (*seen) {
        r.fail("duplicate key '" + key + "'");
        break;
      }
      *seen = true;
      const bool ok = key == "descr" ? r.read_string(descr) : key == "fortran_order" ? r.read_bool(fortran) : r.read_shape(shape);
      if (!ok) break;
      if (r.peek(',')) {
        ++r.pos;
      } else if (!r.peek('}')) {
        r.fail("expected ',' or '}'");
      }
    }
    if (r.error.empty()) {
      ++r.pos;  // '}'
      r.skip_space();
      if (r.pos != header.size()) r.fail("unexpected text after the dict");
    }
  }
  if (!r.error.empty()) return err("bad header: " + r.error);
  if (!seen_descr || !seen_fortran || !seen_shape) {
    return err(std::string("bad header: missing key '") + (!seen_descr ? "descr" : !seen_fortran ? "fortran_order" : "shape") + "'");
  }
  if (descr != "<f4" && descr != "<f2") return err("unsupported descr '" + descr + "' (need '<f4' or '<f2')");
  if (fortran) return err("fortran_order True is not supported (need C order)");

  // Element count, guarding against overflow; the data must then be exactly that long.
  const std::size_t item = descr == "<f4" ? 4 : 2;
  const std::size_t data_bytes = size - preamble - header_len;
  // A zero dimension makes the array empty whatever the others are (numpy agrees).
  const bool empty = std::find(shape.begin(), shape.end(), 0) != shape.end();
  std::uint64_t count = empty ? 0 : 1;
  bool overflow = false;
  for (std::size_t i = 0; i < shape.size() && !empty && !overflow; ++i) {
    const auto d = static_cast<std::uint64_t>(shape[i]);  // >= 1 here
    overflow = count > std::numeric_limits<std::uint64_t>::max() / item / d;
    if (!overflow) count *= d;
  }
  const std::string what = "shape " + detail::shape_text(shape) + " of " + descr;
  if (overflow) return err(what + " overflows the addressable size");
  const std::uint64_t need = count * item;
  if (data_bytes < need) {
    return err("data holds " + std::to_string(data_bytes) + " bytes, " + what + " needs " + std::to_string(need));
  }
  if (data_bytes > need) {
    return err(std::to_string(data_bytes - need) + " bytes after the data (" + what + " needs " + std::to_string(need) +
               ", data holds " + std::to_string(data_bytes) + ")");
  }

  const std::byte* p = bytes.data() + preamble + header_len;
  out.shape = std::move(shape);
  out.data.resize(static_cast<std::size_t>(count));
  for (std::size_t i = 0; i < out.data.size(); ++i) {
    out.data[i] = item == 4 ? std::bit_cast<float>(detail::load_le(p + 4 * i, 4))
                            : half::from_bits(static_cast<std::uint16_t>(detail::load_le(p + 2 * i, 2))).to_float();
  }
  return status::success();
}

// Reads a whole file and parses it; messages name `path` as given.
[[nodiscard]] inline status read(const std::filesystem::path& path, array& out) {
  std::vector<std::byte> bytes;
  SKIM_TRY(examples::read_file(path, bytes));
  return parse(bytes, out, path.string());
}

// Serialises a float32 C-order array.
// @pre every dimension >= 0 and data.size() == product of shape, otherwise shape_mismatch.
[[nodiscard]] inline status serialize(std::span<const std::int64_t> shape, std::span<const float> data, std::vector<std::byte>& out) {
  std::uint64_t count = 1;
  bool overflow = false;
  for (const std::int64_t d : shape) {
    if (d < 0) return status::error(status_code::shape_mismatch, "npy: negative dimension %lld", static_cast<long long>(d));
    const auto ud = static_cast<std::uint64_t>(d);
    overflow = overflow || (ud != 0 && count > std::numeric_limits<std::uint64_t>::max() / ud);
    count *= ud;  // wraps only when overflow is set
  }
  // A zero dimension makes the array empty whatever the others are, as in parse(): an empty array
  // parse() accepted must serialise (found by tests/fuzz/npy_fuzz.cpp: shape [2^40, 2^40, 0]).
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) {
    count = 0;
    overflow = false;
  }
  if (overflow) return status::error(status_code::shape_mismatch, "npy: shape %s overflows", detail::shape_text(shape).c_str());
  if (count != data.size()) {
    return status::error(status_code::shape_mismatch, "npy: shape %s holds %llu elements, data has %zu",
                         detail::shape_text(shape).c_str(), static_cast<unsigned long long>(count), data.size());
  }
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) dict += ", ";
    dict += std::to_string(shape[i]);
  }
  if (shape.size() == 1) dict += ',';  // Python's one-element tuple
  dict += "), }";
  constexpr std::size_t align = 64;
  const bool v1 = dict.size() + 1 + 10 <= 65535;
  const std::size_t preamble = v1 ? 10 : 12;
  const std::size_t total_header = (preamble + dict.size() + 1 + align - 1) / align * align;
  const std::size_t header_len = total_header - preamble;
  dict.append(header_len - dict.size() - 1, ' ');
  dict += '\n';

  out.clear();
  out.reserve(total_header + 4 * data.size());
  for (const unsigned char c : detail::magic) out.push_back(std::byte{c});
  out.push_back(std::byte{static_cast<unsigned char>(v1 ? 1 : 2)});
  out.push_back(std::byte{0});
  for (std::size_t i = 0; i < preamble - 8; ++i) out.push_back(std::byte{static_cast<unsigned char>(header_len >> (8 * i))});
  for (const char c : dict) out.push_back(static_cast<std::byte>(c));
  for (const float f : data) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
    for (int i = 0; i < 4; ++i) out.push_back(std::byte{static_cast<unsigned char>(u >> (8 * i))});
  }
  return status::success();
}

[[nodiscard]] inline status write(const std::filesystem::path& path, std::span<const std::int64_t> shape, std::span<const float> data) {
  std::vector<std::byte> bytes;
  SKIM_TRY(serialize(shape, data, bytes));
  const std::string name = path.string();
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return status::error(status_code::invalid_argument, "%s: cannot create (%s)", name.c_str(), std::strerror(errno));
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  f.close();
  if (!f) return status::error(status_code::invalid_argument, "%s: write failed", name.c_str());
  return status::success();
}

}  // namespace skim::npy
