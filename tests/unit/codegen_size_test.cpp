// How the emitted module grows with loop nesting (issue 27): SPIR-V validation cost grows with
// blocks x enclosing constructs x dominator depth, so a module that grows faster than its IR, a
// loop that costs more blocks, or a function that nests every level again would make compile
// time explode on deep kernels. Pinned on module structure, never on time: words, blocks and the
// deepest loop nesting of any function, for the forward and the adjoint of a nest of `depth`
// loops (vkad-bench-codegen's kernel).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <spirv/unified1/spirv.hpp>

#include "abi/spirv_tools.h"
#include "autodiff/reverse_mode.h"
#include "ir/text.h"
#include "spirv/compiler.h"
#include "spirv/spirv_outline.h"

namespace vkad::codegen {
namespace {

Kernel nest(uint32_t depth) {
  std::string t =
      "kernel nest(n: i32, x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {\n"
      "  task t parallel %0 in [0, shape(x, 0)) {\n    %1 = const 0 : i32\n"
      "    %2 = arg n : i32\n    %v = alloca : f32\n    %x = load x[%0] : f32\n"
      "    store_local %v, %x\n";
  for (uint32_t i = 0; i < depth; ++i) t += "for %l" + std::to_string(i) + " in [%1, %2) {\n";
  t += "%a = load_local %v : f32\n%s = sin %a : f32\nstore_local %v, %s\n";
  for (uint32_t i = 0; i < depth; ++i) t += "}\n";
  t += "    %o = load_local %v : f32\n    store y[%0], %o\n  }\n}\n";
  auto k = parse(t);
  EXPECT_TRUE(k.ok()) << k.status().to_string();
  return k.ok() ? *k : Kernel{};
}

struct Shape {
  size_t words = 0, blocks = 0, loops = 0, functions = 0;
  uint32_t deepest = 0;  // loop nesting within one function, the grid-stride loop included
  size_t stmts = 0;      // of the IR compiled
};

Shape shape_of(const std::vector<uint32_t>& w) {
  Shape s;
  s.words = w.size();
  std::vector<uint32_t> open;  // merge labels of the loops around the current instruction
  for (size_t i = 5; i < w.size();) {
    const uint32_t n = w[i] >> 16, op = w[i] & 0xffff;
    if (n == 0) break;
    if (op == spv::OpFunction) ++s.functions, open.clear();
    if (op == spv::OpLabel) {
      ++s.blocks;
      while (!open.empty() && open.back() == w[i + 1]) open.pop_back();
    }
    if (op == spv::OpLoopMerge) {
      ++s.loops;
      open.push_back(w[i + 1]);
      s.deepest = std::max<uint32_t>(s.deepest, static_cast<uint32_t>(open.size()));
    }
    i += n;
  }
  return s;
}

Shape compiled(const Kernel& k) {
  auto c = compile(k, Target::host());
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  if (!c.ok()) return {};
  Shape s = shape_of(c->tasks[0].spirv);
  std::function<void(const Block&)> count = [&](const Block& b) {
    for (const Stmt& st : b.stmts) {
      ++s.stmts;
      for (const Block& x : st.blocks) count(x);
    }
  };
  count(k.tasks[0].body);
  return s;
}

TEST(CodegenSize, ForwardNestGrowsLinearlyWithFewBlocksPerLoop) {
  Shape a = compiled(nest(32)), b = compiled(nest(64));
  // Linear: doubling the depth less than doubles the module (a quadratic emission: ~4x).
  EXPECT_LT(static_cast<double>(b.words) / a.words, 2.2) << a.words << " -> " << b.words;
  // A loop is its header (a loop body that starts with a loop shares it), continue block and
  // merge block, plus an outlined function's entry and return every kOutlineLoopDepth levels:
  // at most 4 blocks per level (a separate test block and an empty body block made it 5).
  EXPECT_LE(b.blocks - a.blocks, 4u * 32) << a.blocks << " -> " << b.blocks;
}

TEST(CodegenSize, AdjointModuleIsLinearInItsIrAndNoFunctionNestsDeeply) {
  Shape a = compiled(*make_adjoint(nest(16))), b = compiled(*make_adjoint(nest(32)));
  // The adjoint's IR recomputes each level inside every enclosing one (docs/architecture.md):
  // it grows about as depth^2 / 2 (2.5x here); a per-level copy of everything would be ~8x.
  EXPECT_LT(static_cast<double>(b.stmts) / a.stmts, 3.0) << a.stmts << " -> " << b.stmts;
  // The module is linear in that IR: words per statement do not grow with depth.
  const double per_a = static_cast<double>(a.words) / a.stmts,
               per_b = static_cast<double>(b.words) / b.stmts;
  EXPECT_LT(per_b, 1.15 * per_a) << per_a << " -> " << per_b << " words per statement";
  // Validation's cost per block follows the nesting of its function: outlined every
  // kOutlineLoopDepth levels, no function nests deeper than that (plus its own loop).
  Shape deep = compiled(*make_adjoint(nest(64)));
  EXPECT_GT(deep.functions, 1u);
  EXPECT_LE(deep.deepest, kOutlineLoopDepth + 1) << deep.functions << " functions";
}

TEST(SpirvOutline, ShallowModulesStayAsEmittedDeepOnesValidate) {
  auto shallow = compile(nest(7), Target::host());
  ASSERT_TRUE(shallow.ok());
  const std::vector<uint32_t>& w = shallow->tasks[0].spirv;
  EXPECT_EQ(outline_deep_loops(w, kOutlineLoopDepth), w);  // depth 7 + the grid-stride loop: 8
  EXPECT_EQ(shape_of(w).functions, 1u);
  auto deep = compile(nest(20), Target::host());  // compile() outlines and validates
  ASSERT_TRUE(deep.ok()) << deep.status().to_string();
  Shape s = shape_of(deep->tasks[0].spirv);
  EXPECT_EQ(s.functions, 3u);  // the loops 8 and 16 deep
  EXPECT_LE(s.deepest, kOutlineLoopDepth);
  // Outlining at every level still validates: every loop but the grid-stride one in a function.
  CompileOptions o;
  auto plain = compile(nest(5), Target::host(), o);
  ASSERT_TRUE(plain.ok());
  std::vector<uint32_t> each = outline_deep_loops(plain->tasks[0].spirv, 1);
  EXPECT_EQ(shape_of(each).functions, 6u);
  Status v = validate_spirv(each);
  EXPECT_TRUE(v.ok()) << v.to_string();
}

}  // namespace
}  // namespace vkad::codegen
