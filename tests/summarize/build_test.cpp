#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "skim/summarize/build.hpp"
#include "skim/summarize/lsh_buckets.hpp"
#include "skim/summarize/max_bound.hpp"
#include "skim/summarize/mean_pool.hpp"
#include "skim/summarize/multi_centroid.hpp"
#include "skim/summarize/probe_max.hpp"
#include "skim/core/workspace.hpp"
#include "summarize/summarize_testing.hpp"

using namespace skim;
using namespace summarize_test;
namespace sm = skim::summarize;

namespace {

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size_bytes()) == 0);
}

// A varlen batch: 2..4 sequences, one of them empty, one with a ragged last block (block_kv > 1).
struct batch_case {
  std::vector<std::int32_t> cq{0}, ck{0};
  std::int32_t heads_kv = 1, head_dim = 1, block_kv = 1;
  [[nodiscard]] problem get() const {
    return problem{.heads_q = 2 * heads_kv, .heads_kv = heads_kv, .head_dim = head_dim, .block_q = 4,
                   .block_kv = block_kv, .cu_seqlens_q = cq, .cu_seqlens_kv = ck};
  }
};
batch_case random_batch(std::mt19937& rng) {
  batch_case c;
  static constexpr std::int32_t bks[] = {1, 3, 4, 7, 16};
  c.block_kv = bks[uniform(rng, 0, 4)];
  c.heads_kv = uniform(rng, 1, 3);
  c.head_dim = uniform(rng, 1, 20);
  const int n = uniform(rng, 2, 4);
  const int empty = uniform(rng, 0, n - 1);
  const int ragged = (empty + 1) % n;
  for (int b = 0; b < n; ++b) {
    std::int32_t len = uniform(rng, 1, 45);
    if (b == empty) len = 0;
    if (b == ragged && c.block_kv > 1 && len % c.block_kv == 0) len += uniform(rng, 1, c.block_kv - 1);
    c.cq.push_back(c.cq.back() + 1);
    c.ck.push_back(c.ck.back() + len);
  }
  return c;
}

// Paged copy of token-major keys [tokens, heads_kv, head_dim]: page_size tokens per page, the pages of
// all sequences scattered by a random permutation among a few more pages than needed; unused slots
// hold other random values, so reading a wrong slot shows.
template <element T>
struct paged_copy {
  std::vector<T> pages;
  std::vector<std::int32_t> indptr{0}, indices;
  std::int32_t num_pages = 0, page_size = 1;

