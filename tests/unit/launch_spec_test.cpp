// Which args words codegen lets the runtime specialize (spirv/launch_spec.h), and that the
// module declares a flag and a value constant for each.
#include <gtest/gtest.h>

#include <algorithm>

#include "autodiff/reverse_mode.h"
#include "ir/text.h"
#include "runtime/spirv_interface.h"
#include "spirv/compiler.h"

namespace vkad::codegen {
namespace {

Kernel parse_ok(const char* text) {
  auto k = parse(text);
  EXPECT_TRUE(k.ok()) << k.status().to_string();
  return *k;
}

abi::CompiledKernel adjoint_compiled(const Kernel& fwd) {
  auto a = make_adjoint(fwd, Target::host());
  EXPECT_TRUE(a.ok()) << a.status().to_string();
  auto c = compile(*a, Target::host());
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return *c;
}

bool has(const std::vector<uint32_t>& v, uint32_t w) {
  return std::find(v.begin(), v.end(), w) != v.end();
}

// Trip count from scalar `n`, a second bound from an extent; `k` is a float scalar (never a
// bound) and `m` an integer scalar that only feeds arithmetic.
const char* kLoop =
    R"(kernel f(n: i32, k: f32, m: i32, x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = alloca : f32
    %x = load x[%i] : f32
    store_local %v, %x
    %z = const 0 : i32
    %n = arg n : i32
    %one = const 1 : i32
    %n1 = add %n, %one : i32
    %kk = arg k : f32
    %m = arg m : i32
    %mf = cast %m : f32
    for %t in [%z, %n1) {
      %a = load_local %v : f32
      %s = sin %a : f32
      %p = mul %s, %kk : f32
      %q = add %p, %mf : f32
      store_local %v, %q
    }
    %out = load_local %v : f32
    store y[%i], %out
  }
})";

TEST(LaunchSpec, AdjointMarksItsStackWordsAndTheScalarsItsLoopBoundsComeFrom) {
  abi::CompiledKernel c = adjoint_compiled(parse_ok(kLoop));
  ASSERT_EQ(c.tasks.size(), 1u);
  const abi::CompiledTask& t = c.tasks[0];
  ASSERT_FALSE(t.adstacks.empty());
  const std::vector<uint32_t>& w = t.spec_words;
  EXPECT_TRUE(std::is_sorted(w.begin(), w.end()));
  EXPECT_TRUE(has(w, c.scalar_offset(0))) << "n bounds the loop (through n + 1)";
  EXPECT_FALSE(has(w, c.scalar_offset(1))) << "k is a float";
  EXPECT_FALSE(has(w, c.scalar_offset(2))) << "m bounds no loop";
  const uint32_t base = c.adstack_args_offset(0);
  for (uint32_t s = 0; s < t.adstacks.size(); ++s) {
    EXPECT_TRUE(has(w, base + 4 * adstack::offset_word(s))) << "stack " << s;
    EXPECT_TRUE(has(w, base + 4 * adstack::capacity_word(s))) << "stack " << s;
  }
  EXPECT_FALSE(has(w, base + 4 * adstack::threads_word())) << "the thread count varies with n";
  EXPECT_EQ(w.size(), 1 + 2 * t.adstacks.size());
  for (uint32_t i = 0; i < w.size(); ++i) {
    EXPECT_TRUE(runtime::declares_spec_id(t.spirv, abi::launch_spec_flag_id(i))) << i;
    EXPECT_TRUE(runtime::declares_spec_id(t.spirv, abi::launch_spec_value_id(i))) << i;
  }
  EXPECT_FALSE(runtime::declares_spec_id(
      t.spirv, abi::launch_spec_flag_id(static_cast<uint32_t>(w.size()))));
}

TEST(LaunchSpec, ForwardKernelsAndDataDependentBoundsMarkNoScalar) {
  Kernel fwd = parse_ok(kLoop);
  auto c = compile(fwd, Target::host());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_TRUE(c->tasks[0].spec_words.empty()) << "no adstacks: nothing to specialize";
  // The trip count loaded from an ndarray: only the stack words (and no scalar) are marked.
  abi::CompiledKernel a = adjoint_compiled(parse_ok(
      R"(kernel g(n: i32, cnt: ndarray<i32, 1>, x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = alloca : f32
    %x = load x[%i] : f32
    store_local %v, %x
    %z = const 0 : i32
    %c = load cnt[%i] : i32
    for %k in [%z, %c) max_trip(4) {
      %a = load_local %v : f32
      %s = sin %a : f32
      store_local %v, %s
    }
    %out = load_local %v : f32
    store y[%i], %out
  }
})"));
  EXPECT_FALSE(has(a.tasks[0].spec_words, a.scalar_offset(0)));
  EXPECT_EQ(a.tasks[0].spec_words.size(), 2 * a.tasks[0].adstacks.size());
}

TEST(LaunchSpec, SpecializeShapesMarksTheExtentsOfTheArraysATaskAccesses) {
  // A kernel without adstacks: nothing marked by default, every extent of x and y (and only
  // theirs: z is a parameter no statement touches) with specialize_shapes.
  Kernel k = parse_ok(
      R"(kernel h(s: i32, x: ndarray<f32, 2>, y: ndarray<f32, 1>, z: ndarray<f32, 3>) {
  task main parallel %i in [0, shape(y, 0)) {
    %s = arg s : i32
    %a = load x[%s, %i] : f32
    store y[%i], %a
  }
})");
  auto plain = compile(k, Target::host());
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_TRUE(plain->tasks[0].spec_words.empty());
  CompileOptions o;
  o.specialize_shapes = true;
  auto c = compile(k, Target::host(), o);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const std::vector<uint32_t>& w = c->tasks[0].spec_words;
  EXPECT_TRUE(std::is_sorted(w.begin(), w.end()));
  EXPECT_TRUE(has(w, c->shape_offset(1)) && has(w, c->shape_offset(1) + 4)) << "x's two extents";
  EXPECT_TRUE(has(w, c->shape_offset(2))) << "y's extent";
  EXPECT_FALSE(has(w, c->shape_offset(3))) << "z is never accessed";
  EXPECT_FALSE(has(w, c->scalar_offset(0))) << "s varies per launch";
  EXPECT_EQ(w.size(), 3u);
  for (uint32_t i = 0; i < w.size(); ++i) {
    EXPECT_TRUE(runtime::declares_spec_id(c->tasks[0].spirv, abi::launch_spec_flag_id(i))) << i;
    EXPECT_TRUE(runtime::declares_spec_id(c->tasks[0].spirv, abi::launch_spec_value_id(i))) << i;
  }
  EXPECT_NE(compile_key(k, Target::host(), {}), compile_key(k, Target::host(), o))
      << "the option changes the module, so the compile cache must tell them apart";
}

TEST(LaunchSpec, SpecWordsArePartOfTheContent) {
  abi::CompiledKernel a = adjoint_compiled(parse_ok(kLoop));
  abi::CompiledKernel b = a;
  b.tasks[0].spec_words.clear();
  EXPECT_FALSE(abi::same_pipelines(a, b));
  EXPECT_NE(a.content_hash(), b.content_hash());
}

}  // namespace
}  // namespace vkad::codegen
