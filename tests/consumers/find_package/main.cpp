// Consumer of an installed skim: uses a few core types, and the dependencies that
// skim::skim brings along (xsimd, Eigen) must be usable without naming them in its CMake.
#include <array>
#include <cstdint>
#include <cstdio>

#include <Eigen/Core>
#include <xsimd/xsimd.hpp>

#include <skim/config.hpp>
#include <skim/core/dtypes.hpp>
#include <skim/core/problem.hpp>

int main() {
  static_assert(SKIM_VERSION_MAJOR == 0);
  const std::array<std::int32_t, 2> cu_q{0, 10}, cu_kv{0, 37};
  const skim::problem p{.heads_q = 8, .heads_kv = 2, .head_dim = 64, .block_q = 16, .block_kv = 16,
                        .cu_seqlens_q = cu_q, .cu_seqlens_kv = cu_kv};
  const skim::status ok = skim::validate(p);
  const skim::problem bad{.heads_q = 6, .heads_kv = 4, .head_dim = 64, .cu_seqlens_q = cu_q, .cu_seqlens_kv = cu_kv};
  const skim::status err = skim::validate(bad);
  const float h = skim::half::from_float(1.5f).to_float();
  const Eigen::Vector2f v(1.0f, 2.0f);
  const xsimd::batch<float> b(2.0f);
  if (!ok.ok() || err.ok() || h != 1.5f || v.sum() != 3.0f || b.get(0) != 2.0f) {
    std::printf("skim consumer: FAILED (%s / %s)\n", ok.message(), err.message());
    return 1;
  }
  std::printf("skim consumer: ok (bad problem says: %s)\n", err.message());
  return 0;
}
