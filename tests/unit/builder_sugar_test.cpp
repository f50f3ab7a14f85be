// The builder's conveniences (comparisons with numbers, == / != operators, literal typing,
// compound updates on locals and elements, Vec2/3/4): each kernel is built twice, with the
// convenience and the long way (explicit constants, load / op / store, one scalar per
// component), and the two must print the same IR or, where the statement order differs,
// evaluate to the same bits on the CPU reference. Vector kernels' gradients are checked
// against finite differences.
#include <gtest/gtest.h>

#include <cmath>

#include "ir/builder.h"
#include "ir/text.h"
#include "ir/verifier.h"
#include "reference/cpu_eval.h"
#include "support/ad_check.h"

namespace vkad::codegen {
namespace {

using testing::HostValues;

// Every comparison with a number on either side, as sugar and the long way.
Kernel comparisons(bool sugar) {
  KernelBuilder kb("cmp");
  Array x = kb.ndarray("x", DType::kF32, 1, {.read_only = true});
  Array out = kb.ndarray("out", DType::kU32, 1);
  kb.parallel_for("main", 0, x.dim(0), [&](Value i) {
    Value v = x(i);
    std::vector<Value> c;
    if (sugar) {
      c = {v<0.5, v <= 0.5, v> 0.5,
           v >= 0.5,
           0.5 < v,
           0.5 <= v,
           0.5 > v,
           0.5 >= v,
           v == 0.5,
           v != 0.5,
           0.5 == v,
           0.5 != v,
           i == 3,
           i != 3,
           v == v,
           v != v};
    } else {
      auto k = [&] { return kb.f32(0.5); };
      c = {v<k(), v <= k(), v> k(),
           v >= k(),
           k() < v,
           k() <= v,
           k() > v,
           k() >= v,
           eq(v, k()),
           ne(v, k()),
           eq(k(), v),
           ne(k(), v),
           eq(i, kb.i32(3)),
           ne(i, kb.i32(3)),
           eq(v, v),
           ne(v, v)};
    }
    Value bits = kb.u32(0);
    for (size_t b = 0; b < c.size(); ++b) {
      bits = bits + select(c[b], kb.u32(1u << b), kb.u32(0));
    }
    out.store({i}, bits);
  });
  return kb.finish();
}

TEST(BuilderSugar, ComparisonsWithNumbersBuildTheLongForm) {
  Kernel a = comparisons(true), b = comparisons(false);
  ASSERT_TRUE(verify(a).ok()) << verify(a).to_string();
  EXPECT_EQ(print(a), print(b));
}

TEST(BuilderSugar, ComparisonsMatchTheReference) {
  Kernel k = comparisons(true);
  HostArray x(DType::kF32, {6}), out(DType::kU32, {6});
  x.data = {0.25, 0.5, 0.75, -1, NAN, 0.5};
  std::vector<HostArg> args = {HostArg::of(x), HostArg::of(out)};
  ASSERT_TRUE(evaluate(k, args).ok());
  for (size_t e = 0; e < 6; ++e) {
    uint32_t bits = static_cast<uint32_t>(out.data[e]);
    double v = x.data[e];
    bool want[] = {v<0.5, v <= 0.5, v> 0.5,
                   v >= 0.5,
                   0.5 < v,
                   0.5 <= v,
                   0.5 > v,
                   0.5 >= v,
                   v == 0.5,
                   v != 0.5,
                   0.5 == v,
                   0.5 != v,
                   e == 3,
                   e != 3,
                   v == v,
                   v != v};
    for (size_t b = 0; b < 16; ++b)
      EXPECT_EQ((bits >> b) & 1, want[b] ? 1u : 0u) << "element " << e << " bit " << b;
  }
}

// A literal takes the other operand's type; one that type cannot hold exactly is not
// truncated but left as an f64 constant, which verify() reports naming the statement.
TEST(BuilderSugar, LiteralsTakeTheOperandType) {
  KernelBuilder kb("lits");
  Scalar d = kb.scalar("d", DType::kF64);
  Array y = kb.ndarray("y", DType::kF64, 1);
  kb.parallel_for("main", 0, 4,
                  [&](Value i) { kb.if_(i >= 1, [&] { y.store({i}, 2.0 * Value(d) + 1); }); });
  Kernel k = kb.finish();
  ASSERT_TRUE(verify(k).ok()) << verify(k).to_string();
  std::string text = print(k);
  EXPECT_NE(text.find("const 1 : i32"), std::string::npos) << text;
  EXPECT_NE(text.find("const 2.0 : f64"), std::string::npos) << text;
  EXPECT_NE(text.find("const 1.0 : f64"), std::string::npos) << text;

  for (double bad : {2.5, 1e30}) {
    KernelBuilder kb2("bad");
    Array z = kb2.ndarray("z", DType::kU32, 1);
    kb2.parallel_for("main", 0, 4,
                     [&](Value i) { z.store({i}, select(i < bad, kb2.u32(1), kb2.u32(0))); });
    Status st = verify(kb2.finish());
    ASSERT_FALSE(st.ok()) << bad;
    EXPECT_NE(st.message().find("lt %0"), std::string::npos) << st.to_string();
    EXPECT_NE(st.message().find("type mismatch: operands are i32 and f64"), std::string::npos)
        << st.to_string();
  }
}

// Compound updates on locals and on elements (through at() and [{...}]) are load, op, store.
Kernel updates(bool sugar) {
  KernelBuilder kb("upd");
  Array x = kb.ndarray("x", DType::kF32, 1);
  Array m = kb.ndarray("m", DType::kF32, 2);
  kb.parallel_for("main", 0, x.dim(0), [&](Value i) {
    Local acc = kb.local(x(i));
    Value j = kb.i32(1);
    if (sugar) {
      acc += 2;
      acc *= x(i);
      acc -= 0.5;
      acc /= 4;
      acc += acc;
      x.at(i) += acc;
      x[{i}] *= 3;
      m.at(i, j) -= Value(acc);
      m[{i, j}] /= 2;
      x.at(i) = m.at(i, j);
    } else {
      acc.store(acc.load() + kb.f32(2));
      acc.store(acc.load() * x(i));
      acc.store(acc.load() - kb.f32(0.5));
      acc.store(acc.load() / kb.f32(4));
      Value a1 = acc.load();
      acc.store(acc.load() + a1);
      Value a2 = acc.load();
      x.store({i}, x(i) + a2);
      x.store({i}, x(i) * kb.f32(3));
      Value a3 = acc.load();
      m.store({i, j}, m(i, j) - a3);
      m.store({i, j}, m(i, j) / kb.f32(2));
      x.store({i}, m(i, j));
    }
  });
  return kb.finish();
}

TEST(BuilderSugar, CompoundUpdatesBuildTheLongForm) {
  Kernel a = updates(true), b = updates(false);
  ASSERT_TRUE(verify(a).ok()) << verify(a).to_string();
  HostArray xa(DType::kF32, {5}), ma(DType::kF32, {5, 2});
  for (size_t e = 0; e < 5; ++e) xa.data[e] = 0.25 * static_cast<double>(e) - 0.4;
  for (size_t e = 0; e < 10; ++e) ma.data[e] = 0.125 * static_cast<double>(e) + 0.1;
  HostArray xb = xa, mb = ma;
  std::vector<HostArg> aa = {HostArg::of(xa), HostArg::of(ma)},
                       ab = {HostArg::of(xb), HostArg::of(mb)};
  ASSERT_TRUE(evaluate(a, aa).ok());
  ASSERT_TRUE(evaluate(b, ab).ok());
  EXPECT_EQ(xa.data, xb.data);
  EXPECT_EQ(ma.data, mb.data);
  // The update really happened (x changed from its input).
  EXPECT_NE(xa.data[2], 0.25 * 2 - 0.4);
}

// Particles: p (rank-1, xyz packed at [3i]) and v (rank-2, trailing dimension 3) step under a
// force towards the origin, with the velocity carried in a vector local through a loop; the
// long form writes every component by hand.
Kernel particles(bool sugar, DType t = DType::kF64) {
  KernelBuilder kb("particles");
  Scalar n = kb.scalar("n", DType::kI32);
  Array p = kb.ndarray("p", t, 1, {.needs_grad = true, .read_only = true});
  Array v = kb.ndarray("v", t, 2, {.needs_grad = true, .read_only = true});
  Array out = kb.ndarray("out", t, 2, {.needs_grad = true});
  kb.parallel_for("main", 0, v.dim(0), [&](Value i) {
    if (sugar) {
      VecLocal<3> pos = kb.local(p.load_vec<3>({i * 3}));
      VecLocal<3> vel = kb.local(v.load_vec<3>({i}));
      kb.for_range(kb.i32(0), n, [&](Value) {
        Vec3 q = pos.load();
        Value r = length(q) + 1.0;
        Vec3 f = -normalize(q + 0.5) / (r * r);
        vel += f * 0.1;
        vel *= 0.9;
        pos += vel.load() * 0.1 + cross(q, f) * 0.01;
      });
      Vec3 q = pos.load();
      out.store_vec<3>({i}, q * dot(q, vel.load()));
    } else {
      std::array<Local, 3> pos, vel;
      for (int c = 0; c < 3; ++c) {
        Value idx = c == 0 ? i * 3 : i * 3 + static_cast<double>(c);
        pos[c] = kb.local(p.load({idx}));
      }
      for (int c = 0; c < 3; ++c) vel[c] = kb.local(v.load({i, kb.i32(c)}));
      kb.for_range(kb.i32(0), n, [&](Value) {
        Value q[3] = {pos[0].load(), pos[1].load(), pos[2].load()};
        Value len = sqrt(q[0] * q[0] + q[1] * q[1] + q[2] * q[2]);
        Value r = len + 1.0;
        Value qh[3] = {q[0] + 0.5, q[1] + 0.5, q[2] + 0.5};
        Value lh = sqrt(qh[0] * qh[0] + qh[1] * qh[1] + qh[2] * qh[2]);
        Value nq[3] = {qh[0] / lh, qh[1] / lh, qh[2] / lh};
        Value r2 = r * r;
        Value f[3] = {-nq[0] / r2, -nq[1] / r2, -nq[2] / r2};
        Value fs[3] = {f[0] * 0.1, f[1] * 0.1, f[2] * 0.1};
        for (int c = 0; c < 3; ++c) vel[c].store(vel[c].load() + fs[c]);
        for (int c = 0; c < 3; ++c) vel[c].store(vel[c].load() * 0.9);
        Value vv[3] = {vel[0].load(), vel[1].load(), vel[2].load()};
        Value vs[3] = {vv[0] * 0.1, vv[1] * 0.1, vv[2] * 0.1};
        Value cr[3] = {q[1] * f[2] - q[2] * f[1], q[2] * f[0] - q[0] * f[2],
                       q[0] * f[1] - q[1] * f[0]};
        Value cs[3] = {cr[0] * 0.01, cr[1] * 0.01, cr[2] * 0.01};
        Value d[3] = {vs[0] + cs[0], vs[1] + cs[1], vs[2] + cs[2]};
        for (int c = 0; c < 3; ++c) pos[c].store(pos[c].load() + d[c]);
      });
      Value q[3] = {pos[0].load(), pos[1].load(), pos[2].load()};
      Value w[3] = {vel[0].load(), vel[1].load(), vel[2].load()};
      Value dt = q[0] * w[0] + q[1] * w[1] + q[2] * w[2];
      for (int c = 0; c < 3; ++c) out.store({i, kb.i32(c)}, q[c] * dt);
    }
  });
  return kb.finish();
}

HostValues particle_args(DType t, uint32_t count, int steps) {
  HostValues a;
  a.scalars = {static_cast<double>(steps), 0, 0, 0};
  a.arrays = {HostArray{}, HostArray(t, {3 * count}), HostArray(t, {count, 3}),
              HostArray(t, {count, 3})};
  for (size_t e = 0; e < 3 * count; ++e) {
    a.arrays[1].data[e] = round_to(t, std::sin(1.7 * static_cast<double>(e)) * 0.8);
    a.arrays[2].data[e] = round_to(t, std::cos(0.9 * static_cast<double>(e)) * 0.3);
  }
  return a;
}

TEST(BuilderSugar, VectorKernelMatchesTheScalarForm) {
  for (DType t : {DType::kF32, DType::kF64}) {
    Kernel a = particles(true, t), b = particles(false, t);
    ASSERT_TRUE(verify(a).ok()) << verify(a).to_string();
    // C++ leaves the order of a + b's operand evaluation open, so the statement order (and
    // the printed IR) may differ; the operations, hence the values, may not.
    HostValues va = particle_args(t, 7, 5), vb = va;
    auto aa = va.view();
    auto ab = vb.view();
    ASSERT_TRUE(evaluate(a, aa).ok());
    ASSERT_TRUE(evaluate(b, ab).ok());
    EXPECT_EQ(va.arrays[3].data, vb.arrays[3].data);
    EXPECT_NE(va.arrays[3].data[4], 0.0);
  }
}

TEST(BuilderSugar, VectorKernelGradientsMatchFiniteDifferences) {
  Kernel k = particles(true);
  ASSERT_TRUE(verify(k).ok());
  auto r = testing::check_gradients_cpu(k, particle_args(DType::kF64, 5, 4), 3);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->failure, "");
  EXPECT_GE(r->checked, 28);  // 15 + 15 input elements, a few may be skipped as non-smooth
}

// A load_vec / store_vec with an index count that fits neither layout is left to verify().
TEST(BuilderSugar, VectorAccessWithTheWrongIndexCountIsAVerifyError) {
  KernelBuilder kb("badvec");
  Array m = kb.ndarray("m", DType::kF32, 3);
  kb.parallel_for("main", 0, 4, [&](Value i) { m.store_vec<2>({i}, m.load_vec<2>({i})); });
  Status st = verify(kb.finish());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("index rank mismatch: ndarray 'm' has rank 3, got 1"),
            std::string::npos)
      << st.to_string();
}

}  // namespace
}  // namespace vkad::codegen
