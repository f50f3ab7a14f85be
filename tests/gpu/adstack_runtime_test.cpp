// Adstack heaps in the runtime: growth while earlier launches are in flight (no synchronize in
// between), overflow raised / reported / recovered from, a closed-form gradient, and stacks of
// every heap with fewer threads than iterations. Each test runs once per adstack layout.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "autodiff/reverse_mode.h"
#include "gpu/kernel_harness.h"
#include "ir/text.h"

namespace vkad::testing {
namespace {

using runtime::Arg;
using runtime::DType;

const char* kRecurrence = R"(kernel rec(n: i32, x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = alloca : f32
    %x = load x[%i] : f32
    store_local %v, %x
    %z = const 0 : i32
    %n = arg n : i32
    %c = const 0.5 : f32
    for %k in [%z, %n) {
      %a = load_local %v : f32
      %s = sin %a : f32
      %m = mul %s, %c : f32
      %r = add %m, %c : f32
      store_local %v, %r
    }
    %out = load_local %v : f32
    store y[%i], %out
  }
})";

// Per element, cnt[i] sin steps under a stated max_trip(4): counts past 4 overflow the stack.
const char* kDataDependentTrips =
    R"(kernel dd(cnt: ndarray<i32, 1>, x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = alloca : f32
    %x = load x[%i] : f32
    store_local %v, %x
    %zero = const 0 : i32
    %c = load cnt[%i] : i32
    for %k in [%zero, %c) max_trip(4) {
      %a = load_local %v : f32
      %s = sin %a : f32
      store_local %v, %s
    }
    %out = load_local %v : f32
    store y[%i], %out
  }
})";

class AdstackRuntime : public KernelTest, public ::testing::WithParamInterface<adstack::Layout> {
 protected:
  void SetUp() override {
    KernelTest::SetUp();
    if (runner_) runner_->set_adstack_layout(GetParam());
  }
  runtime::CompiledKernel adjoint(const char* text) {
    auto k = codegen::parse(text);
    EXPECT_TRUE(k.ok()) << k.status().to_string();
    forward_ = *k;
    // Every loop's stacks as the loop states them: these tests count stacks, capacities and
    // variants, which segmented checkpointing (checkpoint.h) would change.
    codegen::Target target = runner_->target();
    auto a = codegen::make_adjoint(*k, target, codegen::AdjointOptions{});
    EXPECT_TRUE(a.ok()) << a.status().to_string();
    adjoint_ = *a;
    auto c = codegen::compile(*a, target);
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    return *c;
  }
  runtime::NdArrayHandle array(const std::vector<float>& v) {
    auto h = runner_->rt().create_ndarray(DType::kF32, {static_cast<uint32_t>(v.size())});
    EXPECT_TRUE(h.ok());
    EXPECT_TRUE(runner_->rt().upload(*h, v.data(), 4 * v.size()).ok());
    return *h;
  }
  std::vector<float> read(runtime::NdArrayHandle h, size_t n) {
    std::vector<float> v(n);
    Status s = runner_->rt().download(h, v.data(), 4 * n);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return v;
  }
  codegen::Kernel forward_, adjoint_;
};

// The heap tier forced, whatever VKAD_ADSTACK_TIER says: these tests are about the heaps.
class AdstackHeapTier : public AdstackRuntime {
 protected:
  runtime::RuntimeOptions options() const override {
    runtime::RuntimeOptions o;
    o.adstack_tier = runtime::AdstackTier::kHeap;
    return o;
  }
};

TEST_P(AdstackHeapTier, HeapGrowsWhileEarlierLaunchesAreInFlight) {
  runtime::CompiledKernel ck = adjoint(kRecurrence);
  auto h = runner_->rt().register_kernel(ck);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  const size_t n = 4096;
  std::vector<float> xs(n), seed(n, 1.0f);
  for (size_t i = 0; i < n; ++i) xs[i] = std::sin(0.01f * static_cast<float>(i));
  auto x = array(xs), y = array(std::vector<float>(n, 0)), yg = array(seed);
  const int trips[] = {2, 40, 300, 7};
  std::vector<runtime::NdArrayHandle> grads;
  uint64_t growths_before = runner_->rt().stats()->adstack_heap_growths;
  for (int t : trips) {
    grads.push_back(array(std::vector<float>(n, 0)));
    Arg args[] = {Arg::i32(t), Arg::ndarray(x), Arg::ndarray(y), Arg::ndarray(grads.back()),
                  Arg::ndarray(yg)};
    Status st = runner_->rt().launch(*h, args);
    ASSERT_TRUE(st.ok()) << st.to_string();
    ASSERT_TRUE(runner_->rt().flush().ok());  // submitted, not waited for
  }
  EXPECT_GT(runner_->rt().stats()->adstack_heap_growths, growths_before)
      << "trip 300 needs a bigger heap";
  ASSERT_TRUE(runner_->rt().synchronize().ok());
  // Each launch's gradients equal the CPU reference adjoint's for its own trip count.
  for (size_t l = 0; l < grads.size(); ++l) {
    std::vector<float> got = read(grads[l], n);
    codegen::HostArray hx(DType::kF32, {n}), hy(DType::kF32, {n}), hxg(DType::kF32, {n}),
        hyg(DType::kF32, {n});
    for (size_t i = 0; i < n; ++i) hx.data[i] = xs[i], hyg.data[i] = 1.0;
    std::vector<codegen::HostArg> args = {codegen::HostArg::of(trips[l]), codegen::HostArg::of(hx),
                                          codegen::HostArg::of(hy), codegen::HostArg::of(hxg),
                                          codegen::HostArg::of(hyg)};
    ASSERT_TRUE(codegen::evaluate(adjoint_, args).ok());
    codegen::HostArray dev(DType::kF32, {n});
    for (size_t i = 0; i < n; ++i) dev.data[i] = got[i];
    EXPECT_EQ(compare_arrays(dev, hxg), "") << "launch with trip count " << trips[l];
  }
}

