// vkad::Tape refuses a launch that overwrites what an earlier recorded launch read (or wrote
// through a differentiated parameter) -- api/tape_hazards.h -- and accepts the legal idioms:
// an array per step, DiffTaichi's time axis (read row f, write row f + 1), arrays only read, a
// loss accumulated with atomic_add. On a real device with validation on.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "runtime/runtime.h"
#include "support/session_fixture.h"
#include "vkad.h"

namespace vkad::testing {
namespace {

class TapeHazardsTest : public ValidatedSessionTest {
 protected:
  Differentiated diff(const char* ir) {
    auto d = s_->differentiate(ir);
    EXPECT_TRUE(d.ok()) << d.status().to_string();
    return d.ok() ? *d : Differentiated{};
  }
  NdArrayHandle make(std::vector<uint32_t> shape, const char* name) {
    auto h = s_->ndarray(DType::kF32, std::move(shape), name);
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    return h.ok() ? *h : NdArrayHandle{};
  }
  std::vector<float> read(NdArrayHandle h, size_t n) {
    std::vector<float> out(n);
    Status st = s_->download(h, std::span<float>(out));
    EXPECT_TRUE(st.ok()) << st.to_string();
    return out;
  }
  uint64_t launches() {
    auto r = s_->stats();
    EXPECT_TRUE(r.ok());
    return r.ok() ? r->launches : 0;
  }
  // `st` is the refusal: kInvalidArgument, and the message holds every piece of `parts`.
  static void expect_refused(const Status& st, const std::vector<std::string>& parts) {
    ASSERT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.to_string();
    for (const std::string& p : parts) {
      EXPECT_NE(st.message().find(p), std::string::npos) << "missing '" << p << "' in\n"
                                                         << st.message();
    }
  }
  std::string id(NdArrayHandle a) { return runtime::handle_string(a.id); }
};

constexpr uint32_t kN = 32;

// grid[i] = x[i] (a P2G stand-in: writes the whole grid).
constexpr const char* kScatter = R"(
kernel p2g(x: ndarray<f32, 1> grad, grid: ndarray<f32, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = load x[%i] : f32
    %s = sin %v : f32
    store grid[%i], %s
  }
})";
// y[i] = 2 grid[i] (a G2P stand-in: reads the grid).
constexpr const char* kGather = R"(
kernel g2p(grid: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {
  task main parallel %i in [0, shape(grid, 0)) {
    %v = load grid[%i] : f32
    %two = const 2.0 : f32
    %w = mul %v, %two : f32
    store y[%i], %w
  }
})";
// x[f + 1, p] = sin(x[f, p]) 0.9 + 0.1: DiffTaichi's time axis.
constexpr const char* kTimeStep = R"(
kernel time_step(x: ndarray<f32, 2> grad, f: i32) {
  task main parallel %p in [0, shape(x, 1)) {
    %f = arg f : i32
    %one = const 1 : i32
    %f1 = add %f, %one : i32
    %xv = load x[%f, %p] : f32
    %s = sin %xv : f32
    %a = const 0.9 : f32
    %b = const 0.1 : f32
    %m = mul %s, %a : f32
    %n = add %m, %b : f32
    store x[%f1, %p], %n
  }
})";
// y[p] = x[f, p]
constexpr const char* kTakeRow = R"(
kernel take_row(x: ndarray<f32, 2> grad, y: ndarray<f32, 1> grad, f: i32) {
  task main parallel %p in [0, shape(y, 0)) {
    %f = arg f : i32
    %v = load x[%f, %p] : f32
    store y[%p], %v
  }
})";
// x[g, p] = z[p]
constexpr const char* kPutRow = R"(
kernel put_row(x: ndarray<f32, 2> grad, z: ndarray<f32, 1> grad, g: i32) {
  task main parallel %p in [0, shape(z, 0)) {
    %g = arg g : i32
    %v = load z[%p] : f32
    store x[%g, %p], %v
  }
})";
// x[r, p] = z[p] for every row r (a loop index: rows not launch-uniform).
constexpr const char* kPutAllRows = R"(
kernel put_all_rows(x: ndarray<f32, 2> grad, z: ndarray<f32, 1> grad) {
  task main parallel %p in [0, shape(z, 0)) {
    %zero = const 0 : i32
    %rows = shape x 0 : i32
    %v = load z[%p] : f32
    for %r in [%zero, %rows) {
      store x[%r, %p], %v
    }
  }
})";
// loss[0] += sum x[i]^2, with atomic_add.
constexpr const char* kLoss = R"(
kernel sq_loss(x: ndarray<f32, 1> grad, loss: ndarray<f32, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = load x[%i] : f32
    %q = mul %v, %v : f32
    %zero = const 0 : i32
    atomic_add loss[%zero], %q
  }
})";

