// RuntimeOptions::profile_flush (issue 49, point 1): with it on, every submission is counted in
// RuntimeStats::flush_profile and its phases are timed; with it off the profile stays zero (no
// clock is read). No timing is asserted beyond "some time was measured".
#include <gtest/gtest.h>

#include <vector>

#include "runtime/runtime.h"
#include "support/sample_kernels.h"

namespace vkad::testing {
namespace {

runtime::FlushProfile profile_after_flushes(bool on, int flushes, bool* skipped) {
  runtime::RuntimeOptions o;
  o.device.enable_validation = true;
  o.profile_flush = on;
  auto rt = runtime::Runtime::create(o);
  *skipped = !rt.ok() && rt.status().code() == ErrorCode::kNoDevice;
  if (*skipped) return {};
  EXPECT_TRUE(rt.ok()) << rt.status().to_string();
  if (!rt.ok()) return {};
  runtime::Runtime& r = **rt;
  auto x = r.create_ndarray(runtime::DType::kF32, {256}, "x").value();
  auto y = r.create_ndarray(runtime::DType::kF32, {256}, "y").value();
  std::vector<float> ones(256, 1.0f);
  EXPECT_TRUE(r.upload(x, ones.data(), sizeof(float) * ones.size()).ok());
  EXPECT_TRUE(r.upload(y, ones.data(), sizeof(float) * ones.size()).ok());
  EXPECT_TRUE(r.synchronize().ok());
  const runtime::FlushProfile before = r.stats()->flush_profile;
  auto k = r.register_kernel(make_axpy_kernel("axpy")).value();
  const runtime::Arg args[] = {runtime::Arg::f32(1.0f), runtime::Arg::ndarray(x),
                               runtime::Arg::ndarray(y)};
  for (int i = 0; i < flushes; ++i) {
    EXPECT_TRUE(r.launch(k, args).ok());
    EXPECT_TRUE(r.flush().ok());
  }
  EXPECT_TRUE(r.synchronize().ok());
  runtime::FlushProfile p = r.stats()->flush_profile;
  p.flushes -= before.flushes;
  EXPECT_EQ(r.device().validation_message_count(), 0u);
  return p;
}

TEST(FlushProfile, CountsAndTimesEverySubmissionWhenOn) {
  bool skipped = false;
  const runtime::FlushProfile p = profile_after_flushes(true, 20, &skipped);
  if (skipped) GTEST_SKIP() << "SKIPPED: no Vulkan device";
  EXPECT_EQ(p.flushes, 20u);
  EXPECT_GT(p.submit_us, 0.0);
  EXPECT_GT(p.begin_us, 0.0);
}

TEST(FlushProfile, StaysZeroWhenOff) {
  bool skipped = false;
  const runtime::FlushProfile p = profile_after_flushes(false, 20, &skipped);
  if (skipped) GTEST_SKIP() << "SKIPPED: no Vulkan device";
  EXPECT_EQ(p.flushes, 0u);
  EXPECT_EQ(p.begin_us, 0.0);
  EXPECT_EQ(p.submit_us, 0.0);
  EXPECT_EQ(p.poll_us, 0.0);
  EXPECT_EQ(p.release_us, 0.0);
  EXPECT_EQ(p.recycle_us, 0.0);
}

}  // namespace
}  // namespace vkad::testing
