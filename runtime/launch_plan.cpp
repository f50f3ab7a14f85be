#include "runtime/launch_plan.h"

#include <algorithm>

namespace vkad::runtime {

using abi::CompiledKernel;
using abi::CompiledTask;
using abi::RangeBound;

adstack::SizeInputs LaunchInputs::size_inputs() const {
  return {[this](uint32_t p) { return ints[p]; },
          [this](uint32_t p, uint32_t dim) { return static_cast<int64_t>((*shapes[p])[dim]); }};
}

namespace {

std::string where(const CompiledKernel& d, const CompiledTask& task) {
  return "launch of '" + d.name + "' task '" + task.name + "'";
}

Result<int64_t> nd_range_count(const CompiledKernel& d, const CompiledTask& task,
                               const adstack::SizeInputs& inputs) {
  int64_t count = 1;
  for (size_t dim = 0; dim < task.dim_begin.size(); ++dim) {
    Result<int64_t> b = adstack::evaluate(task.dim_begin[dim], inputs);
    Result<int64_t> e = adstack::evaluate(task.dim_end[dim], inputs);
    // The module computes the bounds in i32 and the indices are i32.
    if (!b.ok() || !e.ok() || *b < 0 || *e > INT32_MAX) {
      std::string got = b.ok() && e.ok()
                            ? "[" + std::to_string(*b) + ", " + std::to_string(*e) + ")"
                            : (b.ok() ? e : b).status().message();
      return make_error(ErrorCode::kInvalidArgument,
                        where(d, task) + ": dimension " + std::to_string(dim) + "'s range " + got +
                            " is out of bounds (begin >= 0, end <= 2^31 - 1)");
    }
    count *= std::max<int64_t>(*e - *b, 0);  // < 2^31 per factor, at most 3 factors
    if (count > UINT32_MAX) {
      return make_error(ErrorCode::kInvalidArgument,
                        where(d, task) + ": the N-d range has more than 2^32 - 1 iterations");
    }
  }
  return count;
}

// The heap tier's rows: may lower *groups so each heap fits one binding; raises *heap_need.
Status plan_heap_rows(const CompiledKernel& d, const CompiledTask& task,
                      const adstack::RowLayout& row, const LaunchLimits& limits, uint64_t* groups,
                      std::array<uint64_t, adstack::kHeapCount>* heap_need) {
  for (uint32_t h = 0; h < adstack::kHeapCount; ++h) {
    auto heap = static_cast<adstack::Heap>(h);
    uint64_t row_bytes = uint64_t{row.row_elems[h]} * adstack::heap_elem_bytes(heap);
    if (!row_bytes) continue;
    uint64_t max_threads = limits.max_storage_buffer_range / row_bytes;
    if (max_threads < task.local_size) {
      return make_error(ErrorCode::kOutOfDeviceMemory,
                        where(d, task) + ": one thread's adstack row needs " +
                            std::to_string(row_bytes) + " bytes of the " +
                            adstack::heap_name(heap) +
                            " heap, more than the device allows in one binding (" +
                            std::to_string(limits.max_storage_buffer_range / task.local_size) +
                            " per thread); lower the loop trip counts");
    }
    *groups = std::min<uint64_t>(*groups, max_threads / task.local_size);
  }
  for (uint32_t h = 0; h < adstack::kHeapCount; ++h) {
    (*heap_need)[h] = std::max(
        (*heap_need)[h],
        adstack::heap_bytes(row, static_cast<adstack::Heap>(h), *groups * task.local_size));
  }
  return {};
}

Status check_loop_passes(const CompiledKernel& d, const CompiledTask& task,
                         const adstack::SizeInputs& inputs, const LaunchLimits& limits, uint64_t n,
                         uint64_t groups) {
  const uint64_t limit = limits.max_loop_passes;
  if (limit == 0 || !limits.enforce_loop_limit) return {};
  Result<int64_t> body = adstack::evaluate(task.loop_passes, inputs);
  // The grid-stride loop: its iterations per invocation, each ending with one pass, then the
  // pass that ends it (ir/loop_passes.h has the model).
  uint64_t threads = task.serial ? 1 : groups * task.local_size;
  uint64_t strides = (n + threads - 1) / threads;
  uint64_t total = 0;
  bool over = !body.ok() ||
              __builtin_mul_overflow(strides, static_cast<uint64_t>(*body) + 1, &total) ||
              __builtin_add_overflow(total, 1 + task.loop_passes_idle, &total) || total > limit;
  if (!over) return {};
  // Only the error path builds strings (this runs on every launch on lavapipe).
  std::string count = body.ok() ? std::to_string(total) : "more than 2^64";
  std::string advice =
      task.serial ? "shorten the serial task's range or its loops"
                  : "lower the per-thread trip counts (the range's iterations per thread are " +
                        std::to_string(strides) +
                        (groups < limits.max_workgroup_count_x && strides > 1
                             ? "; more workgroups (RuntimeOptions::max_groups) would lower them"
                             : "") +
                        ")";
  return make_error(
      ErrorCode::kFailedPrecondition,
      where(d, task) + ": up to " + count + " loop passes per shader invocation (" +
          std::to_string(strides) + " grid-stride iteration(s) of a body with up to " +
          (body.ok() ? std::to_string(*body) : std::string("?")) + " loop passes), more than the " +
          std::to_string(limit) + " that device '" + limits.device_name +
          "' runs: lavapipe silently leaves loops past this limit, so the results would be "
          "wrong. Run it on a GPU, or " +
          advice + " (docs/reference.md, \"Loop limit on lavapipe\")");
}

}  // namespace

Result<LaunchPlan> plan_launch(const CompiledKernel& d, const LaunchInputs& inputs,
                               const LaunchLimits& limits, const TierChooser& choose) {
  LaunchPlan plan;
  VKAD_TRY(plan_launch(d, inputs, limits, choose, &plan));
  return plan;
}

Status plan_launch(const CompiledKernel& d, const LaunchInputs& inputs, const LaunchLimits& limits,
                   const TierChooser& choose, LaunchPlan* out) {
  const adstack::SizeInputs size_inputs = inputs.size_inputs();
  auto eval = [&](const RangeBound& b) {
    return abi::evaluate(
               b, [&](uint32_t p) -> std::optional<int64_t> { return inputs.ints[p]; },
               [&](uint32_t p, uint32_t d) -> std::optional<int64_t> {
                 return (*inputs.shapes[p])[d];
               })
        .value_or(0);
  };
  LaunchPlan& plan = *out;
  plan.tasks.resize(d.tasks.size());
  plan.heap_need = {};
  plan.any_heap_task = false;
  plan.tier_counts = {};
  for (size_t t = 0; t < d.tasks.size(); ++t) {
    const CompiledTask& task = d.tasks[t];
    int64_t b = 0, e = 0;
    if (task.dim_begin.empty()) {
      b = eval(task.begin), e = eval(task.end);
    } else {
      VKAD_ASSIGN_OR_RETURN(e, nd_range_count(d, task, size_inputs));
    }
    if (b < 0 || e > UINT32_MAX) {
      return make_error(ErrorCode::kInvalidArgument, where(d, task) + ": range [" +
                                                         std::to_string(b) + ", " +
                                                         std::to_string(e) + ") is out of bounds");
    }
    TaskPlan& tp = plan.tasks[t];
    tp.tier = TierChoice::kHeap;
    tp.private_len = {};
    tp.row.row_elems = {};
    tp.row.offset.clear();
    tp.row.capacity.clear();
    tp.begin = static_cast<uint32_t>(b);
    tp.end = static_cast<uint32_t>(std::max(b, e));
    const uint64_t n = tp.end - tp.begin;
    uint64_t g = task.serial ? 1 : (n + task.local_size - 1) / task.local_size;
    g = std::min<uint64_t>(std::max<uint64_t>(g, 1), limits.max_groups);
    if (!task.adstacks.empty()) {
      Result<adstack::RowLayout> row = adstack::plan_row(task.adstacks, size_inputs);
      if (!row.ok()) {
        return make_error(row.status().code(), where(d, task) + ": " + row.status().message());
      }
      tp.row = std::move(row).value();
      tp.tier = choose(static_cast<uint32_t>(t), tp.row, &tp.private_len);
      if (!tp.private_tier()) {
        VKAD_TRY(plan_heap_rows(d, task, tp.row, limits, &g, &plan.heap_need));
        plan.any_heap_task = true;
      }
      ++plan.tier_counts[static_cast<size_t>(tp.tier)];
    }
    tp.groups = static_cast<uint32_t>(g);
    VKAD_TRY(check_loop_passes(d, task, size_inputs, limits, n, g));
  }
  return {};
}

TierChoice choose_tier(bool declares_private, bool policy_heap, bool policy_private,
                       uint64_t budget_bytes, uint64_t hard_limit_bytes, uint32_t min_length,
                       const adstack::RowLayout& row, PrivateLengths* len) {
  if (policy_heap || !declares_private) return TierChoice::kHeap;
  const uint64_t bytes = adstack::private_bytes(row, min_length);
  if (policy_private && bytes > hard_limit_bytes) return TierChoice::kFallback;
  if (!policy_private && bytes > std::min(budget_bytes, hard_limit_bytes)) return TierChoice::kHeap;
  *len = adstack::private_lengths(row, min_length);
  return TierChoice::kPrivate;
}

}  // namespace vkad::runtime
