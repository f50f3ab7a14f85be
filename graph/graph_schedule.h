// Graph scheduling (Session, at end_capture; session.h "Graph scheduling"): the order and the
// barriers of a captured stretch of launches, from what each launch reads and writes.
//
// The runtime records a barrier after every dispatch, so N captured launches are N dependent
// steps on the device even where they touch nothing in common (on an H100 each costs about
// 2.9 us however little it does). Here each launch gets a level: one more than the highest
// level of an earlier launch it conflicts with, 0 with none (ASAP list scheduling), except
// that a launch no later one conflicts with (a sink) takes the last level. Launches
// are ordered by level (stably: capture order within one), and a barrier is needed only
// between launches that conflict with something since the last barrier.
//
// Two launches conflict on an array when one writes it (a store, or an atomic_max) and the
// other touches it, or one adds to it atomically and the other reads or writes it; two that
// only add atomically commute. Accesses whose first axis has a known, different row (a
// launch-uniform index evaluated with the launch's arguments, ir/launch_access.h) touch
// different elements and do not conflict. A launch whose accesses are unknown (a kernel vkad
// did not compile) conflicts with everything: nothing moves across it.
//
// Pure: array ids and access kinds in, an order and barrier flags out.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ir/launch_access.h"

namespace vkad {

struct ScheduleAccess {
  static constexpr int64_t kAnyRow = INT64_MIN;
  // The pseudo-array of the runtime's adstack heaps, which every heap-tier launch overwrites
  // (thread g of each uses the same slots).
  static constexpr uint64_t kAdstackHeaps = UINT64_MAX;
  uint64_t array = 0;
  codegen::ArrayAccess::Kind kind = codegen::ArrayAccess::Kind::kRead;
  int64_t row = kAnyRow;  // the first axis's row, where launch-uniform and known
};

struct ScheduleLaunch {
  bool known = true;  // false: may touch anything
  std::vector<ScheduleAccess> accesses;
  // Launches that could fuse with each other share a nonzero shape (same range, or N-d box, and
  // workgroup size: launch_fusion.h); 0 for none.
  uint64_t shape = 0;
};

// The levels of `launches` (in capture order) as above.
std::vector<uint32_t> schedule_levels(std::span<const ScheduleLaunch> launches);

// The capture-order indices sorted by level. Within a level, launches of the shape of the one
// placed last before the level come first (so a chain's next step follows it and may fuse with
// it, rather than a side launch of the same level), then the others grouped by shape in the
// order each shape first appears (so launches of one kind sit together and may fuse), each
// group in capture order.
std::vector<uint32_t> schedule_order(std::span<const uint32_t> levels,
                                     std::span<const ScheduleLaunch> launches);

// Whether two launches conflict (as above: on an array one writes and the other touches, or one
// adds to and the other reads or writes, at rows not known to differ; a launch whose accesses
// are unknown conflicts with every launch).
bool launches_conflict(const ScheduleLaunch& a, const ScheduleLaunch& b);

// The barriers of a sequence one launch at a time: next() says whether `l`, run after the
// launches given before it, needs a barrier before it (never the first; clear() after a fill,
// which records its own).
class BarrierTracker {
 public:
  BarrierTracker();
  ~BarrierTracker();
  bool next(const ScheduleLaunch& l);
  void clear();

 private:
  struct Pending;
  std::unique_ptr<Pending> pending_;
};

// An array and the kinds of access a launch makes to it (a bit per codegen::ArrayAccess::Kind,
// kind_bit()).
struct ArrayKinds {
  uint64_t array = 0;
  uint8_t kinds = 0;
};
constexpr uint8_t kind_bit(codegen::ArrayAccess::Kind k) {
  return static_cast<uint8_t>(1u << static_cast<unsigned>(k));
}

// The barriers of a capture, decided as each launch comes and judged per whole array (a row
// would rest on a scalar argument that a replay's update may change): next() says whether a
// launch with these accesses (`known` false: it may touch anything) needs a barrier after the
// launches given since the last one; clear() after a fill, which records its own. Keeps only
// what was touched since the last barrier, in a vector reused: nothing allocated per launch
// once warm, since the capturing thread pays for it on every launch.
class ArrayBarrierTracker {
 public:
  bool next(std::span<const ArrayKinds> accesses, bool known);
  void clear();

 private:
  std::vector<ArrayKinds> touched_;  // one entry per array
  bool any_ = false;                 // a launch since the last barrier
  bool unknown_ = false;             // one of them may touch anything
};

// Which launches of `in_order` (the order they will run in) need a barrier before them: the
// first never; another when it conflicts with a launch since the last barrier.
std::vector<bool> schedule_barriers(std::span<const ScheduleLaunch> in_order);

}  // namespace vkad
