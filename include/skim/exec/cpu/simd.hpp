#pragma once
// skim::exec::simd<Arch> — the vectorised CPU executor, on xsimd (avx2, avx512f, neon64, or any
// xsimd arch the translation unit is compiled for: simd<xsimd::default_arch> always works).
//
// It computes what exec::scalar computes, with the same interface, checks and statuses, plus work
// items for threads. A *unit* is (sequence, query block, index head): with one index per kv head the
// whole GQA group's query heads, so each K/V tile is read and converted to float once per group.
//
// Prefill units (more than decode_max_queries queries), per selected tile:
//   K tile → float, transposed (Kᵀ [head_dim, keys]); V tile → float rows; then per block of
//   mr rows: S = (scale·Q)·Kᵀ by a register-blocked FMA microkernel (mr rows × nv registers of keys,
//   no reduction), online softmax with xsimd::exp (masking = a shorter row, only on partial tiles),
//   U = α·U + P·V by a second microkernel (mr rows × nv registers of head_dim).
// Decode units (at most decode_max_queries queries, e.g. one query per sequence): K tile → float
//   rows, S by dot products (a block of rows × keys filling one register, reduced by xsimd::haddp).
//   A unit whose row may hold more than chunk_blocks() blocks is split into chunks of chunk_blocks()
//   consecutive selected ids. Each chunk is a work item writing a partial (m, l, u) to the shared
//   workspace; the item that finishes a unit's last chunk merges the partials by LSE in chunk order
//   and writes O. The split depends on the problem only (never on threads), so O and LSE are
//   bit-identical for any thread count and any assignment of items to threads.
//   Decode reads each selected byte once, and two rules decide how fast (bench/executors.cpp,
//   docs/performance.md, CPU decode):
//   - Fused kv heads. With a head-invariant index (index::head_invariant_v: causal_all, sink,
//     sliding_window and unions of them) every kv head of a decode query block reads the same ids,
//     and the items of index head 0 run each chunk for all kv heads, block by block (kv head 0's
//     tile, then kv head 1's, ...): a token-major [tokens, heads_kv, head_dim] cache is then read
//     whole, once, instead of every head's item pulling in lines of the others' halves. The
//     other heads' items are empty; numbering, partials and workspace stay per head (problem-only).
//     Per-head selections (block_table, block_csr, dense_block_mask) keep per-head items: there a
//     head-major [heads_kv, tokens, head_dim] cache is the layout that reads whole lines.
//   - Next-tile prefetch. Each decode tile asks for the next selected tile's K and V rows (of its
//     kv head) while it computes, one row per key it passes, into L2; V's rows in parts, each pass
//     of P·V over the keys its own columns, so that the requests come at an even rate.
//   Small blocks: a decode tile runs selected ids of its chunk together, consecutive or not, as many
//   blocks as its keys hold (kernels::decode_group_blocks: 4 blocks of 4 keys, 2 of 8; blocks of 9
//   keys or more one at a time), so that a tile's fixed work (softmax, the rescale of the output
//   rows) is paid per group. Groups follow from the ids alone: any index giving the same ids gives
//   the same bits.
//
// K/V: fp32, fp16, bf16 (widened in registers: F16C/AVX-512/NEON conversions where compiled, exact
// bit arithmetic otherwise), and int8 or fp8 e4m3 codes with a scale per (block, kv head)
// (core/quantized.hpp; fp8 widened by exact bit arithmetic): the prefill path folds the scale into
// the float tile, the decode path into S and P.
//
// Threads: item_count(p) items; run_items(args, ws, first, last, slot) runs some of them with slot's
// scratch, after prepare(args, ws) (checks + resets the merge counters). run(args, ws) runs all
// items on the calling thread; run(args, ws, threads) uses parallel_for. Workspace:
// workspace_bytes(p, slots) = shared partials + slots × per-thread tiles. run never allocates
// (run(args, ws, threads > 1) spawns std::threads, which do: see core/parallel.hpp).

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include <xsimd/xsimd.hpp>

#include "skim/concepts/block_index.hpp"
#include "skim/concepts/executor.hpp"
#include "skim/config.hpp"
#include "skim/core/attention_args.hpp"
#include "skim/core/dtypes.hpp"
#include "skim/core/parallel.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/softmax_state.hpp"
#include "skim/core/status.hpp"
#include "skim/core/views.hpp"
#include "skim/core/workspace.hpp"
#include "skim/exec/cpu/simd_kernels.hpp"
#include "skim/exec/cpu/simd_ops.hpp"
#include "skim/index/causal_all.hpp"
#include "skim/index/head_invariant.hpp"

