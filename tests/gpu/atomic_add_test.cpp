// atomic_add on the device (validation on, zero messages) against the CPU reference, with the
// target's subgroup arithmetic on and off: one element for all threads (a constant index, also
// under a branch only the even threads take; from 1,024 elements a subgroup adds first, and at
// 70,001 the invocations run several elements each), runs of consecutive threads on one element,
// neighbours on different elements, i32 wrapping, and ranges that do not fill their last
// subgroup; indices read from a table (which a subgroup combines its adds on where it agrees:
// spirv_emitter.cpp, atomic_add) in runs and at random, with zeros the emitter skips; a zero
// added out of bounds is still reported; masked values (a select's zero arm, a 0/1 flag) added at
// computed indices, whose zeros are skipped too. The f32 values are small integers, so every order
// of the additions gives the same, exact sum and the comparison can be exact. Runs of
// consecutive threads on one computed cell (an MPM scatter's: one atomic per run where the
// device has ballot and relative shuffles).
#include <gtest/gtest.h>

#include <cmath>

#include "gpu/kernel_harness.h"
#include "ir/text.h"

namespace vkad::testing {
namespace {

const char* kAtomicAdd =
    R"(kernel aadd(v: ndarray<f32, 1>, iv: ndarray<i32, 1>, uv: ndarray<u32, 1>, s: ndarray<f32, 1>, is: ndarray<i32, 1>, us: ndarray<u32, 1>) {
  task main parallel %i in [0, shape(v, 0)) {
    %x = load v[%i] : f32
    %ix = load iv[%i] : i32
    %ux = load uv[%i] : u32
    %zero = const 0 : i32
    atomic_add s[%zero], %x
    atomic_add is[%zero], %ix
    %three = const 3 : i32
    %run = div %i, %three : i32
    %k = const 5 : i32
    %w = mod %run, %k : i32
    %one = const 1 : i32
    %w1 = add %w, %one : i32
    atomic_add s[%w1], %x
    atomic_add us[%w], %ux
    %eight = const 8 : i32
    %n = mod %i, %eight : i32
    %n6 = add %n, %w1 : i32
    %five = const 5 : i32
    %n7 = add %n6, %five : i32
    atomic_add s[%n7], %x
    %two = const 2 : i32
    %par = mod %i, %two : i32
    %even = eq %par, %zero : bool
    if %even {
      atomic_add is[%w1], %ix
      atomic_add us[%zero], %ux
      atomic_add s[%one], %x
    }
  }
}
)";

class AtomicAddDevice : public KernelTest {
 protected:
  // `k` compiled for the runner's device with its subgroup arithmetic on (where it has it:
  // the combined paths) or off (one atomic per invocation).
  Result<runtime::CompiledKernel> compiled(const codegen::Kernel& k, bool subgroup) {
    codegen::Target t = runner_->target();
    t.subgroup_arithmetic = subgroup && runner_->rt().caps().subgroup_arithmetic;
    t.subgroup_shuffle = t.subgroup_arithmetic && runner_->rt().caps().subgroup_shuffle;
    if (subgroup && !t.subgroup_arithmetic)
      GTEST_LOG_(INFO) << "device has no subgroup arithmetic: per-thread path only";
    return codegen::compile(k, t);
  }

  // kRunAdd (`text`, its floats of type `ft`) against the CPU, with and without runs.
  void expect_runs_add_as_the_cpu_does(const std::string& text, const std::string& ft);

  // *dev run through `c` on the device, and `k` evaluated on the CPU from the same inputs into
  // *cpu; both must succeed, the CPU without an error flag.
  void run_on_both(const codegen::Kernel& k, const runtime::CompiledKernel& c, HostArgs* dev,
                   HostArgs* cpu) {
    *cpu = *dev;
    Status st = runner_->run_compiled(c, *dev);
    ASSERT_TRUE(st.ok()) << st.to_string();
    auto view = cpu->view();
    auto r = codegen::evaluate(k, view);
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r->error_flags, std::vector<uint32_t>{0u});
  }
};

