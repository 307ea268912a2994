#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "skim/core/dtypes.hpp"

using namespace skim;

namespace {

// Independent round-to-nearest-even bf16 oracle: pick the nearer of the two bf16 neighbours in
// double precision, the even one on a tie.
std::uint16_t bf16_oracle(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t lo = x & 0xffff0000u;
  const std::uint32_t hi = lo + 0x10000u;
  const double d = f;
  const double dlo = std::bit_cast<float>(lo);
  const float fhi = std::bit_cast<float>(hi);
  // hi may be inf (rounding past the largest finite bf16); its distance is then 2^128 - |lo|'s spacing.
  const double dhi = std::isinf(fhi) ? std::copysign(std::ldexp(1.0, 128), d) : static_cast<double>(fhi);
  const double elo = std::fabs(d - dlo), ehi = std::fabs(dhi - d);
  if (elo < ehi) return static_cast<std::uint16_t>(lo >> 16);
  if (ehi < elo) return static_cast<std::uint16_t>(hi >> 16);
  return static_cast<std::uint16_t>(((lo >> 16) & 1u) ? hi >> 16 : lo >> 16);
}

// The value of binary16 bits b, decoded from its IEEE 754 fields: independent of skim::half and
// of the compiler's _Float16 (clang 14 has none on x86).
double half_value(std::uint16_t b) {
  const int e = (b >> 10) & 0x1f;
  const int m = b & 0x3ff;
  const double mag = e == 0    ? std::ldexp(m, -24)
                     : e == 31 ? (m != 0 ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity())
                               : std::ldexp(1024 + m, e - 25);
  return (b & 0x8000u) != 0 ? -mag : mag;
}

// Independent round-to-nearest-even half oracle for a non-NaN f: the nearer of the two positive
// halves around |f| (binary search over the ascending bits 0..0x7c00, infinity counting as 2^16
// for the distance), the even one on a tie.
std::uint16_t half_oracle(float f) {
  const double d = std::fabs(static_cast<double>(f));
  const auto sign = static_cast<std::uint16_t>(std::signbit(f) ? 0x8000u : 0u);
  const auto value = [](std::uint32_t b) { return b == 0x7c00u ? 65536.0 : half_value(static_cast<std::uint16_t>(b)); };
  if (d >= 65536.0) return sign | 0x7c00u;
  std::uint32_t lo = 0, hi = 0x7c00u;  // value(lo) <= d < value(hi)
  while (hi - lo > 1) {
    const std::uint32_t mid = (lo + hi) / 2;
    (value(mid) <= d ? lo : hi) = mid;
  }
  const double elo = d - value(lo), ehi = value(hi) - d;
  const std::uint32_t pick = elo < ehi ? lo : ehi < elo ? hi : (lo & 1u) != 0 ? hi : lo;
  return static_cast<std::uint16_t>(sign | pick);
}

}  // namespace

TEST_CASE("half: every finite half round-trips through float exactly") {
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const half h = half::from_bits(static_cast<std::uint16_t>(b));
    const float f = h.to_float();
    const double ref = half_value(static_cast<std::uint16_t>(b));
    if (std::isnan(f)) {
      CHECK(std::isnan(ref));
      CHECK(std::isnan(half::from_float(f).to_float()));
      continue;
    }
    CHECK(std::bit_cast<std::uint32_t>(f) == std::bit_cast<std::uint32_t>(static_cast<float>(ref)));
    CHECK(half::from_float(f).bits == b);
  }
}

TEST_CASE("half: from_float rounds to nearest even on random floats and on halfway points") {
  std::mt19937 rng(20261130u);
  std::uniform_int_distribution<std::uint32_t> bits;
  int checked = 0;
  for (int i = 0; i < 200000; ++i) {
    // Exponents concentrated around the half range (subnormals, normals, overflow).
    std::uint32_t x = bits(rng);
    const std::uint32_t exp = 95u + (x >> 24) % 50u;  // 2^-32 .. 2^17
    x = (x & 0x807fffffu) | (exp << 23);
    const float f = std::bit_cast<float>(x);
    REQUIRE(half::from_float(f).bits == half_oracle(f));
    ++checked;
  }
  // Exact ties between neighbouring halves: the even one wins.
  for (std::uint32_t b = 0; b < 0x7bffu; ++b) {
    const float a = half::from_bits(static_cast<std::uint16_t>(b)).to_float();
    const float c = half::from_bits(static_cast<std::uint16_t>(b + 1)).to_float();
    const float mid = static_cast<float>((static_cast<double>(a) + c) / 2);
    REQUIRE(half::from_float(mid).bits == half_oracle(mid));
    REQUIRE(half::from_float(-mid).bits == half_oracle(-mid));
  }
  CHECK(checked == 200000);
  CHECK(half::from_float(65519.0f).bits == 0x7bffu);  // largest finite
  CHECK(half::from_float(65520.0f).bits == 0x7c00u);  // tie to even: infinity
  CHECK(half::from_float(-std::numeric_limits<float>::infinity()).bits == 0xfc00u);
  CHECK(std::isnan(half::from_float(std::numeric_limits<float>::quiet_NaN()).to_float()));
}

