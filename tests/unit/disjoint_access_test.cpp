// disjoint_access (autodiff/disjoint_access.h) on kernels in text form: what it proves (and on
// which axis), and what it gives up on. make_adjoint's use of it is covered by
// tests/kernels/adjoint_disjoint_*.vkir and tests/kernels/adjoint_error_*.vkir; the gradients
// by tests/unit/disjoint_gradient_test.cpp and tests/gpu/disjoint_access_test.cpp.
#include "autodiff/disjoint_access.h"

#include <gtest/gtest.h>

#include <string>

#include "ir/text.h"
#include "ir/verifier.h"

namespace vkad::codegen {
namespace {

using Kind = DisjointAccess::Kind;

// The analysis of parameter `x` of the kernel in `text` (which must parse and verify).
DisjointAccess analyse(const std::string& text) {
  auto k = parse(text);
  EXPECT_TRUE(k.ok()) << k.status().to_string() << "\n" << text;
  if (!k.ok()) return {};
  Status v = verify(*k);
  EXPECT_TRUE(v.ok()) << v.to_string() << "\n" << text;
  int x = k->find_param("x");
  EXPECT_GE(x, 0);
  return disjoint_access(*k, static_cast<uint32_t>(x));
}

// A 2-d x read at [read, %p] and written at [write, %p] in one task over p; `defs` defines the
// index values from %f, %g (i32 scalars), %one, %two (i32 constants) and %n (shape(x, 0)).
std::string step2(const std::string& defs, const std::string& read, const std::string& write) {
  return R"(kernel step(x: ndarray<f32, 2> grad, v: ndarray<f32, 2> grad, idx: ndarray<i32, 1>, f: i32, g: i32, dt: f32) {
  task main parallel %p in [0, shape(x, 1)) {
    %f = arg f : i32
    %g = arg g : i32
    %one = const 1 : i32
    %two = const 2 : i32
    %n = shape x 0 : i32
)" + defs +
         R"(
    %xv = load x[)" +
         read + R"(, %p] : f32
    %vv = load v[%f, %p] : f32
    %dt = arg dt : f32
    %d = mul %dt, %vv : f32
    %nx = add %xv, %d : f32
    store x[)" +
         write + R"(, %p], %nx
  }
})";
}

void expect_disjoint(const DisjointAccess& d, uint32_t axis) {
  EXPECT_EQ(d.kind, Kind::kDisjoint);
  EXPECT_EQ(d.axis, axis);
}

TEST(DisjointAccess, ReadAtFWriteAtFPlusOne) {
  expect_disjoint(analyse(step2("    %f1 = add %f, %one : i32", "%f", "%f1")), 0);
}

TEST(DisjointAccess, ReadAtFMinusOneWriteAtFPlusOne) {
  expect_disjoint(
      analyse(step2("    %fm = sub %f, %one : i32\n    %fp = add %one, %f : i32", "%fm", "%fp")),
      0);
}

// The same write and read, the other way round: the read at f + 1, the write at f.
TEST(DisjointAccess, ReadAheadOfTheWriteIsDisjointToo) {
  expect_disjoint(analyse(step2("    %f1 = add %f, %one : i32", "%f1", "%f")), 0);
}

// Non-linear launch-uniform terms are compared whole; linear ones are normalised (modulo 2^32).
TEST(DisjointAccess, NormalisedFormsAConstantApart) {
  expect_disjoint(
      analyse(step2("    %h = div %f, %two : i32\n    %h1 = add %h, %one : i32", "%h", "%h1")), 0);
  expect_disjoint(analyse(step2("    %a = add %f, %one : i32\n    %a2 = mul %two, %a : i32\n"
                                "    %b = mul %f, %two : i32\n    %b1 = add %b, %one : i32",
                                "%b1", "%a2")),
                  0);
  // From the last row back: n - 1 read, n - 2 written.
  expect_disjoint(
      analyse(step2("    %r = sub %n, %one : i32\n    %w = sub %n, %two : i32", "%r", "%w")), 0);
  // Through a cast to u32 and back (the same bits).
  expect_disjoint(
      analyse(step2("    %u = cast %f : u32\n    %u1 = const 1 : u32\n    %s = add %u, %u1 : u32\n"
                    "    %w = cast %s : i32",
                    "%f", "%w")),
      0);
}

