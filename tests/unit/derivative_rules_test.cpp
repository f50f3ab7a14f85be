// The derivative rule table (autodiff/derivative_rules.h): every partial reads exactly the
// primal values its row declares. Reverse mode's needed-values analysis trusts the declared
// reads and its sweep runs the partials, so a mismatch here is a wrong checkpoint set (a
// silently wrong gradient, or a wasted stack). The values the partials compute are checked
// against finite differences by the reverse-mode fuzzer and the gradient tests.
#include "autodiff/derivative_rules.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "autodiff/forward_mode.h"
#include "autodiff/reverse_mode.h"
#include "ir/text.h"
#include "ir/verifier.h"

namespace vkad::codegen {
namespace {

// Records the operands of everything a partial emits; fresh ids start above the sentinels.
class RecordingBuilder : public PartialBuilder {
 public:
  ValueId op(Op, DType, std::vector<ValueId> args) override {
    for (ValueId a : args) used.insert(a);
    return next++;
  }
  ValueId constant(DType, double) override { return next++; }
  std::set<ValueId> used;
  ValueId next = 100;
};

constexpr ValueId kG = 1, kArg0 = 2, kArg1 = 3, kArg2 = 4, kResult = 5;

TEST(DerivativeRules, EveryPartialReadsExactlyTheDeclaredPrimals) {
  int partials = 0;
  std::set<Op> without_row;
  for (size_t o = 0; o < kNumOps; ++o) {
    Op op = static_cast<Op>(o);
    const DerivativeRule* rule = derivative_rule(op);
    if (!rule) {
      without_row.insert(op);
      continue;
    }
    for (int k = 0; k < 3; ++k) {
      const PartialRule& p = rule->partial[k];
      if (!p.emit) continue;
      RecordingBuilder b;
      PartialArgs a{
          DType::kF64, kG, {kArg0, kArg1, kArg2}, {DType::kF64, DType::kF64, DType::kF64}, kResult};
      ValueId out = p.emit(b, a);
      EXPECT_NE(out, kNoValue);
      uint8_t read = (b.used.count(kArg0) ? kReadArg0 : 0) | (b.used.count(kArg1) ? kReadArg1 : 0) |
                     (b.used.count(kArg2) ? kReadArg2 : 0) |
                     (b.used.count(kResult) ? kReadResult : 0);
      EXPECT_EQ(read, p.reads) << op_info(op).name << ", partial in operand " << k;
      EXPECT_TRUE(b.used.count(kG) || out == kG)
          << op_info(op).name << ", partial " << k << " ignores the adjoint";
      ++partials;
    }
  }
  EXPECT_GE(partials, 30);
  // The loop reaches the table's last rows: the adstack ops and the barrier have no row.
  for (Op op : {Op::kStackAccAdj, Op::kBarrier}) EXPECT_EQ(without_row.count(op), 1u);
}

// The barrier has no derivative rule (its slot is kNoRule); what each mode does with it:
// reverse mode refuses it by name (autodiff/adjoint_plan.cpp), forward mode keeps it, with each
// tangent on the side of the barrier its primal is on (tangent reads before it, writes after).
TEST(DerivativeRules, TheBarrierHasNoRowReverseModeRefusesItForwardModeKeepsIt) {
  EXPECT_EQ(derivative_rule(Op::kBarrier), nullptr);
  Result<Kernel> k = parse(R"(kernel k(x: ndarray<f32, 1> grad, y: ndarray<f32, 1> grad) {
  task main parallel %i in [0, 64) local_size 64 {
    %v = load x[%i] : f32
    %s = sin %v : f32
    barrier
    store y[%i], %s
  }
}
)");
  ASSERT_TRUE(k.ok()) << k.status().to_string();
  Result<Kernel> adj = make_adjoint(*k);
  ASSERT_FALSE(adj.ok());
  EXPECT_EQ(adj.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(adj.status().message().find("statement `barrier`: barrier cannot be differentiated"),
            std::string::npos)
      << adj.status().message();
  Result<Kernel> jvp = make_jvp(*k);
  ASSERT_TRUE(jvp.ok()) << jvp.status().to_string();
  EXPECT_TRUE(verify(*jvp).ok());
  const std::string text = print(*jvp);
  const size_t barrier = text.find("barrier");
  ASSERT_NE(barrier, std::string::npos) << text;
  EXPECT_EQ(text.find("barrier", barrier + 1), std::string::npos) << text;
  EXPECT_LT(text.find("load x_dot["), barrier) << text;
  EXPECT_GT(text.find("store y_dot["), barrier) << text;
}

TEST(DerivativeRules, EveryDifferentiableFloatOpHasARow) {
  for (Op op : {Op::kNeg,   Op::kSqrt, Op::kRsqrt, Op::kExp,   Op::kLog,    Op::kSin,
                Op::kCos,   Op::kTan,  Op::kTanh,  Op::kAsin,  Op::kAcos,   Op::kAbs,
                Op::kFloor, Op::kCeil, Op::kAdd,   Op::kSub,   Op::kMul,    Op::kDiv,
                Op::kMin,   Op::kMax,  Op::kPow,   Op::kAtan2, Op::kSelect, Op::kCast}) {
    EXPECT_NE(derivative_rule(op), nullptr) << op_info(op).name;
  }
  // Zero almost everywhere: a row without partials, so the sweep stops there.
  for (Op op : {Op::kFloor, Op::kCeil}) {
    for (const PartialRule& p : derivative_rule(op)->partial) EXPECT_EQ(p.emit, nullptr);
  }
}

}  // namespace
}  // namespace vkad::codegen
