// runtime/launch_plan.h on the host: ranges, workgroups, adstack rows and heap needs, tiers and
// the loop-pass check, with expectations from the documented rules (not from the code).
#include "runtime/launch_plan.h"

#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "runtime/host_ring.h"

namespace vkad::runtime {
namespace {

using abi::CompiledKernel;
using abi::CompiledTask;
using abi::DType;
using abi::ParamKind;
using abi::RangeBound;
using adstack::SizeExpr;

// Params: n (i32 scalar), x (f32 ndarray rank 2).
CompiledKernel kernel_with(std::vector<CompiledTask> tasks) {
  CompiledKernel k;
  k.name = "k";
  k.params = {{"n", ParamKind::kScalar, DType::kI32, 0, false},
              {"x", ParamKind::kNdArray, DType::kF32, 2, true}};
  k.tasks = std::move(tasks);
  return k;
}

CompiledTask task(RangeBound b, RangeBound e, uint32_t local_size = 64) {
  CompiledTask t;
  t.name = "t";
  t.begin = b;
  t.end = e;
  t.local_size = local_size;
  return t;
}

struct Fixture {
  std::vector<uint32_t> shape = {300, 7};
  LaunchInputs in(int64_t n) {
    LaunchInputs i;
    i.ints = {n, 0};
    i.shapes = {nullptr, &shape};
    return i;
  }
};

TierChoice always_heap(uint32_t, const adstack::RowLayout&, PrivateLengths*) {
  return TierChoice::kHeap;
}

TEST(LaunchPlan, RangesAndWorkgroups) {
  Fixture f;
  CompiledKernel k = kernel_with({task(RangeBound::constant(5), RangeBound::scalar(0)),
                                  task(RangeBound::constant(0), RangeBound::array_dim(1, 0)),
                                  task(RangeBound::constant(0), RangeBound::array_dim(1, 1))});
  k.tasks[2].serial = true;
  LaunchLimits lim;
  lim.max_groups = 3;
  auto p = plan_launch(k, f.in(1000), lim, always_heap);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->tasks[0].begin, 5u);
  EXPECT_EQ(p->tasks[0].end, 1000u);
  EXPECT_EQ(p->tasks[0].groups, 3u);  // ceil(995 / 64) = 16, capped at max_groups
  EXPECT_EQ(p->tasks[1].end, 300u);
  EXPECT_EQ(p->tasks[1].groups, 3u);  // ceil(300 / 64) = 5 -> 3
  EXPECT_EQ(p->tasks[2].end, 7u);
  EXPECT_EQ(p->tasks[2].groups, 1u);  // serial
  lim.max_groups = 100;
  p = plan_launch(k, f.in(1000), lim, always_heap);
  EXPECT_EQ(p->tasks[0].groups, 16u);
  EXPECT_EQ(p->tasks[1].groups, 5u);
  // An empty range still dispatches one group (it does nothing); an end below begin is empty.
  p = plan_launch(k, f.in(2), lim, always_heap);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->tasks[0].begin, 5u);
  EXPECT_EQ(p->tasks[0].end, 5u);
  EXPECT_EQ(p->tasks[0].groups, 1u);
  EXPECT_FALSE(p->any_heap_task);
}

TEST(LaunchPlan, BadRangesNameKernelAndTask) {
  Fixture f;
  CompiledKernel k = kernel_with({task(RangeBound::scalar(0), RangeBound::constant(10))});
  auto p = plan_launch(k, f.in(-4), {}, always_heap);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("launch of 'k' task 't': range [-4, 10)"), std::string::npos)
      << p.status().message();
}

TEST(LaunchPlan, NdRangeIsTheProductOfItsExtents) {
  Fixture f;
  CompiledTask t = task(RangeBound::constant(0), RangeBound::constant(1));
  t.dim_begin = {SizeExpr::constant(1), SizeExpr::constant(0)};
  t.dim_end = {SizeExpr::array_dim(1, 0), SizeExpr::scalar(0)};
  CompiledKernel k = kernel_with({t});
  auto p = plan_launch(k, f.in(9), {}, always_heap);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->tasks[0].begin, 0u);
  EXPECT_EQ(p->tasks[0].end, 299u * 9u);
  auto bad = plan_launch(k, f.in(int64_t{1} << 32), {}, always_heap);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("dimension 1"), std::string::npos)
      << bad.status().message();
}

