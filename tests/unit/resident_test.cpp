// Resident kernels (graph/resident.h) and the barrier they are built on (ir.h, kBarrier):
// where the verifier admits a barrier, what the evaluators and reverse mode say of one, and
// the rolled kernel's shape (it verifies, prints and parses back; arrays shared by identity;
// only i32 scalars step). Their results are checked on a device (tests/gpu/resident_graph_test).
#include "graph/resident.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "autodiff/reverse_mode.h"
#include "ir/text.h"
#include "ir/verifier.h"
#include "reference/cpu_eval.h"

namespace vkad::codegen {
namespace {

// A one-workgroup kernel whose body is `body` (x: f32 array, n: i32 scalar).
std::string one_group(const std::string& body, const std::string& range = "[0, 64) local_size 64") {
  return "kernel k(n: i32, x: ndarray<f32, 1>) {\n  task main parallel %i in " + range + " {\n" +
         body + "  }\n}\n";
}

Status verify_text(const std::string& text) {
  Result<Kernel> k = parse(text);
  if (!k.ok()) return k.status();
  return verify(*k);
}

TEST(Barrier, VerifiesAtTheTopAndInUniformLoopsOfOneWorkgroup) {
  EXPECT_TRUE(verify_text(one_group("    barrier\n")).ok());
  const std::string loop =
      "    %n = arg n : i32\n    %z = const 0 : i32\n"
      "    for %r in [%z, %n) {\n      %v = load x[%i] : f32\n      barrier\n"
      "      store x[%i], %v\n    }\n";
  EXPECT_TRUE(verify_text(one_group(loop)).ok()) << verify_text(one_group(loop)).to_string();
}

TEST(Barrier, IsRefusedWhereInvocationsMayDivergeOrTheWorkgroupsAreNotWhole) {
  const std::string top = "    barrier\n";
  // Whole workgroups: several are fine (the blocked stencils' tasks have one per tile).
  EXPECT_TRUE(verify_text(one_group(top, "[0, 128) local_size 64")).ok());
  for (const std::string& range :
       {std::string("[0, shape(x, 0)) local_size 64"), std::string("[0, 64)"),
        std::string("[0, 96) local_size 64"), std::string("[32, 96) local_size 64")}) {
    Status st = verify_text(one_group(top, range));
    EXPECT_FALSE(st.ok()) << range;
    EXPECT_NE(st.message().find("workgroups are not whole"), std::string::npos) << st.message();
  }
  const std::string in_if =
      "    %z = const 0 : i32\n    %c = lt %i, %z : bool\n    if %c {\n      barrier\n    }\n";
  // A bound read from memory, and a loop that may leave early, differ between invocations.
  const std::string varying_bound =
      "    %z = const 0 : i32\n    %v = load x[%i] : f32\n    %e = cast %v : i32\n"
      "    for %r in [%z, %e) {\n      barrier\n    }\n";
  const std::string by_index =
      "    %z = const 0 : i32\n    for %r in [%z, %i) {\n      barrier\n    }\n";
  const std::string breaks =
      "    %z = const 0 : i32\n    %n = arg n : i32\n    for %r in [%z, %n) {\n      barrier\n"
      "      %c = lt %r, %i : bool\n      if %c {\n        break\n      }\n    }\n";
  for (const std::string& body : {in_if, varying_bound, by_index, breaks}) {
    Status st = verify_text(one_group(body));
    EXPECT_FALSE(st.ok()) << body;
    EXPECT_NE(st.message().find("may diverge"), std::string::npos) << st.message();
  }
}

// Workgroup shared arrays (the blocked stencils' rows): typed, at the task's top, in whole
// workgroups; the text form round-trips; the reference and reverse mode refuse them.
TEST(SharedArray, VerifiesWhereABarrierMayGoAndRoundTrips) {
  const std::string body =
      "    %s = shared_alloc 64 : f32\n    %v = load x[%i] : f32\n"
      "    store_shared %s, %i, %v\n    barrier\n    %w = load_shared %s, %i : f32\n"
      "    store x[%i], %w\n";
  Result<Kernel> k = parse(one_group(body));
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  EXPECT_TRUE(verify(*k).ok()) << verify(*k).to_string();
  Result<Kernel> again = parse(print(*k));
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(print(*again), print(*k));
  HostArray x(DType::kF32, {64});
  std::vector<HostArg> args{HostArg::of(1.0), HostArg::of(x)};
  Result<EvalResult> e = evaluate(*k, args);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("shared arrays"), std::string::npos) << e.status().message();
  Result<Kernel> adj = make_adjoint(*k);
  ASSERT_FALSE(adj.ok());
  EXPECT_NE(adj.status().message().find("cannot be differentiated"), std::string::npos)
      << adj.status().message();
}

TEST(SharedArray, IsRefusedOutsideTheTopOfAWholeWorkgroupTaskOrMistyped) {
  auto refused = [](const std::string& text, const std::string& why) {
    Status st = verify_text(text);
    EXPECT_FALSE(st.ok()) << text;
    EXPECT_NE(st.message().find(why), std::string::npos) << st.message();
  };
  refused(one_group("    %s = shared_alloc 8 : f32\n", "[0, 64)"), "workgroups are not whole");
  refused(one_group("    %z = const 0 : i32\n    %c = lt %i, %z : bool\n    if %c {\n"
                    "      %s = shared_alloc 8 : f32\n    }\n"),
          "inside a branch or loop");
  refused(one_group("    %s = shared_alloc 8 : bool\n"), "numbers, not bool");
  refused(one_group("    %s = shared_alloc 8 : f32\n    %f = const 1.0 : f32\n"
                    "    %v = load_shared %s, %f : f32\n"),
          "index is i32");
  refused(one_group("    %s = shared_alloc 8 : f32\n    %v = const 1 : i32\n"
                    "    store_shared %s, %i, %v\n"),
          "holds f32");
  refused(one_group("    %v = load x[%i] : f32\n    %w = load_shared %v, %i : f32\n"),
          "expected a shared array");
  EXPECT_FALSE(parse(one_group("    %s = shared_alloc 0 : f32\n")).ok());
}

TEST(Barrier, TheReferenceAndReverseModeRefuseIt) {
  Result<Kernel> k =
      parse(one_group("    %v = load x[%i] : f32\n    barrier\n    store x[%i], %v\n"));
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  HostArray x(DType::kF32, {64});
  std::vector<HostArg> args{HostArg::of(1.0), HostArg::of(x)};
  Result<EvalResult> e = evaluate(*k, args);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("barrier"), std::string::npos) << e.status().message();
  Result<Kernel> adj = make_adjoint(*k);
  ASSERT_FALSE(adj.ok());
  EXPECT_NE(adj.status().message().find("barrier cannot be differentiated"), std::string::npos)
      << adj.status().message();
}

