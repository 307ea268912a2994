// index::build_vertical_slash against a brute force written here (each query's probabilities in
// double over the keys it sees, every id set a std::set built query by query), on random shapes:
// varlen batches with empty sequences and decode rows, GQA 1/2/4, both index scopes, odd head dims,
// partial last blocks, block_q != block_kv, causal and no mask, fp32, fp16 and bf16 Q/K. Then: the
// CSR validates and stays inside its capacity; bad input costs a status and leaves the outputs alone;
// the ids do not depend on the workspace's contents and the build does not allocate; the CPU
// executors over the CSR match exec::reference over it; a planted column and diagonal are kept; and
// the index covers more attention mass than a sliding window of as many blocks.
#include "skim/index/vertical_slash.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <xsimd/xsimd.hpp>

#include "skim/core/attention_args.hpp"
#include "skim/exec/cpu/reference.hpp"
#include "skim/exec/cpu/scalar.hpp"
#include "skim/exec/cpu/simd.hpp"
#include "skim/index/block_csr.hpp"
#include "support/allocation_counter.hpp"
#include "support/compare.hpp"
#include "support/random_case.hpp"
#include "support/seed.hpp"

namespace {

using namespace skim;
using namespace skim::test;
using index::vertical_slash_options;
using id_sets = std::vector<std::set<std::int32_t>>;

// "{1, 4, 9}", for failure reports.
std::string text(const std::set<std::int32_t>& ids) {
  std::string s = "{";
  for (const std::int32_t id : ids) s += (s.size() > 1 ? ", " : "") + std::to_string(id);
  return s + "}";
}

// CHECKs that a row holds the ids it should, printing both sets when it does not.
void check_ids(const std::set<std::int32_t>& have, const std::set<std::int32_t>& want) {
  CHECK_MESSAGE(have == want, "have ", text(have), ", want ", text(want));
}

// A random shape: the cases the index must handle (see the file comment), kept small enough for
// the brute force.
case_spec vs_spec(std::mt19937& rng) {
  case_spec s;
  s.head_dim = pick(rng, {1, 3, 5, 8, 13, 16, 33});
  s.heads_kv = uniform(rng, 1, 2);
  s.heads_q = s.heads_kv * pick(rng, {1, 2, 4});
  s.block_q = pick(rng, {1, 3, 5, 7, 16, 17, 32});
  do {
    s.block_kv = pick(rng, {1, 2, 3, 5, 7, 13, 16, 24});
  } while (s.block_kv == s.block_q && chance(rng, 0.8));
  s.mask = chance(rng, 0.75) ? mask_kind::causal : mask_kind::none;
  s.scope = chance(rng, 0.5) ? index_scope::kv_head : index_scope::query_head;
  s.softmax_scale = chance(rng, 0.5) ? 0.0f
                                     : std::uniform_real_distribution<float>(0.3f, 3.0f)(rng) /
                                           std::sqrt(static_cast<float>(s.head_dim));
  s.seqs.clear();
  const std::int32_t batch = uniform(rng, 1, 4);
  for (std::int32_t b = 0; b < batch; ++b) {
    sequence_lengths l;
    l.kv = uniform(rng, 1, 120);
    switch (uniform(rng, 0, 7)) {
      case 0: l = {0, chance(rng, 0.5) ? 0 : l.kv}; break;                          // empty
      case 1: l.q = 1; break;                                                      // decode
      case 2: l.q = uniform(rng, 1, 120); l.kv = uniform(rng, 0, std::max(0, l.q - 1)); break;  // q > kv
      case 3: case 4: l.q = l.kv; break;                                           // prefill
      default: l.q = uniform(rng, 1, l.kv); break;                                 // prefix cached
    }
    s.seqs.push_back(l);
  }
  s.q_head_major = chance(rng, 0.3);
  s.paged = chance(rng, 0.3);
  s.page_size = pick(rng, {3, 16, 17});
  return s;
}

vertical_slash_options random_options(std::mt19937& rng) {
  vertical_slash_options o;
  o.columns = chance(rng, 0.15) ? 100000 : uniform(rng, 0, 10);
  o.diagonals = chance(rng, 0.15) ? 100000 : uniform(rng, 0, 10);
  o.sink_blocks = uniform(rng, 0, 2);
  o.window_blocks = uniform(rng, 0, 2);
  o.last_q = pick(rng, {1, 2, 5, 16, 64, 1000});
  return o;
}

std::string describe(const vertical_slash_options& o) {
  return "columns " + std::to_string(o.columns) + " diagonals " + std::to_string(o.diagonals) + " sink " +
         std::to_string(o.sink_blocks) + " window " + std::to_string(o.window_blocks) + " last_q " +
         std::to_string(o.last_q);
}

// The k best indices of scores (score descending, index ascending, NaN as -inf), by a full sort.
std::set<std::int32_t> brute_top(const std::vector<double>& scores, std::int32_t k) {
  const auto key = [&](std::int32_t j) {
    return std::isnan(scores[j]) ? -std::numeric_limits<double>::infinity() : scores[j];
  };
  std::vector<std::int32_t> ids(scores.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::sort(ids.begin(), ids.end(), [&](std::int32_t a, std::int32_t b) {
    return key(a) > key(b) || (key(a) == key(b) && a < b);
  });
  const auto n = std::min<std::size_t>(ids.size(), static_cast<std::size_t>(std::max(k, 0)));
  return {ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n)};
}

// The exact probabilities of query t (relative to sequence b) of query head g over the keys
// [0, n_kv) of its sequence, in double; keys it may not see get 0, and a query that sees none gets
// an empty vector.
template <class TQ, class TK>
std::vector<double> brute_probs(const problem& p, strided_view<const TQ> q, strided_view<const TK> k, std::int32_t b,
                                std::int32_t t, std::int32_t g) {
  const std::int32_t n_q = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
  const std::int32_t n_kv = p.cu_seqlens_kv[b + 1] - p.cu_seqlens_kv[b];
  const std::int32_t kv_head = g / (p.heads_q / p.heads_kv);
  const double scale = p.scale();  // the problem's scale, a float
  std::vector<double> logits;
  for (std::int32_t j = 0; j < n_kv; ++j) {
    if (p.mask == mask_kind::causal && j > t + n_kv - n_q) break;
    double dot = 0.0;
    for (std::int32_t e = 0; e < p.head_dim; ++e) {
      dot += static_cast<double>(to_float(q.row(p.cu_seqlens_q[b] + t, g)[e])) *
             static_cast<double>(to_float(k.row(p.cu_seqlens_kv[b] + j, kv_head)[e]));
    }
    logits.push_back(scale * dot);
  }
  if (logits.empty()) return {};
  const double m = *std::max_element(logits.begin(), logits.end());
  double z = 0.0;
  for (double& x : logits) z += (x = std::exp(x - m));
  std::vector<double> probs(static_cast<std::size_t>(n_kv), 0.0);
  for (std::size_t j = 0; j < logits.size(); ++j) probs[j] = logits[j] / z;
  return probs;
}

// The index, from the definition: per (sequence, index head) the pattern of the last queries, then
// per query block and query the blocks of the kept columns and diagonals it sees, sink and window.
template <class TQ, class TK>
id_sets brute_rows(const problem& p, strided_view<const TQ> q, strided_view<const TK> k,
                   const vertical_slash_options& o) {
  const std::int32_t group = p.heads_q / p.heads_kv;
  const std::int32_t heads = p.scope == index_scope::kv_head ? p.heads_kv : p.heads_q;
  id_sets rows;
  std::int64_t first_row_block = 0;
  for (std::int32_t b = 0; b + 1 < static_cast<std::int32_t>(p.cu_seqlens_q.size()); ++b) {
    const std::int32_t n_q = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
    const std::int32_t n_kv = p.cu_seqlens_kv[b + 1] - p.cu_seqlens_kv[b];
    const std::int32_t q_blocks = (n_q + p.block_q - 1) / p.block_q;
    rows.resize(static_cast<std::size_t>((first_row_block + q_blocks) * heads));
    const auto sees = [&](std::int32_t t, std::int32_t j) {
      return j >= 0 && j < n_kv && (p.mask == mask_kind::none || j <= t + n_kv - n_q);
    };
    for (std::int32_t h = 0; h < heads; ++h) {
      std::vector<std::int32_t> query_heads;
      for (std::int32_t g = 0; g < p.heads_q; ++g) {
        if ((p.scope == index_scope::kv_head ? g / group : g) == h) query_heads.push_back(g);
      }
      std::vector<double> vertical(static_cast<std::size_t>(n_kv), 0.0), slash(vertical);
      for (const std::int32_t g : query_heads) {
        for (std::int32_t t = std::max(0, n_q - o.last_q); t < n_q; ++t) {
          const std::vector<double> probs = brute_probs(p, q, k, b, t, g);
          for (std::int32_t j = 0; j < static_cast<std::int32_t>(probs.size()); ++j) {
            if (!sees(t, j)) continue;
            vertical[static_cast<std::size_t>(j)] += probs[static_cast<std::size_t>(j)];
            const std::int32_t offset = t + n_kv - n_q - j;
            if (offset >= 0) slash[static_cast<std::size_t>(offset)] += probs[static_cast<std::size_t>(j)];
          }
        }
      }
      const std::set<std::int32_t> columns = brute_top(vertical, o.columns);
      const std::set<std::int32_t> offsets = brute_top(slash, o.diagonals);
      for (std::int32_t i = 0; i < q_blocks; ++i) {
        std::set<std::int32_t>& ids = rows[static_cast<std::size_t>((first_row_block + i) * heads + h)];
        std::int32_t visible = 0;  // blocks holding a key some query of the block sees
        for (std::int32_t t = i * p.block_q; t < std::min(n_q, (i + 1) * p.block_q); ++t) {
          for (std::int32_t j = 0; j < n_kv; ++j) {
            if (sees(t, j)) visible = std::max(visible, j / p.block_kv + 1);
          }
          for (const std::int32_t c : columns) {
            if (sees(t, c)) ids.insert(c / p.block_kv);
          }
          for (const std::int32_t off : offsets) {
            const std::int32_t j = t + n_kv - n_q - off;
            if (sees(t, j)) ids.insert(j / p.block_kv);
          }
        }
        for (std::int32_t j = 0; j < std::min(o.sink_blocks, visible); ++j) ids.insert(j);
        for (std::int32_t j = std::max(0, visible - o.window_blocks); j < visible; ++j) ids.insert(j);
      }
    }
    first_row_block += q_blocks;
  }
  return rows;
}

// A built index and the buffers it lives in.
struct built {
  std::vector<std::int32_t> row_ptr, col_idx;
  status result;
  [[nodiscard]] index::block_csr view() const { return {row_ptr, col_idx}; }
  [[nodiscard]] id_sets rows(const problem& p) const {
    id_sets out(static_cast<std::size_t>(p.index_rows()));
    for (std::size_t r = 0; r < out.size(); ++r) {
      out[r] = {col_idx.begin() + row_ptr[r], col_idx.begin() + row_ptr[r + 1]};
    }
    return out;
  }
};

template <class TQ, class TK>
built build(const problem& p, strided_view<const TQ> q, strided_view<const TK> k, const vertical_slash_options& o,
            std::byte fill = std::byte{0xff}) {
  built b;
  b.row_ptr.assign(static_cast<std::size_t>(p.index_rows()) + 1, -5);
  b.col_idx.assign(static_cast<std::size_t>(index::vertical_slash_capacity(p, o)), -5);
  aligned_workspace ws(index::vertical_slash_workspace_bytes(p, o), fill);
  b.result = index::build_vertical_slash(p, q, k, o, {b.row_ptr, b.col_idx}, ws.bytes);
  return b;
}

// Every row's ids from the CSR, checked as a set against the brute force, and the CSR's own form.
template <class T>
void check_random_cases(int cases) {
  std::int64_t rows_checked = 0, nnz = 0;
  for (int n = 0; n < cases; ++n) {
    const std::uint32_t seed = next_seed();
    std::mt19937 rng(seed);
    const case_spec spec = vs_spec(rng);
    random_case<T, T> c(spec, rng);
    const problem p = c.prob();
    // Sometimes copies of keys within a sequence: their columns then tie exactly, and the lower wins.
    const bool copies = chance(rng, 0.4);
    for (std::int32_t b = 0; copies && b + 1 < static_cast<std::int32_t>(c.cu_kv.size()); ++b) {
      const std::int32_t n_kv = c.cu_kv[b + 1] - c.cu_kv[b];
      for (std::int32_t x = 0; x < n_kv / 3; ++x) {
        const auto row = [&](std::int32_t t) {
          return c.k.begin() + static_cast<std::ptrdiff_t>(c.cu_kv[b] + t) * spec.heads_kv * spec.head_dim;
        };
        std::copy_n(row(uniform(rng, 0, n_kv - 1)), spec.heads_kv * spec.head_dim, row(uniform(rng, 0, n_kv - 1)));
      }
    }
    const vertical_slash_options o = random_options(rng);
    INFO("seed " << seed << ": " << spec.describe() << ", " << describe(o)
                  << std::string(copies ? ", copied keys" : ""));
    const built got = build(p, c.q_view(), c.contiguous().k, o);
    INFO("build: " << std::string(got.result.message()));
    REQUIRE(got.result.ok());
    const status v = got.view().validate(p);
    CHECK_MESSAGE(v.ok(), v.message());
    const std::int64_t total = got.row_ptr.back();
    CHECK(total <= index::vertical_slash_capacity(p, o));
    CHECK(index::vertical_slash_capacity(p, o) <= index::vertical_slash_capacity(p));
    CHECK(index::vertical_slash_capacity(p) <= p.index_rows() * p.max_kv_blocks());
    const id_sets want = brute_rows(p, c.q_view(), c.contiguous().k, o);
    REQUIRE(want.size() == static_cast<std::size_t>(p.index_rows()));
    const id_sets have = got.rows(p);
    for (std::size_t r = 0; r < want.size(); ++r) {
      INFO("row " << r);
      check_ids(have[r], want[r]);
    }
    rows_checked += p.index_rows();
    nnz += total;
  }
  MESSAGE(std::string(element_name<T>) << ": " << rows_checked << " rows, " << nnz
                                      << " ids checked against the brute force");
  CHECK(nnz > 0);
}

// A fixed small case for the input checks: 2 sequences, GQA 2, fp32.
struct fixed {
  std::vector<std::int32_t> cq{0, 20, 27}, ck{0, 30, 41};
  std::vector<float> q, k;
  problem p;
  fixed() {
    p = problem{.heads_q = 4, .heads_kv = 2, .head_dim = 5, .block_q = 4, .block_kv = 3, .cu_seqlens_q = cq,
                .cu_seqlens_kv = ck};
    std::mt19937 rng(0xf1eedu);
    std::normal_distribution<float> n(0.0f, 1.0f);
    q.resize(static_cast<std::size_t>(cq.back()) * 4 * 5);
    k.resize(static_cast<std::size_t>(ck.back()) * 2 * 5);
    for (float& x : q) x = n(rng);
    for (float& x : k) x = n(rng);
  }
  [[nodiscard]] strided_view<const float> qv() const {
    return strided_view<const float>::token_major(q.data(), cq.back(), 4, 5);
  }
  [[nodiscard]] strided_view<const float> kv() const {
    return strided_view<const float>::token_major(k.data(), ck.back(), 2, 5);
  }
};

}  // namespace

