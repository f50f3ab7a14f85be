// Launch planning, pure: from a kernel's description, the launch's argument values and the
// device's limits to each task's range, workgroups, adstack rows and tier, the heap bytes the
// launch needs, and the lavapipe loop-pass check. No device, no Vulkan objects: unit-tested on
// the host (tests/unit/launch_plan_test.cpp). Runtime::launch plans, then records.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "abi/kernel_abi.h"
#include "adstack/adstack_layout.h"
#include "base/status.h"

namespace vkad::runtime {

// The device facts and options planning depends on.
struct LaunchLimits {
  std::string device_name;
  uint32_t max_groups = 65535;             // RuntimeOptions::max_groups
  uint32_t max_workgroup_count_x = 65535;  // maxComputeWorkGroupCount[0] (advice only)
  uint64_t max_storage_buffer_range = 1ull << 31;
  uint64_t max_loop_passes = 0;  // 0: the device cuts no loops
  bool enforce_loop_limit = true;
};

// The launch's argument values as planning reads them: per parameter, a scalar's integer value
// (`ints`) or an ndarray's shape (`shapes`; nullptr for scalars). Checked against the kernel
// before planning (Runtime::check_args).
struct LaunchInputs {
  std::vector<int64_t> ints;
  std::vector<const std::vector<uint32_t>*> shapes;
  adstack::SizeInputs size_inputs() const;
};

using PrivateLengths = std::array<uint32_t, adstack::kHeapCount>;
enum class TierChoice : uint8_t { kHeap, kPrivate, kFallback };

struct TaskPlan {
  uint32_t begin = 0, end = 0, groups = 0;
  adstack::RowLayout row;  // adstack tasks only
  TierChoice tier = TierChoice::kHeap;
  PrivateLengths private_len{};  // kPrivate only
  bool private_tier() const { return tier == TierChoice::kPrivate; }
  bool operator==(const TaskPlan&) const = default;
};

struct LaunchPlan {
  std::vector<TaskPlan> tasks;
  std::array<uint64_t, adstack::kHeapCount> heap_need{};  // bytes per heap, over all tasks
  bool any_heap_task = false;             // some adstack task uses the heaps (else none are needed)
  std::array<uint64_t, 3> tier_counts{};  // adstack tasks per TierChoice
  bool operator==(const LaunchPlan&) const = default;
};

// The tier of one adstack task given its row: called only for adstack tasks; writes the private
// lengths for kPrivate.
using TierChooser =
    std::function<TierChoice(uint32_t task, const adstack::RowLayout& row, PrivateLengths* len)>;

// Per task: the range [begin, end) (1-d bounds, or the product of an N-d task's extents), the
// workgroups min(ceil(n / local_size), max_groups) (1 for serial tasks), lowered for an adstack
// task in the heap tier until its heap fits one binding (tasks grid-stride, so fewer threads is
// still correct); the heap bytes each heap needs; and the loop-pass check. Errors name the
// kernel and task: a range out of bounds (kInvalidArgument), an adstack row past a binding
// (kOutOfDeviceMemory), too many loop passes for the device (kFailedPrecondition).
Result<LaunchPlan> plan_launch(const abi::CompiledKernel& kernel, const LaunchInputs& inputs,
                               const LaunchLimits& limits, const TierChooser& choose_tier);
// The same plan written into `*plan`, reusing its storage (a launch plans without allocating
// when the kernel has no adstacks). On an error `*plan` holds a partial plan: not to be used.
Status plan_launch(const abi::CompiledKernel& kernel, const LaunchInputs& inputs,
                   const LaunchLimits& limits, const TierChooser& choose_tier, LaunchPlan* plan);

// The tier rule (AdstackTier in runtime.h), as a function of the policy's numbers:
// `declares_private`: the module has the private-tier constant; `policy_private` / `policy_heap`:
// the forced tiers; otherwise automatic within `budget_bytes`. Past `hard_limit_bytes` a forced
// private tier falls back to the heaps (kFallback).
TierChoice choose_tier(bool declares_private, bool policy_heap, bool policy_private,
                       uint64_t budget_bytes, uint64_t hard_limit_bytes, uint32_t min_length,
                       const adstack::RowLayout& row, PrivateLengths* len);

}  // namespace vkad::runtime