TEST_P(AdstackRuntime, CapacityPast64BitsIsALaunchErrorNamingKernelAndStack) {
  // A stated bound n*n*n: with n = 3,000,000 it is 2.7e19, past 2^63. Before checked size
  // arithmetic this wrapped to a garbage capacity (and aborted under UBSan).
  runtime::CompiledKernel ck = adjoint(
      R"(kernel cube(n: i32, cnt: ndarray<i32, 1>, x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = alloca : f32
    %x = load x[%i] : f32
    store_local %v, %x
    %zero = const 0 : i32
    %c = load cnt[%i] : i32
    for %k in [%zero, %c) max_trip(mul(n, mul(n, n))) {
      %a = load_local %v : f32
      %s = sin %a : f32
      store_local %v, %s
    }
    %out = load_local %v : f32
    store y[%i], %out
  }
})");
  auto h = runner_->rt().register_kernel(ck);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  auto cnt = runner_->rt().create_ndarray(DType::kI32, {4});
  ASSERT_TRUE(cnt.ok());
  auto x = array(std::vector<float>(4, 0.5f)), y = array(std::vector<float>(4, 0)),
       xg = array(std::vector<float>(4, 0)), yg = array(std::vector<float>(4, 1));
  Arg args[] = {Arg::i32(3'000'000), Arg::ndarray(*cnt), Arg::ndarray(x),
                Arg::ndarray(y),     Arg::ndarray(xg),   Arg::ndarray(yg)};
  auto before = runner_->rt().stats()->launches;
  Status st = runner_->rt().launch(*h, args);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find("launch of 'cube_adjoint' task 'main_adjoint': adstack %"),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("size overflows 64 bits"), std::string::npos) << st.message();
  EXPECT_EQ(runner_->rt().stats()->launches, before) << "nothing recorded";
  // A bound that fits launches normally.
  args[0] = Arg::i32(2);
  ASSERT_TRUE(runner_->rt().launch(*h, args).ok());
  EXPECT_TRUE(runner_->rt().synchronize().ok());
}

TEST_P(AdstackRuntime, OverflowIsReportedNamingTheStackAndRecoveredFrom) {
  // The loop states max_trip(4), but the counts go up to 9.
  runtime::CompiledKernel ck = adjoint(kDataDependentTrips);
  auto h = runner_->rt().register_kernel(ck);
  ASSERT_TRUE(h.ok());
  const size_t n = 256;
  std::vector<int32_t> counts(n);
  for (size_t i = 0; i < n; ++i) counts[i] = static_cast<int32_t>(i % 10);
  auto cnt = runner_->rt().create_ndarray(DType::kI32, {n});
  ASSERT_TRUE(cnt.ok());
  ASSERT_TRUE(runner_->rt().upload(*cnt, counts.data(), 4 * n).ok());
  auto x = array(std::vector<float>(n, 0.5f)), y = array(std::vector<float>(n, 0)),
       xg = array(std::vector<float>(n, 0)), yg = array(std::vector<float>(n, 1));
  Arg args[] = {Arg::ndarray(*cnt), Arg::ndarray(x), Arg::ndarray(y), Arg::ndarray(xg),
                Arg::ndarray(yg)};
  ASSERT_TRUE(runner_->rt().launch(*h, args).ok());
  Status st = runner_->rt().synchronize();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), ErrorCode::kDeviceError);
  EXPECT_NE(st.message().find("kernel 'dd_adjoint', task 'main_adjoint': adstack %"),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("overflowed its capacity of 4 entries per thread"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("max_trip"), std::string::npos) << st.message();

  // Reported once; with counts inside the bound the same kernel runs cleanly and correctly.
  for (size_t i = 0; i < n; ++i) counts[i] = static_cast<int32_t>(i % 5);
  ASSERT_TRUE(runner_->rt().upload(*cnt, counts.data(), 4 * n).ok());
  std::vector<float> zero(n, 0);
  ASSERT_TRUE(runner_->rt().upload(xg, zero.data(), 4 * n).ok());
  ASSERT_TRUE(runner_->rt().launch(*h, args).ok());
  ASSERT_TRUE(runner_->rt().synchronize().ok());
  std::vector<float> g = read(xg, n);
  for (size_t i = 0; i < 10; ++i) {
    // d/dx of sin applied c times at x = 0.5: product of cos over the iterates.
    double v = 0.5, d = 1;
    for (size_t k = 0; k < i % 5; ++k) d *= std::cos(v), v = std::sin(v);
    EXPECT_NEAR(g[i], d, 1e-5) << i;
  }
}

