#include <doctest/doctest.h>

#include <bit>
#include <cstdint>
#include <random>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "../../examples/common/npy.hpp"

namespace npy = skim::npy;

namespace {

// A .npy file built by hand: preamble (version major.0), header text as given, raw data.
std::vector<std::byte> make_file(std::string_view header, std::vector<unsigned char> data, int major = 1) {
  std::vector<std::byte> f;
  for (const unsigned char c : {0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59}) f.push_back(std::byte{c});  // \x93NUMPY
  f.push_back(std::byte{static_cast<unsigned char>(major)});
  f.push_back(std::byte{0});
  const int len_bytes = major == 1 ? 2 : 4;
  for (int i = 0; i < len_bytes; ++i) f.push_back(std::byte{static_cast<unsigned char>(header.size() >> (8 * i))});
  for (const char c : header) f.push_back(static_cast<std::byte>(c));
  for (const unsigned char c : data) f.push_back(std::byte{c});
  return f;
}

std::vector<unsigned char> floats_le(const std::vector<float>& v) {
  std::vector<unsigned char> out;
  for (const float x : v) {
    const auto u = std::bit_cast<std::uint32_t>(x);
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<unsigned char>(u >> (8 * i)));
  }
  return out;
}

std::string parse_error(const std::vector<std::byte>& f, std::string_view name = "q.npy") {
  npy::array a;
  const skim::status s = npy::parse(f, a, name);
  REQUIRE_FALSE(s.ok());
  return s.message();
}

}  // namespace