  paged_copy(std::mt19937& rng, const problem& p, const std::vector<T>& keys) {
    static constexpr std::int32_t sizes[] = {1, 2, 3, 5, 8};
    page_size = sizes[uniform(rng, 0, 4)];
    std::int32_t needed = 0;
    for (std::int32_t b = 0; b < p.batch(); ++b) needed += (p.seq_len_kv(b) + page_size - 1) / page_size;
    num_pages = needed + uniform(rng, 1, 3);
    std::vector<std::int32_t> perm(num_pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    const std::int64_t row = static_cast<std::int64_t>(p.heads_kv) * p.head_dim;
    pages = to_elements<T>(random_values(rng, static_cast<std::size_t>(num_pages * page_size * row)));
    std::int32_t next = 0;
    for (std::int32_t b = 0; b < p.batch(); ++b) {
      const std::int32_t n = p.seq_len_kv(b);
      for (std::int32_t pg = 0; pg < (n + page_size - 1) / page_size; ++pg) indices.push_back(perm[next++]);
      indptr.push_back(static_cast<std::int32_t>(indices.size()));
      for (std::int32_t t = 0; t < n; ++t) {
        const std::int32_t page = indices[indptr[b] + t / page_size];
        std::copy_n(keys.begin() + (p.cu_seqlens_kv[b] + t) * row, row,
                    pages.begin() + (static_cast<std::int64_t>(page) * page_size + t % page_size) * row);
      }
    }
  }
  [[nodiscard]] paged_kv<T> kv(const problem& p) const {
    return paged_kv<T>::packed(pages.data(), pages.data(), num_pages, page_size, p.heads_kv, p.head_dim, indptr,
                               indices);
  }
};

// Batch build, then the same cache token by token through append(), then each record rebuilt from the
// raw keys by the summarizer's own steps: all three must hold the same bits.
template <summarizer S, element T, kv_source Kv>
void check_build_and_append(std::mt19937& rng, const problem& p, const Kv& kv, const std::vector<T>& keys) {
  const sm::summary_layout l = sm::make_summary_layout<S>(p);
  workspace_buffer ws(sm::workspace_bytes<S>(p));
  const std::size_t n = static_cast<std::size_t>(l.floats());

  std::vector<float> built = random_values(rng, n + 3);  // 3 floats past the layout stay untouched
  const std::vector<float> tail(built.end() - 3, built.end());
  const status s = sm::build<S>(p, kv, built, ws.span());
  REQUIRE_MESSAGE(s.ok(), s.message());
  CHECK(same_bits(std::span(built).subspan(n), tail));

  std::vector<float> appended = random_values(rng, n);  // garbage: every record must be initialised by its slot 0
  std::int32_t longest = 0;
  for (std::int32_t b = 0; b < p.batch(); ++b) longest = std::max(longest, p.seq_len_kv(b));
  for (std::int32_t t = 0; t < longest; ++t) {
    for (std::int32_t b = 0; b < p.batch(); ++b) {
      if (t >= p.seq_len_kv(b)) continue;
      const auto seq_records = std::span(appended).subspan(l.sequence_offset(b), l.sequence_floats(b));
      const status a = sm::append<S>(p, kv, {.seq = b, .position = t, .records = seq_records}, ws.span());
      REQUIRE_MESSAGE(a.ok(), a.message());
    }
  }
  CHECK(same_bits(std::span(built).first(n), appended));

  const std::int64_t row = static_cast<std::int64_t>(p.heads_kv) * p.head_dim;
  for (std::int32_t b = 0; b < p.batch(); ++b) {
    for (std::int32_t j = 0; j < p.kv_blocks(b); ++j) {
      const std::int32_t first = j * p.block_kv;
      const std::int32_t len = std::min(p.block_kv, p.seq_len_kv(b) - first);
      for (std::int32_t h = 0; h < p.heads_kv; ++h) {
        std::vector<T> block(static_cast<std::size_t>(len) * p.head_dim);
        for (std::int32_t s = 0; s < len; ++s) {
          std::copy_n(keys.begin() + (p.cu_seqlens_kv[b] + first + s) * row + h * p.head_dim, p.head_dim,
                      block.begin() + s * p.head_dim);
        }
        const std::vector<float> want = block_record<S>(block, len, p.block_kv, p.head_dim);
        INFO("sequence " << b << " block " << j << " head " << h);
        CHECK(same_bits(std::span(built).subspan(l.record_offset(l.kv_block_offset(b) + j, h), want.size()), want));
      }
    }
  }
}

template <summarizer S, element T>
void check_sources(std::mt19937& rng, int iters) {
  for (int iter = 0; iter < iters; ++iter) {
    const batch_case c = random_batch(rng);
    const problem p = c.get();
    INFO(element_name<T> << " iter " << iter << " block_kv " << c.block_kv << " heads_kv " << c.heads_kv
                         << " head_dim " << c.head_dim << " batch " << p.batch() << " tokens_kv " << p.tokens_kv());
    const auto keys = to_elements<T>(random_values(rng, static_cast<std::size_t>(p.tokens_kv()) * c.heads_kv * c.head_dim));
    const auto view = strided_view<const T>::token_major(keys.data(), p.tokens_kv(), c.heads_kv, c.head_dim);
    {
      INFO("contiguous K");
      check_build_and_append<S>(rng, p, contiguous_kv<T>{.k = view, .v = view}, keys);
    }
    const paged_copy<T> paged(rng, p, keys);
    {
      INFO("paged K, page_size " << paged.page_size << ", pages " << paged.num_pages);
      check_build_and_append<S>(rng, p, paged.kv(p), keys);
    }
  }
}

template <summarizer S>
void check_all_types(std::mt19937& rng) {
  check_sources<S, float>(rng, 4);
  check_sources<S, half>(rng, 3);
  check_sources<S, bfloat16>(rng, 3);
}

// lens {5, 0, 9}, block_kv 4, 2 kv heads, head_dim 3: kv blocks {2, 0, 3}.
struct fixed_case {
  std::vector<std::int32_t> cq{0, 1, 2, 3}, ck{0, 5, 5, 14};
  std::vector<float> keys;
  fixed_case() {
    std::mt19937 rng(fresh_seed());
    keys = random_values(rng, 14 * 2 * 3);
  }
  [[nodiscard]] problem get() const {
    return problem{.heads_q = 2, .heads_kv = 2, .head_dim = 3, .block_q = 4, .block_kv = 4,
                   .cu_seqlens_q = cq, .cu_seqlens_kv = ck};
  }
  [[nodiscard]] contiguous_kv<float> kv() const {
    const auto v = strided_view<const float>::token_major(keys.data(), 14, 2, 3);
    return {.k = v, .v = v};
  }
};

}  // namespace

