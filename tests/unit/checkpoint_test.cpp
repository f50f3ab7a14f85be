// Segmented checkpointing (autodiff/checkpoint.h): the split forward computes what the original
// does, the segmented adjoint computes bit for bit what the every-iteration adjoint does (same
// operations in the same order on the CPU evaluator), its stacks are sized per segment, and
// make_adjoint splits only the loops it should.
#include "autodiff/checkpoint.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <spirv/unified1/spirv.hpp>

#include "api/device_target.h"
#include "autodiff/reverse_mode.h"
#include "ir/text.h"
#include "ir/verifier.h"
#include "reference/cpu_eval.h"
#include "spirv/compiler.h"
#include "spirv/spirv_emitter.h"
#include "support/ad_check.h"
#include "support/ad_fuzz.h"

namespace vkad::testing {
namespace {

using codegen::HostArg;
using codegen::HostArray;
using codegen::Kernel;
using codegen::Target;

// x[i] <- sin(x)*0.9 + 0.1 for steps in [b, e), beside a linearly carried accumulator; the loop
// index enters the arithmetic so a wrong index in a segment changes the result.
const char* kLoop =
    R"(kernel loop(b: i32, e: i32, x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = alloca : f32
    %acc = alloca : f32
    %x = load x[%i] : f32
    store_local %v, %x
    %b = arg b : i32
    %e = arg e : i32
    %c = const 0.9 : f32
    %d = const 0.1 : f32
    %h = const 0.001 : f32
    for %k in [%b, %e) {
      %a = load_local %v : f32
      %s = sin %a : f32
      %kf = cast %k : f32
      %t = mul %kf, %h : f32
      %m = mul %s, %c : f32
      %r = add %m, %d : f32
      %r2 = add %r, %t : f32
      store_local %v, %r2
      %q = load_local %acc : f32
      %q2 = add %q, %a : f32
      store_local %acc, %q2
    }
    %out = load_local %v : f32
    %acc_out = load_local %acc : f32
    %sum = add %out, %acc_out : f32
    store y[%i], %sum
  }
})";

Kernel parsed(const char* text) {
  auto k = codegen::parse(text);
  EXPECT_TRUE(k.ok()) << k.status().to_string();
  return *k;
}

codegen::AdjointOptions with_segment(uint32_t segment) {
  codegen::AdjointOptions o;
  o.checkpoint_segment = segment;
  return o;
}

// The loop's result ids of every for loop in `b`, in statement order.
void for_loops(const codegen::Block& b, std::vector<const codegen::Stmt*>* out) {
  for (const codegen::Stmt& s : b.stmts) {
    if (s.op == codegen::Op::kFor) out->push_back(&s);
    for (const codegen::Block& c : s.blocks) for_loops(c, out);
  }
}

std::vector<const codegen::Stmt*> stack_allocs(const Kernel& k) {
  std::vector<const codegen::Stmt*> out;
  for (const codegen::Stmt& s : k.tasks[0].body.stmts) {
    if (s.op == codegen::Op::kStackAlloc) out.push_back(&s);
  }
  return out;
}

HostArray ramp(size_t n, double scale) {
  HostArray a(codegen::DType::kF32, {static_cast<uint32_t>(n)});
  for (size_t i = 0; i < n; ++i)
    a.data[i] = codegen::round_to(codegen::DType::kF32, scale * static_cast<double>(i + 1));
  return a;
}

// Runs `k` (forward: b, e, x, y; adjoint: also x_grad, y_grad) and returns y, or y and x_grad.
std::vector<double> run_loop(const Kernel& k, int b, int e, bool adjoint) {
  HostArray x = ramp(5, 0.21), y(codegen::DType::kF32, {5}), xg(codegen::DType::kF32, {5}),
            yg = ramp(5, 0.1);
  std::vector<HostArg> args = {HostArg::of(b), HostArg::of(e), HostArg::of(x), HostArg::of(y)};
  if (adjoint) args.insert(args.end(), {HostArg::of(xg), HostArg::of(yg)});
  auto r = codegen::evaluate(k, args);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (r.ok()) {
    for (uint32_t f : r->error_flags)
      EXPECT_EQ(f, 0u) << "a device error flag (2: adstack overflow)";
  }
  std::vector<double> out = y.data;
  if (adjoint) out.insert(out.end(), xg.data.begin(), xg.data.end());
  return out;
}

