// The lavapipe loop limit: Mesa's lavapipe leaves loops silently after 65,535 passes per shader
// invocation (all loops of the invocation together), so launch refuses a launch whose known
// passes exceed it (ir/loop_passes.h has the count). These tests run where the device has
// such a limit (lavapipe) and skip visibly elsewhere.
#include <gtest/gtest.h>

#include <functional>

#include "gpu/kernel_harness.h"
#include "ir/loop_passes.h"
#include "ir/text.h"

namespace vkad::testing {
namespace {

using runtime::Arg;
using runtime::DType;

// y[i] = n, counted one by one in a serial loop.
const char* kCount = R"(kernel passes(n: i32, y: ndarray<i32, 1>) {
  task main parallel %i in [0, shape(y, 0)) {
    %acc = alloca : i32
    %z = const 0 : i32
    %n = arg n : i32
    %one = const 1 : i32
    for %k in [%z, %n) {
      %a = load_local %acc : i32
      %b = add %a, %one : i32
      store_local %acc, %b
    }
    %r = load_local %acc : i32
    store y[%i], %r
  }
})";

// y[i] = m * n + n: a nested pair of loops, then a loop after them.
const char* kNested = R"(kernel nested(m: i32, n: i32, y: ndarray<i32, 1>) {
  task main parallel %i in [0, shape(y, 0)) {
    %acc = alloca : i32
    %z = const 0 : i32
    %m = arg m : i32
    %n = arg n : i32
    %one = const 1 : i32
    for %j in [%z, %m) {
      for %k in [%z, %n) {
        %a = load_local %acc : i32
        %b = add %a, %one : i32
        store_local %acc, %b
      }
    }
    for %k2 in [%z, %n) {
      %a2 = load_local %acc : i32
      %b2 = add %a2, %one : i32
      store_local %acc, %b2
    }
    %r = load_local %acc : i32
    store y[%i], %r
  }
})";

class LoopLimit : public KernelTest {
 protected:
  void SetUp() override {
    KernelTest::SetUp();
    if (runner_ && runner_->rt().caps().max_loop_passes == 0) {
      GTEST_SKIP() << "device '" << runner_->rt().caps().device_name << "' has no loop limit";
    }
  }
  codegen::Kernel parse(const char* text) {
    auto k = codegen::parse(text);
    EXPECT_TRUE(k.ok()) << k.status().to_string();
    return k.ok() ? *k : codegen::Kernel{};
  }
  runtime::KernelHandle register_kernel(const codegen::Kernel& k) {
    auto ck = codegen::compile(k, runner_->target());
    EXPECT_TRUE(ck.ok()) << ck.status().to_string();
    auto h = runner_->rt().register_kernel(*ck);
    EXPECT_TRUE(h.ok()) << h.status().to_string();
    return *h;
  }
  // Runs `k` with integer scalars `scalars` and an i32 output of `len` elements on the device,
  // and compares it with the CPU evaluator. Returns the launch's status.
  Status run_and_compare(const codegen::Kernel& k, std::vector<double> scalars, uint32_t len) {
    std::vector<ArgSpec> specs;
    for (double s : scalars) specs.push_back(ArgSpec::of(s));
    specs.push_back(ArgSpec::array({len}, 0, 0));
    HostArgs dev = make_args(k, specs, 1), cpu = make_args(k, specs, 1);
    Status st = runner_->run(k, dev);
    if (!st.ok()) return st;
    auto view = cpu.view();
    auto r = codegen::evaluate(k, view);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(compare_arrays_exact(dev.arrays.back(), cpu.arrays.back()), "")
        << k.name << " with scalars " << ::testing::PrintToString(scalars);
    return st;
  }
};