TEST_CASE("npy: float32 round trips in memory for every rank") {
  const std::vector<std::vector<std::int64_t>> shapes = {{}, {0}, {5}, {3, 0, 2}, {4, 2, 8}, {2, 3, 1, 5}};
  for (const auto& shape : shapes) {
    std::int64_t n = 1;
    for (const auto d : shape) n *= d;
    std::vector<float> data(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = 0.25f * static_cast<float>(i) - 3.0f;
    std::vector<std::byte> bytes;
    REQUIRE(npy::serialize(shape, data, bytes).ok());
    CHECK((bytes.size() - 4 * data.size()) % 64 == 0);  // data starts on a 64-byte boundary
    npy::array a;
    const skim::status s = npy::parse(bytes, a);
    REQUIRE_MESSAGE(s.ok(), s.message());
    CHECK(a.shape == shape);
    CHECK(a.data == data);
  }
}

TEST_CASE("npy: the writer's header is what numpy writes") {
  std::vector<std::byte> bytes;
  const std::vector<std::int64_t> shape = {5};
  REQUIRE(npy::serialize(shape, std::vector<float>(5, 1.0f), bytes).ok());
  const std::size_t header_len = std::to_integer<std::size_t>(bytes[8]) | std::to_integer<std::size_t>(bytes[9]) << 8;
  CHECK((10 + header_len) % 64 == 0);
  const std::string text(reinterpret_cast<const char*>(bytes.data()) + 10, header_len);
  CHECK(text.starts_with("{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }"));
  CHECK(text.back() == '\n');
  CHECK(npy::serialize(std::vector<std::int64_t>{2, 3}, std::vector<float>(5), bytes).message() ==
        std::string_view("npy: shape [2, 3] holds 6 elements, data has 5"));
}

TEST_CASE("npy: file round trip and missing file") {
  const auto dir = std::filesystem::temp_directory_path() / ("skim_npy_test_" + std::to_string(std::random_device{}()));
  std::filesystem::create_directories(dir);
  const std::vector<std::int64_t> shape = {2, 3};
  const std::vector<float> data = {1, 2, 3, -4, 5.5f, 1e-30f};
  REQUIRE(npy::write(dir / "a.npy", shape, data).ok());
  npy::array a;
  REQUIRE(npy::read(dir / "a.npy", a).ok());
  CHECK(a.shape == shape);
  CHECK(a.data == data);
  const std::string missing = (dir / "nope.npy").string();
  CHECK(std::string(npy::read(dir / "nope.npy", a).message()) == missing + ": cannot open (No such file or directory)");
  CHECK(std::string(npy::read(dir, a).message()).starts_with(dir.string() + ": read error"));  // a directory
  std::filesystem::remove_all(dir);
}

TEST_CASE("npy: fp16 files are widened to float, versions 2.0 and 3.0 are read") {
  // 1.0, -2.0, 0.5, 65504 (max half), a subnormal (2^-24), -0
  const std::vector<unsigned char> data = {0x00, 0x3c, 0x00, 0xc0, 0x00, 0x38, 0xff, 0x7b, 0x01, 0x00, 0x00, 0x80};
  for (const int major : {1, 2, 3}) {
    const auto f = make_file("{'descr': '<f2', 'fortran_order': False, 'shape': (2, 3), }    \n", data, major);
    npy::array a;
    const skim::status s = npy::parse(f, a);
    REQUIRE_MESSAGE(s.ok(), s.message());
    CHECK(a.shape == std::vector<std::int64_t>{2, 3});
    CHECK(a.data == std::vector<float>{1.0f, -2.0f, 0.5f, 65504.0f, 0x1p-24f, -0.0f});
  }
}

TEST_CASE("npy: headers in other spellings are accepted") {
  const auto data = floats_le({1, 2});
  for (const char* h : {"{\"shape\": (2,), \"fortran_order\": False, \"descr\": \"<f4\"}", "{'descr':'<f4','fortran_order':False,'shape':(2L,)}\n",
                        "{ 'descr' : '<f4' , 'fortran_order' : False , 'shape' : ( 2 , ) , }"}) {
    npy::array a;
    const skim::status s = npy::parse(make_file(h, data), a);
    CHECK_MESSAGE(s.ok(), h, " -> ", s.message());
  }
}

TEST_CASE("npy: every malformed file gets a clear message") {
  const std::string good = "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 2, 8), }\n";
  const auto data256 = std::vector<unsigned char>(256, 0);

  CHECK(parse_error({}) == "q.npy: truncated: 0 bytes, shorter than the .npy preamble");
  CHECK(parse_error(std::vector<std::byte>(4, std::byte{0x93})) == "q.npy: bad magic (not a .npy file)");
  auto f = make_file(good, data256);
  f[1] = std::byte{'n'};
  CHECK(parse_error(f) == "q.npy: bad magic (not a .npy file)");
  f = make_file(good, data256);
  f.resize(9);
  CHECK(parse_error(f) == "q.npy: truncated: 9 bytes, shorter than the .npy preamble");
  f = make_file(good, data256, 2);
  f.resize(11);
  CHECK(parse_error(f) == "q.npy: truncated: 11 bytes, shorter than the .npy preamble");
  f = make_file(good, data256);
  f[6] = std::byte{4};
  CHECK(parse_error(f) == "q.npy: unsupported .npy version 4.0 (need 1.0, 2.0 or 3.0)");
  f = make_file(good, data256);
  f[7] = std::byte{1};
  CHECK(parse_error(f) == "q.npy: unsupported .npy version 1.1 (need 1.0, 2.0 or 3.0)");

  // Header length beyond the file (header cut short).
  f = make_file(good, {});
  f.resize(40);
  CHECK(parse_error(f) == "q.npy: header length 63 reaches beyond the file (30 bytes after the preamble)");

  // Data shorter or longer than the shape needs.
  CHECK(parse_error(make_file(good, std::vector<unsigned char>(96)), "q.npy") == "q.npy: data holds 96 bytes, shape [4, 2, 8] of <f4 needs 256");
  CHECK(parse_error(make_file(good, std::vector<unsigned char>(264))) ==
        "q.npy: 8 bytes after the data (shape [4, 2, 8] of <f4 needs 256, data holds 264)");
  CHECK(parse_error(make_file("{'descr': '<f2', 'fortran_order': False, 'shape': (3,), }", {1, 2, 3})) ==
        "q.npy: data holds 3 bytes, shape [3] of <f2 needs 6");

  // Dtype and order.
  CHECK(parse_error(make_file("{'descr': '<f8', 'fortran_order': False, 'shape': (4,), }", data256)) ==
        "q.npy: unsupported descr '<f8' (need '<f4' or '<f2')");
  CHECK(parse_error(make_file("{'descr': '>f4', 'fortran_order': False, 'shape': (4,), }", data256)) ==
        "q.npy: unsupported descr '>f4' (need '<f4' or '<f2')");
  CHECK(parse_error(make_file("{'descr': '<f4', 'fortran_order': True, 'shape': (4,), }", data256)) ==
        "q.npy: fortran_order True is not supported (need C order)");

  // Shapes.
  CHECK(parse_error(make_file("{'descr': '<f4', 'fortran_order': False, 'shape': (4, -2), }", data256)) ==
        "q.npy: bad header: negative dimension at header offset 54");
  CHECK(parse_error(make_file("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", data256)) ==
        "q.npy: bad header: dimension overflows int64 at header offset 69");
  CHECK(parse_error(make_file("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", data256)) ==
        "q.npy: shape [4294967296, 4294967296] of <f4 overflows the addressable size");
  CHECK(parse_error(make_file("{'descr': '<f4', 'fortran_order': False, 'shape': (4 2), }", data256)) ==
        "q.npy: bad header: expected ',' or ')' in shape at header offset 53");
  std::string many = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  for (int i = 0; i < 65; ++i) many += "1,";
  CHECK(parse_error(make_file(many + "), }", floats_le({1}))) == "q.npy: bad header: more than 64 dimensions at header offset 179");

  // Dict structure.
  CHECK(parse_error(make_file("{'descr': '<f4', 'fortran_order': False}", data256)) == "q.npy: bad header: missing key 'shape'");
  CHECK(parse_error(make_file("{'descr': '<f4', 'descr': '<f4'}", data256)) == "q.npy: bad header: duplicate key 'descr' at header offset 25");
  CHECK(parse_error(make_file("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), 'x': 1}", data256)) ==
        "q.npy: bad header: unknown key 'x' at header offset 60");
  CHECK(parse_error(make_file("{'descr': '<f4', 'fortran_order': Nope, 'shape': (4,)}", data256)) ==
        "q.npy: bad header: expected True or False at header offset 34");
  CHECK(parse_error(make_file("{'descr: '<f4'}", data256)) == "q.npy: bad header: expected ':' at header offset 10");
  CHECK(parse_error(make_file("{'descr': '<f4", data256)) == "q.npy: bad header: unterminated string at header offset 11");
  CHECK(parse_error(make_file("['descr']", data256)) == "q.npy: bad header: expected '{' at header offset 0");
  CHECK(parse_error(make_file("{'descr': '<f4', 'fortran_order': False, 'shape': (4,)", data256)) ==
        "q.npy: bad header: expected ',' or '}' at header offset 54");
  CHECK(parse_error(make_file("{'descr': '<f4', 'fortran_order': False, 'shape': (64,)} x", data256)) ==
        "q.npy: bad header: unexpected text after the dict at header offset 57");
}

TEST_CASE("npy: every prefix of a valid file fails cleanly") {
  std::vector<std::byte> bytes;
  REQUIRE(npy::serialize(std::vector<std::int64_t>{3, 4}, std::vector<float>(12, 2.0f), bytes).ok());
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    npy::array a;
    CHECK_FALSE(npy::parse(std::span(bytes).first(n), a).ok());
  }
}

TEST_CASE("npy: random mutations of a valid file never crash") {
  std::vector<std::byte> bytes;
  REQUIRE(npy::serialize(std::vector<std::int64_t>{2, 3, 4}, std::vector<float>(24, 1.5f), bytes).ok());
  std::uint64_t x = 0x9e3779b97f4a7c15ull;  // xorshift64: deterministic
  const auto next = [&x] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  int accepted = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    std::vector<std::byte> f = bytes;
    const int edits = 1 + static_cast<int>(next() % 4);
    for (int e = 0; e < edits; ++e) {
      const std::size_t at = next() % 80;  // mostly the preamble and the header text
      f[at] = std::byte{static_cast<unsigned char>(next())};
    }
    if (next() % 4 == 0) f.resize(next() % (f.size() + 1));
    npy::array a;
    if (npy::parse(f, a).ok()) {
      ++accepted;
      std::size_t n = 1;
      for (const auto d : a.shape) n *= static_cast<std::size_t>(d);
      CHECK(a.data.size() == n);
    }
  }
  CHECK(accepted > 0);  // some edits only touch padding or data
}