TEST_CASE("bfloat16: from_float rounds to nearest even, keeps inf and NaN") {
  std::mt19937 rng(7u);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    const float f = std::bit_cast<float>(bits(rng));
    if (std::isnan(f)) {
      CHECK(std::isnan(bfloat16::from_float(f).to_float()));
      continue;
    }
    REQUIRE(bfloat16::from_float(f).bits == bf16_oracle(f));
  }
  // Ties: x.5 ulp in bf16 terms.
  CHECK(bfloat16::from_float(std::bit_cast<float>(0x3f808000u)).bits == 0x3f80u);  // tie, even below
  CHECK(bfloat16::from_float(std::bit_cast<float>(0x3f818000u)).bits == 0x3f82u);  // tie, even above
  CHECK(bfloat16::from_float(std::numeric_limits<float>::max()).bits == 0x7f80u);  // rounds to inf
  CHECK(bfloat16::from_float(std::numeric_limits<float>::infinity()).bits == 0x7f80u);
  // A NaN whose payload sits only in the dropped bits must stay a NaN (not become inf).
  CHECK(std::isnan(bfloat16::from_float(std::bit_cast<float>(0x7f800001u)).to_float()));
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const bfloat16 h = bfloat16::from_bits(static_cast<std::uint16_t>(b));
    if (!std::isnan(h.to_float())) REQUIRE(bfloat16::from_float(h.to_float()).bits == b);
  }
}

TEST_CASE("to_float/from_float dispatch on the element type") {
  CHECK(to_float(from_float<half>(1.5f)) == 1.5f);
  CHECK(to_float(from_float<bfloat16>(-2.25f)) == -2.25f);
  CHECK(to_float(from_float<float>(0.1f)) == 0.1f);
  CHECK(to_float(from_float<half>(0.1f)) != 0.1f);  // fp16 cannot hold 0.1 exactly
}

namespace {

// The value of e4m3 bits b from the format's fields (bias 7, subnormals, S.1111.111 NaN, no inf).
double e4m3_value(std::uint8_t b) {
  const int e = (b >> 3) & 0xf;
  const int m = b & 0x7;
  if (e == 0xf && m == 0x7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return (b & 0x80u) != 0 ? -mag : mag;
}

// Nearest finite e4m3 code to f by search over every code (the even mantissa on a tie), with
// magnitudes beyond 448 saturated: the rounding fp8_e4m3::from_float promises.
std::uint8_t e4m3_oracle(float f) {
  if (std::isnan(f)) return 0x7f;
  const double d = f;
  int best = -1;
  double best_err = 0;
  for (int c = 0; c < 256; ++c) {
    const double v = e4m3_value(static_cast<std::uint8_t>(c));
    if (std::isnan(v) || (std::signbit(v) != std::signbit(d))) continue;
    const double err = std::fabs(std::fmin(std::fabs(d), 448.0) - std::fabs(v));
    if (best < 0 || err < best_err || (err == best_err && (c & 1) == 0)) {
      best = c;
      best_err = err;
    }
  }
  return static_cast<std::uint8_t>(best);
}

}  // namespace

TEST_CASE("fp8_e4m3: every code decodes to its field value; finite codes round-trip") {
  int finite = 0;
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    const double want = e4m3_value(code);
    const float got = fp8_e4m3::from_bits(code).to_float();
    CAPTURE(c);
    if (std::isnan(want)) {
      CHECK(std::isnan(got));
      continue;
    }
    ++finite;
    CHECK(static_cast<double>(got) == want);
    CHECK(std::signbit(got) == ((c & 0x80) != 0));
    CHECK(fp8_e4m3::from_float(got).bits == code);  // -0 stays -0
  }
  CHECK(finite == 254);
  CHECK(fp8_e4m3::from_bits(0x7e).to_float() == 448.0f);
  CHECK(fp8_e4m3::from_bits(0x01).to_float() == std::ldexp(1.0f, -9));
}

TEST_CASE("fp8_e4m3: from_float rounds to nearest even, saturates at 448, keeps NaN") {
  // Every midpoint between neighbouring codes (and a hair either side) goes where the oracle says.
  for (int c = 0; c < 0x7e; ++c) {
    const double a = e4m3_value(static_cast<std::uint8_t>(c)), b = e4m3_value(static_cast<std::uint8_t>(c + 1));
    const auto mid = static_cast<float>((a + b) / 2);  // exact: e4m3 midpoints need 5 significant bits
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1000.0f), -mid}) {
      CAPTURE(f);
      CHECK(fp8_e4m3::from_float(f).bits == e4m3_oracle(f));
    }
    CHECK(fp8_e4m3::from_float(mid).bits == ((c & 1) == 0 ? c : c + 1));  // the tie goes to the even code
  }
  std::mt19937 rng(20261203);
  std::uniform_real_distribution<float> expo(-14.0f, 10.0f);
  for (int i = 0; i < 20000; ++i) {
    const float f = (i % 2 == 0 ? 1.0f : -1.0f) * std::exp2(expo(rng));
    CAPTURE(f);
    CHECK(fp8_e4m3::from_float(f).bits == e4m3_oracle(f));
  }
  CHECK(fp8_e4m3::from_float(464.0f).bits == 0x7e);
  CHECK(fp8_e4m3::from_float(1e30f).bits == 0x7e);
  CHECK(fp8_e4m3::from_float(-std::numeric_limits<float>::infinity()).bits == 0xfe);
  CHECK(fp8_e4m3::from_float(std::numeric_limits<float>::quiet_NaN()).bits == 0x7f);
  CHECK(fp8_e4m3::from_float(std::ldexp(1.0f, -11)).bits == 0x00);  // a quarter of the least subnormal
  CHECK(fp8_e4m3::from_float(std::ldexp(3.0f, -11)).bits == 0x01);
}
