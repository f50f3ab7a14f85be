// C ABI session lifetimes (api/vkad_c.h, "Lifetimes"): destroying a session twice or calling
// through a destroyed one aborts with a message naming the call in builds without NDEBUG,
// instead of a silent use-after-free. Release builds do not check (the Debug pass of CI runs
// these).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "api/vkad_c.h"

namespace {

#ifdef NDEBUG
#define SKIP_IN_RELEASE() GTEST_SKIP() << "lifetime checks are compiled in without NDEBUG only"
#else
#define SKIP_IN_RELEASE() (void)0
#endif

// A session, or nullptr (and the test skips) when there is no Vulkan device.
vkad_session* make_session() {
  vkad_session* s = nullptr;
  vkad_status* st = vkad_session_create(nullptr, &s);
  if (st != nullptr) {
    const bool no_device = vkad_status_code(st) == VKAD_NO_DEVICE;
    vkad_status_free(st);
    EXPECT_TRUE(no_device);
    return nullptr;
  }
  return s;
}

TEST(CAbiSessionLifetimes, DestroyedTwiceAborts) {
  SKIP_IN_RELEASE();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        vkad_session* s = make_session();
        if (s == nullptr) std::abort();  // no device: the death test still ends
        vkad_session_destroy(s);
        vkad_session_destroy(s);
      },
      "vkad: vkad_session_destroy: session 0x[0-9a-f]+ is not live");
}

TEST(CAbiSessionLifetimes, CallThroughADestroyedSessionAborts) {
  SKIP_IN_RELEASE();
  vkad_session* probe = make_session();
  if (probe == nullptr) GTEST_SKIP() << "SKIPPED: no Vulkan device";
  vkad_session_destroy(probe);
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        vkad_session* s = make_session();
        vkad_session_destroy(s);
        vkad_kernel k = 0;
        (void)vkad_compile(s, "kernel k() {}", &k);
      },
      "vkad: vkad_compile: session 0x[0-9a-f]+ is not live");
}

TEST(CAbiSessionLifetimes, ALiveSessionWorksAfterAnotherWasDestroyed) {
  vkad_session* a = make_session();
  if (a == nullptr) GTEST_SKIP() << "SKIPPED: no Vulkan device";
  vkad_session* b = make_session();
  ASSERT_NE(b, nullptr);
  vkad_session_destroy(a);
  vkad_stats stats{};
  stats.struct_size = sizeof stats;
  vkad_status* st = vkad_session_stats(b, &stats);
  EXPECT_EQ(st, nullptr) << vkad_status_message(st);
  vkad_status_free(st);
  vkad_session_destroy(b);
}

}  // namespace