TEST_CASE("vertical_slash: ids equal the brute force on random shapes, fp32") { check_random_cases<float>(150); }

TEST_CASE("vertical_slash: ids equal the brute force on random shapes, fp16 and bf16") {
  check_random_cases<half>(60);
  check_random_cases<bfloat16>(30);
}

TEST_CASE("vertical_slash: mixed Q and K types, head-major K, and the query_head scope reading kv heads") {
  const std::uint32_t seed = next_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (int n = 0; n < 10; ++n) {
    case_spec spec = vs_spec(rng);
    spec.scope = n % 2 == 0 ? index_scope::query_head : index_scope::kv_head;
    const random_case<half, float> c(spec, rng);
    const problem p = c.prob();
    const std::vector<float> k_hm = heads_outside(c.k, 1, c.cu_kv.back(), spec.heads_kv, spec.head_dim);
    const auto k = strided_view<const float>::head_major(k_hm.data(), c.cu_kv.back(), spec.heads_kv, spec.head_dim);
    const vertical_slash_options o = random_options(rng);
    INFO(spec.describe() << ", " << describe(o));
    const built got = build(p, c.q_view(), k, o);
    REQUIRE(got.result.ok());
    CHECK(got.rows(p) == brute_rows(p, c.q_view(), k, o));
    CHECK(got.rows(p) == build(p, c.q_view(), c.contiguous().k, o).rows(p));  // the layout does not matter
  }
}

