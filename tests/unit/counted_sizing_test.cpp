// Exact adstack sizing without max_trip (make_adjoint_counted): the counting kernel on the CPU
// reference finds each counted loop's largest trip count; the adjoint sized by those counts
// computes bit for bit what the max_trip-sized adjoint computes (which
// WhileLoop.GradientsMatchFiniteDifferences checks against finite differences), and one trip
// less overflows, so the counts are exact, not merely sufficient.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "autodiff/reverse_mode.h"
#include "ir/text.h"
#include "ir/verifier.h"
#include "runtime/counted_launch.h"
#include "support/ad_check.h"
#include "support/ad_fuzz.h"
#include "support/while_kernels.h"

namespace vkad::testing {
namespace {

using codegen::DType;
using codegen::HostArray;
using codegen::Kernel;

// Drops every stated max_trip.
void strip_caps(codegen::Block& b) {
  for (codegen::Stmt& s : b.stmts) {
    if (s.op == codegen::Op::kWhile || s.op == codegen::Op::kFor) s.has_cap = false;
    for (codegen::Block& c : s.blocks) strip_caps(c);
  }
}

// The counting kernel's result on `base` (run after the forward, as the adjoint is).
std::vector<int32_t> count_trips(const Kernel& forward, const codegen::CountedAdjoint& ca,
                                 HostValues base) {
  {
    auto v = base.view();
    EXPECT_TRUE(codegen::evaluate(forward, v).ok());
  }
  HostValues c = base;
  c.arrays.push_back(HostArray(DType::kI32, {ca.counted * runtime::kTripSlots}));
  c.scalars.push_back(0);
  auto v = c.view();
  auto r = codegen::evaluate(ca.counter, v);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  std::vector<int32_t> out(ca.counted, 0);
  const std::vector<double>& words = c.arrays.back().data;
  for (size_t w = 0; w < words.size(); ++w) {
    int32_t& o = out[w / runtime::kTripSlots];
    o = std::max(o, static_cast<int32_t>(words[w]));
  }
  return out;
}

// The adjoint's gradient arrays and error flags with `trips` appended.
std::pair<std::vector<HostArray>, uint32_t> run_adjoint(const Kernel& forward,
                                                        const Kernel& adjoint,
                                                        const HostValues& base,
                                                        const std::vector<int32_t>& trips) {
  HostValues a = adjoint_args(forward, base, random_seeds(forward, base, 9));
  for (int32_t t : trips) {
    a.arrays.emplace_back();
    a.scalars.push_back(t);
  }
  auto v = a.view();
  auto r = codegen::evaluate(adjoint, v);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  uint32_t flags = 0;
  if (r.ok()) {
    for (uint32_t f : r->error_flags) flags |= f;
  }
  std::vector<HostArray> grads(
      a.arrays.begin() + static_cast<std::ptrdiff_t>(forward.params.size()),
      a.arrays.end() - static_cast<std::ptrdiff_t>(trips.size()));
  return {grads, flags};
}

TEST(CountedSizing, WhileKernelsWithoutMaxTripMatchTheStatedBound) {
  for (const WhileCase& c : while_cases()) {
    auto parsed = codegen::parse(c.text);
    ASSERT_TRUE(parsed.ok());
    Kernel capped = *parsed, bare = *parsed;
    for (codegen::Task& t : bare.tasks) strip_caps(t.body);
    EXPECT_FALSE(codegen::make_adjoint(bare).ok())
        << c.name << ": plain make_adjoint needs the bound";
    auto ca = codegen::make_adjoint_counted(bare);
    ASSERT_TRUE(ca.ok()) << c.name << ": " << ca.status().to_string();
    ASSERT_GT(ca->counted, 0u) << c.name;
    ASSERT_TRUE(codegen::verify(ca->counter).ok());
    HostValues base = c.args();
    std::vector<int32_t> trips = count_trips(bare, *ca, base);
    auto want = codegen::make_adjoint(capped);
    ASSERT_TRUE(want.ok());
    auto [g_want, f_want] = run_adjoint(capped, *want, base, {});
    auto [g_got, f_got] = run_adjoint(bare, ca->adjoint, base, trips);
    EXPECT_EQ(f_want, 0u) << c.name;
    EXPECT_EQ(f_got, 0u) << c.name;
    ASSERT_EQ(g_got.size(), g_want.size());
    for (size_t p = 0; p < g_got.size(); ++p)
      EXPECT_EQ(g_got[p].data, g_want[p].data) << c.name << " gradient " << p;
    // One trip less for any counted loop with a stack: an overflow (the count is exact).
    bool any_overflow = false;
    for (size_t j = 0; j < trips.size(); ++j) {
      std::vector<int32_t> less = trips;
      less[j] -= 1;
      any_overflow |= (run_adjoint(bare, ca->adjoint, base, less).second & 0xff) ==
                      runtime::kErrorAdstackOverflow;
    }
    EXPECT_TRUE(any_overflow) << c.name;
  }
}

// The halving loop's count, against the same loop in C++.
TEST(CountedSizing, CountIsTheLargestTripCount) {
  auto k = codegen::parse(kHalveUntilSmall);
  ASSERT_TRUE(k.ok());
  strip_caps(k->tasks[0].body);
  auto ca = codegen::make_adjoint_counted(*k);
  ASSERT_TRUE(ca.ok()) << ca.status().to_string();
  ASSERT_EQ(ca->counted, 1u);
  HostValues base = while_cases()[0].args();
  int want = 0;
  for (double x : base.arrays[0].data) {
    int n = 0;
    for (double v = x; v * v > 0.01; v *= 0.5) ++n;
    want = std::max(want, n);
  }
  EXPECT_EQ(count_trips(*k, *ca, base), std::vector<int32_t>{want});
  EXPECT_EQ(ca->adjoint.params.back().name.rfind("trips_", 0), 0u);
}

// A kernel that counts its own trips into an array called `trips` (the Dr.Jit conformance
// test's form): the counting kernels' appended array takes another name, so both verify, and
// the count is the largest trip count.
TEST(CountedSizing, AParameterCalledTripsKeepsItsName) {
  auto k = codegen::parse(R"(
kernel grow(x: ndarray<f32, 1> grad, trips: ndarray<i32, 1>) {
  task main parallel %0 in [0, shape(x, 0)) {
    %1 = load x[%0] : f32
    %2 = alloca : f32
    store_local %2, %1
    %3 = alloca : i32
    while %4 (%7) {
      %5 = load_local %2 : f32
      %6 = const 4.0 : f32
      %7 = lt %5, %6 : bool
    } do {
      %8 = load_local %2 : f32
      %9 = mul %8, %8 : f32
      %10 = const 0.5 : f32
      %11 = add %9, %10 : f32
      store_local %2, %11
      %12 = load_local %3 : i32
      %13 = const 1 : i32
      %14 = add %12, %13 : i32
      store_local %3, %14
    }
    %15 = load_local %3 : i32
    store trips[%0], %15
  }
}
)");
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  auto ca = codegen::make_adjoint_counted(*k);
  ASSERT_TRUE(ca.ok()) << ca.status().to_string();
  ASSERT_EQ(ca->counted, 1u);
  EXPECT_EQ(ca->counter.params.back().name, "trips_1");
  EXPECT_EQ(ca->counting_forward.params.back().name, "trips_1");
  EXPECT_EQ(ca->counter.params[1].name, "trips");
  HostValues base;
  base.arrays = {HostArray(DType::kF32, {4}), HostArray(DType::kI32, {4})};
  base.arrays[0].data = {0.0, 0.9, 1.5, 3.0};
  base.scalars = {0, 0};
  int want = 0;  // 0 -> 0.5 -> 0.75 -> 1.0625 -> 1.63 -> 3.16 -> 10.5: 6 trips
  for (double x : base.arrays[0].data) {
    int n = 0;
    for (float v = static_cast<float>(x); v < 4.0f; v = v * v + 0.5f) ++n;
    want = std::max(want, n);
  }
  EXPECT_EQ(want, 6);
  EXPECT_EQ(count_trips(*k, *ca, base), std::vector<int32_t>{want});
}

// The two slot layouts of the counting kernel (trip_counter.h: runs of kTripSlotRun indices per
// word where the target has subgroup arithmetic, neighbours on different words where not) find
// the same counts for every while kernel; the runs put each loop's maxima on fewer words.
TEST(CountedSizing, SlotLayoutsFindTheSameCounts) {
  for (const WhileCase& c : while_cases()) {
    auto parsed = codegen::parse(c.text);
    ASSERT_TRUE(parsed.ok());
    Kernel bare = *parsed;
    for (codegen::Task& t : bare.tasks) strip_caps(t.body);
    codegen::Target runs = codegen::Target::host(), spread = runs;
    ASSERT_TRUE(runs.subgroup_arithmetic);
    spread.subgroup_arithmetic = false;
    auto a = codegen::make_adjoint_counted(bare, runs),
         b = codegen::make_adjoint_counted(bare, spread);
    ASSERT_TRUE(a.ok() && b.ok()) << c.name;
    auto divs = [](const std::string& text) {
      size_t n = 0;
      for (size_t at = text.find(" div "); at != std::string::npos; at = text.find(" div ", at + 1))
        ++n;
      return n;
    };
    EXPECT_EQ(divs(codegen::print(a->counter)), divs(codegen::print(b->counter)) + a->counted)
        << c.name;
    HostValues base = c.args();
    EXPECT_EQ(count_trips(bare, *a, base), count_trips(bare, *b, base)) << c.name;
  }
}

// A for loop bounded by ndarray contents, with no max_trip: counted too, the loop inside it
// sized from the counted bound; gradients against finite differences through the counted
// capacity (a stated max_trip adjoint is the reference).
TEST(CountedSizing, DataBoundedForLoop) {
  const char* text =
      R"(kernel gather(n: ndarray<i32, 1>, x: ndarray<f64, 1> grad, y: ndarray<f64, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = alloca : f64
    %x = load x[%i] : f64
    store_local %v, %x
    %zero = const 0 : i32
    %m = load n[%i] : i32
    for %k in [%zero, %m) {
      for %l in [%zero, %k) {
        %a = load_local %v : f64
        %s = sin %a : f64
        %t = add %s, %a : f64
        %h = const 0.5 : f64
        %u = mul %t, %h : f64
        store_local %v, %u
      }
      %b = load_local %v : f64
      %c = cos %b : f64
      store_local %v, %c
    }
    %o = load_local %v : f64
    store y[%i], %o
  }
})";
  auto k = codegen::parse(text);
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  auto ca = codegen::make_adjoint_counted(*k);
  ASSERT_TRUE(ca.ok()) << ca.status().to_string();
  ASSERT_EQ(ca->counted, 1u);
  HostValues base;
  base.arrays = {HostArray(DType::kI32, {4}), HostArray(DType::kF64, {4}),
                 HostArray(DType::kF64, {4})};
  base.arrays[0].data = {3, 0, 5, 2};
  base.arrays[1].data = {0.3, -0.8, 1.2, 0.5};
  base.scalars = {0, 0, 0};
  std::vector<int32_t> trips = count_trips(*k, *ca, base);
  EXPECT_EQ(trips, std::vector<int32_t>{5});
  Kernel capped = *k;
  for (codegen::Stmt& s : capped.tasks[0].body.stmts) {
    if (s.op == codegen::Op::kFor) s.has_cap = true, s.cap = codegen::SizeExpr::constant(5);
  }
  auto r = check_gradients_cpu(capped, base, 3);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->failure, "");
  EXPECT_GE(r->checked, 3);
  auto want = codegen::make_adjoint(capped);
  ASSERT_TRUE(want.ok());
  auto [g_want, f_want] = run_adjoint(capped, *want, base, {});
  auto [g_got, f_got] = run_adjoint(*k, ca->adjoint, base, trips);
  EXPECT_EQ(f_got, 0u);
  for (size_t p = 0; p < g_got.size(); ++p) EXPECT_EQ(g_got[p].data, g_want[p].data);
}

