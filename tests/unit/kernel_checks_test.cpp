// runtime/kernel_checks.h: what register_kernel refuses, checked on the host. Each case starts
// from a kernel the checks accept and breaks one thing; the refusal must say what (a check that
// accepted the broken kernel, or a message that named something else, fails the case).
#include "runtime/kernel_checks.h"

#include <gtest/gtest.h>

#include <string>

namespace vkad::runtime {
namespace {

KernelLimits limits() {
  KernelLimits l;
  l.device_name = "test device";
  l.max_workgroup_size_x = 256;
  l.max_workgroup_invocations = 512;
  l.float64 = false;
  l.int64 = false;
  return l;
}

CompiledKernel good() {
  CompiledKernel k;
  k.name = "k";
  k.params = {{"n", ParamKind::kScalar, DType::kI32, 0, false},
              {"x", ParamKind::kNdArray, DType::kF32, 2, true}};
  CompiledTask t;
  t.name = "main";
  t.local_size = 64;
  t.begin = RangeBound::constant(0);
  t.end = RangeBound::scalar(0);
  adstack::StackDesc st;
  st.name = "%7";
  st.capacity =
      adstack::SizeExpr::combine(adstack::SizeExpr::Kind::kMul, adstack::SizeExpr::scalar(0),
                                 adstack::SizeExpr::array_dim(1, 1));
  t.adstacks.push_back(st);
  t.loop_passes = adstack::SizeExpr::array_dim(1, 0);
  k.tasks.push_back(t);
  return k;
}

// The refusal's message, or "accepted".
std::string refusal(const CompiledKernel& k, const KernelLimits& l = limits()) {
  Status s = check_kernel(k, l);
  return s.ok() ? "accepted" : s.to_string();
}

#define EXPECT_REFUSED(k, ...)                                                             \
  do {                                                                                     \
    const std::string msg = refusal(k);                                                    \
    for (const char* part : {__VA_ARGS__})                                                 \
      EXPECT_NE(msg.find(part), std::string::npos) << "want '" << part << "' in: " << msg; \
  } while (0)

TEST(KernelChecks, AcceptsAWellFormedKernel) { EXPECT_EQ(refusal(good()), "accepted"); }

TEST(KernelChecks, NoTasks) {
  CompiledKernel k = good();
  k.tasks.clear();
  EXPECT_REFUSED(k, "invalid argument", "kernel 'k' has no tasks");
}

TEST(KernelChecks, TooManyParameters) {
  CompiledKernel k = good();
  k.params.resize(kMaxKernelParams + 1, k.params[0]);
  EXPECT_REFUSED(k, "kernel 'k' has 4097 parameters", "at most 4096");
}

TEST(KernelChecks, ParameterEnumeratorOutOfRange) {
  CompiledKernel k = good();
  k.params[1].kind = static_cast<ParamKind>(9);
  EXPECT_REFUSED(k, "parameter 1 ('x')", "kind 9 is not one of the enumerators");
}

TEST(KernelChecks, NdArrayRank) {
  CompiledKernel k = good();
  k.params[1].rank = 0;
  EXPECT_REFUSED(k, "parameter 1 ('x'): ndarray of rank 0");
  k.params[1].rank = kMaxNdArrayRank + 1;
  EXPECT_REFUSED(k, "ndarray of rank 9 (1 to 8 supported)");
}

TEST(KernelChecks, SixtyFourBitParametersNeedTheFeature) {
  CompiledKernel k = good();
  k.params[1].dtype = DType::kF64;
  const std::string msg = refusal(k);
  EXPECT_NE(msg.find("unsupported"), std::string::npos) << msg;
  EXPECT_NE(msg.find("parameter 'x' is f64, which device 'test device' does not support"),
            std::string::npos)
      << msg;
  KernelLimits l = limits();
  l.float64 = true;
  EXPECT_EQ(refusal(k, l), "accepted");
  k.params[1].dtype = DType::kI64;
  EXPECT_NE(refusal(k, l).find("is i64"), std::string::npos);
}

TEST(KernelChecks, LocalSizeWithinTheSmallerDeviceLimit) {
  CompiledKernel k = good();
  k.tasks[0].local_size = 0;
  EXPECT_REFUSED(k, "task 'main': local_size 0 is outside 1..256");
  k.tasks[0].local_size = 257;  // within invocations (512), past size x (256)
  EXPECT_REFUSED(k, "local_size 257 is outside 1..256");
  k.tasks[0].local_size = 256;
  EXPECT_EQ(refusal(k), "accepted");
}

TEST(KernelChecks, AdstackCapacityMustNameIntegerParameters) {
  CompiledKernel k = good();
  k.tasks[0].adstacks[0].capacity = adstack::SizeExpr::array_dim(1, 2);  // x has rank 2
  EXPECT_REFUSED(k, "task 'main': adstack %7", "missing or non-integer parameter");
  k = good();
  k.params[0].dtype = DType::kF32;  // n: a float scalar cannot size a stack (nor the range)
  EXPECT_REFUSED(k, "adstack %7");
  k = good();
  k.tasks[0].adstacks[0].heap = static_cast<adstack::Heap>(adstack::kHeapCount);
  EXPECT_REFUSED(k, "adstack %7 has an unknown heap");
}

TEST(KernelChecks, SpecWordsInsideTheArgsBufferAndDeclared) {
  CompiledKernel k = good();
  k.tasks[0].spec_words = {2};  // unaligned
  EXPECT_REFUSED(k, "task 'main': spec_words must be at most 64 aligned offsets");
  k.tasks[0].spec_words = {k.args_bytes()};  // past the end
  EXPECT_REFUSED(k, "spec_words");
  k.tasks[0].spec_words = {0};  // in place, but the (empty) module declares no constants
  EXPECT_REFUSED(k, "specialization constants declared by the module");
}

TEST(KernelChecks, NdBounds) {
  CompiledKernel k = good();
  k.tasks[0].dim_begin = {adstack::SizeExpr::constant(0)};
  EXPECT_REFUSED(k, "task 'main': N-d range bounds are malformed");  // no matching end
  k.tasks[0].dim_end = {adstack::SizeExpr::scalar(5)};               // no parameter 5
  EXPECT_REFUSED(k, "N-d range bounds are malformed");
  k.tasks[0].dim_end = {adstack::SizeExpr::scalar(0)};
  EXPECT_EQ(refusal(k), "accepted");
}

TEST(KernelChecks, LoopPassBound) {
  CompiledKernel k = good();
  k.tasks[0].loop_passes = adstack::SizeExpr::array_dim(0, 0);  // n is a scalar
  EXPECT_REFUSED(k, "task 'main': loop_passes refers to a missing");
}

TEST(KernelChecks, RangeBounds) {
  CompiledKernel k = good();
  k.tasks[0].end = RangeBound::scalar(1);  // x is an ndarray
  EXPECT_REFUSED(k, "kernel 'k' task 'main': range bound refers to a missing parameter");
  k.tasks[0].end = RangeBound::array_dim(1, 2);  // x has rank 2
  EXPECT_REFUSED(k, "range bound refers to a missing parameter or dimension");
  k.tasks[0].end = RangeBound::array_dim(1, 1);
  EXPECT_EQ(refusal(k), "accepted");
}

}  // namespace
}  // namespace vkad::runtime