TEST_CASE("vertical_slash: bad input gives a status and leaves the outputs alone") {
  const fixed f;
  const vertical_slash_options o{.columns = 3, .diagonals = 2, .sink_blocks = 1, .window_blocks = 1, .last_q = 5};
  const std::int64_t cap = index::vertical_slash_capacity(f.p, o);
  REQUIRE(cap > 0);
  std::vector<std::int32_t> row_ptr(static_cast<std::size_t>(f.p.index_rows()) + 1, -3);
  std::vector<std::int32_t> col_idx(static_cast<std::size_t>(cap), -3);
  aligned_workspace ws(index::vertical_slash_workspace_bytes(f.p, o));
  const auto run = [&](const problem& p, strided_view<const float> q, strided_view<const float> k,
                       const vertical_slash_options& opt, std::span<std::int32_t> rp, std::span<std::int32_t> ci,
                       std::span<std::byte> w) {
    return index::build_vertical_slash(p, q, k, opt, {rp, ci}, w);
  };
  const auto check_error = [&](const status& s, status_code code, const std::string& message) {
    CHECK(s.code() == code);
    CHECK(std::string(s.message()) == message);
    CHECK(std::all_of(row_ptr.begin(), row_ptr.end(), [](std::int32_t x) { return x == -3; }));
    CHECK(std::all_of(col_idx.begin(), col_idx.end(), [](std::int32_t x) { return x == -3; }));
  };

  problem bad = f.p;
  bad.heads_q = 3;
  check_error(run(bad, f.qv(), f.kv(), o, row_ptr, col_idx, ws.bytes), status_code::invalid_argument,
              "heads_q 3 is not a multiple of heads_kv 2");
  const std::vector<std::int32_t> decreasing{0, 20, 19};
  bad = f.p;
  bad.cu_seqlens_kv = decreasing;
  check_error(run(bad, f.qv(), f.kv(), o, row_ptr, col_idx, ws.bytes), status_code::invalid_argument,
              "cu_seqlens_kv[2] = 19 < cu_seqlens_kv[1] = 20 (must not decrease)");
  CHECK(index::vertical_slash_capacity(bad, o) == 0);  // sizes of a broken problem are safe to ask
  CHECK(index::vertical_slash_workspace_bytes(bad, o) == 0);

  const auto with = [&](auto change) {
    vertical_slash_options x = o;
    change(x);
    return x;
  };
  check_error(run(f.p, f.qv(), f.kv(), with([](auto& x) { x.columns = -1; }), row_ptr, col_idx, ws.bytes),
              status_code::invalid_argument, "vertical_slash columns -1 < 0");
  check_error(run(f.p, f.qv(), f.kv(), with([](auto& x) { x.diagonals = -2; }), row_ptr, col_idx, ws.bytes),
              status_code::invalid_argument, "vertical_slash diagonals -2 < 0");
  check_error(run(f.p, f.qv(), f.kv(), with([](auto& x) { x.sink_blocks = -1; }), row_ptr, col_idx, ws.bytes),
              status_code::invalid_argument, "vertical_slash sink_blocks -1 < 0");
  const auto most_negative = with([](auto& x) { x.window_blocks = std::numeric_limits<std::int32_t>::min(); });
  check_error(run(f.p, f.qv(), f.kv(), most_negative, row_ptr, col_idx, ws.bytes),
              status_code::invalid_argument, "vertical_slash window_blocks -2147483648 < 0");
  check_error(run(f.p, f.qv(), f.kv(), with([](auto& x) { x.last_q = 0; }), row_ptr, col_idx, ws.bytes),
              status_code::invalid_argument, "vertical_slash last_q 0 < 1");

  auto q_short = f.qv();
  q_short.tokens -= 1;
  check_error(run(f.p, q_short, f.kv(), o, row_ptr, col_idx, ws.bytes), status_code::shape_mismatch,
              "Q is [26, 4, 5], expected [27, 4, 5]");
  auto k_null = f.kv();
  k_null.data = nullptr;
  check_error(run(f.p, f.qv(), k_null, o, row_ptr, col_idx, ws.bytes), status_code::invalid_argument, "K data is null");
  auto k_heads = f.kv();
  k_heads.heads = 4;
  check_error(run(f.p, f.qv(), k_heads, o, row_ptr, col_idx, ws.bytes), status_code::shape_mismatch,
              "K is [41, 4, 5], expected [41, 2, 5]");
  auto k_stride = f.kv();
  k_stride.token_stride = -10;
  check_error(run(f.p, f.qv(), k_stride, o, row_ptr, col_idx, ws.bytes), status_code::invalid_argument,
              "K has negative strides (token -10, head 5)");

  const std::span<std::int32_t> rp(row_ptr), ci(col_idx);
  check_error(run(f.p, f.qv(), f.kv(), o, rp.first(rp.size() - 1), ci, ws.bytes), status_code::shape_mismatch,
              "vertical_slash row_ptr has 14 entries, needs rows 14 + 1");
  check_error(run(f.p, f.qv(), f.kv(), o, rp, ci.first(ci.size() - 1), ws.bytes), status_code::shape_mismatch,
              "vertical_slash col_idx has " + std::to_string(cap - 1) + " entries, needs capacity " +
                  std::to_string(cap));
  const std::size_t need = index::vertical_slash_workspace_bytes(f.p, o);
  REQUIRE(need > 0);
  check_error(run(f.p, f.qv(), f.kv(), o, rp, ci, ws.bytes.first(need - 1)), status_code::workspace_too_small,
              "workspace has " + std::to_string(need - 1) + " bytes, needs " + std::to_string(need));
  aligned_workspace wider(need + 8);
  const status misaligned = run(f.p, f.qv(), f.kv(), o, rp, ci, wider.bytes.subspan(8));
  CHECK(misaligned.code() == status_code::misaligned);

  // And the good call succeeds on the same buffers.
  REQUIRE(run(f.p, f.qv(), f.kv(), o, rp, ci, ws.bytes).ok());
  CHECK(index::block_csr{row_ptr, col_idx}.validate(f.p).ok());
}

