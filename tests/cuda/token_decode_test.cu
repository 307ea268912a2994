// cuda::token_decode against exec::reference (CPU, double) on random decode shapes: 0..4 queries per
// sequence (decode and speculative rows, empty sequences), GQA groups 1/4/8, odd head dims up to 256,
// contiguous and paged K/V (token-major or head-major), both index scopes, bf16, fp16 and fp32
// inputs, 16-bit and fp32 outputs, empty rows and dense rows (every visible key listed). The
// reference reads the list as a block index with block_kv = 1 (a key block per token), so it is
// exactly the double-precision softmax over the listed keys. Also: bit-identical reruns, every output
// written (buffers start as NaN), the device error word for bad positions / order / counts / pages,
// host errors.
//
// Run only these: skim_cuda_tests -tc='token_decode*'
#include "cuda/support.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "skim/exec/cpu/reference.hpp"
#include "skim/exec/cuda/token_decode.cuh"
#include "skim/index/block_table.hpp"
#include "support/executor_cases.hpp"
#include "support/random_case.hpp"

namespace {

using namespace skim;
using namespace skim::test;
namespace sc = skim::cuda;
namespace tc = skim::test::cuda;

case_spec random_token_spec(std::mt19937& rng) {
  case_spec s;
  s.head_dim = pick(rng, {1, 3, 32, 33, 64, 100, 128, 256});
  s.heads_kv = uniform(rng, 1, 2);
  s.heads_q = s.heads_kv * pick(rng, {1, 4, 8});
  s.block_q = pick(rng, {1, 1, 2, 4});
  s.block_kv = 16;  // not read by token_decode
  s.mask = chance(rng, 0.85) ? mask_kind::causal : mask_kind::none;
  s.scope = chance(rng, 0.7) ? index_scope::kv_head : index_scope::query_head;
  s.softmax_scale = chance(rng, 0.5) ? 0.0f
                                     : std::uniform_real_distribution<float>(0.3f, 3.0f)(rng) /
                                           std::sqrt(static_cast<float>(s.head_dim));
  const std::int32_t batch = uniform(rng, 1, 5);
  s.seqs.clear();
  for (std::int32_t b = 0; b < batch; ++b) {
    const int kind = uniform(rng, 0, 9);
    const std::int32_t q = kind == 0 ? 0 : (kind <= 6 ? 1 : uniform(rng, 2, 4));
    const int kv_kind = uniform(rng, 0, 9);
    const std::int32_t kv = kv_kind == 0 ? 0 : (kv_kind == 1 ? uniform(rng, 0, 8) : uniform(rng, 1, 1500));
    s.seqs.push_back({q, kv});
  }
  // At least one query and one key in the batch: the executors take no null Q or K/V (nor page
  // table), and an empty tensor's buffer here is null. Empty sequences stay, inside the batch.
  std::int32_t all_q = 0, all_kv = 0;
  for (const auto& l : s.seqs) all_q += l.q, all_kv += l.kv;
  if (all_q == 0) s.seqs[0].q = 1;
  if (all_kv == 0) s.seqs[0].kv = 1;
  s.paged = chance(rng, 0.5);
  s.page_size = pick(rng, {1, 8, 16, 17, 64});
  s.kv_head_major = chance(rng, 0.5);
  return s;
}

// Rows of ascending positions (problem row order), with a list and a block_kv = 1 table of them.
struct host_list {
  std::vector<std::vector<std::int32_t>> rows;
  std::vector<std::int32_t> positions, count;
  std::int32_t width = 0;