namespace skim::exec {

namespace detail {

// A decode unit's selected ids in ascending order, gathered into groups of `most` blocks (the last
// one fewer), consecutive or not; each group goes to run(group, next) once the group after it is
// complete (an empty one after the last), so a tile can prefetch the next one. A group holds rising
// ids only (then the keys a query sees are a prefix of its tile's): an id that does not rise, from
// an index out of canonical order run unchecked (run_items), starts a new group.
template <class Run>
struct block_groups {
  // The blocks of one group: ids[0, count).
  struct group {
    static constexpr std::int32_t capacity = 16;
    std::int32_t ids[capacity] = {};
    std::int32_t count = 0;
    [[nodiscard]] std::span<const std::int32_t> span() const noexcept {
      return {ids, static_cast<std::size_t>(count)};
    }
  };
  // A tile holds at most floats_per_line keys (kernels::decode_group_blocks), so as many blocks.
  static_assert(workspace_alignment / sizeof(float) <= group::capacity);

  std::int32_t most = 1;  // 1 to group::capacity: kernels::decode_group_blocks(p)
  Run run;
  group current{}, next{};

  void add(std::int32_t id) {
    if (next.count == most || (next.count > 0 && id <= next.ids[next.count - 1])) {
      if (current.count > 0) run(current.span(), next.span());
      current = next;
      next.count = 0;
    }
    next.ids[next.count++] = id;
  }
  void flush() {
    if (current.count > 0) run(current.span(), next.span());
    if (next.count > 0) run(next.span(), std::span<const std::int32_t>{});
    current.count = next.count = 0;
  }
};
template <class Run>
block_groups(std::int32_t, Run) -> block_groups<Run>;

}  // namespace detail

template <class Arch>
struct simd {
  static_assert(Arch::supported(),
                "skim::exec::simd<Arch>: Arch is not enabled in this translation unit; compile it with the "
                "arch's flags (avx2: -mavx2 -mfma; avx512f: -mavx512f -mavx512dq; neon64: an aarch64 target) "
                "or use xsimd::default_arch");

  using kernels = simd_detail::kernels<Arch>;

  // Keys per decode chunk (rounded down to whole blocks, at least one block). A property of the
  // problem, never of the thread count. 2048 keys: a chunk's K+V at fp16, d = 128 is 1 MiB.
  std::int32_t decode_chunk_keys = 2048;
  // Units whose query block holds at most this many queries take the decode path.
  std::int32_t decode_max_queries = 4;

  [[nodiscard]] std::int32_t chunk_blocks(const problem& p) const noexcept {
    const std::int32_t n = p.block_kv > 0 ? decode_chunk_keys / p.block_kv : 1;
    return n > 0 ? n : 1;
  }

  // Scratch for `slots` concurrent runners of items (run_items' slot < slots).
  [[nodiscard]] std::size_t workspace_bytes(const problem& p, std::int32_t slots = 1) const noexcept {
    if (!shape_ok(p)) return 0;  // run() rejects this problem before touching the workspace
    const layout l = measure(p);
    return l.shared + static_cast<std::size_t>(slots < 1 ? 1 : slots) * l.per_slot;
  }

  [[nodiscard]] status can_implement(const problem& p) const noexcept { return validate(p); }

  // Work items: one per prefill unit, one per chunk of a decode unit. Problem-only.
  [[nodiscard]] std::int64_t item_count(const problem& p) const noexcept {
    if (!shape_ok(p) || !validate(p).ok()) return 0;
    std::int64_t n = 0;
    for_each_unit(p, [&](const unit& u) { n += u.chunks; return false; });
    return n;
  }

  // Checks everything run() checks and resets the decode merge counters.
  // @post run_items may run any items, in any order and on any threads, each item exactly once.
  template <element TQ, kv_source KV, block_index Index, element TO>
  [[nodiscard]] status prepare(const attention_args<TQ, KV, Index, TO>& a, std::span<std::byte> workspace,
                               std::int32_t slots = 1) const noexcept {
    SKIM_TRY(check_args(a));
    SKIM_TRY(a.index.validate(a.prob));
    SKIM_TRY(check_workspace(workspace, workspace_bytes(a.prob, slots)));
    const layout l = measure(a.prob);
    workspace_arena arena(workspace);
    const shared_area sh = carve_shared(a.prob, l, arena);
    for (std::int32_t& c : sh.counters) c = 0;
    return status::success();
  }