TEST_CASE("vertical_slash: counts past the sequence are clamped, zero counts leave sink and window") {
  const fixed f;
  const vertical_slash_options none{.columns = 0, .diagonals = 0, .sink_blocks = 2, .window_blocks = 1, .last_q = 1};
  const built b = build(f.p, f.qv(), f.kv(), none);
  REQUIRE(b.result.ok());
  const id_sets none_rows = b.rows(f.p);
  REQUIRE(for_each_row(f.p, [&](const row_info& r) {
            std::set<std::int32_t> want;
            for (std::int32_t j = 0; j < std::min(2, r.visible_blocks); ++j) want.insert(j);
            if (r.visible_blocks > 0) want.insert(r.visible_blocks - 1);
            check_ids(none_rows[static_cast<std::size_t>(r.row)], want);
          }).ok());
  // Every column and diagonal kept: every visible block of every row.
  const vertical_slash_options all{.columns = 1 << 30, .diagonals = 1 << 30, .sink_blocks = 0, .window_blocks = 0,
                                   .last_q = 1 << 30};
  const built d = build(f.p, f.qv(), f.kv(), all);
  REQUIRE(d.result.ok());
  const id_sets all_rows = d.rows(f.p);
  REQUIRE(for_each_row(f.p, [&](const row_info& r) {
            std::set<std::int32_t> want;
            for (std::int32_t j = 0; j < r.visible_blocks; ++j) want.insert(j);
            check_ids(all_rows[static_cast<std::size_t>(r.row)], want);
          }).ok());
}