TEST_F(TapeHazardsTest, ReusedGridIsRefusedNamingBothLaunchesAndTheArray) {
  Differentiated p2g = diff(kScatter), g2p = diff(kGather);
  NdArrayHandle x0 = make({kN}, "x0"), x1 = make({kN}, "x1"), grid = make({kN}, "grid");
  NdArrayHandle y0 = make({kN}, "y0");
  for (NdArrayHandle a : {x0, x1}) ASSERT_TRUE(s_->fill(a, 0.5).ok());
  Tape tape(*s_);
  ASSERT_TRUE(tape.launch(p2g, {Arg::ndarray(x0), Arg::ndarray(grid)}).ok());
  ASSERT_TRUE(tape.launch(g2p, {Arg::ndarray(grid), Arg::ndarray(y0)}).ok());
  const uint64_t before = launches();
  Status st = tape.launch(p2g, {Arg::ndarray(x1), Arg::ndarray(grid)});
  expect_refused(st, {"tape.launch: launch 2 ('p2g') writes ndarray 'grid' (" + id(grid) +
                          ") (parameter 'grid') at rows that depend on the thread, a loop or "
                          "data, which launch 1 ('g2p') read (parameter 'grid')",
                      "Backward runs launch 1's adjoint", "its gradients would be wrong",
                      "Keep one row or one array per step", "\"Tapes and memory\"",
                      "Tape::set_memory_budget", "Nothing was launched or recorded"});
  EXPECT_EQ(tape.launches(), 2u) << "the refused launch is not recorded";
  EXPECT_EQ(launches(), before) << "nor launched";
  // A new recording forgets what the old one read.
  tape.reset();
  EXPECT_TRUE(tape.launch(p2g, {Arg::ndarray(x1), Arg::ndarray(grid)}).ok());
}

TEST_F(TapeHazardsTest, OneArrayPerStepAndReadOnlyWeightsAreAccepted) {
  Differentiated p2g = diff(kScatter), g2p = diff(kGather);
  std::vector<NdArrayHandle> x, grid;
  for (int k = 0; k < 4; ++k) {
    x.push_back(make({kN}, "x"));
    grid.push_back(make({kN}, "grid"));
  }
  ASSERT_TRUE(s_->fill(x[0], 0.25).ok());
  Tape tape(*s_);
  for (int k = 0; k + 1 < 4; ++k) {
    ASSERT_TRUE(tape.launch(p2g, {Arg::ndarray(x[k]), Arg::ndarray(grid[k])}).ok()) << k;
    ASSERT_TRUE(tape.launch(g2p, {Arg::ndarray(grid[k]), Arg::ndarray(x[k + 1])}).ok()) << k;
  }
  ASSERT_TRUE(tape.backward({TapeSeed::of_value(x[3], 1.0)}).ok());
  // x3 = 2 sin(2 sin(2 sin(x0))): the chain rule in double.
  double v = 0.25, g = 1;
  for (int k = 0; k < 3; ++k) {
    g *= 2 * std::cos(v);
    v = 2 * std::sin(v);
  }
  auto g0 = tape.grad(x[0]);
  ASSERT_TRUE(g0.ok());
  for (float got : read(*g0, kN)) EXPECT_NEAR(got, g, 2e-2 * std::fabs(g));
}

