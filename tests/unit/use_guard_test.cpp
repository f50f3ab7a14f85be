// The thread-model check of runtime/use_guard.h, without a device.
#include "runtime/use_guard.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <thread>

namespace vkad::runtime {
namespace {

TEST(UseGuard, SecondThreadIsRefusedWhileTheFirstIsInside) {
  UseGuard guard;
  std::mutex m;
  std::condition_variable cv;
  bool inside = false, release = false;
  std::thread holder([&] {
    auto scope = guard.enter("launch");
    EXPECT_TRUE(scope.ok());
    std::unique_lock<std::mutex> lock(m);
    inside = true;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
  });
  {
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return inside; });
  }
  {
    auto refused = guard.enter("download");
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), ErrorCode::kFailedPrecondition);
    EXPECT_NE(refused.status().message().find("Runtime::download"), std::string::npos);
    EXPECT_NE(refused.status().message().find("externally synchronised"), std::string::npos);
  }
  {
    std::lock_guard<std::mutex> lock(m);
    release = true;
  }
  cv.notify_all();
  holder.join();
  // The holder left: this thread may enter now, and a refused attempt released nothing.
  auto later = guard.enter("launch");
  EXPECT_TRUE(later.ok());
}

TEST(UseGuard, ReentryOnTheOwningThreadIsAllowedAndKeepsOwnership) {
  UseGuard guard;
  auto outer = guard.enter("download");
  ASSERT_TRUE(outer.ok());
  {
    auto inner = guard.enter("flush");
    EXPECT_TRUE(inner.ok());
  }
  // The inner scope must not have released the outer one's ownership.
  bool refused_elsewhere = false;
  std::thread other([&] { refused_elsewhere = !guard.enter("launch").ok(); });
  other.join();
  EXPECT_TRUE(refused_elsewhere);
}

}  // namespace
}  // namespace vkad::runtime
