// GPU decode routing (skim/summarize/cuda/max_bound.cuh, route/cuda/decode_router.cuh) against the CPU pipeline
// summarize::max_bound -> route::pooled_router -> select::reserved<select::top_k>: summaries equal to
// a host min/max bit for bit (build and token-by-token append_newest), scores bit for bit, ids and
// counts exactly; ties to lower ids; special scores (NaN, infinities, signed zeros) through select();
// a captured CUDA graph replayed while the sequences grow; bad input reported, never crashing; a
// routed table (decode selecting its own rows) against select() and decode over its table.
#include "cuda/support.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "skim/decode_step.cuh"
#include "skim/index/head_shared.hpp"
#include "skim/route/head_pool.hpp"
#include "support/quantized_case.hpp"

namespace {

using namespace skim;
using skim::test::case_spec;
using skim::test::random_case;
using skim::test::cuda::buffer;
namespace sc = skim::cuda;

constexpr float inf = std::numeric_limits<float>::infinity();

std::uint32_t fresh_seed() { return skim::test::next_seed(); }  // support/seed.hpp

// Runs f(rng, iteration) `iterations` times, each rng from a fresh seed that a failure reports.
template <class F>
void seeded(int iterations, F&& f) {
  for (int iteration = 0; iteration < iterations; ++iteration) {
    const std::uint32_t seed = fresh_seed();
    INFO("seed ", seed);
    std::mt19937 rng(seed);
    f(rng, iteration);
  }
}

// A score for the selection tests: NaN, -inf, +inf, -0 or +0, each once in `kinds` draws on
// average, else an integer in [-levels, levels] over `divisor` (few levels: many ties).
float special_score(std::mt19937& rng, int kinds, int levels, float divisor) {
  switch (skim::test::uniform(rng, 0, kinds - 1)) {
    case 0: return std::numeric_limits<float>::quiet_NaN();
    case 1: return -inf;
    case 2: return inf;
    case 3: return -0.0f;
    case 4: return 0.0f;
    default: return static_cast<float>(skim::test::uniform(rng, -levels, levels)) / divisor;
  }
}

template <class T>
std::uint32_t bits_of(T x) {
  if constexpr (std::is_same_v<T, float>) {
    std::uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    return u;
  } else {
    return x.bits;
  }
}

std::int32_t blocks_of(std::int32_t len, std::int32_t bk) { return (len + bk - 1) / bk; }

std::vector<std::int32_t> cumulative(const std::vector<std::int32_t>& lens) {
  std::vector<std::int32_t> cu{0};
  for (const std::int32_t l : lens) cu.push_back(cu.back() + l);
  return cu;
}

// A decode batch: every sequence has one query or none (then no index row); kv lengths up to
// max_blocks blocks and about `elements` K elements per sequence, some empty.
case_spec decode_spec(std::mt19937& rng, std::int32_t max_blocks, std::int32_t max_batch,
                      std::int64_t elements = 400'000) {
  using skim::test::chance;
  using skim::test::pick;
  using skim::test::uniform;
  case_spec s;
  s.head_dim = pick(rng, {1, 3, 8, 13, 32, 64, 72, 128, 256});
  s.heads_kv = uniform(rng, 1, 3);
  s.heads_q = s.heads_kv * pick(rng, {1, 2, 4, 8});
  s.block_q = pick(rng, {1, 16, 64});
  s.block_kv = pick(rng, {16, 32, 64, 128});
  s.mask = chance(rng, 0.8) ? mask_kind::causal : mask_kind::none;
  s.scope = chance(rng, 0.75) ? index_scope::kv_head : index_scope::query_head;
  s.softmax_scale = chance(rng, 0.5) ? 0.0f : std::uniform_real_distribution<float>(0.05f, 1.0f)(rng);
  s.seqs.clear();
  const std::int32_t batch = uniform(rng, 1, max_batch);
  const auto max_kv = static_cast<std::int32_t>(
      std::clamp<std::int64_t>(elements / (s.heads_kv * s.head_dim), 1, max_blocks * s.block_kv));
  for (std::int32_t b = 0; b < batch; ++b) {
    const int kind = uniform(rng, 0, 9);
    const std::int32_t kv = uniform(rng, 1, max_kv);
    s.seqs.push_back(kind == 0 ? skim::test::sequence_lengths{0, kv}    // no query: no row
                     : kind == 1 ? skim::test::sequence_lengths{1, 0}  // no key: an empty row
                                 : skim::test::sequence_lengths{1, kv});
  }
  s.paged = chance(rng, 0.5);
  s.page_size = pick(rng, {8, 16, 17, 64});
  return s;
}

sc::decode_router random_router(std::mt19937& rng) {
  using skim::test::chance;
  using skim::test::pick;
  using skim::test::uniform;
  sc::decode_router r;
  r.router.reduce = pick(rng, {route::group_reduce::max, route::group_reduce::mean, route::group_reduce::sum});
  r.selector.sink = uniform(rng, 0, 3);
  r.selector.local = uniform(rng, 0, 4);
  r.selector.recency = chance(rng, 0.5);
  r.selector.dynamic.k = uniform(rng, 0, 12);
  return r;
}

std::vector<std::int32_t> kv_lengths(const case_spec& s) {
  std::vector<std::int32_t> lens;
  for (const auto& l : s.seqs) lens.push_back(l.kv);
  return lens;
}

// K of c's sequences cut to `lens` (a prefix of each), packed token-major.
template <class TQ, class TKV>
std::vector<TKV> packed_prefix(const random_case<TQ, TKV>& c, const std::vector<std::int32_t>& lens) {
  const std::size_t row = static_cast<std::size_t>(c.spec.heads_kv) * c.spec.head_dim;
  std::vector<TKV> k;
  for (std::size_t b = 0; b < lens.size(); ++b) {
    const auto first = c.k.begin() + static_cast<std::ptrdiff_t>(c.cu_kv[b] * row);
    k.insert(k.end(), first, first + static_cast<std::ptrdiff_t>(lens[b] * row));
  }
  return k;
}

// A device copy of v, one element at least (a null pointer would read as a missing input).
template <class T>
buffer<T> device_copy(const std::vector<T>& v) {
  buffer<T> d(std::max<std::size_t>(v.size(), 1));
  if (!v.empty()) SKIM_CUDA_REQUIRE(cudaMemcpy(d.data(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// The CPU summarizer a device summary equals.
template <class S>
struct host_summarizer {
  using type = summarize::max_bound;
};
template <std::int32_t M, std::int32_t L>
struct host_summarizer<sc::device_multi_centroid<M, L>> {
  using type = summarize::multi_centroid<M, L>;
};
// The element of a device summary's records.
template <class S>
struct summary_element {
  using type = typename S::value_type;
};
template <std::int32_t M, std::int32_t L>
struct summary_element<sc::device_multi_centroid<M, L>> {
  using type = float;
};
using centroids = sc::device_multi_centroid<2>;  // skim::defaults::summarizer's device records
static_assert(std::is_same_v<host_summarizer<centroids>::type, defaults::summarizer>);

// c's inputs on the device, with room for its full lengths, and the routing outputs. The kv lengths
// can be cut to a prefix of each sequence (set_lengths): a growing cache under fixed host bounds.
// Summaries S: device_max_bound<TS> (lo, hi; codes also a scale per record) or device_multi_centroid
// (records, TS = float).
template <class TQ, class TKV, class TS, class S = sc::device_max_bound<TS>>
struct device_decode {
  static constexpr bool multi_centroid = sc::is_device_multi_centroid_v<S>;
  const random_case<TQ, TKV>& c;
  sc::decode_router router;
  buffer<std::int32_t> cu_q, cu_kv, page_indptr, page_indices;
  buffer<TQ> q;
  buffer<TKV> k, k_pages;
  buffer<std::uint32_t> error;
  std::int32_t max_q = 0, max_kv = 0, capacity = 0, width = 0;
  std::int64_t rows = 0;
  buffer<TS> lo, hi;
  buffer<float> scales;  // code summaries
  buffer<float> records;
  buffer<std::byte> workspace;
  buffer<std::int32_t> ids, count;

  device_decode(const random_case<TQ, TKV>& cs, const sc::decode_router& r)
      : c(cs), router(r), cu_q(cs.cu_q), cu_kv(cs.cu_kv), page_indptr(device_copy(cs.page_indptr)),
        page_indices(device_copy(cs.page_indices)), q(device_copy(cs.q)), k(device_copy(cs.k)),
        k_pages(device_copy(cs.k_pages)), error(1) {
    SKIM_CUDA_REQUIRE(cudaMemset(error.data(), 0, sizeof(std::uint32_t)));
    for (const auto& l : cs.spec.seqs) {
      max_q = std::max(max_q, l.q);
      max_kv = std::max(max_kv, l.kv);
    }
    set_lengths(kv_lengths(cs.spec));
    const sc::device_problem p = prob();
    capacity = p.max_kv_blocks() + 1;  // a spare block per sequence, never written
    if constexpr (multi_centroid) {
      records = buffer<float>(static_cast<std::size_t>(summaries().elements(p)));
    } else {
      const auto elements = static_cast<std::size_t>(p.batch) * capacity * p.heads_kv * p.head_dim;
      lo = buffer<TS>(elements);
      hi = buffer<TS>(elements);
      if constexpr (sc::is_device_code_v<TS>) scales = buffer<float>(elements / static_cast<std::size_t>(p.head_dim));
    }
    workspace = buffer<std::byte>(router.workspace_bytes(p));
    width = router.width(p);
    rows = static_cast<std::int64_t>(cs.cu_q.back()) * (router.share_heads ? 1 : p.index_heads());
    ids = buffer<std::int32_t>(static_cast<std::size_t>(rows * width));
    count = buffer<std::int32_t>(static_cast<std::size_t>(rows));
  }

  [[nodiscard]] sc::device_problem prob() const {
    const case_spec& s = c.spec;
    return {.batch = static_cast<std::int32_t>(s.seqs.size()), .heads_q = s.heads_q, .heads_kv = s.heads_kv,
            .head_dim = s.head_dim, .block_q = s.block_q, .block_kv = s.block_kv, .mask = s.mask,
            .softmax_scale = s.softmax_scale, .scope = s.scope, .cu_seqlens_q = cu_q.data(),
            .cu_seqlens_kv = cu_kv.data(), .max_seqlen_q = max_q, .max_seqlen_kv = max_kv, .error = error.data()};
  }
  [[nodiscard]] sc::device_contiguous_kv<TKV> contiguous() const {
    const std::int64_t hs = c.spec.head_dim;
    return {.k = k.data(), .v = k.data(), .token_stride = hs * c.spec.heads_kv, .head_stride = hs};
  }
  [[nodiscard]] sc::device_paged_kv<TKV> paged() const {
    const std::int64_t hs = c.spec.head_dim;
    const std::int64_t ts = hs * c.spec.heads_kv;
    return {.k_pages = k_pages.data(), .v_pages = k_pages.data(), .num_pages = c.num_pages,
            .page_size = c.spec.page_size, .page_stride = ts * c.spec.page_size, .token_stride = ts,
            .head_stride = hs, .page_indptr = page_indptr.data(), .page_indices = page_indices.data()};
  }
  [[nodiscard]] S summaries() const {
    if constexpr (multi_centroid) {
      return {records.data(), capacity};
    } else {
      return {lo.data(), hi.data(), capacity, scales.data()};
    }
  }
  [[nodiscard]] sc::decode_route_args<TQ, TS, S> args() const {
    return {.prob = prob(),
            .q = sc::device_view<const TQ>::token_major(q.data(), c.spec.heads_q, c.spec.head_dim),
            .summaries = summaries(),
            .index = {.ids = ids.data(), .count = count.data(), .width = width, .rows = rows}};
  }

  // Cuts every sequence's keys to lens (each <= c's): cu_seqlens_kv, and a contiguous cache repacked.
  // Synchronises: a pageable cudaMemcpy may return before its DMA lands, and a non-blocking stream
  // does not wait for the legacy stream's copies.
  void set_lengths(const std::vector<std::int32_t>& lens) {
    cu_kv.upload(cumulative(lens));
    const std::vector<TKV> packed = packed_prefix(c, lens);
    if (!packed.empty()) {
      SKIM_CUDA_REQUIRE(cudaMemcpy(k.data(), packed.data(), packed.size() * sizeof(TKV), cudaMemcpyHostToDevice));
    }
    SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
  }

  [[nodiscard]] status build(cudaStream_t stream = nullptr) const {
    return c.spec.paged ? sc::build(prob(), paged(), summaries(), stream)
                        : sc::build(prob(), contiguous(), summaries(), stream);
  }
  [[nodiscard]] status append(cudaStream_t stream = nullptr) const {
    return c.spec.paged ? sc::append_newest(prob(), paged(), summaries(), stream)
                        : sc::append_newest(prob(), contiguous(), summaries(), stream);
  }
  [[nodiscard]] status route(cudaStream_t stream = nullptr) {
    return router.run(args(), std::span<std::byte>(workspace.data(), workspace.size()), stream);
  }
  // route() with append_newest folded into the score kernel.
  [[nodiscard]] status append_and_route(cudaStream_t stream = nullptr) {
    const std::span<std::byte> ws(workspace.data(), workspace.size());
    return c.spec.paged ? router.run(args(), paged(), ws, stream) : router.run(args(), contiguous(), ws, stream);
  }
  [[nodiscard]] std::uint32_t error_bits() {
    std::uint32_t bits = 0;
    SKIM_CUDA_REQUIRE(cudaMemcpy(&bits, error.data(), sizeof bits, cudaMemcpyDeviceToHost));
    SKIM_CUDA_REQUIRE(cudaMemset(error.data(), 0, sizeof bits));
    return bits;
  }
};

#define SKIM_REQUIRE_OK(expr)                                         \
  do {                                                                \
    const ::skim::status skim_st_ = (expr);                           \
    REQUIRE_MESSAGE(skim_st_.ok(), std::string(skim_st_.message()));  \
  } while (0)

// The device summaries against the host's min and max of every block of the prefix `lens`, bit for
// bit; records past a sequence's blocks still hold the 0xff poison (never written).
template <class TQ, class TKV, class TS>
void expect_summaries(const device_decode<TQ, TKV, TS>& dd, const std::vector<std::int32_t>& lens) {
  const case_spec& s = dd.c.spec;
  const std::vector<TS> lo = dd.lo.download(), hi = dd.hi.download();
  const std::uint32_t poison = sizeof(TS) == 4 ? 0xffffffffu : 0xffffu;
  std::int64_t bad = 0;
  std::string first;
  for (std::size_t b = 0; b < lens.size(); ++b) {
    for (std::int32_t j = 0; j < dd.capacity; ++j) {
      for (std::int32_t h = 0; h < s.heads_kv; ++h) {
        for (std::int32_t d = 0; d < s.head_dim; ++d) {
          const std::size_t at = ((b * dd.capacity + j) * s.heads_kv + h) * static_cast<std::size_t>(s.head_dim) + d;
          std::uint32_t want_lo = poison, want_hi = poison;
          if (j < blocks_of(lens[b], s.block_kv)) {
            float mn = inf, mx = -inf;
            const std::int32_t end = std::min((j + 1) * s.block_kv, lens[b]);
            for (std::int32_t t = j * s.block_kv; t < end; ++t) {
              const std::size_t key = ((dd.c.cu_kv[b] + t) * s.heads_kv + h) * static_cast<std::size_t>(s.head_dim) + d;
              const float x = to_float(dd.c.k[key]);
              mn = x < mn ? x : mn;
              mx = x > mx ? x : mx;
            }
            want_lo = bits_of(from_float<TS>(mn));
            want_hi = bits_of(from_float<TS>(mx));
          }
          if (bits_of(lo[at]) != want_lo || bits_of(hi[at]) != want_hi) {
            if (bad++ == 0) {
              first = "seq " + std::to_string(b) + " block " + std::to_string(j) + " head " + std::to_string(h) +
                      " dim " + std::to_string(d) + ": lo/hi bits " + std::to_string(bits_of(lo[at])) + "/" +
                      std::to_string(bits_of(hi[at])) + ", expected " + std::to_string(want_lo) + "/" +
                      std::to_string(want_hi);
            }
          }
        }
      }
    }
  }
  CHECK_MESSAGE(bad == 0, bad, " summary elements differ; first: ", first);
}

// Code summaries against the host's min and max of the dequantised keys of every block of the prefix
// `lens` (dd.c.k): each end dequantised with the record's scale, fp32(scale · code), equals the float
// summary's element bit for bit; records past a sequence's blocks still hold the poison.
template <class TQ, class TKV, class TS>
  requires sc::is_device_code_v<TS>
void expect_summaries(const device_decode<TQ, TKV, TS>& dd, const std::vector<std::int32_t>& lens) {
  const case_spec& s = dd.c.spec;
  const std::vector<TS> lo = dd.lo.download(), hi = dd.hi.download();
  const std::vector<float> scale = dd.scales.download();
  std::int64_t bad = 0;
  std::string first;
  for (std::size_t b = 0; b < lens.size(); ++b) {
    for (std::int32_t j = 0; j < dd.capacity; ++j) {
      for (std::int32_t h = 0; h < s.heads_kv; ++h) {
        const std::size_t rec = (b * dd.capacity + j) * s.heads_kv + h;
        const bool written = j < blocks_of(lens[b], s.block_kv);
        for (std::int32_t d = 0; d < s.head_dim; ++d) {
          const std::size_t at = rec * static_cast<std::size_t>(s.head_dim) + d;
          const auto bits = [](TS x) { std::uint8_t u; std::memcpy(&u, &x, 1); return std::uint32_t{u}; };
          bool ok = true;
          std::string got = std::to_string(bits(lo[at])) + "/" + std::to_string(bits(hi[at]));
          std::string want = "poison";
          if (written) {
            float mn = inf, mx = -inf;
            const std::int32_t end = std::min((j + 1) * s.block_kv, lens[b]);
            for (std::int32_t t = j * s.block_kv; t < end; ++t) {
              const std::size_t key = ((dd.c.cu_kv[b] + t) * s.heads_kv + h) * static_cast<std::size_t>(s.head_dim) + d;
              const float x = dd.c.k[key];
              mn = x < mn ? x : mn;
              mx = x > mx ? x : mx;
            }
            float l = scale[rec] * skim::test::code_value(lo[at]), u = scale[rec] * skim::test::code_value(hi[at]);
            if (scale[rec] < 0.0f) std::swap(l, u);
            ok = bits_of(l) == bits_of(mn) && bits_of(u) == bits_of(mx);
            got += " as " + std::to_string(l) + "/" + std::to_string(u);
            want = std::to_string(mn) + "/" + std::to_string(mx);
          } else {
            ok = bits(lo[at]) == 0xff && bits(hi[at]) == 0xff;
          }
          if (!ok && bad++ == 0) {
            first = "seq " + std::to_string(b) + " block " + std::to_string(j) + " head " + std::to_string(h) +
                    " dim " + std::to_string(d) + ": codes " + got + ", expected " + want;
          }
        }
      }
    }
  }
  CHECK_MESSAGE(bad == 0, bad, " code summary elements differ; first: ", first);
}

// The device's multi_centroid records against summarize::build of the prefix `lens` on the CPU, bit for
// bit; records past a sequence's blocks still hold the 0xff poison (never written).
template <class TQ, class TKV>
void expect_summaries(const device_decode<TQ, TKV, float, centroids>& dd, const std::vector<std::int32_t>& lens) {
  using host = summarize::multi_centroid<2>;
  const case_spec& s = dd.c.spec;
  const std::vector<std::int32_t> cu_kv = cumulative(lens);
  const std::vector<TKV> k = packed_prefix(dd.c, lens);
  const problem p{.heads_q = s.heads_q, .heads_kv = s.heads_kv, .head_dim = s.head_dim, .block_q = s.block_q,
                  .block_kv = s.block_kv, .mask = s.mask, .cu_seqlens_q = dd.c.cu_q, .cu_seqlens_kv = cu_kv};
  const auto k_view = strided_view<const TKV>::token_major(k.data(), cu_kv.back(), s.heads_kv, s.head_dim);
  const contiguous_kv<TKV> kv{.k = k_view, .v = k_view, .cu_seqlens_kv = {}};
  const summarize::summary_layout layout = summarize::make_summary_layout<host>(p);
  std::vector<float> want(static_cast<std::size_t>(layout.floats()));
  skim::test::aligned_workspace ws(summarize::workspace_bytes<host>(p));
  SKIM_REQUIRE_OK(summarize::build<host>(p, kv, want, ws.bytes));
  const std::vector<float> got = dd.records.download();
  const std::int64_t rf = centroids::record_floats(s.head_dim);
  std::int64_t bad = 0;
  std::string first;
  for (std::size_t b = 0; b < lens.size(); ++b) {
    const std::int32_t blocks = blocks_of(lens[b], s.block_kv);
    for (std::int32_t j = 0; j < dd.capacity; ++j) {
      for (std::int32_t h = 0; h < s.heads_kv; ++h) {
        const std::int64_t at = ((static_cast<std::int64_t>(b) * dd.capacity + j) * s.heads_kv + h) * rf;
        const std::int64_t cpu = j < blocks ? layout.record_offset(layout.kv_block_offset(static_cast<std::int32_t>(b)) + j, h) : -1;
        for (std::int64_t e = 0; e < rf; ++e) {
          const std::uint32_t g = bits_of(got[static_cast<std::size_t>(at + e)]);
          const std::uint32_t w = cpu < 0 ? 0xffffffffu : bits_of(want[static_cast<std::size_t>(cpu + e)]);
          if (g != w && bad++ == 0) {
            first = "seq " + std::to_string(b) + " block " + std::to_string(j) + " head " + std::to_string(h) +
                    " float " + std::to_string(e) + ": bits " + std::to_string(g) + ", expected " + std::to_string(w);
          }
        }
      }
    }
  }
  CHECK_MESSAGE(bad == 0, bad, " record floats differ from summarize::build<multi_centroid<2>>; first: ", first);
}

// The CPU pipeline on the prefix `lens` against the device's scores (bit for bit) and block table
// (exact ids and counts, pad past count); the CPU selection is also run on the device's scores.
template <class TQ, class TKV, class TS, class S>
void expect_cpu_route(const device_decode<TQ, TKV, TS, S>& dd, const std::vector<std::int32_t>& lens) {
  const random_case<TQ, TKV>& c = dd.c;
  const case_spec& s = c.spec;
  const std::vector<std::int32_t> cu_kv = cumulative(lens);
  const std::vector<TKV> k = packed_prefix(c, lens);
  const problem p{.heads_q = s.heads_q, .heads_kv = s.heads_kv, .head_dim = s.head_dim, .block_q = s.block_q,
                  .block_kv = s.block_kv, .mask = s.mask, .softmax_scale = s.softmax_scale, .cu_seqlens_q = c.cu_q,
                  .cu_seqlens_kv = cu_kv, .scope = s.scope};
  const auto k_view = strided_view<const TKV>::token_major(k.data(), cu_kv.back(), s.heads_kv, s.head_dim);
  const contiguous_kv<TKV> kv{.k = k_view, .v = k_view, .cu_seqlens_kv = {}};
  using host = typename host_summarizer<S>::type;
  std::vector<float> records(static_cast<std::size_t>(summarize::make_summary_layout<host>(p).floats()));
  skim::test::aligned_workspace build_ws(summarize::workspace_bytes<host>(p));
  SKIM_REQUIRE_OK(summarize::build<host>(p, kv, records, build_ws.bytes));
  const std::int32_t stride = p.max_kv_blocks();
  const std::int64_t rows = p.index_rows();
  std::vector<float> scores(static_cast<std::size_t>(rows * stride));
  skim::test::aligned_workspace score_ws(dd.router.router.workspace_bytes(p));
  SKIM_REQUIRE_OK(dd.router.router.template score<host>(p, c.q_view(), records, scores, score_ws.bytes));

  // Scores: device row (b, h) against CPU row q_block_offset(b) * index_heads + h.
  std::vector<float> device_scores(dd.workspace.size() / sizeof(float));
  if (!device_scores.empty()) {
    SKIM_CUDA_REQUIRE(cudaMemcpy(device_scores.data(), dd.workspace.data(), device_scores.size() * sizeof(float),
                                 cudaMemcpyDeviceToHost));
  }
  const std::int32_t heads = p.index_heads();
  const std::int32_t device_stride = dd.prob().max_kv_blocks();
  std::vector<float> device_as_cpu(scores.size());
  std::int64_t bad = 0;
  std::string first;
  for (std::int32_t b = 0; b < p.batch(); ++b) {
    if (p.seq_len_q(b) == 0) continue;
    for (std::int32_t h = 0; h < heads; ++h) {
      const std::int64_t row = p.q_block_offset(b) * heads + h;
      for (std::int32_t j = 0; j < device_stride; ++j) {
        const auto at = static_cast<std::size_t>((static_cast<std::int64_t>(b) * heads + h) * device_stride + j);
        const float got = device_scores[at];
        const float want = j < stride ? scores[static_cast<std::size_t>(row * stride + j)] : -inf;
        if (j < stride) device_as_cpu[static_cast<std::size_t>(row * stride + j)] = got;
        if (bits_of(got) != bits_of(want) && !(std::isnan(got) && std::isnan(want))) {
          if (bad++ == 0) {
            first = "seq " + std::to_string(b) + " head " + std::to_string(h) + " block " + std::to_string(j) +
                    ": " + std::to_string(got) + " vs " + std::to_string(want);
          }
        }
      }
    }
  }
  CHECK_MESSAGE(bad == 0, bad, " scores differ from pooled_router's; first: ", first);

  // Selection from the CPU's scores, and from the device's. With share_heads: from each query block's
  // heads pooled as the CPU pipeline pools them (route/head_pool.hpp), on the shared problem.
  const bool shared = dd.router.share_heads;
  const problem sp = shared ? index::head_shared<index::block_table>::shared_problem(p) : p;
  const auto selected_from = [&](const std::vector<float>& per_head) {
    if (!shared) return per_head;
    std::vector<float> pooled(static_cast<std::size_t>(sp.index_rows() * stride), -inf);
    REQUIRE(for_each_row(p, [&](const row_info& r) {
              const auto visible = static_cast<std::size_t>(r.visible_blocks);
              pool_head_scores(dd.router.pool, r.head,
                               std::span<const float>(per_head).subspan(static_cast<std::size_t>(r.row * stride), visible),
                               std::span<float>(pooled).subspan(static_cast<std::size_t>(r.row / heads * stride), visible));
            }).ok());
    return pooled;
  };
  const std::int64_t rows_selected = sp.index_rows();
  const std::int32_t width = select::max_count(dd.router.selector, sp);
  skim::test::aligned_workspace select_ws(select::workspace_bytes(dd.router.selector, sp));
  std::vector<std::int32_t> cpu_ids(static_cast<std::size_t>(rows_selected * width)),
      cpu_count(static_cast<std::size_t>(rows_selected));
  std::vector<std::int32_t> rerun_ids(cpu_ids.size()), rerun_count(cpu_count.size());
  SKIM_REQUIRE_OK(select::select_all(dd.router.selector, sp, {.scores = selected_from(scores), .score_stride = stride},
                                     index::mutable_block_table{cpu_ids, cpu_count, width}, select_ws.bytes));
  SKIM_REQUIRE_OK(select::select_all(dd.router.selector, sp,
                                     {.scores = selected_from(device_as_cpu), .score_stride = stride},
                                     index::mutable_block_table{rerun_ids, rerun_count, width}, select_ws.bytes));
  const std::vector<std::int32_t> ids = dd.ids.download(), count = dd.count.download();
  REQUIRE(dd.rows == rows_selected);
  REQUIRE(dd.width >= width);
  for (std::int64_t r = 0; r < rows_selected; ++r) {
    INFO("row ", r, " of ", rows_selected, shared ? " (shared)" : "");
    const auto n = static_cast<std::size_t>(cpu_count[static_cast<std::size_t>(r)]);
    const auto row_of = [&](const std::vector<std::int32_t>& v, std::int32_t w, std::size_t len) {
      return std::vector<std::int32_t>(v.begin() + r * w, v.begin() + r * w + static_cast<std::ptrdiff_t>(len));
    };
    REQUIRE(count[static_cast<std::size_t>(r)] == cpu_count[static_cast<std::size_t>(r)]);
    CHECK(row_of(ids, dd.width, n) == row_of(rerun_ids, width, n));  // selection alone
    CHECK(row_of(ids, dd.width, n) == row_of(cpu_ids, width, n));    // the whole pipeline
    for (std::int32_t i = static_cast<std::int32_t>(n); i < dd.width; ++i) {
      REQUIRE(ids[static_cast<std::size_t>(r * dd.width + i)] == index::block_table::pad);
    }
  }
}

// Builds c on the device, routes it, compares with the CPU. Half the time the newest key of every
// sequence is left out of the build and appended by the router's score kernel (run with a K/V
// source): the records must then equal a build of the whole cache, and the route the CPU's.
template <class TQ, class TKV, class TS, class S = sc::device_max_bound<TS>>
void check_route(const case_spec& s, const sc::decode_router& router, std::mt19937& rng) {
  const bool fused = skim::test::chance(rng, 0.5);
  INFO(s.describe(), " | reduce ", std::string(route::to_string(router.router.reduce)), " sink ",
       router.selector.sink, " local ", router.selector.local, " recency ", router.selector.recency, " k ",
       router.selector.dynamic.k, fused ? " | append fused into score" : "");
  const random_case<TQ, TKV> c(s, rng);
  device_decode<TQ, TKV, TS, S> dd(c, router);
  const std::vector<std::int32_t> full = kv_lengths(s);
  if (fused) {
    std::vector<std::int32_t> shorter = full;
    for (std::int32_t& l : shorter) l = l > 0 ? l - 1 : 0;
    dd.set_lengths(shorter);
    SKIM_REQUIRE_OK(dd.build());
    dd.set_lengths(full);
    SKIM_REQUIRE_OK(dd.append_and_route());
  } else {
    SKIM_REQUIRE_OK(dd.build());
    SKIM_REQUIRE_OK(dd.route());
  }
  SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
  CHECK(dd.error_bits() == 0);
  if (fused) expect_summaries(dd, full);
  expect_cpu_route(dd, full);
}

// decode_router::routed() and score_routed(): decode's split kernels select each row where they read
// it (no select launch), from the scores or from the candidates the score kernel kept. The table they
// write must be select()'s, bit for bit (and the CPU pipeline's: expect_cpu_route), and the output
// decode's over select()'s table, bit for bit: both split kernels, whole rows and split rows (cluster
// merge, merge kernel), contiguous or paged K/V (V = K here). The table is poisoned before every
// routed run, so each run must write it; O must be written everywhere.
template <class T>
void check_routed(const case_spec& s, const sc::decode_router& router, std::mt19937& rng) {
  using skim::cuda::decode;
  using skim::cuda::decode_kernel;
  INFO(s.describe(), " | reduce ", std::string(route::to_string(router.router.reduce)), " sink ",
       router.selector.sink, " local ", router.selector.local, " recency ", router.selector.recency, " k ",
       router.selector.dynamic.k);
  const random_case<T, T> c(s, rng);
  device_decode<T, T, T> dd(c, router);
  SKIM_REQUIRE_OK(dd.build());
  const sc::device_problem p = dd.prob();
  const std::span<float> scores = sc::decode_router::scores_in(dd.workspace.bytes(dd.workspace.size()), p);
  SKIM_REQUIRE_OK(router.score(dd.args(), scores, nullptr));
  buffer<std::int32_t> ids(dd.ids.size()), count(dd.count.size());
  const sc::mutable_device_block_table selected{.ids = ids.data(), .count = count.data(), .width = dd.width,
                                                .rows = dd.rows};
  SKIM_REQUIRE_OK(router.select(p, scores, selected, nullptr));
  sc::device_routed_table routed, kept;
  SKIM_REQUIRE_OK(router.routed(p, scores, dd.args().index, routed));
  SKIM_REQUIRE_OK(router.score_routed(dd.args(), dd.workspace.bytes(dd.workspace.size()), kept, nullptr));
  CHECK((kept.candidates != nullptr) == (router.candidate_stride(p) > 0));
  CHECK(kept.scores == routed.scores);
  SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
  const std::vector<std::int32_t> want_ids = ids.download(), want_count = count.download();

  const std::int32_t tokens_q = c.cu_q.back();
  const std::size_t n_o = static_cast<std::size_t>(std::max(tokens_q, 1)) * p.heads_q * p.head_dim;
  const std::size_t n_lse = static_cast<std::size_t>(std::max(tokens_q, 1)) * p.heads_q;
  struct result {
    std::vector<T> o;
    std::vector<float> lse;
  };
  const auto attend = [&](const decode& dec, const auto& index) {
    buffer<T> o(n_o);
    buffer<float> lse(n_lse);
    const std::size_t ws_bytes = dec.workspace_bytes(p, dd.width);
    buffer<std::byte> ws(std::max<std::size_t>(ws_bytes, 1));
    const auto run = [&](const auto& kv) {
      using KV = std::decay_t<decltype(kv)>;
      const sc::device_attention_args<T, KV, std::decay_t<decltype(index)>, T> a{
          .prob = p, .q = sc::device_view<const T>::token_major(dd.q.data(), p.heads_q, p.head_dim), .kv = kv,
          .index = index, .o = sc::device_view<T>::token_major(o.data(), p.heads_q, p.head_dim), .lse = lse.data()};
      return dec.run(a, ws.bytes(ws_bytes), nullptr);
    };
    SKIM_REQUIRE_OK(s.paged ? run(dd.paged()) : run(dd.contiguous()));
    SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
    return result{o.download(), lse.download()};
  };
  for (const decode_kernel k : {decode_kernel::cuda_cores, decode_kernel::tensor_cores}) {
    for (const std::int32_t chunk : {0, 1, 3}) {
      for (const bool cluster : {true, false}) {
        INFO(std::string(k == decode_kernel::cuda_cores ? "cuda cores" : "tensor cores"), ", chunk_blocks ", chunk,
             std::string(cluster ? ", cluster merge" : ", merge kernel"));
        decode dec;
        dec.kernel = k;
        dec.chunk_blocks = chunk;
        dec.merge_in_cluster = cluster;
        const result want = attend(dec, sc::device_block_table(selected));
        CHECK(dd.error_bits() == 0);
        for (const sc::device_routed_table& table : {routed, kept}) {
          INFO(std::string(table.candidates != nullptr ? "from the kept candidates" : "from the scores"));
          SKIM_CUDA_REQUIRE(cudaMemset(dd.ids.data(), 0xff, dd.ids.size() * sizeof(std::int32_t)));
          SKIM_CUDA_REQUIRE(cudaMemset(dd.count.data(), 0xff, dd.count.size() * sizeof(std::int32_t)));
          const result got = attend(dec, table);
          CHECK(dd.error_bits() == 0);
          CHECK(dd.ids.download() == want_ids);
          CHECK(dd.count.download() == want_count);
          std::int64_t differ = 0, unwritten = 0;
          for (std::size_t i = 0; i < static_cast<std::size_t>(tokens_q) * p.heads_q * p.head_dim; ++i) {
            differ += bits_of(got.o[i]) != bits_of(want.o[i]);
            unwritten += std::isnan(to_float(got.o[i]));
          }
          for (std::size_t i = 0; i < static_cast<std::size_t>(tokens_q) * p.heads_q; ++i) {
            differ += bits_of(got.lse[i]) != bits_of(want.lse[i]);
          }
          CHECK_MESSAGE(differ == 0, differ, " output elements differ from decode over select()'s table");
          CHECK_MESSAGE(unwritten == 0, unwritten, " output elements unwritten (NaN poison)");
        }
      }
    }
  }
  expect_cpu_route(dd, kv_lengths(s));  // the table of the last routed run against the CPU pipeline
}

// The summaries (max_bound's lo/hi or multi_centroid's records, S) built on a prefix, then grown key by
// key with append, each step against summarize::build on the CPU (expect_summaries); then equal, bit
// for bit, to one build of the whole cache.
template <class TQ, class TKV, class TS, class S = sc::device_max_bound<TS>>
void check_summaries(const case_spec& s, std::mt19937& rng) {
  INFO(s.describe());
  const random_case<TQ, TKV> c(s, rng);
  device_decode<TQ, TKV, TS, S> dd(c, sc::decode_router{});
  const std::vector<std::int32_t> full = kv_lengths(s);
  std::vector<std::int32_t> lens = full;
  std::int32_t steps = 0;
  for (std::int32_t& l : lens) {
    const std::int32_t cut = std::min(l, skim::test::uniform(rng, 0, 2 * s.block_kv + 3));
    l -= cut;
    steps = std::max(steps, cut);
  }
  dd.set_lengths(lens);
  SKIM_REQUIRE_OK(dd.build());
  SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
  expect_summaries(dd, lens);
  for (std::int32_t step = 0; step < steps; ++step) {  // every sequence grows by one key (until full)
    for (std::size_t b = 0; b < lens.size(); ++b) lens[b] = std::min(lens[b] + 1, full[b]);
    dd.set_lengths(lens);
    SKIM_REQUIRE_OK(dd.append());
    if (step % 3 == 0) SKIM_REQUIRE_OK(dd.append());  // a replayed step changes nothing
    SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
    INFO("after append step ", step + 1, " of ", steps);
    expect_summaries(dd, lens);
  }
  // Token by token equals one build of the whole cache.
  device_decode<TQ, TKV, TS, S> once(c, sc::decode_router{});
  SKIM_REQUIRE_OK(once.build());
  SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
  // Bitwise: records no key reaches keep the 0xff poison in both (NaN for float, so == would fail).
  const auto same_bits = [](const auto& x, const auto& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0;
  };
  if constexpr (sc::is_device_multi_centroid_v<S>) {
    CHECK(same_bits(dd.records.download(), once.records.download()));
  } else {
    CHECK(same_bits(dd.lo.download(), once.lo.download()));
    CHECK(same_bits(dd.hi.download(), once.hi.download()));
  }
  CHECK(dd.error_bits() == 0);
  CHECK(once.error_bits() == 0);
}

// decode_step<..., S> keeps code summaries in the memory it plans (a scale per record beside the codes):
// its prefill() over kv writes the records build() wrote into dd, for every block of the lengths `lens`.
template <class S, class TQ, class TKV, class TS, class KV>
void expect_step_summaries(const device_decode<TQ, TKV, TS>& dd, const KV& kv, const std::vector<std::int32_t>& lens) {
  using step_t = sc::decode_step<bfloat16, bfloat16, S>;
  sc::device_problem p = dd.prob();
  p.block_q = 1;  // a decode step's problem, one selection per kv head (the summaries depend on neither)
  p.max_seqlen_q = 1;
  p.scope = index_scope::kv_head;
  if (!sc::decode{}.can_implement(p).ok()) return;  // head dims decode does not take (the caller draws some it does)
  const sc::decode_step_config config{.prob = p, .top_k = 2};
  step_t step;
  buffer<std::byte> memory(step_t::device_bytes(config));
  SKIM_REQUIRE_OK(step.plan(config, memory.bytes(memory.size())));
  SKIM_REQUIRE_OK(step.prefill(kv, nullptr));
  SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
  const S got = step.summaries();
  const auto records = static_cast<std::size_t>(got.scales(p));
  std::vector<TS> lo(records * p.head_dim), hi(lo.size());
  std::vector<float> scale(records);
  SKIM_CUDA_REQUIRE(cudaMemcpy(lo.data(), got.lo, lo.size() * sizeof(TS), cudaMemcpyDeviceToHost));
  SKIM_CUDA_REQUIRE(cudaMemcpy(hi.data(), got.hi, hi.size() * sizeof(TS), cudaMemcpyDeviceToHost));
  SKIM_CUDA_REQUIRE(cudaMemcpy(scale.data(), got.scale, records * sizeof(float), cudaMemcpyDeviceToHost));
  const std::vector<TS> want_lo = dd.lo.download(), want_hi = dd.hi.download();
  const std::vector<float> want_scale = dd.scales.download();
  std::int64_t bad = 0;
  for (std::size_t b = 0; b < lens.size(); ++b) {
    for (std::int32_t j = 0; j < blocks_of(lens[b], p.block_kv); ++j) {
      for (std::int32_t h = 0; h < p.heads_kv; ++h) {
        const std::size_t r = (b * got.max_kv_blocks + j) * p.heads_kv + h, w = (b * dd.capacity + j) * p.heads_kv + h;
        bad += bits_of(scale[r]) != bits_of(want_scale[w]);
        bad += std::memcmp(lo.data() + r * p.head_dim, want_lo.data() + w * p.head_dim, p.head_dim) != 0;
        bad += std::memcmp(hi.data() + r * p.head_dim, want_hi.data() + w * p.head_dim, p.head_dim) != 0;
      }
    }
  }
  CHECK_MESSAGE(bad == 0, bad, " records of decode_step's summaries differ from build()'s");
}

// Summaries of a quantised cache (core/cuda/quantized.cuh): built from 8-bit codes and their scales
// (per block or per head), they equal the CPU's over the dequantised keys, bit for bit, for max_bound
// <float> and multi_centroid<2>; max_bound<Code> (codes and a scale per record) holds the same values
// once dequantised. A paged cache then grows key by key, each step appended alone or fused into the
// router's score kernel; the route after a fused step is the CPU pipeline's over the dequantised keys.
// dd holds the dequantised keys (the expectations read them); the device summaries are written only
// from the codes. With negative_scales, some of K's scales are negative (code summaries swap ends).
template <class Code, class S>
void check_quantized_summaries(const case_spec& s, std::mt19937& rng, bool negative_scales = false) {
  using TS = typename summary_element<S>::type;
  const bool per_block = skim::test::chance(rng, 0.6);
  INFO(s.describe(), std::string(per_block ? " | scales per block" : " | scales per head"),
       std::string(negative_scales ? " | some scales < 0" : ""));  // strings: a bare const char* prints as a pointer
  const random_case<float, float> shape(s, rng);
  const std::vector<std::int32_t> full = kv_lengths(s);
  const std::int32_t capacity = blocks_of(*std::max_element(full.begin(), full.end()), s.block_kv) + 1;
  skim::test::quantized_host<Code> qh(shape, rng, per_block, capacity);
  if (negative_scales) {  // fp32(-x · v) is -fp32(x · v): flip every third scale and the keys it scales
    const auto flipped = [](std::int64_t si) { return si % 3 == 0; };
    for (std::size_t b = 0; b < full.size(); ++b) {
      for (std::int32_t t = 0; t < full[b]; ++t) {
        for (std::int32_t h = 0; h < s.heads_kv; ++h) {
          const std::int64_t si = static_cast<std::int64_t>(b) * qh.seq_stride + (t / s.block_kv) * qh.block_stride + h * qh.head_stride;
          if (!flipped(si)) continue;
          const std::size_t row = ((shape.cu_kv[b] + t) * s.heads_kv + h) * static_cast<std::size_t>(s.head_dim);
          for (std::int32_t d = 0; d < s.head_dim; ++d) qh.kf[row + d] = -qh.kf[row + d];
        }
      }
    }
    for (std::size_t si = 0; si < qh.k_scales.size(); ++si) {
      if (flipped(static_cast<std::int64_t>(si))) qh.k_scales[si] = -qh.k_scales[si];
    }
  }
  random_case<float, float> c = shape;  // the dequantised keys, for the expectations
  c.k = qh.kf;
  const sc::decode_router router = random_router(rng);
  device_decode<float, float, TS, S> dd(c, router);
  const buffer<Code> k(device_copy(qh.k)), kp(device_copy(qh.k_pages));
  const buffer<float> ks(device_copy(qh.k_scales));
  const std::int64_t hs = s.head_dim, ts = hs * s.heads_kv;
  const auto quantize = [&](const auto& codes) {
    return sc::device_quantized_kv<std::decay_t<decltype(codes)>>{codes, ks.data(), ks.data(), qh.seq_stride,
                                                                   qh.block_stride, qh.head_stride};
  };
  const auto contiguous = quantize(sc::device_contiguous_kv<Code>{.k = k.data(), .v = k.data(), .token_stride = ts,
                                                                   .head_stride = hs});
  const auto paged = quantize(sc::device_paged_kv<Code>{
      .k_pages = kp.data(), .v_pages = kp.data(), .num_pages = c.num_pages, .page_size = s.page_size,
      .page_stride = ts * s.page_size, .token_stride = ts, .head_stride = hs, .page_indptr = dd.page_indptr.data(),
      .page_indices = dd.page_indices.data()});

  SKIM_REQUIRE_OK(sc::build(dd.prob(), contiguous, dd.summaries(), nullptr));
  SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
  expect_summaries(dd, full);
  CHECK(dd.error_bits() == 0);
  if constexpr (sc::is_device_code_v<TS>) expect_step_summaries<S>(dd, contiguous, full);

  std::vector<std::int32_t> lens = full;
  std::int32_t steps = 0;
  for (std::int32_t& l : lens) {
    const std::int32_t cut = std::min(l, skim::test::uniform(rng, 0, s.block_kv + 3));
    l -= cut;
    steps = std::max(steps, cut);
  }
  dd.set_lengths(lens);
  dd.lo.poison();  // the blocks past the prefix are written again by the appends only
  dd.hi.poison();
  dd.scales.poison();
  dd.records.poison();
  SKIM_REQUIRE_OK(sc::build(dd.prob(), paged, dd.summaries(), nullptr));
  for (std::int32_t step = 0; step < steps; ++step) {
    for (std::size_t b = 0; b < lens.size(); ++b) lens[b] = std::min(lens[b] + 1, full[b]);
    dd.set_lengths(lens);
    const bool fused = step % 2 == 1;
    if (fused) {
      SKIM_REQUIRE_OK(dd.router.run(dd.args(), paged, std::span<std::byte>(dd.workspace.data(), dd.workspace.size()),
                                    nullptr));
    } else {
      SKIM_REQUIRE_OK(sc::append_newest(dd.prob(), paged, dd.summaries(), nullptr));
    }
    SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
    INFO("after append step ", step + 1, " of ", steps, fused ? " (fused)" : "");
    expect_summaries(dd, lens);
    if (fused) expect_cpu_route(dd, lens);
  }
  CHECK(dd.error_bits() == 0);
}

// Block sizes for multi_centroid cases: skim::defaults' 4, ragged sub-chunks (3, 5), one key a block,
// and the larger blocks of the max_bound cases.
case_spec centroid_spec(std::mt19937& rng, std::int32_t max_blocks, std::int32_t max_batch, std::int64_t elements) {
  case_spec s = decode_spec(rng, max_blocks, max_batch, elements);
  s.block_kv = skim::test::pick(rng, {1, 2, 3, 4, 4, 5, 8, 16, 64});
  const auto max_kv = static_cast<std::int32_t>(
      std::clamp<std::int64_t>(elements / (s.heads_kv * s.head_dim), 1, max_blocks * s.block_kv));
  for (auto& l : s.seqs) l.kv = std::min(l.kv, max_kv);
  return s;
}

}  // namespace

TEST_CASE("route multi_centroid: build and append_newest equal the CPU's records") {
  seeded(8, [&](std::mt19937& rng, int) {
    const case_spec s = centroid_spec(rng, 12, 3, 200'000);
    check_summaries<float, float, float, centroids>(s, rng);
    check_summaries<bfloat16, bfloat16, float, centroids>(s, rng);
    check_summaries<skim::half, skim::half, float, centroids>(s, rng);
  });
}

TEST_CASE("route multi_centroid: decode routing equals the CPU pipeline (skim::defaults' summaries)") {
  seeded(24, [&](std::mt19937& rng, int iteration) {
    const case_spec s = centroid_spec(rng, 200, 5, 600'000);
    sc::decode_router router = iteration % 3 == 0 ? sc::decode_router{} : random_router(rng);
    if (iteration % 3 == 0) router.selector.dynamic.k = skim::test::uniform(rng, 0, 40);
    if (skim::test::chance(rng, 0.5)) {
      check_route<bfloat16, bfloat16, float, centroids>(s, router, rng);
    } else {
      check_route<float, float, float, centroids>(s, router, rng);
    }
  });
}

TEST_CASE("route small build and append_newest match the host's min and max") {
  seeded(6, [&](std::mt19937& rng, int) {
    case_spec s = decode_spec(rng, 5, 3);
    s.block_kv = skim::test::pick(rng, {16, 32});
    check_summaries<float, float, float>(s, rng);
    check_summaries<bfloat16, bfloat16, bfloat16>(s, rng);
    check_summaries<bfloat16, bfloat16, float>(s, rng);
    check_summaries<skim::half, skim::half, skim::half>(s, rng);
  });
}

TEST_CASE("route small decode selection matches the CPU pipeline") {
  seeded(8, [&](std::mt19937& rng, int) {
    const case_spec s = decode_spec(rng, 12, 4);
    const sc::decode_router router = random_router(rng);
    check_route<float, float, float>(s, router, rng);
    check_route<bfloat16, bfloat16, bfloat16>(s, router, rng);
    check_route<skim::half, skim::half, skim::half>(s, router, rng);
    check_route<bfloat16, bfloat16, float>(s, router, rng);
  });
}

// share_heads: one row per sequence from its index heads' scores pooled (relative and max), against
// the CPU's pooling (route/head_pool.hpp) and selection on the shared problem; more heads than one
// per row half the time (several kv heads, or query-head scope).
TEST_CASE("route small shared selection (share_heads) matches the CPU pooling") {
  seeded(8, [&](std::mt19937& rng, int iteration) {
    case_spec s = decode_spec(rng, 40, 4);
    if (skim::test::chance(rng, 0.5)) s.heads_kv = 3, s.heads_q = 12;
    sc::decode_router router = random_router(rng);
    router.share_heads = true;
    router.pool = iteration % 2 == 0 ? head_pool::relative : head_pool::max;
    INFO(std::string(router.pool == head_pool::relative ? "relative pool" : "max pool"));
    check_route<bfloat16, bfloat16, bfloat16>(s, router, rng);
    check_route<float, float, float>(s, router, rng);
  });
}

// decode_router::routed(): decode selects each row itself (check_routed). Head dims decode takes.
TEST_CASE("route small routed table: decode selects select()'s ids and attends alike") {
  seeded(6, [&](std::mt19937& rng, int) {
    case_spec s = decode_spec(rng, 12, 4);
    s.head_dim = skim::test::pick(rng, {64, 128});
    check_routed<bfloat16>(s, random_router(rng), rng);
  });
}

TEST_CASE("route decode routed table: random shapes and a serving shape") {
  seeded(12, [&](std::mt19937& rng, int iteration) {
    case_spec s = decode_spec(rng, 300, 6, 4'000'000);
    s.head_dim = skim::test::pick(rng, {64, 128});
    sc::decode_router router = random_router(rng);
    router.selector.dynamic.k = skim::test::uniform(rng, 0, 40);
    if (iteration % 2 == 0) {
      check_routed<bfloat16>(s, router, rng);
    } else {
      check_routed<skim::half>(s, router, rng);
    }
  });
  const std::uint32_t seed = fresh_seed();
  INFO("seed ", seed);
  std::mt19937 rng(seed);
  case_spec s;  // B = 4, 32 query heads over 8 kv heads, head_dim 128, bk 128, ~8K keys, 16 blocks selected
  s.heads_q = 32;
  s.heads_kv = 8;
  s.head_dim = 128;
  s.block_kv = 128;
  s.seqs.clear();
  for (int b = 0; b < 4; ++b) s.seqs.push_back({1, 8192 + skim::test::uniform(rng, -300, 300)});
  sc::decode_router router;
  router.selector = {.sink = 1, .local = 2, .dynamic = {.k = 13}};
  check_routed<bfloat16>(s, router, rng);
}

TEST_CASE("route decode random shapes match the CPU pipeline") {
  seeded(40, [&](std::mt19937& rng, int) {
    const case_spec s = decode_spec(rng, 100, 6, 1'000'000);
    sc::decode_router router = random_router(rng);
    router.selector.dynamic.k = skim::test::uniform(rng, 0, 40);
    if (skim::test::chance(rng, 0.5)) {
      check_route<bfloat16, bfloat16, bfloat16>(s, router, rng);
    } else {
      check_route<float, float, float>(s, router, rng);
    }
  });
}

TEST_CASE("route decode long rows: 8192 blocks, and a serving shape") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed ", seed);
  std::mt19937 rng(seed);
  {  // the most blocks a row may have (select's keys fill 32 KB of shared memory)
    case_spec s;
    s.heads_q = 2;
    s.heads_kv = 1;
    s.head_dim = 8;
    s.block_kv = 16;
    s.seqs = {{1, 8192 * 16}, {1, 8192 * 16 - 5}, {1, 3000}};
    sc::decode_router router;
    router.selector = {.sink = 4, .local = 3, .dynamic = {.k = 100}};
    check_route<float, float, float>(s, router, rng);
    router.selector.dynamic.k = 5000;
    check_route<float, float, float>(s, router, rng);
  }
  {  // B = 4, 16 query heads over 4 kv heads, head_dim 128, bk 128, ~16K keys: 16 blocks selected
    case_spec s;
    s.heads_q = 16;
    s.heads_kv = 4;
    s.head_dim = 128;
    s.block_kv = 128;
    s.paged = true;
    s.page_size = 64;
    s.seqs.clear();
    for (int b = 0; b < 4; ++b) s.seqs.push_back({1, 16384 + skim::test::uniform(rng, -300, 300)});
    sc::decode_router router;
    router.selector = {.sink = 1, .local = 2, .dynamic = {.k = 13}};
    check_route<bfloat16, bfloat16, bfloat16>(s, router, rng);
  }
}

TEST_CASE("route small ties go to the lower block id") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed ", seed);
  std::mt19937 rng(seed);
  case_spec s;
  s.heads_q = 4;
  s.heads_kv = 1;
  s.head_dim = 16;
  s.block_kv = 16;
  s.seqs = {{1, 16 * 20}, {1, 16 * 9 + 7}};
  random_case<float, float> c(s, rng);
  const std::size_t row = 16;  // heads_kv * head_dim floats per token
  const auto copy_block = [&](std::int32_t b, std::int32_t from, std::int32_t to) {
    const auto src = c.k.begin() + static_cast<std::ptrdiff_t>((c.cu_kv[b] + from * 16) * row);
    std::copy(src, src + static_cast<std::ptrdiff_t>(16 * row),
              c.k.begin() + static_cast<std::ptrdiff_t>((c.cu_kv[b] + to * 16) * row));
  };
  for (std::int32_t j = 1; j < 20; ++j) copy_block(0, 0, j);  // the deliberate tie: every block alike
  for (const std::int32_t j : {2, 4, 5, 7}) copy_block(1, 3, j);
  sc::decode_router router;
  router.selector = {.sink = 2, .local = 1, .recency = true, .dynamic = {.k = 5}};
  device_decode<float, float, float> dd(c, router);
  SKIM_REQUIRE_OK(dd.build());
  SKIM_REQUIRE_OK(dd.route());
  SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
  CHECK(dd.error_bits() == 0);
  expect_cpu_route(dd, kv_lengths(s));
  const std::vector<std::int32_t> ids = dd.ids.download();
  const std::vector<std::int32_t> row0(ids.begin(), ids.begin() + 8);
  CHECK(row0 == std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 6, 19});  // sink, the 5 lowest tied ids, local
}

TEST_CASE("route small select ranks special scores as the CPU does") {
  seeded(20, [&](std::mt19937& rng, int) {
    const std::vector<std::int32_t> cu_q{0, 1, 2, 2, 3, 4};
    const std::vector<std::int32_t> lens{200, 16 * 40, 50, 0, skim::test::uniform(rng, 1, 16 * 64)};
    const std::vector<std::int32_t> cu_kv = cumulative(lens);
    const problem p{.heads_q = 4, .heads_kv = 2, .head_dim = 8, .block_q = 16, .block_kv = 16,
                    .cu_seqlens_q = cu_q, .cu_seqlens_kv = cu_kv};
    sc::decode_router router = random_router(rng);
    router.selector.dynamic.k = skim::test::uniform(rng, 0, 50);
    INFO("sink ", router.selector.sink, " local ", router.selector.local, " recency ", router.selector.recency, " k ",
         router.selector.dynamic.k);
    // Scores on a few levels (many ties), with NaN, infinities and signed zeros.
    const std::int32_t stride = p.max_kv_blocks();
    const std::int32_t heads = p.index_heads();
    const int levels = skim::test::uniform(rng, 1, 6);
    std::vector<float> device_scores(static_cast<std::size_t>(p.batch() * heads * stride));
    for (float& x : device_scores) x = special_score(rng, 25, levels, 2.0f);
    const std::int64_t rows = p.index_rows();
    std::vector<float> cpu_scores(static_cast<std::size_t>(rows * stride), -inf);
    for (std::int32_t b = 0; b < p.batch(); ++b) {
      if (p.seq_len_q(b) == 0) continue;
      for (std::int32_t h = 0; h < heads; ++h) {
        std::copy_n(device_scores.begin() + (b * heads + h) * stride, stride,
                    cpu_scores.begin() + (p.q_block_offset(b) * heads + h) * stride);
      }
    }
    const std::int32_t width = select::max_count(router.selector, p);
    std::vector<std::int32_t> cpu_ids(static_cast<std::size_t>(rows * width));
    std::vector<std::int32_t> cpu_count(static_cast<std::size_t>(rows));
    skim::test::aligned_workspace ws(select::workspace_bytes(router.selector, p));
    SKIM_REQUIRE_OK(select::select_all(router.selector, p, {.scores = cpu_scores, .score_stride = stride},
                                       index::mutable_block_table{cpu_ids, cpu_count, width}, ws.bytes));

    buffer<std::int32_t> d_cu_q(cu_q), d_cu_kv(cu_kv), ids(cpu_ids.size()), count(cpu_count.size());
    buffer<float> d_scores(device_scores);
    buffer<std::uint32_t> error(1);
    SKIM_CUDA_REQUIRE(cudaMemset(error.data(), 0, sizeof(std::uint32_t)));
    const sc::device_problem dp{.batch = p.batch(), .heads_q = 4, .heads_kv = 2, .head_dim = 8, .block_q = 16,
                                .block_kv = 16, .cu_seqlens_q = d_cu_q.data(), .cu_seqlens_kv = d_cu_kv.data(),
                                .max_seqlen_q = 1, .max_seqlen_kv = *std::max_element(lens.begin(), lens.end()),
                                .error = error.data()};
    REQUIRE(router.width(dp) == width);
    SKIM_REQUIRE_OK(router.select(dp, std::span<const float>(d_scores.data(), d_scores.size()),
                                  {.ids = ids.data(), .count = count.data(), .width = width, .rows = rows}, nullptr));
    SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
    CHECK(ids.download() == cpu_ids);
    CHECK(count.download() == cpu_count);
    std::uint32_t bits = 1;
    SKIM_CUDA_REQUIRE(cudaMemcpy(&bits, error.data(), sizeof bits, cudaMemcpyDeviceToHost));
    CHECK(bits == 0);
  });
}

// select_row in CTAs of Threads threads, one row each (a sequence with one index head): the select
// kernel runs it with 1024 threads, decode's split kernels with 256.
template <int Threads>
__global__ void select_rows_kernel(sc::device_problem p, const float* scores, const std::int32_t* visible,
                                   sc::detail::route_impl::select_params sp, sc::mutable_device_block_table t) {
  namespace impl = sc::detail::route_impl;
  extern __shared__ std::uint32_t select_rows_keys[];
  __shared__ impl::select_scratch scratch;
  const int row = static_cast<int>(blockIdx.x);
  const int count = impl::select_row<Threads, false>(p, scores, row, 0, impl::plan_row(visible[row], sp), sp,
                                                     t.ids + row * t.width, t.width, select_rows_keys, scratch);
  if (threadIdx.x == 0) t.count[row] = count;
}

// The selection in two halves: keep_tile_candidates in CTAs of a tile (grid: tiles, rows), as the
// score kernel runs it, then select_candidates in CTAs of Threads threads, one row each.
__global__ void keep_tiles_kernel(const float* scores, const std::int32_t* visible,
                                  sc::detail::route_impl::select_params sp, int slots, std::int64_t cand_stride,
                                  std::uint64_t* cands) {
  namespace impl = sc::detail::route_impl;
  __shared__ impl::tile_scratch scratch;
  const int row = static_cast<int>(blockIdx.y);
  const int j0 = static_cast<int>(blockIdx.x) * impl::candidate_tile;
  const int id = j0 + static_cast<int>(threadIdx.x);
  const impl::row_plan plan = impl::plan_row(visible[row], sp);
  if (!impl::chooses(plan) || j0 >= plan.bb || j0 + impl::candidate_tile <= plan.a) return;
  const float x = id < sp.stride ? scores[row * sp.stride + id] : 1.0f;  // past the row: not a candidate
  impl::keep_tile_candidates(x, id, plan, slots, cands + row * cand_stride + blockIdx.x * slots, scratch);
}
template <int Threads>
__global__ void select_candidates_kernel(const std::int32_t* visible, sc::detail::route_impl::select_params sp,
                                         const std::uint64_t* cands, int slots, std::int64_t cand_stride,
                                         sc::mutable_device_block_table t) {
  namespace impl = sc::detail::route_impl;
  extern __shared__ std::uint64_t select_cands[];
  __shared__ impl::select_scratch scratch;
  const int row = static_cast<int>(blockIdx.x);
  const int count = impl::select_candidates<Threads>(impl::plan_row(visible[row], sp), cands + row * cand_stride, slots,
                                                     t.ids + row * t.width, t.width, select_cands, scratch);
  if (threadIdx.x == 0) t.count[row] = count;
}

// select_row at every CTA size against the CPU selector: rows up to 3000 candidates (several a thread
// below 1024 threads), scores on a few levels (ties) or spread (few), with NaN, infinities and signed
// zeros, every k from 0 to 20. The same for the two halves (select_candidates at 32 to 256 threads
// over up to 24 tiles' candidates; slots never written by a tile poisoned).
TEST_CASE("route small select: select_row in CTAs of 32 to 1024 threads selects the CPU's ids") {
  namespace impl = sc::detail::route_impl;
  seeded(12, [&](std::mt19937& rng, int iteration) {
    const int rows = 24;
    std::vector<std::int32_t> visible(rows);
    for (std::int32_t& v : visible) {
      v = skim::test::pick(rng, {skim::test::uniform(rng, 1, 40), skim::test::uniform(rng, 100, 1100),
                                 skim::test::uniform(rng, 1000, 3000), 1024, 1025, 1027, 129, 2});
    }
    std::vector<std::int32_t> lens(rows), cu_q(rows + 1);
    for (int r = 0; r < rows; ++r) {
      lens[r] = visible[r] * 16 - skim::test::uniform(rng, 0, 15);
      cu_q[r + 1] = r + 1;
    }
    const std::vector<std::int32_t> cu_kv = cumulative(lens);
    const problem p{.heads_q = 1, .heads_kv = 1, .head_dim = 8, .block_q = 16, .block_kv = 16,
                    .cu_seqlens_q = cu_q, .cu_seqlens_kv = cu_kv};
    const std::int32_t stride = p.max_kv_blocks();
    const select::reserved<select::top_k> selector{.sink = skim::test::uniform(rng, 0, 3),
                                                   .local = skim::test::uniform(rng, 0, 3),
                                                   .dynamic = {.k = skim::test::uniform(rng, 0, 20)}};
    INFO("sink ", selector.sink, " local ", selector.local, " (recency) k ", selector.dynamic.k);
    const int levels = iteration % 2 == 0 ? skim::test::uniform(rng, 1, 6) : 1 << 20;
    std::vector<float> scores(static_cast<std::size_t>(rows) * stride);
    for (float& x : scores) x = special_score(rng, 41, levels, static_cast<float>(levels));
    const std::int32_t width = select::max_count(selector, p);
    std::vector<std::int32_t> cpu_ids(static_cast<std::size_t>(rows) * width), cpu_count(rows);
    skim::test::aligned_workspace ws(select::workspace_bytes(selector, p));
    SKIM_REQUIRE_OK(select::select_all(selector, p, {.scores = scores, .score_stride = stride},
                                       index::mutable_block_table{cpu_ids, cpu_count, width}, ws.bytes));

    buffer<float> d_scores(scores);
    buffer<std::int32_t> d_visible(visible), ids(cpu_ids.size()), count(cpu_count.size());
    const sc::device_problem dp{.batch = rows, .heads_q = 1, .heads_kv = 1, .head_dim = 8, .block_q = 16,
                                .block_kv = 16, .max_seqlen_q = 1};
    const impl::select_params sp{.k = selector.dynamic.k, .sink = selector.sink,
                                 .newest = std::max(selector.local, selector.recency ? 1 : 0),  // recency: on
                                 .stride = stride};
    const sc::mutable_device_block_table t{.ids = ids.data(), .count = count.data(), .width = width, .rows = rows};
    const std::size_t smem = sizeof(std::uint32_t) * static_cast<std::size_t>(stride);
    const auto check = [&](auto kernel, int threads) {
      INFO(threads, " threads");
      SKIM_CUDA_REQUIRE(cudaMemset(ids.data(), 0x7f, ids.size() * sizeof(std::int32_t)));
      SKIM_CUDA_REQUIRE(cudaMemset(count.data(), 0x7f, count.size() * sizeof(std::int32_t)));
      kernel<<<rows, threads, smem>>>(dp, d_scores.data(), d_visible.data(), sp, t);
      SKIM_CUDA_REQUIRE(cudaGetLastError());
      SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
      CHECK(ids.download() == cpu_ids);
      CHECK(count.download() == cpu_count);
    };
    check(select_rows_kernel<256>, 256);
    check(select_rows_kernel<128>, 128);
    check(select_rows_kernel<32>, 32);
    check(select_rows_kernel<impl::select_threads>, impl::select_threads);

    const int slots = impl::candidate_slots(selector.dynamic.k);
    const std::int64_t tiles = (stride + impl::candidate_tile - 1) / impl::candidate_tile;
    const std::int64_t cand_stride = tiles * slots;
    buffer<std::uint64_t> cands(static_cast<std::size_t>(std::max<std::int64_t>(rows * cand_stride, 1)));
    const auto check_halves = [&](auto kernel, int threads) {
      INFO("two halves, ", threads, " threads");
      SKIM_CUDA_REQUIRE(cudaMemset(cands.data(), 0x5a, cands.size() * sizeof(std::uint64_t)));
      SKIM_CUDA_REQUIRE(cudaMemset(ids.data(), 0x7f, ids.size() * sizeof(std::int32_t)));
      SKIM_CUDA_REQUIRE(cudaMemset(count.data(), 0x7f, count.size() * sizeof(std::int32_t)));
      keep_tiles_kernel<<<dim3(static_cast<unsigned>(tiles), rows), impl::candidate_tile>>>(
          d_scores.data(), d_visible.data(), sp, slots, cand_stride, cands.data());
      SKIM_CUDA_REQUIRE(cudaGetLastError());
      kernel<<<rows, threads, impl::candidate_entries(cand_stride) * sizeof(std::uint64_t)>>>(
          d_visible.data(), sp, cands.data(), slots, cand_stride, t);
      SKIM_CUDA_REQUIRE(cudaGetLastError());
      SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
      CHECK(ids.download() == cpu_ids);
      CHECK(count.download() == cpu_count);
    };
    check_halves(select_candidates_kernel<256>, 256);
    check_halves(select_candidates_kernel<128>, 128);
    check_halves(select_candidates_kernel<32>, 32);
  });
}

TEST_CASE("route small graph capture: append and route replayed while the sequences grow") {
  for (const int mode : {0, 1, 2, 3}) {  // paged or contiguous; append_newest + run, or run with the source
    const bool paged = mode % 2 == 0, fused = mode >= 2;
    const std::uint32_t seed = fresh_seed();
    INFO("seed ", seed, paged ? " paged" : " contiguous", fused ? ", append fused into score" : "");
    std::mt19937 rng(seed);
    case_spec s;
    s.heads_q = 8;
    s.heads_kv = 2;
    s.head_dim = 64;
    s.block_kv = 16;
    s.paged = paged;
    s.page_size = 16;
    s.seqs = {{1, 16 * 7 + 1}, {1, 16 * 3 + 2}, {1, skim::test::uniform(rng, 3, 200)}, {1, 3}};
    const random_case<bfloat16, bfloat16> c(s, rng);
    sc::decode_router router;
    router.selector = {.sink = 1, .local = 1, .dynamic = {.k = 3}};
    device_decode<bfloat16, bfloat16, bfloat16> dd(c, router);
    std::vector<std::int32_t> lens = kv_lengths(s);
    for (std::int32_t& l : lens) l -= 2;  // sequence 0: the first replay ends block 6, the second starts block 7
    dd.set_lengths(lens);
    SKIM_REQUIRE_OK(dd.build());
    SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());

    cudaStream_t stream = nullptr;
    SKIM_CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    SKIM_CUDA_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const status appended = fused ? status::success() : dd.append(stream);
    const status routed = fused ? dd.append_and_route(stream) : dd.route(stream);
    SKIM_CUDA_REQUIRE(cudaStreamEndCapture(stream, &graph));
    SKIM_REQUIRE_OK(appended);
    SKIM_REQUIRE_OK(routed);
    SKIM_CUDA_REQUIRE(cudaGraphInstantiate(&exec, graph, 0));
    for (int step = 0; step < 2; ++step) {
      INFO("replay ", step + 1);
      for (std::int32_t& l : lens) ++l;
      dd.set_lengths(lens);  // the new key is in K and counted by cu_seqlens_kv
      SKIM_CUDA_REQUIRE(cudaGraphLaunch(exec, stream));
      SKIM_CUDA_REQUIRE(cudaStreamSynchronize(stream));
      CHECK(dd.error_bits() == 0);
      expect_summaries(dd, lens);
      expect_cpu_route(dd, lens);
    }
    SKIM_CUDA_REQUIRE(cudaGraphExecDestroy(exec));
    SKIM_CUDA_REQUIRE(cudaGraphDestroy(graph));
    SKIM_CUDA_REQUIRE(cudaStreamDestroy(stream));
  }
}

// skim::cuda::decode_step (decode_step.cuh) runs, in one object, the step this file checks piece by
// piece: captured once in a graph and replayed while the sequences grow, it selects the ids of the
// router over the same keys (and so the CPU pipeline's, expect_cpu_route) and attends as decode over
// them, bit for bit.
template <class S>
void check_decode_step(bool paged) {
  using TS = std::conditional_t<sc::is_device_multi_centroid_v<S>, float, bfloat16>;
  const std::uint32_t seed = fresh_seed();
  INFO("seed ", seed, paged ? " paged" : " contiguous", sc::is_device_multi_centroid_v<S> ? " multi_centroid" : " max_bound");
  std::mt19937 rng(seed);
  case_spec s;
  s.heads_q = 8;
  s.heads_kv = 2;
  s.head_dim = 64;
  s.block_q = 1;
  s.block_kv = sc::is_device_multi_centroid_v<S> ? defaults::block_kv : 16;
  s.paged = paged;
  s.page_size = 16;
  s.seqs = {{1, 16 * 7 + 1}, {1, 37}, {1, skim::test::uniform(rng, 4, 200)}, {1, 4}};
  const random_case<bfloat16, bfloat16> c(s, rng);
  sc::decode_router router;
  router.selector.dynamic.k = 5;  // skim::defaults' reserves otherwise, as decode_step's
  device_decode<bfloat16, bfloat16, TS, S> dd(c, router);
  std::vector<std::int32_t> lens = kv_lengths(s);
  for (std::int32_t& l : lens) l -= 3;
  dd.set_lengths(lens);
  SKIM_REQUIRE_OK(dd.build());

  const sc::decode_step_config config{.prob = dd.prob(), .top_k = router.selector.dynamic.k};
  using step_t = sc::decode_step<bfloat16, bfloat16, S>;
  step_t step;
  buffer<std::byte> memory(step_t::device_bytes(config));
  const std::span<std::byte> all = memory.bytes(memory.size());
  CHECK(step.run(sc::device_view<const bfloat16>{}, dd.contiguous(), sc::device_view<bfloat16>{}, nullptr, nullptr)
            .code() == status_code::invalid_argument);  // before plan()
  CHECK(step.plan(config, all.first(all.size() - 1)).code() == status_code::workspace_too_small);
  SKIM_REQUIRE_OK(step.plan(config, all));
  const sc::device_problem p = dd.prob();
  const std::size_t n_o = static_cast<std::size_t>(s.seqs.size()) * p.heads_q * p.head_dim;
  buffer<bfloat16> o(n_o), want_o(n_o);
  buffer<float> lse(s.seqs.size() * p.heads_q), want_lse(s.seqs.size() * p.heads_q);
  const auto q = sc::device_view<const bfloat16>::token_major(dd.q.data(), p.heads_q, p.head_dim);
  const auto step_run = [&](const auto& kv, cudaStream_t stream) {
    return step.run(q, kv, sc::device_view<bfloat16>::token_major(o.data(), p.heads_q, p.head_dim), lse.data(),
                    stream);
  };
  SKIM_REQUIRE_OK(paged ? step.prefill(dd.paged(), nullptr) : step.prefill(dd.contiguous(), nullptr));
  SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());

  cudaStream_t stream = nullptr;
  SKIM_CUDA_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  SKIM_CUDA_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const status captured = paged ? step_run(dd.paged(), stream) : step_run(dd.contiguous(), stream);
  SKIM_CUDA_REQUIRE(cudaStreamEndCapture(stream, &graph));
  SKIM_REQUIRE_OK(captured);
  SKIM_CUDA_REQUIRE(cudaGraphInstantiate(&exec, graph, 0));
  const sc::decode dec;
  buffer<std::byte> ws(std::max<std::size_t>(dec.workspace_bytes(p, dd.width), 1));
  for (int replay = 0; replay < 3; ++replay) {
    INFO("replay ", replay + 1);
    for (std::int32_t& l : lens) ++l;
    dd.set_lengths(lens);  // the new key is in K and counted by cu_seqlens_kv
    SKIM_CUDA_REQUIRE(cudaGraphLaunch(exec, stream));
    SKIM_CUDA_REQUIRE(cudaStreamSynchronize(stream));
    CHECK(dd.error_bits() == 0);
    // The same step from its parts, over dd's own summaries and table.
    SKIM_REQUIRE_OK(dd.append_and_route());
    const auto attend = [&](const auto& kv) {
      using KV = std::decay_t<decltype(kv)>;
      const sc::device_attention_args<bfloat16, KV, sc::device_block_table, bfloat16> a{
          .prob = p, .q = q, .kv = kv, .index = dd.args().index,
          .o = sc::device_view<bfloat16>::token_major(want_o.data(), p.heads_q, p.head_dim), .lse = want_lse.data()};
      return dec.run(a, ws.bytes(dec.workspace_bytes(p, dd.width)), nullptr);
    };
    SKIM_REQUIRE_OK(paged ? attend(dd.paged()) : attend(dd.contiguous()));
    SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
    CHECK(dd.error_bits() == 0);
    const sc::device_block_table t = step.table();
    REQUIRE(t.width == dd.width);
    REQUIRE(t.rows == dd.rows);
    std::vector<std::int32_t> ids(dd.ids.size()), count(dd.count.size());
    SKIM_CUDA_REQUIRE(cudaMemcpy(ids.data(), t.ids, ids.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost));
    SKIM_CUDA_REQUIRE(cudaMemcpy(count.data(), t.count, count.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost));
    CHECK(count == dd.count.download());
    CHECK(ids == dd.ids.download());
    const std::vector<bfloat16> got = o.download(), want = want_o.download();
    std::int64_t differ = 0;
    for (std::size_t i = 0; i < n_o; ++i) differ += bits_of(got[i]) != bits_of(want[i]);
    const std::vector<float> got_lse = lse.download(), want_l = want_lse.download();
    for (std::size_t i = 0; i < got_lse.size(); ++i) differ += bits_of(got_lse[i]) != bits_of(want_l[i]);
    CHECK_MESSAGE(differ == 0, differ, " outputs differ from the step's parts");
    expect_cpu_route(dd, lens);
  }
  SKIM_CUDA_REQUIRE(cudaGraphExecDestroy(exec));
  SKIM_CUDA_REQUIRE(cudaGraphDestroy(graph));
  SKIM_CUDA_REQUIRE(cudaStreamDestroy(stream));
}

TEST_CASE("route small decode_step: one object, replayed in a graph, equals its parts") {
  for (const bool paged : {false, true}) {
    check_decode_step<centroids>(paged);
    check_decode_step<sc::device_max_bound<bfloat16>>(paged);
  }
}

TEST_CASE("route small bad input: host bounds rejected, device lengths reported") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed ", seed);
  std::mt19937 rng(seed);
  case_spec s;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.head_dim = 32;
  s.block_kv = 16;
  s.seqs = {{1, 100}, {1, 40}, {0, 7}};
  const random_case<float, float> c(s, rng);
  sc::decode_router router;
  router.selector = {.sink = 1, .local = 2, .dynamic = {.k = 2}};
  device_decode<float, float, float> dd(c, router);
  const sc::device_problem p = dd.prob();

