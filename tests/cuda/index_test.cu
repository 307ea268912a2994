// The device indices (index/cuda/device_index.cuh) against the CPU ones (skim::index): a small kernel walks
// every row's cursor on the device, with the row geometry make_device_row computes from the device
// cu_seqlens, and writes the ids; every row must hold exactly the ids the CPU cursor of the same
// index gives (stored forms, causal_all, sink, sliding_window, unions of them), on random varlen
// shapes (empty sequences, partial blocks, q_len > kv_len, both masks, both scopes). Broken stored
// rows (unsorted, repeated, out-of-range ids, counts past the width) are compared raw: the cursors
// do not check ids (the kernels do), and a union merges them exactly as index::block_union does.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cuda/support.cuh"
#include "skim/index/cuda/device_index.cuh"
#include "skim/index/block_csr.hpp"
#include "skim/index/block_table.hpp"
#include "skim/index/block_union.hpp"
#include "skim/index/causal_all.hpp"
#include "skim/index/sink.hpp"
#include "skim/index/sliding_window.hpp"
#include "support/random_case.hpp"

namespace {

using namespace skim;
using namespace skim::test;
namespace tc = skim::test::cuda;
namespace sc = skim::cuda;

// One thread per (query block, sequence, index head) of the device problem: walks the row's
// cursor, writes up to `width` ids at ids[row * width], the number of ids at count[row] (all of
// them, also past width), the cursor's malformed() at malformed[row] and the geometry's
// visible_blocks at visible[row]. Rows that do not exist write nothing.
template <class Index>
__global__ void walk_rows(const sc::device_problem p, const Index index, std::int32_t width, std::int32_t* ids,
                          std::int32_t* count, std::int32_t* malformed, std::int32_t* visible) {
  const std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int32_t heads = p.index_heads();
  if (t >= static_cast<std::int64_t>(p.max_q_blocks()) * p.batch * heads) return;
  const auto h = static_cast<std::int32_t>(t % heads);
  const auto b = static_cast<std::int32_t>(t / heads % p.batch);
  const auto i = static_cast<std::int32_t>(t / heads / p.batch);
  const sc::device_row g = sc::make_device_row(p, b, i);
  if (!g.ok) return;
  const std::int64_t r = (sc::q_block_offset(p, b) + i) * heads + h;
  auto c = index.cursor(r, g);
  std::int32_t n = 0;
  for (; !c.done(); c.next(), ++n) {
    if (n < width) ids[r * width + n] = c.id();
  }
  count[r] = n;
  malformed[r] = c.malformed() ? 1 : 0;
  visible[r] = g.visible_blocks;
}

// A random problem (no tensors: the cursors read only geometry and the index).
struct shape {
  std::vector<std::int32_t> cu_q{0}, cu_kv{0};
  problem p;
  std::int32_t max_q = 0, max_kv = 0;

  explicit shape(std::mt19937& rng) {
    p.heads_kv = uniform(rng, 1, 3);
    p.heads_q = p.heads_kv * pick(rng, {1, 4, 8});
    p.head_dim = 64;
    p.block_q = pick(rng, {16, 64, 128});
    p.block_kv = pick(rng, {16, 32, 64, 128});
    p.mask = chance(rng, 0.7) ? mask_kind::causal : mask_kind::none;
    p.scope = chance(rng, 0.7) ? index_scope::kv_head : index_scope::query_head;
    const std::int32_t batch = uniform(rng, 1, 5);
    for (std::int32_t b = 0; b < batch; ++b) {
      std::int32_t q = uniform(rng, 0, 700), kv = uniform(rng, 0, 900);
      switch (uniform(rng, 0, 4)) {
        case 0: q = 0; break;         // empty sequence
        case 1: kv = q; break;        // plain prefill
        case 2: q = std::min(q, kv); break;  // prefix caching
        default: break;               // anything, q_len > kv_len included
      }
      cu_q.push_back(cu_q.back() + q);
      cu_kv.push_back(cu_kv.back() + kv);
      max_q = std::max(max_q, q);
      max_kv = std::max(max_kv, kv);
    }
    p.cu_seqlens_q = cu_q;
    p.cu_seqlens_kv = cu_kv;
  }
};

// A block_table over every row of p: random ids per row (a valid selection, or with `broken` some
// rows unsorted, repeated, out of range, or with a count past the width or below 0).
struct table_storage {
  std::vector<std::int32_t> ids, count;
  std::int32_t width = 0;

