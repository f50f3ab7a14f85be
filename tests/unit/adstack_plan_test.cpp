// Adstack planning on the host, as tables: capacity evaluation (adstack/size_expr.h), row
// layouts, element offsets in both layouts, args words and heap sizes (adstack/adstack_layout.h).
// Every expected number is worked out by hand from the formulas of the headers' contracts:
//   capacity    = max(evaluate(expr), 1), leaves clamped at 0, sums/products checked in 64 bits
//   row         = per heap, in stack order: primal block [off, off + cap), then the adjoint
//                 block [off + cap, off + 2 cap) for a float stack whose adjoint is used
//   position r  = off + slot (+ cap for the adjoint)
//   thread-major: t * row_elems[h] + r        slot-major: r * T + t
//   heap bytes  = T * row_elems[h] * (8 for f64, else 4)
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "adstack/adstack_layout.h"
#include "adstack/size_expr.h"

namespace vkad::adstack {
namespace {

using K = SizeExpr::Kind;
constexpr int64_t kI32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();

SizeExpr c(int64_t v) { return SizeExpr::constant(v); }
SizeExpr n() { return SizeExpr::scalar(0); }  // the launch's scalar argument 0
SizeExpr add(SizeExpr a, SizeExpr b) {
  return SizeExpr::combine(K::kAdd, std::move(a), std::move(b));
}
SizeExpr mul(SizeExpr a, SizeExpr b) {
  return SizeExpr::combine(K::kMul, std::move(a), std::move(b));
}
SizeExpr max(SizeExpr a, SizeExpr b) {
  return SizeExpr::combine(K::kMax, std::move(a), std::move(b));
}
// A node the folder cannot touch, so that the evaluator (not combine()) does the arithmetic.
SizeExpr raw(K k, SizeExpr a, SizeExpr b) {
  SizeExpr e;
  e.kind = k;
  e.operands = {std::move(a), std::move(b)};
  return e;
}

// Scalar parameter 0 is `scalar`; extent d of ndarray parameter p is 100 p + d.
SizeInputs inputs(int64_t scalar) {
  return {[scalar](uint32_t) { return scalar; },
          [](uint32_t p, uint32_t d) { return int64_t{100} * p + d; }};
}

// ---- capacity evaluation ----------------------------------------------------------------

struct EvalCase {
  const char* name;
  SizeExpr expr;
  int64_t scalar;
  int64_t want;  // ignored when `error` is set
  const char* error = nullptr;
};

TEST(AdstackPlan, EvaluateTable) {
  // clang-format off: one case per line reads as a table
  const EvalCase cases[] = {
      {"constant", c(7), 0, 7},
      {"scalar leaf", n(), 12, 12},
      {"negative scalar counts as 0", n(), -5, 0},
      {"ndarray extent (param 1, dim 2)", SizeExpr::array_dim(1, 2), 0, 102},
      {"n - 1 at n = 10", add(n(), c(-1)), 10, 9},
      {"n - 1 at n = 0 is negative (plan_row lifts it to 1)", add(n(), c(-1)), 0, -1},
      {"extent times n", mul(SizeExpr::array_dim(1, 0), n()), 7, 700},
      {"max(n, 3) at n = 2", max(n(), c(3)), 2, 3},
      {"max(n, 3) at n = 9", max(n(), c(3)), 9, 9},
      {"n^3 + max(n, 7) at n = 10", add(mul(n(), mul(n(), n())), max(n(), c(7))), 10, 1010},
      {"product exactly 2^62", raw(K::kMul, n(), c(4)), int64_t{1} << 60, int64_t{1} << 62},
      {"sum exactly 2^63 - 1", raw(K::kAdd, n(), c(1)), kI64Max - 1, kI64Max},
      {"product past 2^63 - 1", raw(K::kMul, n(), c(2)), int64_t{1} << 62, 0,
       "size overflows 64 bits (a product past 2^63 - 1)"},
      {"sum past 2^63 - 1", raw(K::kAdd, n(), c(1)), kI64Max, 0,
       "size overflows 64 bits (a sum past 2^63 - 1)"},
      {"overflow deep inside a max", max(c(1), mul(n(), mul(n(), n()))), 3'000'000, 0,
       "overflows 64 bits"},
  };
  // clang-format on
  for (const EvalCase& tc : cases) {
    SCOPED_TRACE(tc.name);
    Result<int64_t> v = evaluate(tc.expr, inputs(tc.scalar));
    if (tc.error) {
      ASSERT_FALSE(v.ok()) << "got " << *v;
      EXPECT_EQ(v.status().code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(v.status().message().find(tc.error), std::string::npos) << v.status().message();
    } else {
      ASSERT_TRUE(v.ok()) << v.status().to_string();
      EXPECT_EQ(*v, tc.want);
    }
  }
}

// combine() folds constants and identities; what it folds must evaluate as the unfolded node.
TEST(AdstackPlan, FoldingAgreesWithTheEvaluator) {
  // clang-format off: one case per line reads as a table
  const std::pair<const char*, SizeExpr> exprs[] = {
      {"x + 0", add(n(), c(0))},    {"0 + x", add(c(0), n())},
      {"x * 1", mul(n(), c(1))},    {"1 * x", mul(c(1), n())},
      {"x * 0", mul(n(), c(0))},    {"max(x, 0)", max(n(), c(0))},
      {"max(x, x)", max(n(), n())}, {"3 * 5 + 2", add(mul(c(3), c(5)), c(2))},
  };
  // clang-format on
  // clang-format off: one case per line reads as a table
  const std::pair<const char*, SizeExpr> unfolded[] = {
      {"x + 0", raw(K::kAdd, n(), c(0))},
      {"0 + x", raw(K::kAdd, c(0), n())},
      {"x * 1", raw(K::kMul, n(), c(1))},
      {"1 * x", raw(K::kMul, c(1), n())},
      {"x * 0", raw(K::kMul, n(), c(0))},
      {"max(x, 0)", raw(K::kMax, n(), c(0))},
      {"max(x, x)", raw(K::kMax, n(), n())},
      {"3 * 5 + 2", raw(K::kAdd, raw(K::kMul, c(3), c(5)), c(2))},
  };
  // clang-format on
  for (size_t i = 0; i < std::size(exprs); ++i) {
    for (int64_t x : {int64_t{0}, int64_t{1}, int64_t{17}}) {
      SCOPED_TRACE(std::string(exprs[i].first) + " at x = " + std::to_string(x));
      auto a = evaluate(exprs[i].second, inputs(x));
      auto b = evaluate(unfolded[i].second, inputs(x));
      ASSERT_TRUE(a.ok() && b.ok());
      EXPECT_EQ(*a, *b);
    }
  }
}

// ---- row layouts ------------------------------------------------------------------------

StackDesc stack(const char* name, Heap h, SizeExpr cap, bool adjoint = true) {
  return {name, h, std::move(cap), adjoint};
}

struct RowCase {
  const char* name;
  std::vector<StackDesc> stacks;
  int64_t scalar;
  std::vector<uint32_t> offset, capacity;
  std::array<uint32_t, kHeapCount> row_elems;  // f32, f64, int
};

// Five stacks over the three heaps, n = 6: f32 a (3, adjoint), f64 b (n, adjoint), int c (2),
// f32 d (2, no adjoint use), f64 e (1, no adjoint use).
std::vector<StackDesc> mixed() {
  return {stack("a", Heap::kF32, c(3)), stack("b", Heap::kF64, n()), stack("c", Heap::kInt, c(2)),
          stack("d", Heap::kF32, c(2), false), stack("e", Heap::kF64, c(1), false)};
}

TEST(AdstackPlan, RowTable) {
  // clang-format off: one case per line reads as a table
  const RowCase cases[] = {
      {"no stacks", {}, 0, {}, {}, {0, 0, 0}},
      {"f32 with adjoint: primal + adjoint block",
       {stack("a", Heap::kF32, c(4))},
       0,
       {0},
       {4},
       {8, 0, 0}},
      {"f32 without adjoint use: primal only",
       {stack("a", Heap::kF32, c(4), false)},
       0,
       {0},
       {4},
       {4, 0, 0}},
      {"f64 with adjoint", {stack("a", Heap::kF64, n())}, 5, {0}, {5}, {0, 10, 0}},
      {"int stacks never get an adjoint block",
       {stack("a", Heap::kInt, c(5), true)},
       0,
       {0},
       {5},
       {0, 0, 5}},
      {"capacity 0 is lifted to 1", {stack("a", Heap::kF32, n())}, 0, {0}, {1}, {2, 0, 0}},
      {"negative capacity (n - 1 at n = 0) is lifted to 1",
       {stack("a", Heap::kInt, add(n(), c(-1)))},
       0,
       {0},
       {1},
       {0, 0, 1}},
      {"same heap: offsets follow in stack order",
       {stack("a", Heap::kF32, c(3)), stack("b", Heap::kF32, c(5), false),
        stack("c", Heap::kF32, c(2))},
       0,
       {0, 6, 11},
       {3, 5, 2},
       {15, 0, 0}},
      {"heaps are independent", mixed(), 6, {0, 0, 0, 6, 12}, {3, 6, 2, 2, 1}, {8, 13, 2}},
      {"a row of exactly 2^31 - 1 fits",
       {stack("a", Heap::kF32, n(), false)},
       kI32Max,
       {0},
       {uint32_t(kI32Max)},
       {uint32_t(kI32Max), 0, 0}},
      {"2^31 - 1 elements in each heap",
       {stack("a", Heap::kF32, n(), false), stack("b", Heap::kF64, n(), false),
        stack("c", Heap::kInt, n())},
       kI32Max,
       {0, 0, 0},
       {uint32_t(kI32Max), uint32_t(kI32Max), uint32_t(kI32Max)},
       {uint32_t(kI32Max), uint32_t(kI32Max), uint32_t(kI32Max)}},
  };
  // clang-format on
  for (const RowCase& tc : cases) {
    SCOPED_TRACE(tc.name);
    Result<RowLayout> row = plan_row(tc.stacks, inputs(tc.scalar));
    ASSERT_TRUE(row.ok()) << row.status().to_string();
    EXPECT_EQ(row->offset, tc.offset);
    EXPECT_EQ(row->capacity, tc.capacity);
    EXPECT_EQ(row->row_elems, tc.row_elems);
  }
}

struct RowErrorCase {
  const char* name;
  std::vector<StackDesc> stacks;
  int64_t scalar;
  std::vector<const char*> message;  // substrings of the error
};

TEST(AdstackPlan, RowErrorTable) {
  // clang-format off: one case per line reads as a table
  const RowErrorCase cases[] = {
      {"capacity 2^31",
       {stack("%4", Heap::kInt, n())},
       kI32Max + 1,
       {"adstack %4 needs capacity 2147483648", "32-bit row"}},
      {"capacity 2^31 - 1 with its adjoint block is a 2^32 - 2 row",
       {stack("%4", Heap::kF32, n())},
       kI32Max,
       {"adstack %4 ", "32-bit row"}},
      {"two stacks of 2^30 in one heap: the second does not fit",
       {stack("%1", Heap::kF64, n(), false), stack("%2", Heap::kF64, n(), false)},
       int64_t{1} << 30,
       {"adstack %2 ", "32-bit row"}},
      {"a capacity past 64 bits names its stack",
       {stack("%1", Heap::kF32, n()),
        stack("%7 (carried f32 local %3)", Heap::kF32, mul(n(), mul(n(), n())))},
       3'000'000,
       {"adstack %7 (carried f32 local %3) capacity", "overflows 64 bits"}},
  };
  // clang-format on
  for (const RowErrorCase& tc : cases) {
    SCOPED_TRACE(tc.name);
    Result<RowLayout> row = plan_row(tc.stacks, inputs(tc.scalar));
    ASSERT_FALSE(row.ok());
    EXPECT_EQ(row.status().code(), ErrorCode::kInvalidArgument);
    for (const char* m : tc.message) {
      EXPECT_NE(row.status().message().find(m), std::string::npos)
          << m << " in: " << row.status().message();
    }
  }
  // The same two 2^30 stacks fit when they live in different heaps.
  std::vector<StackDesc> split = {stack("%1", Heap::kF64, n(), false),
                                  stack("%2", Heap::kF32, n(), false)};
  EXPECT_TRUE(plan_row(split, inputs(int64_t{1} << 30)).ok());
}

// ---- element offsets --------------------------------------------------------------------

struct IndexCase {
  uint32_t stack, slot;
  bool adjoint;
  uint32_t thread;
  uint64_t thread_major, slot_major;  // T = 10 threads
};

TEST(AdstackPlan, ElementIndexTable) {
  std::vector<StackDesc> stacks = mixed();
  auto row = plan_row(stacks, inputs(6));
  ASSERT_TRUE(row.ok());
  // Row lengths 8 (f32), 13 (f64), 2 (int); see RowTable's "heaps are independent".
  // clang-format off: one case per line reads as a table
  const IndexCase cases[] = {
      // stack a (f32, off 0, cap 3)
      {0, 0, false, 0, 0, 0},
      {0, 2, false, 1, 1 * 8 + 2, 2 * 10 + 1},
      {0, 2, true, 9, 9 * 8 + 5, 5 * 10 + 9},  // adjoint slot 2 is row position 0 + 2 + 3
      // stack b (f64, off 0, cap 6)
      {1, 5, false, 4, 4 * 13 + 5, 5 * 10 + 4},
      {1, 5, true, 4, 4 * 13 + 11, 11 * 10 + 4},
      // stack c (int, off 0, cap 2)
      {2, 1, false, 9, 9 * 2 + 1, 1 * 10 + 9},
      // stack d (f32, off 6, cap 2, no adjoint block)
      {3, 1, false, 3, 3 * 8 + 7, 7 * 10 + 3},
      // stack e (f64, off 12, cap 1)
      {4, 0, false, 0, 12, 120},
      {4, 0, false, 9, 9 * 13 + 12, 12 * 10 + 9},
  };
  // clang-format on
  for (const IndexCase& tc : cases) {
    SCOPED_TRACE("stack " + std::to_string(tc.stack) + " slot " + std::to_string(tc.slot) +
                 (tc.adjoint ? " adjoint" : " primal") + " thread " + std::to_string(tc.thread));
    EXPECT_EQ(element_index(Layout::kThreadMajor, *row, stacks, tc.stack, tc.slot, tc.adjoint,
                            tc.thread, 10),
              tc.thread_major);
    EXPECT_EQ(element_index(Layout::kSlotMajor, *row, stacks, tc.stack, tc.slot, tc.adjoint,
                            tc.thread, 10),
              tc.slot_major);
  }
}

// With a 2^31 - 1 row and 2^32 - 1 threads the last element is (2^31 - 1)(2^32 - 1) - 1, past
// 32 bits: both layouts must compute it in 64 bits and land on the heap's last element.
TEST(AdstackPlan, ElementIndexAtTheLargestRowAndThreadCount) {
  std::vector<StackDesc> stacks = {stack("a", Heap::kF32, n(), false)};
  auto row = plan_row(stacks, inputs(kI32Max));
  ASSERT_TRUE(row.ok());
  const uint32_t threads = std::numeric_limits<uint32_t>::max();
  const uint64_t last = uint64_t{0x7fffffff} * 0xffffffffu - 1;  // 0x7ffffffe80000000
  for (Layout layout : {Layout::kThreadMajor, Layout::kSlotMajor}) {
    SCOPED_TRACE(layout_name(layout));
    EXPECT_EQ(
        element_index(layout, *row, stacks, 0, uint32_t(kI32Max) - 1, false, threads - 1, threads),
        last);
    EXPECT_EQ(element_index(layout, *row, stacks, 0, 0, false, 0, threads), 0u);
  }
}

// ---- args words and heap sizes ----------------------------------------------------------

TEST(AdstackPlan, ArgsWordsOfTheMixedRow) {
  std::vector<StackDesc> stacks = mixed();
  auto row = plan_row(stacks, inputs(6));
  ASSERT_TRUE(row.ok());
  EXPECT_EQ(args_words(0), 0u);  // a task without stacks has no adstack words at all
  ASSERT_EQ(args_words(stacks.size()), 14u);
  std::vector<uint32_t> w(14, 0xdeadbeef);
  write_args(*row, 10, w.data());
  // Row lengths f32, f64, int; T; then (offset, capacity) per stack.
  EXPECT_EQ(w, (std::vector<uint32_t>{8, 13, 2, 10, 0, 3, 0, 6, 0, 2, 6, 2, 12, 1}));
}

struct HeapCase {
  const char* name;
  std::array<uint32_t, kHeapCount> row_elems;
  uint64_t threads;
  std::array<uint64_t, kHeapCount> bytes;
};

TEST(AdstackPlan, HeapBytesTable) {
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  const uint32_t big = uint32_t(kI32Max);
  // clang-format off: one case per line reads as a table
  const HeapCase cases[] = {
      {"mixed row, 10 threads", {8, 13, 2}, 10, {320, 1040, 80}},
      {"no threads", {8, 13, 2}, 0, {0, 0, 0}},
      {"empty row", {0, 0, 0}, 1u << 20, {0, 0, 0}},
      {"largest row, 2^26 threads (65535 groups of 1024)",
       {big, big, big},
       uint64_t{1} << 26,
       {(uint64_t{1} << 28) * big, (uint64_t{1} << 29) * big, (uint64_t{1} << 28) * big}},
      // (2^31 - 1) * 2^32 * 4 and * 8 are past 2^64: the need saturates instead of wrapping to
      // a small number that a heap would then be sized by.
      {"largest row, 2^32 threads: saturates",
       {big, big, 1},
       uint64_t{1} << 32,
       {kMax, kMax, uint64_t{1} << 34}},
      {"threads past 2^61 with a one-element row", {1, 1, 0}, uint64_t{1} << 62, {kMax, kMax, 0}},
  };
  // clang-format on
  for (const HeapCase& tc : cases) {
    SCOPED_TRACE(tc.name);
    RowLayout row;
    row.row_elems = tc.row_elems;
    for (uint32_t h = 0; h < kHeapCount; ++h) {
      EXPECT_EQ(heap_bytes(row, static_cast<Heap>(h), tc.threads), tc.bytes[h])
          << heap_name(static_cast<Heap>(h));
    }
  }
}

}  // namespace
}  // namespace vkad::adstack