TEST_P(AdstackRuntime, OverflowNamesTheLaunchThatHitIt) {
  // Three launches with separate counts and gradients, one submission: only the second's counts
  // exceed max_trip(4), and the error names exactly that launch.
  runtime::CompiledKernel ck = adjoint(kDataDependentTrips);
  auto h = runner_->rt().register_kernel(ck);
  ASSERT_TRUE(h.ok());
  const size_t n = 64;
  auto x = array(std::vector<float>(n, 0.5f)), y = array(std::vector<float>(n, 0)),
       yg = array(std::vector<float>(n, 1));
  std::vector<runtime::LaunchId> ids;
  std::vector<runtime::NdArrayHandle> grads;
  for (int l = 0; l < 3; ++l) {
    std::vector<int32_t> counts(n, 3);
    if (l == 1) counts[n / 2] = 7;  // past the stated bound of 4
    auto cnt = runner_->rt().create_ndarray(DType::kI32, {n});
    ASSERT_TRUE(cnt.ok());
    ASSERT_TRUE(runner_->rt().upload(*cnt, counts.data(), 4 * n).ok());
    grads.push_back(array(std::vector<float>(n, 0)));
    Arg args[] = {Arg::ndarray(*cnt), Arg::ndarray(x), Arg::ndarray(y), Arg::ndarray(grads.back()),
                  Arg::ndarray(yg)};
    runtime::LaunchId id;
    ASSERT_TRUE(runner_->rt().launch(*h, args, &id).ok());
    ids.push_back(id);
  }
  EXPECT_LT(ids[0], ids[1]);
  EXPECT_LT(ids[1], ids[2]);
  EXPECT_EQ(runner_->rt().next_launch_id().value, ids[2].value + 1);
  Status st = runner_->rt().synchronize();
  ASSERT_EQ(st.code(), ErrorCode::kDeviceError) << st.to_string();
  const std::string second = "(in launch #" + std::to_string(ids[1].value) + ")";
  EXPECT_NE(st.message().find(second), std::string::npos) << st.message();
  EXPECT_EQ(st.message().find("#" + std::to_string(ids[0].value) + ")"), std::string::npos)
      << st.message();
  EXPECT_EQ(st.message().find("#" + std::to_string(ids[2].value) + ")"), std::string::npos)
      << st.message();
  // The same, as data: one error, hit by the second launch only.
  const auto& errors = runner_->rt().device_errors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].kernel, "dd_adjoint");
  EXPECT_EQ(errors[0].task, "main_adjoint");
  EXPECT_EQ(errors[0].code, runtime::kErrorAdstackOverflow);
  EXPECT_EQ(errors[0].count, 1u);
  EXPECT_EQ(errors[0].launches, std::vector<runtime::LaunchId>{ids[1]});
  // The other launches' gradients are right: three sin steps from 0.5.
  double v = 0.5, d = 1;
  for (int k = 0; k < 3; ++k) d *= std::cos(v), v = std::sin(v);
  for (int l : {0, 2}) {
    for (float g : read(grads[l], n)) ASSERT_NEAR(g, d, 1e-5) << "launch " << l;
  }
}

TEST_P(AdstackRuntime, LinearRecurrenceMatchesItsClosedForm) {
  // v <- a v + x_k over n steps: dy/dx_k = a^(n-1-k), dy/dv0 = a^n.
  runtime::CompiledKernel ck = adjoint(
      R"(kernel lin(n: i32, v0: ndarray<f32, 1> grad, xs: ndarray<f32, 2> grad, y: ndarray<f32, 1> grad) {
  task main parallel %i in [0, shape(v0, 0)) {
    %v = alloca : f32
    %init = load v0[%i] : f32
    store_local %v, %init
    %z = const 0 : i32
    %n = arg n : i32
    %a = const 0.75 : f32
    for %k in [%z, %n) {
      %cur = load_local %v : f32
      %xk = load xs[%i, %k] : f32
      %m = mul %cur, %a : f32
      %s = add %m, %xk : f32
      store_local %v, %s
    }
    %o = load_local %v : f32
    store y[%i], %o
  }
})");
  EXPECT_EQ(codegen::print(adjoint_).find("stack_alloc"), std::string::npos)
      << "a linear update needs no stack";
  auto h = runner_->rt().register_kernel(ck);
  ASSERT_TRUE(h.ok());
  const uint32_t rows = 8, n = 12;
  auto v0 = array(std::vector<float>(rows, 1)), y = array(std::vector<float>(rows, 0)),
       v0g = array(std::vector<float>(rows, 0)), yg = array(std::vector<float>(rows, 1));
  auto xs = runner_->rt().create_ndarray(DType::kF32, {rows, n});
  auto xsg = runner_->rt().create_ndarray(DType::kF32, {rows, n});
  ASSERT_TRUE(xs.ok() && xsg.ok());
  std::vector<float> zeros(rows * n, 0);
  ASSERT_TRUE(runner_->rt().upload(*xs, zeros.data(), 4 * zeros.size()).ok());
  ASSERT_TRUE(runner_->rt().upload(*xsg, zeros.data(), 4 * zeros.size()).ok());
  Arg args[] = {Arg::i32(n),       Arg::ndarray(v0),   Arg::ndarray(*xs), Arg::ndarray(y),
                Arg::ndarray(v0g), Arg::ndarray(*xsg), Arg::ndarray(yg)};
  ASSERT_TRUE(runner_->rt().launch(*h, args).ok());
  ASSERT_TRUE(runner_->rt().synchronize().ok());
  std::vector<float> gv = read(v0g, rows);
  std::vector<float> gx(rows * n);
  ASSERT_TRUE(runner_->rt().download(*xsg, gx.data(), 4 * gx.size()).ok());
  for (uint32_t r = 0; r < rows; ++r) {
    EXPECT_NEAR(gv[r], std::pow(0.75, n), 1e-6);
    for (uint32_t k = 0; k < n; ++k)
      EXPECT_NEAR(gx[r * n + k], std::pow(0.75, n - 1 - k), 1e-6) << r << "," << k;
  }
}