  void finish(std::int32_t pad) {
    width = pad;
    for (const auto& r : rows) width = std::max(width, static_cast<std::int32_t>(r.size()) + pad);
    positions.clear();
    count.clear();
    for (const auto& r : rows) {
      count.push_back(static_cast<std::int32_t>(r.size()));
      for (std::int32_t j = 0; j < width; ++j) positions.push_back(j < static_cast<std::int32_t>(r.size()) ? r[j] : -1);
    }
  }
};

// Per row: empty, a few positions, about half, or every visible key (dense).
host_list random_list(const problem& p, std::mt19937& rng) {
  host_list h;
  REQUIRE(for_each_row(p, [&](const row_info& r) {
            const std::int32_t v = r.visible_keys(r.q_end - 1, p.mask);
            const double density = pick(rng, {0.0, 0.01, 0.1, 0.5, 1.0});
            std::bernoulli_distribution keep(density);
            std::vector<std::int32_t> row;
            for (std::int32_t j = 0; j < v; ++j) {
              if (keep(rng)) row.push_back(j);
            }
            h.rows.push_back(row);
          }).ok());
  h.finish(uniform(rng, 0, 2));
  return h;
}

struct device_list {
  tc::buffer<std::int32_t> positions, count;
  std::int32_t width = 0;
  std::int64_t rows = 0;
  explicit device_list(const host_list& h)
      : positions(std::max<std::size_t>(h.positions.size(), 1)), count(std::max<std::size_t>(h.count.size(), 1)),
        width(h.width), rows(static_cast<std::int64_t>(h.rows.size())) {
    upload(positions, h.positions);
    upload(count, h.count);
  }
  static void upload(tc::buffer<std::int32_t>& b, const std::vector<std::int32_t>& v) {
    if (!v.empty()) SKIM_CUDA_REQUIRE(cudaMemcpy(b.data(), v.data(), v.size() * 4, cudaMemcpyHostToDevice));
  }
  [[nodiscard]] sc::device_token_list view() const {
    return {.positions = positions.data(), .count = count.data(), .width = width, .rows = rows};
  }
};

// The reference over exactly the listed keys: the list read as a block_table of a problem with one
// key per block (block_kv = 1), the same rows and the same causal mask.
template <class TQ, class TKV>
void reference_output(const random_case<TQ, TKV>& c, const host_list& h, output<float>& ref) {
  problem p = c.prob();
  p.block_kv = 1;
  const index::block_table table{h.positions, h.count, h.width};
  REQUIRE(table.validate(p).ok());
  const attention_args<TQ, contiguous_kv<TKV>, index::block_table, float> ra{
      .prob = p, .q = c.q_view(), .kv = c.contiguous(), .index = table, .o = ref.view, .lse = ref.lse};
  const status st = exec::reference{}.run(ra, {});
  INFO("reference: " << std::string(st.message()));
  REQUIRE(st.ok());
}

template <class TO>
struct gpu_output {
  std::vector<TO> o;
  std::vector<float> lse;
  std::uint32_t error = 0;
};

// One run into fresh NaN-poisoned O / lse.
template <class TO, class TQ, class TKV, class KV>
gpu_output<TO> run_tokens(const sc::token_decode& dec, tc::device_case<TQ, TKV>& dc, const sc::device_problem& p,
                          const KV& kv, const sc::device_token_list& list, std::int32_t tokens_q) {
  const std::size_t n = static_cast<std::size_t>(std::max(tokens_q, 1)) * p.heads_q * p.head_dim;
  tc::buffer<TO> o(n);
  tc::buffer<float> lse(static_cast<std::size_t>(std::max(tokens_q, 1)) * p.heads_q);
  const sc::device_token_args<TQ, KV, TO> a{
      .prob = p,
      .q = sc::device_view<const TQ>::token_major(dc.q.data(), p.heads_q, p.head_dim),
      .kv = kv,
      .tokens = list,
      .o = sc::device_view<TO>::token_major(o.data(), p.heads_q, p.head_dim),
      .lse = lse.data()};
  const status st = dec.run(a, {}, nullptr);
  INFO("run: " << std::string(st.message()));
  REQUIRE(st.ok());
  SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
  gpu_output<TO> out;
  out.o = o.download();
  out.lse = lse.download();
  out.o.resize(static_cast<std::size_t>(tokens_q) * p.heads_q * p.head_dim);
  out.lse.resize(static_cast<std::size_t>(tokens_q) * p.heads_q);
  out.error = dc.error_bits();
  return out;
}

// Per (token, head): an empty reference row must be exactly o = 0, lse = -inf; otherwise relative L2
// error of o <= tol and |dlse| <= 1e-4 · max(1, |lse|). NaN (an unwritten element) fails.
template <class TO>
void check_against(const case_spec& s, const gpu_output<TO>& g, const output<float>& ref, std::int32_t tokens_q,
                   double tol) {
  const std::int32_t d = s.head_dim;
  const double floor = 0.05 * std::sqrt(static_cast<double>(d));
  std::int64_t failures = 0, empty = 0;
  double max_rel = 0.0, max_dlse = 0.0;
  std::string first;
  for (std::int32_t t = 0; t < tokens_q; ++t) {
    for (std::int32_t h = 0; h < s.heads_q; ++h) {
      const std::size_t row = static_cast<std::size_t>(t) * s.heads_q + h;
      const float rl = ref.lse[row], gl = g.lse[row];
      double err = 0.0, norm = 0.0;
      bool zero = true;
      for (std::int32_t e = 0; e < d; ++e) {
        const double x = to_float(g.o[row * d + e]), y = ref.o[row * d + e];
        err += (x - y) * (x - y);
        norm += y * y;
        zero = zero && x == 0.0;
      }
      std::string what;
      if (rl == -INFINITY) {
        ++empty;
        if (!zero) what = "row with no listed key has non-zero (or NaN) o";
        else if (!(gl == -INFINITY)) what = "row with no listed key has lse " + std::to_string(gl);
      } else {
        const double rel = std::sqrt(err) / std::max(std::sqrt(norm), floor);
        const double dl = std::abs(static_cast<double>(gl) - rl);
        max_rel = std::max(max_rel, std::isnan(rel) ? INFINITY : rel);
        max_dlse = std::max(max_dlse, std::isnan(dl) ? INFINITY : dl);
        if (!(rel <= tol)) what = "relative error of o " + std::to_string(rel);
        else if (!(dl <= 1e-4 * std::max(1.0, std::abs(static_cast<double>(rl)))))
          what = "lse " + std::to_string(gl) + " vs reference " + std::to_string(rl);
      }
      if (!what.empty() && failures++ == 0) first = "token " + std::to_string(t) + " head " + std::to_string(h) + ": " + what;
    }
  }
  INFO("rows " << tokens_q * s.heads_q << ", tolerance " << tol << ", empty " << empty << ", max rel o " << max_rel
               << ", max |dlse| " << max_dlse << ", failures " << failures << ", first: " << first);
  CHECK(failures == 0);
}

// fp32 accumulation against double, plus the output's rounding.
template <class TO>
[[nodiscard]] constexpr double tolerance() {
  return std::is_same_v<TO, float> ? 1e-4 : (std::is_same_v<TO, skim::half> ? 2e-3 : 1.2e-2);
}

template <class TQ, class TKV, class F>
void with_kv(const random_case<TQ, TKV>& c, const tc::device_case<TQ, TKV>& dc, F&& f) {
  if (c.spec.paged) {
    f(dc.paged(c));
  } else {
    f(dc.contiguous(c.spec));
  }
}

}  // namespace