// The AD fuzzer's kernels (while loops, for loops bounded by table entries, break / continue,
// loops nested in them) with every stated bound removed: the counted adjoint raises no overflow
// and equals the stated-bound adjoint bit for bit.
TEST(CountedSizing, FuzzKernelsMatchTheStatedBound) {
  uint32_t seed0 = env_or("VKAD_AD_FUZZ_SEED", 1), count = env_or("VKAD_AD_FUZZ_COUNT", 5000) / 10;
  int counted_kernels = 0;
  for (uint32_t seed = seed0; seed < seed0 + count; ++seed) {
    AdFuzzCase c = random_ad_kernel(seed);
    Kernel bare = c.kernel;
    for (codegen::Task& t : bare.tasks) strip_caps(t.body);
    auto ca = codegen::make_adjoint_counted(bare);
    ASSERT_TRUE(ca.ok()) << "seed " << seed << ": " << ca.status().to_string();
    if (ca->counted == 0) continue;
    ++counted_kernels;
    auto want = codegen::make_adjoint(c.kernel);
    ASSERT_TRUE(want.ok()) << "seed " << seed;
    std::vector<int32_t> trips = count_trips(bare, *ca, c.args);
    auto [g_want, f_want] = run_adjoint(c.kernel, *want, c.args, {});
    auto [g_got, f_got] = run_adjoint(bare, ca->adjoint, c.args, trips);
    ASSERT_EQ(f_got, 0u) << "seed " << seed << "\n" << codegen::print(bare);
    ASSERT_EQ(f_want, 0u) << "seed " << seed;
    for (size_t p = 0; p < g_got.size(); ++p) {
      ASSERT_EQ(g_got[p].data, g_want[p].data) << "seed " << seed << " gradient " << p << "\n"
                                               << codegen::print(bare);
    }
  }
  EXPECT_GT(counted_kernels, static_cast<int>(count) / 8);  // ~20% of the kernels count a loop
}

