// Gather recompute at Session::end_capture (graph/gather_recompute.h, docs/graphs.md,
// "Gather recompute"): a captured step loop of grid update -> gather -> update, where the gather
// reads the grid update's output at a stencil, replays with each gather computing the cells it
// reads itself (stats().recomputed_launches counts them), and every array ends as the CPU
// evaluator's run of the launches one by one says.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ir/text.h"
#include "reference/cpu_eval.h"
#include "support/session_fixture.h"
#include "vkad.h"

namespace vkad::testing {
namespace {

using codegen::HostArg;
using codegen::HostArray;

// out[f, i, j, c] = gv[f, i, j, c] / (gm[i, j] + 1), the first component zero where i < 2.
constexpr const char* kGridOp = R"(
kernel grid_op(f: i32, gv: ndarray<f32, 4>, gm: ndarray<f32, 2>, out: ndarray<f32, 4>) {
  task cells parallel %i in [0, shape(gm, 0)), %j in [0, shape(gm, 1)) {
    %r = arg f : i32
    %c0 = const 0 : i32
    %c1 = const 1 : i32
    %m = load gm[%i, %j] : f32
    %one = const 1.0 : f32
    %m1 = add %m, %one : f32
    %v0 = load gv[%r, %i, %j, %c0] : f32
    %v1 = load gv[%r, %i, %j, %c1] : f32
    %q0 = div %v0, %m1 : f32
    %q1 = div %v1, %m1 : f32
    %two = const 2 : i32
    %wall = lt %i, %two : bool
    %zero = const 0.0 : f32
    %o0 = select %wall, %zero, %q0 : f32
    store out[%r, %i, %j, %c0], %o0
    store out[%r, %i, %j, %c1], %q1
  }
}
)";

// y[g, p] = sum over a 2 x 2 stencil at particle p's cell of both components of grid row g.
constexpr const char* kGather = R"(
kernel gather(g: i32, cell: ndarray<i32, 2>, grid: ndarray<f32, 4>, y: ndarray<f32, 2>) {
  task particles parallel %p in [0, shape(y, 1)) {
    %r = arg g : i32
    %c0 = const 0 : i32
    %c1 = const 1 : i32
    %c2 = const 2 : i32
    %bi = load cell[%p, %c0] : i32
    %bj = load cell[%p, %c1] : i32
    %acc = alloca : f32
    %z = const 0.0 : f32
    store_local %acc, %z
    for %d in [%c0, %c2) {
      %i = add %bi, %d : i32
      for %e in [%c0, %c2) {
        %j = add %bj, %e : i32
        %a = load grid[%r, %i, %j, %c0] : f32
        %b = load grid[%r, %i, %j, %c1] : f32
        %ab = add %a, %b : f32
        %old = load_local %acc : f32
        %new = add %old, %ab : f32
        store_local %acc, %new
      }
    }
    %s = load_local %acc : f32
    store y[%r, %p], %s
  }
}
)";

// gv[g + 1, i, j, c] = 0.5 gv[g, i, j, c] + 0.01 y[g, (i + j) % P]: the next step's input.
constexpr const char* kUpdate = R"(
kernel update(g: i32, y: ndarray<f32, 2>, gv: ndarray<f32, 4>) {
  task cells parallel %i in [0, shape(gv, 1)), %j in [0, shape(gv, 2)) {
    %r = arg g : i32
    %c0 = const 0 : i32
    %c1 = const 1 : i32
    %n = shape y 1 : i32
    %ij = add %i, %j : i32
    %k = mod %ij, %n : i32
    %yv = load y[%r, %k] : f32
    %w = const 0.01 : f32
    %dy = mul %yv, %w : f32
    %h = const 0.5 : f32
    %u = add %r, %c1 : i32
    %a = load gv[%r, %i, %j, %c0] : f32
    %a2 = mul %a, %h : f32
    %a3 = add %a2, %dy : f32
    store gv[%u, %i, %j, %c0], %a3
    %b = load gv[%r, %i, %j, %c1] : f32
    %b2 = mul %b, %h : f32
    %b3 = add %b2, %dy : f32
    store gv[%u, %i, %j, %c1], %b3
  }
}
)";

// y[g, p] = p: a launch between grid_op and gather that writes what the gather writes, not what
// it gathers (as a checkpointed tape's copy of the version a launch then writes in part).
constexpr const char* kPrefill = R"(
kernel prefill(g: i32, y: ndarray<f32, 2>) {
  task particles parallel %p in [0, shape(y, 1)) {
    %r = arg g : i32
    %v = cast %p : f32
    store y[%r, %p], %v
  }
}
)";

constexpr uint32_t kSteps = 6, kN = 8, kP = 9;

// Resident loops off: this 8 x 8 grid's step loop would otherwise roll into one resident kernel
// (N-d tasks roll, graph/resident.h) before gather recompute sees it.
class GatherRecomputeGraph : public ValidatedSessionTest {
  void adjust(SessionOptions& o) override { o.resident_max_range = 0; }
};