TEST_F(AtomicAddDevice, MatchesTheCpuEvaluatorForUniformDivergentAndPartlyActiveSubgroups) {
  auto k = codegen::parse(kAtomicAdd);
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  for (bool subgroup : {true, false}) {
    auto c = compiled(*k, subgroup);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    for (uint32_t n : {1u, 37u, 1000u, 4099u, 70001u}) {
      HostArgs dev =
          make_args(*k,
                    {ArgSpec::array({n}, -1000, 1000), ArgSpec::array({n}, -1000000, 1000000),
                     ArgSpec::array({n}, 0, 1000000), ArgSpec::array({18}, 0, 0),
                     ArgSpec::array({6}, 0, 0), ArgSpec::array({5}, 0, 0)},
                    n);
      for (double& x : dev.arrays[0].data) x = std::round(x);  // exact sums in any order
      HostArgs cpu;
      ASSERT_NO_FATAL_FAILURE(run_on_both(*k, *c, &dev, &cpu));
      for (int a : {3, 4, 5}) {
        EXPECT_EQ(compare_arrays_exact(dev.arrays[a], cpu.arrays[a]), "")
            << "array " << a << " n " << n << " subgroup " << subgroup;
      }
    }
  }
}

// An index read from an integer array (a "table": table_index_values), clamped and offset by a
// launch-uniform row; the values zero wherever the id is -1, as reverse mode's adjoint of a
// masked read is. The ids come in runs (subgroups agree: the combined path) and at random
// (they do not: each invocation its own atomic), also under a branch.
const char* kTableAdd =
    R"(kernel tadd(v: ndarray<f32, 1>, ids: ndarray<i32, 1>, s: ndarray<f32, 2>, f: i32) {
  task main parallel %i in [0, shape(v, 0)) {
    %x = load v[%i] : f32
    %id = load ids[%i] : i32
    %zero = const 0 : i32
    %m1 = const -1 : i32
    %none = eq %id, %m1 : bool
    %z = const 0.0 : f32
    %y = select %none, %z, %x : f32
    %c = max %zero, %id : i32
    %f = arg f : i32
    atomic_add s[%f, %c], %y
    %two = const 2 : i32
    %par = mod %i, %two : i32
    %even = eq %par, %zero : bool
    if %even {
      atomic_add s[%zero, %c], %x
    }
  }
}
)";

TEST_F(AtomicAddDevice, TableIndexedAddsMatchTheCpuEvaluatorInRunsAndAtRandom) {
  auto k = codegen::parse(kTableAdd);
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  for (bool subgroup : {true, false}) {
    auto c = compiled(*k, subgroup);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    for (bool runs : {true, false}) {
      for (uint32_t n : {1u, 37u, 1000u, 4099u, 70001u}) {
        HostArgs dev = make_args(*k,
                                 {ArgSpec::array({n}, -3, 3), ArgSpec::array({n}, -1, 4),
                                  ArgSpec::array({2, 5}, 0, 0), ArgSpec::of(1)},
                                 n + runs);
        for (double& x : dev.arrays[0].data) x = std::round(x);  // exact sums, zeros among them
        if (runs) {
          for (uint32_t i = 0; i < n; ++i) dev.arrays[1].data[i] = (i / 40) % 6 - 1.0;
        }
        HostArgs cpu;
        ASSERT_NO_FATAL_FAILURE(run_on_both(*k, *c, &dev, &cpu));
        EXPECT_EQ(compare_arrays_exact(dev.arrays[2], cpu.arrays[2]), "")
            << "n " << n << " subgroup " << subgroup << " runs " << runs;
      }
    }
  }
}

TEST_F(AtomicAddDevice, ANanOrMinusZeroTableIndexedAddIsNotLostOrMisread) {
  // The zero skip tests bits: a NaN among the values still makes its element NaN (a NaN
  // gradient must not vanish), and -0.0 adds nothing, as on the CPU.
  auto k = codegen::parse(kTableAdd);
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  for (bool subgroup : {true, false}) {
    auto c = compiled(*k, subgroup);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    const uint32_t n = 100;
    HostArgs dev = make_args(*k,
                             {ArgSpec::array({n}, -3, 3), ArgSpec::array({n}, 0, 0),
                              ArgSpec::array({2, 5}, 0, 0), ArgSpec::of(1)},
                             7);
    for (uint32_t i = 0; i < n; ++i) {
      dev.arrays[0].data[i] = i == 41 ? std::nan("") : -0.0;
      dev.arrays[1].data[i] = i < 50 ? 1.0 : 2.0;  // ids in two runs
    }
    Status st = runner_->run_compiled(*c, dev);
    ASSERT_TRUE(st.ok()) << st.to_string();
    const std::vector<double>& s = dev.arrays[2].data;  // [2, 5]: rows 0 and 1
    EXPECT_TRUE(std::isnan(s[5 + 1])) << "row f = 1, id 1 got the NaN; subgroup " << subgroup;
    EXPECT_EQ(s[5 + 2], 0.0) << "-0.0 only";
    EXPECT_FALSE(std::signbit(s[5 + 2])) << "the element's +0.0 kept";
  }
}

