// base/: Status context, the log sink, and misuse of a failed Result stopping the process.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/log.h"
#include "base/status.h"

namespace vkad {
namespace {

Status inner() { return make_error(ErrorCode::kNotFound, "no such thing"); }
Result<int> inner_value(bool fail) {
  if (fail) return inner();
  return 7;
}
Status outer() {
  VKAD_TRY_CTX(inner(), "loading 'k'");
  return {};
}
Result<int> outer_value(bool fail) {
  VKAD_ASSIGN_OR_RETURN_CTX(int v, inner_value(fail), std::string("reading ") + "'v'");
  return v + 1;
}

TEST(Base, ContextPrefixesTheMessageAndKeepsTheCode) {
  Status s = outer();
  EXPECT_EQ(s.code(), ErrorCode::kNotFound);
  EXPECT_EQ(s.message(), "loading 'k': no such thing");
  Result<int> r = outer_value(true);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "reading 'v': no such thing");
  Result<int> ok = outer_value(false);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 8);
  EXPECT_TRUE(Status().with_context("x").ok());
}

TEST(Base, LogSinkReceivesMessagesAndNullSilences) {
  struct Seen {
    std::vector<std::string> messages;
    std::vector<LogLevel> levels;
  } seen;
  set_log_sink(
      [](LogLevel level, const char* m, void* user) {
        auto* s = static_cast<Seen*>(user);
        s->messages.push_back(m);
        s->levels.push_back(level);
      },
      &seen);
  log(LogLevel::kWarning, "first");
  log(LogLevel::kError, "second");
  set_log_sink(nullptr, nullptr);
  log(LogLevel::kError, "dropped");
  reset_log_sink();
  ASSERT_EQ(seen.messages.size(), 2u);
  EXPECT_EQ(seen.messages[0], "first");
  EXPECT_EQ(seen.levels[1], LogLevel::kError);
}

TEST(BaseDeathTest, ValueOfAFailedResultStopsWithTheError) {
  Result<int> r = inner_value(true);
  EXPECT_DEATH((void)r.value(), "value\\(\\) of a failed Result.*no such thing");
}

}  // namespace
}  // namespace vkad