TEST_CASE("summarize::summary_layout: blocks of each sequence are contiguous, in sequence order") {
  const fixed_case f;
  const problem p = f.get();
  const auto l = sm::make_summary_layout<sm::mean_pool>(p);
  CHECK(l.record_floats == 4);
  CHECK(l.kv_blocks(0) == 2);
  CHECK(l.kv_blocks(1) == 0);
  CHECK(l.kv_blocks(2) == 3);
  CHECK(l.kv_block_offset(1) == 2);
  CHECK(l.kv_block_offset(2) == 2);
  CHECK(l.total_kv_blocks == 5);
  CHECK(l.block_floats() == 8);
  CHECK(l.floats() == 40);
  CHECK(l.record_offset(3, 1) == 28);
  CHECK(l.sequence_offset(2) == 16);
  CHECK(l.sequence_floats(2) == 24);
  CHECK(sm::workspace_bytes<sm::mean_pool>(p) == 0);
  CHECK(sm::workspace_bytes<sm::multi_centroid<3>>(p) == (4 * 3 + 3) * sizeof(float));
}

TEST_CASE("summarize::build and append agree bit for bit: mean_pool") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  check_all_types<sm::mean_pool>(rng);
}

TEST_CASE("summarize::build and append agree bit for bit: max_bound") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  check_all_types<sm::max_bound>(rng);
}

TEST_CASE("summarize::build and append agree bit for bit: probe_max") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  check_all_types<sm::probe_max<3>>(rng);
}

TEST_CASE("summarize::build and append agree bit for bit: lsh_buckets") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  check_all_types<sm::lsh_buckets<3, 5>>(rng);
}

TEST_CASE("summarize::build and append agree bit for bit: multi_centroid") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  check_all_types<sm::multi_centroid<3>>(rng);
  check_sources<sm::multi_centroid<2, 1>, half>(rng, 2);
}

TEST_CASE("summarize::append resumes a build of a shorter prefix") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  using S = sm::multi_centroid<2>;
  for (int iter = 0; iter < 10; ++iter) {
    const std::int32_t n = uniform(rng, 1, 60), n0 = uniform(rng, 0, n), bk = uniform(rng, 1, 9), d = uniform(rng, 1, 9);
    INFO("iter " << iter << " n " << n << " prefix " << n0 << " block_kv " << bk << " head_dim " << d);
    const std::vector<std::int32_t> cq{0, 1}, ck{0, n}, ck0{0, n0};
    const problem p{.heads_q = 1, .heads_kv = 1, .head_dim = d, .block_kv = bk, .cu_seqlens_q = cq, .cu_seqlens_kv = ck};
    problem p0 = p;
    p0.cu_seqlens_kv = ck0;
    const std::vector<float> keys = random_values(rng, static_cast<std::size_t>(n) * d);
    const auto k = strided_view<const float>::token_major(keys.data(), n, 1, d);
    const auto k0 = strided_view<const float>::token_major(keys.data(), n0, 1, d);
    workspace_buffer ws(sm::workspace_bytes<S>(p));
    const std::size_t size = static_cast<std::size_t>(sm::make_summary_layout<S>(p).floats());
    std::vector<float> full(size), resumed = random_values(rng, size);
    REQUIRE(sm::build<S>(p, contiguous_kv<float>{.k = k, .v = k}, full, ws.span()).ok());
    REQUIRE(sm::build<S>(p0, contiguous_kv<float>{.k = k0, .v = k0}, resumed, ws.span()).ok());
    for (std::int32_t t = n0; t < n; ++t) {
      REQUIRE(sm::append<S>(p, contiguous_kv<float>{.k = k, .v = k}, {.seq = 0, .position = t, .records = resumed}, ws.span()).ok());
    }
    CHECK(same_bits(full, resumed));
  }
}

