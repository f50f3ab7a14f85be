// Gather recompute (graph/gather_recompute.h): a consumer that gathers a producer's element-wise
// output computes it itself. On the CPU evaluator the rewritten consumer, run on the
// producer's inputs alone (its output array holding garbage), must give exactly what the
// producer followed by the consumer gives; and pairs that do not qualify are refused.
#include "graph/gather_recompute.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ir/text.h"
#include "ir/verifier.h"
#include "reference/cpu_eval.h"

namespace vkad::testing {
namespace {

using codegen::DType;
using codegen::GatherLaunch;
using codegen::HostArg;
using codegen::HostArray;
using codegen::Kernel;

Kernel parse(const std::string& text) {
  auto k = codegen::parse(text);
  EXPECT_TRUE(k.ok()) << k.status().to_string();
  return k.ok() ? *k : Kernel{};
}

// A grid update: per cell of row f, two velocity components divided by the mass, the first
// zeroed next to the wall i < 2 (it reads its own index), written at row f.
const char* kGridOp = R"(
kernel grid_op(f: i32, gv: ndarray<f32, 4> readonly, gm: ndarray<f32, 3> readonly, out: ndarray<f32, 4>) {
  task cells parallel %i in [0, shape(gm, 1)), %j in [0, shape(gm, 2)) {
    %r = arg f : i32
    %c0 = const 0 : i32
    %c1 = const 1 : i32
    %m = load gm[%r, %i, %j] : f32
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

// A gather: per particle, a weighted sum of both components over a 2 x 2 stencil at the
// particle's cell of row g, inside a loop (the copies go where the loads are).
const char* kGather = R"(
kernel gather(g: i32, cell: ndarray<i32, 2> readonly, grid: ndarray<f32, 4> readonly, y: ndarray<f32, 1>) {
  task particles parallel %p in [0, shape(y, 0)) {
    %r = arg g : i32
    %c0 = const 0 : i32
    %c1 = const 1 : i32
    %bi = load cell[%p, %c0] : i32
    %bj = load cell[%p, %c1] : i32
    %acc = alloca : f32
    %z = const 0.0 : f32
    store_local %acc, %z
    %c2 = const 2 : i32
    for %d in [%c0, %c2) {
      %i = add %bi, %d : i32
      %a = load grid[%r, %i, %bj, %c0] : f32
      %b = load grid[%r, %i, %bj, %c1] : f32
      %j = add %bj, %c1 : i32
      %e = load grid[%r, %i, %j, %c0] : f32
      %ab = add %a, %b : f32
      %abe = add %ab, %e : f32
      %old = load_local %acc : f32
      %new = add %old, %abe : f32
      store_local %acc, %new
    }
    %s = load_local %acc : f32
    store y[%p], %s
  }
}
)";

constexpr uint32_t kRows = 3, kN = 6, kParticles = 5;

struct World {
  HostArray gv{DType::kF32, {kRows, kN, kN, 2}}, gm{DType::kF32, {kRows, kN, kN}};
  HostArray out{DType::kF32, {kRows, kN, kN, 2}}, cell{DType::kI32, {kParticles, 2}};
  HostArray y{DType::kF32, {kParticles}};
  World() {
    for (size_t e = 0; e < gv.size(); ++e) gv.data[e] = std::sin(0.37 * static_cast<double>(e));
    for (size_t e = 0; e < gm.size(); ++e) gm.data[e] = 0.5 + 0.1 * static_cast<double>(e % 7);
    for (size_t e = 0; e < out.size(); ++e) out.data[e] = 1e6;  // garbage: must not be read
    const int cells[kParticles][2] = {{0, 0}, {1, 3}, {4, 4}, {2, 1}, {3, 2}};
    for (uint32_t p = 0; p < kParticles; ++p) {
      cell.data[2 * p] = cells[p][0];
      cell.data[2 * p + 1] = cells[p][1];
    }
  }
};

// What Session passes for a launch: arrays by identity, extents, evaluated uniform values.
GatherLaunch describe(const Kernel& k, std::vector<uint64_t> ids,
                      std::vector<std::vector<uint32_t>> extents, std::vector<int64_t> scalars) {
  GatherLaunch l;
  l.kernel = &k;
  l.arrays = std::move(ids);
  l.extents = std::move(extents);
  codegen::UniformInputs in{
      [scalars](uint32_t p) -> int64_t { return p < scalars.size() ? scalars[p] : 0; },
      [ext = l.extents](uint32_t p, uint32_t d) -> std::optional<uint32_t> {
        if (p >= ext.size() || d >= ext[p].size()) return std::nullopt;
        return ext[p][d];
      }};
  l.uniform = codegen::launch_uniform_words(k, in);
  return l;
}

GatherLaunch grid_op_launch(const Kernel& k, int64_t row) {
  GatherLaunch l = describe(k, {0, 1, 2, 3},
                            {{}, {kRows, kN, kN, 2}, {kRows, kN, kN}, {kRows, kN, kN, 2}}, {row});
  l.ranges = {{0, kN}, {0, kN}};
  return l;
}

GatherLaunch gather_launch(const Kernel& k, int64_t row) {
  return describe(k, {0, 4, 3, 5}, {{}, {kParticles, 2}, {kRows, kN, kN, 2}, {kParticles}}, {row});
}

// The producer, then the consumer, both at row 1, on `w`: the launches one by one.
void run_original(const Kernel& grid_op, const Kernel& gather, World& w) {
  ASSERT_TRUE(
      codegen::evaluate(grid_op, std::vector<HostArg>{HostArg::of(1), HostArg::of(w.gv),
                                                      HostArg::of(w.gm), HostArg::of(w.out)})
          .ok());
  ASSERT_TRUE(codegen::evaluate(gather, std::vector<HostArg>{HostArg::of(1), HostArg::of(w.cell),
                                                             HostArg::of(w.out), HostArg::of(w.y)})
                  .ok());
}

// The rewritten consumer on `w`: gather's arguments, then the producer's f (row 1), gv and gm,
// as producer_param says.
void run_rewritten(const Kernel& k, World& w) {
  std::vector<HostArg> args = {HostArg::of(1),   HostArg::of(w.cell), HostArg::of(w.out),
                               HostArg::of(w.y), HostArg::of(1),      HostArg::of(w.gv),
                               HostArg::of(w.gm)};
  auto ev = codegen::evaluate(k, args);
  ASSERT_TRUE(ev.ok()) << ev.status().to_string();
}

TEST(GatherRecompute, TheRewrittenGatherEqualsProducerThenConsumerWithoutReadingTheOutput) {
  Kernel grid_op = parse(kGridOp), gather = parse(kGather);
  ASSERT_TRUE(codegen::recompute_producer(grid_op));
  auto r = codegen::recompute_gathers(gather_launch(gather, 1), grid_op_launch(grid_op, 1), {});
  ASSERT_TRUE(r.has_value());
  ASSERT_TRUE(codegen::verify(r->kernel).ok()) << codegen::print(r->kernel);
  // Added: gv and gm (gather does not bind them) and the scalar f, in the producer's order.
  ASSERT_EQ(r->producer_param, (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_EQ(r->kernel.params.size(), gather.params.size() + 3);
  // No load of the producer's output is left.
  EXPECT_EQ(codegen::print(r->kernel).find("load grid["), std::string::npos)
      << codegen::print(r->kernel);

  World want, got;
  run_original(grid_op, gather, want);
  run_rewritten(r->kernel, got);
  for (uint32_t p = 0; p < kParticles; ++p) {
    EXPECT_EQ(got.y.data[p], want.y.data[p]) << "particle " << p;
    EXPECT_LT(std::fabs(got.y.data[p]), 1e5) << "read the garbage output";
  }
}

// Two loads of one cell whose indices the consumer computed twice (a builder writes
// `base + offset` per access): one copy of the producer's body serves both.
const char* kGatherTwice = R"(
kernel gather2(g: i32, cell: ndarray<i32, 2> readonly, grid: ndarray<f32, 4> readonly, y: ndarray<f32, 1>) {
  task particles parallel %p in [0, shape(y, 0)) {
    %r = arg g : i32
    %c0 = const 0 : i32
    %c1 = const 1 : i32
    %bi = load cell[%p, %c0] : i32
    %bj = load cell[%p, %c1] : i32
    %one = const 1 : i32
    %i = add %bi, %one : i32
    %a = load grid[%r, %i, %bj, %c0] : f32
    %r2 = arg g : i32
    %one2 = const 1 : i32
    %i2 = add %bi, %one2 : i32
    %k1 = const 1 : i32
    %b = load grid[%r2, %i2, %bj, %k1] : f32
    %two = const 2 : i32
    %i3 = add %bi, %two : i32
    %e = load grid[%r, %i3, %bj, %c0] : f32
    %ab = add %a, %b : f32
    %abe = add %ab, %e : f32
    store y[%p], %abe
  }
}
)";

TEST(GatherRecompute, LoadsOfOneCellShareOneCopyWhateverComputedTheirIndices) {
  Kernel grid_op = parse(kGridOp), gather = parse(kGatherTwice);
  auto r = codegen::recompute_gathers(gather_launch(gather, 1), grid_op_launch(grid_op, 1), {});
  ASSERT_TRUE(r.has_value());
  ASSERT_TRUE(codegen::verify(r->kernel).ok()) << codegen::print(r->kernel);
  // Two cells (bi + 1 twice, bi + 2): two copies, each loading the mass once.
  const std::string text = codegen::print(r->kernel);
  size_t copies = 0;
  for (size_t at = text.find("load r_gm["); at != std::string::npos;
       at = text.find("load r_gm[", at + 1))
    ++copies;
  EXPECT_EQ(copies, 2u) << text;
  World want, got;
  for (uint32_t p = 0; p < kParticles; ++p) {  // bi + 2 within the grid
    want.cell.data[2 * p] = got.cell.data[2 * p] = static_cast<double>(p % 4);
  }
  run_original(grid_op, gather, want);
  run_rewritten(r->kernel, got);
  for (uint32_t p = 0; p < kParticles; ++p) {
    EXPECT_EQ(got.y.data[p], want.y.data[p]) << "particle " << p;
    EXPECT_LT(std::fabs(got.y.data[p]), 1e5) << "read the garbage output";
  }
}

TEST(GatherRecompute, AtomicOutputsCountOnlyWhereKnownZero) {
  const std::string adds = [] {
    std::string t = kGridOp;
    for (const char* c : {"%c0], %o0", "%c1], %q1"}) {
      const size_t at = t.find(std::string("store out[%r, %i, %j, ") + c);
      t.replace(at, 5, "atomic_add");
    }
    return t;
  }();
  Kernel grid_op = parse(adds), gather = parse(kGather);
  const GatherLaunch c = gather_launch(gather, 1), p = grid_op_launch(grid_op, 1);
  EXPECT_FALSE(codegen::recompute_gathers(c, p, {}).has_value());
  const uint64_t out_id = 3;
  auto r = codegen::recompute_gathers(c, p, std::vector<uint64_t>{out_id});
  ASSERT_TRUE(r.has_value());
  World want, got;
  for (size_t e = 0; e < want.out.size(); ++e) want.out.data[e] = 0;  // the fill before
  run_original(grid_op, gather, want);
  run_rewritten(r->kernel, got);
  for (uint32_t p = 0; p < kParticles; ++p) EXPECT_EQ(got.y.data[p], want.y.data[p]);
}

TEST(GatherRecompute, PairsThatDoNotQualifyAreLeftAlone) {
  Kernel grid_op = parse(kGridOp), gather = parse(kGather);
  const GatherLaunch producer = grid_op_launch(grid_op, 1);
  // The consumer reads another row than the producer wrote.
  EXPECT_FALSE(codegen::recompute_gathers(gather_launch(gather, 2), producer, {}).has_value());
  // The producer's range does not cover the output's extent.
  GatherLaunch partial = producer;
  partial.ranges[1].second = kN - 1;
  EXPECT_FALSE(codegen::recompute_gathers(gather_launch(gather, 1), partial, {}).has_value());
  // The consumer writes an array the producer reads (gm bound as gather's output y).
  Kernel writer = parse(R"(
kernel writer(g: i32, cell: ndarray<i32, 2> readonly, grid: ndarray<f32, 4> readonly, m: ndarray<f32, 3>) {
  task particles parallel %p in [0, 4) {
    %r = arg g : i32
    %c0 = const 0 : i32
    %x = load grid[%r, %c0, %c0, %c0] : f32
    store m[%r, %c0, %c0], %x
  }
}
)");
  GatherLaunch w = describe(writer, {0, 4, 3, 2},
                            {{}, {kParticles, 2}, {kRows, kN, kN, 2}, {kRows, kN, kN}}, {1});
  EXPECT_FALSE(codegen::recompute_gathers(w, producer, {}).has_value());
  // A producer that reads what it writes, or has a branch, is not a function of its inputs.
  std::string rmw = kGridOp;
  rmw.replace(rmw.find("load gm[%r"), 8, "load out[");
  rmw.replace(rmw.find("%i, %j] : f32"), 13, "%i, %j, %c0] : f32");
  Kernel self_reading = parse(rmw);
  GatherLaunch sr = producer;
  sr.kernel = &self_reading;
  sr.uniform = describe(self_reading, {0, 1, 2, 3},
                        {{}, {kRows, kN, kN, 2}, {kRows, kN, kN}, {kRows, kN, kN, 2}}, {1})
                   .uniform;
  EXPECT_FALSE(codegen::recompute_gathers(gather_launch(gather, 1), sr, {}).has_value());
  EXPECT_FALSE(codegen::recompute_producer(gather));  // a loop in the body
}

}  // namespace
}  // namespace vkad::testing
