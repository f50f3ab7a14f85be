// atomic_max on the device (validation on, zero messages) against the CPU reference, with the
// device's own target: where it has subgroup arithmetic the emitter combines the atomics of a
// subgroup whose invocations hit one element (spirv_emitter.cpp, atomic_max), so every pattern
// here must come out as the per-invocation atomics would: one word for all threads, runs of
// consecutive threads on one word (the counting kernel's pattern, subgroups split over two
// words when a run is shorter than a subgroup), and neighbours on different words; a range
// that does not fill its last subgroup; and the same kernel without subgroup arithmetic.
#include <gtest/gtest.h>

#include "gpu/kernel_harness.h"
#include "ir/text.h"

namespace vkad::testing {
namespace {

const char* kAtomicMax =
    R"(kernel amax(v: ndarray<i32, 1>, u: ndarray<u32, 1>, m: ndarray<i32, 1>, mu: ndarray<u32, 1>) {
  task main parallel %i in [0, shape(v, 0)) {
    %x = load v[%i] : i32
    %y = load u[%i] : u32
    %zero = const 0 : i32
    atomic_max m[%zero], %x
    %three = const 3 : i32
    %run = div %i, %three : i32
    %k = const 5 : i32
    %w = mod %run, %k : i32
    %one = const 1 : i32
    %w1 = add %w, %one : i32
    atomic_max m[%w1], %x
    %s = const 8 : i32
    %n = mod %i, %s : i32
    %n6 = add %n, %w1 : i32
    %five = const 5 : i32
    %n7 = add %n6, %five : i32
    atomic_max m[%n7], %x
    atomic_max mu[%w], %y
  }
}
)";

class AtomicMaxDevice : public KernelTest {};

TEST_F(AtomicMaxDevice, MatchesTheCpuEvaluatorForUniformAndDivergentAddresses) {
  auto k = codegen::parse(kAtomicMax);
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  for (bool subgroup : {true, false}) {
    // Where the device has subgroup arithmetic, the combined path runs even on a CPU device
    // (target_from_caps leaves it off there for speed, not correctness).
    codegen::Target t = runner_->target();
    t.subgroup_arithmetic = subgroup && runner_->rt().caps().subgroup_arithmetic;
    if (subgroup && !t.subgroup_arithmetic)
      GTEST_LOG_(INFO) << "device has no subgroup arithmetic: per-thread path only";
    for (uint32_t n : {1u, 37u, 1000u, 4099u}) {
      HostArgs dev =
          make_args(*k,
                    {ArgSpec::array({n}, -1000000, 1000000), ArgSpec::array({n}, 0, 4000000000.0),
                     ArgSpec::array({18}, -2000000, -2000000), ArgSpec::array({5}, 0, 0)},
                    n);
      HostArgs cpu = dev;
      auto c = codegen::compile(*k, t);
      ASSERT_TRUE(c.ok()) << c.status().to_string();
      Status st = runner_->run_compiled(*c, dev);
      ASSERT_TRUE(st.ok()) << st.to_string();
      auto view = cpu.view();
      auto r = codegen::evaluate(*k, view);
      ASSERT_TRUE(r.ok());
      ASSERT_EQ(r->error_flags, std::vector<uint32_t>{0u});  // every access in bounds
      EXPECT_EQ(compare_arrays_exact(dev.arrays[2], cpu.arrays[2]), "")
          << "n " << n << " subgroup " << subgroup;
      EXPECT_EQ(compare_arrays_exact(dev.arrays[3], cpu.arrays[3]), "")
          << "n " << n << " subgroup " << subgroup;
    }
  }
}

}  // namespace
}  // namespace vkad::testing