  // Runs items [first, last) with the scratch of `slot`.
  // @pre prepare(a, workspace, slots) succeeded with slot < slots, and no item runs twice.
  template <element TQ, kv_source KV, block_index Index, element TO>
  [[nodiscard]] status run_items(const attention_args<TQ, KV, Index, TO>& a, std::span<std::byte> workspace,
                                 std::int64_t first, std::int64_t last, std::int32_t slot = 0) const noexcept {
    const problem& p = a.prob;
    const layout l = measure(p);
    if (workspace.size() < l.shared + static_cast<std::size_t>(slot + 1) * l.per_slot) {
      return status::error(status_code::workspace_too_small, "workspace has %zu bytes, slot %d needs %zu",
                           workspace.size(), slot, l.shared + static_cast<std::size_t>(slot + 1) * l.per_slot);
    }
    workspace_arena arena(workspace);
    const shared_area sh = carve_shared(p, l, arena);
    workspace_arena slot_arena(workspace.subspan(l.shared + static_cast<std::size_t>(slot) * l.per_slot, l.per_slot));
    const typename kernels::tiles t = kernels::tiles::carve(p, max_unit_rows(p), slot_arena);
    const KV kv = a.kv.bind(p);
    status result;
    for_each_unit(p, [&](const unit& u) {
      if (u.first_item >= last) return true;  // stop the walk
      const bool fused = fuses_heads<Index>(p, u);
      if (fused && u.row.head != 0) return false;  // index head 0's items run every head; these are empty
      for (std::int32_t c = 0; c < u.chunks; ++c) {
        const std::int64_t item = u.first_item + c * u.item_stride;
        if (item < first || item >= last) continue;
        result = fused ? run_fused_chunk(a, kv, t, sh, u, c) : run_chunk(a, kv, t, sh, u, c);
        if (!result.ok()) return true;
      }
      return false;
    });
    return result;
  }

  template <element TQ, kv_source KV, block_index Index, element TO>
  [[nodiscard]] status run(const attention_args<TQ, KV, Index, TO>& a, std::span<std::byte> workspace) const noexcept {
    SKIM_TRY(prepare(a, workspace));
    return run_items(a, workspace, 0, item_count(a.prob), 0);
  }

  // @pre workspace.size() >= workspace_bytes(a.prob, threads)
  template <element TQ, kv_source KV, block_index Index, element TO>
  [[nodiscard]] status run(const attention_args<TQ, KV, Index, TO>& a, std::span<std::byte> workspace,
                           std::int32_t threads) const noexcept {
    threads = threads < 1 ? 1 : (threads > max_parallel_threads ? max_parallel_threads : threads);
    SKIM_TRY(prepare(a, workspace, threads));
    // Items go out in grains of consecutive items, 8 per thread: run_items walks the units from the
    // start (O(units) per call), and 8 grains per thread still balance causal prefill's uneven units.
    const std::int64_t items = item_count(a.prob);
    const std::int64_t grains = items < 8 * threads ? items : 8 * threads;
    status results[max_parallel_threads];
    parallel_for(grains, threads, [&](std::int32_t slot, std::int64_t g, std::int64_t) {
      if (!results[slot].ok()) return;
      results[slot] = run_items(a, workspace, g * items / grains, (g + 1) * items / grains, slot);
    });
    for (std::int32_t s = 0; s < threads; ++s) SKIM_TRY(results[s]);
    return status::success();
  }

 private:
  struct layout {
    std::size_t shared = 0;    // bytes of the shared area (decode partials, counters)
    std::size_t per_slot = 0;  // bytes of one slot's tiles (a multiple of workspace_alignment)
    std::int64_t partial_rows = 0;  // Σ over split units of chunks × unit rows
    std::int64_t split_units = 0;
  };

  struct shared_area {
    std::span<softmax_state> states;  // [partial_rows]
    std::span<float> u;               // [partial_rows, dim_stride]
    std::span<std::int32_t> counters; // [split_units] chunks finished
  };