  table_storage(const problem& p, std::mt19937& rng, bool broken) {
    std::vector<std::vector<std::int32_t>> rows;
    REQUIRE(for_each_row(p, [&](const row_info& r) {
              std::vector<std::int32_t> row;
              for (std::int32_t id = 0; id < r.visible_blocks; ++id) {
                if (chance(rng, 0.3)) row.push_back(id);
              }
              if (broken && chance(rng, 0.3)) {
                switch (uniform(rng, 0, 3)) {
                  case 0: std::shuffle(row.begin(), row.end(), rng); break;
                  case 1: if (!row.empty()) row.push_back(row.front()); break;
                  case 2: row.push_back(r.visible_blocks + uniform(rng, 0, 3)); break;
                  default: row.insert(row.begin(), -uniform(rng, 1, 3)); break;
                }
              }
              rows.push_back(std::move(row));
            }).ok());
    for (const auto& r : rows) width = std::max(width, static_cast<std::int32_t>(r.size()));
    width += 1;
    ids.assign(rows.size() * static_cast<std::size_t>(width), -1);
    for (std::size_t r = 0; r < rows.size(); ++r) {
      std::copy(rows[r].begin(), rows[r].end(), ids.begin() + static_cast<std::ptrdiff_t>(r * width));
      count.push_back(static_cast<std::int32_t>(rows[r].size()));
      if (broken && chance(rng, 0.05)) count.back() = chance(rng, 0.5) ? width + 4 : -2;  // clamped
    }
  }
  [[nodiscard]] index::block_table view() const { return {ids, count, width}; }
};

// CSR of a (valid) table's rows.
struct csr_of {
  std::vector<std::int32_t> row_ptr{0}, col_idx;
  explicit csr_of(const table_storage& t) {
    for (std::size_t r = 0; r < t.count.size(); ++r) {
      const std::int32_t n = std::clamp(t.count[r], 0, t.width);
      col_idx.insert(col_idx.end(), t.ids.begin() + static_cast<std::ptrdiff_t>(r * t.width),
                     t.ids.begin() + static_cast<std::ptrdiff_t>(r * t.width + n));
      row_ptr.push_back(static_cast<std::int32_t>(col_idx.size()));
    }
  }
  [[nodiscard]] index::block_csr view() const { return {row_ptr, col_idx}; }
};

// The shape and the table on the device.
struct device_shape {
  tc::buffer<std::int32_t> cu_q, cu_kv, ids, count, row_ptr, col_idx;
  sc::device_problem prob;
  sc::device_block_table table;
  sc::device_block_csr csr;

