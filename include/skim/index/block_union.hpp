#pragma once
// block_union<A, B, ...>: the set union of several indices (local ∪ sink ∪ dynamic), merged on the
// fly and never materialised.
//
// The cursor is a lazy k-way merge of the parts' cursors: id() is the smallest current id of the
// parts; next() advances every part past it, so an id held by two parts comes out once and no tile
// is counted twice in a softmax. With k parts a step costs O(k); k is small (2..4) and fixed at
// compile time, so the merge is a few compares in registers.
//
// Output is strictly ascending whatever the parts hold: a part that repeats or goes back is
// skipped forward, so even an invalid part cannot make the union yield a duplicate (validate
// still reports it). The merge reads nothing beyond what the parts' cursors read.

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "skim/concepts/block_index.hpp"
#include "skim/core/problem.hpp"
#include "skim/core/status.hpp"
#include "skim/index/sink.hpp"
#include "skim/index/sliding_window.hpp"

namespace skim::index {

template <block_cursor... Cursors>
class union_cursor {
 public:
  static_assert(sizeof...(Cursors) > 0, "a union needs at least one part");

  constexpr union_cursor() noexcept = default;
  constexpr explicit union_cursor(Cursors... parts) noexcept : parts_(std::move(parts)...) { settle(); }

  [[nodiscard]] constexpr bool done() const noexcept { return done_; }
  [[nodiscard]] constexpr std::int32_t id() const noexcept { return id_; }
  constexpr void next() noexcept {
    // Drop the current id from every part that holds it (and anything a broken part holds below it).
    std::apply([this](auto&... c) { (skip_through(c, id_), ...); }, parts_);
    settle();
  }

 private:
  template <class C>
  static constexpr void skip_through(C& c, std::int32_t id) noexcept {
    while (!c.done() && static_cast<std::int32_t>(c.id()) <= id) c.next();
  }

  // @post id_ = the smallest current id of the parts; done_ iff every part is done.
  constexpr void settle() noexcept {
    done_ = true;
    std::apply([this](const auto&... c) { (this->consider(c), ...); }, parts_);
  }

  template <class C>
  constexpr void consider(const C& c) noexcept {
    if (c.done()) return;
    const auto id = static_cast<std::int32_t>(c.id());
    if (done_ || id < id_) {
      id_ = id;
      done_ = false;
    }
  }

  std::tuple<Cursors...> parts_{};
  std::int32_t id_ = 0;
  bool done_ = true;
};

template <block_index... Parts>
struct block_union {
  static_assert(sizeof...(Parts) > 0, "a union needs at least one part");

  std::tuple<Parts...> parts;

  [[nodiscard]] constexpr auto cursor(const row_info& r) const noexcept {
    return std::apply(
        [&r](const auto&... p) { return union_cursor<decltype(p.cursor(r))...>(p.cursor(r)...); }, parts);
  }

  // ok iff every part validates; the first failure is returned, prefixed with the part's position
  // ("union part 1: block id 9 >= ...").
  [[nodiscard]] status validate(const problem& p) const noexcept {
    return validate_from<0>(p);
  }

 private:
  template <std::size_t I>
  [[nodiscard]] status validate_from(const problem& p) const noexcept {
    if constexpr (I == sizeof...(Parts)) {
      return status::success();
    } else {
      const status s = std::get<I>(parts).validate(p);
      if (!s.ok()) return status::error(s.code(), "union part %zu: %s", I, s.message());
      return validate_from<I + 1>(p);
    }
  }
};

static_assert(block_index<block_union<sink, sliding_window>>);

// The union of the given indices, copied into the union (the stored forms are views: cheap).
template <class... Parts>
  requires(block_index<std::remove_cvref_t<Parts>> && ...)
[[nodiscard]] constexpr block_union<std::remove_cvref_t<Parts>...> make_union(Parts&&... parts) {
  return {std::tuple<std::remove_cvref_t<Parts>...>(std::forward<Parts>(parts)...)};
}

}  // namespace skim::index