  // One unit and where its items and partials live.
  struct unit {
    row_info row;
    std::int32_t first_head = 0;
    std::int32_t heads = 0;
    std::int32_t rows = 0;            // heads × queries
    bool decode = false;
    std::int32_t chunks = 1;          // > 1 only for a split decode unit
    std::int64_t first_item = 0;      // item of chunk 0; chunk c is first_item + c · item_stride
    std::int64_t item_stride = 1;
    std::int64_t split_index = -1;    // counter of a split unit
    std::int64_t partial_first = 0;   // first partial row of a split unit (chunk-major)
  };

  [[nodiscard]] static bool shape_ok(const problem& p) noexcept {
    return p.heads_q > 0 && p.heads_kv > 0 && p.heads_q % p.heads_kv == 0 && p.head_dim > 0 && p.block_q > 0 &&
           p.block_kv > 0;
  }

  [[nodiscard]] static std::int32_t heads_per_unit(const problem& p) noexcept {
    return p.scope == index_scope::kv_head ? p.group_size() : 1;
  }

  // Rows of one kv group in a fused unit: padded to whole blocks of mr rows, so that no block of
  // the tile kernels mixes two groups (each group reads its own kv head).
  [[nodiscard]] static std::int32_t group_rows(const problem& p, std::int32_t queries) noexcept {
    const std::int32_t r = p.group_size() * queries;
    return (r + kernels::mr - 1) / kernels::mr * kernels::mr;
  }

  // A unit's rows in the tiles: heads × queries, or heads_kv groups of group_rows for a fused unit.
  [[nodiscard]] std::int32_t max_unit_rows(const problem& p) const noexcept {
    const std::int32_t per_head = heads_per_unit(p) * p.block_q;
    std::int32_t q = p.block_q < decode_max_queries ? p.block_q : decode_max_queries;
    q = q < 0 ? 0 : q;
    const std::int32_t fused = p.heads_kv * group_rows(p, q);
    return per_head > fused ? per_head : fused;
  }

  // Whether the decode unit u runs fused: every index head of its query block reads the same ids
  // (a head-invariant index), so one item runs the block's tiles for every kv head, each block id
  // for kv head 0, 1, ... in turn: the rows of a token-major cache are then read whole, once. Per
  // kv head, half of each line pair the hardware fetches (its prefetchers take neighbouring lines)
  // would belong to the other head and be fetched again by its item.
  template <class Index>
  [[nodiscard]] static bool fuses_heads(const problem& p, const unit& u) noexcept {
    return index::head_invariant_v<Index> && u.decode && p.index_heads() > 1;
  }

  // Calls f(unit) for every unit in order until f returns true.
  template <class F>
  void for_each_unit(const problem& p, F&& f) const noexcept {
    std::int64_t row_base = 0, item = 0, split = 0, partial = 0;
    const std::int32_t cb = chunk_blocks(p);
    for (std::int32_t b = 0; b < p.batch(); ++b) {
      const std::int32_t nqb = p.q_blocks(b);
      for (std::int32_t i = 0; i < nqb; ++i) {
        // The units of a query block share its geometry, hence their chunk count; their items are
        // numbered chunk-major (chunk c of every head, then chunk c + 1), so that items run in
        // order read neighbouring K/V rows of token-major caches together.
        const std::int64_t block_first = item;
        std::int32_t block_chunks = 1;
        for (std::int32_t ih = 0; ih < p.index_heads(); ++ih) {
          unit u;
          u.row = make_row_info(p, row_base, b, i, ih);
          u.heads = heads_per_unit(p);
          u.first_head = p.scope == index_scope::kv_head ? ih * p.group_size() : ih;
          const std::int32_t queries = u.row.q_end - u.row.q_begin;
          u.rows = u.heads * queries;
          u.decode = queries <= decode_max_queries;
          u.first_item = block_first + ih;
          u.item_stride = p.index_heads();
          if (u.decode && u.row.visible_blocks > cb) {
            u.chunks = (u.row.visible_blocks + cb - 1) / cb;
            u.split_index = split++;
            u.partial_first = partial;
            partial += static_cast<std::int64_t>(u.chunks) * u.rows;
          }
          block_chunks = u.chunks;
          if (f(u)) return;
        }
        item = block_first + static_cast<std::int64_t>(block_chunks) * p.index_heads();
      }
      row_base += nqb;
    }
  }

