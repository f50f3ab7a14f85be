// CompileCache is documented thread-safe: its counters are read by one thread while others
// compile. ThreadSanitizer (scripts/ci-extra.sh runs CompileCacheThreads.* in its TSan build)
// flags an unsynchronised read of a counter the compiling threads write.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "ir/text.h"
#include "spirv/compiler.h"

namespace vkad::codegen {
namespace {

// Small so that many compiles fit in a TSan run; the local size makes each kernel distinct.
Kernel small_kernel(uint32_t local_size) {
  auto k = parse(R"(kernel scale(x: ndarray<f32, 1>) {
  task main parallel %0 in [0, shape(x, 0)) {
    %1 = load x[%0] : f32
    %2 = add %1, %1 : f32
    store x[%0], %2
  }
})");
  EXPECT_TRUE(k.ok()) << k.status().to_string();
  Kernel out = k.ok() ? *k : Kernel{};
  if (!out.tasks.empty()) out.tasks[0].local_size = local_size;
  return out;
}

TEST(CompileCacheThreads, CountersReadWhileOtherThreadsCompile) {
  CompileCache cache;
  constexpr int kThreads = 3, kCallsPerThread = 8, kDistinct = 4;
  std::atomic<bool> done{false};
  std::atomic<int> failures{0};
  // The reader polls the counters for as long as the compilers run; the counts only grow.
  std::thread reader([&] {
    uint64_t last = 0;
    while (!done.load()) {
      uint64_t seen = cache.hits() + cache.misses();
      if (seen < last) failures.fetch_add(1);
      last = seen;
      (void)cache.size();
    }
  });
  std::vector<std::thread> compilers;
  for (int t = 0; t < kThreads; ++t) {
    compilers.emplace_back([&, t] {
      for (int i = 0; i < kCallsPerThread; ++i) {
        auto r = cache.compile(small_kernel(16u << ((t + i) % kDistinct)), Target::host());
        if (!r.ok()) failures.fetch_add(1);
      }
    });
  }
  for (std::thread& c : compilers) c.join();
  done = true;
  reader.join();
  EXPECT_EQ(failures.load(), 0);
  // Every call is counted once, as a hit or a miss (two threads missing on the same key both
  // compile and both count a miss), and every distinct kernel missed at least once.
  EXPECT_EQ(cache.hits() + cache.misses(), uint64_t{kThreads * kCallsPerThread});
  EXPECT_GE(cache.misses(), uint64_t{kDistinct});
  EXPECT_EQ(cache.size(), size_t{kDistinct});
}

}  // namespace
}  // namespace vkad::codegen