TEST_F(TapeHazardsTest, TimeAxisOverManyLaunchesIsAcceptedAndItsGradientMatches) {
  Differentiated step = diff(kTimeStep);
  constexpr int kSteps = 200;
  NdArrayHandle x = make({kSteps + 1, kN}, "x");
  std::vector<float> host((kSteps + 1) * kN, 0.0f);
  for (uint32_t p = 0; p < kN; ++p) host[p] = -1.5f + 3.0f * static_cast<float>(p) / kN;
  ASSERT_TRUE(s_->upload(x, std::span<const float>(host)).ok());
  Tape tape(*s_);
  for (int f = 0; f < kSteps; ++f) {
    Status st = tape.launch(step, {Arg::ndarray(x), Arg::i32(f)});
    ASSERT_TRUE(st.ok()) << "step " << f << ": " << st.to_string();
  }
  // Seed d loss / d x[kSteps, p] = 1.
  std::vector<float> seed((kSteps + 1) * kN, 0.0f);
  for (uint32_t p = 0; p < kN; ++p) seed[kSteps * kN + p] = 1.0f;
  ASSERT_TRUE(tape.backward({TapeSeed::of_data(x, std::span<const float>(seed))}).ok());
  auto g = tape.grad(x);
  ASSERT_TRUE(g.ok());
  const std::vector<float> got = read(*g, (kSteps + 1) * kN);
  for (uint32_t p = 0; p < kN; ++p) {
    double v = host[p], want = 1;
    for (int f = 0; f < kSteps; ++f) {
      want *= 0.9 * std::cos(v);
      v = std::sin(v) * 0.9 + 0.1;
    }
    // The product of 200 factors below 0.9 is tiny: compare absolutely and in log terms.
    EXPECT_NEAR(got[p], want, 1e-6 + 1e-2 * std::fabs(want)) << "element " << p;
  }
  // Stepping back over a row already read is refused (launch f = 3 writes row 4, read by the
  // launch at f = 4).
  Status st = tape.launch(step, {Arg::ndarray(x), Arg::i32(3)});
  expect_refused(st, {"launch 200 ('time_step') writes ndarray 'x' (" + id(x) +
                      ") (parameter 'x') at row 4 of axis 0, which launch 4 ('time_step') "
                      "read there (parameter 'x')"});
}

TEST_F(TapeHazardsTest, ScalarRowsThatCollideAreRefusedAndOthersAccepted) {
  Differentiated take = diff(kTakeRow), put = diff(kPutRow), put_all = diff(kPutAllRows);
  NdArrayHandle x = make({8, kN}, "x"), y = make({kN}, "y"), z = make({kN}, "z");
  ASSERT_TRUE(s_->fill(x, 1.0).ok());
  ASSERT_TRUE(s_->fill(z, 2.0).ok());
  Tape tape(*s_);
  ASSERT_TRUE(tape.launch(take, {Arg::ndarray(x), Arg::ndarray(y), Arg::i32(3)}).ok());
  EXPECT_TRUE(tape.launch(put, {Arg::ndarray(x), Arg::ndarray(z), Arg::i32(4)}).ok())
      << "row 4 was not read";
  Status st = tape.launch(put, {Arg::ndarray(x), Arg::ndarray(z), Arg::i32(3)});
  expect_refused(st, {"tape.launch: launch 2 ('put_row') writes ndarray 'x' (" + id(x) +
                      ") (parameter 'x') at row 3 of axis 0, which launch 0 ('take_row') "
                      "read there (parameter 'x')"});
  // Rows from a loop index: may be any row, so refused after a read of any row.
  st = tape.launch(put_all, {Arg::ndarray(x), Arg::ndarray(z)});
  expect_refused(st, {"launch 2 ('put_all_rows') writes ndarray 'x' (" + id(x) +
                      ") (parameter 'x') at rows that depend on the thread, a loop or data, "
                      "which launch 0 ('take_row') read (parameter 'x')"});
  EXPECT_EQ(tape.launches(), 2u);
  ASSERT_TRUE(tape.backward({TapeSeed::of_value(y, 1.0)}).ok());
}

