#pragma once
// Building block summaries, for any summarizer and any K source (contiguous or paged; fp32, fp16,
// bf16): build() over a whole K cache (prefill), append() of one new key (decode), and
// append_newest() of every sequence's newest key (a batch decode step).
//
// Layout of the summaries, one record of S::record_floats(head_dim) floats per (key block, kv head),
// meant to sit next to an engine's KV cache:
//
//   std::span<float> records;  // [total_kv_blocks, heads_kv, record_floats]
//
// where block j of sequence b is global block kv_block_offset(b) + j, kv_block_offset(b) being
// Σ_{s<b} kv_blocks(s); record (block g, head h) starts at (g * heads_kv + h) * record_floats.
// summary_layout computes these numbers from a problem. A sequence's records are contiguous
// ([kv_blocks(b), heads_kv, record_floats] from sequence_offset(b)), so a decode engine may just as
// well keep one span per sequence with room for its future blocks and hand that span to append().
//
// The entry points add keys through the same per-key step — init at slot 0, append, complete_block
// after the block's last slot — so a cache summarised by build() and the same cache summarised
// token by token with append() or append_newest() hold the same bits.
//
// No allocation: the only scratch is S::workspace_floats(head_dim) floats (multi_centroid's Lloyd
// step; 0 for the others), carved from the caller's workspace of workspace_bytes<S>(p) bytes
// (skim/core/workspace.hpp: aligned to workspace_alignment; an empty span is fine when 0).

#include <cstddef>
#include <cstdint>
#include <span>

#include "skim/concepts/summarizer.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"
#include "skim/core/views.hpp"
#include "skim/core/workspace.hpp"

namespace skim::summarize {

// Offsets and sizes of a batch's records (see the layout above).
struct summary_layout {
  std::int32_t heads_kv = 0;
  std::int32_t head_dim = 0;
  std::int32_t block_kv = 0;
  std::int64_t record_floats = 0;                 // floats per (block, kv head) record
  std::int64_t total_kv_blocks = 0;               // Σ_b kv_blocks(b)
  std::span<const std::int32_t> cu_seqlens_kv{};  // [batch + 1], the problem's (not copied)