// A ring of a power-of-two size: rows (f + 1) mod m and f mod m differ when m does not divide
// the difference, whatever f (wrap-around included: m divides 2^32).
TEST(DisjointAccess, RingRowsOfAPowerOfTwoRing) {
  const std::string ring2 =
      "    %r = mod %f, %two : i32\n    %f1 = add %f, %one : i32\n    %w = mod %f1, %two : i32";
  expect_disjoint(analyse(step2(ring2, "%r", "%w")), 0);
  expect_disjoint(analyse(step2(ring2, "%w", "%r")), 0);
  // A ring of 4, three apart (f + 3 vs f, and f - 1 vs f + 2: the same terms, 3 apart).
  expect_disjoint(analyse(step2("    %four = const 4 : i32\n    %three = const 3 : i32\n"
                                "    %a = add %f, %three : i32\n    %w = mod %a, %four : i32\n"
                                "    %r = mod %f, %four : i32",
                                "%r", "%w")),
                  0);
  expect_disjoint(analyse(step2("    %four = const 4 : i32\n    %b = sub %f, %one : i32\n"
                                "    %c = add %f, %two : i32\n    %r = mod %b, %four : i32\n"
                                "    %w = mod %c, %four : i32",
                                "%r", "%w")),
                  0);
}

// What a ring does not prove: a difference the modulus divides (f + 2 vs f in a ring of 2:
// the same row), a modulus that is not a power of two (wrap-around of f + 1 at 2^31 breaks
// the congruence), different moduli, a modulus that is not a constant, different operands.
TEST(DisjointAccess, RingsThatCanMeetAreUnproven) {
  auto unproven = [](const std::string& defs) {
    EXPECT_EQ(analyse(step2(defs, "%r", "%w")).kind, Kind::kUnproven) << defs;
  };
  unproven(
      "    %r = mod %f, %two : i32\n    %f2 = add %f, %two : i32\n    %w = mod %f2, %two : i32");
  unproven(
      "    %three = const 3 : i32\n    %r = mod %f, %three : i32\n"
      "    %f1 = add %f, %one : i32\n    %w = mod %f1, %three : i32");
  unproven(
      "    %four = const 4 : i32\n    %r = mod %f, %two : i32\n"
      "    %f1 = add %f, %one : i32\n    %w = mod %f1, %four : i32");
  unproven("    %r = mod %f, %n : i32\n    %f1 = add %f, %one : i32\n    %w = mod %f1, %n : i32");
  unproven(
      "    %r = mod %f, %two : i32\n    %g1 = add %g, %one : i32\n    %w = mod %g1, %two : i32");
}

TEST(DisjointAccess, SameIndexIsUnproven) {
  EXPECT_EQ(analyse(step2("", "%f", "%f")).kind, Kind::kUnproven);
  // Equal after normalisation: (f + 1) - 1 and f; f + f and 2 * f.
  EXPECT_EQ(
      analyse(step2("    %a = add %f, %one : i32\n    %b = sub %a, %one : i32", "%f", "%b")).kind,
      Kind::kUnproven);
  EXPECT_EQ(
      analyse(step2("    %a = add %f, %f : i32\n    %b = mul %two, %f : i32", "%a", "%b")).kind,
      Kind::kUnproven);
}

// f and g are equal in some launch: nothing separates them.
TEST(DisjointAccess, TwoDifferentScalarsAreUnproven) {
  EXPECT_EQ(analyse(step2("    %g1 = add %g, %one : i32", "%f", "%g1")).kind, Kind::kUnproven);
  EXPECT_EQ(analyse(step2("", "%f", "%g")).kind, Kind::kUnproven);
}

// f and 2 f differ by f, not by a constant.
TEST(DisjointAccess, NonConstantDifferenceIsUnproven) {
  EXPECT_EQ(analyse(step2("    %b = mul %f, %two : i32", "%f", "%b")).kind, Kind::kUnproven);
}

