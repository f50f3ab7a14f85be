// The IR rewrites behind reverse mode of while / break / continue kernels, text in, text
// checked out: lower_jumps (autodiff/jumps.h) and trip_counter_kernel (autodiff/trip_counter.h).
#include "autodiff/jumps.h"

#include <gtest/gtest.h>

#include <functional>

#include "autodiff/trip_counter.h"
#include "ir/text.h"
#include "ir/verifier.h"
#include "reference/cpu_eval.h"
#include "support/ad_check.h"
#include "support/while_kernels.h"

namespace vkad::testing {
namespace {

using codegen::DType;
using codegen::HostArray;

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The rewrite leaves no jump, verifies, and computes what the original computes (every
// output array equal, bit for bit, on the reference).
TEST(LowerJumps, RemovesEveryJumpAndKeepsTheResults) {
  for (const char* text : {kJumpCounts, kBreakContinue}) {
    auto k = codegen::parse(text);
    ASSERT_TRUE(k.ok()) << k.status().to_string();
    ASSERT_TRUE(codegen::has_jumps(*k));
    codegen::Kernel low = codegen::lower_jumps(*k);
    std::string out = codegen::print(low);
    EXPECT_FALSE(codegen::has_jumps(low));
    EXPECT_EQ(count(out, "break"), 0u) << out;
    EXPECT_EQ(count(out, "continue"), 0u) << out;
    // One skip flag per loop with jumps, one broke flag per loop with a break.
    EXPECT_GE(count(out, "alloca : bool"), 3u) << out;
    Status v = codegen::verify(low);
    ASSERT_TRUE(v.ok()) << v.to_string() << "\n" << out;
  }
  // Same results: kJumpCounts' counts on a few inputs.
  auto k = codegen::parse(kJumpCounts);
  codegen::Kernel low = codegen::lower_jumps(*k);
  HostArray xs = while_array({0.1, 0.35, 0.5, 0.75, 1.2, 4.0});
  HostArray y1(DType::kI32, {6}), z1(DType::kI32, {6}), y2 = y1, z2 = z1;
  std::vector<codegen::HostArg> a1 = {codegen::HostArg::of(xs), codegen::HostArg::of(y1),
                                      codegen::HostArg::of(z1)};
  std::vector<codegen::HostArg> a2 = {codegen::HostArg::of(xs), codegen::HostArg::of(y2),
                                      codegen::HostArg::of(z2)};
  ASSERT_TRUE(codegen::evaluate(*k, a1).ok());
  ASSERT_TRUE(codegen::evaluate(low, a2).ok());
  EXPECT_EQ(y1.data, y2.data);
  EXPECT_EQ(z1.data, z2.data);
}

// The counting kernel: no stores of the forward, one atomic_max per counted loop, the trips
// parameter last; it verifies.
TEST(TripCounter, KeepsControlFlowDropsWrites) {
  auto k = codegen::parse(kWhileInFor);
  ASSERT_TRUE(k.ok());
  std::vector<codegen::ValueId> loops;
  std::function<void(const codegen::Block&)> walk = [&](const codegen::Block& b) {
    for (const codegen::Stmt& s : b.stmts) {
      if (s.op == codegen::Op::kWhile) loops.push_back(s.result);
      for (const codegen::Block& c : s.blocks) walk(c);
    }
  };
  walk(k->tasks[0].body);
  ASSERT_EQ(loops.size(), 1u);
  codegen::Kernel c = codegen::trip_counter_kernel(*k, loops);
  std::string out = codegen::print(c);
  EXPECT_EQ(count(out, "store y["), 0u) << out;
  EXPECT_EQ(count(out, "atomic_max trips["), 1u) << out;
  EXPECT_EQ(count(out, "while "), 1u) << out;
  EXPECT_EQ(count(out, "for "), 1u) << out;
  EXPECT_EQ(c.params.back().name, "trips");
  Status v = codegen::verify(c);
  EXPECT_TRUE(v.ok()) << v.to_string() << "\n" << out;
}

}  // namespace
}  // namespace vkad::testing