// Equal bit for bit (NaN included), as the counting forward's outputs must be.
bool same_bits(const HostArray& a, const HostArray& b) {
  return a.dtype == b.dtype && a.shape == b.shape &&
         std::equal(a.data.begin(), a.data.end(), b.data.begin(), b.data.end(),
                    [](double p, double q) { return std::memcmp(&p, &q, sizeof p) == 0; });
}

// Runs `forward` and `ca.counting_forward` on copies of `base`; expects the counting forward to
// write every array as the forward does and to leave in its trips array word for word what the
// counter leaves when run after the forward. Returns the per-loop maxima of those words.
std::vector<int32_t> expect_counting_forward_matches(const Kernel& forward,
                                                     const codegen::CountedAdjoint& ca,
                                                     const HostValues& base,
                                                     const std::string& what) {
  HostValues plain = base;
  auto pv = plain.view();
  auto pr = codegen::evaluate(forward, pv);
  EXPECT_TRUE(pr.ok()) << what << ": " << pr.status().to_string();
  HostValues counting = base;
  counting.arrays.push_back(HostArray(DType::kI32, {ca.counted * runtime::kTripSlots}));
  counting.scalars.push_back(0);
  auto cv = counting.view();
  auto cr = codegen::evaluate(ca.counting_forward, cv);
  EXPECT_TRUE(cr.ok()) << what << ": " << cr.status().to_string();
  if (pr.ok() && cr.ok()) {
    EXPECT_EQ(pr->error_flags, cr->error_flags) << what;
  }
  for (size_t p = 0; p < forward.params.size(); ++p) {
    EXPECT_TRUE(same_bits(counting.arrays[p], plain.arrays[p]))
        << what << ": parameter " << forward.params[p].name;
  }
  // The counter, after the forward (on `plain`, as the forward left it).
  HostValues after = plain;
  after.arrays.push_back(HostArray(DType::kI32, {ca.counted * runtime::kTripSlots}));
  after.scalars.push_back(0);
  auto av = after.view();
  EXPECT_TRUE(codegen::evaluate(ca.counter, av).ok()) << what;
  const std::vector<double>& words = counting.arrays.back().data;
  EXPECT_EQ(words, after.arrays.back().data) << what << ": trips words";
  std::vector<int32_t> out(ca.counted, 0);
  for (size_t w = 0; w < words.size(); ++w) {
    int32_t& o = out[w / runtime::kTripSlots];
    o = std::max(o, static_cast<int32_t>(words[w]));
  }
  return out;
}