  sc::device_problem two_queries = p;
  two_queries.max_seqlen_q = 2;
  CHECK(router.can_implement(two_queries).code() == status_code::unsupported);
  sc::device_problem too_long = p;
  too_long.max_seqlen_kv = (sc::decode_router::max_blocks + 1) * s.block_kv;
  CHECK(router.can_implement(too_long).code() == status_code::unsupported);
  sc::decode_router with_prior = router;
  with_prior.selector.importance = 0.5f;
  CHECK(with_prior.can_implement(p).code() == status_code::unsupported);
  sc::decode_router negative = router;
  negative.selector.dynamic.k = -1;
  CHECK(negative.can_implement(p).code() == status_code::invalid_argument);

  auto narrow = dd.args();
  narrow.index.width = dd.width - 1;
  CHECK(router.run(narrow, std::span<std::byte>(dd.workspace.data(), dd.workspace.size()), nullptr).code() ==
        status_code::shape_mismatch);
  CHECK(router.run(dd.args(), std::span<std::byte>(dd.workspace.data(), dd.workspace.size() - 64), nullptr).code() ==
        status_code::workspace_too_small);
  auto small_summaries = dd.args();
  small_summaries.summaries.max_kv_blocks = p.max_kv_blocks() - 1;
  CHECK(router.run(small_summaries, std::span<std::byte>(dd.workspace.data(), dd.workspace.size()), nullptr).code() ==
        status_code::shape_mismatch);
  CHECK(sc::build(p, dd.contiguous(), small_summaries.summaries, nullptr).code() == status_code::shape_mismatch);