TEST_F(AtomicAddDevice, AZeroAddedOutOfBoundsIsStillReported) {
  // A table index (the path that skips zeros), one of them past the end: the zero is not
  // added, but the bounds check before the skip still reports the access, with subgroups on
  // (the combined path: the ids agree in runs) and off.
  auto k = codegen::parse(R"(kernel zoob(ids: ndarray<i32, 1>, s: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(ids, 0)) {
    %j = load ids[%i] : i32
    %z = const 0.0 : f32
    atomic_add s[%j], %z
  }
})");
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  for (bool subgroup : {true, false}) {
    auto c = compiled(*k, subgroup);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    HostArgs dev = make_args(*k, {ArgSpec::array({64}, 0, 0), ArgSpec::array({16}, 2, 2)}, 5);
    for (uint32_t i = 0; i < 64; ++i) dev.arrays[0].data[i] = i < 32 ? 3.0 : 16.0;  // 16: past
    Status st = runner_->run_compiled(*c, dev);
    ASSERT_FALSE(st.ok()) << "subgroup " << subgroup;
    EXPECT_NE(st.message().find("out-of-bounds ndarray access"), std::string::npos) << st.message();
    for (double x : dev.arrays[1].data) EXPECT_EQ(x, 2.0);  // adding zero changed nothing
    EXPECT_TRUE(runner_->rt().synchronize().ok());
  }
}

// Masked adds at indices the task index computes (masked_values: not a table, not uniform), as
// a ray marcher's adjoint adds `flag * d image` at a clamped voxel: outside a window of 8
// invocations the values are zero -- a select's zero arm, a 0/1 flag local cast and multiplied
// -- and their clamped indices pile onto the two end elements.
const char* kMaskedAdd =
    R"(kernel madd(v: ndarray<f32, 1>, s: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(v, 0)) {
    %x = load v[%i] : f32
    %lo = const 50 : i32
    %hi = const 58 : i32
    %zi = const 0 : i32
    %oi = const 1 : i32
    %seven = const 7 : i32
    %z = const 0.0 : f32
    %ge = ge %i, %lo : bool
    %lt = lt %i, %hi : bool
    %in = and %ge, %lt : bool
    %j = sub %i, %lo : i32
    %jm = min %j, %seven : i32
    %c = max %zi, %jm : i32
    %sel = select %in, %x, %z : f32
    atomic_add s[%c], %sel
    %flag = alloca : i32
    store_local %flag, %zi
    if %in {
      store_local %flag, %oi
    } else {
    }
    %fl = load_local %flag : i32
    %ff = cast %fl : f32
    %p = mul %x, %ff : f32
    atomic_add s[%c], %p
  }
}
)";

TEST_F(AtomicAddDevice, MaskedAddsAtComputedIndicesMatchTheCpuEvaluator) {
  auto k = codegen::parse(kMaskedAdd);
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  for (bool subgroup : {true, false}) {
    auto c = compiled(*k, subgroup);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    for (uint32_t n : {37u, 100u, 4099u, 70001u}) {
      HostArgs dev =
          make_args(*k, {ArgSpec::array({n}, -1000, 1000), ArgSpec::array({8}, -5, 5)}, n);
      for (double& x : dev.arrays[0].data) x = std::round(x);  // exact sums in any order
      for (double& x : dev.arrays[1].data) x = std::round(x);
      HostArgs cpu;
      ASSERT_NO_FATAL_FAILURE(run_on_both(*k, *c, &dev, &cpu));
      EXPECT_EQ(compare_arrays_exact(dev.arrays[1], cpu.arrays[1]), "")
          << "n " << n << " subgroup " << subgroup;
    }
  }
}

