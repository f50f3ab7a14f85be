// A sequence appended in groups (a captured launch's arguments, its arrays' buffers), each
// group contiguous, kept in chunks that never move: appending never copies what is there.
// A capture appends ~10^4 groups of ~20; one vector doubling under it copied and faulted in
// megabytes inside the recording (the first capture's capture_launch ran at ~4x the later
// ones' cost). Chunks double from kFirst elements to kLargest; those of 2 MiB and more are
// 2 MiB-aligned and advised as huge pages (Linux): the first capture's fresh memory then
// faults in a page per 2 MiB, not per 4 KiB.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <vector>

namespace vkad::runtime {

namespace detail {
// Storage for `bytes`, huge-page backed where the OS lends them and the chunk is that large.
// Throws std::bad_alloc (as a vector would).
void* chunk_alloc(size_t bytes);
void chunk_free(void* p) noexcept;
}  // namespace detail

template <typename T>
class ChunkedVector {
  static_assert(std::is_trivially_copyable_v<T>, "chunks are filled with memcpy");

 public:
  static constexpr uint32_t kOffsetBits = 20;
  static constexpr size_t kFirst = 2048;                        // elements of the first chunk
  static constexpr size_t kLargest = size_t{1} << kOffsetBits;  // of any later one

  ChunkedVector() = default;
  ChunkedVector(ChunkedVector&&) noexcept = default;
  ChunkedVector& operator=(ChunkedVector&&) noexcept = default;

  // Appends `items` contiguously and returns the index of the first (at(index) reads them).
  // A group wider than kLargest elements is refused with std::length_error (no kernel has a
  // million parameters).
  uint32_t append(std::span<const T> items) {
    if (items.size() > kLargest) throw std::length_error("ChunkedVector: group too large");
    if (chunks_.empty() || used_ + items.size() > chunks_.back().capacity) grow(items.size());
    Chunk& c = chunks_.back();
    const uint32_t index = static_cast<uint32_t>(((chunks_.size() - 1) << kOffsetBits) | used_);
    if (!items.empty()) std::memcpy(c.data.get() + used_, items.data(), items.size_bytes());
    used_ += items.size();
    count_ += items.size();
    return index;
  }
  T* at(uint32_t index) { return chunks_[index >> kOffsetBits].data.get() + offset(index); }
  const T* at(uint32_t index) const {
    return chunks_[index >> kOffsetBits].data.get() + offset(index);
  }
  size_t count() const { return count_; }  // elements appended

 private:
  struct Free {
    void operator()(T* p) const noexcept { detail::chunk_free(p); }
  };
  struct Chunk {
    std::unique_ptr<T[], Free> data;
    size_t capacity = 0;
  };
  static uint32_t offset(uint32_t index) { return index & ((1u << kOffsetBits) - 1); }
  void grow(size_t at_least) {
    size_t capacity = chunks_.empty() ? kFirst : std::min(chunks_.back().capacity * 2, kLargest);
    capacity = std::max(capacity, at_least);
    if (chunks_.size() >= (size_t{1} << (32 - kOffsetBits))) {
      throw std::length_error("ChunkedVector: too many chunks");
    }
    // T may be a pointer (a launch's buffers): its size is the element's, as meant.
    const size_t bytes = capacity * sizeof(T);  // NOLINT(bugprone-sizeof-expression)
    chunks_.push_back(
        {std::unique_ptr<T[], Free>(static_cast<T*>(detail::chunk_alloc(bytes))), capacity});
    used_ = 0;
  }

  std::vector<Chunk> chunks_;
  size_t used_ = 0;  // of the last chunk
  size_t count_ = 0;
};

}  // namespace vkad::runtime
