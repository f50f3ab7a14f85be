// What the user wrote that made a launch (Runtime::set_launch_note, set_launch_iteration), for
// its device errors: "in launch #12 (iteration 4 of the loop at tape entry 2)". A captured
// launch keeps its capture's, which its replays report.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

namespace vkad::runtime {

struct LaunchOrigin {
  const char* what = nullptr;  // static storage; nullptr: none
  uint64_t index = 0;
  // The iteration of a loop launched one launch at a time, negative: none; a launch fused from
  // several iterations' spans iteration .. last_iteration.
  int64_t iteration = -1;
  int64_t last_iteration = -1;
  bool empty() const { return what == nullptr && iteration < 0; }
  // "iteration 4 of the loop at tape entry 2", "iterations 0 to 3 of a launch_loop",
  // "tape entry 3"
  std::string text() const {
    std::string t;
    if (iteration >= 0 && last_iteration > iteration) {
      t = "iterations " + std::to_string(iteration) + " to " + std::to_string(last_iteration) +
          " of ";
    } else if (iteration >= 0) {
      t = "iteration " + std::to_string(iteration) + " of ";
    }
    if (what == nullptr) return t + "a launch_loop";
    return t + what + " " + std::to_string(index);
  }
  // The origin of a launch fused from launches of `a` and `b`: what both name (their loop, with
  // the iterations of both), else none.
  static LaunchOrigin join(const LaunchOrigin& a, const LaunchOrigin& b) {
    if (a.what != b.what || a.index != b.index) return {};
    LaunchOrigin o = a;
    if (a.iteration < 0 || b.iteration < 0) {
      o.iteration = o.last_iteration = -1;
      return o;
    }
    o.iteration = std::min(a.iteration, b.iteration);
    o.last_iteration =
        std::max(std::max(a.iteration, a.last_iteration), std::max(b.iteration, b.last_iteration));
    return o;
  }
};

}  // namespace vkad::runtime
