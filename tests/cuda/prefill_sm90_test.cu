// skim::exec::cuda::prefill_sm90 (wgmma, sm_90a) against exec::reference (CPU, double) on random
// cases and host-built selections, as prefill_test.cu checks prefill: every supported tile shape
// (head_dim 64/128, block_q 128, block_kv 64/128), bf16 and fp16, fp32 and 16-bit outputs,
// contiguous K/V, block_table and block_csr, both index scopes, GQA 1/4/8, varlen batches with empty
// sequences, partial query and key blocks, q_len <, ==, > kv_len, causal and no mask, bad device
// content skipped and reported. Outputs are poisoned with a guard past their end. On a device that is
// not sm_90 the cases check that run() refuses and stop there. Cases named *small* also run under
// compute-sanitizer (scripts/cuda sanitize).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/support.cuh"
#include "skim/exec/cpu/reference.hpp"
#include "skim/exec/cuda/prefill_sm90.cuh"
#include "support/compare.hpp"
#include "support/executor_cases.hpp"
#include "support/random_case.hpp"

namespace {

using namespace skim;
using namespace skim::test;
using f16 = skim::half;
using bf16 = skim::bfloat16;
namespace tc = skim::test::cuda;

enum class index_form { table, csr };

template <class T>
inline constexpr double prefill_tolerance = std::is_same_v<T, bf16> ? 2e-2 : 5e-3;
inline constexpr double lse_tolerance = 5e-3;

// The current device runs sm_90a code (checked once).
bool is_sm90() {
  static const bool yes = [] {
    int device = 0, major = 0, minor = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return false;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    return major == 9 && minor == 0;
  }();
  return yes;
}

case_spec sm90_spec(std::mt19937& rng, double work) {
  case_spec s;
  s.head_dim = pick(rng, {64, 128});
  s.heads_kv = uniform(rng, 1, 2);
  s.heads_q = s.heads_kv * pick(rng, {1, 4, 8});
  s.block_q = 128;
  s.block_kv = pick(rng, {64, 128});
  s.mask = chance(rng, 0.7) ? mask_kind::causal : mask_kind::none;
  s.scope = chance(rng, 0.75) ? index_scope::kv_head : index_scope::query_head;
  s.softmax_scale = chance(rng, 0.5) ? 0.0f
                                     : std::uniform_real_distribution<float>(0.3f, 3.0f)(rng) /
                                           std::sqrt(static_cast<float>(s.head_dim));
  const std::int32_t batch = uniform(rng, 1, 4);
  const double per_seq = work / (static_cast<double>(s.heads_q) * s.head_dim * batch);
  const std::int32_t max_len = std::clamp(static_cast<std::int32_t>(std::sqrt(per_seq)), 2, 1200);
  s.seqs.clear();
  for (std::int32_t b = 0; b < batch; ++b) {
    sequence_lengths l;
    l.kv = uniform(rng, 1, max_len);
    switch (uniform(rng, 0, 9)) {
      case 0: l = {0, chance(rng, 0.5) ? 0 : l.kv}; break;
      case 1: l.q = 1; break;
      case 2:
        l.q = uniform(rng, 1, max_len);
        l.kv = uniform(rng, 0, std::max(0, l.q - 1));
        break;
      case 3:
        l.q = s.block_q * uniform(rng, 1, std::max(1, max_len / s.block_q));
        l.kv = l.q + s.block_kv * uniform(rng, 0, 2);
        break;
      case 4: case 5: case 6: l.q = l.kv; break;
      default: l.q = uniform(rng, 1, l.kv); break;
    }
    s.seqs.push_back(l);
  }
  s.paged = false;
  s.q_head_major = chance(rng, 0.25);
  s.o_head_major = chance(rng, 0.25);
  return s;
}

struct device_index {
  tc::buffer<std::int32_t> row_ptr, col_idx, ids, count;
  std::int32_t width = 0;
  std::int64_t rows = 0;