TEST(Checkpoint, SplitForwardRunsTheSameIterations) {
  Kernel k = parsed(kLoop);
  std::vector<const codegen::Stmt*> loops;
  for_loops(k.tasks[0].body, &loops);
  ASSERT_EQ(loops.size(), 1u);
  for (uint32_t segment : {2u, 3u, 16u}) {
    // The whole tape from the least W (2K - 1) to the most (4K).
    for (uint32_t whole : {2 * segment - 1, 4 * segment}) {
      Kernel split = codegen::segment_loops(k, {{loops[0]->result, whole}}, segment);
      ASSERT_TRUE(codegen::verify(split).ok())
          << codegen::verify(split).to_string() << codegen::print(split);
      // The whole tape's loop (max_trip W), the segments' loop, its constant-trip inner loop
      // (max_trip K, exact), and the rest with max_trip K - 1.
      std::vector<const codegen::Stmt*> nested;
      for_loops(split.tasks[0].body, &nested);
      ASSERT_EQ(nested.size(), 4u) << codegen::print(split);
      EXPECT_TRUE(nested[0]->has_cap);
      EXPECT_EQ(nested[0]->cap, adstack::SizeExpr::constant(whole));
      EXPECT_FALSE(nested[1]->has_cap);
      EXPECT_TRUE(nested[2]->has_cap);
      EXPECT_EQ(nested[2]->cap, adstack::SizeExpr::constant(segment));
      EXPECT_TRUE(nested[3]->has_cap);
      EXPECT_EQ(nested[3]->cap, adstack::SizeExpr::constant(segment - 1));
      // Empty, reversed, shorter than a segment, around W and two segments, exact multiples
      // and remainders, past 4K, negative begin.
      for (auto [b, e] : std::vector<std::pair<int, int>>{{0, 0},
                                                          {5, 2},
                                                          {0, 1},
                                                          {0, 2},
                                                          {0, 16},
                                                          {0, 17},
                                                          {3, 40},
                                                          {0, 31},
                                                          {0, 32},
                                                          {5, 38},
                                                          {0, 64},
                                                          {0, 65},
                                                          {2, 99},
                                                          {-7, 9},
                                                          {-20, -3}}) {
        EXPECT_EQ(run_loop(split, b, e, false), run_loop(k, b, e, false))
            << "segment " << segment << ", W " << whole << ", [" << b << ", " << e << ")";
      }
    }
  }
}

TEST(Checkpoint, SegmentedAdjointEqualsTheEveryIterationAdjointBitForBit) {
  Kernel k = parsed(kLoop);
  auto every = codegen::make_adjoint(k, Target::host(), with_segment(0));
  ASSERT_TRUE(every.ok()) << every.status().to_string();
  for (uint32_t segment : {2u, 5u, 16u}) {
    auto seg = codegen::make_adjoint(k, Target::host(), with_segment(segment));
    ASSERT_TRUE(seg.ok()) << seg.status().to_string();
    ASSERT_NE(codegen::print(*seg), codegen::print(*every))
        << "segment " << segment << ": nothing was split";
    // (Begins >= 0: reverse mode sizes a loop's stacks assuming a scalar begin is not negative;
    // a launch that breaks that reports an adstack overflow, with or without segments.)
    for (auto [b, e] : std::vector<std::pair<int, int>>{{0, 0},
                                                        {4, 1},
                                                        {0, 1},
                                                        {0, 5},
                                                        {0, 16},
                                                        {0, 37},
                                                        {6, 11},
                                                        {3, 40},
                                                        {0, 31},
                                                        {0, 32},
                                                        {0, 64},
                                                        {0, 65},
                                                        {5, 86},
                                                        {0, 100}}) {
      EXPECT_EQ(run_loop(*seg, b, e, true), run_loop(*every, b, e, true))
          << "segment " << segment << ", [" << b << ", " << e << ")\n"
          << codegen::print(*seg);
    }
  }
}