TEST(DisjointAccess, IndexFromAnNdarrayIsUnproven) {
  EXPECT_EQ(
      analyse(
          step2("    %z = const 0 : i32\n    %j = load idx[%z] : i32\n    %j1 = add %j, %one : i32",
                "%j", "%j1"))
          .kind,
      Kind::kUnproven);
}

TEST(DisjointAccess, IndexThroughAMutableLocalIsUnproven) {
  EXPECT_EQ(
      analyse(step2("    %l = alloca : i32\n    store_local %l, %f\n    %lf = load_local %l : i32\n"
                    "    %f1 = add %f, %one : i32",
                    "%lf", "%f1"))
          .kind,
      Kind::kUnproven);
}

// An index computed from a float (even a launch-uniform one) is not taken.
TEST(DisjointAccess, IndexFromAFloatIsUnproven) {
  EXPECT_EQ(
      analyse(step2("    %t = arg dt : f32\n    %c = cast %t : i32\n    %c1 = add %c, %one : i32",
                    "%c", "%c1"))
          .kind,
      Kind::kUnproven);
}

// The thread index on the only axis that could separate: x[p] read, x[p + 1] written.
TEST(DisjointAccess, TaskIndexIsUnproven) {
  EXPECT_EQ(analyse(R"(kernel k(x: ndarray<f32, 1> grad) {
  task main parallel %p in [0, shape(x, 0)) {
    %one = const 1 : i32
    %q = add %p, %one : i32
    %v = load x[%p] : f32
    %s = sin %v : f32
    store x[%q], %s
  }
})")
                .kind,
            Kind::kUnproven);
}

// A serial loop over steps in one task: x[k + 1] = x[k] + ... is a real dependence, not
// separated (k is not launch-uniform).
TEST(DisjointAccess, LoopIndexIsUnproven) {
  EXPECT_EQ(analyse(R"(kernel k(x: ndarray<f32, 2> grad, n: i32) {
  task main parallel %p in [0, shape(x, 1)) {
    %zero = const 0 : i32
    %one = const 1 : i32
    %n = arg n : i32
    for %k in [%zero, %n) {
      %k1 = add %k, %one : i32
      %v = load x[%k, %p] : f32
      %s = sin %v : f32
      store x[%k1, %p], %s
    }
  }
})")
                .kind,
            Kind::kUnproven);
}

// One read at f + 1 anywhere (here in a branch, after the store) spoils the proof.
TEST(DisjointAccess, AReadAtTheWrittenIndexAnywhereIsUnproven) {
  EXPECT_EQ(analyse(R"(kernel k(x: ndarray<f32, 2> grad, f: i32) {
  task main parallel %p in [0, shape(x, 1)) {
    %f = arg f : i32
    %one = const 1 : i32
    %f1 = add %f, %one : i32
    %v = load x[%f, %p] : f32
    %s = sin %v : f32
    store x[%f1, %p], %s
    %zero = const 0 : i32
    %c = gt %p, %zero : bool
    if %c {
      %w = load x[%f1, %p] : f32
      %t = mul %w, %w : f32
      store x[%f1, %zero], %t
    }
  }
})")
                .kind,
            Kind::kUnproven);
}

// 3-d state x[f, p, d] over a 2-d task (p, d): separated on the leading axis.
TEST(DisjointAccess, ThreeDimensionalStateInATwoDimensionalTask) {
  expect_disjoint(analyse(R"(kernel k(x: ndarray<f64, 3> grad, f: i32) {
  task main parallel %p in [0, shape(x, 1)), %d in [0, shape(x, 2)) {
    %f = arg f : i32
    %one = const 1 : i32
    %f1 = add %f, %one : i32
    %v = load x[%f, %p, %d] : f64
    %s = sin %v : f64
    store x[%f1, %p, %d], %s
  }
})"),
                  0);
}

// The separating axis need not be the first: x[p, f] read, x[p, f + 1] written.
TEST(DisjointAccess, SeparatedOnASecondAxis) {
  expect_disjoint(analyse(R"(kernel k(x: ndarray<f32, 2> grad, f: i32) {
  task main parallel %p in [0, shape(x, 0)) {
    %f = arg f : i32
    %one = const 1 : i32
    %f1 = add %f, %one : i32
    %v = load x[%p, %f] : f32
    %s = sin %v : f32
    store x[%p, %f1], %s
  }
})"),
                  1);
}