// The counting forward (make_adjoint_counted's counting_forward: the forward with the counter's
// recording) on the while kernels (break / continue among them: it is their lowered forward),
// in both slot layouts: what the forward writes, and the counter's words.
TEST(CountedSizing, CountingForwardWritesTheForwardsOutputsAndTheCountersWords) {
  for (const WhileCase& c : while_cases()) {
    auto parsed = codegen::parse(c.text);
    ASSERT_TRUE(parsed.ok());
    Kernel bare = *parsed;
    for (codegen::Task& t : bare.tasks) strip_caps(t.body);
    for (bool runs : {true, false}) {
      codegen::Target target = codegen::Target::host();
      target.subgroup_arithmetic = runs;
      auto ca = codegen::make_adjoint_counted(bare, target);
      ASSERT_TRUE(ca.ok()) << c.name << ": " << ca.status().to_string();
      ASSERT_GT(ca->counted, 0u);
      EXPECT_EQ(ca->counting_forward.params.size(), bare.params.size() + 1);
      EXPECT_EQ(ca->counting_forward.tasks.size(), bare.tasks.size());
      HostValues base = c.args();
      std::vector<int32_t> trips = expect_counting_forward_matches(bare, *ca, base, c.name);
      EXPECT_EQ(trips, count_trips(bare, *ca, base)) << c.name;
    }
  }
}