TEST_F(AtomicAddDevice, AMaskedZeroIsNotAddedAndANanStillIs) {
  // Every element starts at -0.0 and every value added is a zero (the masked ones +0.0, the
  // window's -0.0) but one NaN: the +0.0s are skipped (adding one would make an element +0.0),
  // the NaN is not.
  auto k = codegen::parse(kMaskedAdd);
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  for (bool subgroup : {true, false}) {
    auto c = compiled(*k, subgroup);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    const uint32_t n = 200;
    HostArgs dev = make_args(*k, {ArgSpec::array({n}, 1, 9), ArgSpec::array({8}, 0, 0)}, 3);
    for (uint32_t i = 50; i < 58; ++i) dev.arrays[0].data[i] = i == 53 ? std::nan("") : -0.0;
    for (double& x : dev.arrays[1].data) x = -0.0;
    Status st = runner_->run_compiled(*c, dev);
    ASSERT_TRUE(st.ok()) << st.to_string();
    const std::vector<double>& s = dev.arrays[1].data;
    for (uint32_t e = 0; e < 8; ++e) {
      if (e == 3) {
        EXPECT_TRUE(std::isnan(s[e])) << "subgroup " << subgroup;
        continue;
      }
      EXPECT_EQ(s[e], 0.0) << "element " << e;
      EXPECT_TRUE(std::signbit(s[e]))
          << "element " << e << ": a masked +0.0 was added; subgroup " << subgroup;
    }
  }
}

// A kernel with a workgroup barrier (as a resident step loop has: graph/resident.h) adding a
// local that only a branch changes (billiards' adjoint of a contact that did not happen): where
// the branch did not run the local is +0.0 and is not added; where it ran, the sums match the
// CPU evaluator exactly (integer values).
const char* kBranchLocalAdd =
    R"(kernel badd(v: ndarray<f32, 1>, s: ndarray<f32, 1>) {
  task main parallel %i in [0, 64) local_size 64 {
    %x = load v[%i] : f32
    %one = const 1.0 : f32
    %seven = const 7 : i32
    %hit = gt %x, %one : bool
    %acc = alloca : f32
    if %hit {
      %a0 = load_local %acc : f32
      %a1 = add %a0, %x : f32
      store_local %acc, %a1
    } else {
    }
    barrier
    %a = load_local %acc : f32
    %c = min %i, %seven : i32
    atomic_add s[%c], %a
  }
}
)";

TEST_F(AtomicAddDevice, ABranchOnlyLocalSkipsItsZeroInAKernelWithABarrier) {
  auto k = codegen::parse(kBranchLocalAdd);
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  for (bool subgroup : {true, false}) {
    auto c = compiled(*k, subgroup);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    // No branch runs: every element stays -0.0 (adding one +0.0 would make it +0.0).
    HostArgs none = make_args(*k, {ArgSpec::array({64}, -5, 1), ArgSpec::array({8}, 0, 0)}, 64);
    for (double& x : none.arrays[1].data) x = -0.0;
    Status st = runner_->run_compiled(*c, none);
    ASSERT_TRUE(st.ok()) << st.to_string();
    for (uint32_t e = 0; e < 8; ++e) {
      EXPECT_EQ(none.arrays[1].data[e], 0.0) << "element " << e;
      EXPECT_TRUE(std::signbit(none.arrays[1].data[e]))
          << "element " << e << ": a +0.0 the branch did not change was added; subgroup "
          << subgroup;
    }
    // Some branches run: the device's sums equal the evaluator's.
    HostArgs dev = make_args(*k, {ArgSpec::array({64}, -5, 5), ArgSpec::array({8}, -3, 3)}, 64);
    for (double& x : dev.arrays[0].data) x = std::round(x);
    for (double& x : dev.arrays[1].data) x = std::round(x);
    HostArgs cpu = dev;
    st = runner_->run_compiled(*c, dev);
    ASSERT_TRUE(st.ok()) << st.to_string();
    // The reference runs invocations one at a time, so it evaluates the kernel without the
    // barrier -- which orders nothing here: no invocation reads another's data.
    std::string text = kBranchLocalAdd;
    text.erase(text.find("    barrier\n"), std::string("    barrier\n").size());
    auto plain = codegen::parse(text);
    ASSERT_TRUE(plain.ok()) << plain.status().to_string();
    auto view = cpu.view();
    auto r = codegen::evaluate(*plain, view);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(compare_arrays_exact(dev.arrays[1], cpu.arrays[1]), "") << "subgroup " << subgroup;
  }
}

