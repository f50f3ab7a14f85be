// Print and assert in kernels (issue 56, points 1 and 2; docs/debugging.md): a kernel's print
// statements leave records in its launch's print area that the host turns into lines when the
// launch retires -- the same lines the CPU evaluator writes for the same IR -- in forward and
// adjoint kernels, inside loops and in replayed graphs; a full area drops records and says how
// many; a failed assert is a kDeviceError naming the message, the statement, the first failing
// invocation and its values, and the session goes on. A kernel without either has no print
// area.
#include <gtest/gtest.h>

#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "abi/print_records.h"
#include "ir/builder.h"
#include "reference/cpu_eval.h"
#include "spirv/compiler.h"
#include "support/session_fixture.h"
#include "vkad.h"

namespace vkad::testing {
namespace {

using codegen::Array;
using codegen::KernelBuilder;
using codegen::Value;

// y[i] = x[i] * 2; for k in [0, 3): print "i = {}, k = {}, x = {}" (i, k, x[i] + k).
codegen::Kernel printing(uint32_t every = 1) {
  KernelBuilder kb("printing");
  Array x = kb.ndarray("x", DType::kF32, 1, {.needs_grad = true});
  Array y = kb.ndarray("y", DType::kF32, 1, {.needs_grad = true});
  kb.parallel_for("main", 0, x.dim(0), [&](Value i) {
    Value v = x(i);
    kb.if_(eq(mod(i, kb.i32(static_cast<int>(every))), kb.i32(0)), [&] {
      kb.for_range(kb.i32(0), kb.i32(3), [&](Value k) {
        kb.print("i = {}, k = {}, x = {}", {i, k, v + cast(k, DType::kF32)});
      });
    });
    y.store({i}, v * 2.0);
  });
  return kb.finish();
}

// assert x[i] < limit, "x stays below the limit", x[i], limit.
codegen::Kernel asserting(bool grad = false) {
  KernelBuilder kb("asserting");
  codegen::Scalar limit = kb.scalar("limit", DType::kF32);
  Array x = kb.ndarray("x", DType::kF32, 1, {.needs_grad = grad});
  Array y = kb.ndarray("y", DType::kF32, 1, {.needs_grad = grad});
  kb.parallel_for("main", 0, x.dim(0), [&](Value i) {
    Value v = x(i);
    const Value lim = limit;
    kb.assert_(v < lim, "x stays below the limit", {v, lim});
    y.store({i}, v + 1.0);
  });
  return kb.finish();
}

class PrintAssert : public ValidatedSessionTest {
 protected:
  void SetUp() override {
    ValidatedSessionTest::SetUp();
    s_->set_print_sink([this](std::string_view line) { lines_.emplace_back(line); });
  }
  // lines_ dies before the base's session: a launch retired by the session's destruction must
  // not write into it.
  void TearDown() override {
    if (s_) s_->set_print_sink(nullptr);
    ValidatedSessionTest::TearDown();
  }
  NdArrayHandle make(const std::vector<float>& values) {
    auto h = s_->ndarray(DType::kF32, {static_cast<uint32_t>(values.size())});
    EXPECT_TRUE(h.ok());
    EXPECT_TRUE(s_->upload(*h, std::span<const float>(values)).ok());
    return *h;
  }
  std::vector<std::string> lines_;
};

// The lines of the CPU evaluator for the same kernel and inputs.
std::vector<std::string> reference_lines(const codegen::Kernel& k, const std::vector<float>& x) {
  codegen::HostArray xs(DType::kF32, {static_cast<uint32_t>(x.size())}),
      ys(DType::kF32, {static_cast<uint32_t>(x.size())});
  xs.data.assign(x.begin(), x.end());
  std::vector<codegen::HostArg> args = {codegen::HostArg::of(xs), codegen::HostArg::of(ys)};
  auto r = codegen::evaluate(k, args);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? r->prints : std::vector<std::string>{};
}

std::vector<float> inputs(uint32_t n) {
  std::vector<float> x(n);
  for (uint32_t i = 0; i < n; ++i) x[i] = 0.25f * static_cast<float>(i) - 1.5f;
  return x;
}

TEST_F(PrintAssert, PrintsInALoopAreTheReferencesLines) {
  const codegen::Kernel k = printing();
  auto h = s_->compile(k);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  const std::vector<float> x = inputs(40);
  NdArrayHandle xs = make(x), ys = make(std::vector<float>(40));
  ASSERT_TRUE(s_->launch(*h, {Arg::ndarray(xs), Arg::ndarray(ys)}).ok());
  ASSERT_TRUE(s_->synchronize().ok());
  // Each invocation's lines in its order; invocations in the order they reserved their
  // records: compared as sets of lines, and per invocation in order.
  std::vector<std::string> want = reference_lines(k, x);
  ASSERT_EQ(want.size(), 120u);
  EXPECT_EQ(want[0], "[kernel 'printing', task 'main', thread (0)] i = 0, k = 0, x = -1.5");
  std::vector<std::string> got = lines_;
  for (uint32_t i = 0; i < 40; ++i) {  // per invocation, k = 0, 1, 2 in order
    std::vector<size_t> at;
    const std::string prefix = "thread (" + std::to_string(i) + ")]";
    for (size_t j = 0; j < got.size(); ++j)
      if (got[j].find(prefix) != std::string::npos) at.push_back(j);
    ASSERT_EQ(at.size(), 3u) << prefix;
    for (int kk = 0; kk < 3; ++kk)
      EXPECT_NE(got[at[kk]].find("k = " + std::to_string(kk)), std::string::npos) << got[at[kk]];
  }
  std::sort(got.begin(), got.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(got, want);
}

TEST_F(PrintAssert, AnAdjointPrintsWhatItsForwardPrintsOnce) {
  auto d = s_->differentiate(printing());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  const std::vector<float> x = inputs(8);
  NdArrayHandle xs = make(x), ys = make(std::vector<float>(8));
  Tape t(*s_);
  ASSERT_TRUE(t.launch(*d, {Arg::ndarray(xs), Arg::ndarray(ys)}).ok());
  ASSERT_TRUE(s_->synchronize().ok());
  ASSERT_EQ(lines_.size(), 24u);
  lines_.clear();
  ASSERT_TRUE(t.backward({TapeSeed::of_value(ys, 1.0)}).ok());
  ASSERT_TRUE(s_->synchronize().ok());
  // The adjoint replays the forward: the same 24 lines (values recomputed), named by the
  // adjoint kernel, once each.
  ASSERT_EQ(lines_.size(), 24u);
  for (const std::string& l : lines_)
    EXPECT_EQ(l.rfind("[kernel 'printing_adjoint', task 'main_adjoint', thread (", 0), 0u) << l;
  EXPECT_NE(
      std::find(
          lines_.begin(), lines_.end(),
          "[kernel 'printing_adjoint', task 'main_adjoint', thread (7)] i = 7, k = 2, x = 2.25"),
      lines_.end());
  auto g = t.grad(xs);
  ASSERT_TRUE(g.ok());
  std::vector<float> gx(8);
  ASSERT_TRUE(s_->download(*g, std::span<float>(gx)).ok());
  for (float v : gx) EXPECT_EQ(v, 2.0f);
}

TEST_F(PrintAssert, AReplayedGraphPrintsAtEveryReplay) {
  auto h = s_->compile(printing(4));
  ASSERT_TRUE(h.ok());
  NdArrayHandle xs = make(inputs(16)), ys = make(std::vector<float>(16));
  ASSERT_TRUE(s_->begin_capture("printing graph").ok());
  ASSERT_TRUE(s_->launch(*h, {Arg::ndarray(xs), Arg::ndarray(ys)}).ok());
  auto g = s_->end_capture();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  ASSERT_TRUE(s_->synchronize().ok());
  lines_.clear();
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(s_->replay(*g).ok());
  ASSERT_TRUE(s_->synchronize().ok());
  // Threads 0, 4, 8, 12 print 3 lines per replay.
  EXPECT_EQ(lines_.size(), 36u);
  EXPECT_EQ(std::count(lines_.begin(), lines_.end(),
                       "[kernel 'printing', task 'main', thread (12)] i = 12, k = 1, x = 2.5"),
            3);
  ASSERT_TRUE(s_->release_graph(*g).ok());
}

TEST_F(PrintAssert, AFullPrintAreaDropsRecordsAndSaysHowMany) {
  auto h = s_->compile(printing());
  ASSERT_TRUE(h.ok());
  // 3 records of 5 words per thread; the area's 4,094 words after its header hold 818.
  const uint32_t n = 1000;
  NdArrayHandle xs = make(inputs(n)), ys = make(std::vector<float>(n));
  ASSERT_TRUE(s_->launch(*h, {Arg::ndarray(xs), Arg::ndarray(ys)}).ok());
  ASSERT_TRUE(s_->synchronize().ok());
  const size_t kept = (16384 / 4 - abi::kPrintHeaderWords) / 5;
  ASSERT_EQ(lines_.size(), kept + 1);
  EXPECT_EQ(lines_.back(), "[kernel 'printing'] " + std::to_string(3 * n - kept) +
                               " print records dropped: the launch's print area (16384 bytes, "
                               "CompileOptions::print_buffer_bytes) was full");
  std::vector<float> y(n);
  ASSERT_TRUE(s_->download(ys, std::span<float>(y)).ok());  // the kernel's work is whole
  EXPECT_EQ(y[n - 1], 2.0f * inputs(n)[n - 1]);
}

TEST_F(PrintAssert, AFailedAssertNamesTheMessageTheThreadAndTheValues) {
  auto h = s_->compile(asserting());
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  std::vector<float> x(64, 1.0f);
  x[37] = 9.5f;
  NdArrayHandle xs = make(x), ys = make(std::vector<float>(64));
  ASSERT_TRUE(s_->launch(*h, {Arg::f32(4.0f), Arg::ndarray(xs), Arg::ndarray(ys)}).ok());
  Status st = s_->synchronize();
  ASSERT_EQ(st.code(), ErrorCode::kDeviceError) << st.to_string();
  EXPECT_NE(st.message().find("kernel 'asserting', task 'main': assertion failed: x stays below "
                              "the limit (`assert \"x stays below the limit\", %"),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find(", thread (37) with 9.5, 4;"), std::string::npos) << st.message();
  EXPECT_TRUE(lines_.empty());  // an assert's record is the error's, not a printed line
  // The launch ran to its end; the session goes on, and a passing launch raises nothing.
  std::vector<float> y(64);
  ASSERT_TRUE(s_->download(ys, std::span<float>(y)).ok());
  EXPECT_EQ(y[37], 10.5f);
  ASSERT_TRUE(s_->launch(*h, {Arg::f32(10.0f), Arg::ndarray(xs), Arg::ndarray(ys)}).ok());
  EXPECT_TRUE(s_->synchronize().ok());
}

TEST_F(PrintAssert, AnAssertInAReplayedGraphNamesTheGraphLaunch) {
  auto h = s_->compile(asserting());
  ASSERT_TRUE(h.ok());
  std::vector<float> x(64, 1.0f);
  NdArrayHandle xs = make(x), ys = make(std::vector<float>(64));
  ASSERT_TRUE(s_->begin_capture("checked step").ok());
  ASSERT_TRUE(s_->launch(*h, {Arg::f32(4.0f), Arg::ndarray(xs), Arg::ndarray(ys)}).ok());
  auto g = s_->end_capture();
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(s_->synchronize().ok());
  x[5] = 6.0f;
  ASSERT_TRUE(s_->upload(xs, std::span<const float>(x)).ok());
  ASSERT_TRUE(s_->replay(*g).ok());
  Status st = s_->synchronize();
  ASSERT_EQ(st.code(), ErrorCode::kDeviceError) << st.to_string();
  EXPECT_NE(st.message().find("assertion failed: x stays below the limit"), std::string::npos);
  EXPECT_NE(st.message().find("thread (5) with 6, 4"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("of graph 'checked step'"), std::string::npos) << st.message();
  ASSERT_TRUE(s_->release_graph(*g).ok());
}

// Issue 56, point 5: a device error of a tape's launch names the tape entry, in its forward and
// in its adjoint.
TEST_F(PrintAssert, ATapesLaunchesNameTheirEntry) {
  auto d = s_->differentiate(asserting(true));
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  std::vector<float> x(64, 1.0f);
  NdArrayHandle xs = make(x), ys = make(std::vector<float>(64)), zs = make(x),
                ws = make(std::vector<float>(64));
  Tape t(*s_);
  ASSERT_TRUE(t.launch(*d, {Arg::f32(4.0f), Arg::ndarray(zs), Arg::ndarray(ys)}).ok());
  x[9] = 5.0f;
  ASSERT_TRUE(s_->upload(xs, std::span<const float>(x)).ok());
  ASSERT_TRUE(t.launch(*d, {Arg::f32(4.0f), Arg::ndarray(xs), Arg::ndarray(ws)}).ok());
  Status st = s_->synchronize();
  ASSERT_EQ(st.code(), ErrorCode::kDeviceError) << st.to_string();
  EXPECT_NE(st.message().find("(tape entry 1)"), std::string::npos) << st.message();
  ASSERT_TRUE(t.backward({TapeSeed::of_value(ws, 1.0)}).ok());
  st = s_->synchronize();
  ASSERT_EQ(st.code(), ErrorCode::kDeviceError) << st.to_string();
  EXPECT_NE(st.message().find("kernel 'asserting_adjoint'"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("(the adjoint of tape entry 1)"), std::string::npos) << st.message();
  EXPECT_EQ(st.message().find("tape entry 0"), std::string::npos) << st.message();
}

// y[t, i] = x[t, i] * 2, asserting x[t, i] < 2: a step of a loop over rows t. 1,024 columns,
// too wide to roll (SessionOptions::resident_max_range): launch_loop launches it once per
// iteration.
codegen::Kernel row_check() {
  KernelBuilder kb("row_check");
  codegen::Scalar t = kb.scalar("t", DType::kI32);
  Array x = kb.ndarray("x", DType::kF32, 2, {.needs_grad = true});
  Array y = kb.ndarray("y", DType::kF32, 2, {.needs_grad = true});
  kb.parallel_for("main", 0, x.dim(1), [&](Value i) {
    const Value row = t;
    Value v = x(row, i);
    kb.assert_(v < 2.0, "x stays below 2", {v});
    y.store({row, i}, v * 2.0);
  });
  return kb.finish();
}

// Issue 56, point 5: a loop launched one launch at a time names the iteration of a failing
// launch: a session's launch_loop, a tape's, and the tape's adjoint (whose iterations run from
// the forward's last).
TEST_F(PrintAssert, ALoopsLaunchesNameTheirIteration) {
  constexpr uint32_t kRows = 4, kCols = 1024;
  auto d = s_->differentiate(row_check());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  std::vector<float> x(kRows * kCols, 1.0f);
  x[2 * kCols + 700] = 5.0f;  // row 2 fails
  auto xs = s_->ndarray(DType::kF32, {kRows, kCols});
  auto ys = s_->ndarray(DType::kF32, {kRows, kCols});
  ASSERT_TRUE(xs.ok() && ys.ok());
  ASSERT_TRUE(s_->upload(*xs, std::span<const float>(x)).ok());
  const std::vector<Arg> args = {Arg::i32(0), Arg::ndarray(*xs), Arg::ndarray(*ys)};
  LoopInfo info;
  const std::vector<LoopLaunch> body = {{d->forward, args, {1, 0, 0}}};
  ASSERT_TRUE(s_->launch_loop(body, kRows, &info).ok());
  EXPECT_FALSE(info.rolled);
  Status st = s_->synchronize();
  ASSERT_EQ(st.code(), ErrorCode::kDeviceError) << st.to_string();
  EXPECT_NE(st.message().find("thread (700) with 5"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("(iteration 2 of a launch_loop)"), std::string::npos) << st.message();
  // The same loop on a tape after a first entry (row 0 of x, which passes), then its adjoint.
  auto zs = s_->ndarray(DType::kF32, {kRows, kCols});
  ASSERT_TRUE(zs.ok());
  Tape tape(*s_);
  ASSERT_TRUE(tape.launch(*d, {Arg::i32(0), Arg::ndarray(*xs), Arg::ndarray(*zs)}).ok());
  const std::vector<TapeLoopLaunch> taped = {{&*d, args, {1, 0, 0}}};
  ASSERT_TRUE(tape.launch_loop(taped, kRows).ok());
  st = s_->synchronize();
  ASSERT_EQ(st.code(), ErrorCode::kDeviceError) << st.to_string();
  EXPECT_NE(st.message().find("(iteration 2 of the loop at tape entry 1)"), std::string::npos)
      << st.message();
  ASSERT_TRUE(tape.backward({TapeSeed::of_value(*ys, 1.0)}).ok());
  st = s_->synchronize();
  ASSERT_EQ(st.code(), ErrorCode::kDeviceError) << st.to_string();
  EXPECT_NE(st.message().find("kernel 'row_check_adjoint'"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("(iteration 1 of the adjoint (run from the last iteration) of the "
                              "loop at tape entry 1)"),
            std::string::npos)
      << st.message();
}

// A replayed launch names the graph's launch and what the capture recorded it from, also when
// the graph was reworked (two independent launches of different ranges: scheduled without a
// barrier between them, not fused).
TEST_F(PrintAssert, AReplayedTapeLaunchNamesItsEntryToo) {
  auto d = s_->differentiate(asserting(true));
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  std::vector<float> x(64, 1.0f);
  NdArrayHandle xs = make(x), ws = make(std::vector<float>(64)),
                zs = make(std::vector<float>(32, 1.0f)), ys = make(std::vector<float>(32));
  Tape t(*s_);
  ASSERT_TRUE(s_->begin_capture("taped").ok());
  ASSERT_TRUE(t.launch(*d, {Arg::f32(4.0f), Arg::ndarray(zs), Arg::ndarray(ys)}).ok());
  ASSERT_TRUE(t.launch(*d, {Arg::f32(4.0f), Arg::ndarray(xs), Arg::ndarray(ws)}).ok());
  auto g = s_->end_capture();
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  ASSERT_TRUE(s_->synchronize().ok());
  x[9] = 5.0f;
  ASSERT_TRUE(s_->upload(xs, std::span<const float>(x)).ok());
  ASSERT_TRUE(s_->replay(*g).ok());
  Status st = s_->synchronize();
  ASSERT_EQ(st.code(), ErrorCode::kDeviceError) << st.to_string();
  EXPECT_NE(st.message().find("of graph 'taped', captured from tape entry 1)"), std::string::npos)
      << st.message();
  EXPECT_EQ(st.message().find("tape entry 0"), std::string::npos) << st.message();
  ASSERT_TRUE(s_->release_graph(*g).ok());
}

TEST_F(PrintAssert, AKernelWithoutThemHasNoPrintArea) {
  KernelBuilder kb("plain");
  Array x = kb.ndarray("x", DType::kF32, 1);
  kb.parallel_for("main", 0, x.dim(0), [&](Value i) { x.store({i}, x(i) + 1.0); });
  const codegen::Kernel plain = kb.finish();
  auto c = codegen::compile(plain, codegen::Target::host());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->print_bytes, 0u);
  EXPECT_EQ(c->args_bytes(), c->print_offset());
  auto p = codegen::compile(printing(), codegen::Target::host());
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->print_bytes, 16384u);
  ASSERT_EQ(p->tasks[0].print_sites.size(), 1u);
  EXPECT_EQ(p->tasks[0].print_sites[0].format, "i = {}, k = {}, x = {}");
  // Asserts alone: the smallest area (their first failure's record; a graph moves every
  // launch's args at each replay).
  auto a = codegen::compile(asserting(), codegen::Target::host());
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->print_bytes, abi::kMinPrintBytes);
}

}  // namespace
}  // namespace vkad::testing
