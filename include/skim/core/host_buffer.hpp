#pragma once
// host_buffer<T>: an owning, aligned host array for the memory a decode step reads every token: the
// K/V cache, the block summaries, the workspaces. Built outside hot paths (once per plan), freed on
// destruction; moves, never copies.
//
// Huge pages. From huge_page_bytes (2 MiB) on, the array starts on a 2 MiB boundary and, on Linux,
// is advised into transparent huge pages (madvise MADV_HUGEPAGE) before anything touches it. Decode
// reads its blocks scattered over tens of megabytes: with 4 KiB pages nearly every block needs a page
// walk, and on a default kernel (THP "madvise") only advised memory gets 2 MiB pages. On a 2-vCPU
// AMD EPYC Zen 4 at N = 32768, over huge pages, dense decode ran in about 0.8x its time and the
// skim::defaults decode step in 0.85x (docs/performance.md, "CPU: huge pages"). Where the kernel
// has no transparent huge pages, or the advice fails, the array is an ordinary one: the advice is a
// hint, never an error.
//
// The elements are value-initialised (zeros for arithmetic types) or copies of `value`.

#include <algorithm>
#include <cstddef>
#include <memory>
#include <new>
#include <span>
#include <type_traits>
#include <utility>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace skim {

inline constexpr std::size_t huge_page_bytes = std::size_t{2} << 20;  // x86-64 and aarch64 (4 KiB base pages)

template <class T>
class host_buffer {
  static_assert(std::is_nothrow_destructible_v<T> && std::is_nothrow_copy_constructible_v<T>);

 public:
  // Alignment of the first element below huge_page_bytes: a cache line and an AVX-512 register.
  static constexpr std::size_t alignment = std::max<std::size_t>(64, alignof(T));

  host_buffer() noexcept = default;
  explicit host_buffer(std::size_t n) : host_buffer(n, T{}) {}
  host_buffer(std::size_t n, const T& value) {
    if (n == 0) return;
    data_ = static_cast<T*>(allocate(n * sizeof(T)));
    size_ = n;
    std::uninitialized_fill_n(data_, n, value);
  }
  host_buffer(host_buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  host_buffer& operator=(host_buffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  host_buffer(const host_buffer&) = delete;
  host_buffer& operator=(const host_buffer&) = delete;
  ~host_buffer() { release(); }

  [[nodiscard]] T* data() noexcept { return data_; }
  [[nodiscard]] const T* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  [[nodiscard]] T& operator[](std::size_t i) noexcept { return data_[i]; }
  [[nodiscard]] const T& operator[](std::size_t i) const noexcept { return data_[i]; }
  [[nodiscard]] T* begin() noexcept { return data_; }
  [[nodiscard]] T* end() noexcept { return data_ + size_; }
  [[nodiscard]] const T* begin() const noexcept { return data_; }
  [[nodiscard]] const T* end() const noexcept { return data_ + size_; }
  [[nodiscard]] std::span<T> span() noexcept { return {data_, size_}; }
  [[nodiscard]] std::span<const T> span() const noexcept { return {data_, size_}; }

 private:
  // The alignment of an array of `bytes` bytes: 2 MiB from huge_page_bytes on.
  [[nodiscard]] static constexpr std::size_t alignment_for(std::size_t bytes) noexcept {
    return bytes >= huge_page_bytes ? std::max(alignment, huge_page_bytes) : alignment;
  }
  // Uninitialised storage (bytes > 0), advised into huge pages when large; throws std::bad_alloc as
  // operator new does.
  [[nodiscard]] static void* allocate(std::size_t bytes) {
    const std::size_t align = alignment_for(bytes);
    void* p = ::operator new(bytes, std::align_val_t{align});
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (align >= huge_page_bytes) (void)::madvise(p, bytes, MADV_HUGEPAGE);  // a hint: failure keeps 4 KiB pages
#endif
    return p;
  }
  void release() noexcept {
    if (data_ == nullptr) return;
    std::destroy_n(data_, size_);
    ::operator delete(data_, std::align_val_t{alignment_for(size_ * sizeof(T))});
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace skim
