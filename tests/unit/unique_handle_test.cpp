// rhi/unique_handle.h without a device: a fake handle type and a deleter that records what it
// released, so each ownership rule (move steals, move-assign releases the target's old handle
// with the target's deleter, destructor releases once, release() gives up ownership) is checked.
#include "rhi/unique_handle.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace vkad::rhi {
namespace {

using FakeHandle = uint64_t;  // what a non-dispatchable Vulkan handle is on 32-bit targets

struct Log {
  std::vector<std::string> released;  // "owner:handle"
};

struct FakeDeleter {
  Log* log = nullptr;
  std::string owner;
  void operator()(FakeHandle h) noexcept {
    log->released.push_back(owner + ":" + std::to_string(h));
  }
};

using Handle = UniqueHandle<FakeHandle, FakeDeleter>;

static_assert(!std::is_copy_constructible_v<Handle> && !std::is_copy_assignable_v<Handle>);
static_assert(std::is_nothrow_move_constructible_v<Handle> &&
              std::is_nothrow_move_assignable_v<Handle>);
static_assert(std::is_nothrow_destructible_v<Handle>);

TEST(UniqueHandle, DestructorReleasesOnceAndNullReleasesNothing) {
  Log log;
  {
    Handle a(7, {&log, "a"});
    Handle empty;
    EXPECT_TRUE(a);
    EXPECT_FALSE(empty);
  }
  EXPECT_EQ(log.released, (std::vector<std::string>{"a:7"}));
}

TEST(UniqueHandle, MoveStealsHandleAndDeleterAndNullsTheSource) {
  Log log;
  {
    Handle a(7, {&log, "a"});
    Handle b(std::move(a));
    EXPECT_FALSE(a);  // NOLINT(bugprone-use-after-move): the moved-from state is the contract
    EXPECT_EQ(b.get(), 7u);
    EXPECT_EQ(b.deleter().owner, "a");
    EXPECT_TRUE(log.released.empty());
  }
  EXPECT_EQ(log.released, (std::vector<std::string>{"a:7"})) << "released once, by the new owner";
}

TEST(UniqueHandle, MoveAssignReleasesTheTargetsHandleWithTheTargetsDeleter) {
  Log log;
  {
    Handle a(7, {&log, "a"});
    Handle b(9, {&log, "b"});
    b = std::move(a);
    EXPECT_EQ(log.released, (std::vector<std::string>{"b:9"}));
    EXPECT_FALSE(a);  // NOLINT(bugprone-use-after-move)
    EXPECT_EQ(b.get(), 7u);
    Handle& self = b;
    b = std::move(self);  // self-move keeps the handle
    EXPECT_EQ(b.get(), 7u);
  }
  EXPECT_EQ(log.released, (std::vector<std::string>{"b:9", "a:7"}));
}

TEST(UniqueHandle, ResetAndReleaseGiveUpOwnership) {
  Log log;
  Handle a(7, {&log, "a"});
  a.reset();
  a.reset();  // twice: once released
  EXPECT_EQ(log.released, (std::vector<std::string>{"a:7"}));
  EXPECT_EQ(a.deleter().owner, "a") << "the deleter's state stays with the owner";
  Handle b(9, {&log, "b"});
  FakeHandle raw = b.release();
  EXPECT_EQ(raw, 9u);
  EXPECT_FALSE(b);
  b.reset();
  EXPECT_EQ(log.released, (std::vector<std::string>{"a:7"})) << "released handles are the caller's";
}

}  // namespace
}  // namespace vkad::rhi
