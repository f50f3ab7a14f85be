// The slice pass on a device (graph/slice_pass.cpp): a checkpointed tape's versions of a
// particle ring -- each step copies the ring (x[2, n, 2]) into a new array and then reads one
// row of the copy and writes the other -- captured as a graph give what the launches one by
// one give, every version whole, while each copy runs inside its step's kernel (sliced along
// the particle axis, then fused) instead of in a dispatch of its own. Integers: exact.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/graphs.h"
#include "runtime/runtime.h"
#include "support/session_fixture.h"
#include "vkad.h"

namespace vkad::testing {
namespace {

// x[(f + 1) % 2, p, c] = (x[f % 2, p, c] * 3 + p + c + f) % 9973, c = 0, 1
constexpr const char* kStep = R"(
kernel step(f: i32, x: ndarray<i32, 3>) {
  task particles parallel %p in [0, shape(x, 1)) {
    %r = arg f : i32
    %two = const 2 : i32
    %one = const 1 : i32
    %zero = const 0 : i32
    %a = mod %r, %two : i32
    %r1 = add %r, %one : i32
    %b = mod %r1, %two : i32
    %k = const 3 : i32
    %m = const 9973 : i32
    %x0 = load x[%a, %p, %zero] : i32
    %y0 = mul %x0, %k : i32
    %s0 = add %y0, %p : i32
    %t0 = add %s0, %r : i32
    %q0 = mod %t0, %m : i32
    store x[%b, %p, %zero], %q0
    %x1 = load x[%a, %p, %one] : i32
    %y1 = mul %x1, %k : i32
    %s1 = add %y1, %p : i32
    %u1 = add %s1, %one : i32
    %t1 = add %u1, %r : i32
    %q1 = mod %t1, %m : i32
    store x[%b, %p, %one], %q1
  }
}
)";

constexpr uint32_t kParticles = 300, kSteps = 6;

struct Out {
  size_t graph_steps = 0;
  std::vector<std::vector<int32_t>> versions;  // every version's elements
};

// The steps launched one by one (`captured` false) or captured with pipeline `passes` and
// replayed twice (the start uploaded before each).
Out run(const std::string& passes, bool captured, bool* skipped) {
  Out r;
  auto s = validated_session(skipped, [&](SessionOptions& o) {
    if (!passes.empty()) o.graph_passes = passes;
  });
  if (*skipped || !s) return r;
  Result<KernelHandle> step = s->compile(std::string_view(kStep));
  EXPECT_TRUE(step.ok()) << step.status().to_string();
  if (!step.ok()) return r;
  std::vector<NdArrayHandle> v;
  for (uint32_t f = 0; f <= kSteps; ++f)
    v.push_back(*s->ndarray(DType::kI32, {2, kParticles, 2}, "x" + std::to_string(f)));
  std::vector<int32_t> x0(2 * kParticles * 2);
  for (size_t i = 0; i < x0.size(); ++i) x0[i] = static_cast<int32_t>(i * 7 % 31);
  auto record = [&] {
    for (uint32_t f = 0; f < kSteps; ++f) {
      EXPECT_TRUE(s->copy(v[f], v[f + 1]).ok());
      EXPECT_TRUE(
          s->launch(*step, {Arg::i32(static_cast<int32_t>(f)), Arg::ndarray(v[f + 1])}).ok());
    }
  };
  auto start = [&] { EXPECT_TRUE(s->upload(v[0], std::span<const int32_t>(x0)).ok()); };
  if (!captured) {
    start();
    record();
  } else {
    EXPECT_TRUE(s->begin_capture("ring versions").ok());
    record();
    Result<GraphHandle> g = s->end_capture();
    EXPECT_TRUE(g.ok()) << g.status().to_string();
    if (!g.ok()) return r;
    r.graph_steps = *s->runtime().graphs().graph_steps(*g);
    for (int rep = 0; rep < 2; ++rep) {
      start();
      EXPECT_TRUE(s->replay(*g).ok());
    }
  }
  for (NdArrayHandle a : v) {
    std::vector<int32_t> got(x0.size());
    EXPECT_TRUE(s->download(a, std::span<int32_t>(got)).ok());
    r.versions.push_back(std::move(got));
  }
  expect_no_validation_messages(*s);
  return r;
}

TEST(GraphSlice, CopiesOfARingRunInsideTheStepsThatWriteThemWithTheLaunchesResults) {
  bool skipped = false;
  const Out launched = run("", false, &skipped);
  if (skipped) GTEST_SKIP() << "SKIPPED: no Vulkan device";
  const Out plain = run("schedule, fuse", true, &skipped);
  const Out sliced = run("slice, schedule, fuse", true, &skipped);
  // Every version holds both rows: the one its step wrote and the one its copy carried over
  // (the step moves the particles: a program that did nothing would compare equal too).
  EXPECT_NE(launched.versions[kSteps][3], launched.versions[0][3]);
  const size_t row1 = 2 * kParticles + 3;  // the last step writes row 0, copies row 1 over
  EXPECT_EQ(launched.versions[kSteps - 1][row1], launched.versions[kSteps][row1]);
  EXPECT_NE(launched.versions[kSteps - 1][3], launched.versions[kSteps][3]);
  EXPECT_EQ(plain.versions, launched.versions);
  EXPECT_EQ(sliced.versions, launched.versions);
  // As captured: a copy and a step per step, each waiting for the one before. Sliced, each copy
  // is particle-wise like its step and fuses into it (and the steps with each other: every
  // access is the invocation's own particle).
  EXPECT_EQ(plain.graph_steps, 2u * kSteps);
  EXPECT_LE(sliced.graph_steps, kSteps / 2);
}

}  // namespace
}  // namespace vkad::testing