TEST(LaunchPlan, HeapRowsLowerWorkgroupsToFitOneBindingAndSumNeeds) {
  Fixture f;
  CompiledTask t = task(RangeBound::constant(0), RangeBound::scalar(0), 64);
  t.adstacks = {{"s", adstack::Heap::kF32, SizeExpr::constant(1000), true}};
  CompiledKernel k = kernel_with({t});
  LaunchLimits lim;
  lim.max_groups = 1 << 20;
  lim.max_storage_buffer_range = 64ull << 20;  // 64 MiB
  auto p = plan_launch(k, f.in(1 << 20), lim, always_heap);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  const adstack::RowLayout& row = p->tasks[0].row;
  const uint64_t row_bytes = uint64_t{row.row_elems[0]} * 4;
  ASSERT_GT(row_bytes, 4000u);  // at least the capacity's primal slots
  // Threads are capped at range / row_bytes, rounded down to whole groups.
  const uint64_t max_threads = lim.max_storage_buffer_range / row_bytes;
  EXPECT_EQ(p->tasks[0].groups, max_threads / 64);
  EXPECT_TRUE(p->any_heap_task);
  EXPECT_EQ(p->heap_need[0],
            adstack::heap_bytes(row, adstack::Heap::kF32, p->tasks[0].groups * 64ull));
  EXPECT_LE(p->heap_need[0], lim.max_storage_buffer_range);
  EXPECT_EQ(p->tier_counts[0], 1u);
  // A row no binding can hold even for one group is out of device memory, named.
  lim.max_storage_buffer_range = 1000;
  auto oom = plan_launch(k, f.in(100), lim, always_heap);
  ASSERT_FALSE(oom.ok());
  EXPECT_EQ(oom.status().code(), ErrorCode::kOutOfDeviceMemory);
  EXPECT_NE(oom.status().message().find("'k' task 't'"), std::string::npos);
}

TEST(LaunchPlan, PrivateTierNeedsNoHeap) {
  Fixture f;
  CompiledTask t = task(RangeBound::constant(0), RangeBound::scalar(0));
  t.adstacks = {{"s", adstack::Heap::kF32, SizeExpr::scalar(0), true}};
  CompiledKernel k = kernel_with({t});
  auto choose = [](uint32_t, const adstack::RowLayout&, PrivateLengths* len) {
    (*len)[0] = 64;
    return TierChoice::kPrivate;
  };
  auto p = plan_launch(k, f.in(10), {}, choose);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->tasks[0].private_tier());
  EXPECT_EQ(p->tasks[0].private_len[0], 64u);
  EXPECT_FALSE(p->any_heap_task);
  EXPECT_EQ(p->heap_need[0], 0u);
  EXPECT_EQ(p->tier_counts[1], 1u);
}

TEST(LaunchPlan, TierRule) {
  adstack::RowLayout row;
  row.row_elems = {40, 0, 0};  // 40 f32 slots: private length 64 (power of two >= 32)
  PrivateLengths len{};
  // A module without the private tier, or the heap policy: heaps.
  EXPECT_EQ(choose_tier(false, false, false, 4096, 16384, 32, row, &len), TierChoice::kHeap);
  EXPECT_EQ(choose_tier(true, true, false, 4096, 16384, 32, row, &len), TierChoice::kHeap);
  // Automatic within the budget: private, lengths powers of two >= the minimum.
  EXPECT_EQ(choose_tier(true, false, false, 4096, 16384, 32, row, &len), TierChoice::kPrivate);
  EXPECT_EQ(len[0], 64u);
  // Automatic past the budget: heaps. Forced private past the budget but within the hard limit:
  // private; past the hard limit: fallback to the heaps.
  EXPECT_EQ(choose_tier(true, false, false, 128, 16384, 32, row, &len), TierChoice::kHeap);
  EXPECT_EQ(choose_tier(true, false, true, 128, 16384, 32, row, &len), TierChoice::kPrivate);
  EXPECT_EQ(choose_tier(true, false, true, 128, 128, 32, row, &len), TierChoice::kFallback);
}

TEST(LaunchPlan, LoopPassLimitRefusesWithTheCount) {
  Fixture f;
  CompiledTask t = task(RangeBound::constant(0), RangeBound::scalar(0), 64);
  t.loop_passes = SizeExpr::constant(100);  // 100 passes per iteration
  CompiledKernel k = kernel_with({t});
  LaunchLimits lim;
  lim.device_name = "llvmpipe";
  lim.max_groups = 1;  // 64 threads
  lim.max_loop_passes = 65535;
  // 64 * 600 iterations: 600 grid-stride iterations x 101 passes + 1 = 60,601 <= 65,535.
  EXPECT_TRUE(plan_launch(k, f.in(64 * 600), lim, always_heap).ok());
  // 700 iterations per thread: 70,701 passes.
  auto p = plan_launch(k, f.in(64 * 700), lim, always_heap);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(p.status().message().find("70701"), std::string::npos) << p.status().message();
  EXPECT_NE(p.status().message().find("'llvmpipe'"), std::string::npos);
  lim.enforce_loop_limit = false;
  EXPECT_TRUE(plan_launch(k, f.in(64 * 700), lim, always_heap).ok());
}

}  // namespace
}  // namespace vkad::runtime