// Computed indices (a float position cast to a cell, as an MPM scatter's; neither a table index
// nor launch-uniform) in runs of consecutive invocations on one cell, of random lengths from 1
// to past two subgroups, some cut by a branch that leaves every seventh invocation out, and at
// random: with ballot and relative shuffles each run adds its sum from its last invocation
// (spirv_emitter.cpp, combine_runs; g[c, 0] and m[c] in one group, g[c + 1, 1] in another, the
// branch's add alone), which must equal the CPU's sums exactly (the values are
// small integers), for a 2-d array (the cell and a constant component, as a vector's) and a
// 1-d one, also at sizes that leave the last subgroup partly active. A cell past the end
// inside a run is still reported.
const char* kRunAdd =
    R"(kernel radd(pos: ndarray<f32, 1>, v: ndarray<f32, 1>, g: ndarray<f32, 2>, m: ndarray<f32, 1>) {
  task main parallel %i in [0, shape(pos, 0)) {
    %p = load pos[%i] : f32
    %c = cast %p : i32
    %x = load v[%i] : f32
    %zero = const 0 : i32
    %one = const 1 : i32
    atomic_add g[%c, %zero], %x
    %c1 = add %c, %one : i32
    %y = mul %x, %x : f32
    atomic_add g[%c1, %one], %y
    atomic_add m[%c], %y
    %seven = const 7 : i32
    %r = mod %i, %seven : i32
    %three = const 3 : i32
    %keep = ne %r, %three : bool
    if %keep {
      atomic_add m[%c], %x
    }
  }
}
)";

TEST_F(AtomicAddDevice, RunsOnOneComputedCellAddAsTheCpuDoes) {
  for (const std::string ft : {"f32", "f64"}) {  // f64: shuffles of 64-bit values
    std::string text = kRunAdd;
    if (ft == "f64") {
      if (!runner_->target().float64) {
        GTEST_LOG_(INFO) << "device has no f64: f32 only";
        continue;
      }
      for (size_t at = text.find("f32"); at != std::string::npos; at = text.find("f32", at))
        text.replace(at, 3, "f64");
    }
    ASSERT_NO_FATAL_FAILURE(expect_runs_add_as_the_cpu_does(text, ft));
  }
}

void AtomicAddDevice::expect_runs_add_as_the_cpu_does(const std::string& text,
                                                      const std::string& ft) {
  auto k = codegen::parse(text);
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  for (bool subgroup : {true, false}) {
    auto c = compiled(*k, subgroup);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    for (bool runs : {true, false}) {
      // past 16,896 the combined path (kCombineRunsAbove), up to it one add each
      for (uint32_t n : {1000u, 4099u, 16896u, 16897u, 70001u}) {
        const uint32_t cells = 600;
        HostArgs dev = make_args(*k,
                                 {ArgSpec::array({n}, 0, cells - 2), ArgSpec::array({n}, -4, 4),
                                  ArgSpec::array({cells, 2}, 0, 0), ArgSpec::array({cells}, 0, 0)},
                                 n + 3 * runs);
        std::vector<double>& pos = dev.arrays[0].data;
        for (double& x : dev.arrays[1].data) x = std::round(x);  // exact sums in any order
        if (runs) {  // run lengths 1 .. 70 from the seed's values, cells in increasing order
          uint32_t i = 0, cell = 0;
          while (i < n) {
            const uint32_t len = 1 + static_cast<uint32_t>(std::fabs(dev.arrays[1].data[i]) * 17);
            for (uint32_t j = 0; j < len && i < n; ++j) pos[i++] = cell + 0.25;
            cell = (cell + 1) % (cells - 1);
          }
        }
        HostArgs cpu;
        ASSERT_NO_FATAL_FAILURE(run_on_both(*k, *c, &dev, &cpu));
        for (int a : {2, 3}) {
          EXPECT_EQ(compare_arrays_exact(dev.arrays[a], cpu.arrays[a]), "")
              << ft << " array " << a << " n " << n << " subgroup " << subgroup << " runs " << runs;
        }
      }
    }
    // A run whose cell is past the end: its last invocation's access is checked and reported.
    const uint32_t n = 20000;
    HostArgs dev = make_args(*k,
                             {ArgSpec::array({n}, 0, 0), ArgSpec::array({n}, 1, 1),
                              ArgSpec::array({64, 2}, 0, 0), ArgSpec::array({64}, 0, 0)},
                             11);
    for (uint32_t i = 0; i < n; ++i) dev.arrays[0].data[i] = i >= 1000 && i < 1040 ? 70.5 : i % 60;
    Status st = runner_->run_compiled(*c, dev);
    ASSERT_FALSE(st.ok()) << "subgroup " << subgroup;
    EXPECT_NE(st.message().find("out-of-bounds ndarray access"), std::string::npos) << st.message();
  }
}

}  // namespace
}  // namespace vkad::testing