// Rows past the dense table (TapeHazards::kDenseRows, 65,536) are kept apart: a read there
// still refuses a write of the same row, and rows on either side of the boundary stay distinct.
TEST_F(TapeHazardsTest, RowsPastTheDenseTableCollideOnlyWithThemselves) {
  Differentiated take = diff(kTakeRow), put = diff(kPutRow);
  constexpr int32_t kFar = 65'540;
  NdArrayHandle x = make({kFar + 2, 1}, "x"), y = make({1}, "y"), y2 = make({1}, "y2"),
                z = make({1}, "z");
  Tape tape(*s_);
  ASSERT_TRUE(tape.launch(take, {Arg::ndarray(x), Arg::ndarray(y), Arg::i32(kFar)}).ok());
  ASSERT_TRUE(tape.launch(take, {Arg::ndarray(x), Arg::ndarray(y2), Arg::i32(3)}).ok());
  for (int32_t row : {65'535, 65'536, kFar + 1, 4}) {
    EXPECT_TRUE(tape.launch(put, {Arg::ndarray(x), Arg::ndarray(z), Arg::i32(row)}).ok()) << row;
  }
  for (int32_t row : {kFar, 3}) {
    Status st = tape.launch(put, {Arg::ndarray(x), Arg::ndarray(z), Arg::i32(row)});
    expect_refused(st, {"at row " + std::to_string(row) + " of axis 0, which launch " +
                        (row == 3 ? "1" : "0") + " ('take_row') read there"});
  }
  EXPECT_EQ(tape.launches(), 6u);
}

TEST_F(TapeHazardsTest, OverwritingADifferentiatedWriteIsRefused) {
  Differentiated put = diff(kPutRow);
  NdArrayHandle x = make({8, kN}, "x"), a = make({kN}, "a"), b = make({kN}, "b");
  Tape tape(*s_);
  ASSERT_TRUE(tape.launch(put, {Arg::ndarray(x), Arg::ndarray(a), Arg::i32(5)}).ok());
  Status st = tape.launch(put, {Arg::ndarray(x), Arg::ndarray(b), Arg::i32(5)});
  expect_refused(st, {"launch 1 ('put_row') overwrites ndarray 'x' (" + id(x) +
                          ") (parameter 'x') at row 5 of axis 0, which launch 0 ('put_row') "
                          "wrote, differentiated, there (parameter 'x')",
                      "Backward would hand the gradient of the new values to launch 0's "
                      "adjoint too"});
  EXPECT_TRUE(tape.launch(put, {Arg::ndarray(x), Arg::ndarray(b), Arg::i32(6)}).ok());
}

