// skim::cuda::prefill over a vertical-slash index (index/vertical_slash.hpp) built on the host from
// the case's own Q and K, copied to the device as a device_block_csr, against exec::reference over
// the same CSR on the host: bf16 and fp16, fp32 and 16-bit outputs, every supported tile shape,
// contiguous and paged K/V, GQA 1/4/8 under both index scopes, causal and no mask, varlen batches
// with empty sequences, decode rows and more queries than keys; and one long sequence with a
// planted column and diagonal, whose index is far sparser than causal. Each case runs through
// every kernel that applies to it (mma_sync always; wgmma on an sm_90 device for block_q 128 and
// contiguous K/V). Outputs are NaN-poisoned with a guard past their end.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/support.cuh"
#include "skim/core/workspace.hpp"
#include "skim/exec/cpu/reference.hpp"
#include "skim/exec/cuda/prefill.cuh"
#include "skim/index/block_csr.hpp"
#include "skim/index/vertical_slash.hpp"
#include "support/compare.hpp"
#include "support/executor_cases.hpp"
#include "support/random_case.hpp"

namespace {

using namespace skim;
using namespace skim::test;
using f16 = skim::half;  // not CUDA's ::half
using bf16 = skim::bfloat16;
namespace tc = skim::test::cuda;
using skim::cuda::prefill_kernel;

const char* kernel_name(prefill_kernel k) { return k == prefill_kernel::wgmma ? "wgmma" : "mma_sync"; }

std::vector<prefill_kernel> vs_kernels(const case_spec& s) {
  std::vector<prefill_kernel> k{prefill_kernel::mma_sync};
  if (tc::is_sm90() && s.block_q == 128 && !s.paged) k.push_back(prefill_kernel::wgmma);
  return k;
}

// The bounds of tests/cuda/prefill_test.cu: P is rounded to the input type before P·V.
template <class T>
inline constexpr double vs_tolerance = std::is_same_v<T, bf16> ? 2e-2 : 5e-3;
inline constexpr double vs_lse_tolerance = 5e-3;

// A shape prefill implements (head_dim, block_q, block_kv in {64, 128}), lengths up to max_len.
case_spec vs_prefill_spec(std::mt19937& rng, std::int32_t max_len) {
  case_spec s;
  s.head_dim = pick(rng, {64, 128});
  s.heads_kv = uniform(rng, 1, 2);
  s.heads_q = s.heads_kv * pick(rng, {1, 4, 8});
  s.block_q = pick(rng, {64, 128});
  s.block_kv = pick(rng, {64, 128});
  s.mask = chance(rng, 0.75) ? mask_kind::causal : mask_kind::none;
  s.scope = chance(rng, 0.6) ? index_scope::kv_head : index_scope::query_head;
  s.seqs.clear();
  const std::int32_t batch = uniform(rng, 1, 3);
  for (std::int32_t b = 0; b < batch; ++b) {
    sequence_lengths l;
    l.kv = uniform(rng, 1, max_len);
    switch (uniform(rng, 0, 7)) {
      case 0: l = {0, chance(rng, 0.5) ? 0 : l.kv}; break;  // empty
      case 1: l.q = 1; break;                                // decode row
      case 2: l.q = uniform(rng, 1, max_len); l.kv = uniform(rng, 0, std::max(0, l.q - 1)); break;
      case 3: case 4: case 5: l.q = l.kv; break;             // prefill
      default: l.q = uniform(rng, 1, l.kv); break;           // prefix cached
    }
    s.seqs.push_back(l);
  }
  s.paged = chance(rng, 0.4);
  s.page_size = pick(rng, {16, 17, 64});
  s.q_head_major = chance(rng, 0.25);
  s.o_head_major = chance(rng, 0.25);
  s.kv_head_major = chance(rng, 0.5);
  return s;
}

// The vertical-slash CSR of case c, built on the host.
struct host_csr {
  std::vector<std::int32_t> row_ptr, col_idx;
  [[nodiscard]] index::block_csr view() const { return {row_ptr, col_idx}; }
};

template <class T>
host_csr build_index(const random_case<T, T>& c, const index::vertical_slash_options& o) {
  const problem p = c.prob();
  host_csr h;
  h.row_ptr.assign(static_cast<std::size_t>(p.index_rows()) + 1, -1);
  h.col_idx.assign(static_cast<std::size_t>(index::vertical_slash_capacity(p, o)), -1);
  skim::workspace_buffer ws(index::vertical_slash_workspace_bytes(p, o));
  const status s = index::build_vertical_slash(p, c.q_view(), c.contiguous().k, o, {h.row_ptr, h.col_idx}, ws.span());
  INFO("build_vertical_slash: " << std::string(s.message()));
  REQUIRE(s.ok());
  REQUIRE(h.view().validate(p).ok());
  return h;
}

template <class T>
bool all_ones_from(const std::vector<T>& v, std::size_t from) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(v.data());
  return std::all_of(bytes + from * sizeof(T), bytes + v.size() * sizeof(T), [](unsigned char x) { return x == 0xff; });
}