TEST_CASE("summarize::build and append report bad input with the value and its place") {
  const fixed_case f;
  const problem p = f.get();
  std::vector<float> records(40);
  workspace_buffer ws(sm::workspace_bytes<sm::multi_centroid<3>>(p));
  REQUIRE(sm::build<sm::mean_pool>(p, f.kv(), records, {}).ok());

  status s = sm::build<sm::mean_pool>(p, f.kv(), std::span(records).first(39), {});
  CHECK(s.code() == status_code::shape_mismatch);
  CHECK(std::string_view(s.message()) == "records has 39 floats, needs 40 (5 kv blocks x 2 kv heads x 4 floats)");

  problem bad_dim = p;
  bad_dim.head_dim = 0;
  s = sm::build<sm::mean_pool>(bad_dim, f.kv(), records, {});
  CHECK(s.code() == status_code::invalid_argument);
  CHECK(std::string_view(s.message()) == "head_dim 0 <= 0");

  std::vector<float> mc_records(static_cast<std::size_t>(sm::make_summary_layout<sm::multi_centroid<3>>(p).floats()));
  s = sm::build<sm::multi_centroid<3>>(p, f.kv(), mc_records, {});
  CHECK(s.code() == status_code::workspace_too_small);
  CHECK(std::string_view(s.message()) == "workspace has 0 bytes, needs 60");
  CHECK(sm::build<sm::multi_centroid<3>>(p, f.kv(), mc_records, ws.span()).ok());

  auto short_k = f.kv();
  short_k.k.tokens = 13;
  s = sm::build<sm::mean_pool>(p, short_k, records, {});
  CHECK(s.code() == status_code::shape_mismatch);
  CHECK(std::string_view(s.message()) == "K is [13, 2, 3], expected [14, 2, 3]");

  const auto seq2 = std::span(records).subspan(16, 24);
  CHECK(sm::append<sm::mean_pool>(p, f.kv(), {.seq = 2, .position = 8, .records = seq2}, {}).ok());
  s = sm::append<sm::mean_pool>(p, f.kv(), {.seq = 3, .position = 0, .records = seq2}, {});
  CHECK(s.code() == status_code::invalid_argument);
  CHECK(std::string_view(s.message()) == "append sequence 3 out of [0, 3)");
  s = sm::append<sm::mean_pool>(p, f.kv(), {.seq = -1, .position = 0, .records = seq2}, {});
  CHECK(std::string_view(s.message()) == "append sequence -1 out of [0, 3)");
  s = sm::append<sm::mean_pool>(p, f.kv(), {.seq = 2, .position = 9, .records = seq2}, {});
  CHECK(s.code() == status_code::invalid_argument);
  CHECK(std::string_view(s.message()) == "append position 9 out of [0, 9) keys of sequence 2");
  s = sm::append<sm::mean_pool>(p, f.kv(), {.seq = 1, .position = 0, .records = seq2}, {});
  CHECK(std::string_view(s.message()) == "append position 0 out of [0, 0) keys of sequence 1");
  s = sm::append<sm::mean_pool>(p, f.kv(), {.seq = 2, .position = -2, .records = seq2}, {});
  CHECK(std::string_view(s.message()) == "append position -2 out of [0, 9) keys of sequence 2");
  s = sm::append<sm::mean_pool>(p, f.kv(), {.seq = 2, .position = 8, .records = seq2.first(23)}, {});
  CHECK(s.code() == status_code::shape_mismatch);
  CHECK(std::string_view(s.message()) ==
        "records of sequence 2 has 23 floats, needs 24 for key 8 in block 2 (3 blocks x 2 kv heads x 4 floats)");
  CHECK(sm::append<sm::mean_pool>(p, f.kv(), {.seq = 2, .position = 7, .records = seq2.first(16)}, {}).ok());
  s = sm::append<sm::multi_centroid<3>>(p, f.kv(), {.seq = 0, .position = 3, .records = mc_records}, {});
  CHECK(std::string_view(s.message()) == "workspace has 0 bytes, needs 60");

  // A paged source's own checks come through unchanged.
  const std::vector<std::int32_t> indptr{0, 2, 2, 5}, indices{0, 1, 2, 3, 9};
  const auto paged = paged_kv<float>::packed(f.keys.data(), f.keys.data(), 5, 3, 2, 3, indptr, indices);
  s = sm::build<sm::mean_pool>(p, paged, records, {});
  CHECK(s.code() == status_code::invalid_index);
  CHECK(std::string_view(s.message()) == "page_indices[4] = 9 out of [0, 5) for sequence 2");
}