constexpr const char* kStep = R"(
kernel step(t: i32, c: f32, x: ndarray<f32, 2>) {
  task main parallel %i in [0, shape(x, 1)) {
    %t = arg t : i32
    %c = arg c : f32
    %v = load x[%t, %i] : f32
    %w = mul %v, %c : f32
    %one = const 1 : i32
    %u = add %t, %one : i32
    store x[%u, %i], %w
  }
}
)";

TEST(RollLaunches, TheRolledKernelVerifiesSharesArraysAndStepsI32Scalars) {
  Kernel k = *parse(kStep);
  ResidentMember a{&k, {0, 0, 7}, {1, 0, 0}, {{0, 100}}};
  ResidentMember b{&k, {0, 0, 7}, {1, 0, 0}, {{0, 100}}};
  std::vector<ResidentMember> period{a, b};
  Result<ResidentKernel> r = roll_launches(period, 5, 64, "rolled");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(verify(r->kernel).ok()) << verify(r->kernel).to_string() << print(r->kernel);
  // One array (identity 7) for both members; each member's scalars its own.
  ASSERT_EQ(r->kernel.params.size(), 5u);
  EXPECT_EQ(r->param_map[0][2], r->param_map[1][2]);
  EXPECT_NE(r->param_map[0][0], r->param_map[1][0]);
  const std::string text = print(r->kernel);
  Result<Kernel> back = parse(text);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(print(*back), text);
  // 100 elements in a workgroup of 64: two passes per launch, each launch then a barrier.
  size_t barriers = 0;
  for (size_t at = text.find("barrier"); at != std::string::npos;
       at = text.find("barrier", at + 1)) {
    ++barriers;
  }
  EXPECT_EQ(barriers, 2u);  // per member, inside the repetition loop
  EXPECT_NE(text.find("local_size 64"), std::string::npos) << text;

  ResidentMember f32_steps{&k, {0, 0, 7}, {1, 1, 0}, {{0, 100}}};
  Result<ResidentKernel> bad = roll_launches(std::vector<ResidentMember>{f32_steps}, 5, 64, "bad");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("not an i32 scalar"), std::string::npos);
}