TEST_F(TapeHazardsTest, LossAccumulatedWithAtomicsIsAcceptedUnlessALaunchReadIt) {
  Differentiated loss_k = diff(kLoss), g2p = diff(kGather);
  NdArrayHandle loss = make({1}, "loss"), out = make({1}, "out");
  std::vector<NdArrayHandle> x;
  Tape tape(*s_);
  ASSERT_TRUE(s_->zero(loss).ok());
  for (int k = 0; k < 5; ++k) {
    x.push_back(make({kN}, "x"));
    ASSERT_TRUE(s_->fill(x.back(), 0.5 + k).ok());
    ASSERT_TRUE(tape.launch(loss_k, {Arg::ndarray(x.back()), Arg::ndarray(loss)}).ok()) << k;
  }
  ASSERT_TRUE(tape.backward({TapeSeed::of_value(loss, 1.0)}).ok());
  for (int k = 0; k < 5; ++k) {
    auto g = tape.grad(x[k]);
    ASSERT_TRUE(g.ok());
    for (float got : read(*g, kN)) EXPECT_NEAR(got, 2 * (0.5 + k), 1e-5) << k;
  }
  // A launch reads the loss; a later atomic_add into it changes what that launch read.
  ASSERT_TRUE(tape.launch(g2p, {Arg::ndarray(loss), Arg::ndarray(out)}).ok());
  Status st = tape.launch(loss_k, {Arg::ndarray(x[0]), Arg::ndarray(loss)});
  expect_refused(st, {"launch 6 ('sq_loss') atomically adds to ndarray 'loss' (" + id(loss) +
                      ") (parameter 'loss') at row 0 of axis 0, which launch 5 ('g2p') read at "
                      "rows that depend on the thread, a loop or data (parameter 'grid')"});
}

TEST_F(TapeHazardsTest, CapturedTapeLaunchesAreCheckedTheSameWay) {
  Differentiated take = diff(kTakeRow), put = diff(kPutRow);
  NdArrayHandle x = make({8, kN}, "x"), y = make({kN}, "y"), z = make({kN}, "z");
  ASSERT_TRUE(s_->fill(x, 1.0).ok());
  ASSERT_TRUE(s_->fill(z, 2.0).ok());
  Tape tape(*s_);
  ASSERT_TRUE(s_->begin_capture("hazards").ok());
  ASSERT_TRUE(tape.launch(take, {Arg::ndarray(x), Arg::ndarray(y), Arg::i32(3)}).ok());
  Status st = tape.launch(put, {Arg::ndarray(x), Arg::ndarray(z), Arg::i32(3)});
  expect_refused(st, {"tape.launch: launch 1 ('put_row') writes ndarray 'x' (" + id(x) +
                      ") (parameter 'x') at row 3 of axis 0, which launch 0 ('take_row') "
                      "read there (parameter 'x')"});
  ASSERT_TRUE(tape.launch(put, {Arg::ndarray(x), Arg::ndarray(z), Arg::i32(2)}).ok());
  ASSERT_TRUE(tape.backward({TapeSeed::of_value(y, 1.0)}).ok());
  auto g = s_->end_capture();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  ASSERT_TRUE(s_->replay(*g).ok());
  auto gz = tape.grad(z);
  ASSERT_TRUE(gz.ok());
  EXPECT_EQ(read(*gz, kN), std::vector<float>(kN, 0.0f)) << "z went to row 2, not read";
  auto gx = tape.grad(x);
  ASSERT_TRUE(gx.ok());
  const std::vector<float> gxs = read(*gx, 8 * kN);
  for (uint32_t p = 0; p < kN; ++p) EXPECT_EQ(gxs[3 * kN + p], 1.0f) << p;
  ASSERT_TRUE(s_->release_graph(*g).ok());
}

// b[f + 1, p] = sin(a[f, p]): with a = b, a time axis through two parameters.
constexpr const char* kShiftRow = R"(
kernel shift_row(a: ndarray<f32, 2> grad, b: ndarray<f32, 2> grad, f: i32) {
  task main parallel %p in [0, shape(a, 1)) {
    %f = arg f : i32
    %one = const 1 : i32
    %f1 = add %f, %one : i32
    %v = load a[%f, %p] : f32
    %s = sin %v : f32
    store b[%f1, %p], %s
  }
})";