TEST_CASE("summarize::append_newest grows every sequence of a paged batch by one key per step") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  using S = sm::multi_centroid<2>;
  using T = half;
  for (int iter = 0; iter < 6; ++iter) {
    // Prefix lengths (one sequence stays empty throughout), then `steps` decode steps.
    const batch_case c = random_batch(rng);
    const std::int32_t steps = uniform(rng, 1, 20);
    const std::int32_t batch = static_cast<std::int32_t>(c.ck.size()) - 1;
    std::vector<std::int32_t> prefix(batch), final_ck{0};
    std::int32_t empty = -1;
    for (std::int32_t b = 0; b < batch; ++b) {
      prefix[b] = c.ck[b + 1] - c.ck[b];
      if (prefix[b] == 0 && empty < 0) empty = b;
      final_ck.push_back(final_ck.back() + (b == empty ? 0 : prefix[b] + steps));
    }
    INFO("iter " << iter << " steps " << steps << " block_kv " << c.block_kv << " empty sequence " << empty);
    problem final_p = c.get();
    final_p.cu_seqlens_kv = final_ck;
    const auto keys = to_elements<T>(random_values(rng, static_cast<std::size_t>(final_p.tokens_kv()) * c.heads_kv * c.head_dim));
    const paged_copy<T> paged(rng, final_p, keys);
    workspace_buffer ws(sm::workspace_bytes<S>(final_p));

    const sm::summary_layout lf = sm::make_summary_layout<S>(final_p);
    std::vector<float> want(static_cast<std::size_t>(lf.floats()));
    REQUIRE(sm::build<S>(final_p, paged.kv(final_p), want, ws.span()).ok());

    // The engine's per-sequence record spans, filled from a build of the prefixes.
    const problem prefix_p = c.get();
    const sm::summary_layout lp = sm::make_summary_layout<S>(prefix_p);
    std::vector<float> prefix_records(static_cast<std::size_t>(lp.floats()));
    // The final page table covers every prefix too (a sequence may hold more pages than it needs).
    REQUIRE(sm::build<S>(prefix_p, paged.kv(prefix_p), prefix_records, ws.span()).ok());
    std::vector<std::vector<float>> own(batch);
    std::vector<std::span<float>> spans(batch);
    for (std::int32_t b = 0; b < batch; ++b) {
      own[b] = random_values(rng, static_cast<std::size_t>(lf.sequence_floats(b)));
      std::copy_n(prefix_records.begin() + lp.sequence_offset(b), lp.sequence_floats(b), own[b].begin());
      spans[b] = own[b];
    }
    std::vector<std::int32_t> ck{0};
    for (std::int32_t s = 1; s <= steps; ++s) {
      ck.assign(1, 0);
      for (std::int32_t b = 0; b < batch; ++b) ck.push_back(ck.back() + (b == empty ? 0 : prefix[b] + s));
      problem step_p = c.get();
      step_p.cu_seqlens_kv = ck;
      const status a = sm::append_newest<S>(step_p, paged.kv(step_p), spans, ws.span());
      REQUIRE_MESSAGE(a.ok(), a.message());
    }
    for (std::int32_t b = 0; b < batch; ++b) {
      INFO("sequence " << b);
      CHECK(same_bits(std::span(want).subspan(lf.sequence_offset(b), lf.sequence_floats(b)), own[b]));
    }

    std::vector<std::span<float>> short_spans = spans;
    short_spans.pop_back();
    const status bad = sm::append_newest<S>(final_p, paged.kv(final_p), short_spans, ws.span());
    CHECK(bad.code() == status_code::shape_mismatch);
    CHECK(std::string_view(bad.message()) ==
          "seq_records has " + std::to_string(batch - 1) + " spans, expected batch = " + std::to_string(batch));
  }
}

TEST_CASE("summarize::append_newest names a sequence whose records are too short") {
  const fixed_case f;
  const problem p = f.get();
  std::vector<float> a(16), b, c(23);  // sequence 0: 5 keys, 2 blocks; sequence 1: empty
  const std::vector<std::span<float>> spans{a, b, c};
  const status s = sm::append_newest<sm::mean_pool>(p, f.kv(), spans, {});
  CHECK(s.code() == status_code::shape_mismatch);
  CHECK(std::string_view(s.message()) ==
        "records of sequence 2 has 23 floats, needs 24 for key 8 in block 2 (3 blocks x 2 kv heads x 4 floats)");
  c.resize(24);
  const std::vector<std::span<float>> ok_spans{a, b, c};
  CHECK(sm::append_newest<sm::mean_pool>(p, f.kv(), ok_spans, {}).ok());
}
