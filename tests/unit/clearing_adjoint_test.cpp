// make_clearing_adjoint (reverse_mode.h): the adjoint of a store clears the seed it read, at the
// stored elements only, and computes the same gradients as make_adjoint -- on the CPU evaluator.
#include <gtest/gtest.h>

#include <vector>

#include "autodiff/reverse_mode.h"
#include "ir/text.h"
#include "reference/cpu_eval.h"

namespace vkad::testing {
namespace {

using codegen::HostArg;
using codegen::HostArray;

// b[i] = sin(a[i]) * 0.9 for i < 5 of 8 (the rest of b is not written), and an atomic sum.
const char* kPartial = R"(
kernel partial(a: ndarray<f32, 1> grad, b: ndarray<f32, 1> grad, s: ndarray<f32, 1> grad) {
  task main parallel %i in [0, 5) {
    %x = load a[%i] : f32
    %y = sin %x : f32
    %c = const 0.9 : f32
    %m = mul %y, %c : f32
    store b[%i], %m
    %z = const 0 : i32
    atomic_add s[%z], %x
  }
}
)";

TEST(ClearingAdjoint, StoresClearTheirSeedWhereTheyWroteAndGradientsAreMakeAdjoints) {
  auto k = codegen::parse(kPartial);
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  auto plain = codegen::make_adjoint(*k);
  auto clearing = codegen::make_clearing_adjoint(*k);
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  ASSERT_TRUE(clearing.ok()) << clearing.status().to_string();
  ASSERT_EQ(plain->params.size(), clearing->params.size());
  auto run = [&](const codegen::Kernel& adj, std::vector<HostArray>& arrays) {
    std::vector<HostArg> args;
    for (HostArray& a : arrays) args.push_back(HostArg::of(a));
    ASSERT_TRUE(codegen::evaluate(adj, args).ok());
  };
  auto fresh = [] {
    std::vector<HostArray> arrays;
    for (uint32_t n : {8u, 8u, 1u, 8u, 8u, 1u})
      arrays.emplace_back(abi::DType::kF32, std::vector<uint32_t>{n});
    for (uint32_t i = 0; i < 8; ++i) {
      arrays[0].data[i] = 0.1 * i;  // a
      arrays[4].data[i] = 1.0 + i;  // b_grad: the seed
    }
    arrays[5].data[0] = 2.0;  // s_grad
    return arrays;
  };
  std::vector<HostArray> p = fresh(), c = fresh();
  run(*plain, p);
  run(*clearing, c);
  EXPECT_EQ(c[3].data, p[3].data);  // a_grad: the same gradient
  for (uint32_t i = 0; i < 8; ++i) {
    // Cleared where b was stored, kept where it was not; make_adjoint keeps every seed.
    EXPECT_EQ(c[4].data[i], i < 5 ? 0.0 : 1.0 + i) << i;
    EXPECT_EQ(p[4].data[i], 1.0 + i) << i;
  }
  // An atomic add accumulates: its seed stays.
  EXPECT_EQ(c[5].data[0], 2.0);
}

}  // namespace
}  // namespace vkad::testing