// The loop captured and replayed against the CPU's launches one by one; `prefill`: a prefill
// launch between each grid_op and its gather, which recompute looks past to grid_op.
void replays_the_loop_as_the_cpu(Session& s, bool prefill) {
  auto grid_op = s.compile(std::string_view(kGridOp));
  auto gather = s.compile(std::string_view(kGather));
  auto update = s.compile(std::string_view(kUpdate));
  auto fill = s.compile(std::string_view(kPrefill));
  ASSERT_TRUE(grid_op.ok() && gather.ok() && update.ok() && fill.ok());
  HostArray hgv(DType::kF32, {kSteps + 1, kN, kN, 2}), hgm(DType::kF32, {kN, kN});
  HostArray hout(DType::kF32, {kSteps, kN, kN, 2}), hcell(DType::kI32, {kP, 2});
  HostArray hy(DType::kF32, {kSteps, kP});
  for (size_t e = 0; e < hgv.size(); ++e) hgv.data[e] = std::sin(0.3 * static_cast<double>(e));
  for (size_t e = 0; e < hgm.size(); ++e) hgm.data[e] = 0.25 * static_cast<double>(e % 5);
  for (uint32_t p = 0; p < kP; ++p) {
    hcell.data[2 * p] = (3 * p) % (kN - 1);
    hcell.data[2 * p + 1] = (5 * p + 1) % (kN - 1);
  }
  auto to_f = [](const HostArray& h) { return std::vector<float>(h.data.begin(), h.data.end()); };
  auto gv = s.ndarray(DType::kF32, hgv.shape, "gv"), gm = s.ndarray(DType::kF32, hgm.shape, "gm");
  auto out = s.ndarray(DType::kF32, hout.shape, "out"), y = s.ndarray(DType::kF32, hy.shape, "y");
  auto cell = s.ndarray(DType::kI32, hcell.shape, "cell");
  ASSERT_TRUE(gv.ok() && gm.ok() && out.ok() && y.ok() && cell.ok());
  const std::vector<float> gv0 = to_f(hgv);
  std::vector<int32_t> cells(hcell.data.begin(), hcell.data.end());
  ASSERT_TRUE(s.upload(*gm, std::span<const float>(to_f(hgm))).ok());
  ASSERT_TRUE(s.upload(*cell, std::span<const int32_t>(cells)).ok());

  // The CPU evaluator runs the launches one by one.
  for (uint32_t g = 0; g < kSteps; ++g) {
    std::vector<std::pair<std::string, std::vector<HostArg>>> launches = {
        {kGridOp, {HostArg::of(g), HostArg::of(hgv), HostArg::of(hgm), HostArg::of(hout)}},
        {kGather, {HostArg::of(g), HostArg::of(hcell), HostArg::of(hout), HostArg::of(hy)}},
        {kUpdate, {HostArg::of(g), HostArg::of(hy), HostArg::of(hgv)}}};
    if (prefill)
      launches.insert(launches.begin() + 1, {kPrefill, {HostArg::of(g), HostArg::of(hy)}});
    for (const auto& [text, args] : launches) {
      auto k = codegen::parse(text);
      ASSERT_TRUE(k.ok());
      ASSERT_TRUE(codegen::evaluate(*k, args).ok());
    }
  }

  const uint64_t before = s.stats()->recomputed_launches;
  ASSERT_TRUE(s.begin_capture("loop").ok());
  for (uint32_t g = 0; g < kSteps; ++g) {
    const Arg gi = Arg::i32(static_cast<int32_t>(g));
    ASSERT_TRUE(
        s.launch(*grid_op, {gi, Arg::ndarray(*gv), Arg::ndarray(*gm), Arg::ndarray(*out)}).ok());
    if (prefill) {
      ASSERT_TRUE(s.launch(*fill, {gi, Arg::ndarray(*y)}).ok());
    }
    ASSERT_TRUE(
        s.launch(*gather, {gi, Arg::ndarray(*cell), Arg::ndarray(*out), Arg::ndarray(*y)}).ok());
    ASSERT_TRUE(s.launch(*update, {gi, Arg::ndarray(*y), Arg::ndarray(*gv)}).ok());
  }
  auto graph = s.end_capture();
  ASSERT_TRUE(graph.ok()) << graph.status().to_string();
  // Every gather but the first: step 0's grid update reads only what was uploaded, so it runs
  // ahead of the chain anyway and is not copied (docs/graphs.md, "Gather recompute").
  EXPECT_EQ(s.stats()->recomputed_launches - before, kSteps - 1);

  for (int rep = 0; rep < 2; ++rep) {  // the second replay starts from the first one's results
    ASSERT_TRUE(s.upload(*gv, std::span<const float>(gv0)).ok());
    ASSERT_TRUE(s.replay(*graph).ok());
    std::vector<float> got_y(hy.size()), got_out(hout.size()), got_gv(hgv.size());
    ASSERT_TRUE(s.download(*y, std::span<float>(got_y)).ok());
    ASSERT_TRUE(s.download(*out, std::span<float>(got_out)).ok());
    ASSERT_TRUE(s.download(*gv, std::span<float>(got_gv)).ok());
    // Divisions are 2.5 ulp on Vulkan and the sums a few roundings: 1e-5 relative.
    auto near = [](const std::vector<float>& got, const HostArray& want, const char* what) {
      for (size_t e = 0; e < got.size(); ++e) {
        ASSERT_NEAR(got[e], want.data[e], 1e-5 * std::max(1.0, std::fabs(want.data[e])))
            << what << "[" << e << "]";
      }
    };
    near(got_y, hy, "y");
    near(got_out, hout, "out");
    near(got_gv, hgv, "gv");
  }
}

TEST_F(GatherRecomputeGraph, AReplayedLoopComputesTheGatheredCellsAndMatchesTheCpu) {
  replays_the_loop_as_the_cpu(*s_, false);
}

TEST_F(GatherRecomputeGraph, RecomputeLooksPastALaunchWritingWhatTheGatherWrites) {
  replays_the_loop_as_the_cpu(*s_, true);
}

}  // namespace
}  // namespace vkad::testing