TEST(RollLaunches, AnNdTaskIsWalkedOverItsBoxAndAMismatchedBoxIsRefused) {
  Kernel k = *parse(R"(
kernel g(t: i32, x: ndarray<f32, 3>) {
  task main parallel %i in [1, 4), %j in [0, shape(x, 2)) {
    %t = arg t : i32
    %v = load x[%t, %i, %j] : f32
    %one = const 1 : i32
    %u = add %t, %one : i32
    store x[%u, %i, %j], %v
  }
}
)");
  EXPECT_TRUE(residable(k));
  // A 3 x 5 box: 15 points, rows from 1.
  const std::vector<std::pair<int64_t, int64_t>> box{{1, 4}, {0, 5}};
  EXPECT_EQ(box_range(box), (std::pair<int64_t, int64_t>{0, 15}));
  ResidentMember m{&k, {0, 7}, {1, 0}, {box_range(box)}, {box}};
  Result<ResidentKernel> r = roll_launches(std::vector<ResidentMember>{m}, 4, 32, "rolled_nd");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(verify(r->kernel).ok()) << verify(r->kernel).to_string() << print(r->kernel);
  ASSERT_EQ(r->kernel.tasks.size(), 1u);
  EXPECT_TRUE(r->kernel.tasks[0].dims.empty());  // one 1-d task over the workgroup
  // The point's indices: (p / 5) + 1 and p mod 5.
  const std::string text = print(r->kernel);
  EXPECT_NE(text.find(" div "), std::string::npos) << text;
  EXPECT_NE(text.find(" mod "), std::string::npos) << text;
  // A box that does not match the task's dimensions, or a range other than its points.
  ResidentMember flat{&k, {0, 7}, {1, 0}, {{0, 15}}, {}};
  EXPECT_FALSE(roll_launches(std::vector<ResidentMember>{flat}, 4, 32, "bad").ok());
  ResidentMember wrong{&k, {0, 7}, {1, 0}, {{0, 14}}, {box}};
  EXPECT_FALSE(roll_launches(std::vector<ResidentMember>{wrong}, 4, 32, "bad").ok());
}

TEST(RollLaunches, SerialTasksAreWalkedByOneInvocation) {
  Kernel serial = *parse(
      "kernel s(x: ndarray<f32, 1>) {\n  task main serial %i in [0, 4) {\n    %v = load x[%i] : "
      "f32\n"
      "    store x[%i], %v\n  }\n}\n");
  EXPECT_TRUE(residable(serial));
  ResidentMember m{&serial, {7}, {0}, {{0, 4}}};
  Result<ResidentKernel> r = roll_launches(std::vector<ResidentMember>{m}, 3, 32, "rolled_serial");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(verify(r->kernel).ok()) << verify(r->kernel).to_string() << print(r->kernel);
  // Invocation 0 alone (an eq against 0, not the walk's lt against the range's end) runs a loop
  // over [0, 4) -- in order, where a grid-stride walk would hand the elements to 4 invocations.
  const std::string text = print(r->kernel);
  EXPECT_NE(text.find(" eq "), std::string::npos) << text;
  EXPECT_EQ(text.find(" lt "), std::string::npos) << text;
  EXPECT_NE(text.find("const 4 : i32"), std::string::npos) << text;
}

TEST(RollLaunches, AdstackAdjointsAreNotResidable) {
  EXPECT_TRUE(residable(*parse(kStep)));
  // A loop whose trip count is data-dependent gets an adstack in its adjoint.
  Kernel loop = *parse(R"(
kernel l(n: i32, x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %n = arg n : i32
    %z = const 0 : i32
    %a = alloca : f32
    %v = load x[%i] : f32
    store_local %a, %v
    for %j in [%z, %n) max_trip(8) {
      %b = load_local %a : f32
      %s = sin %b : f32
      store_local %a, %s
    }
    %r = load_local %a : f32
    store y[%i], %r
  }
}
)");
  Result<Kernel> adj = make_adjoint(loop);
  ASSERT_TRUE(adj.ok()) << adj.status().to_string();
  EXPECT_FALSE(residable(*adj));
}

}  // namespace
}  // namespace vkad::codegen