  // A sequence longer than the host's bound: skipped and reported, by every kernel.
  dd.max_kv = 60;
  SKIM_REQUIRE_OK(dd.build());
  SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
  CHECK((dd.error_bits() & sc::bad_seqlen) != 0);
  SKIM_REQUIRE_OK(dd.append());
  SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
  CHECK((dd.error_bits() & sc::bad_seqlen) != 0);
  SKIM_REQUIRE_OK(dd.route());
  SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
  CHECK((dd.error_bits() & sc::bad_seqlen) != 0);
  const std::vector<std::int32_t> count = dd.count.download();
  CHECK(count[0] == -1);  // sequence 0's rows stay unwritten (poison)
  CHECK(count[1] == -1);
  CHECK(count[2] == 3);  // sequence 1 (40 keys, 3 blocks) is routed: sink 1 and local 2
}

// decode_router::routed() and decode::run over a device_routed_table: what the host rejects, each
// with its status; the well-formed table still runs.
TEST_CASE("route small routed table: bad input rejected on the host") {
  const std::uint32_t seed = fresh_seed();
  INFO("seed ", seed);
  std::mt19937 rng(seed);
  case_spec s;
  s.heads_q = 4;
  s.heads_kv = 1;
  s.head_dim = 64;
  s.block_kv = 16;
  s.seqs = {{1, 100}, {1, 40}};
  const random_case<bfloat16, bfloat16> c(s, rng);
  sc::decode_router router;
  router.selector = {.sink = 1, .local = 2, .dynamic = {.k = 2}};
  device_decode<bfloat16, bfloat16, bfloat16> dd(c, router);
  const sc::device_problem p = dd.prob();
  const std::span<std::byte> ws = dd.workspace.bytes(dd.workspace.size());
  const std::span<float> scores = router.scores_in(ws, p);
  REQUIRE(scores.size() == static_cast<std::size_t>(router.score_floats(p)));
  REQUIRE(static_cast<const void*>(scores.data()) == static_cast<const void*>(ws.data()));
  SKIM_REQUIRE_OK(dd.build());
  // A workspace one float short of the scores gives a span one float short, which score() refuses.
  const std::span<float> short_scores = router.scores_in(ws.first(scores.size_bytes() - sizeof(float)), p);
  CHECK(short_scores.size() == scores.size() - 1);
  CHECK(router.score(dd.args(), short_scores, nullptr).code() == status_code::shape_mismatch);
  SKIM_REQUIRE_OK(router.score(dd.args(), scores, nullptr));

  sc::device_routed_table rt;
  sc::decode_router shared = router;
  shared.share_heads = true;
  CHECK(shared.routed(p, scores, dd.args().index, rt).code() == status_code::unsupported);
  auto narrow = dd.args().index;
  narrow.width = dd.width - 1;
  CHECK(router.routed(p, scores, narrow, rt).code() == status_code::shape_mismatch);
  CHECK(router.routed(p, scores.first(scores.size() - 1), dd.args().index, rt).code() == status_code::shape_mismatch);
  SKIM_REQUIRE_OK(router.routed(p, scores, dd.args().index, rt));

  buffer<bfloat16> o(static_cast<std::size_t>(2 * p.heads_q * p.head_dim));
  const skim::cuda::decode dec;
  const auto run = [&](const sc::device_problem& pp, const sc::device_routed_table& r) {
    const sc::device_attention_args<bfloat16, sc::device_contiguous_kv<bfloat16>, sc::device_routed_table, bfloat16> a{
        .prob = pp, .q = sc::device_view<const bfloat16>::token_major(dd.q.data(), p.heads_q, p.head_dim),
        .kv = dd.contiguous(), .index = r, .o = sc::device_view<bfloat16>::token_major(o.data(), p.heads_q, p.head_dim)};
    const std::size_t ws_bytes = dec.workspace_bytes(pp, r.table.width);
    buffer<std::byte> ws(std::max<std::size_t>(ws_bytes, 1));
    return dec.run(a, ws.bytes(ws_bytes), nullptr).code();
  };
  sc::device_routed_table bad = rt;
  bad.table.width = dd.width - 1;
  CHECK(run(p, bad) == status_code::shape_mismatch);  // fewer ids than a row may select
  bad = rt;
  bad.select.stride = p.max_kv_blocks() - 1;
  CHECK(run(p, bad) == status_code::shape_mismatch);  // score rows shorter than the blocks
  bad = rt;
  bad.scores = nullptr;
  CHECK(run(p, bad) == status_code::invalid_argument);
  bad = rt;
  bad.select.k = -1;
  CHECK(run(p, bad) == status_code::invalid_argument);
  // score_routed(): the workspace holds the kept candidates too (k 2 over 7 blocks: one tile's 2 slots).
  sc::device_routed_table kept;
  REQUIRE(router.candidate_stride(p) == 2);
  CHECK(router.score_routed(dd.args(), ws.first(ws.size() - 1), kept, nullptr).code() ==
        status_code::workspace_too_small);
  SKIM_REQUIRE_OK(router.score_routed(dd.args(), ws, kept, nullptr));
  REQUIRE(kept.candidates != nullptr);
  CHECK(run(p, kept) == status_code::ok);
  bad = kept;
  bad.slots = 3;  // not candidate_slots(k)
  CHECK(run(p, bad) == status_code::invalid_argument);
  bad = kept;
  bad.candidate_stride = 1;  // fewer than a row's tiles hold
  CHECK(run(p, bad) == status_code::invalid_argument);
  sc::device_problem speculative = p;
  speculative.max_seqlen_q = 2;
  CHECK(run(speculative, rt) == status_code::unsupported);  // the router's rows are one query each
  CHECK(run(p, rt) == status_code::ok);
  SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
  CHECK(dd.error_bits() == 0);
  expect_cpu_route(dd, kv_lengths(s));
}

