#include "base/chunked_vector.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace vkad::runtime::detail {

namespace {
constexpr size_t kHugePage = size_t{2} << 20;
}  // namespace

void* chunk_alloc(size_t bytes) {
#if defined(__linux__)
  if (bytes >= kHugePage) {
    const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    void* p = std::aligned_alloc(kHugePage, rounded);
    if (p == nullptr) throw std::bad_alloc();
    // Advice only: where transparent huge pages are off it is refused, and nothing changes.
    (void)madvise(p, rounded, MADV_HUGEPAGE);
    return p;
  }
#endif
  void* p = std::malloc(bytes == 0 ? 1 : bytes);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void chunk_free(void* p) noexcept { std::free(p); }

}  // namespace vkad::runtime::detail
