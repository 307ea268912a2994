// Sequence isolation: no path may read another sequence's K/V (docs/design.md §5).
//
// For varlen (contiguous) and paged batches, for every sequence b: poison every other sequence's
// K/V (and Q) with NaN — in paged storage every page b does not own, spare pages and the unused
// tail of b's last page included — run the whole batch, and require b's output rows to be finite
// and bit-identical to running b alone. Then: pages shared by a common prefix work; an index id one
// block past a sequence's end and page-table entries out of range get their exact status.
//
// Executors: reference, scalar and simd<xsimd::default_arch>.

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "skim/core/attention_args.hpp"
#include "skim/exec/cpu/reference.hpp"
#include "skim/exec/cpu/scalar.hpp"
#include "skim/exec/cpu/simd.hpp"
#include "skim/index/block_table.hpp"
#include "skim/index/block_union.hpp"
#include "skim/index/causal_all.hpp"
#include "skim/index/sink.hpp"
#include "skim/index/sliding_window.hpp"
#include "support/random_case.hpp"

using namespace skim;
using namespace skim::test;

namespace {

constexpr float nan_f = std::numeric_limits<float>::quiet_NaN();

// Sequences of every kind: partial blocks, decode, empty queries, more queries than keys.
case_spec batch_spec(bool paged, std::int32_t page_size) {
  case_spec s;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.head_dim = 16;
  s.block_q = 8;
  s.block_kv = 8;
  s.seqs = {{5, 37}, {1, 20}, {16, 16}, {0, 9}, {9, 50}, {3, 3}, {12, 7}};
  s.paged = paged;
  s.page_size = page_size > 0 ? page_size : 16;  // random_case builds pages either way
  return s;
}

struct result {
  std::vector<float> o, lse;
};

template <class E, class KV, class Index>
result run_batch(const E& e, const problem& p, const float* q, const KV& kv, const Index& index) {
  result r{std::vector<float>(static_cast<std::size_t>(p.tokens_q()) * p.heads_q * p.head_dim, nan_f),
           std::vector<float>(static_cast<std::size_t>(p.tokens_q()) * p.heads_q, nan_f)};
  const attention_args<float, KV, Index, float> a{
      .prob = p, .q = strided_view<const float>::token_major(q, p.tokens_q(), p.heads_q, p.head_dim), .kv = kv,
      .index = index, .o = strided_view<float>::token_major(r.o.data(), p.tokens_q(), p.heads_q, p.head_dim),
      .lse = r.lse};
  const status s = run_executor(e, a);
  REQUIRE_MESSAGE(s.ok(), s.message());
  return r;
}

// Sequence b of the case, alone: its own Q and (contiguous) K/V slices.
template <class E, class Index>
result run_alone(const E& e, const random_case<float, float>& c, std::int32_t b, const Index& index) {
  const case_spec& s = c.spec;
  const std::int32_t nq = c.cu_q[b + 1] - c.cu_q[b], nkv = c.cu_kv[b + 1] - c.cu_kv[b];
  const std::vector<std::int32_t> cu_q{0, nq}, cu_kv{0, nkv};
  problem p = c.prob();
  p.cu_seqlens_q = cu_q;
  p.cu_seqlens_kv = cu_kv;
  const std::size_t q_row = static_cast<std::size_t>(s.heads_q) * s.head_dim;
  const std::size_t kv_row = static_cast<std::size_t>(s.heads_kv) * s.head_dim;
  const contiguous_kv<float> kv{
      .k = strided_view<const float>::token_major(c.k.data() + c.cu_kv[b] * kv_row, nkv, s.heads_kv, s.head_dim),
      .v = strided_view<const float>::token_major(c.v.data() + c.cu_kv[b] * kv_row, nkv, s.heads_kv, s.head_dim)};
  return run_batch(e, p, c.q.data() + c.cu_q[b] * q_row, kv, index);
}

// Rows [first, last) of x, each `width` floats wide.
std::span<const float> rows(const std::vector<float>& x, std::int32_t first, std::int32_t last, std::size_t width) {
  return std::span<const float>(x).subspan(first * width, (last - first) * width);
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

bool all_finite(std::span<const float> a) {
  for (float x : a) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

template <class E, class Index>
void check_isolation(const E& e, const Index& index, bool paged, std::int32_t page_size) {
  std::mt19937 rng(0x150u + static_cast<unsigned>(page_size));
  const case_spec spec = batch_spec(paged, page_size);
  const random_case<float, float> c(spec, rng);
  const problem p = c.prob();
  const std::size_t q_width = static_cast<std::size_t>(spec.heads_q) * spec.head_dim;
  const std::size_t kv_width = static_cast<std::size_t>(spec.heads_kv) * spec.head_dim;
  for (std::int32_t b = 0; b < p.batch(); ++b) {
    CAPTURE(b);
    // Every other sequence's Q and K/V poisoned.
    std::vector<float> q = c.q, k = c.k, v = c.v, k_pages = c.k_pages, v_pages = c.v_pages;
    for (std::int32_t t = 0; t < p.tokens_q(); ++t) {
      if (t < c.cu_q[b] || t >= c.cu_q[b + 1]) std::fill_n(q.begin() + t * q_width, q_width, nan_f);
    }
    result batch;
    if (!paged) {
      for (std::int32_t t = 0; t < p.tokens_kv(); ++t) {
        if (t < c.cu_kv[b] || t >= c.cu_kv[b + 1]) {
          std::fill_n(k.begin() + t * kv_width, kv_width, nan_f);
          std::fill_n(v.begin() + t * kv_width, kv_width, nan_f);
        }
      }
      const contiguous_kv<float> kv{
          .k = strided_view<const float>::token_major(k.data(), p.tokens_kv(), spec.heads_kv, spec.head_dim),
          .v = strided_view<const float>::token_major(v.data(), p.tokens_kv(), spec.heads_kv, spec.head_dim)};
      batch = run_batch(e, p, q.data(), kv, index);
    } else {
      // Slots b owns: t < seq_len in its pages; everything else (other pages, spares, tail) is NaN.
      const std::size_t page_elems = static_cast<std::size_t>(page_size) * kv_width;
      std::vector<char> owned(k_pages.size() / kv_width, 0);
      const std::int32_t n_kv = p.seq_len_kv(b);
      for (std::int32_t t = 0; t < n_kv; ++t) {
        const std::int32_t page = c.page_indices[static_cast<std::size_t>(c.page_indptr[b] + t / page_size)];
        owned[static_cast<std::size_t>(page) * page_size + t % page_size] = 1;
      }
      for (std::size_t slot = 0; slot < owned.size(); ++slot) {
        if (!owned[slot]) {
          std::fill_n(k_pages.begin() + slot * kv_width, kv_width, nan_f);
          std::fill_n(v_pages.begin() + slot * kv_width, kv_width, nan_f);
        }
      }
      REQUIRE(k_pages.size() == static_cast<std::size_t>(c.num_pages) * page_elems);
      const auto kv = paged_kv<float>::packed(k_pages.data(), v_pages.data(), c.num_pages, page_size,
                                              spec.heads_kv, spec.head_dim, c.page_indptr, c.page_indices);
      batch = run_batch(e, p, q.data(), kv, index);
    }
    const result alone = run_alone(e, c, b, index);
    const auto o_b = rows(batch.o, c.cu_q[b], c.cu_q[b + 1], q_width);
    const auto lse_b = rows(batch.lse, c.cu_q[b], c.cu_q[b + 1], spec.heads_q);
    CHECK(all_finite(o_b));
    CHECK(same_bits(o_b, alone.o));
    CHECK(same_bits(lse_b, alone.lse));
  }
}

using simd_default = exec::simd<xsimd::default_arch>;

}  // namespace

TEST_CASE_TEMPLATE("isolation: a sequence's output ignores every other sequence's K/V (NaN-poisoned)", E,
                   exec::reference, exec::scalar, simd_default) {
  const auto sparse = index::make_union(index::sink{1}, index::sliding_window{2});
  SUBCASE("varlen, causal_all") { check_isolation(E{}, index::causal_all{}, false, 0); }
  SUBCASE("varlen, sink + window") { check_isolation(E{}, sparse, false, 0); }
  SUBCASE("paged, page 3") { check_isolation(E{}, index::causal_all{}, true, 3); }
  SUBCASE("paged, page 16") { check_isolation(E{}, sparse, true, 16); }
}

TEST_CASE_TEMPLATE("isolation: pages shared by a common prefix are allowed and read as each sequence's own", E,
                   exec::reference, exec::scalar, simd_default) {
  // Two sequences whose first 16 keys are the same two pages (page size 8), then their own pages.
  std::mt19937 rng(0x5a3eu);
  case_spec spec = batch_spec(false, 8);
  spec.seqs = {{6, 30}, {9, 21}};
  random_case<float, float> c(spec, rng);
  // Make the contiguous K/V agree with the sharing: sequence 1's first 16 keys = sequence 0's.
  const std::size_t kv_width = static_cast<std::size_t>(spec.heads_kv) * spec.head_dim;
  std::copy_n(c.k.begin(), 16 * kv_width, c.k.begin() + c.cu_kv[1] * kv_width);
  std::copy_n(c.v.begin(), 16 * kv_width, c.v.begin() + c.cu_kv[1] * kv_width);
  // Pages: 0..3 for sequence 0 (30 keys), sequence 1 = pages 0, 1 (shared) + 4, 5 (its own 5 keys).
  const std::int32_t page = 8, num_pages = 6;
  std::vector<float> k_pages(num_pages * page * kv_width, nan_f), v_pages(k_pages.size(), nan_f);
  const auto place = [&](std::int32_t seq, std::int32_t t, std::int32_t phys) {
    const std::size_t src = (c.cu_kv[seq] + t) * kv_width, dst = (phys * page + t % page) * kv_width;
    std::copy_n(c.k.begin() + src, kv_width, k_pages.begin() + dst);
    std::copy_n(c.v.begin() + src, kv_width, v_pages.begin() + dst);
  };
  for (std::int32_t t = 0; t < 30; ++t) place(0, t, t / page);
  for (std::int32_t t = 16; t < 21; ++t) place(1, t, 4 + (t - 16) / page);
  const std::vector<std::int32_t> indptr{0, 4, 7}, indices{0, 1, 2, 3, 0, 1, 4};
  const problem p = c.prob();
  const auto paged = paged_kv<float>::packed(k_pages.data(), v_pages.data(), num_pages, page, spec.heads_kv,
                                             spec.head_dim, indptr, indices);
  REQUIRE(paged.validate(p).ok());
  const result shared = run_batch(E{}, p, c.q.data(), paged, index::causal_all{});
  const result contiguous = run_batch(E{}, p, c.q.data(), c.contiguous(), index::causal_all{});
  CHECK(all_finite(shared.o));
  CHECK(same_bits(shared.o, contiguous.o));
  CHECK(same_bits(shared.lse, contiguous.lse));
}

TEST_CASE_TEMPLATE("isolation: an id one block past a sequence's end is a status, not a read of the next sequence",
                   E, exec::reference, exec::scalar, simd_default) {
  std::mt19937 rng(0x0b1u);
  const case_spec spec = batch_spec(false, 0);
  const random_case<float, float> c(spec, rng);
  const problem p = c.prob();
  // A block table: every row its visible blocks; then row 0 (sequence 0, 37 keys = 5 blocks of 8,
  // query block 0, kv head 0) gets id 5 — the first block of sequence 1 in the packed K/V.
  const std::int32_t width = p.max_kv_blocks() + 1;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(p.index_rows()) * width, -1), count(p.index_rows());
  REQUIRE(for_each_row(p, [&](const row_info& r) {
            for (std::int32_t j = 0; j < r.visible_blocks; ++j) ids[r.row * width + j] = j;
            count[r.row] = r.visible_blocks;
          }).ok());
  const row_info row0 = make_row_info(p, 0, 0, 0, 0);
  REQUIRE(row0.kv_blocks == 5);
  REQUIRE(count[0] == 5);
  ids[5] = 5;
  count[0] = 6;
  const index::block_table table{ids, count, width};
  const status v = table.validate(p);
  CHECK(v.code() == status_code::invalid_index);
  CHECK(std::string_view(v.message()) == "block id 5 >= kv blocks 5 of sequence 0 in row 0 (position 5)");

  output<float> out(spec, c.tokens_q());
  const attention_args<float, contiguous_kv<float>, index::block_table, float> a{
      .prob = p, .q = c.q_view(), .kv = c.contiguous(), .index = table, .o = out.view, .lse = out.lse};
  const status s = run_executor(E{}, a);
  CHECK(s.code() == status_code::invalid_index);
  CHECK(std::string_view(s.message()) == "block id 5 >= kv blocks 5 of sequence 0 in row 0 (position 5)");
}

TEST_CASE_TEMPLATE("isolation: page-table entries out of range and short page lists are statuses", E,
                   exec::reference, exec::scalar, simd_default) {
  std::mt19937 rng(0x9a9eu);
  const case_spec spec = batch_spec(true, 8);
  random_case<float, float> c(spec, rng);
  output<float> out(spec, c.tokens_q());
  const auto run_with = [&](std::vector<std::int32_t> indptr, std::vector<std::int32_t> indices) {
    auto kv = c.paged();
    kv.page_indptr = indptr;
    kv.page_indices = indices;
    const attention_args<float, paged_kv<float>, index::causal_all, float> a{
        .prob = c.prob(), .q = c.q_view(), .kv = kv, .index = {}, .o = out.view, .lse = out.lse};
    return run_executor(E{}, a);
  };
  REQUIRE(run_with(c.page_indptr, c.page_indices).ok());
  // Sequence 1 (20 keys) owns page_indices[5, 8): entries 5..7.
  REQUIRE(c.page_indptr[1] == 5);
  {
    auto bad = c.page_indices;
    bad[6] = c.num_pages;
    const status s = run_with(c.page_indptr, bad);
    CHECK(s.code() == status_code::invalid_index);
    CHECK(std::string_view(s.message()) ==
          "page_indices[6] = " + std::to_string(c.num_pages) + " out of [0, " + std::to_string(c.num_pages) +
              ") for sequence 1");
    bad[6] = -1;
    CHECK(std::string_view(run_with(c.page_indptr, bad).message()) ==
          "page_indices[6] = -1 out of [0, " + std::to_string(c.num_pages) + ") for sequence 1");
  }
  {
    auto short_indptr = c.page_indptr;
    short_indptr[2] -= 1;  // sequence 1 loses its last page
    const status s = run_with(short_indptr, c.page_indices);
    CHECK(s.code() == status_code::shape_mismatch);
    CHECK(std::string_view(s.message()) == "sequence 1 has 2 pages, needs 3 for 20 keys");
  }
  {
    auto beyond = c.page_indptr;
    beyond.back() += 1;  // the table claims one page more than page_indices holds
    const status s = run_with(beyond, c.page_indices);
    CHECK(s.code() == status_code::shape_mismatch);
    CHECK(std::string_view(s.message()) == "page_indptr[7] = " + std::to_string(beyond.back()) +
                                               " > page_indices size " + std::to_string(c.page_indices.size()));
  }
}
