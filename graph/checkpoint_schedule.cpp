#include "graph/checkpoint_schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace vkad::codegen {

namespace {

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// Saturating: a cut whose bytes pass 2^64 is as good as unaffordable, never cheap.
uint64_t mul(uint64_t a, uint64_t b) {
  uint64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}
uint64_t add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

// Segments clamped to what they can be: none longer than the recording or its parent.
std::vector<uint32_t> clamped(uint32_t n, std::vector<uint32_t> s) {
  uint32_t parent = std::max(n, 1u);
  for (uint32_t& v : s) {
    v = std::clamp(v, 1u, parent);
    parent = v;
  }
  s.back() = 1;
  return s;
}

// The geometric cut of `levels` levels: segments n^((L - 1 - i) / L) (top free) or, with level
// 0 fixed at `top`, top^((L - 1 - i) / (L - 1)) below it.
std::vector<uint32_t> geometric(uint32_t n, uint32_t levels, uint32_t top) {
  std::vector<uint32_t> s(levels, 1);
  const double base = top ? top : std::max(n, 1u);
  const double steps = top ? levels - 1 : levels;
  for (uint32_t i = 0; i < levels; ++i) {
    const double e = static_cast<double>(levels - 1 - i) / steps;
    s[i] = static_cast<uint32_t>(std::ceil(std::pow(base, e) - 1e-9));
  }
  if (top) s[0] = top;
  return clamped(n, s);
}

struct Cut {
  std::vector<uint32_t> segments;
  uint64_t bytes = std::numeric_limits<uint64_t>::max();
};

// The least-bytes cut of `levels` levels near the geometric one: each free level's length
// scaled up and down while that lowers the bytes (the cost is convex enough along each).
Cut best_cut(uint32_t n, uint32_t levels, uint32_t top, uint64_t big_w, uint64_t small_w) {
  Cut c;
  c.segments = geometric(n, levels, top);
  c.bytes = checkpoint_bytes(n, c.segments, big_w, small_w);
  if (levels == 2 && top == 0) {  // one free length: every value
    for (uint32_t k = 1; k <= std::max(n, 1u); ++k) {
      const uint64_t b = checkpoint_bytes(n, {k, 1}, big_w, small_w);
      if (b < c.bytes) c = {{k, 1}, b};
    }
    return c;
  }
  const double factors[] = {0.5, 0.7, 0.85, 0.95, 1.05, 1.2, 1.4, 2.0};
  for (int pass = 0; pass < 4; ++pass) {
    bool better = false;
    for (uint32_t i = top ? 1 : 0; i + 1 < levels; ++i) {
      for (double f : factors) {
        std::vector<uint32_t> s = c.segments;
        s[i] = static_cast<uint32_t>(std::max(1.0, std::round(s[i] * f)));
        s = clamped(n, s);
        if (top && s[0] != top) continue;
        const uint64_t b = checkpoint_bytes(n, s, big_w, small_w);
        if (b < c.bytes) {
          c = {s, b};
          better = true;
        }
      }
    }
    if (!better) break;
  }
  return c;
}

}  // namespace

uint64_t checkpoint_bytes(uint32_t launches, const std::vector<uint32_t>& segments,
                          uint64_t state_bytes, uint64_t launch_bytes) {
  if (segments.empty()) return 0;
  const std::vector<uint32_t> s = clamped(launches, segments);
  const size_t levels = s.size();
  uint64_t bytes = add(state_bytes, mul(ceil_div(std::max(launches, 1u), s[0]), state_bytes));
  for (size_t i = 1; i + 1 < levels; ++i) {
    bytes = add(bytes, mul(ceil_div(s[i - 1], s[i]), state_bytes));
  }
  return add(bytes, levels >= 2 ? mul(s[levels - 2], launch_bytes) : 0);
}

std::string format_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[48];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buf, sizeof buf, "%.3g %s", v, units[u]);
  }
  return buf;
}

std::string CheckpointPlan::to_string() const {
  std::string cut;
  for (uint32_t s : segments) cut += (cut.empty() ? "" : ", ") + std::to_string(s);
  return std::to_string(segments.size()) + " levels {" + cut + "}: " + format_bytes(peak_bytes) +
         " of copies at most, every launch run " + std::to_string(recompute) + " times (" +
         std::to_string(launches) + " launches)";
}

Result<CheckpointPlan> plan_checkpoints(uint32_t launches, uint64_t state_bytes,
                                        uint64_t launch_bytes, uint64_t budget, uint32_t top,
                                        const std::string& what) {
  const uint32_t n = std::max(launches, 1u);
  if (top) top = std::min(top, n);
  // Past log2(n) + 2 levels every level halves its parent at best: no fewer bytes.
  const uint32_t most = std::min<uint32_t>(
      kMaxCheckpointLevels, 2 + static_cast<uint32_t>(std::ceil(std::log2(std::max(n, 2u)))));
  CheckpointPlan plan;
  plan.launches = launches;
  plan.state_bytes = state_bytes;
  plan.launch_bytes = launch_bytes;
  plan.min_bytes = std::numeric_limits<uint64_t>::max();
  bool chosen = false;
  for (uint32_t levels = 2; levels <= most; ++levels) {
    const Cut c = best_cut(n, levels, top, state_bytes, launch_bytes);
    plan.min_bytes = std::min(plan.min_bytes, c.bytes);
    if (!chosen && (budget == 0 || c.bytes <= budget)) {
      plan.segments = c.segments;
      plan.peak_bytes = c.bytes;
      plan.recompute = levels;
      chosen = true;
    }
  }
  if (!chosen) {
    return make_error(
        ErrorCode::kInvalidArgument,
        what + ": the memory budget of " + format_bytes(budget) +
            " is below the least this recording's checkpoints need, " +
            format_bytes(plan.min_bytes) + " (" + std::to_string(launches) + " launches writing " +
            format_bytes(state_bytes) + " of arrays, at most " + format_bytes(launch_bytes) +
            " per launch); raise it to at least " + std::to_string(plan.min_bytes) + " bytes");
  }
  return plan;
}

}  // namespace vkad::codegen