// One checkpoint stack per carried local the replay needs, sized by the segment count
// div(e, 16) (not by e: that would keep 16 times the memory); the segment's own stack sized by
// the segment, the rest's by a segment less one, the whole tape's by W (one value per
// iteration: 4 segments).
TEST(Checkpoint, StacksAreSizedPerSegment) {
  Kernel k = parsed(kLoop);
  auto seg = codegen::make_adjoint(k, Target::host(), with_segment(16));
  ASSERT_TRUE(seg.ok()) << seg.status().to_string();
  const std::string text = codegen::print(*seg);
  std::vector<const codegen::Stmt*> stacks = stack_allocs(*seg);
  ASSERT_FALSE(stacks.empty()) << text;
  int per_segment = 0, inner = 0, rest = 0, whole = 0;
  for (const codegen::Stmt* s : stacks) {
    const std::string cap = codegen::print_size(*seg, s->cap);
    if (cap == "16")
      ++inner;
    else if (cap == "15")
      ++rest;
    else if (cap == "64")
      ++whole;
    else if (cap.find("div(") == 0)
      ++per_segment;
    else
      ADD_FAILURE() << "a stack sized " << cap << "\n" << text;
  }
  EXPECT_EQ(inner, 1) << "the sin's argument, per iteration of the segment\n" << text;
  EXPECT_EQ(rest, 1) << "the sin's argument, per iteration of the rest\n" << text;
  EXPECT_EQ(whole, 1) << "the sin's argument, per iteration of the whole tape\n" << text;
  EXPECT_GE(per_segment, 1) << text;
  // The sizes evaluate as the launch would: 37 steps from 0 are 2 full segments.
  adstack::SizeInputs in{[](uint32_t p) { return p == 1 ? int64_t{37} : int64_t{0}; },
                         [](uint32_t, uint32_t) { return int64_t{5}; }};
  for (const codegen::Stmt* s : stacks) {
    if (s->cap.kind == adstack::SizeExpr::Kind::kConst) continue;
    auto v = adstack::evaluate(s->cap, in);
    ASSERT_TRUE(v.ok());
    EXPECT_EQ(*v, 2) << codegen::print_size(*seg, s->cap);
  }
}

// What is not split: a constant trip count within the whole tape (15 <= W = 32), a loop with a
// stated max_trip, an outer loop (only the innermost is), and a loop that checkpoints nothing.
TEST(Checkpoint, SplitsOnlyLongInnermostLoopsThatCheckpoint) {
  const char* text =
      R"(kernel sel(n: i32, x: ndarray<f32, 1> grad, c: ndarray<i32, 1>, y: ndarray<f32, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = alloca : f32
    %acc = alloca : f32
    %x = load x[%i] : f32
    store_local %v, %x
    %z = const 0 : i32
    %n = arg n : i32
    %fifteen = const 15 : i32
    for %a in [%z, %fifteen) {
      %p = load_local %v : f32
      %s = sin %p : f32
      store_local %v, %s
    }
    %cnt = load c[%i] : i32
    for %b in [%z, %cnt) max_trip(64) {
      %p2 = load_local %v : f32
      %s2 = sin %p2 : f32
      store_local %v, %s2
    }
    for %o in [%z, %n) {
      for %in in [%z, %n) {
        %p3 = load_local %v : f32
        %s3 = sin %p3 : f32
        store_local %v, %s3
      }
    }
    for %l in [%z, %n) {
      %q = load_local %acc : f32
      %q2 = add %q, %x : f32
      store_local %acc, %q2
    }
    %out = load_local %v : f32
    %acc_out = load_local %acc : f32
    %sum = add %out, %acc_out : f32
    store y[%i], %sum
  }
})";
  Kernel k = parsed(text);
  auto seg = codegen::make_adjoint(k, Target::host(), with_segment(8));
  ASSERT_TRUE(seg.ok()) << seg.status().to_string();
  // make_adjoint's selection is exactly the nest's inner loop: the same adjoint as splitting
  // that loop by hand and differentiating without segments.
  std::vector<const codegen::Stmt*> fl;
  for_loops(k.tasks[0].body, &fl);
  ASSERT_EQ(fl.size(), 5u);
  Kernel only_inner =
      codegen::segment_loops(k, {{fl[3]->result, codegen::whole_tape_trips(8, 1)}}, 8);
  auto expected = codegen::make_adjoint(only_inner, Target::host(), with_segment(0));
  ASSERT_TRUE(expected.ok()) << expected.status().to_string();
  EXPECT_EQ(codegen::print(*seg), codegen::print(*expected));
  auto every = codegen::make_adjoint(k, Target::host(), with_segment(0));
  ASSERT_TRUE(every.ok());
  EXPECT_NE(codegen::print(*seg), codegen::print(*every));
}