TEST_F(LoopLimit, LaunchPastTheLimitIsRefusedNamingKernelTaskAndCount) {
  codegen::Kernel k = parse(kCount);
  runtime::KernelHandle h = register_kernel(k);
  auto y = runner_->rt().create_ndarray(DType::kI32, {1});
  ASSERT_TRUE(y.ok());
  // One grid-stride iteration of a body whose loop makes n + 1 passes: n + 4 in all.
  Arg args[] = {Arg::i32(65'532), Arg::ndarray(*y)};
  uint64_t before = runner_->rt().stats()->launches;
  Status st = runner_->rt().launch(h, args);
  EXPECT_EQ(st.code(), ErrorCode::kFailedPrecondition) << st.to_string();
  EXPECT_NE(st.message().find("launch of 'passes' task 'main'"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("up to 65536 loop passes per shader invocation"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("more than the 65535"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("lavapipe silently leaves loops"), std::string::npos) << st.message();
  EXPECT_EQ(runner_->rt().stats()->launches, before) << "nothing recorded";
  EXPECT_TRUE(runner_->rt().synchronize().ok());
}

TEST_F(LoopLimit, JustUnderTheLimitMatchesTheCpuEvaluator) {
  codegen::Kernel k = parse(kCount);
  EXPECT_TRUE(run_and_compare(k, {65'531}, 1).ok());
  // 200 elements: several lanes of one SIMD batch and several batches, all at the limit.
  EXPECT_TRUE(run_and_compare(k, {65'531}, 200).ok());
}

// At the largest size launch accepts, the device result is right: the count is never below
// the driver's. Nested loops, a loop after them, and nests that never run (m = 0).
TEST_F(LoopLimit, LargestAcceptedSizeMatchesTheCpuEvaluator) {
  codegen::Kernel k = parse(kNested);
  runtime::KernelHandle h = register_kernel(k);
  auto y = runner_->rt().create_ndarray(DType::kI32, {1});
  ASSERT_TRUE(y.ok());
  for (int m : {0, 1, 2, 100, 1000}) {
    auto accepted = [&](int n) {
      Arg args[] = {Arg::i32(m), Arg::i32(n), Arg::ndarray(*y)};
      return runner_->rt().launch(h, args).ok();
    };
    int lo = 0, hi = 70'000;  // accepted(lo), !accepted(hi)
    ASSERT_TRUE(accepted(lo));
    ASSERT_FALSE(accepted(hi));
    while (hi - lo > 1) {
      int mid = (lo + hi) / 2;
      (accepted(mid) ? lo : hi) = mid;
    }
    EXPECT_GT(lo, 0) << "m = " << m;
    EXPECT_TRUE(run_and_compare(k, {static_cast<double>(m), static_cast<double>(lo)}, 1).ok())
        << "m = " << m << ", n = " << lo;
  }
  EXPECT_TRUE(runner_->rt().synchronize().ok());
}

TEST_F(LoopLimit, SerialTaskCountsEveryIterationOfItsRange) {
  codegen::Kernel k = parse(R"(kernel ser(n: i32, y: ndarray<i32, 1>) {
  task main serial %i in [0, n) {
    %z = const 0 : i32
    %old = load y[%z] : i32
    %one = const 1 : i32
    %new = add %old, %one : i32
    store y[%z], %new
  }
})");
  EXPECT_TRUE(run_and_compare(k, {65'534}, 1).ok());  // 65,534 passes + the last one
  Status st = run_and_compare(k, {65'535}, 1);
  EXPECT_EQ(st.code(), ErrorCode::kFailedPrecondition) << st.to_string();
  EXPECT_NE(st.message().find("65536 loop passes"), std::string::npos) << st.message();
}

// Without the check, lavapipe's cut is visible: the result is silently wrong. This documents
// why the check exists; a driver that no longer cuts is reported as a skip, not a failure.
class LoopLimitUnchecked : public LoopLimit {
 protected:
  runtime::RuntimeOptions options() const override {
    runtime::RuntimeOptions o;
    o.enforce_loop_limit = false;
    return o;
  }
};

TEST_F(LoopLimitUnchecked, TheDriverCutsALoopPastTheLimit) {
  codegen::Kernel k = parse(kCount);
  HostArgs dev = make_args(k, {ArgSpec::of(70'000), ArgSpec::array({1}, 0, 0)}, 1);
  ASSERT_TRUE(runner_->run(k, dev).ok());
  if (dev.arrays[1].data[0] == 70'000) GTEST_SKIP() << "this driver ran all 70,000 passes";
  EXPECT_LT(dev.arrays[1].data[0], 70'000);
}

// Many grid-stride iterations per thread count too: with one workgroup of 64 threads, 100,000
// elements are 1,563 iterations per thread.
class LoopLimitOneGroup : public LoopLimit {
 protected:
  runtime::RuntimeOptions options() const override {
    runtime::RuntimeOptions o;
    o.max_groups = 1;
    return o;
  }
};

TEST_F(LoopLimitOneGroup, GridStrideIterationsCount) {
  codegen::Kernel k = parse(kCount);
  EXPECT_TRUE(run_and_compare(k, {2}, 100'000).ok());  // 1563 * 4 + 2 passes
  Status st = run_and_compare(k, {100}, 100'000);      // 1563 * 102 + 2
  EXPECT_EQ(st.code(), ErrorCode::kFailedPrecondition) << st.to_string();
  EXPECT_NE(st.message().find("up to 159428 loop passes"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("1563 grid-stride iteration(s)"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("RuntimeOptions::max_groups"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace vkad::testing