  // Floats of one block's records, all kv heads.
  [[nodiscard]] constexpr std::int64_t block_floats() const noexcept { return heads_kv * record_floats; }
  // Floats of the whole batch: the size the records span needs.
  [[nodiscard]] constexpr std::int64_t floats() const noexcept { return total_kv_blocks * block_floats(); }
  // The key-block geometry of the problem (problem's own formulas, so the two cannot disagree).
  [[nodiscard]] constexpr problem keys() const noexcept {
    problem p;
    p.block_kv = block_kv;
    p.cu_seqlens_q = cu_seqlens_kv;  // only the batch size is read from it
    p.cu_seqlens_kv = cu_seqlens_kv;
    return p;
  }
  // Blocks of sequence b (the last may be partial).
  [[nodiscard]] constexpr std::int32_t kv_blocks(std::int32_t b) const noexcept { return keys().kv_blocks(b); }
  // First global block of sequence b: Σ_{s<b} kv_blocks(s). O(b).
  [[nodiscard]] constexpr std::int64_t kv_block_offset(std::int32_t b) const noexcept {
    return keys().kv_block_offset(b);
  }
  // Start of record (global block g, kv head h), in floats.
  [[nodiscard]] constexpr std::int64_t record_offset(std::int64_t g, std::int32_t h) const noexcept {
    return (g * heads_kv + h) * record_floats;
  }
  // Start and size of sequence b's records, in floats.
  [[nodiscard]] constexpr std::int64_t sequence_offset(std::int32_t b) const noexcept {
    return kv_block_offset(b) * block_floats();
  }
  [[nodiscard]] constexpr std::int64_t sequence_floats(std::int32_t b) const noexcept {
    return kv_blocks(b) * block_floats();
  }
};

// @pre validate(p) is ok (the layout of an invalid problem is meaningless).
template <summarizer S>
[[nodiscard]] constexpr summary_layout make_summary_layout(const problem& p) noexcept {
  summary_layout l;
  l.heads_kv = p.heads_kv;
  l.head_dim = p.head_dim;
  l.block_kv = p.block_kv;
  l.record_floats = S::record_floats(p.head_dim);
  l.cu_seqlens_kv = p.cu_seqlens_kv;
  l.total_kv_blocks = p.total_kv_blocks();
  return l;
}

namespace detail {

// Rows of one block of one kv head, for S::complete_block.
template <class Kv>
struct block_rows {
  const Kv* kv = nullptr;
  std::int32_t seq = 0;
  std::int32_t first = 0;  // token position of slot 0
  std::int32_t head = 0;
  [[nodiscard]] SKIM_FORCEINLINE const typename Kv::value_type* operator()(std::int32_t slot) const noexcept {
    return kv->k_row(seq, first + slot, head);
  }
};

template <summarizer S>
[[nodiscard]] std::span<float> take_scratch(workspace_arena& arena, std::int32_t head_dim) noexcept {
  const std::int64_t n = head_dim > 0 ? S::workspace_floats(head_dim) : 0;
  return arena.take<float>(static_cast<std::size_t>(n));
}

// The one per-key step both entry points share: key t of sequence b, kv head h, into `record`
// (the record of block t / block_kv). @pre keys [t - t % block_kv, t) of the block are in the record.
template <summarizer S, class Kv>
SKIM_FORCEINLINE void add_key(float* record, const Kv& kv, std::int32_t b, std::int32_t t, std::int32_t h,
                              std::int32_t block_kv, std::int32_t head_dim, float* scratch) noexcept {
  const std::int32_t slot = t % block_kv;
  if (slot == 0) S::init(record, head_dim);
  S::append(record, kv.k_row(b, t, h), slot, block_kv, head_dim);
  if (slot == block_kv - 1) {
    S::complete_block(record, block_rows<Kv>{&kv, b, t - slot, h}, block_kv, head_dim, scratch);
  }
}

// Key t of sequence b, every kv head, into the records of its block: block_records is
// [heads_kv, record_floats].
template <summarizer S, class Kv>
void add_key_all_heads(float* block_records, const Kv& kv, std::int32_t b, std::int32_t t, const problem& p,
                       float* scratch) noexcept {
  const std::int64_t rf = S::record_floats(p.head_dim);
  for (std::int32_t h = 0; h < p.heads_kv; ++h) {
    add_key<S>(block_records + h * rf, kv, b, t, h, p.block_kv, p.head_dim, scratch);
  }
}

}  // namespace detail

// Bytes of workspace build() and append() need (0 unless S has a completion step).
template <summarizer S>
[[nodiscard]] std::size_t workspace_bytes(const problem& p) noexcept {
  workspace_arena measure;
  (void)detail::take_scratch<S>(measure, p.head_dim);
  return measure.bytes();
}

// Summarises every key block of every sequence and kv head of K into records.
// records: [total_kv_blocks, heads_kv, record_floats] (make_summary_layout<S>(p).floats() floats or
// more; floats past that are left alone). Only K is read; V is validated with K but never touched.
template <summarizer S, kv_source Kv>
[[nodiscard]] status build(const problem& p, const Kv& kv, std::span<float> records,
                           std::span<std::byte> workspace) noexcept {
  SKIM_TRY(validate(p));
  SKIM_TRY(kv.validate(p));
  const summary_layout l = make_summary_layout<S>(p);
  if (records.size() < static_cast<std::size_t>(l.floats())) {
    return status::error(status_code::shape_mismatch,
                         "records has %zu floats, needs %lld (%lld kv blocks x %d kv heads x %lld floats)",
                         records.size(), static_cast<long long>(l.floats()), static_cast<long long>(l.total_kv_blocks),
                         l.heads_kv, static_cast<long long>(l.record_floats));
  }
  SKIM_TRY(check_workspace(workspace, workspace_bytes<S>(p)));
  workspace_arena arena(workspace);
  float* scratch = detail::take_scratch<S>(arena, p.head_dim).data();
  const Kv bound = kv.bind(p);
  std::int64_t first_block = 0;
  for (std::int32_t b = 0; b < p.batch(); ++b) {
    const std::int32_t n = p.seq_len_kv(b);
    for (std::int32_t t = 0; t < n; ++t) {
      const std::int64_t g = first_block + t / p.block_kv;
      for (std::int32_t h = 0; h < p.heads_kv; ++h) {
        detail::add_key<S>(records.data() + l.record_offset(g, h), bound, b, t, h, p.block_kv, p.head_dim, scratch);
      }
    }
    first_block += p.kv_blocks(b);
  }
  return status::success();
}

// Where a decode step's new key goes.
struct append_site {
  std::int32_t seq = 0;        // sequence b of the problem
  std::int32_t position = 0;   // the new key's token position within sequence b, < seq_len_kv(b)
  std::span<float> records{};  // [>= position / block_kv + 1, heads_kv, record_floats]: sequence b's
                               // records, i.e. the batch layout from sequence_offset(b), or the
                               // engine's own per-sequence span
};

// Decode: adds key `position` of sequence `seq` (read from kv, every kv head) to that sequence's
// records. O(head_dim * heads_kv) per call, plus S's completion step when the key ends its block
// (which rereads that block's keys from kv). Keys of a sequence must be appended in position
// order, starting at 0 or right after a build() of the shorter prefix; the record of a new block
// is initialised by its slot-0 key. Checks p and kv (O(batch + pages) for a paged source); a
// decode step over a whole batch is cheaper with append_newest().
template <summarizer S, kv_source Kv>
[[nodiscard]] status append(const problem& p, const Kv& kv, const append_site& site,
                            std::span<std::byte> workspace) noexcept {
  SKIM_TRY(validate(p));
  SKIM_TRY(kv.validate(p));
  if (site.seq < 0 || site.seq >= p.batch()) {
    return status::error(status_code::invalid_argument, "append sequence %d out of [0, %d)", site.seq, p.batch());
  }
  const std::int32_t n = p.seq_len_kv(site.seq);
  if (site.position < 0 || site.position >= n) {
    return status::error(status_code::invalid_argument, "append position %d out of [0, %d) keys of sequence %d",
                         site.position, n, site.seq);
  }
  const std::int32_t block = site.position / p.block_kv;
  const std::int64_t rf = S::record_floats(p.head_dim);
  const std::int64_t needed = (static_cast<std::int64_t>(block) + 1) * p.heads_kv * rf;
  if (site.records.size() < static_cast<std::size_t>(needed)) {
    return status::error(status_code::shape_mismatch,
                         "records of sequence %d has %zu floats, needs %lld for key %d in block %d (%d blocks x %d "
                         "kv heads x %lld floats)",
                         site.seq, site.records.size(), static_cast<long long>(needed), site.position, block,
                         block + 1, p.heads_kv, static_cast<long long>(rf));
  }
  SKIM_TRY(check_workspace(workspace, workspace_bytes<S>(p)));
  workspace_arena arena(workspace);
  float* scratch = detail::take_scratch<S>(arena, p.head_dim).data();
  detail::add_key_all_heads<S>(site.records.data() + static_cast<std::int64_t>(block) * p.heads_kv * rf, kv.bind(p), site.seq, site.position,
                               p, scratch);
  return status::success();
}

// Decode step of a whole batch: for every sequence b with keys, adds its newest key (position
// seq_len_kv(b) - 1) to seq_records[b]; empty sequences are skipped. Same result as append() per
// sequence, but p and kv are checked once for the batch instead of once per sequence.
// seq_records: [batch] spans, each as append_site::records for its sequence.
template <summarizer S, kv_source Kv>
[[nodiscard]] status append_newest(const problem& p, const Kv& kv, std::span<const std::span<float>> seq_records,
                                   std::span<std::byte> workspace) noexcept {
  SKIM_TRY(validate(p));
  SKIM_TRY(kv.validate(p));
  if (seq_records.size() != static_cast<std::size_t>(p.batch())) {
    return status::error(status_code::shape_mismatch, "seq_records has %zu spans, expected batch = %d",
                         seq_records.size(), p.batch());
  }
  const std::int64_t rf = S::record_floats(p.head_dim);
  for (std::int32_t b = 0; b < p.batch(); ++b) {
    const std::int32_t n = p.seq_len_kv(b);
    if (n == 0) continue;
    const std::int32_t block = (n - 1) / p.block_kv;
    const std::int64_t needed = (static_cast<std::int64_t>(block) + 1) * p.heads_kv * rf;
    if (seq_records[b].size() < static_cast<std::size_t>(needed)) {
      return status::error(status_code::shape_mismatch,
                           "records of sequence %d has %zu floats, needs %lld for key %d in block %d (%d blocks x "
                           "%d kv heads x %lld floats)",
                           b, seq_records[b].size(), static_cast<long long>(needed), n - 1, block, block + 1,
                           p.heads_kv, static_cast<long long>(rf));
    }
  }
  SKIM_TRY(check_workspace(workspace, workspace_bytes<S>(p)));
  workspace_arena arena(workspace);
  float* scratch = detail::take_scratch<S>(arena, p.head_dim).data();
  const Kv bound = kv.bind(p);
  for (std::int32_t b = 0; b < p.batch(); ++b) {
    const std::int32_t t = p.seq_len_kv(b) - 1;
    if (t < 0) continue;
    detail::add_key_all_heads<S>(seq_records[b].data() + static_cast<std::int64_t>(t / p.block_kv) * p.heads_kv * rf, bound, b, t, p, scratch);
  }
  return status::success();
}

}  // namespace skim::summarize