TEST_CASE("vertical_slash: exact ties go to the lower column and the lower offset") {
  // Every key a copy of one random key, no mask: every query spreads its mass evenly, so every
  // column scores the same sum, and offsets o score by how many queries reach o.
  std::mt19937 rng(next_seed());
  const std::vector<std::int32_t> cq{0, 8}, ck{0, 40};
  const problem p{.heads_q = 1, .heads_kv = 1, .head_dim = 4, .block_q = 8, .block_kv = 4, .mask = mask_kind::none,
                  .cu_seqlens_q = cq, .cu_seqlens_kv = ck};
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(8 * 4), k(40 * 4);
  for (float& x : q) x = normal(rng);
  for (std::size_t e = 0; e < 4; ++e) k[e] = normal(rng);
  for (std::size_t j = 1; j < 40; ++j) std::copy_n(k.begin(), 4, k.begin() + static_cast<std::ptrdiff_t>(j * 4));
  const auto qv = strided_view<const float>::token_major(q.data(), 8, 1, 4);
  const auto kv = strided_view<const float>::token_major(k.data(), 40, 1, 4);
  const vertical_slash_options columns{.columns = 3, .diagonals = 0, .sink_blocks = 0, .window_blocks = 0, .last_q = 8};
  const built a = build(p, qv, kv, columns);
  REQUIRE(a.result.ok());
  check_ids(a.rows(p)[0], {0});  // columns 0, 1, 2: block 0
  // The 8 queries sit at positions 32..39; offsets 0..32 are reached by all of them: 0, 1, 2 kept,
  // and the query at position 32 + x reads keys 32 + x, 31 + x, 30 + x (blocks 7..9).
  const vertical_slash_options diagonals{
      .columns = 0, .diagonals = 3, .sink_blocks = 0, .window_blocks = 0, .last_q = 8};
  const built d = build(p, qv, kv, diagonals);
  REQUIRE(d.result.ok());
  check_ids(d.rows(p)[0], {7, 8, 9});
  CHECK(brute_rows(p, qv, kv, columns) == a.rows(p));
  CHECK(brute_rows(p, qv, kv, diagonals) == d.rows(p));
}