// Stacks in all three heaps (f32, f64, and the integer index), with two workgroups for 4096
// iterations: each thread grid-strides over 32 iterations, reusing its stack slots, and the
// slot-major stride T (dispatched threads) differs from the range.
class AdstackFewThreads : public AdstackRuntime {
 protected:
  runtime::RuntimeOptions options() const override {
    runtime::RuntimeOptions o;
    o.max_groups = 2;
    return o;
  }
};

TEST_P(AdstackFewThreads, StacksOfEveryHeapMatchTheCpuReference) {
  if (!runner_->target().float64) GTEST_SKIP() << "device has no f64";
  adjoint(
      R"(kernel mix(n: i32, x: ndarray<f32, 1> grad, w: ndarray<f32, 1>, d: ndarray<f64, 1> grad, y: ndarray<f32, 1> grad, yd: ndarray<f64, 1> grad) {
  task main parallel %i in [0, shape(x, 0)) {
    %v = alloca : f32
    %u = alloca : f64
    %j = alloca : i32
    %x = load x[%i] : f32
    store_local %v, %x
    %d = load d[%i] : f64
    store_local %u, %d
    %z = const 0 : i32
    %n = arg n : i32
    %one = const 1 : i32
    for %k in [%z, %n) {
      %jv = load_local %j : i32
      %wv = load w[%jv] : f32
      %a = load_local %v : f32
      %s = sin %a : f32
      %p = mul %s, %wv : f32
      store_local %v, %p
      %b = load_local %u : f64
      %c = cos %b : f64
      store_local %u, %c
      %jn = add %jv, %one : i32
      store_local %j, %jn
    }
    %o = load_local %v : f32
    store y[%i], %o
    %od = load_local %u : f64
    store yd[%i], %od
  }
})");
  std::string text = codegen::print(adjoint_);
  for (const char* heap : {": f32", ": f64", ": i32"}) {
    EXPECT_NE(text.find(std::string("stack_alloc cap(n) ") + heap), std::string::npos)
        << heap << "\n"
        << text;
  }
  const uint32_t n = 4096;
  // x, w, d, y, yd, then x_grad, d_grad (zero), y_grad, yd_grad (seeds).
  HostArgs args = make_args(
      adjoint_,
      {ArgSpec::of(6), ArgSpec::array({n}), ArgSpec::array({8}, 0.5, 1.5), ArgSpec::array({n}),
       ArgSpec::array({n}, 0, 0), ArgSpec::array({n}, 0, 0), ArgSpec::array({n}, 0, 0),
       ArgSpec::array({n}, 0, 0), ArgSpec::array({n}), ArgSpec::array({n})},
      7);
  HostArgs cpu = args;
  Status st = runner_->run(adjoint_, args);
  ASSERT_TRUE(st.ok()) << st.to_string();
  auto view = cpu.view();
  auto ref = codegen::evaluate(adjoint_, view);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  for (size_t p = 0; p < adjoint_.params.size(); ++p) {
    if (args.arrays[p].shape.empty()) continue;
    EXPECT_EQ(compare_arrays(args.arrays[p], cpu.arrays[p], 1e-4), "") << adjoint_.params[p].name;
  }
}

// Adjoint blocks (stack_acc_adj / stack_top_adj, which reverse mode does not emit today)
// beside a primal-only stack in the same row, over the grid-stride: device vs CPU reference.
TEST_P(AdstackFewThreads, AdjointBlocksBesidePrimalOnlyStacksMatchTheCpuReference) {
  auto k = codegen::parse(R"(kernel adj(n: i32, x: ndarray<f32, 1>, y: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(x, 0)) {
    %z = const 0 : i32
    %n = arg n : i32
    %x = load x[%i] : f32
    %p = stack_alloc cap(n) : f32
    %s = stack_alloc cap(n) : f32
    %acc = alloca : f32
    for %k in [%z, %n) {
      %kf = cast %k : f32
      %v = add %x, %kf : f32
      stack_push %p, %kf
      stack_push %s, %v
      %t = stack_top %s : f32
      stack_acc_adj %s, %t
      stack_acc_adj %s, %x
    }
    for %j in [%z, %n) {
      %a = stack_top_adj %s : f32
      %b = stack_top %p : f32
      %old = load_local %acc : f32
      %m = mul %a, %b : f32
      %sum = add %old, %m : f32
      store_local %acc, %sum
      stack_pop %s
      stack_pop %p
    }
    %r = load_local %acc : f32
    store y[%i], %r
  }
})");
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  auto ck = codegen::compile(*k, runner_->target());
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  ASSERT_EQ(ck->tasks[0].adstacks.size(), 2u);
  EXPECT_FALSE(adstack::has_adjoint_block(ck->tasks[0].adstacks[0]));
  EXPECT_TRUE(adstack::has_adjoint_block(ck->tasks[0].adstacks[1]));
  const uint32_t n = 4096;
  HostArgs args =
      make_args(*k, {ArgSpec::of(5), ArgSpec::array({n}), ArgSpec::array({n}, 0, 0)}, 3);
  HostArgs cpu = args;
  Status st = runner_->run_compiled(*ck, args);
  ASSERT_TRUE(st.ok()) << st.to_string();
  auto view = cpu.view();
  auto ref = codegen::evaluate(*k, view);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  EXPECT_EQ(compare_arrays(args.arrays[2], cpu.arrays[2], 1e-5), "");
}