// Several tasks and counted loops, one task without: the counting forward keeps every task (the
// third reads what the second writes), counts all three loops (checked against the loops in
// C++), and the adjoint sized by its counts equals the one sized by the counter's, with no
// overflow.
TEST(CountedSizing, CountingForwardKeepsEveryTaskAndCountsEachLoop) {
  auto k = codegen::parse(kThreeTasks);
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  auto ca = codegen::make_adjoint_counted(*k);
  ASSERT_TRUE(ca.ok()) << ca.status().to_string();
  ASSERT_EQ(ca->counted, 3u);
  EXPECT_EQ(ca->counter.tasks.size(), 2u);  // the square task has nothing to count
  ASSERT_EQ(ca->counting_forward.tasks.size(), 3u);
  HostValues base = three_tasks_args();
  std::vector<int32_t> trips = expect_counting_forward_matches(*k, *ca, base, "staged");
  int halvings = 0, n_max = 0;
  for (double x : base.arrays[1].data) {
    int h = 0;
    for (double v = x; v * v > 0.01; v *= 0.5) ++h;
    halvings = std::max(halvings, h);
  }
  for (double n : base.arrays[0].data) n_max = std::max(n_max, static_cast<int>(n));
  // The while loop's count in the nested task is j + 1 for the largest j < n[i].
  std::vector<int32_t> want = {halvings, n_max, n_max}, sorted = trips;
  std::sort(sorted.begin(), sorted.end()), std::sort(want.begin(), want.end());
  EXPECT_EQ(sorted, want);
  // Adjoints run after the forward (the second and third tasks read what the first two wrote).
  HostValues after = base;
  auto v = after.view();
  ASSERT_TRUE(codegen::evaluate(*k, v).ok());
  auto [g_fwd, f_fwd] = run_adjoint(*k, ca->adjoint, after, trips);
  auto [g_cnt, f_cnt] = run_adjoint(*k, ca->adjoint, after, count_trips(*k, *ca, base));
  EXPECT_EQ(f_fwd, 0u);
  EXPECT_EQ(f_cnt, 0u);
  for (size_t p = 0; p < g_fwd.size(); ++p)
    EXPECT_TRUE(same_bits(g_fwd[p], g_cnt[p])) << "gradient " << p;
}

// The AD fuzzer's kernels without stated bounds (nested while / for loops bounded by table
// entries, break / continue, several counted loops): the counting forward writes what the
// forward writes and counts what the counter counts. Also with segmented checkpointing (as on
// GPUs), where the counter runs the split kernel the adjoint differentiates and the counting
// forward the unsplit one: the counted loops are the same statements in both.
TEST(CountedSizing, CountingForwardOnFuzzKernels) {
  uint32_t seed0 = env_or("VKAD_AD_FUZZ_SEED", 1), count = env_or("VKAD_AD_FUZZ_COUNT", 5000) / 10;
  int counted_kernels = 0, several = 0, split = 0;
  codegen::AdjointOptions segmented;
  segmented.checkpoint_segment = 4;
  for (uint32_t seed = seed0; seed < seed0 + count; ++seed) {
    AdFuzzCase c = random_ad_kernel(seed);
    Kernel bare = c.kernel;
    for (codegen::Task& t : bare.tasks) strip_caps(t.body);
    auto ca = codegen::make_adjoint_counted(bare);
    ASSERT_TRUE(ca.ok()) << "seed " << seed << ": " << ca.status().to_string();
    if (ca->counted == 0) continue;
    ++counted_kernels;
    several += ca->counted > 1;
    expect_counting_forward_matches(bare, *ca, c.args, "seed " + std::to_string(seed));
    auto cs = codegen::make_adjoint_counted(bare, codegen::Target::host(), segmented);
    ASSERT_TRUE(cs.ok()) << "seed " << seed << ": " << cs.status().to_string();
    split += codegen::print(cs->counter) != codegen::print(ca->counter);
    expect_counting_forward_matches(bare, *cs, c.args,
                                    "seed " + std::to_string(seed) + ", segmented");
    if (::testing::Test::HasFailure()) FAIL() << "seed " << seed << "\n" << codegen::print(bare);
  }
  EXPECT_GT(counted_kernels, static_cast<int>(count) / 8);
  EXPECT_GT(several, 0);
  EXPECT_GT(split, 0);  // kernels whose counter runs segmented loops
}

}  // namespace
}  // namespace vkad::testing
