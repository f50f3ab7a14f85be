// The rename and prune passes on a device (graph/rename_pass.cpp): DiffTaichi's one grid,
// cleared, scattered into and gathered from at every step, captured as a graph, gives what its
// launches one by one give -- every row of the particles, the grid as the last step left it,
// the cell kernel's output -- while the grid's lifetimes live in a ring of buffers (so a
// step's gather fuses with the next step's scatter) and the cell kernel's launches whose
// output the next one overwrites unread are left out. Integers: atomic adds in any order give
// the same sums, so the comparisons are exact.
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

// grid[p % cells] += (x[f, p], 1)
constexpr const char* kScatter = R"(
kernel scatter(f: i32, x: ndarray<i32, 2>, grid: ndarray<i32, 2>) {
  task particles parallel %p in [0, shape(x, 1)) {
    %r = arg f : i32
    %v = load x[%r, %p] : i32
    %c = shape grid 0 : i32
    %i = mod %p, %c : i32
    %z = const 0 : i32
    %o = const 1 : i32
    atomic_add grid[%i, %z], %v
    atomic_add grid[%i, %o], %o
  }
}
)";

// x[f + 1, p] = (x[f, p] + add + grid[p % cells, 0] * grid[p % cells, 1]) % 9973
constexpr const char* kGather = R"(
kernel gather(f: i32, x: ndarray<i32, 2>, grid: ndarray<i32, 2>, add: i32) {
  task particles parallel %p in [0, shape(x, 1)) {
    %r = arg f : i32
    %o = const 1 : i32
    %w = add %r, %o : i32
    %c = shape grid 0 : i32
    %i = mod %p, %c : i32
    %z = const 0 : i32
    %g = load grid[%i, %z] : i32
    %n = load grid[%i, %o] : i32
    %gn = mul %g, %n : i32
    %v = load x[%r, %p] : i32
    %a = arg add : i32
    %va = add %v, %a : i32
    %s = add %va, %gn : i32
    %m = const 9973 : i32
    %q = mod %s, %m : i32
    store x[%w, %p], %q
  }
}
)";

// out[i, j] = grid[i, j] * 3 + j: stores every element of `out`, reads nothing of it.
constexpr const char* kCells = R"(
kernel cells(grid: ndarray<i32, 2>, out: ndarray<i32, 2>) {
  task cells parallel %i in [0, shape(out, 0)), %j in [0, shape(out, 1)) {
    %v = load grid[%i, %j] : i32
    %k = const 3 : i32
    %m = mul %v, %k : i32
    %s = add %m, %j : i32
    store out[%i, %j], %s
  }
}
)";

constexpr uint32_t kParticles = 200, kCellsN = 16;

struct Result3 {
  size_t graph_steps = 0;
  uint64_t rolled = 0;
  std::vector<int32_t> x, grid, out;
};

struct Options {
  uint32_t steps = 9;
  // `cells` reads the grid the caller uploaded before the first fill (lifetime 0).
  bool read_first = false;
  // The second replay updates step `update_step`'s gather's `add` to 5 (launched: that step is
  // launched with 5); -1: no update.
  int update_step = -1;
};

