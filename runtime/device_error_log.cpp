#include "runtime/device_error_log.h"

#include <cstring>
#include <utility>

#include "abi/print_records.h"

namespace vkad::runtime {

using abi::CompiledKernel;
using abi::kErrorAdstackOverflow;
using abi::kErrorOutOfBounds;

// What a task's error word means (codes in abi/kernel_abi.h). `args` is the launch's args
// buffer, which still holds the launch's adstack capacities.
std::string describe_device_error(const CompiledKernel& d, uint32_t task, uint32_t flag,
                                  const std::byte* args) {
  const abi::ErrorWord e = abi::decode_error_word(flag);
  if (e.code == kErrorOutOfBounds) {
    const auto& sites = d.tasks[task].access_sites;
    const std::string by = e.site >= 0 && static_cast<size_t>(e.site) < sites.size()
                               ? " by `" + sites[static_cast<size_t>(e.site)] + "`"
                               : "";
    return "out-of-bounds ndarray access" + by + " (the access was skipped; loads read 0)";
  }
  if (e.code == abi::kErrorNonFinite) {
    const auto& sites = d.tasks[task].finite_sites;
    const std::string where = e.site >= 0 && static_cast<size_t>(e.site) < sites.size()
                                  ? "`" + sites[static_cast<size_t>(e.site)] + "`"
                                  : "check " + std::to_string(e.site);
    return "a NaN or an infinity was stored by " + where +
           " (the finite checks, check_finite; the value was stored, and later launches went "
           "on: the first one of this launch is named)";
  }
  if (e.code == abi::kErrorAssert && e.site >= 0 &&
      static_cast<size_t>(e.site) < d.tasks[task].print_sites.size()) {
    const auto site = static_cast<uint32_t>(e.site);
    const abi::PrintSite& p = d.tasks[task].print_sites[site];
    const std::string detail = abi::assert_detail(d, args, task, site);
    return "assertion failed: " + p.format + " (`" + p.stmt + "`" +
           (detail.empty() ? "" : ", " + detail) +
           "; the launch ran to its end, and later launches went on)";
  }
  const auto& stacks = d.tasks[task].adstacks;
  if (e.code == kErrorAdstackOverflow && e.stack >= 0 &&
      static_cast<size_t>(e.stack) < stacks.size()) {
    uint32_t cap = 0;
    const uint32_t st = static_cast<uint32_t>(e.stack);
    std::memcpy(&cap, args + d.adstack_args_offset(task) + 4 * size_t{adstack::capacity_word(st)},
                4);
    return "adstack " + stacks[st].name + " overflowed its capacity of " + std::to_string(cap) +
           " entries per thread (pushes past it were dropped, so that launch's gradients are "
           "wrong): a loop ran more iterations than its trip bound; raise the loop's max_trip "
           "(KernelBuilder::for_range(begin, end, max_trip, body))";
  }
  return "device reported error code " + std::to_string(flag);
}

void DeviceErrorLog::record(const CompiledKernel& d, const std::byte* base, LaunchId launch,
                            const std::function<std::string()>& where) {
  // Entries retire in submission order and a list's launches in launch order, so `launches`
  // stays ascending.
  for (uint32_t t = 0; t < d.tasks.size(); ++t) {
    uint32_t flag;
    std::memcpy(&flag, base + d.error_flag_offset(t), 4);
    if (flag == 0) continue;
    std::string what = "kernel '" + d.name + "', task '" + d.tasks[t].name +
                       "': " + describe_device_error(d, t, flag, base);
    DeviceError* e = nullptr;
    for (DeviceError& known : pending_) {
      if (known.message == what) e = &known;
    }
    if (!e) {
      if (pending_.size() >= kMaxErrors) continue;
      e = &pending_.emplace_back();
      e->kernel = d.name;
      e->task = d.tasks[t].name;
      e->code = abi::decode_error_word(flag).code;
      e->message = std::move(what);
    }
    ++e->count;
    if (e->launches.size() < DeviceError::kMaxListedLaunches) {
      e->launches.push_back(launch);
      e->wheres.push_back(where ? where() : std::string());
    }
  }
}

Status DeviceErrorLog::take() {
  if (pending_.empty()) return {};
  std::string msg;
  for (const DeviceError& e : pending_) {
    std::string ids;
    for (size_t i = 0; i < e.launches.size(); ++i) {
      ids += (i ? ", #" : "#") + std::to_string(e.launches[i].value);
      if (i < e.wheres.size() && !e.wheres[i].empty()) ids += " (" + e.wheres[i] + ")";
    }
    if (e.count > e.launches.size()) ids += ", ...";
    msg += (msg.empty() ? "" : "; ") + e.message +
           (e.count == 1 ? " (in launch " + ids + ")"
                         : " (in launches " + ids + "; " + std::to_string(e.count) + " launches)");
  }
  // Reported once; the runtime stays usable.
  reported_ = std::exchange(pending_, {});
  return make_error(ErrorCode::kDeviceError, msg);
}

}  // namespace vkad::runtime