TEST_CASE("route quantized K: summaries of int8 and fp8 codes equal the CPU's over the dequantised keys") {
  seeded(6, [&](std::mt19937& rng, int) {
    case_spec s = decode_spec(rng, 8, 3, 200'000);
    s.block_kv = skim::test::pick(rng, {16, 32});
    check_quantized_summaries<std::int8_t, sc::device_max_bound<float>>(s, rng);
    check_quantized_summaries<skim::fp8_e4m3, sc::device_max_bound<float>>(s, rng);
    const case_spec cs = centroid_spec(rng, 10, 3, 200'000);
    check_quantized_summaries<std::int8_t, centroids>(cs, rng);
    check_quantized_summaries<skim::fp8_e4m3, centroids>(cs, rng);
  });
}

TEST_CASE("route quantized K: summaries in the codes' type bound the dequantised keys and route alike") {
  seeded(8, [&](std::mt19937& rng, int i) {
    case_spec s = decode_spec(rng, 8, 3, 200'000);
    s.block_kv = skim::test::pick(rng, {1, 3, 16, 32});
    if (i % 2 == 0) s.head_dim = skim::test::pick(rng, {64, 128});  // decode_step's head dims, 16-byte loads
    const bool negative_scales = i % 4 >= 2;
    check_quantized_summaries<std::int8_t, sc::device_max_bound<std::int8_t>>(s, rng, negative_scales);
    check_quantized_summaries<skim::fp8_e4m3, sc::device_max_bound<skim::fp8_e4m3>>(s, rng, negative_scales);
  });
}