// The program launched one by one (`passes` empty) or captured with the pipeline `passes` and
// replayed twice, the start state uploaded before each; what the last run leaves.
Result3 run(const std::string& passes, bool captured, bool* skipped, const Options& o = {}) {
  const uint32_t kSteps = o.steps;
  Result3 r;
  auto s = validated_session(skipped, [&](SessionOptions& o) {
    if (!passes.empty()) o.graph_passes = passes;
  });
  if (*skipped || !s) return r;
  Result<KernelHandle> scatter = s->compile(std::string_view(kScatter));
  Result<KernelHandle> gather = s->compile(std::string_view(kGather));
  Result<KernelHandle> cells = s->compile(std::string_view(kCells));
  EXPECT_TRUE(scatter.ok() && gather.ok() && cells.ok());
  if (!scatter.ok() || !gather.ok() || !cells.ok()) return r;
  NdArrayHandle x = *s->ndarray(DType::kI32, {kSteps + 1, kParticles}, "x");
  NdArrayHandle grid = *s->ndarray(DType::kI32, {kCellsN, 2}, "grid");
  NdArrayHandle out = *s->ndarray(DType::kI32, {kCellsN, 2}, "out");
  std::vector<int32_t> x0((kSteps + 1) * kParticles, 0), grid0(kCellsN * 2);
  for (uint32_t p = 0; p < kParticles; ++p) x0[p] = static_cast<int32_t>(p * 7 % 23);
  for (uint32_t c = 0; c < grid0.size(); ++c) grid0[c] = static_cast<int32_t>(c * 5 + 1);
  // Per step: its gather's launch index in capture order, counting every launch.
  std::vector<uint32_t> gather_index;
  auto record = [&](int updated) {
    uint32_t launches = 0;
    if (o.read_first) {
      EXPECT_TRUE(s->launch(*cells, {Arg::ndarray(grid), Arg::ndarray(out)}).ok());
      ++launches;
    }
    for (uint32_t f = 0; f < kSteps; ++f) {
      EXPECT_TRUE(s->zero(grid).ok());
      const int32_t add = static_cast<int32_t>(f) == updated ? 5 : 1;
      const Arg a[] = {Arg::i32(static_cast<int32_t>(f)), Arg::ndarray(x), Arg::ndarray(grid),
                       Arg::i32(add)};
      EXPECT_TRUE(s->launch(*scatter, std::span<const Arg>(a, 3)).ok());
      EXPECT_TRUE(s->launch(*gather, a).ok());
      gather_index.push_back(launches + 1);
      EXPECT_TRUE(s->launch(*cells, {Arg::ndarray(grid), Arg::ndarray(out)}).ok());
      launches += 3;
    }
  };
  auto start = [&] {
    EXPECT_TRUE(s->upload(x, std::span<const int32_t>(x0)).ok());
    EXPECT_TRUE(s->upload(grid, std::span<const int32_t>(grid0)).ok());
  };
  if (!captured) {
    start();
    record(o.update_step);
  } else {
    EXPECT_TRUE(s->begin_capture("one grid").ok());
    record(-1);
    Result<GraphHandle> g = s->end_capture();
    EXPECT_TRUE(g.ok()) << g.status().to_string();
    if (!g.ok()) return r;
    r.graph_steps = *s->runtime().graphs().graph_steps(*g);
    for (int rep = 0; rep < 2; ++rep) {
      start();
      std::vector<GraphUpdate> u;
      if (rep == 1 && o.update_step >= 0)
        u.push_back({gather_index[static_cast<size_t>(o.update_step)], 3, Arg::i32(5)});
      EXPECT_TRUE(s->replay(*g, u).ok());
    }
    Result<SessionStats> st = s->stats();
    if (st.ok()) r.rolled = st->rolled_launches;
  }
  r.x.resize(x0.size());
  r.grid.resize(kCellsN * 2);
  r.out.resize(kCellsN * 2);
  EXPECT_TRUE(s->download(x, std::span<int32_t>(r.x)).ok());
  EXPECT_TRUE(s->download(grid, std::span<int32_t>(r.grid)).ok());
  EXPECT_TRUE(s->download(out, std::span<int32_t>(r.out)).ok());
  expect_no_validation_messages(*s);
  return r;
}

TEST(GraphRename, AGridClearedEveryStepGivesItsLaunchesResultsFromFewerSteps) {
  const uint32_t kSteps = Options{}.steps;
  bool skipped = false;
  const Result3 launched = run("", false, &skipped);
  if (skipped) GTEST_SKIP() << "SKIPPED: no Vulkan device";
  const Result3 plain = run("schedule, fuse", true, &skipped);
  const Result3 renamed = run("rename, schedule, fuse", true, &skipped);
  const Result3 all = run("", true, &skipped);  // the default pipeline, prune included
  const Result3 side = run("schedule, fuse{side=4}", true, &skipped);
  // The launches move the particles: a program that did nothing would compare equal too.
  EXPECT_NE(launched.x[kSteps * kParticles + 3], launched.x[3]);
  for (const Result3* r : {&plain, &renamed, &all, &side}) {
    EXPECT_EQ(r->x, launched.x);
    EXPECT_EQ(r->grid, launched.grid) << "the caller's grid holds the last step's";
    EXPECT_EQ(r->out, launched.out);
  }
  // Captured: kSteps x (a fill and three launches). Renamed, each step's gather runs in one
  // dispatch with the next step's scatter (the fills become launches beside them); pruned, only
  // the last `cells` launch is left (without prune they fuse a few to a dispatch). Side by side,
  // each step's gather and `cells` (a launch over the grid's cells: another range, sharing
  // nothing written) run in one dispatch, on the device.
  EXPECT_EQ(plain.graph_steps, 4u * kSteps);
  EXPECT_LT(renamed.graph_steps, plain.graph_steps - kSteps);
  EXPECT_LT(all.graph_steps, renamed.graph_steps);
  EXPECT_EQ(side.graph_steps, 3u * kSteps);
}

TEST(GraphRename, LifetimesBeforeTheFirstFillAndAnUpdatedLaunchKeepTheirResults) {
  // Seven fills (not a multiple of the ring's three), `cells` reading the caller's grid before
  // the first fill, and an update of step 4's gather's scalar in the second replay.
  Options o;
  o.steps = 7;
  o.read_first = true;
  o.update_step = 4;
  bool skipped = false;
  const Result3 launched = run("", false, &skipped, o);
  if (skipped) GTEST_SKIP() << "SKIPPED: no Vulkan device";
  const Result3 plain = run("none", true, &skipped, o);
  const Result3 all = run("", true, &skipped, o);
  for (const Result3* r : {&plain, &all}) {
    EXPECT_EQ(r->x, launched.x);
    EXPECT_EQ(r->grid, launched.grid);
    EXPECT_EQ(r->out, launched.out);
  }
  EXPECT_LT(all.graph_steps, plain.graph_steps);
  // A rolled launch is one a resident kernel runs; the launches prune leaves out are not.
  EXPECT_LE(all.rolled, 4u * o.steps);
}

}  // namespace
}  // namespace vkad::testing