// Several reads and writes: written at f + 1 and f + 2, read at f and f - 1 (every pair a
// non-zero constant apart).
TEST(DisjointAccess, EveryReadAgainstEveryWrite) {
  expect_disjoint(analyse(R"(kernel k(x: ndarray<f32, 2> grad, f: i32) {
  task main parallel %p in [0, shape(x, 1)) {
    %f = arg f : i32
    %one = const 1 : i32
    %two = const 2 : i32
    %fm = sub %f, %one : i32
    %f1 = add %f, %one : i32
    %f2 = add %f, %two : i32
    %a = load x[%f, %p] : f32
    %b = load x[%fm, %p] : f32
    %s = add %a, %b : f32
    store x[%f1, %p], %s
    atomic_add x[%f2, %p], %a
  }
})"),
                  0);
}

// Across tasks: a write in an earlier task than a read conflicts with nothing (the barrier
// orders them); a write in a later task than a read does, like one in the same task.
TEST(DisjointAccess, TaskOrderDecidesWhichPairsConflict) {
  // Semi-implicit Euler: v[f + 1] written in `kick` and read in `drift`; v[f] read in `kick`.
  const char* kEuler = R"(kernel k(x: ndarray<f32, 2> grad, v: ndarray<f32, 2> grad, f: i32) {
  task kick parallel %p in [0, shape(x, 1)) {
    %f = arg f : i32
    %one = const 1 : i32
    %f1 = add %f, %one : i32
    %xv = load x[%f, %p] : f32
    %vv = load v[%f, %p] : f32
    %s = sin %xv : f32
    %nv = sub %vv, %s : f32
    store v[%f1, %p], %nv
  }
  task drift parallel %q in [0, shape(x, 1)) {
    %f_ = arg f : i32
    %one_ = const 1 : i32
    %f1_ = add %f_, %one_ : i32
    %xv_ = load x[%f_, %q] : f32
    %vv_ = load v[%f1_, %q] : f32
    %nx_ = add %xv_, %vv_ : f32
    store x[%f1_, %q], %nx_
  }
})";
  auto k = parse(kEuler);
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  ASSERT_TRUE(verify(*k).ok());
  expect_disjoint(disjoint_access(*k, 0), 0);  // x: read and written in `drift`, read in `kick`
  expect_disjoint(disjoint_access(*k, 1), 0);  // v: the kick pair; the read in drift is ordered
  // Only a write in an earlier task than every read: nothing to prove.
  EXPECT_EQ(analyse(R"(kernel k(x: ndarray<f32, 2> grad, y: ndarray<f32, 1> grad, f: i32) {
  task first parallel %p in [0, shape(x, 1)) {
    %f = arg f : i32
    %c = cast %p : f32
    store x[%f, %p], %c
  }
  task second parallel %q in [0, shape(x, 1)) {
    %f_ = arg f : i32
    %v_ = load x[%f_, %q] : f32
    store y[%q], %v_
  }
})")
                .kind,
            Kind::kNoConflict);
  // The same index, read in `first` and written in the later `second`: a conflict, unproven.
  EXPECT_EQ(analyse(R"(kernel k(x: ndarray<f32, 2> grad, y: ndarray<f32, 1> grad, f: i32) {
  task first parallel %p in [0, shape(x, 1)) {
    %f = arg f : i32
    %v = load x[%f, %p] : f32
    store y[%p], %v
  }
  task second parallel %q in [0, shape(x, 1)) {
    %f_ = arg f : i32
    %c_ = cast %q : f32
    store x[%f_, %q], %c_
  }
})")
                .kind,
            Kind::kUnproven);
}

TEST(DisjointAccess, ReadOnlyOrWriteOnlyHasNoConflict) {
  auto k = parse(step2("    %f1 = add %f, %one : i32", "%f", "%f1"));
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(disjoint_access(*k, 1).kind, Kind::kNoConflict);  // v: read only
  EXPECT_EQ(disjoint_access(*k, 2).kind, Kind::kNoConflict);  // idx: untouched
}

}  // namespace
}  // namespace vkad::codegen