TEST_CASE("vertical_slash: deterministic whatever the workspace held, and no allocation") {
  const std::uint32_t seed = next_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (int n = 0; n < 8; ++n) {
    const case_spec spec = vs_spec(rng);
    const random_case<half, half> c(spec, rng);
    const problem p = c.prob();
    const vertical_slash_options o = random_options(rng);
    INFO(spec.describe() << ", " << describe(o));
    const built a = build(p, c.q_view(), c.contiguous().k, o, std::byte{0xff});
    const built b = build(p, c.q_view(), c.contiguous().k, o, std::byte{0x00});
    REQUIRE(a.result.ok());
    REQUIRE(b.result.ok());
    CHECK(a.row_ptr == b.row_ptr);
    CHECK(a.col_idx == b.col_idx);

    std::vector<std::int32_t> row_ptr(a.row_ptr.size()), col_idx(a.col_idx.size());
    aligned_workspace ws(index::vertical_slash_workspace_bytes(p, o), std::byte{0x5a});
    const auto q = c.q_view();
    const auto k = c.contiguous().k;
    allocation_counter counter;
    const status s = index::build_vertical_slash(p, q, k, o, {row_ptr, col_idx}, ws.bytes);
    const long allocations = counter.stop();
    REQUIRE(s.ok());
    CHECK(allocations == 0);
    CHECK(row_ptr == a.row_ptr);
    CHECK(std::equal(col_idx.begin(), col_idx.begin() + row_ptr.back(), a.col_idx.begin()));
  }
}