// prefill on the device over the CSR, compared with the reference over the same CSR on the host.
template <class T, class TO>
void check_vs_case(const random_case<T, T>& c, const index::vertical_slash_options& o) {
  const case_spec& s = c.spec;
  const problem p = c.prob();
  const host_csr idx = build_index(c, o);
  INFO(s.describe() << ", columns " << o.columns << " diagonals " << o.diagonals << " sink " << o.sink_blocks
                    << " window " << o.window_blocks << " last_q " << o.last_q << ", " << idx.row_ptr.back()
                    << " ids");

  output<TO> ref(s, c.tokens_q());
  {
    const attention_args<T, contiguous_kv<T>, index::block_csr, TO> a{
        .prob = p, .q = c.q_view(), .kv = c.contiguous(), .index = idx.view(), .o = ref.view, .lse = ref.lse};
    const status st = run_executor(exec::reference{}, a);
    INFO("reference: " << std::string(st.message()));
    REQUIRE(st.ok());
  }

  tc::device_case<T, T> dc(c);
  // A CSR with nothing stored still needs a valid pointer (check_args), never read.
  tc::buffer<std::int32_t> row_ptr(idx.row_ptr);
  tc::buffer<std::int32_t> col_idx(idx.col_idx.empty() ? std::vector<std::int32_t>{-1} : idx.col_idx);
  const skim::cuda::device_block_csr dev_csr{.row_ptr = row_ptr.data(), .col_idx = col_idx.data(),
                                             .capacity = static_cast<std::int64_t>(idx.row_ptr.back()),
                                             .rows = p.index_rows()};

  const std::size_t o_elems = static_cast<std::size_t>(c.tokens_q()) * s.heads_q * s.head_dim;
  const std::size_t lse_elems = static_cast<std::size_t>(c.tokens_q()) * s.heads_q;
  const tc::buffer<T> no_tokens(8);
  const tc::buffer<std::int32_t> no_pages(1);
  const auto or_dummy = [](auto* ptr, auto* dummy) { return ptr != nullptr ? ptr : dummy; };
  const strided_view<const T> qv = c.q_view();
  for (const prefill_kernel kernel : vs_kernels(s)) {
    INFO("kernel " << std::string(kernel_name(kernel)));
    tc::buffer<TO> o_dev(o_elems + static_cast<std::size_t>(s.heads_q) * s.head_dim);
    tc::buffer<float> lse_dev(lse_elems + s.heads_q);
    const output<TO> layout(s, c.tokens_q(), false);
    const skim::cuda::device_view<const T> q{or_dummy(dc.q.data(), no_tokens.data()), qv.token_stride, qv.head_stride};
    const skim::cuda::device_view<TO> ov{o_dev.data(), layout.view.token_stride, layout.view.head_stride};
    const auto go = [&](auto kv) {
      const skim::cuda::device_attention_args<T, decltype(kv), skim::cuda::device_block_csr, TO> a{
          .prob = dc.prob(s), .q = q, .kv = kv, .index = dev_csr, .o = ov, .lse = lse_dev.data()};
      const status st = skim::cuda::prefill{.kernel = kernel}.run(a, {}, nullptr);
      INFO("prefill: " << std::string(st.message()));
      REQUIRE(st.ok());
      SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
    };
    if (s.paged) {
      auto kv = dc.paged(c);
      kv.page_indices = or_dummy(kv.page_indices, no_pages.data());
      go(kv);
    } else {
      auto kv = dc.contiguous(s);
      kv.k = or_dummy(kv.k, no_tokens.data());
      kv.v = or_dummy(kv.v, no_tokens.data());
      go(kv);
    }
    std::vector<TO> o_host = o_dev.download();
    std::vector<float> lse_host = lse_dev.download();
    CHECK(all_ones_from(o_host, o_elems));  // nothing written past O and lse
    CHECK(all_ones_from(lse_host, lse_elems));
    output<TO> got(s, c.tokens_q());
    std::copy_n(o_host.begin(), o_elems, got.o.begin());
    std::copy_n(lse_host.begin(), lse_elems, got.lse.begin());
    check(compare(p, got.view, ref.view, std::span<const float>(got.lse), std::span<const float>(ref.lse),
                  vs_tolerance<T>, vs_lse_tolerance));
    CHECK(dc.error_bits() == 0u);
  }
}

