#pragma once
// Workspace carving: typed, aligned spans cut out of the caller's std::span<std::byte>.
//
// Executors never allocate in run(). They describe their scratch memory once, as a sequence of
// take<T>(n) calls, and use the same sequence twice:
//  - on a measuring arena (default-constructed) inside workspace_bytes(), which only adds up sizes;
//  - on an arena over the caller's span inside run(), after check_workspace() accepted the span.
// Because both passes run the same code, the size reported and the size carved cannot drift apart.
//
// Every span starts at a multiple of workspace_alignment from the start of the workspace, and the
// workspace itself must be aligned to workspace_alignment, so every span is aligned in memory.

#include <cstddef>
#include <cstdint>
#include <span>

#include "skim/core/host_buffer.hpp"
#include "skim/core/status.hpp"

namespace skim {

// 64 bytes: one cache line and one AVX-512 register; tiles never share a line.
inline constexpr std::size_t workspace_alignment = 64;

[[nodiscard]] constexpr std::size_t align_up(std::size_t n, std::size_t alignment) noexcept {
  return (n + alignment - 1) / alignment * alignment;
}

// Checks a caller's workspace against what workspace_bytes() reported.
// An empty requirement accepts any span (even a null one).
[[nodiscard]] inline status check_workspace(std::span<std::byte> workspace, std::size_t required) noexcept {
  if (required == 0) return status::success();
  if (reinterpret_cast<std::uintptr_t>(workspace.data()) % workspace_alignment != 0) {
    return status::error(status_code::misaligned, "workspace %p is not aligned to %zu bytes",
                         static_cast<const void*>(workspace.data()), workspace_alignment);
  }
  if (workspace.size() < required) {
    return status::error(status_code::workspace_too_small, "workspace has %zu bytes, needs %zu",
                         workspace.size(), required);
  }
  return status::success();
}

class workspace_arena {
 public:
  // A measuring arena: take() returns empty spans and only counts bytes.
  constexpr workspace_arena() noexcept = default;
  // A carving arena over `workspace`. @pre check_workspace(workspace, bytes of the same takes) is ok.
  explicit constexpr workspace_arena(std::span<std::byte> workspace) noexcept
      : base_(workspace.data()), capacity_(workspace.size()), carving_(true) {}

  // The next n elements of T, aligned to workspace_alignment. On a measuring arena, or if the
  // workspace is exhausted (a broken precondition), returns an empty span and keeps counting.
  template <class T>
  [[nodiscard]] std::span<T> take(std::size_t n) noexcept {
    static_assert(alignof(T) <= workspace_alignment, "workspace elements are aligned to workspace_alignment");
    const std::size_t first = align_up(used_, workspace_alignment);
    used_ = first + n * sizeof(T);
    if (!carving_ || used_ > capacity_) return {};
    return {reinterpret_cast<T*>(base_ + first), n};
  }

  // Bytes taken so far, alignment padding included (what workspace_bytes() reports).
  [[nodiscard]] constexpr std::size_t bytes() const noexcept { return used_; }

 private:
  std::byte* base_ = nullptr;
  std::size_t capacity_ = 0;
  std::size_t used_ = 0;
  bool carving_ = false;
};

// An owning, aligned workspace for callers that do not manage their own scratch memory.
// It allocates once, when built (never inside an executor's run), and frees on destruction; it is a
// zeroed host_buffer of bytes (core/host_buffer.hpp), so from 2 MiB on it asks for huge pages:
//   skim::workspace_buffer ws(exec.workspace_bytes(p));   // outside the hot path
//   SKIM_TRY(exec.run(args, ws.span()));                   // as often as needed
class workspace_buffer {
 public:
  static_assert(host_buffer<std::byte>::alignment % workspace_alignment == 0);

  workspace_buffer() noexcept = default;
  explicit workspace_buffer(std::size_t bytes) : bytes_(bytes) {}

  [[nodiscard]] std::span<std::byte> span() const noexcept { return bytes_.span(); }
  [[nodiscard]] std::size_t size() const noexcept { return bytes_.size(); }

 private:
  mutable host_buffer<std::byte> bytes_;  // scratch: written through a const buffer's span(), as before
};

}  // namespace skim
