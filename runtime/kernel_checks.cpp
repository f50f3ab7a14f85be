#include "runtime/kernel_checks.h"

#include <algorithm>
#include <set>

#include "runtime/spirv_interface.h"

namespace vkad::runtime {

namespace {

// Symbolic sizes of a registered kernel are evaluated at every launch with its arguments:
// their leaves must name integer scalars or existing ndarray dimensions. `depth` bounds the
// recursion over a foreign expression.
bool size_refs_ok(const adstack::SizeExpr& e, const std::vector<KernelParam>& params,
                  uint32_t depth = 0) {
  using K = adstack::SizeExpr::Kind;
  if (depth > 64) return false;
  switch (e.kind) {
    case K::kConst: return true;
    case K::kScalar:
    case K::kNegScalar:
      return e.param < params.size() && params[e.param].kind == ParamKind::kScalar &&
             (params[e.param].dtype == DType::kI32 || params[e.param].dtype == DType::kU32 ||
              params[e.param].dtype == DType::kI64);
    case K::kDim:
      return e.param < params.size() && params[e.param].kind == ParamKind::kNdArray &&
             e.dim < params[e.param].rank;
    case K::kDiv:
      return e.operands.size() == 1 && e.value >= 1 &&
             size_refs_ok(e.operands[0], params, depth + 1);
    case K::kAdd:
    case K::kMul:
    case K::kMax:
      if (e.operands.empty()) return false;
      for (const auto& o : e.operands) {
        if (!size_refs_ok(o, params, depth + 1)) return false;
      }
      return true;
  }
  return false;
}

Status invalid(const std::string& what) { return make_error(ErrorCode::kInvalidArgument, what); }

Status check_param(const CompiledKernel& kernel, size_t i, const KernelLimits& limits,
                   const std::string& kname) {
  const KernelParam& p = kernel.params[i];
  if (!valid_dtype(p.dtype) || (p.kind != ParamKind::kScalar && p.kind != ParamKind::kNdArray)) {
    return invalid(kname + " parameter " + std::to_string(i) + " ('" + p.name + "'): dtype " +
                   std::to_string(static_cast<int>(p.dtype)) + " or kind " +
                   std::to_string(static_cast<int>(p.kind)) + " is not one of the enumerators");
  }
  if (p.kind == ParamKind::kNdArray && (p.rank == 0 || p.rank > kMaxNdArrayRank)) {
    return invalid("kernel '" + kernel.name + "' parameter " + std::to_string(i) + " ('" + p.name +
                   "'): ndarray of rank " + std::to_string(p.rank) + " (1 to " +
                   std::to_string(kMaxNdArrayRank) + " supported)");
  }
  if ((p.dtype == DType::kF64 && !limits.float64) || (p.dtype == DType::kI64 && !limits.int64)) {
    return make_error(ErrorCode::kUnsupported, "kernel '" + kernel.name + "' parameter '" + p.name +
                                                   "' is " + dtype_name(p.dtype) +
                                                   ", which device '" + limits.device_name +
                                                   "' does not support");
  }
  return {};
}

// Launch specialization reads these words from the encoded args (runtime.h): each must be an
// aligned word inside the args buffer, and the module must declare its constants.
bool spec_words_ok(const CompiledKernel& kernel, const CompiledTask& task) {
  bool ok = task.spec_words.size() <= abi::kMaxSpecWords;
  for (uint32_t w : task.spec_words) ok = ok && w % 4 == 0 && w + 4 <= kernel.args_bytes();
  const std::set<uint32_t> ids =
      task.spec_words.empty() ? std::set<uint32_t>{} : declared_spec_ids(task.spirv);
  for (uint32_t i = 0; ok && i < task.spec_words.size(); ++i) {
    ok = ids.count(abi::launch_spec_flag_id(i)) && ids.count(abi::launch_spec_value_id(i));
  }
  return ok;
}

bool dims_ok(const CompiledKernel& kernel, const CompiledTask& task) {
  bool ok = task.dim_begin.size() == task.dim_end.size() && task.dim_begin.size() <= 3;
  for (size_t d = 0; ok && d < task.dim_begin.size(); ++d) {
    ok = size_refs_ok(task.dim_begin[d], kernel.params) &&
         size_refs_ok(task.dim_end[d], kernel.params);
  }
  return ok;
}

// Scalar range bounds are read as integers at launch, so they must be integer parameters.
bool range_bound_ok(const CompiledKernel& kernel, const RangeBound& b) {
  if (b.kind == RangeBound::Kind::kConstant) return true;
  if (b.param >= kernel.params.size()) return false;
  const KernelParam& p = kernel.params[b.param];
  if (b.kind == RangeBound::Kind::kScalarParam) {
    return p.kind == ParamKind::kScalar &&
           (p.dtype == DType::kI32 || p.dtype == DType::kU32 || p.dtype == DType::kI64);
  }
  return p.kind == ParamKind::kNdArray && b.dim < p.rank;
}

Status check_task(const CompiledKernel& kernel, const CompiledTask& task,
                  const KernelLimits& limits, const std::string& kname) {
  const std::string where = kname + " task '" + task.name + "'";
  const uint32_t max_local =
      std::min(limits.max_workgroup_size_x, limits.max_workgroup_invocations);
  if (task.local_size == 0 || task.local_size > max_local) {
    return invalid(where + ": local_size " + std::to_string(task.local_size) + " is outside 1.." +
                   std::to_string(max_local) + " (the device's limit)");
  }
  if (task.adstacks.size() > kMaxTaskAdstacks) {
    return invalid(where + ": " + std::to_string(task.adstacks.size()) + " adstacks; at most " +
                   std::to_string(kMaxTaskAdstacks) + " are supported");
  }
  for (const adstack::StackDesc& st : task.adstacks) {
    if (static_cast<uint32_t>(st.heap) >= adstack::kHeapCount ||
        !size_refs_ok(st.capacity, kernel.params)) {
      return invalid(where + ": adstack " + st.name +
                     " has an unknown heap or a capacity that refers to a missing or "
                     "non-integer parameter or dimension (or nests deeper than 64)");
    }
  }
  if (!spec_words_ok(kernel, task)) {
    return invalid(where + ": spec_words must be at most " + std::to_string(abi::kMaxSpecWords) +
                   " aligned offsets inside the args buffer, each with its two "
                   "specialization constants declared by the module");
  }
  if (!dims_ok(kernel, task)) {
    return invalid(where +
                   ": N-d range bounds are malformed (more than 3 dimensions, or a "
                   "missing or non-integer parameter or dimension)");
  }
  if (!size_refs_ok(task.loop_passes, kernel.params)) {
    return invalid(where +
                   ": loop_passes refers to a missing or non-integer parameter or "
                   "dimension (or nests deeper than 64)");
  }
  if (!range_bound_ok(kernel, task.begin) || !range_bound_ok(kernel, task.end)) {
    return invalid("kernel '" + kernel.name + "' task '" + task.name +
                   "': range bound refers to a missing parameter or dimension");
  }
  return {};
}

}  // namespace

Status check_kernel(const CompiledKernel& kernel, const KernelLimits& limits) {
  const std::string kname = "register_kernel: kernel '" + kernel.name + "'";
  if (kernel.tasks.empty()) return invalid("kernel '" + kernel.name + "' has no tasks");
  // Bounded so that every args-buffer offset (abi/kernel_abi.h) fits 32 bits.
  if (kernel.params.size() > kMaxKernelParams || kernel.tasks.size() > kMaxKernelTasks) {
    return invalid(kname + " has " + std::to_string(kernel.params.size()) + " parameters and " +
                   std::to_string(kernel.tasks.size()) + " tasks; at most " +
                   std::to_string(kMaxKernelParams) + " and " + std::to_string(kMaxKernelTasks) +
                   " are supported");
  }
  for (size_t i = 0; i < kernel.params.size(); ++i) {
    VKAD_TRY(check_param(kernel, i, limits, kname));
  }
  for (const CompiledTask& task : kernel.tasks) VKAD_TRY(check_task(kernel, task, limits, kname));
  return {};
}

}  // namespace vkad::runtime