auto layout_name = [](const ::testing::TestParamInfo<adstack::Layout>& info) {
  return layout_suffix(info.param);
};
// ---------------------------------------------------------------- storage tiers
// RuntimeOptions::adstack_tier and the private tier (adstack_layout.h, "Storage tiers").
class AdstackTiers : public AdstackRuntime {
 protected:
  runtime::RuntimeOptions options() const override {
    runtime::RuntimeOptions o;
    o.adstack_tier = tier_;
    o.adstack_private_budget_bytes = 64;  // 16 f32 slots
    o.adstack_private_min_length = min_length_;
    o.adstack_specialize = specialize_;
    o.adstack_specialize_max_variants = max_variants_;
    // Each launch's variant made by that launch: the counts below are per launch
    // (background specialization is tested in session_test.cpp).
    o.background_specialization = false;
    return o;
  }
  void SetUp() override {}  // each test picks its tier, then calls start()
  void start(runtime::AdstackTier tier, uint32_t min_length = 1,
             runtime::AdstackSpecialize specialize = runtime::AdstackSpecialize::kAuto,
             uint32_t max_variants = 8) {
    tier_ = tier;
    min_length_ = min_length;
    specialize_ = specialize;
    max_variants_ = max_variants;
    AdstackRuntime::SetUp();
  }
  // Launches the recurrence's adjoint with `trips` on `n` elements (one submission) and checks
  // its gradients against the CPU evaluator's.
  void check_recurrence(runtime::KernelHandle h, int trips, uint32_t n = 256) {
    std::vector<float> xs(n);
    for (size_t i = 0; i < n; ++i) xs[i] = std::sin(0.01f * static_cast<float>(i));
    auto x = array(xs), y = array(std::vector<float>(n, 0)), yg = array(std::vector<float>(n, 1)),
         xg = array(std::vector<float>(n, 0));
    Arg args[] = {Arg::i32(trips), Arg::ndarray(x), Arg::ndarray(y), Arg::ndarray(xg),
                  Arg::ndarray(yg)};
    ASSERT_TRUE(runner_->rt().launch(h, args).ok());
    Status st = runner_->rt().synchronize();
    ASSERT_TRUE(st.ok()) << st.to_string();
    std::vector<float> got = read(xg, n);
    codegen::HostArray hx(DType::kF32, {n}), hy(DType::kF32, {n}), hxg(DType::kF32, {n}),
        hyg(DType::kF32, {n});
    for (size_t i = 0; i < n; ++i) hx.data[i] = xs[i], hyg.data[i] = 1.0;
    std::vector<codegen::HostArg> hargs = {codegen::HostArg::of(trips), codegen::HostArg::of(hx),
                                           codegen::HostArg::of(hy), codegen::HostArg::of(hxg),
                                           codegen::HostArg::of(hyg)};
    ASSERT_TRUE(codegen::evaluate(adjoint_, hargs).ok());
    codegen::HostArray dev(DType::kF32, {n});
    for (size_t i = 0; i < n; ++i) dev.data[i] = got[i];
    EXPECT_EQ(compare_arrays(dev, hxg), "") << "trip count " << trips;
    for (auto a : {x, y, yg, xg}) EXPECT_TRUE(runner_->rt().free_ndarray(a).ok());
  }
  // start(), then the recurrence's adjoint registered; nullopt (a failure recorded where it
  // is one) when there is no device or registration fails.
  std::optional<runtime::KernelHandle> start_recurrence(
      runtime::AdstackTier tier, uint32_t min_length = 1,
      runtime::AdstackSpecialize specialize = runtime::AdstackSpecialize::kAuto,
      uint32_t max_variants = 8) {
    start(tier, min_length, specialize, max_variants);
    if (!runner_) return std::nullopt;
    auto h = runner_->rt().register_kernel(adjoint(kRecurrence));
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    if (!h.ok()) return std::nullopt;
    return *h;
  }
  runtime::AdstackTier tier_ = runtime::AdstackTier::kDefault;
  uint32_t min_length_ = 1;
  runtime::AdstackSpecialize specialize_ = runtime::AdstackSpecialize::kAuto;
  uint32_t max_variants_ = 8;
};

// The bucket tests count the private tier's generic variants: launch specialization off.
TEST_P(AdstackTiers, MinimumPrivateLengthMergesSmallBuckets) {
  auto h = start_recurrence(runtime::AdstackTier::kPrivate, 32, runtime::AdstackSpecialize::kOff);
  if (!h) return;
  for (int trips : {1, 9, 32}) check_recurrence(*h, trips);  // all in the 32-slot bucket
  EXPECT_EQ(runner_->rt().stats()->adstack_private_pipelines, 1u);
  check_recurrence(*h, 33);
  EXPECT_EQ(runner_->rt().stats()->adstack_private_pipelines, 2u);
  EXPECT_EQ(runner_->rt().stats()->adstack_private_dispatches, 4u);
}

