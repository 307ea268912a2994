#pragma once
// head_invariant_v<Index>: true when every index head of a query block reads the same block ids,
// i.e. the index's cursor depends on the row's query block (its geometry, or its row divided by the
// index heads) and never on row_info::head.
//
// Executors use it to read K/V once per token row instead of once per kv head: exec::simd<Arch>
// runs a decode query block's kv heads in one work item when its index is head-invariant, so every
// cache line of a token-major [tokens, heads_kv, head_dim] cache that the hardware fetches is used
// (see exec/cpu/simd.hpp).
//
// True for the implicit rules (causal_all, sink, sliding_window: computed from the row's geometry),
// for head_shared (one stored row per query block) and for a block_union of head-invariant parts.
// False by default, hence for the stored forms (block_table, block_csr, dense_block_mask), whose
// rows may differ per head even when a given index's do not. An engine's own index that ignores the
// head may specialise head_invariant:
//   template <> struct skim::index::head_invariant<my_index> : std::true_type {};

#include <type_traits>

#include "skim/index/block_union.hpp"
#include "skim/index/causal_all.hpp"
#include "skim/index/head_shared.hpp"
#include "skim/index/sink.hpp"
#include "skim/index/sliding_window.hpp"

namespace skim::index {

template <class Index>
struct head_invariant : std::false_type {};

template <> struct head_invariant<causal_all> : std::true_type {};
template <> struct head_invariant<sink> : std::true_type {};
template <> struct head_invariant<sliding_window> : std::true_type {};
template <class Index>
struct head_invariant<head_shared<Index>> : std::true_type {};
template <class... Parts>
struct head_invariant<block_union<Parts...>> : std::bool_constant<(head_invariant<Parts>::value && ...)> {};

template <class Index>
inline constexpr bool head_invariant_v = head_invariant<std::remove_cvref_t<Index>>::value;

static_assert(head_invariant_v<block_union<sink, sliding_window>>);

}  // namespace skim::index
