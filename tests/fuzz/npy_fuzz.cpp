// Fuzz target: the .npy reader (examples/common/npy.hpp, parse()) on arbitrary bytes.
//
// parse() must never read outside its span or crash; an error must carry a message naming the
// input; an accepted file must hold exactly prod(shape) floats, and writing it back with
// serialize() and parsing that again must give the same shape and the same bits (for '<f4' input;
// '<f2' is widened, so only the shape and the values, compared as floats, must survive).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

#include "../../examples/common/npy.hpp"
#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace skim;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  npy::array a;
  const status s = npy::parse(bytes, a, "fuzz.npy");
  if (!s.ok()) {
    SKIM_FUZZ_CHECK(std::string_view(s.message()).starts_with("fuzz.npy: "), "message without the name: %s",
                    s.message());
    return 0;
  }
  std::uint64_t count = 1;
  for (const std::int64_t d : a.shape) {
    SKIM_FUZZ_CHECK(d >= 0, "negative dimension accepted");
    count *= static_cast<std::uint64_t>(d);
  }
  SKIM_FUZZ_CHECK(count == a.data.size(), "shape holds %llu elements, data %zu", static_cast<unsigned long long>(count),
                  a.data.size());
  std::vector<std::byte> again;
  const status w = npy::serialize(a.shape, a.data, again);
  SKIM_FUZZ_CHECK(w.ok(), "serialize of a parsed array: %s", w.message());
  npy::array b;
  const status r = npy::parse(again, b, "again.npy");
  SKIM_FUZZ_CHECK(r.ok(), "parse of serialize's output: %s", r.message());
  SKIM_FUZZ_CHECK(b.shape == a.shape, "shape changed in a round trip");
  SKIM_FUZZ_CHECK(b.data.size() == a.data.size() &&
                      (a.data.empty() || std::memcmp(b.data.data(), a.data.data(), a.data.size() * sizeof(float)) == 0),
                  "data changed in a round trip");
  return 0;
}