TEST_P(AdstackTiers, PrivateTierMakesNoHeapAndOneVariantPerCapacityBucket) {
  auto h = start_recurrence(runtime::AdstackTier::kPrivate, 1, runtime::AdstackSpecialize::kOff);
  if (!h) return;
  EXPECT_EQ(runner_->rt().stats()->adstack_tier, runtime::AdstackTier::kPrivate);
  // Capacities 5, 7 and 8 round up to one bucket (8 slots), 9 to the next (16).
  for (int trips : {5, 7, 8}) check_recurrence(*h, trips);
  runtime::RuntimeStats s = *runner_->rt().stats();
  EXPECT_EQ(s.adstack_heap_bytes, 0u) << "the private tier needs no heap";
  EXPECT_EQ(s.adstack_private_dispatches, 3u);
  EXPECT_EQ(s.adstack_heap_dispatches, 0u);
  EXPECT_EQ(s.adstack_private_pipelines, 1u);
  check_recurrence(*h, 9);
  EXPECT_EQ(runner_->rt().stats()->adstack_private_pipelines, 2u);
  EXPECT_EQ(runner_->rt().stats()->adstack_heap_bytes, 0u);
}

TEST_P(AdstackTiers, ForcedPrivatePastTheHardLimitFallsBackToTheHeap) {
  auto h = start_recurrence(runtime::AdstackTier::kPrivate);
  if (!h) return;
  // 4097 f32 slots round up to 8192 (32 KiB per thread), past kMaxPrivateTierBytes.
  const int trips = static_cast<int>(runtime::kMaxPrivateTierBytes / 4) + 1;
  check_recurrence(*h, trips, 64);
  runtime::RuntimeStats s = *runner_->rt().stats();
  EXPECT_EQ(s.adstack_private_fallbacks, 1u);
  EXPECT_EQ(s.adstack_heap_dispatches, 1u);
  EXPECT_EQ(s.adstack_private_dispatches, 0u);
  EXPECT_GT(s.adstack_heap_bytes, 0u);
}

TEST_P(AdstackTiers, AutoUsesPrivateArraysUpToTheBudget) {
  auto h = start_recurrence(runtime::AdstackTier::kAuto);
  if (!h) return;
  check_recurrence(*h, 16);  // 16 slots: 64 bytes, the budget
  EXPECT_EQ(runner_->rt().stats()->adstack_private_dispatches, 1u);
  EXPECT_EQ(runner_->rt().stats()->adstack_heap_bytes, 0u);
  check_recurrence(*h, 17);  // rounds up to 32 slots: 128 bytes
  EXPECT_EQ(runner_->rt().stats()->adstack_heap_dispatches, 1u);
  EXPECT_EQ(runner_->rt().stats()->adstack_private_fallbacks, 0u) << "over budget is no fallback";
  EXPECT_GT(runner_->rt().stats()->adstack_heap_bytes, 0u);
}

TEST_P(AdstackTiers, HeapTierNeverUsesPrivateArrays) {
  auto h = start_recurrence(runtime::AdstackTier::kHeap);
  if (!h) return;
  check_recurrence(*h, 3);
  EXPECT_EQ(runner_->rt().stats()->adstack_private_dispatches, 0u);
  EXPECT_EQ(runner_->rt().stats()->adstack_private_pipelines, 0u);
  EXPECT_GT(runner_->rt().stats()->adstack_heap_bytes, 0u);
}

TEST_P(AdstackTiers, OverflowIsReportedInThePrivateTier) {
  start(runtime::AdstackTier::kPrivate);
  if (!runner_) return;
  auto h = runner_->rt().register_kernel(adjoint(kDataDependentTrips));
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  const size_t n = 64;
  std::vector<int32_t> counts(n, 3);
  counts[17] = 6;  // past max_trip(4)
  auto cnt = runner_->rt().create_ndarray(DType::kI32, {n});
  ASSERT_TRUE(cnt.ok());
  ASSERT_TRUE(runner_->rt().upload(*cnt, counts.data(), 4 * n).ok());
  auto x = array(std::vector<float>(n, 0.5f)), y = array(std::vector<float>(n, 0)),
       xg = array(std::vector<float>(n, 0)), yg = array(std::vector<float>(n, 1));
  Arg args[] = {Arg::ndarray(*cnt), Arg::ndarray(x), Arg::ndarray(y), Arg::ndarray(xg),
                Arg::ndarray(yg)};
  ASSERT_TRUE(runner_->rt().launch(*h, args).ok());
  Status st = runner_->rt().synchronize();
  EXPECT_EQ(st.code(), ErrorCode::kDeviceError) << st.to_string();
  EXPECT_NE(st.message().find("overflowed its capacity of 4 entries per thread"), std::string::npos)
      << st.message();
  EXPECT_EQ(runner_->rt().stats()->adstack_private_dispatches, 1u);
  EXPECT_EQ(runner_->rt().stats()->adstack_heap_bytes, 0u);
}

// Launch specialization (abi/kernel_abi.h): one variant per trip count, each one's gradients
// the CPU reference's; the variant cap; which tiers it applies to.
TEST_P(AdstackTiers, SpecializedVariantPerTripCountMatchesTheCpuReference) {
  start(runtime::AdstackTier::kPrivate);
  if (!runner_) return;
  auto ck = adjoint(kRecurrence);
  ASSERT_FALSE(ck.tasks[0].spec_words.empty());
  auto h = runner_->rt().register_kernel(ck);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  // 5 and 7 share the 8-slot private bucket but are separate specialized variants; the second
  // launch with 5 reuses the first variant.
  for (int trips : {5, 7, 5}) check_recurrence(*h, trips);
  runtime::RuntimeStats s = *runner_->rt().stats();
  EXPECT_EQ(s.adstack_specialize, runtime::AdstackSpecialize::kAuto);
  EXPECT_EQ(s.adstack_specialized_dispatches, 3u);
  EXPECT_EQ(s.adstack_specialized_pipelines, 2u);
  EXPECT_EQ(s.adstack_private_pipelines, 2u);
  EXPECT_EQ(s.adstack_specialize_misses, 0u);
}