// The loop-merge controls of a compiled task's loops, in module order.
std::vector<uint32_t> loop_controls(const std::vector<uint32_t>& words) {
  std::vector<uint32_t> out;
  for (size_t i = 5; i < words.size() && (words[i] >> 16);) {
    const uint32_t count = words[i] >> 16;
    if ((words[i] & 0xffff) == spv::OpLoopMerge && count == 4) out.push_back(words[i + 3]);
    i += count;
  }
  return out;
}

// The whole tape's loops, the segments' and the rest's carry a constant max_trip into the
// adjoint, and the emitter asks the driver to unroll them: without that NVIDIA kept the 64-step
// tape in local memory (1.4x slower on the H200). The segments' outer loop and the
// every-iteration adjoint's loops, whose trip counts are unbounded at compile time, are not
// marked.
TEST(Checkpoint, WholeTapeLoopsAskTheDriverToUnroll) {
  Kernel k = parsed(kLoop);
  auto count_unrolled = [](const Kernel& adj) {
    auto c = codegen::compile(adj, Target::host());
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    int n = 0;
    for (uint32_t control : loop_controls(c->tasks[0].spirv))
      n += (control & spv::LoopControlUnrollMask) ? 1 : 0;
    return n;
  };
  auto seg = codegen::make_adjoint(k, Target::host(), with_segment(16));
  ASSERT_TRUE(seg.ok()) << seg.status().to_string();
  int capped = 0;
  std::vector<const codegen::Stmt*> loops;
  for_loops(seg->tasks[0].body, &loops);
  for (const codegen::Stmt* l : loops) {
    if (!l->has_cap) continue;
    ++capped;
    ASSERT_EQ(l->cap.kind, adstack::SizeExpr::Kind::kConst) << codegen::print(*seg);
    EXPECT_LE(l->cap.value, codegen::kUnrollMaxTrips);
  }
  // The whole tape and the rest, each in the forward sweep and in the reverse; the segment in
  // the forward sweep, in its replay and in the reverse.
  EXPECT_EQ(capped, 7) << codegen::print(*seg);
  EXPECT_EQ(count_unrolled(*seg), 7);
  EXPECT_EQ(static_cast<int>(loops.size()), 9) << "and the segments' loop, forward and reverse";
  auto every = codegen::make_adjoint(k, Target::host(), with_segment(0));
  ASSERT_TRUE(every.ok());
  EXPECT_EQ(count_unrolled(*every), 0);
}

TEST(Checkpoint, InvalidSegmentIsAnErrorNamingTheSetting) {
  Kernel k = parsed(kLoop);
  for (uint32_t bad : {1u, codegen::kMaxCheckpointSegment + 1, UINT32_MAX}) {
    auto a = codegen::make_adjoint(k, Target::host(), with_segment(bad));
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(a.status().message().find("VKAD_ADJOINT_CHECKPOINT"), std::string::npos)
        << a.status().to_string();
    EXPECT_NE(a.status().message().find("checkpoint_segment"), std::string::npos)
        << a.status().to_string();
  }
}