// One array for two parameters, one written and the other read: an in-place launch. Its
// adjoint would read sin(x) where it needs x (issue 50: d/dx came out 1.80 for cos(0.7) =
// 0.76), so every way onto a tape refuses it before it runs, naming both parameters.
TEST_F(TapeHazardsTest, InPlaceLaunchIsRefusedNamingBothParameters) {
  Differentiated p2g = diff(kScatter);
  NdArrayHandle x = make({kN}, "x");
  ASSERT_TRUE(s_->fill(x, 0.7).ok());
  const std::vector<std::string> parts = {
      "tape.launch: launch 0 ('p2g') passes ndarray 'x' (" + id(x) +
          ") as both parameter 'grid', which it writes, and parameter 'x', which it reads",
      "the gradients would be wrong", "Pass a separate array for 'grid'",
      "Nothing was launched or recorded"};
  const uint64_t before = launches();
  Tape tape(*s_);
  expect_refused(tape.launch(p2g, {Arg::ndarray(x), Arg::ndarray(x)}), parts);
  EXPECT_EQ(tape.launches(), 0u);
  // A step loop checks every launch of every iteration the same way.
  const TapeLoopLaunch body[] = {{&p2g, {Arg::ndarray(x), Arg::ndarray(x)}, {}}};
  expect_refused(tape.launch_loop(body, 3), parts);
  // So does a checkpointed tape, which keeps no record of earlier launches.
  ASSERT_TRUE(tape.set_checkpoint_every(2).ok());
  expect_refused(tape.launch(p2g, {Arg::ndarray(x), Arg::ndarray(x)}), parts);
  EXPECT_EQ(launches(), before) << "nothing ran";
  std::vector<float> host = read(x, kN);
  EXPECT_EQ(host, std::vector<float>(kN, 0.7f)) << "x untouched";
  // And inside a capture; the way out the message names, a separate output, gives cos(0.7).
  Tape plain(*s_);
  NdArrayHandle y = make({kN}, "y");
  ASSERT_TRUE(s_->begin_capture("in place").ok());
  expect_refused(plain.launch(p2g, {Arg::ndarray(x), Arg::ndarray(x)}), parts);
  ASSERT_TRUE(plain.launch(p2g, {Arg::ndarray(x), Arg::ndarray(y)}).ok());
  ASSERT_TRUE(plain.backward({TapeSeed::of_value(y, 1.0)}).ok());
  auto g = s_->end_capture();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  ASSERT_TRUE(s_->replay(*g).ok());
  auto gx = plain.grad(x);
  ASSERT_TRUE(gx.ok());
  for (float got : read(*gx, kN)) EXPECT_NEAR(got, std::cos(0.7), 1e-5);
  ASSERT_TRUE(s_->release_graph(*g).ok());
}

// Aliased parameters whose rows a launch-uniform index keeps apart (read row f, write row
// f + 1) are accepted, and their gradient is right.
TEST_F(TapeHazardsTest, AliasedParametersOnDisjointRowsAreAccepted) {
  Differentiated shift = diff(kShiftRow);
  NdArrayHandle x = make({3, kN}, "x");
  ASSERT_TRUE(s_->fill(x, 0.5).ok());
  Tape tape(*s_);
  for (int32_t f = 0; f < 2; ++f) {
    Status st = tape.launch(shift, {Arg::ndarray(x), Arg::ndarray(x), Arg::i32(f)});
    ASSERT_TRUE(st.ok()) << st.to_string();
  }
  std::vector<float> seed(3 * kN, 0.0f);
  for (uint32_t p = 0; p < kN; ++p) seed[2 * kN + p] = 1.0f;
  ASSERT_TRUE(tape.backward({TapeSeed::of_data(x, std::span<const float>(seed))}).ok());
  auto g = tape.grad(x);
  ASSERT_TRUE(g.ok());
  const std::vector<float> got = read(*g, 3 * kN);
  const double want = std::cos(std::sin(0.5)) * std::cos(0.5);  // d sin(sin(x)) / dx
  for (uint32_t p = 0; p < kN; ++p) EXPECT_NEAR(got[p], want, 1e-5) << p;
}

}  // namespace
}  // namespace vkad::testing