// Runtime::prepare makes the pipelines a launch with those arguments uses (here the private
// tier's specialized variant) without launching or making a heap; the launch then finds them.
TEST_P(AdstackTiers, PrepareMakesTheLaunchsPipelinesAheadOfIt) {
  auto h = start_recurrence(runtime::AdstackTier::kAuto);
  if (!h) return;
  const uint32_t n = 256;
  auto x = array(std::vector<float>(n, 0.5f)), y = array(std::vector<float>(n, 0)),
       xg = array(std::vector<float>(n, 0)), yg = array(std::vector<float>(n, 1));
  Arg args[] = {Arg::i32(5), Arg::ndarray(x), Arg::ndarray(y), Arg::ndarray(xg), Arg::ndarray(yg)};
  // Bad arguments: the launch's error, nothing made.
  Arg too_few[] = {Arg::i32(5), Arg::ndarray(x)};
  Status bad = runner_->rt().prepare(*h, too_few);
  EXPECT_EQ(bad.code(), ErrorCode::kInvalidArgument) << bad.to_string();
  EXPECT_EQ(runner_->rt().stats()->adstack_private_pipelines, 0u);
  Status st = runner_->rt().prepare(*h, args);
  ASSERT_TRUE(st.ok()) << st.to_string();
  runtime::RuntimeStats s = *runner_->rt().stats();
  EXPECT_EQ(s.prepares, 1u);
  EXPECT_EQ(s.launches, 0u);
  EXPECT_EQ(s.adstack_specialized_pipelines, 1u);
  EXPECT_EQ(s.adstack_private_pipelines, 1u);
  EXPECT_EQ(s.adstack_heap_bytes, 0u);
  EXPECT_EQ(s.adstack_specialized_dispatches, 0u) << "prepare dispatches nothing";
  for (auto a : {x, y, xg, yg}) EXPECT_TRUE(runner_->rt().free_ndarray(a).ok());
  check_recurrence(*h, 5, n);  // the same trip count: the prepared variant, a right gradient
  s = *runner_->rt().stats();
  EXPECT_EQ(s.adstack_specialized_dispatches, 1u);
  EXPECT_EQ(s.adstack_specialized_pipelines, 1u) << "the launch made no pipeline of its own";
  EXPECT_EQ(s.adstack_private_pipelines, 1u);
  // A freed kernel handle is refused, naming the call.
  ASSERT_TRUE(runner_->rt().unregister_kernel(*h).ok());
  Status gone = runner_->rt().prepare(*h, args);
  EXPECT_EQ(gone.code(), ErrorCode::kNotFound) << gone.to_string();
  EXPECT_NE(gone.message().find("prepare"), std::string::npos) << gone.to_string();
}

TEST_P(AdstackTiers, PastTheVariantCapLaunchesUseTheGenericPipeline) {
  auto h =
      start_recurrence(runtime::AdstackTier::kPrivate, 1, runtime::AdstackSpecialize::kAuto, 1);
  if (!h) return;
  for (int trips : {5, 7, 6, 5}) check_recurrence(*h, trips);
  runtime::RuntimeStats s = *runner_->rt().stats();
  EXPECT_EQ(s.adstack_specialized_pipelines, 1u) << "the cap is one variant";
  EXPECT_EQ(s.adstack_specialized_dispatches, 2u) << "5 twice";
  EXPECT_EQ(s.adstack_specialize_misses, 2u) << "7 and 6";
  EXPECT_EQ(s.adstack_private_pipelines, 2u) << "the specialized one and the generic 8-slot one";
}

TEST_P(AdstackTiers, AutoSpecializesOnlyUpToTheCapacityLimit) {
  auto h = start_recurrence(runtime::AdstackTier::kHeap, 1, runtime::AdstackSpecialize::kAuto);
  if (!h) return;
  check_recurrence(*h, 6);
  const uint32_t past = runtime::RuntimeOptions{}.adstack_specialize_max_capacity + 1;
  check_recurrence(*h, static_cast<int>(past));
  runtime::RuntimeStats s = *runner_->rt().stats();
  EXPECT_EQ(s.adstack_specialized_dispatches, 1u) << "6 entries: specialized, in the heap tier too";
  EXPECT_EQ(s.adstack_specialized_pipelines, 1u);
  EXPECT_EQ(s.adstack_specialize_misses, 0u) << "past the capacity limit is no miss";
}

TEST_P(AdstackTiers, AutoLimitInThePrivateTierIsItsOwn) {
  auto h = start_recurrence(runtime::AdstackTier::kPrivate, 1, runtime::AdstackSpecialize::kAuto);
  if (!h) return;
  const runtime::RuntimeOptions d;
  ASSERT_GT(d.adstack_specialize_max_private_capacity, d.adstack_specialize_max_capacity);
  check_recurrence(*h, static_cast<int>(d.adstack_specialize_max_private_capacity), 64);
  check_recurrence(*h, static_cast<int>(d.adstack_specialize_max_private_capacity) + 1, 64);
  runtime::RuntimeStats s = *runner_->rt().stats();
  EXPECT_EQ(s.adstack_private_dispatches, 2u);
  EXPECT_EQ(s.adstack_specialized_dispatches, 1u) << "only the one within the private limit";
}