TEST_CASE("vertical_slash: exec::scalar and exec::simd over the CSR match exec::reference over it") {
  const std::uint32_t seed = next_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  double worst = 0.0;
  for (int n = 0; n < 30; ++n) {
    case_spec spec = vs_spec(rng);
    // Not head_dim 1: an output of one element may cancel to almost nothing, and fp32 rounding then
    // exceeds compare()'s relative bound whatever the index (the executors' own suites cover it).
    // The scale was drawn as a multiple of 1/sqrt(1): a redrawn head_dim gets its own (left as drawn,
    // up to 3·sqrt(head_dim) times the usual scale, logits of ~25 at head_dim 8 took fp32 past it).
    if (spec.head_dim == 1) {
      while (spec.head_dim == 1) spec.head_dim = pick(rng, {1, 3, 5, 8, 13, 16, 33});
      spec.softmax_scale /= std::sqrt(static_cast<float>(spec.head_dim));
    }
    const auto one = [&]<class T>(const random_case<T, T>& c) {
      const problem p = c.prob();
      const vertical_slash_options o = random_options(rng);
      INFO(spec.describe() << ", " << describe(o) << ", " << std::string(element_name<T>));
      const built idx = build(p, c.q_view(), c.contiguous().k, o);
      REQUIRE(idx.result.ok());
      output<float> ref(spec, c.tokens_q());
      const attention_args<T, contiguous_kv<T>, index::block_csr, float> ra{
          .prob = p, .q = c.q_view(), .kv = c.contiguous(), .index = idx.view(), .o = ref.view, .lse = ref.lse};
      REQUIRE(run_executor(exec::reference{}, ra).ok());
      c.with_kv([&](auto kv) {
        output<float> s_out(spec, c.tokens_q()), v_out(spec, c.tokens_q());
        attention_args<T, decltype(kv), index::block_csr, float> a{
            .prob = p, .q = c.q_view(), .kv = kv, .index = idx.view(), .o = s_out.view, .lse = s_out.lse};
        REQUIRE(run_executor(exec::scalar{}, a).ok());
        const comparison cs = compare(p, s_out.view, ref.view, std::span<const float>(s_out.lse),
                                      std::span<const float>(ref.lse), output_tolerance<float>);
        {
          INFO("exec::scalar");
          check(cs);
        }
        a.o = v_out.view;
        a.lse = v_out.lse;
        REQUIRE(run_executor(exec::simd<xsimd::default_arch>{}, a).ok());
        const comparison cv = compare(p, v_out.view, ref.view, std::span<const float>(v_out.lse),
                                      std::span<const float>(ref.lse), output_tolerance<float>);
        {
          INFO("exec::simd<" << std::string(xsimd::default_arch::name()) << ">");
          check(cv);
        }
        worst = std::max({worst, cs.max_rel_o, cv.max_rel_o});
      });
    };
    if (n % 2 == 0) {
      one(random_case<float, float>(spec, rng));
    } else {
      one(random_case<half, half>(spec, rng));
    }
  }
  MESSAGE("worst relative error of o against the reference over the same CSR: " << worst);
}

namespace {

// One sequence of n queries over n keys, GQA 2 (one kv head, kv_head rows): random keys of norm
// sqrt(d), and each query head's q_t = k_c + k_{t - o} (+ N(0, 0.3²) noise), so that column c and
// diagonal o hold most of every query's mass.
struct planted {
  static constexpr std::int32_t n = 200, d = 32, c = 37, o = 50;
  std::vector<std::int32_t> cu{0, n};
  std::vector<float> q, k;
  problem p;
  planted(std::mt19937& rng, std::int32_t block_q, std::int32_t block_kv) {
    p = problem{.heads_q = 2, .heads_kv = 1, .head_dim = d, .block_q = block_q, .block_kv = block_kv,
                .cu_seqlens_q = cu, .cu_seqlens_kv = cu};
    std::normal_distribution<float> normal(0.0f, 1.0f);
    k.resize(static_cast<std::size_t>(n) * d);
    for (float& x : k) x = normal(rng);
    for (std::int32_t j = 0; j < n; ++j) {  // every key of norm sqrt(d): the planted logits are alike
      float* kj = k.data() + static_cast<std::size_t>(j) * d;
      double norm = 0.0;
      for (std::int32_t e = 0; e < d; ++e) norm += static_cast<double>(kj[e]) * kj[e];
      for (std::int32_t e = 0; e < d; ++e) kj[e] = static_cast<float>(kj[e] * std::sqrt(d / norm));
    }
    q.resize(static_cast<std::size_t>(n) * 2 * d);
    for (std::int32_t t = 0; t < n; ++t) {
      for (std::int32_t g = 0; g < 2; ++g) {
        for (std::int32_t e = 0; e < d; ++e) {
          float x = k[static_cast<std::size_t>(c) * d + e] + 0.3f * normal(rng);
          if (t - o >= 0) x += k[static_cast<std::size_t>(t - o) * d + e];
          q[(static_cast<std::size_t>(t) * 2 + g) * d + e] = x;
        }
      }
    }
  }
  [[nodiscard]] strided_view<const float> qv() const {
    return strided_view<const float>::token_major(q.data(), n, 2, d);
  }
  [[nodiscard]] strided_view<const float> kv() const {
    return strided_view<const float>::token_major(k.data(), n, 1, d);
  }
};

}  // namespace

