// Milliseconds per phase of a session's slow paths, printed to stderr with VKAD_GRAPH_TRACE:
// what a graph rework (end_capture) or a step loop's first run (launch_loop) spends its time
// on. One line per clock, written when it goes out of scope.
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace vkad {

class PhaseClock {
 public:
  // `what` starts the line ("vkad graph rework"); `compile_ms`, where given, is the session's
  // running total of compile time, whose growth per phase is printed beside it.
  explicit PhaseClock(const char* what, const double* compile_ms = nullptr)
      : on_(std::getenv("VKAD_GRAPH_TRACE") != nullptr),
        what_(what),
        compile_ms_(compile_ms),
        compiled_(compile_ms ? *compile_ms : 0),
        last_(std::chrono::steady_clock::now()) {}
  PhaseClock(const PhaseClock&) = delete;
  PhaseClock& operator=(const PhaseClock&) = delete;
  void mark(const char* phase) {
    if (!on_) return;
    const auto now = std::chrono::steady_clock::now();
    line_ += std::string(line_.empty() ? "" : ", ") + phase + " " +
             std::to_string(std::chrono::duration<double, std::milli>(now - last_).count()) + " ms";
    if (compile_ms_ && *compile_ms_ > compiled_) {
      line_ += " (compiles " + std::to_string(*compile_ms_ - compiled_) + " ms)";
    }
    if (compile_ms_) compiled_ = *compile_ms_;
    last_ = now;
  }
  ~PhaseClock() {
    if (on_ && !line_.empty()) std::fprintf(stderr, "%s: %s\n", what_, line_.c_str());
  }

 private:
  bool on_;
  const char* what_;
  const double* compile_ms_;
  double compiled_;
  std::chrono::steady_clock::time_point last_;
  std::string line_;
};

}  // namespace vkad
