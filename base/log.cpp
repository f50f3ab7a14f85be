#include "base/log.h"

#include <cstdio>
#include <mutex>

namespace vkad {
namespace {

void stderr_sink(LogLevel level, const char* message, void*) {
  std::fprintf(stderr, "[vkad %s] %s\n", log_level_name(level), message);
}

struct SinkState {
  std::mutex mu;
  LogSink sink = stderr_sink;
  void* user = nullptr;
};
SinkState& state() {
  static SinkState* s = new SinkState();  // never destroyed: messages may arrive during exit
  return *s;
}

}  // namespace

const char* log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
  }
  return "?";
}

void set_log_sink(LogSink sink, void* user) {
  SinkState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.sink = sink;
  s.user = user;
}

void reset_log_sink() { set_log_sink(stderr_sink, nullptr); }

void log(LogLevel level, const std::string& message) {
  SinkState& s = state();
  LogSink sink;
  void* user;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    sink = s.sink;
    user = s.user;
  }
  if (sink != nullptr) sink(level, message.c_str(), user);
}

}  // namespace vkad
