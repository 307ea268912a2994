#pragma once
// probe_max<N>: N evenly spaced keys of the block kept as they are ("probes");
// score = max over the probes present of q·probe. A needle (one key with a huge q·k) sitting at a
// probe slot is seen at full strength wherever it is in the block, which no pooled summary does.
// Cost: N·head_dim floats per record and N dot products per score.
//
// Probe slots: probe j (0 <= j < N) is the key at slot floor(j * block_kv / N). Probe 0 is always
// slot 0, so every non-empty block — a ragged last block of one key included — has a probe.
// A block of len keys (len <= block_kv) holds the probes j with floor(j * block_kv / N) < len,
// i.e. the first min(N, ceil(len * N / block_kv)) of them; appending slot s stores exactly the
// probes whose slot is s, so a record built key by key and one built from a whole block agree.
// With N > block_kv several probes share a slot and hold the same key (harmless, only wasteful).
//
// Record [N * head_dim + 1] floats: probes [N, head_dim] in fp32 (fp16/bf16 keys convert
// exactly), then the count of probes present.

#include <cstdint>

#include "skim/concepts/summarizer.hpp"
#include "skim/detail/dot.hpp"

namespace skim::summarize {

template <std::int32_t N>
struct probe_max {
  static_assert(N >= 1, "probe_max needs at least one probe per block");
  static constexpr std::int32_t probes = N;

  // Slot of probe j in a block of block_kv keys.
  [[nodiscard]] static constexpr std::int32_t probe_slot(std::int32_t j, std::int32_t block_kv) noexcept {
    return static_cast<std::int32_t>(static_cast<std::int64_t>(j) * block_kv / N);
  }

  [[nodiscard]] static constexpr std::int64_t record_floats(std::int32_t head_dim) noexcept {
    return static_cast<std::int64_t>(N) * head_dim + 1;
  }
  [[nodiscard]] static constexpr std::int64_t workspace_floats(std::int32_t) noexcept { return 0; }

  static void init(float* record, std::int32_t head_dim) noexcept {
    const std::int64_t n = record_floats(head_dim);
    for (std::int64_t i = 0; i < n; ++i) record[i] = 0.0f;
  }

  template <element T>
  static void append(float* SKIM_RESTRICT record, const T* SKIM_RESTRICT key, std::int32_t slot,
                     std::int32_t block_kv, std::int32_t head_dim) noexcept {
    // First probe whose slot is >= slot: j = ceil(slot * N / block_kv).
    std::int32_t j = static_cast<std::int32_t>((static_cast<std::int64_t>(slot) * N + block_kv - 1) / block_kv);
    for (; j < N && probe_slot(j, block_kv) == slot; ++j) {
      float* probe = record + static_cast<std::int64_t>(j) * head_dim;
      for (std::int32_t i = 0; i < head_dim; ++i) probe[i] = to_float(key[i]);
      record[static_cast<std::int64_t>(N) * head_dim] = static_cast<float>(j + 1);
    }
  }

  template <class Keys>
  static void complete_block(float*, const Keys&, std::int32_t, std::int32_t, float*) noexcept {}

  [[nodiscard]] static float score(const float* record, const float* q, std::int32_t head_dim) noexcept {
    const float count = record[static_cast<std::int64_t>(N) * head_dim];
    // Clamped so that a damaged record cannot make score read past its N probes.
    const std::int32_t present = count >= 0.0f && count <= static_cast<float>(N) ? static_cast<std::int32_t>(count) : N;
    float best = detail::neg_inf;
    for (std::int32_t j = 0; j < present; ++j) {
      const float s = detail::dot(q, record + static_cast<std::int64_t>(j) * head_dim, head_dim);
      best = s > best ? s : best;
    }
    return best;
  }
};
static_assert(summarizer<probe_max<4>>);

}  // namespace skim::summarize
