// autodiff/adjoint_plan.h: what reverse mode decides to store, where and how big, checked on
// small kernels before any adjoint statement exists. Each case states what the plan must say;
// a plan that stored too little (a wrong gradient), too much (a larger heap), sized a stack
// wrong or split the wrong loop fails it.
#include "autodiff/adjoint_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "ir/text.h"

namespace vkad::codegen {
namespace {

// The kernel in `text` and its plan (the plan points into the kernel: keep them together).
struct Planned {
  Kernel k;
  AdjointPlan plan;
};
Planned planned(const std::string& text, uint32_t segment = 0, bool counting = false) {
  Planned out;
  auto k = parse(text);
  EXPECT_TRUE(k.ok()) << k.status().to_string();
  if (!k.ok()) return out;
  out.k = std::move(*k);
  AdjointOptions o;
  o.checkpoint_segment = segment;
  auto p = plan_adjoint(out.k, o, counting);
  EXPECT_TRUE(p.ok()) << p.status().to_string();
  if (p.ok()) out.plan = std::move(*p);
  return out;
}

// `text` with `from` (which must occur) replaced by `to`.
std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

// The text of a checkpoint's capacity, e.g. "n" or "100".
std::string cap(const Kernel& k, const LoopCheckpoint& c) { return print_size(k, c.capacity); }

// v = sin(v) n times: v is needed by the reverse sweep at every iteration (cos(v)), so it is
// checkpointed at the loop, one stack of n entries.
const char* kRecurrence = R"(
kernel k(n: i32, x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {
  task main parallel %0 in [0, shape(x, 0)) {
    %1 = alloca : f32
    %2 = load x[%0] : f32
    store_local %1, %2
    %3 = const 0 : i32
    %4 = arg n : i32
    for %5 in [%3, %4) {
      %6 = load_local %1 : f32
      %7 = sin %6 : f32
      store_local %1, %7
    }
    %8 = load_local %1 : f32
    store y[%0], %8
  }
})";

TEST(AdjointPlan, NonlinearRecurrenceCheckpointsItsLocalSizedByTheTripCount) {
  const auto [k, p] = planned(kRecurrence);
  ASSERT_EQ(p.tasks.size(), 1u);
  const TaskPlan& t = p.tasks[0];
  ASSERT_EQ(t.checkpoints.size(), 1u);
  EXPECT_EQ(t.checkpoints[0].loop->result, 5u);
  EXPECT_EQ(t.checkpoints[0].locals, std::vector<ValueId>{1});
  EXPECT_EQ(cap(k, t.checkpoints[0]), "n");
  EXPECT_EQ(t.stack_count(), 1u);
  // The derivative flows x -> v -> y: the load, the local and the sin carry one; the bound n
  // (an integer) does not.
  for (ValueId v : {2u, 1u, 6u, 7u, 8u}) EXPECT_TRUE(t.active.count(v)) << "%" << v;
  EXPECT_FALSE(t.active.count(4));
  EXPECT_TRUE(t.read.count(6));  // cos(%6): the sin's operand is read by the reverse sweep
  EXPECT_EQ(t.active_locals, std::vector<ValueId>{1});
  // Gradients: x and y, after the two forward parameters... n, x, y: x_grad 3, y_grad 4.
  EXPECT_EQ(p.grad_param, (std::vector<uint32_t>{UINT32_MAX, 3, 4}));
  EXPECT_EQ(p.param_count, 5u);
  EXPECT_TRUE(t.owned[1] && t.owned[2]);  // x[%0], y[%0]: each thread its own element
}

// With hardware float atomics of a type, the gradient of an owned array of that type that the
// kernel only reads (x) is added atomically (the launches adding into it then commute in a
// graph); one the kernel writes (y: a state whose gradient the next adjoint reads) keeps its
// load-add-store. Without, both do. f32 and f64 apart.
TEST(AdjointPlan, GradientsOfOwnedArraysOnlyReadAreAddedAtomicallyWithHardwareAtomics) {
  const char* k64 = R"(
kernel k(x: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {
  task main parallel %0 in [0, shape(x, 0)) {
    %1 = load x[%0] : f64
    %2 = sin %1 : f64
    store y[%0], %2
  }
})";
  for (const char* text : {kRecurrence, k64}) {
    auto k = parse(text);
    ASSERT_TRUE(k.ok()) << k.status().to_string();
    const bool f64 = text == k64;
    const uint32_t x = f64 ? 0 : 1, y = x + 1;
    for (int atomics = 0; atomics < 4; ++atomics) {
      AdjointOptions o;
      o.atomic_f32_add = (atomics & 1) != 0;
      o.atomic_f64_add = (atomics & 2) != 0;
      auto p = plan_adjoint(*k, o, false);
      ASSERT_TRUE(p.ok()) << p.status().to_string();
      const bool hw = f64 ? o.atomic_f64_add : o.atomic_f32_add;
      EXPECT_EQ(p->tasks[0].owned[x], !hw) << "x, f64 " << f64 << ", atomics " << atomics;
      EXPECT_TRUE(p->tasks[0].owned[y]) << "y, f64 " << f64 << ", atomics " << atomics;
    }
  }
}

// acc += x[k] * w[k]: acc is only updated linearly, so nothing is stored at all.
TEST(AdjointPlan, LinearAccumulationStoresNothing) {
  const AdjointPlan p = planned(R"(
kernel k(n: i32, x: ndarray<f32, 1> grad, w: ndarray<f32, 1>, y: ndarray<f32, 1> grad) {
  task main parallel %0 in [0, shape(x, 0)) {
    %1 = alloca : f32
    %2 = const 0 : i32
    %3 = arg n : i32
    for %4 in [%2, %3) {
      %5 = load x[%4] : f32
      %6 = load w[%4] : f32
      %7 = mul %5, %6 : f32
      %8 = load_local %1 : f32
      %9 = add %8, %7 : f32
      store_local %1, %9
    }
    %10 = load_local %1 : f32
    store y[%0], %10
  }
})")
                            .plan;
  EXPECT_TRUE(p.tasks[0].checkpoints.empty());
  EXPECT_EQ(p.tasks[0].stack_count(), 0u);
  EXPECT_FALSE(p.tasks[0].active.count(6));  // w has no gradient
  EXPECT_TRUE(p.tasks[0].read.count(6));     // but d(x * w)/dx reads it
  EXPECT_FALSE(p.tasks[0].owned[1]);         // x[%4]: a gather, not the thread's element
}

// Nested loops: the inner loop's stack is sized by its own trip bound (m), the outer's by n
// (the sum over loops, not the product: the inner iterations are recomputed per outer one).
TEST(AdjointPlan, NestedLoopsEachGetTheirOwnTripBound) {
  // kRecurrence's loop (%5, to m now) inside a loop %10 to n.
  std::string text = replaced(kRecurrence, "kernel k(n: i32,", "kernel k(n: i32, m: i32,");
  text = replaced(text, "    for %5 in [%3, %4) {\n",
                  "    %9 = arg m : i32\n    for %10 in [%3, %4) {\n    for %5 in [%3, %9) {\n");
  text = replaced(text, "      store_local %1, %7\n    }\n",
                  "      store_local %1, %7\n    }\n    }\n");
  const auto [k, p] = planned(text);
  const TaskPlan& t = p.tasks[0];
  ASSERT_EQ(t.checkpoints.size(), 2u);
  EXPECT_EQ(t.checkpoints[0].loop->result, 10u);  // statement order: outer first
  EXPECT_EQ(cap(k, t.checkpoints[0]), "n");
  EXPECT_EQ(t.checkpoints[1].loop->result, 5u);
  EXPECT_EQ(cap(k, t.checkpoints[1]), "m");
}

// A loop from a negative i32 begin: the stack must hold end - begin entries, and begin may be
// negative, so its lower bound is -neg(b) and the capacity counts it (issue 24: the two range
// analyses once disagreed here).
TEST(AdjointPlan, SignedBeginWidensTheStack) {
  const std::string text =
      replaced(replaced(kRecurrence, "kernel k(n: i32,", "kernel k(b: i32, n: i32,"),
               "%3 = const 0 : i32", "%3 = arg b : i32");
  const auto [k, p] = planned(text);
  ASSERT_EQ(p.tasks[0].checkpoints.size(), 1u);
  const std::string c = cap(k, p.tasks[0].checkpoints[0]);
  EXPECT_NE(c.find("n"), std::string::npos) << c;
  EXPECT_NE(c.find("neg(b)"), std::string::npos) << c;  // not just n: a negative b adds to it
}

// Segmented checkpointing picks the innermost loop that stores something, with W = 64 / values
// per iteration clamped to [2K - 1, 4K]: K = 4, one value -> W = 16.
TEST(AdjointPlan, SegmentationSelectsLongCheckpointedLoops) {
  EXPECT_TRUE(planned(kRecurrence, 0).plan.tasks[0].segmentable.empty());  // off
  const AdjointPlan p = planned(kRecurrence, 4).plan;
  ASSERT_EQ(p.tasks[0].segmentable.size(), 1u);
  EXPECT_EQ(p.tasks[0].segmentable.at(5), 16u);
  // A constant trip count within the whole tape is left alone (the split would run all of
  // it on the whole-tape path); past it the loop is split.
  const std::string sixteen = replaced(kRecurrence, "%4 = arg n : i32", "%4 = const 16 : i32");
  EXPECT_TRUE(planned(sixteen, 4).plan.tasks[0].segmentable.empty());
  const std::string seventeen = replaced(sixteen, "const 16", "const 17");
  EXPECT_EQ(planned(seventeen, 4).plan.tasks[0].segmentable.size(), 1u);
}

// A loop bounded by data: refused naming the loop, or counted (a trips_ parameter after the
// gradients, which sizes its stack) when counting.
TEST(AdjointPlan, DataBoundedLoopIsRefusedOrCounted) {
  const std::string text = replaced(kRecurrence, "%4 = arg n : i32", "%4 = cast %2 : i32");
  auto forward = parse(text);
  ASSERT_TRUE(forward.ok()) << forward.status().to_string();
  auto refused = plan_adjoint(*forward);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("needs a bound on this loop's trip count"),
            std::string::npos)
      << refused.status().to_string();
  const auto [counted_k, p] = planned(text, 0, /*counting=*/true);  // p points into counted_k
  ASSERT_EQ(p.counted_loops.size(), 1u);
  EXPECT_EQ(p.counted_loops[0]->result, 5u);
  EXPECT_EQ(p.param_count, 6u);  // n, x, y, x_grad, y_grad, then trips_5 (parameter 5)
  ASSERT_EQ(p.tasks[0].checkpoints.size(), 1u);
  EXPECT_EQ(p.tasks[0].checkpoints[0].capacity, SizeExpr::scalar(5));
}

TEST(AdjointPlan, RefusesAnOutOfRangeSegment) {
  AdjointOptions o;
  o.checkpoint_segment = 1;
  auto forward = parse(kRecurrence);
  ASSERT_TRUE(forward.ok()) << forward.status().to_string();
  auto p = plan_adjoint(*forward, o);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("AdjointOptions::checkpoint_segment is 1"), std::string::npos)
      << p.status().to_string();
}

}  // namespace
}  // namespace vkad::codegen