#include "runtime/adstack_heaps.h"

namespace vkad::runtime {
namespace {

TEST(AdstackHeapsGrowth, DoublesFromFourKibAndStopsAtTheBindingRange) {
  EXPECT_EQ(next_heap_bytes(0, 0, 1 << 30),
            4096u);  // every heap is bound: even an unused one exists
  EXPECT_EQ(next_heap_bytes(0, 100, 1 << 30), 4096u);                      // at least 4 KiB
  EXPECT_EQ(next_heap_bytes(4096, 4096, 1 << 30), 4096u);                  // enough: unchanged
  EXPECT_EQ(next_heap_bytes(4096, 5000, 1 << 30), 8192u);                  // doubling
  EXPECT_EQ(next_heap_bytes(4096, 100000, 1 << 30), 100000u);              // or the need, if larger
  EXPECT_EQ(next_heap_bytes(600u << 20, 700u << 20, 1u << 30), 1u << 30);  // capped at the range
  EXPECT_EQ(next_heap_bytes(0, 3ull << 30, 1u << 30), 3ull << 30);  // unless the need is larger
}

}  // namespace
}  // namespace vkad::runtime

#include "runtime/ndarray_table.h"

namespace vkad::runtime {
namespace {

TEST(NdArrayTable, BytesAndTheErrorsThatNameTheArray) {
  auto ok = ndarray_bytes(DType::kF64, {3, 5}, "a", 1 << 20);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 3u * 5u * 8u);
  EXPECT_EQ(*ndarray_bytes(DType::kBool, {7}, "b", 1 << 20), 28u);  // bool: one u32 each
  auto empty = ndarray_bytes(DType::kF32, {4, 0}, "e", 1 << 20);
  EXPECT_NE(empty.status().message().find("'e': shape (4, 0) is empty"), std::string::npos);
  EXPECT_FALSE(ndarray_bytes(DType::kF32, {}, "r0", 1 << 20).ok());
  auto rank = ndarray_bytes(DType::kF32, std::vector<uint32_t>(9, 2), "r9", 1 << 20);
  EXPECT_NE(rank.status().message().find("rank 9"), std::string::npos);
  auto big = ndarray_bytes(DType::kF32, {1u << 20, 1u << 20, 1u << 30}, "o", UINT64_MAX);
  EXPECT_NE(big.status().message().find("overflows 64 bits"), std::string::npos);
  auto range = ndarray_bytes(DType::kF32, {1000}, "x", 3999);
  EXPECT_NE(range.status().message().find("'x' of 4000 bytes exceeds"), std::string::npos);
  auto dtype = ndarray_bytes(static_cast<DType>(42), {1}, "d", 1 << 20);
  EXPECT_NE(dtype.status().message().find("dtype value 42"), std::string::npos);
}

}  // namespace
}  // namespace vkad::runtime

// The host ring's suballocation (runtime/host_ring.h): aligned slots front to back, refused
// once the chunk cannot hold the next one, from the start again after reset.
namespace vkad::runtime {
namespace {
TEST(RingCursor, AlignedSlotsFrontToBackUntilFull) {
  RingCursor c(256, 64);
  EXPECT_EQ(c.take(10), std::optional<uint64_t>(0));
  EXPECT_EQ(c.take(64), std::optional<uint64_t>(64)) << "aligned up from 10";
  EXPECT_EQ(c.take(1), std::optional<uint64_t>(128));
  EXPECT_EQ(c.take(64), std::optional<uint64_t>(192)) << "exactly fills the chunk";
  EXPECT_EQ(c.take(1), std::nullopt) << "full";
  EXPECT_EQ(c.used(), 256u);
  c.reset();
  EXPECT_EQ(c.take(256), std::optional<uint64_t>(0));
  EXPECT_EQ(c.take(0), std::nullopt) << "an aligned offset past the end is refused";
  RingCursor big(100, 16);
  EXPECT_EQ(big.take(101), std::nullopt) << "larger than the chunk";
  EXPECT_EQ(big.take(UINT64_MAX), std::nullopt) << "no overflow in the bound";
  EXPECT_EQ(big.take(100), std::optional<uint64_t>(0));
}
}  // namespace
}  // namespace vkad::runtime
