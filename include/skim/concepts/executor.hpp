#pragma once
// The executor concept: exact attention over the tiles an index selects.
//
// Every executor computes the same function (docs/design.md §3): for each query token and query head h,
// softmax attention over the keys of the row's blocks (the row of index head problem::index_head_of(h)),
// intersected with the causal mask and the sequence; o = 0 and lse = -inf for a query that sees no key.
// skim::exec::reference is the oracle that defines it.
//
// An executor E, for an arguments type Args (an attention_args<...>), provides:
//  1. e.workspace_bytes(problem) -> std::size_t: scratch bytes run() needs for any args of this
//     problem. It depends on the problem's shape only (never on data) and never fails: for a problem
//     that validate() rejects it may return anything, and run() then reports the problem.
//  2. e.can_implement(problem) -> status: ok iff run() accepts every valid args of this problem
//     (an executor may support only some head dims or block sizes); otherwise says which value it lacks.
//  3. e.run(args, workspace) noexcept -> status: computes O (and LSE if args.lse is not empty).
//     It checks args (check_args), the index and the workspace (check_workspace: aligned to
//     workspace_alignment, at least workspace_bytes(args.prob)) before reading anything, and reports
//     bad input as a status, never by crashing, reading out of bounds or writing past O and LSE.
//  4. run() does not allocate (executor tests count operator new calls during run), and is
//     deterministic: the same inputs give bit-identical O and LSE, whatever the workspace held before.
//  5. Executors are cheap copyable values; options, if any, are public members.
// (reference is the exception to 4's first half: as the oracle it allocates, for simplicity.)

#include <concepts>
#include <cstddef>
#include <span>

#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"

namespace skim {

template <class E, class Args>
concept executor = std::copyable<E> &&
    requires(const E& e, const problem& p, const Args& args, std::span<std::byte> workspace) {
      { e.workspace_bytes(p) } -> std::same_as<std::size_t>;
      { e.can_implement(p) } -> std::same_as<status>;
      { e.run(args, workspace) } -> std::same_as<status>;
      requires noexcept(e.run(args, workspace));
    };

}  // namespace skim