  device_index(const csr_storage& csr, std::int32_t extra) : row_ptr(csr.row_ptr), col_idx(csr.col_idx) {
    rows = static_cast<std::int64_t>(csr.row_ptr.size()) - 1;
    for (std::int64_t r = 0; r < rows; ++r) width = std::max(width, csr.row_ptr[r + 1] - csr.row_ptr[r]);
    width += extra;
    std::vector<std::int32_t> host_ids(static_cast<std::size_t>(rows * width), -1), host_count(static_cast<std::size_t>(rows));
    for (std::int64_t r = 0; r < rows; ++r) {
      host_count[r] = csr.row_ptr[r + 1] - csr.row_ptr[r];
      std::copy(csr.col_idx.begin() + csr.row_ptr[r], csr.col_idx.begin() + csr.row_ptr[r + 1],
                host_ids.begin() + r * width);
    }
    ids = tc::buffer<std::int32_t>(host_ids);
    count = tc::buffer<std::int32_t>(host_count);
  }
  [[nodiscard]] skim::cuda::device_block_csr csr() const {
    return {.row_ptr = row_ptr.data(), .col_idx = col_idx.data(), .capacity = static_cast<std::int64_t>(col_idx.size()),
            .rows = rows};
  }
  [[nodiscard]] skim::cuda::device_block_table table() const {
    return {.ids = ids.data(), .count = count.data(), .width = width, .rows = rows};
  }
};

template <class TO>
struct device_result {
  std::vector<TO> o;
  std::vector<float> lse;
  bool guard_intact = true;
  std::uint32_t error_bits = 0;
};

template <class T>
bool all_ones(const std::vector<T>& v, std::size_t from) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(v.data());
  return std::all_of(bytes + from * sizeof(T), bytes + v.size() * sizeof(T), [](unsigned char c) { return c == 0xff; });
}

template <class TO, class T>
device_result<TO> run_sm90(const random_case<T, T>& c, tc::device_case<T, T>& dc, const device_index& idx,
                           index_form form) {
  const case_spec& s = c.spec;
  const std::size_t o_elems = static_cast<std::size_t>(c.tokens_q()) * s.heads_q * s.head_dim;
  const std::size_t lse_elems = static_cast<std::size_t>(c.tokens_q()) * s.heads_q;
  const std::size_t guard = static_cast<std::size_t>(s.heads_q) * s.head_dim;
  tc::buffer<TO> o(o_elems + guard);
  tc::buffer<float> lse(lse_elems + s.heads_q);
  const strided_view<const T> qv = c.q_view();
  const output<TO> layout(s, c.tokens_q(), false);
  const tc::buffer<T> no_tokens(8);
  const auto or_dummy = [](auto* p, auto* dummy) { return p != nullptr ? p : dummy; };
  const skim::cuda::device_view<const T> q{or_dummy(dc.q.data(), no_tokens.data()), qv.token_stride, qv.head_stride};
  const skim::cuda::device_view<TO> ov{o.data(), layout.view.token_stride, layout.view.head_stride};

  auto kv = dc.contiguous(s);
  kv.k = or_dummy(kv.k, no_tokens.data());
  kv.v = or_dummy(kv.v, no_tokens.data());
  const auto go = [&](auto index) {
    const skim::cuda::device_attention_args<T, decltype(kv), decltype(index), TO> a{
        .prob = dc.prob(s), .q = q, .kv = kv, .index = index, .o = ov, .lse = lse.data()};
    const exec::cuda::prefill_sm90 e;
    REQUIRE(e.workspace_bytes(a.prob) == 0);
    const status st = e.run(a, nullptr, 0, nullptr);
    INFO("prefill_sm90: " << std::string(st.message()));
    REQUIRE(st.ok());
    SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
  };
  if (form == index_form::csr) {
    go(idx.csr());
  } else {
    go(idx.table());
  }

  device_result<TO> r;
  r.o = o.download();
  r.lse = lse.download();
  r.guard_intact = all_ones(r.o, o_elems) && all_ones(r.lse, lse_elems);
  r.o.resize(o_elems);
  r.lse.resize(lse_elems);
  r.error_bits = dc.error_bits();
  return r;
}

