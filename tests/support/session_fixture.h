// One validated Session for a GPU test (tests/gpu): made with the Khronos validation layer on,
// skipped where there is no Vulkan device, and checked at the end to have reported no
// validation message (a message is a failing test). Header-only: the support library does not
// link gtest (the benchmarks use it too).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>

#include "runtime/runtime.h"
#include "vkad.h"

namespace vkad::testing {

// A session with validation on and `adjust` applied to its options; nullptr with *skipped set
// where there is no Vulkan device, nullptr with a test failure on any other error.
inline std::unique_ptr<Session> validated_session(
    bool* skipped, const std::function<void(SessionOptions&)>& adjust = {}) {
  SessionOptions o;
  o.validation = true;
  if (adjust) adjust(o);
  auto r = Session::create(o);
  *skipped = !r.ok() && r.status().code() == ErrorCode::kNoDevice;
  if (*skipped) return nullptr;
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? std::move(r).value() : nullptr;
}

// Fails the test if `s` reported validation messages, listing them.
inline void expect_no_validation_messages(Session& s) {
  const rhi::Device& d = s.runtime().device();
  std::string all;
  for (const std::string& m : d.validation_messages()) all += m + "\n";
  EXPECT_EQ(d.validation_message_count(), 0u) << all;
}

// A fixture holding `s_`, made in SetUp (with adjust() applied to its options) and checked in
// TearDown. A derived SetUp calls this one first and returns when IsSkipped() or
// HasFatalFailure().
template <typename Base = ::testing::Test>
class ValidatedSessionFixture : public Base {
 protected:
  void SetUp() override {
    bool skipped = false;
    s_ = validated_session(&skipped, [this](SessionOptions& o) { adjust(o); });
    if (skipped) GTEST_SKIP() << "SKIPPED: no Vulkan device";
    ASSERT_TRUE(s_ != nullptr);
  }
  void TearDown() override {
    if (s_) expect_no_validation_messages(*s_);
  }
  virtual void adjust(SessionOptions&) {}
  std::unique_ptr<Session> s_;
};
using ValidatedSessionTest = ValidatedSessionFixture<>;

}  // namespace vkad::testing