  device_shape(const shape& s, const table_storage& t, const csr_of& c)
      : cu_q(s.cu_q), cu_kv(s.cu_kv), ids(t.ids.empty() ? std::vector<std::int32_t>{-1} : t.ids),
        count(t.count.empty() ? std::vector<std::int32_t>{0} : t.count), row_ptr(c.row_ptr),
        col_idx(c.col_idx.empty() ? std::vector<std::int32_t>{-1} : c.col_idx) {
    prob = {.batch = static_cast<std::int32_t>(s.cu_q.size()) - 1, .heads_q = s.p.heads_q, .heads_kv = s.p.heads_kv,
            .head_dim = s.p.head_dim, .block_q = s.p.block_q, .block_kv = s.p.block_kv, .mask = s.p.mask,
            .scope = s.p.scope, .cu_seqlens_q = cu_q.data(), .cu_seqlens_kv = cu_kv.data(), .max_seqlen_q = s.max_q,
            .max_seqlen_kv = s.max_kv};
    const auto rows = static_cast<std::int64_t>(t.count.size());
    table = {.ids = ids.data(), .count = count.data(), .width = t.width, .rows = rows};
    csr = {.row_ptr = row_ptr.data(), .col_idx = col_idx.data(),
           .capacity = static_cast<std::int64_t>(c.col_idx.size()), .rows = rows};
  }
};

// Walks `dev` on the device and `cpu` on the host over every row of s.p; the ids, counts and
// visible blocks must agree row for row. `malformed_rows` lists the rows whose cursor must say
// malformed() (the others must not).
template <class DeviceIndex, class CpuIndex>
void check_same_rows(const shape& s, const device_shape& ds, const DeviceIndex& dev, const CpuIndex& cpu,
                     const std::vector<bool>& malformed_rows, const std::string& what) {
  INFO(what);
  const std::int64_t rows = s.p.index_rows();
  std::int32_t width = 1;
  REQUIRE(for_each_row(s.p, [&](const row_info& r) {
            std::int32_t n = 0;
            for (auto c = cpu.cursor(r); !c.done(); c.next()) ++n;
            width = std::max(width, n);
          }).ok());
  tc::buffer<std::int32_t> ids(static_cast<std::size_t>(std::max<std::int64_t>(rows, 1) * width));
  tc::buffer<std::int32_t> count(static_cast<std::size_t>(std::max<std::int64_t>(rows, 1)));
  tc::buffer<std::int32_t> malformed(count.size()), visible(count.size());
  const std::int64_t threads = static_cast<std::int64_t>(ds.prob.max_q_blocks()) * ds.prob.batch * s.p.index_heads();
  if (threads > 0) {
    walk_rows<<<static_cast<unsigned>(sc::ceil_div(threads, 128)), 128>>>(ds.prob, dev, width, ids.data(),
                                                                          count.data(), malformed.data(),
                                                                          visible.data());
    SKIM_CUDA_REQUIRE(cudaGetLastError());
    SKIM_CUDA_REQUIRE(cudaDeviceSynchronize());
  }
  const std::vector<std::int32_t> got_ids = ids.download(), got_count = count.download(),
                                  got_malformed = malformed.download(), got_visible = visible.download();
  std::int64_t seen = 0;
  REQUIRE(for_each_row(s.p, [&](const row_info& r) {
            INFO("row " << r.row << " (seq " << r.seq << ", q block " << r.q_block << ", head " << r.head
                        << ", visible " << r.visible_blocks << ")");
            std::vector<std::int32_t> want;
            for (auto c = cpu.cursor(r); !c.done(); c.next()) want.push_back(c.id());
            const auto u = static_cast<std::size_t>(r.row);
            CHECK(got_count[u] == static_cast<std::int32_t>(want.size()));  // every row written
            const std::vector<std::int32_t> got(got_ids.begin() + static_cast<std::ptrdiff_t>(u * width),
                                                got_ids.begin() + static_cast<std::ptrdiff_t>(u * width + want.size()));
            CHECK(got == want);
            CHECK(got_visible[u] == r.visible_blocks);
            CHECK((got_malformed[u] != 0) == (u < malformed_rows.size() && malformed_rows[u]));
            ++seen;
          }).ok());
  CHECK(seen == rows);
}

}  // namespace

