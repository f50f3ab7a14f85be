// Adstack planning without a device: row offsets, the args words, and where a slot lives in
// each layout (adstack/adstack_layout.h).
#include "adstack/adstack_layout.h"

#include <gtest/gtest.h>

#include <set>

#include "api/device_target.h"
#include "ir/target.h"
#include "ir/text.h"
#include "rhi/device.h"
#include "runtime/spirv_interface.h"
#include "spirv/compiler.h"

namespace vkad::adstack {
namespace {

std::vector<StackDesc> three_stacks() {
  // Two float stacks and an integer one, with capacities 3, 5 (scalar 0) and 2.
  return {{"a", Heap::kF32, SizeExpr::constant(3)},
          {"b", Heap::kF32, SizeExpr::scalar(0)},
          {"c", Heap::kInt, SizeExpr::constant(2)}};
}

SizeInputs inputs(int64_t scalar) {
  return {[scalar](uint32_t) { return scalar; }, [](uint32_t, uint32_t) { return int64_t{0}; }};
}

TEST(AdstackLayout, RowHoldsPrimalAndAdjointBlocksOfFloatStacksOnly) {
  std::vector<StackDesc> stacks = three_stacks();
  auto row = plan_row(stacks, inputs(5));
  ASSERT_TRUE(row.ok()) << row.status().to_string();
  EXPECT_EQ(row->offset, (std::vector<uint32_t>{0, 6, 0}));
  EXPECT_EQ(row->capacity, (std::vector<uint32_t>{3, 5, 2}));
  EXPECT_EQ(row->row_elems[0], 6u + 10u);
  EXPECT_EQ(row->row_elems[2], 2u);
  EXPECT_EQ(heap_bytes(*row, Heap::kF32, 100), 100u * 16 * 4);
}

TEST(AdstackLayout, ArgsWordsCarryRowLengthsThreadsAndStacks) {
  std::vector<StackDesc> stacks = three_stacks();
  auto row = plan_row(stacks, inputs(5));
  ASSERT_TRUE(row.ok());
  std::vector<uint32_t> w(args_words(stacks.size()), 0xdeadbeef);
  write_args(*row, 192, w.data());
  EXPECT_EQ(w[row_length_word(Heap::kF32)], 16u);
  EXPECT_EQ(w[row_length_word(Heap::kF64)], 0u);
  EXPECT_EQ(w[row_length_word(Heap::kInt)], 2u);
  EXPECT_EQ(w[threads_word()], 192u);
  for (uint32_t s = 0; s < stacks.size(); ++s) {
    EXPECT_EQ(w[offset_word(s)], row->offset[s]);
    EXPECT_EQ(w[capacity_word(s)], row->capacity[s]);
  }
}

// Every (stack, slot, primal/adjoint, thread) gets its own element inside the heap, in both
// layouts; slot-major puts neighbouring threads in neighbouring elements, thread-major keeps a
// thread's row contiguous.
TEST(AdstackLayout, BothLayoutsAreOneToOneIntoTheHeap) {
  std::vector<StackDesc> stacks = three_stacks();
  auto row = plan_row(stacks, inputs(5));
  ASSERT_TRUE(row.ok());
  const uint32_t threads = 7;
  for (Layout layout : {Layout::kThreadMajor, Layout::kSlotMajor}) {
    SCOPED_TRACE(layout_name(layout));
    std::array<std::set<uint64_t>, kHeapCount> seen;
    for (uint32_t s = 0; s < stacks.size(); ++s) {
      size_t h = static_cast<size_t>(stacks[s].heap);
      for (bool adj : {false, true}) {
        if (adj && !has_adjoint_block(stacks[s])) continue;
        for (uint32_t k = 0; k < row->capacity[s]; ++k) {
          for (uint32_t t = 0; t < threads; ++t) {
            uint64_t e = element_index(layout, *row, stacks, s, k, adj, t, threads);
            EXPECT_LT(e * heap_elem_bytes(stacks[s].heap),
                      heap_bytes(*row, stacks[s].heap, threads));
            EXPECT_TRUE(seen[h].insert(e).second)
                << "stack " << s << " slot " << k << " thread " << t;
            if (t == 0) continue;
            uint64_t prev = element_index(layout, *row, stacks, s, k, adj, t - 1, threads);
            uint64_t want = layout == Layout::kSlotMajor ? 1 : row->row_elems[h];
            EXPECT_EQ(e - prev, want);
          }
        }
      }
    }
    // Every element of the f32 and int heaps is used exactly once.
    EXPECT_EQ(seen[0].size(), uint64_t{row->row_elems[0]} * threads);
    EXPECT_EQ(seen[2].size(), uint64_t{row->row_elems[2]} * threads);
  }
}

TEST(AdstackLayout, CapacityBeyondThirtyTwoBitsNamesTheStack) {
  std::vector<StackDesc> stacks = three_stacks();
  auto row = plan_row(stacks, inputs(int64_t{1} << 31));
  ASSERT_FALSE(row.ok());
  EXPECT_EQ(row.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(row.status().message().find("adstack b"), std::string::npos) << row.status().message();
}

// A stack whose adjoint the kernel never reads or accumulates (every stack reverse mode makes
// today: it keeps adjoints in locals) gets no adjoint block: the row holds only primal values.
// A stack that uses its adjoint keeps the block.
TEST(AdstackLayout, CompiledStacksGetAnAdjointBlockOnlyWhenTheKernelUsesIt) {
  auto k = codegen::parse(R"(kernel k(n: i32, x: ndarray<f32, 1>, y: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(x, 0)) {
    %z = const 0 : i32
    %n = arg n : i32
    %x = load x[%i] : f32
    %p = stack_alloc cap(n) : f32
    %a = stack_alloc cap(n) : f32
    for %k in [%z, %n) {
      stack_push %p, %x
      stack_push %a, %x
      stack_acc_adj %a, %x
    }
    %t = stack_top %p : f32
    %u = stack_top_adj %a : f32
    %r = add %t, %u : f32
    store y[%i], %r
  }
})");
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  auto ck = codegen::compile(*k, codegen::Target::host());
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const std::vector<StackDesc>& stacks = ck->tasks[0].adstacks;
  ASSERT_EQ(stacks.size(), 2u);
  EXPECT_FALSE(has_adjoint_block(stacks[0]));
  EXPECT_TRUE(has_adjoint_block(stacks[1]));
  auto row = plan_row(stacks, inputs(10));
  ASSERT_TRUE(row.ok());
  EXPECT_EQ(row->offset, (std::vector<uint32_t>{0, 10}));
  EXPECT_EQ(row->row_elems[0], 10u + 20u);
}

TEST(AdstackLayout, PrivateLengthsArePowersOfTwoCoveringEachUsedHeap) {
  std::vector<StackDesc> stacks = three_stacks();
  auto row = plan_row(stacks, inputs(5));  // f32 row 16, int row 2, no f64
  ASSERT_TRUE(row.ok());
  EXPECT_EQ(private_lengths(*row), (std::array<uint32_t, kHeapCount>{16, 1, 2}));
  EXPECT_EQ(private_bytes(*row), 16u * 4 + 2u * 4) << "the unused f64 heap takes nothing";
  row = plan_row(stacks, inputs(6));  // f32 row 3*2 + 6*2 = 18 -> 32
  ASSERT_TRUE(row.ok());
  EXPECT_EQ(private_lengths(*row)[0], 32u);
  for (uint32_t h = 0; h < kHeapCount; ++h) EXPECT_GE(private_lengths(*row)[h], row->row_elems[h]);
  // A minimum length raises the used heaps only.
  EXPECT_EQ(private_lengths(*row, 64), (std::array<uint32_t, kHeapCount>{64, 1, 64}));
  EXPECT_EQ(private_bytes(*row, 64), 64u * 4 + 64u * 4);
}

TEST(AdstackLayout, CompiledAdstackTasksDeclareThePrivateTier) {
  auto k = codegen::parse(R"(kernel k(n: i32, x: ndarray<f32, 1>, y: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(x, 0)) {
    %z = const 0 : i32
    %n = arg n : i32
    %x = load x[%i] : f32
    %p = stack_alloc cap(n) : f32
    for %k in [%z, %n) {
      stack_push %p, %x
    }
    %t = stack_top %p : f32
    store y[%i], %t
  }
  task plain parallel %j in [0, shape(x, 0)) {
    %w = load x[%j] : f32
    store y[%j], %w
  }
})");
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  auto ck = codegen::compile(*k, codegen::Target::host());
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_TRUE(runtime::declares_spec_id(ck->tasks[0].spirv, kPrivateTierSpecId));
  EXPECT_TRUE(runtime::declares_spec_id(ck->tasks[0].spirv, private_length_spec_id(Heap::kF32)));
  EXPECT_FALSE(runtime::declares_spec_id(ck->tasks[0].spirv, private_length_spec_id(Heap::kF64)))
      << "only heaps with stacks get a private array";
  EXPECT_FALSE(runtime::declares_spec_id(ck->tasks[1].spirv, kPrivateTierSpecId));
}

TEST(AdstackLayout, TargetPicksSlotMajorOnGpusAndThreadMajorOnCpus) {
  rhi::Capabilities caps;
  for (rhi::DeviceKind kind : {rhi::DeviceKind::kDiscreteGpu, rhi::DeviceKind::kIntegratedGpu,
                               rhi::DeviceKind::kVirtualGpu, rhi::DeviceKind::kOther}) {
    caps.kind = kind;
    EXPECT_EQ(codegen::target_from_caps(caps).adstack_layout, Layout::kSlotMajor)
        << rhi::device_kind_name(kind);
  }
  caps.kind = rhi::DeviceKind::kCpu;
  EXPECT_EQ(codegen::target_from_caps(caps).adstack_layout, Layout::kThreadMajor);
}

}  // namespace
}  // namespace vkad::adstack
