#include "rhi/sub_allocator.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace vkad::rhi {
namespace {

TEST(SubAllocator, RespectsAlignment) {
  SubAllocator a(1024);
  auto x = a.allocate(3, 1);
  auto y = a.allocate(16, 64);
  ASSERT_TRUE(x && y);
  EXPECT_EQ(*x, 0u);
  EXPECT_EQ(*y % 64, 0u);
  EXPECT_GE(*y, 3u);
}

TEST(SubAllocator, ExhaustionFailsWithoutChangingState) {
  SubAllocator a(256);
  ASSERT_TRUE(a.allocate(200, 4));
  uint64_t used = a.bytes_used();
  EXPECT_FALSE(a.allocate(100, 4).has_value());
  EXPECT_EQ(a.bytes_used(), used);
  EXPECT_EQ(a.allocation_count(), 1u);
}

TEST(SubAllocator, FreeReusesAndCoalesces) {
  SubAllocator a(300);
  auto p = a.allocate(100, 1), q = a.allocate(100, 1), r = a.allocate(100, 1);
  ASSERT_TRUE(p && q && r);
  EXPECT_FALSE(a.allocate(1, 1));
  EXPECT_TRUE(a.free(*q));
  EXPECT_FALSE(a.free(*q)) << "double free must be refused";
  EXPECT_EQ(a.largest_free_range(), 100u);
  EXPECT_TRUE(a.free(*p));
  EXPECT_EQ(a.largest_free_range(), 200u) << "p and q merge";
  EXPECT_EQ(a.free_range_count(), 1u);
  auto big = a.allocate(200, 1);
  ASSERT_TRUE(big);
  EXPECT_EQ(*big, 0u);
  EXPECT_TRUE(a.free(*big));
  EXPECT_TRUE(a.free(*r));
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(a.largest_free_range(), 300u);
}

TEST(SubAllocator, FragmentationBlocksLargeRequestUntilNeighboursFree) {
  SubAllocator a(1000);
  std::vector<uint64_t> offs;
  for (int i = 0; i < 10; ++i) offs.push_back(*a.allocate(100, 1));
  for (int i = 0; i < 10; i += 2) a.free(offs[i]);  // free every other: 5 holes of 100
  EXPECT_EQ(a.bytes_used(), 500u);
  EXPECT_FALSE(a.allocate(150, 1)) << "500 bytes free, but no hole of 150";
  a.free(offs[1]);  // joins holes 0,1,2 -> 300
  EXPECT_TRUE(a.allocate(150, 1));
}

TEST(SubAllocator, BestFitPicksSmallestHole) {
  SubAllocator a(1000);
  auto x = a.allocate(300, 1), s1 = a.allocate(10, 1), y = a.allocate(50, 1),
       s2 = a.allocate(10, 1);
  ASSERT_TRUE(x && s1 && y && s2);
  a.free(*x);
  a.free(*y);
  auto z = a.allocate(40, 1);
  EXPECT_EQ(*z, *y) << "the 50-byte hole fits best";
}

TEST(SubAllocator, RandomisedAccountingStaysConsistent) {
  std::mt19937 rng(1234);
  SubAllocator a(1 << 20);
  std::vector<uint64_t> live;
  for (int step = 0; step < 5000; ++step) {
    if (live.empty() || rng() % 3 != 0) {
      uint64_t size = 1 + rng() % 4096;
      uint64_t align = 1ull << (rng() % 9);
      if (auto off = a.allocate(size, align)) {
        EXPECT_EQ(*off % align, 0u);
        live.push_back(*off);
      }
    } else {
      size_t i = rng() % live.size();
      EXPECT_TRUE(a.free(live[i]));
      live[i] = live.back();
      live.pop_back();
    }
    ASSERT_EQ(a.allocation_count(), live.size());
    ASSERT_LE(a.bytes_used(), a.capacity());
  }
  for (uint64_t off : live) a.free(off);
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(a.bytes_used(), 0u);
  EXPECT_EQ(a.largest_free_range(), a.capacity());
}

}  // namespace
}  // namespace vkad::rhi