TEST_CASE("device indices small: every form gives the CPU index's ids") {
  for (std::uint32_t seed = 0; seed < 12; ++seed) {
    std::mt19937 rng(0x1d3e0u + seed);
    const shape s(rng);
    const bool broken = seed % 3 == 2;
    const table_storage t(s.p, rng, broken);
    const csr_of c(t);
    device_shape ds(s, t, c);
    const std::int32_t sink = uniform(rng, 0, 3), window = uniform(rng, 0, 4);
    INFO("seed " << seed << (broken ? " broken table" : "") << ", sink " << sink << ", window " << window << ", bq "
                 << s.p.block_q << ", bk " << s.p.block_kv << (s.p.mask == mask_kind::causal ? " causal" : " none"));

    std::vector<bool> clamped(t.count.size());
    for (std::size_t r = 0; r < t.count.size(); ++r) clamped[r] = t.count[r] < 0 || t.count[r] > t.width;
    const std::vector<bool> none;

    check_same_rows(s, ds, ds.table, t.view(), clamped, "block_table");
    check_same_rows(s, ds, ds.csr, c.view(), none, "block_csr");
    check_same_rows(s, ds, sc::device_causal_all{}, index::causal_all{}, none, "causal_all");
    check_same_rows(s, ds, sc::device_sink{sink}, index::sink{sink}, none, "sink");
    check_same_rows(s, ds, sc::device_sliding_window{window}, index::sliding_window{window}, none, "sliding_window");
    check_same_rows(s, ds, sc::make_device_union(sc::device_sink{sink}, sc::device_sliding_window{window}),
                    index::make_union(index::sink{sink}, index::sliding_window{window}), none, "sink + window");
    check_same_rows(s, ds,
                    sc::make_device_union(ds.table, sc::device_sink{sink}, sc::device_sliding_window{window}),
                    index::make_union(t.view(), index::sink{sink}, index::sliding_window{window}), clamped,
                    "table + sink + window");
    check_same_rows(s, ds, sc::make_device_union(sc::device_sliding_window{window}, ds.csr),
                    index::make_union(index::sliding_window{window}, c.view()), none, "window + csr");
    check_same_rows(s, ds, sc::make_device_union(sc::device_causal_all{}, ds.table),
                    index::make_union(index::causal_all{}, t.view()), clamped, "causal_all + table");
  }
}

TEST_CASE("device index traits and host checks") {
  static_assert(sc::is_device_index_v<sc::device_block_table> && sc::is_stored_device_index_v<sc::device_block_csr>);
  static_assert(sc::is_device_index_v<sc::device_union<sc::device_sink, sc::device_sliding_window>>);
  static_assert(!sc::is_stored_device_index_v<sc::device_causal_all>);
  static_assert(sc::device_cursor_t<sc::device_union<sc::device_sink, sc::device_causal_all>>::trusted);
  static_assert(!sc::device_cursor_t<sc::device_union<sc::device_sink, sc::device_block_csr>>::trusted);

  CHECK(sc::device_sink{0}.validate().ok());
  status st = sc::device_sink{-1}.validate();
  CHECK(st.code() == status_code::invalid_argument);
  CHECK(std::string(st.message()) == "sink blocks -1 < 0");
  st = sc::device_sliding_window{-3}.validate();
  CHECK(std::string(st.message()) == "sliding_window blocks -3 < 0");
  st = sc::make_device_union(sc::device_block_table{}, sc::device_sink{2}, sc::device_sliding_window{-4}).validate();
  CHECK(st.code() == status_code::invalid_argument);
  CHECK(std::string(st.message()) == "union part 1: union part 1: sliding_window blocks -4 < 0");
  st = sc::make_device_union(sc::device_block_table{.width = -1}, sc::device_sink{2}).validate();
  CHECK(std::string(st.message()) == "union part 0: block_table width -1 < 0");
  CHECK(sc::make_device_union(sc::device_causal_all{}, sc::device_sink{}).validate().ok());

  // A shared row per query block is laid out for the problem's index heads, alone or in a union.
  const sc::device_head_shared<sc::device_block_table> shared{.index_heads = 4};
  CHECK(sc::check_index_heads(shared, 4).ok());
  CHECK(sc::check_index_heads(sc::device_sink{1}, 4).ok());
  st = sc::check_index_heads(sc::make_device_union(sc::device_sink{1}, shared), 2);
  CHECK(st.code() == status_code::shape_mismatch);
  CHECK(std::string(st.message()) == "head_shared index_heads 4, the problem has 2 index heads");
}
