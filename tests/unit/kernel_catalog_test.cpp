// The kernel catalog (graph/kernel_catalog.h): what a graph pass asks of a kernel by handle id
// is what the IR's own analyses say, a kernel kept by its access only has no IR, and a dropped
// or unknown kernel is unknown to every question.
#include "graph/kernel_catalog.h"

#include <gtest/gtest.h>

#include <string>

#include "graph/gather_recompute.h"
#include "graph/launch_fusion.h"
#include "ir/text.h"

namespace vkad::testing {
namespace {

codegen::Kernel parse(const std::string& text) {
  auto k = codegen::parse(text);
  EXPECT_TRUE(k.ok()) << k.status().to_string();
  return k.ok() ? *k : codegen::Kernel{};
}

// Element-wise: fusible, a recompute producer, no loops, no launch-uniform index.
const char* kScale = R"(
kernel scale(a: ndarray<f32, 1>, b: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(a, 0)) {
    %x = load a[%i] : f32
    %two = const 2.0 : f32
    %y = mul %x, %two : f32
    store b[%i], %y
  }
}
)";

// Reads a row chosen by a scalar (a launch-uniform index) and loops: neither fusible's first
// task without loops nor element-wise.
const char* kRow = R"(
kernel row(a: ndarray<f32, 2>, b: ndarray<f32, 1>, r: i32) {
  task main parallel %i in [0, shape(b, 0)) {
    %row = arg r : i32
    %lo = const 0 : i32
    %hi = const 4 : i32
    for %k in [%lo, %hi) {
      %x = load a[%row, %i] : f32
      atomic_add b[%i], %x
    }
  }
}
)";

TEST(KernelCatalog, AnswersWhatTheIrsOwnAnalysesSay) {
  KernelCatalog c;
  const codegen::Kernel scale = parse(kScale);
  const codegen::Kernel row = parse(kRow);
  c.add(1, scale, /*adstack=*/false);
  c.add(2, row, /*adstack=*/true);

  ASSERT_NE(c.ir(1), nullptr);
  EXPECT_EQ(c.ir(1)->name, "scale");
  EXPECT_EQ(c.fusible_ir(1) != nullptr, codegen::fusible(scale));
  EXPECT_EQ(c.fusible_ir(2) != nullptr, codegen::fusible(row));
  EXPECT_EQ(c.recompute_producer(1), codegen::recompute_producer(scale));
  EXPECT_EQ(c.recompute_producer(2), codegen::recompute_producer(row));
  EXPECT_FALSE(c.adstack(1));
  EXPECT_TRUE(c.adstack(2));
  ASSERT_NE(c.access(2), nullptr);
  EXPECT_EQ(c.access(2)->params.size(), codegen::kernel_access(row).params.size());
  EXPECT_EQ(c.index_exprs(2).size(), codegen::uniform_index_exprs(row).size());
  EXPECT_FALSE(c.index_exprs(2).empty());  // %row indexes a
  EXPECT_TRUE(c.index_exprs(1).empty());
  // Asked twice: the same (cached) answer.
  EXPECT_EQ(&c.index_exprs(2), &c.index_exprs(2));
  if (c.fusible_ir(2)) {
    EXPECT_TRUE(c.first_task_loops(2));
  } else {
    EXPECT_FALSE(c.first_task_loops(2));  // only a fusible kernel's loops are asked for
  }
  EXPECT_FALSE(c.first_task_loops(1));
}

TEST(KernelCatalog, AKernelKeptByItsAccessHasNoIr) {
  KernelCatalog c;
  const codegen::Kernel scale = parse(kScale);
  c.add_access(7, scale, /*adstack=*/true);
  EXPECT_EQ(c.ir(7), nullptr);
  EXPECT_EQ(c.fusible_ir(7), nullptr);
  ASSERT_NE(c.access(7), nullptr);
  EXPECT_TRUE(c.adstack(7));
  EXPECT_FALSE(c.recompute_producer(7));
  EXPECT_TRUE(c.index_exprs(7).empty());
}

TEST(KernelCatalog, RefusedProducersAndDroppedKernelsAreUnknown) {
  KernelCatalog c;
  const codegen::Kernel scale = parse(kScale);
  ASSERT_TRUE(codegen::recompute_producer(scale));
  c.add(3, scale, false);
  EXPECT_TRUE(c.recompute_producer(3));
  c.refuse_producer(3);
  EXPECT_FALSE(c.recompute_producer(3));
  c.add(4, scale, false);
  c.drop(4);
  EXPECT_EQ(c.ir(4), nullptr);
  EXPECT_EQ(c.access(4), nullptr);
  EXPECT_FALSE(c.adstack(4));
  EXPECT_FALSE(c.recompute_producer(4));
  // Added again under the same id (a reserved handle registered after a drop): fresh facts.
  c.add(3, scale, false);
  EXPECT_TRUE(c.recompute_producer(3));
  EXPECT_EQ(c.access(99), nullptr);  // never added
}

}  // namespace
}  // namespace vkad::testing