// adjoint_options_from_caps: on for GPUs, off for CPU devices, the environment variable over both.
TEST(Checkpoint, DeviceTargetDefaultAndEnvironmentOverride) {
  rhi::Capabilities gpu, cpu;
  gpu.kind = rhi::DeviceKind::kDiscreteGpu;
  cpu.kind = rhi::DeviceKind::kCpu;
  const char* saved = std::getenv("VKAD_ADJOINT_CHECKPOINT");
  std::string restore = saved ? saved : "";
  unsetenv("VKAD_ADJOINT_CHECKPOINT");
  EXPECT_EQ(codegen::adjoint_options_from_caps(gpu).checkpoint_segment,
            codegen::kGpuCheckpointSegment);
  EXPECT_EQ(codegen::adjoint_options_from_caps(cpu).checkpoint_segment, 0u);
  setenv("VKAD_ADJOINT_CHECKPOINT", "off", 1);
  EXPECT_EQ(codegen::adjoint_options_from_caps(gpu).checkpoint_segment, 0u);
  setenv("VKAD_ADJOINT_CHECKPOINT", "4", 1);
  EXPECT_EQ(codegen::adjoint_options_from_caps(cpu).checkpoint_segment, 4u);
  for (const char* bad : {"four", "-4", "4x", "100000"}) {
    setenv("VKAD_ADJOINT_CHECKPOINT", bad, 1);
    auto a = codegen::make_adjoint(parsed(kLoop), codegen::target_from_caps(gpu),
                                   codegen::adjoint_options_from_caps(gpu));
    ASSERT_FALSE(a.ok()) << bad;
    EXPECT_NE(a.status().message().find("VKAD_ADJOINT_CHECKPOINT"), std::string::npos);
  }
  if (saved)
    setenv("VKAD_ADJOINT_CHECKPOINT", restore.c_str(), 1);
  else
    unsetenv("VKAD_ADJOINT_CHECKPOINT");
}

// The reverse-mode fuzzer's kernels (nested, triangular, data-dependent and while loops,
// branches, break / continue, integer locals): with short segments (many segments, every
// remainder) the adjoint computes exactly what it computes without them.
TEST(Checkpoint, FuzzKernelsAdjointsUnchanged) {
  int split = 0;
  for (uint32_t seed = 1; seed <= 300; ++seed) {
    AdFuzzCase c = random_ad_kernel(seed);
    auto every = codegen::make_adjoint(c.kernel, Target::host(), with_segment(0));
    ASSERT_TRUE(every.ok()) << "seed " << seed << ": " << every.status().to_string();
    for (uint32_t segment : {2u, 3u}) {
      auto seg = codegen::make_adjoint(c.kernel, Target::host(), with_segment(segment));
      ASSERT_TRUE(seg.ok()) << "seed " << seed << ", segment " << segment << ": "
                            << seg.status().to_string();
      if (codegen::print(*seg) == codegen::print(*every)) continue;
      ++split;
      std::vector<HostArray> seeds = random_seeds(c.kernel, c.args, seed);
      HostValues va = adjoint_args(c.kernel, c.args, seeds), vb = va;
      auto ra = codegen::evaluate(*every, va.view());
      auto rb = codegen::evaluate(*seg, vb.view());
      ASSERT_TRUE(ra.ok() && rb.ok()) << "seed " << seed;
      EXPECT_EQ(ra->error_flags, rb->error_flags) << "seed " << seed;
      for (size_t p = 0; p < va.arrays.size(); ++p) {
        EXPECT_EQ(va.arrays[p].data, vb.arrays[p].data)
            << "seed " << seed << ", segment " << segment << ", parameter " << p << "\n"
            << codegen::print(c.kernel);
      }
    }
  }
  // About a sixth of the fuzzer's kernels have an innermost loop that checkpoints with derivable
  // bounds (most of their loops nest or have data-dependent bounds).
  EXPECT_GT(split, 60) << "too few of the fuzzer's kernels had a loop to split";
}

}  // namespace
}  // namespace vkad::testing