TEST_CASE("vertical_slash: a planted column and diagonal are what the index keeps") {
  const std::uint32_t seed = next_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (const std::pair<std::int32_t, std::int32_t>& blocks : {std::pair{16, 8}, std::pair{7, 13}, std::pair{32, 32}}) {
    const std::int32_t bq = blocks.first, bk = blocks.second;
    INFO("bq " << bq << " bk " << bk);
    const planted pl(rng, bq, bk);
    // One column, one diagonal, nothing else: each row is exactly the planted blocks it sees.
    const vertical_slash_options one{.columns = 1, .diagonals = 1, .sink_blocks = 0, .window_blocks = 0, .last_q = 64};
    const built b = build(pl.p, pl.qv(), pl.kv(), one);
    REQUIRE(b.result.ok());
    const id_sets one_rows = b.rows(pl.p);
    std::int64_t rows_with_both = 0;
    REQUIRE(for_each_row(pl.p, [&](const row_info& r) {
              std::set<std::int32_t> want;
              if (planted::c <= r.q_end - 1) want.insert(planted::c / bk);
              for (std::int32_t t = r.q_begin; t < r.q_end; ++t) {
                if (t - planted::o >= 0) want.insert((t - planted::o) / bk);
              }
              rows_with_both += planted::c <= r.q_end - 1 && r.q_end - 1 - planted::o >= 0;
              INFO("row " << r.row);
              check_ids(one_rows[static_cast<std::size_t>(r.row)], want);
            }).ok());
    CHECK(rows_with_both > 0);
    // A few more of each: the planted ones are still among them.
    const vertical_slash_options more{.columns = 4, .diagonals = 4, .sink_blocks = 1, .window_blocks = 1, .last_q = 64};
    const built m = build(pl.p, pl.qv(), pl.kv(), more);
    REQUIRE(m.result.ok());
    const id_sets more_rows = m.rows(pl.p);
    REQUIRE(for_each_row(pl.p, [&](const row_info& r) {
              const std::set<std::int32_t>& ids = more_rows[static_cast<std::size_t>(r.row)];
              if (planted::c <= r.q_end - 1) CHECK(ids.count(planted::c / bk) == 1);
              if (r.q_end - 1 - planted::o >= 0) CHECK(ids.count((r.q_end - 1 - planted::o) / bk) == 1);
            }).ok());
  }
}

TEST_CASE("vertical_slash: covers more attention mass than a sliding window of as many blocks") {
  const std::uint32_t seed = next_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  // Random queries and keys; key c is a strong column: every query leans towards it.
  const std::int32_t n = 384, d = 16, c = 21, bq = 16, bk = 8;
  const std::vector<std::int32_t> cu{0, n};
  const problem p{.heads_q = 4, .heads_kv = 2, .head_dim = d, .block_q = bq, .block_kv = bk, .cu_seqlens_q = cu,
                  .cu_seqlens_kv = cu};
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(static_cast<std::size_t>(n) * 4 * d), k(static_cast<std::size_t>(n) * 2 * d);
  for (float& x : k) x = normal(rng);
  for (std::int32_t h = 0; h < 2; ++h) {  // key c of each kv head rescaled to the norm sqrt(d)
    float* kc = k.data() + (static_cast<std::size_t>(c) * 2 + h) * d;
    double norm = 0.0;
    for (std::int32_t e = 0; e < d; ++e) norm += static_cast<double>(kc[e]) * kc[e];
    for (std::int32_t e = 0; e < d; ++e) kc[e] = static_cast<float>(kc[e] * std::sqrt(d / norm));
  }
  for (std::int32_t t = 0; t < n; ++t) {
    for (std::int32_t g = 0; g < 4; ++g) {
      for (std::int32_t e = 0; e < d; ++e) {
        const float kc = k[(static_cast<std::size_t>(c) * 2 + g / 2) * d + e];
        q[(static_cast<std::size_t>(t) * 4 + g) * d + e] = 0.6f * normal(rng) + 1.6f * kc;
      }
    }
  }
  const auto qv = strided_view<const float>::token_major(q.data(), n, 4, d);
  const auto kv = strided_view<const float>::token_major(k.data(), n, 2, d);
  const vertical_slash_options o{.columns = 2, .diagonals = 2, .sink_blocks = 0, .window_blocks = 1, .last_q = 64};
  const built b = build(p, qv, kv, o);
  REQUIRE(b.result.ok());
  const id_sets rows = b.rows(p);
  double covered = 0.0, window = 0.0, blocks = 0.0;
  std::int64_t queries = 0;
  REQUIRE(for_each_row(p, [&](const row_info& r) {
            const std::set<std::int32_t>& ids = rows[static_cast<std::size_t>(r.row)];
            const auto count = static_cast<std::int32_t>(ids.size());
            for (std::int32_t g = r.head * 2; g < r.head * 2 + 2; ++g) {
              for (std::int32_t t = r.q_begin; t < r.q_end; ++t) {
                const std::vector<double> probs = brute_probs(p, qv, kv, 0, t, g);
                for (std::int32_t j = 0; j < static_cast<std::int32_t>(probs.size()); ++j) {
                  if (ids.count(j / bk) != 0) covered += probs[static_cast<std::size_t>(j)];
                  if (j / bk >= r.visible_blocks - count) window += probs[static_cast<std::size_t>(j)];
                }
                ++queries;
              }
            }
            blocks += count;
          }).ok());
  covered /= static_cast<double>(queries);
  window /= static_cast<double>(queries);
  MESSAGE("mean attention mass covered: vertical_slash " << covered << ", sliding window of as many blocks " << window
                                                         << " (mean " << blocks / static_cast<double>(p.index_rows())
                                                         << " blocks a row)");
  CHECK(covered > window + 0.2);  // 0.38 the least margin over 300 seeds
}