  [[nodiscard]] layout measure(const problem& p) const noexcept {
    layout l;
    for_each_unit(p, [&](const unit& u) {
      if (u.chunks > 1) {
        l.partial_rows += static_cast<std::int64_t>(u.chunks) * u.rows;
        ++l.split_units;
      }
      return false;
    });
    workspace_arena shared;
    (void)carve_shared(p, l, shared);
    l.shared = align_up(shared.bytes(), workspace_alignment);
    workspace_arena tiles;
    (void)kernels::tiles::carve(p, max_unit_rows(p), tiles);
    l.per_slot = align_up(tiles.bytes(), workspace_alignment);
    return l;
  }

  [[nodiscard]] static shared_area carve_shared(const problem& p, const layout& l, workspace_arena& arena) noexcept {
    shared_area s;
    const std::size_t ds = kernels::dim_stride(p);
    s.states = arena.take<softmax_state>(static_cast<std::size_t>(l.partial_rows));
    s.u = arena.take<float>(static_cast<std::size_t>(l.partial_rows) * ds);
    s.counters = arena.take<std::int32_t>(static_cast<std::size_t>(l.split_units));
    return s;
  }

  // Calls f(id) for each selected id of chunk `chunk` of unit u. Ids are checked against the row
  // (ascending, visible) as they are walked (for_each_block_id), so a bad index costs a status;
  // explicit rows (block_table, block_csr) and id ranges start at the chunk's first id, others walk
  // from the row's start.
  template <class Index, class F>
  [[nodiscard]] status for_each_id(const Index& index, const problem& p, const unit& u, std::int32_t chunk,
                                   F&& f) const noexcept {
    const std::int64_t cb = chunk_blocks(p);
    const std::int64_t pos_first = u.chunks > 1 ? chunk * cb : 0;
    const std::int64_t pos_last = u.chunks > 1 ? pos_first + cb : INT64_MAX;
    std::int64_t pos = pos_first;
    return for_each_block_id(
        index, u.row,
        [&](std::int32_t id) {
          f(id);
          return ++pos < pos_last;
        },
        pos_first);
  }

  // Copies rows [0, rows) of t (state and U) to the shared partials from row `base` on.
  static void publish(const problem& p, const typename kernels::tiles& t, const shared_area& sh, std::int64_t base,
                      std::int32_t rows) noexcept {
    const std::size_t ds = kernels::dim_stride(p);
    for (std::int32_t r = 0; r < rows; ++r) {
      sh.states[static_cast<std::size_t>(base + r)] = t.state[static_cast<std::size_t>(r)];
      kernels::copy(t.u.data() + static_cast<std::size_t>(r) * ds, sh.u.data() + static_cast<std::size_t>(base + r) * ds,
                    p.head_dim);
    }
  }

  // Counts a finished chunk of split unit u; true for the last one (which then merges).
  [[nodiscard]] static bool last_to_finish(const shared_area& sh, const unit& u) noexcept {
    std::atomic_ref<std::int32_t> done(sh.counters[static_cast<std::size_t>(u.split_index)]);
    if (done.fetch_add(1, std::memory_order_acq_rel) + 1 != u.chunks) return false;
    done.store(0, std::memory_order_relaxed);  // ready for the next run without prepare()
    return true;
  }

  // Item `chunk` of unit u.
  template <class Args, class KV>
  [[nodiscard]] status run_chunk(const Args& a, const KV& kv, const typename kernels::tiles& t, const shared_area& sh,
                                 const unit& u, std::int32_t chunk) const noexcept {
    const problem& p = a.prob;
    const std::int32_t queries = u.row.q_end - u.row.q_begin;
    const std::int64_t q_first = static_cast<std::int64_t>(p.cu_seqlens_q[u.row.seq]) + u.row.q_begin;
    const std::int32_t kv_head = u.first_head / p.group_size();
    kernels::load_q(a.q, t, p, q_first, u.first_head, u.heads, queries);
    // Decode runs a tile behind the cursor, so that each tile knows the next one (to prefetch it),
    // and runs small blocks a group to a tile (block_groups).
    const auto run_tile = [&](std::span<const std::int32_t> ids, std::span<const std::int32_t> next) {
      kernels::tile(kv, t, p, u.row, kv_head, ids, u.rows, queries, true, next);
    };
    detail::block_groups groups{kernels::decode_group_blocks(p), run_tile};
    SKIM_TRY(for_each_id(a.index, p, u, chunk, [&](std::int32_t id) {
      if (!u.decode) {
        kernels::tile(kv, t, p, u.row, kv_head, {&id, 1}, u.rows, queries, false);
        return;
      }
      groups.add(id);
    }));
    groups.flush();

    if (u.chunks == 1) {
      kernels::finish(a.o, a.lse, t, p, q_first, u.first_head, u.heads, queries);
      return status::success();
    }
    // A split unit: publish this chunk's partial, and merge if it was the last one to finish.
    publish(p, t, sh, u.partial_first + static_cast<std::int64_t>(chunk) * u.rows, u.rows);
    if (!last_to_finish(sh, u)) return status::success();
    const std::size_t ds = kernels::dim_stride(p);
    kernels::merge_partials(sh.states.data() + u.partial_first, sh.u.data() + static_cast<std::size_t>(u.partial_first) * ds,
                            u.chunks, u.rows, t, p);
    kernels::finish(a.o, a.lse, t, p, q_first, u.first_head, u.heads, queries);
    return status::success();
  }