index::vertical_slash_options vs_random_options(std::mt19937& rng) {
  return {.columns = pick(rng, {0, 8, 64, 1000}), .diagonals = pick(rng, {0, 8, 64, 1000}),
          .sink_blocks = uniform(rng, 0, 1), .window_blocks = uniform(rng, 0, 2), .last_q = pick(rng, {1, 64, 256})};
}

}  // namespace

TEST_CASE_TEMPLATE("prefill over a vertical_slash index matches the reference over it", TT, types<bf16, bf16, float>,
                   types<bf16, bf16, bf16>, types<f16, f16, float>, types<f16, f16, f16>) {
  using T = typename TT::q;
  using TO = typename TT::o;
  for (std::uint32_t i = 0; i < 10; ++i) {
    const std::uint32_t seed = 0x75e0u + 97u * i + static_cast<std::uint32_t>(std::is_same_v<T, f16> * 5 + sizeof(TO));
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    const case_spec spec = vs_prefill_spec(rng, 700);
    const random_case<T, T> c(spec, rng);
    check_vs_case<T, TO>(c, vs_random_options(rng));
  }
}

TEST_CASE("prefill over a vertical_slash index: a long sequence with a planted column and diagonal") {
  // 1500 queries over 1600 keys: every query leans on key 300 and on the key 700 positions back, so
  // the index keeps their blocks and little else (columns 4, diagonals 4, sink 1, window 1).
  std::mt19937 rng(0x51a5u);
  case_spec s;
  s.head_dim = 64;
  s.heads_q = 4;
  s.heads_kv = 1;
  s.block_q = 128;
  s.block_kv = 64;
  s.seqs = {{1500, 1600}};
  random_case<bf16, bf16> c(s, rng);
  const std::int32_t d = s.head_dim, n_q = 1500, n_kv = 1600, column = 300, back = 700;
  const auto k_at = [&](std::int32_t j, std::int32_t e) { return to_float(c.k[static_cast<std::size_t>(j) * d + e]); };
  for (std::int32_t t = 0; t < n_q; ++t) {
    const std::int32_t pos = t + n_kv - n_q;
    for (std::int32_t g = 0; g < s.heads_q; ++g) {
      for (std::int32_t e = 0; e < d; ++e) {
        float x = 0.3f * to_float(c.q[(static_cast<std::size_t>(t) * s.heads_q + g) * d + e]) + 0.5f * k_at(column, e);
        if (pos - back >= 0) x += 0.5f * k_at(pos - back, e);
        c.q[(static_cast<std::size_t>(t) * s.heads_q + g) * d + e] = from_float<bf16>(x);
      }
    }
  }
  const index::vertical_slash_options o{
      .columns = 4, .diagonals = 4, .sink_blocks = 1, .window_blocks = 1, .last_q = 64};
  const host_csr idx = build_index(c, o);
  const problem p = c.prob();
  std::int64_t causal = 0;
  REQUIRE(for_each_row(p, [&](const row_info& r) {
            causal += r.visible_blocks;
            const std::int32_t* first = idx.col_idx.data() + idx.row_ptr[static_cast<std::size_t>(r.row)];
            const std::int32_t* last = idx.col_idx.data() + idx.row_ptr[static_cast<std::size_t>(r.row) + 1];
            if (column < r.visible_keys(r.q_end - 1, p.mask)) {
              CHECK(std::find(first, last, column / s.block_kv) != last);
            }
          }).ok());
  MESSAGE("vertical_slash keeps " << idx.row_ptr.back() << " of " << causal << " causal blocks");
  CHECK(idx.row_ptr.back() < causal / 2);
  check_vs_case<bf16, float>(c, o);
}