TEST_CASE_TEMPLATE("token_decode random shapes against reference", Types,
                   types<skim::bfloat16, skim::bfloat16, skim::bfloat16>, types<skim::half, skim::half, float>,
                   types<float, float, float>, types<skim::bfloat16, skim::half, skim::half>) {
  using TQ = typename Types::q;
  using TKV = typename Types::kv;
  using TO = typename Types::o;
  for (int trial = 0; trial < 12; ++trial) {
    const std::uint32_t seed = next_seed();
    std::mt19937 rng(seed);
    const case_spec s = random_token_spec(rng);
    INFO("seed " << seed << ": " << s.describe());
    const random_case<TQ, TKV> c(s, rng);
    const host_list hl = random_list(c.prob(), rng);
    tc::device_case<TQ, TKV> dc(c);
    const device_list dl(hl);
    const sc::device_problem p = dc.prob(s);
    const sc::token_decode dec;
    REQUIRE(dec.can_implement(p).ok());
    output<float> ref(c.spec, c.tokens_q());
    reference_output(c, hl, ref);
    with_kv(c, dc, [&](const auto& kv) {
      const auto g = run_tokens<TO>(dec, dc, p, kv, dl.view(), c.tokens_q());
      CHECK(g.error == 0u);
      check_against(s, g, ref, c.tokens_q(), tolerance<TO>());
      const auto again = run_tokens<TO>(dec, dc, p, kv, dl.view(), c.tokens_q());
      CHECK(std::memcmp(g.o.data(), again.o.data(), g.o.size() * sizeof(TO)) == 0);
      CHECK(std::memcmp(g.lse.data(), again.lse.data(), g.lse.size() * sizeof(float)) == 0);
    });
  }
}