template <class TO, class T>
void run_reference(const random_case<T, T>& c, const csr_storage& csr, output<TO>& ref) {
  attention_args<T, contiguous_kv<T>, index::block_csr, TO> a{
      .prob = c.prob(), .q = c.q_view(), .kv = c.contiguous(), .index = csr.view(), .o = ref.view, .lse = ref.lse};
  const status st = run_executor(exec::reference{}, a);
  INFO("reference: " << std::string(st.message()));
  REQUIRE(st.ok());
}

template <class TO, class T>
void check_against(const random_case<T, T>& c, const device_result<TO>& got, const output<TO>& ref) {
  output<TO> view(c.spec, c.tokens_q());
  std::copy(got.o.begin(), got.o.end(), view.o.begin());
  std::copy(got.lse.begin(), got.lse.end(), view.lse.begin());
  check(compare(c.prob(), view.view, ref.view, std::span<const float>(view.lse), std::span<const float>(ref.lse),
                prefill_tolerance<T>, lse_tolerance));
  CHECK(got.guard_intact);
}

template <class T, class TO>
void check_case(const case_spec& spec, std::mt19937& rng, double density, index_form form) {
  const random_case<T, T> c(spec, rng);
  const problem p = c.prob();
  const csr_storage csr = random_selection(p, rng, density);
  REQUIRE(csr.view().validate(p).ok());
  INFO(spec.describe() << ", density " << density << (form == index_form::csr ? ", csr" : ", table"));

  output<TO> ref(spec, c.tokens_q());
  run_reference(c, csr, ref);
  tc::device_case<T, T> dc(c);
  const device_index idx(csr, uniform(rng, 0, 2));
  const device_result<TO> got = run_sm90<TO>(c, dc, idx, form);
  check_against(c, got, ref);
  CHECK(got.error_bits == 0u);
}

case_spec small_spec(std::int32_t d, std::int32_t bk, std::int32_t heads_q, std::int32_t heads_kv,
                     std::vector<sequence_lengths> seqs, mask_kind mask = mask_kind::causal) {
  case_spec s;
  s.head_dim = d;
  s.block_q = 128;
  s.block_kv = bk;
  s.heads_q = heads_q;
  s.heads_kv = heads_kv;
  s.seqs = std::move(seqs);
  s.mask = mask;
  return s;
}

}  // namespace

TEST_CASE("prefill_sm90 small cases match the reference") {
  if (!is_sm90()) return;  // "prefill_sm90 host checks" covers the refusal
  std::mt19937 rng(0x5e90u);
  const std::vector<sequence_lengths> seqs{{70, 130}, {0, 5}, {128, 128}, {9, 3}};
  check_case<bf16, float>(small_spec(64, 64, 2, 1, seqs), rng, 1.0, index_form::csr);
  check_case<bf16, bf16>(small_spec(128, 64, 4, 1, seqs), rng, 0.6, index_form::table);
  check_case<f16, f16>(small_spec(64, 128, 2, 2, seqs, mask_kind::none), rng, 1.0, index_form::table);
  check_case<f16, float>(small_spec(128, 128, 1, 1, {{200, 260}}), rng, 1.0, index_form::csr);
  check_case<bf16, float>(small_spec(128, 128, 8, 1, {{33, 300}}, mask_kind::none), rng, 0.5, index_form::csr);
  check_case<f16, float>(small_spec(64, 64, 1, 1, {{129, 129}, {1, 77}}), rng, 1.0, index_form::table);
}

TEST_CASE_TEMPLATE("prefill_sm90 matches reference on random shapes", TT, types<bf16, bf16, float>,
                   types<bf16, bf16, bf16>, types<f16, f16, f16>, types<f16, f16, float>) {
  if (!is_sm90()) return;
  using T = typename TT::q;
  using TO = typename TT::o;
  for (std::uint32_t i = 0; i < 14; ++i) {
    const std::uint32_t seed = 0x90c0u + 131u * i + static_cast<std::uint32_t>(std::is_same_v<T, f16> * 7 + sizeof(TO));
    std::mt19937 rng(seed);
    const case_spec spec = sm90_spec(rng, 4e7);
    const double density = pick(rng, {0.15, 0.4, 1.0});
    const index_form form = chance(rng, 0.5) ? index_form::csr : index_form::table;
    INFO("seed " << seed);
    check_case<T, TO>(spec, rng, density, form);
  }
}