TEST_P(AdstackTiers, HeapTierSpecializedUnderAllMatchesTheCpuReference) {
  auto h = start_recurrence(runtime::AdstackTier::kHeap, 1, runtime::AdstackSpecialize::kAll);
  if (!h) return;
  // Different element counts change the dispatched threads (not a specialized word): one variant.
  check_recurrence(*h, 6, 256);
  check_recurrence(*h, 6, 1000);
  check_recurrence(*h, 40, 300);  // past kAuto's capacity limit: kAll specializes it anyway
  runtime::RuntimeStats s = *runner_->rt().stats();
  EXPECT_EQ(s.adstack_specialized_dispatches, 3u);
  EXPECT_EQ(s.adstack_specialized_pipelines, 2u);
  EXPECT_EQ(s.adstack_private_pipelines, 0u);
  EXPECT_GT(s.adstack_heap_bytes, 0u);
}

TEST_P(AdstackTiers, SpecializationOffMakesNoSpecializedVariant) {
  auto h = start_recurrence(runtime::AdstackTier::kPrivate, 1, runtime::AdstackSpecialize::kOff);
  if (!h) return;
  check_recurrence(*h, 4);
  EXPECT_EQ(runner_->rt().stats()->adstack_specialized_dispatches, 0u);
  EXPECT_EQ(runner_->rt().stats()->adstack_specialized_pipelines, 0u);
  EXPECT_EQ(runner_->rt().stats()->adstack_private_pipelines, 1u);
}

TEST_P(AdstackTiers, MalformedSpecWordsAreRefusedAtRegistration) {
  start(runtime::AdstackTier::kPrivate);
  if (!runner_) return;
  auto ck = adjoint(kRecurrence);
  auto past = ck;
  past.tasks[0].spec_words.back() = past.args_bytes();  // one word past the args buffer
  auto bad = runner_->rt().register_kernel(past);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("spec_words"), std::string::npos) << bad.status().message();
  auto extra = ck;
  extra.tasks[0].spec_words.push_back(0);  // the module declares no constants for a new word
  EXPECT_EQ(runner_->rt().register_kernel(extra).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(runner_->rt().register_kernel(ck).ok());
}

TEST(AdstackSpecializeOption, EnvironmentVariableSetsTheDefaultAndBadValuesAreNamed) {
  ASSERT_EQ(setenv("VKAD_ADSTACK_SPECIALIZE", "sometimes", 1), 0);
  auto bad = runtime::Runtime::create();
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("VKAD_ADSTACK_SPECIALIZE is 'sometimes'"),
            std::string::npos)
      << bad.status().message();
  ASSERT_EQ(setenv("VKAD_ADSTACK_SPECIALIZE", "all", 1), 0);
  auto rt = runtime::Runtime::create();
  if (!rt.ok()) GTEST_SKIP() << rt.status().to_string();
  EXPECT_EQ((*rt)->stats()->adstack_specialize, runtime::AdstackSpecialize::kAll);
  runtime::RuntimeOptions o;
  o.adstack_specialize = runtime::AdstackSpecialize::kOff;
  auto rt2 = runtime::Runtime::create(o);
  ASSERT_TRUE(rt2.ok());
  EXPECT_EQ((*rt2)->stats()->adstack_specialize, runtime::AdstackSpecialize::kOff);
  unsetenv("VKAD_ADSTACK_SPECIALIZE");
}

TEST(AdstackTierOption, EnvironmentVariableSetsTheDefaultAndBadValuesAreNamed) {
  // Each GPU test runs in its own process (tests/CMakeLists.txt), so setenv stays local.
  ASSERT_EQ(setenv("VKAD_ADSTACK_TIER", "sideways", 1), 0);
  auto bad = runtime::Runtime::create();
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument) << "checked before any device";
  EXPECT_NE(bad.status().message().find("VKAD_ADSTACK_TIER is 'sideways'"), std::string::npos)
      << bad.status().message();
  ASSERT_EQ(setenv("VKAD_ADSTACK_TIER", "heap", 1), 0);
  auto rt = runtime::Runtime::create();
  if (!rt.ok()) GTEST_SKIP() << rt.status().to_string();
  EXPECT_EQ((*rt)->stats()->adstack_tier, runtime::AdstackTier::kHeap);
  // An explicit option wins over the environment.
  runtime::RuntimeOptions o;
  o.adstack_tier = runtime::AdstackTier::kPrivate;
  auto rt2 = runtime::Runtime::create(o);
  ASSERT_TRUE(rt2.ok());
  EXPECT_EQ((*rt2)->stats()->adstack_tier, runtime::AdstackTier::kPrivate);
  unsetenv("VKAD_ADSTACK_TIER");
}

INSTANTIATE_TEST_SUITE_P(Layouts, AdstackHeapTier, ::testing::ValuesIn(kAdstackLayouts),
                         layout_name);
INSTANTIATE_TEST_SUITE_P(Layouts, AdstackTiers, ::testing::ValuesIn(kAdstackLayouts), layout_name);
INSTANTIATE_TEST_SUITE_P(Layouts, AdstackRuntime, ::testing::ValuesIn(kAdstackLayouts),
                         layout_name);
INSTANTIATE_TEST_SUITE_P(Layouts, AdstackFewThreads, ::testing::ValuesIn(kAdstackLayouts),
                         layout_name);

}  // namespace
}  // namespace vkad::testing