  // Item `chunk` of a fused query block: u is its index head 0's unit, whose items (and those of
  // the block's other index heads, left empty) keep the per-head numbering and partials layout.
  // Kv group g keeps rows [g · group_rows, g · group_rows + group · queries) of the tiles; index
  // head ih's rows are a contiguous part of its group's (all of them with one index per kv head).
  template <class Args, class KV>
  [[nodiscard]] status run_fused_chunk(const Args& a, const KV& kv, const typename kernels::tiles& t,
                                       const shared_area& sh, const unit& u, std::int32_t chunk) const noexcept {
    const problem& p = a.prob;
    const std::int32_t queries = u.row.q_end - u.row.q_begin;
    const std::int64_t q_first = static_cast<std::int64_t>(p.cu_seqlens_q[u.row.seq]) + u.row.q_begin;
    const std::int32_t group = p.group_size();
    const std::int32_t gr = group_rows(p, queries);
    for (std::int32_t g = 0; g < p.heads_kv; ++g) {
      kernels::load_q(a.q, t.rows_from(g * gr), p, q_first, g * group, group, queries);
    }
    // Block by block (small blocks a group to a tile), kv head 0, 1, ... in turn (one tile behind
    // the cursor, as in run_chunk).
    const auto run_tiles = [&](std::span<const std::int32_t> ids, std::span<const std::int32_t> next) {
      for (std::int32_t g = 0; g < p.heads_kv; ++g) {
        kernels::tile(kv, t.rows_from(g * gr), p, u.row, g, ids, group * queries, queries, true, next);
      }
    };
    detail::block_groups groups{kernels::decode_group_blocks(p), run_tiles};
    SKIM_TRY(for_each_id(a.index, p, u, chunk, [&](std::int32_t id) { groups.add(id); }));
    groups.flush();

    const auto finish_all = [&] {
      for (std::int32_t g = 0; g < p.heads_kv; ++g) {
        kernels::finish(a.o, a.lse, t.rows_from(g * gr), p, q_first, g * group, group, queries);
      }
    };
    if (u.chunks == 1) {
      finish_all();
      return status::success();
    }
    // Index head ih (heads [ih · u.heads, ...)) publishes into its own unit's partials.
    const auto rows_of = [&](std::int32_t ih) {
      const std::int32_t h = ih * u.heads;
      return (h / group) * gr + (h % group) * queries;
    };
    const auto partials_of = [&](std::int32_t ih) {
      return u.partial_first + static_cast<std::int64_t>(ih) * u.chunks * u.rows;
    };
    for (std::int32_t ih = 0; ih < p.index_heads(); ++ih) {
      publish(p, t.rows_from(rows_of(ih)), sh, partials_of(ih) + static_cast<std::int64_t>(chunk) * u.rows, u.rows);
    }
    if (!last_to_finish(sh, u)) return status::success();
    const std::size_t ds = kernels::dim_stride(p);
    for (std::int32_t ih = 0; ih < p.index_heads(); ++ih) {
      kernels::merge_partials(sh.states.data() + partials_of(ih), sh.u.data() + static_cast<std::size_t>(partials_of(ih)) * ds,
                              u.chunks, u.rows, t.rows_from(rows_of(ih)), p);
    }
    finish_all();
    return status::success();
  }
};

static_assert(executor<simd<xsimd::default_arch>, attention_args<float, contiguous_kv<float>, index::causal_all, float>>);
static_assert(executor<simd<xsimd::default_arch>, attention_args<bfloat16, paged_kv<half>, index::causal_all, half>>);

}  // namespace skim::exec