TEST_CASE("token_decode bad list content is skipped and reported") {
  std::mt19937 rng(92);
  case_spec s;
  s.head_dim = 128;
  s.heads_kv = 1;
  s.heads_q = 4;
  s.block_q = 1;
  s.seqs = {{1, 300}, {1, 200}};
  s.paged = true;
  s.page_size = 16;
  const random_case<skim::half, skim::half> c(s, rng);
  tc::device_case<skim::half, skim::half> dc(c);
  const sc::device_problem p = dc.prob(s);
  const sc::token_decode dec;
  const auto error_of = [&](const std::vector<std::vector<std::int32_t>>& rows, bool paged = false) {
    host_list h;
    h.rows = rows;
    h.finish(1);
    const device_list dl(h);
    return paged ? run_tokens<float>(dec, dc, p, dc.paged(c), dl.view(), c.tokens_q()).error
                 : run_tokens<float>(dec, dc, p, dc.contiguous(s), dl.view(), c.tokens_q()).error;
  };
  const std::vector<std::vector<std::int32_t>> good{{0, 17, 299}, {3, 4, 199}};
  CHECK(error_of(good) == 0u);
  CHECK(error_of(good, true) == 0u);
  CHECK((error_of({{0, 17, 300}, {3, 4, 199}}) & sc::bad_block_id) != 0u);  // past the sequence
  CHECK((error_of({{0, 17, 299}, {-1, 4, 199}}) & sc::bad_block_id) != 0u);
  CHECK((error_of({{0, 17, 299}, {3, 200}}) & sc::bad_block_id) != 0u);  // another sequence's length
  CHECK((error_of({{17, 0, 299}, {3, 4, 199}}) & sc::bad_order) != 0u);
  CHECK((error_of({{0, 17, 17}, {3, 4, 199}}) & sc::bad_order) != 0u);
  SUBCASE("count past the width, rows past the list") {
    host_list h;
    h.rows = good;
    h.finish(0);
    device_list dl(h);
    std::vector<std::int32_t> count = {h.width + 1, 3};
    dl.count.upload(count);
    CHECK((run_tokens<float>(dec, dc, p, dc.contiguous(s), dl.view(), c.tokens_q()).error & sc::bad_count) != 0u);
    device_list short_list(h);
    sc::device_token_list v = short_list.view();
    v.rows = 1;
    CHECK((run_tokens<float>(dec, dc, p, dc.contiguous(s), v, c.tokens_q()).error & sc::bad_count) != 0u);
  }
  SUBCASE("page outside the pool") {
    for (const std::int32_t bad : {-1, c.num_pages}) {
      std::vector<std::int32_t> pages = c.page_indices;
      pages[1] = bad;  // sequence 0's tokens 16..31: position 17 is listed
      dc.page_indices.upload(pages);
      CHECK((error_of(good, true) & sc::bad_page) != 0u);
      dc.page_indices.upload(c.page_indices);
    }
  }
}

TEST_CASE("token_decode host errors") {
  std::mt19937 rng(6);
  case_spec s;
  s.head_dim = 64;
  s.heads_kv = 2;
  s.heads_q = 8;
  s.block_q = 1;
  s.seqs = {{1, 100}, {1, 64}};
  const random_case<skim::bfloat16, skim::bfloat16> c(s, rng);
  host_list hl;
  hl.rows = {{0, 1, 2}, {3, 6}, {0, 3}, {1}};
  hl.finish(0);
  tc::device_case<skim::bfloat16, skim::bfloat16> dc(c);
  const device_list dl(hl);
  const sc::device_problem p = dc.prob(s);
  tc::buffer<float> o(static_cast<std::size_t>(c.tokens_q()) * s.heads_q * s.head_dim);
  const auto args = [&](const sc::device_problem& prob) {
    return sc::device_token_args<skim::bfloat16, sc::device_contiguous_kv<skim::bfloat16>, float>{
        .prob = prob,
        .q = sc::device_view<const skim::bfloat16>::token_major(dc.q.data(), prob.heads_q, prob.head_dim),
        .kv = dc.contiguous(s),
        .tokens = dl.view(),
        .o = sc::device_view<float>::token_major(o.data(), prob.heads_q, prob.head_dim),
        .lse = nullptr};
  };
  const sc::token_decode dec;
  CHECK(dec.run(args(p), {}, nullptr).ok());
  SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
  CHECK(dc.error_bits() == 0u);

  sc::device_problem wide = p;
  wide.head_dim = 300;
  CHECK(std::string(dec.can_implement(wide).message()) == "cuda::token_decode: head_dim 300 > 256");
  sc::device_problem long_q = p;
  long_q.max_seqlen_q = 9;
  CHECK(dec.can_implement(long_q).code() == status_code::unsupported);
  auto a = args(p);
  a.tokens.width = -1;
  CHECK(std::string(dec.run(a, {}, nullptr).message()) == "token_list width -1 < 0");
  a = args(p);
  a.tokens.positions = nullptr;
  CHECK(dec.run(a, {}, nullptr).code() == status_code::invalid_argument);
  a = args(p);
  a.tokens.rows = -2;
  CHECK(std::string(dec.run(a, {}, nullptr).message()) == "token_list rows -2 < 0");
  a = args(p);
  a.o.data = nullptr;
  CHECK(dec.run(a, {}, nullptr).code() == status_code::invalid_argument);
}
