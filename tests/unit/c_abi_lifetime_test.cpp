// C ABI lifetimes without a device (api/vkad_c.h, "Lifetimes"): freeing a status twice, or
// reading one after it was freed, aborts with a message naming the call in builds without
// NDEBUG, instead of a silent use-after-free. Release builds do not check (the Debug pass of CI
// runs these).
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

// A real error status without a device: vkad_session_create with a NULL out-pointer.
vkad_status* some_error() { return vkad_session_create(nullptr, nullptr); }

TEST(CAbiLifetimes, StatusFreedTwiceAborts) {
  SKIP_IN_RELEASE();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        vkad_status* st = some_error();
        vkad_status_free(st);
        vkad_status_free(st);
      },
      "vkad: vkad_status_free: status 0x[0-9a-f]+ is not live");
}

TEST(CAbiLifetimes, StatusReadAfterFreeAborts) {
  SKIP_IN_RELEASE();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        vkad_status* st = some_error();
        vkad_status_free(st);
        (void)vkad_status_message(st);
      },
      "vkad: vkad_status_message: status 0x[0-9a-f]+ is not live");
}

TEST(CAbiLifetimes, LiveStatusesAndNullAreFine) {
  vkad_status* st = some_error();
  ASSERT_NE(st, nullptr);
  EXPECT_EQ(vkad_status_code(st), VKAD_INVALID_ARGUMENT);
  EXPECT_NE(std::string(vkad_status_message(st)).find("out is NULL"), std::string::npos);
  vkad_status_free(st);
  vkad_status_free(nullptr);  // accepted and ignored
  EXPECT_EQ(vkad_status_code(nullptr), VKAD_OK);
  vkad_session_destroy(nullptr);
}

}  // namespace