TEST_CASE("prefill_sm90 over many tiles: a long causal sequence, sparse and dense") {
  if (!is_sm90()) return;
  // Tens of tiles per CTA: the ring of K/V buffers wraps many times.
  for (const double density : {0.25, 1.0}) {
    std::mt19937 rng(0x1090u);
    check_case<bf16, float>(small_spec(128, 128, 2, 1, {{1900, 2000}, {700, 700}}), rng, density, index_form::csr);
    check_case<f16, f16>(small_spec(64, 64, 2, 1, {{1900, 2000}, {700, 700}}), rng, density, index_form::table);
  }
}

TEST_CASE("prefill_sm90 is deterministic: two runs are bit-identical") {
  if (!is_sm90()) return;
  std::mt19937 rng(0xde90u);
  const case_spec spec = small_spec(128, 128, 8, 2, {{300, 420}, {65, 65}});
  const random_case<bf16, bf16> c(spec, rng);
  const csr_storage csr = random_selection(c.prob(), rng, 0.5);
  tc::device_case<bf16, bf16> dc(c);
  const device_index idx(csr, 1);
  const auto a = run_sm90<float>(c, dc, idx, index_form::csr);
  const auto b = run_sm90<float>(c, dc, idx, index_form::csr);
  const auto t = run_sm90<float>(c, dc, idx, index_form::table);
  CHECK(std::memcmp(a.o.data(), b.o.data(), a.o.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(a.o.data(), t.o.data(), a.o.size() * sizeof(float)) == 0);
}

TEST_CASE("prefill_sm90 small bad input: ids, order and counts are skipped and reported") {
  if (!is_sm90()) return;
  std::mt19937 rng(0xbad9u);
  const case_spec spec = small_spec(64, 64, 4, 2, {{150, 200}, {64, 130}});
  const random_case<f16, f16> c(spec, rng);
  const problem p = c.prob();
  const csr_storage clean = random_selection(p, rng, 0.7);
  output<float> ref(spec, c.tokens_q());
  run_reference(c, clean, ref);
  tc::device_case<f16, f16> dc(c);

  std::vector<row_info> rows;
  REQUIRE(for_each_row(p, [&](const row_info& r) { rows.push_back(r); }).ok());
  const auto edit = [&](auto&& change) {
    csr_storage bad;
    for (const row_info& r : rows) {
      std::vector<std::int32_t> ids(clean.col_idx.begin() + clean.row_ptr[r.row],
                                    clean.col_idx.begin() + clean.row_ptr[r.row + 1]);
      change(r, ids);
      bad.col_idx.insert(bad.col_idx.end(), ids.begin(), ids.end());
      bad.row_ptr.push_back(static_cast<std::int32_t>(bad.col_idx.size()));
    }
    return bad;
  };
  const auto run_both_forms = [&](const csr_storage& bad, std::uint32_t expected_bit) {
    const device_index idx(bad, 0);
    for (const index_form form : {index_form::csr, index_form::table}) {
      INFO((form == index_form::csr ? "csr" : "table"));
      const auto got = run_sm90<float>(c, dc, idx, form);
      CHECK((got.error_bits & expected_bit) != 0u);
      check_against(c, got, ref);
    }
  };

  SUBCASE("an id past the row's visible blocks, and a negative one") {
    bool done = false;
    run_both_forms(edit([&](const row_info& r, std::vector<std::int32_t>& ids) {
                     if (done) return;
                     ids.insert(ids.begin(), -1);
                     ids.push_back(r.visible_blocks);
                     done = true;
                   }),
                   skim::cuda::bad_block_id);
  }
  SUBCASE("a repeated id and a descending pair") {
    bool done = false;
    run_both_forms(edit([&](const row_info&, std::vector<std::int32_t>& ids) {
                     if (done || ids.size() < 2) return;
                     ids.push_back(ids.back());
                     ids.push_back(ids.front());
                     done = true;
                   }),
                   skim::cuda::bad_order);
  }
  SUBCASE("a table count above the width, a CSR range past col_idx") {
    device_index idx(clean, 0);
    std::vector<std::int32_t> count = idx.count.download();
    const auto widest = std::max_element(count.begin(), count.end()) - count.begin();
    count[static_cast<std::size_t>(widest)] = idx.width + 5;
    idx.count.upload(count);
    auto got = run_sm90<float>(c, dc, idx, index_form::table);
    CHECK((got.error_bits & skim::cuda::bad_count) != 0u);
    check_against(c, got, ref);
    std::vector<std::int32_t> row_ptr = clean.row_ptr;
    row_ptr.back() += 3;
    idx.row_ptr.upload(row_ptr);
    got = run_sm90<float>(c, dc, idx, index_form::csr);
    CHECK((got.error_bits & skim::cuda::bad_count) != 0u);
    check_against(c, got, ref);
  }
}

TEST_CASE("prefill_sm90 host checks: unsupported shapes, paged K/V, misaligned views, other devices") {
  std::mt19937 rng(0x4090u);
  const exec::cuda::prefill_sm90 e;
  skim::cuda::device_problem p{.batch = 0, .heads_q = 2, .heads_kv = 1, .head_dim = 96, .block_q = 128, .block_kv = 64};
  status st = e.can_implement(p);
  CHECK(st.code() == status_code::unsupported);
  CHECK(std::string(st.message()).find("head_dim 96") != std::string::npos);
  p.head_dim = 128;
  p.block_q = 64;
  st = e.can_implement(p);
  CHECK(st.code() == status_code::unsupported);
  CHECK(std::string(st.message()).find("block_q 64") != std::string::npos);
  p.block_q = 128;
  p.block_kv = 256;
  st = e.can_implement(p);
  CHECK(st.code() == status_code::unsupported);
  CHECK(std::string(st.message()).find("block_kv 256") != std::string::npos);
  p.block_kv = 128;
  CHECK(e.can_implement(p).ok());

  case_spec spec = small_spec(64, 64, 2, 1, {{10, 10}});
  spec.paged = true;
  const random_case<bf16, bf16> c(spec, rng);
  tc::device_case<bf16, bf16> dc(c);
  tc::buffer<float> o(static_cast<std::size_t>(c.tokens_q()) * spec.heads_q * spec.head_dim);
  const device_index idx(random_selection(c.prob(), rng, 1.0), 0);
  {  // paged K/V: not implemented
    const skim::cuda::device_attention_args<bf16, skim::cuda::device_paged_kv<bf16>, skim::cuda::device_block_csr,
                                            float>
        a{.prob = dc.prob(spec), .q = {dc.q.data(), 64 * 2, 64}, .kv = dc.paged(c), .index = idx.csr(),
          .o = {o.data(), 64 * 2, 64}};
    st = e.run(a, nullptr, 0, nullptr);
    CHECK(st.code() == status_code::unsupported);
    CHECK(std::string(st.message()).find("paged") != std::string::npos);
  }
  skim::cuda::device_attention_args<bf16, skim::cuda::device_contiguous_kv<bf16>, skim::cuda::device_block_csr, float>
      a{.prob = dc.prob(spec), .q = {dc.q.data(), 64 * 2, 64}, .kv = dc.contiguous(spec), .index = idx.csr(),
        .o = {o.data(), 64 * 2, 64}};
  if (!is_sm90()) {
    st = e.run(a, nullptr, 0, nullptr);
    CHECK(st.code() == status_code::unsupported);
    CHECK(std::string(st.message()).find("not sm_90") != std::string::npos);
    return;
  }
  a.q.token_stride = 64 * 2 + 4;  // rows no longer on 16 bytes
  st = e.run(a, nullptr, 0, nullptr);
  CHECK(st.code() == status_code::unsupported);
  a.q.token_stride = 64 * 2;
  st = e.run(a, nullptr, 0, nullptr);
  CHECK(st.ok());
  SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
  CHECK(dc.error_bits() == 0u);
}
