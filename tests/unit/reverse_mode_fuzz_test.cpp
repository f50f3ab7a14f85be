// The reverse-mode fuzzer, CPU tier: random kernels (tests/support/ad_fuzz.h) whose adjoints,
// run on the CPU evaluator, must match f64 central finite differences of their forward
// kernels. Seeded and reproducible: VKAD_AD_FUZZ_SEED (first seed, default 1) and
// VKAD_AD_FUZZ_COUNT (default 5000); a failure prints the seed and the kernel's text. A longer
// run is documented in docs/architecture.md (reverse mode).
#include <gtest/gtest.h>

#include <set>

#include "ir/text.h"
#include "ir/verifier.h"
#include "support/ad_check.h"
#include "support/ad_fuzz.h"

namespace vkad::testing {
namespace {

TEST(ReverseModeFuzz, AdjointsMatchFiniteDifferences) {
  uint32_t seed0 = env_or("VKAD_AD_FUZZ_SEED", 1), count = env_or("VKAD_AD_FUZZ_COUNT", 5000);
  int failures = 0;
  long checked = 0, skipped = 0;
  for (uint32_t seed = seed0; seed < seed0 + count && failures < 3; ++seed) {
    AdFuzzCase c = random_ad_kernel(seed);
    Status v = codegen::verify(c.kernel);
    ASSERT_TRUE(v.ok()) << "seed " << seed
                        << ": the generator made an invalid kernel: " << v.to_string() << "\n"
                        << codegen::print(c.kernel);
    auto r = check_gradients_cpu(c.kernel, c.args, seed);
    if (!r.ok() || !r->failure.empty()) {
      ++failures;
      ADD_FAILURE() << "seed " << seed << " (rerun: VKAD_AD_FUZZ_SEED=" << seed
                    << " VKAD_AD_FUZZ_COUNT=1): " << (r.ok() ? r->failure : r.status().to_string())
                    << "\n"
                    << codegen::print(c.kernel);
      continue;
    }
    checked += r->checked;
    skipped += r->skipped;
  }
  // The smoothness filter must not swallow the test: most points are compared.
  EXPECT_GT(checked, 4 * skipped) << "checked " << checked << ", skipped " << skipped;
  std::cout << "[ad fuzz] seeds " << seed0 << ".." << seed0 + count - 1 << ": " << checked
            << " gradient elements compared, " << skipped << " skipped as not smooth\n";
}

// The generator reaches every differentiable op and every statement kind, so a clean run
// means something.
TEST(ReverseModeFuzz, GeneratorCoversEveryDifferentiableOp) {
  std::set<codegen::Op> seen;
  std::function<void(const codegen::Block&)> walk = [&](const codegen::Block& b) {
    for (const codegen::Stmt& s : b.stmts) {
      seen.insert(s.op);
      for (const codegen::Block& c : s.blocks) walk(c);
    }
  };
  for (uint32_t seed = 1; seed <= 200; ++seed) walk(random_ad_kernel(seed).kernel.tasks[0].body);
  using codegen::Op;
  for (Op op : {Op::kNeg,       Op::kSqrt,      Op::kRsqrt,      Op::kExp,   Op::kLog,
                Op::kSin,       Op::kCos,       Op::kTan,        Op::kTanh,  Op::kAsin,
                Op::kAcos,      Op::kAbs,       Op::kFloor,      Op::kCeil,  Op::kAdd,
                Op::kSub,       Op::kMul,       Op::kDiv,        Op::kMod,   Op::kFloorDiv,
                Op::kMin,       Op::kMax,       Op::kPow,        Op::kAtan2, Op::kSelect,
                Op::kCast,      Op::kLoadLocal, Op::kStoreLocal, Op::kLoad,  Op::kStore,
                Op::kAtomicAdd, Op::kFor,       Op::kIf,         Op::kWhile, Op::kBreak,
                Op::kContinue}) {
    EXPECT_TRUE(seen.count(op)) << "no generated kernel uses " << codegen::op_info(op).name;
  }
}

TEST(ReverseModeFuzz, SameSeedSameKernel) {
  EXPECT_EQ(codegen::print(random_ad_kernel(42).kernel),
            codegen::print(random_ad_kernel(42).kernel));
  EXPECT_NE(codegen::print(random_ad_kernel(42).kernel),
            codegen::print(random_ad_kernel(43).kernel));
}

}  // namespace
}  // namespace vkad::testing
