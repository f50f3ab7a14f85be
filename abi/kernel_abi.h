// The kernel ABI, written down once: what spirv/ emits and runtime/ launches (a kernel compiled
// to one SPIR-V compute module per task, plus the description of its parameters and launch
// ranges), the args-buffer layout both sides compute from it, its encoder (encode_args) and the
// error words' encoding and decoding. The compiler (ir/, autodiff/, spirv/, reference/) and
// runtime/ are siblings above this floor; the CPU evaluator (reference/cpu_eval.h) reports
// errors in the same words. Hand-written SPIR-V can be registered too, by following the ABI
// below.
//
// Kernel ABI (every task module of a kernel):
//   set 0, binding 0   the args buffer, a std430 block written by the host per launch:
//                        for each scalar parameter in order: its value (4 bytes; f64/i64 take
//                        8 bytes, 8-aligned), then for each ndarray parameter its shape
//                        (rank u32 words each), then one u32 error-flag word per task
//                        (`error_flag_offset()`), which the device sets non-zero to report an
//                        error (adstack overflow, out-of-bounds) for the host to surface.
//                      Then, for each task with adstacks, its row lengths, its dispatched
//                      thread count and per-stack (offset, capacity) words
//                      (`adstack_args_offset()`, adstack/adstack_layout.h).
//                      Then, 16-aligned, the print area of a kernel that prints or asserts
//                      (`print_offset()`, `print_bytes`; abi/print_records.h).
//   set 0, binding 1+k the k-th ndarray parameter, a runtime array of its element type.
//   set 0, after them  the adstack heaps (f32, f64, int) if any task has adstacks.
//   push constants     {u32 begin, u32 end}: the task's iteration range [begin, end).
//   The dispatch covers min(ceil((end-begin)/local_size), max_groups) workgroups; a task
//   grid-strides over its range, so it must not assume one invocation per iteration.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "adstack/adstack_layout.h"

namespace vkad::abi {

// Error codes the device writes into a task's error word (low 8 bits; the rest is detail,
// e.g. which adstack overflowed, plus one). The first error of a launch wins.
inline constexpr uint32_t kErrorOutOfBounds = 1;
// An out-of-bounds access's word with the access named: its site (CompiledTask::access_sites)
// plus one above the code (the last out-of-bounds access of the invocation that raised it).
constexpr uint32_t out_of_bounds_word(uint32_t site) { return kErrorOutOfBounds | (site + 1) << 8; }
inline constexpr uint32_t kErrorAdstackOverflow = 2;
// A NaN or an infinity stored into an ndarray with the finite checks on (CompileOptions::
// check_finite); the detail is the site (CompiledTask::finite_sites) plus one.
inline constexpr uint32_t kErrorNonFinite = 3;
constexpr uint32_t non_finite_word(uint32_t site) { return kErrorNonFinite | (site + 1) << 8; }
// The word an overflow of the task's adstack number `stack` (0-based) writes.
// An `assert` whose condition was false (CompiledTask::print_sites: the site plus one).
inline constexpr uint32_t kErrorAssert = 4;
constexpr uint32_t assert_word(uint32_t site) { return kErrorAssert | (site + 1) << 8; }
constexpr uint32_t adstack_overflow_word(uint32_t stack) {
  return kErrorAdstackOverflow | (stack + 1) << 8;
}
struct ErrorWord {
  uint32_t code = 0;   // kErrorOutOfBounds, kErrorAdstackOverflow, kErrorNonFinite, or unknown
  int64_t stack = -1;  // the overflowed adstack (kErrorAdstackOverflow), else -1
  int64_t site = -1;   // the access / finite check / assert named (their codes)
};
constexpr ErrorWord decode_error_word(uint32_t word) {
  ErrorWord e{word & 0xff, -1, -1};
  if (e.code == kErrorAdstackOverflow && (word >> 8) >= 1) e.stack = (word >> 8) - 1;
  if ((e.code == kErrorNonFinite || e.code == kErrorOutOfBounds || e.code == kErrorAssert) &&
      (word >> 8) >= 1) {
    e.site = (word >> 8) - 1;
  }
  return e;
}

enum class DType : uint8_t { kF32, kF64, kI32, kU32, kI64, kBool };
const char* dtype_name(DType t);
uint32_t dtype_bytes(DType t);  // element size in ndarrays (bool: 4) and in the args buffer

enum class ParamKind : uint8_t { kScalar, kNdArray };

// Words of a trip-counting kernel's `trips` array per counted loop (autodiff/trip_counter.h): its
// threads atomic_max into one of them by index; runtime::launch_counted takes the max over them.
inline constexpr uint32_t kTripSlots = 64;

// The rank limit of ndarrays (create_ndarray, kernel parameters, the verifier).
inline constexpr uint32_t kMaxNdArrayRank = 8;
// Bounds on a kernel's declared layout, so every args-buffer offset fits 32 bits with room.
inline constexpr uint32_t kMaxKernelParams = 4096;
inline constexpr uint32_t kMaxKernelTasks = 4096;
inline constexpr uint32_t kMaxTaskAdstacks = 4096;
bool valid_dtype(DType t);  // one of the enumerators (a cast integer may be anything)

struct KernelParam {
  std::string name;
  ParamKind kind = ParamKind::kScalar;
  DType dtype = DType::kF32;
  uint32_t rank = 0;     // ndarrays only
  bool written = false;  // ndarrays only: the kernel stores or atomically adds into it
};

// One end of a task's iteration range, evaluated per launch.
struct RangeBound {
  enum class Kind : uint8_t { kConstant, kScalarParam, kArrayDim };
  Kind kind = Kind::kConstant;
  int64_t value = 0;   // kConstant
  uint32_t param = 0;  // kScalarParam / kArrayDim: parameter index
  uint32_t dim = 0;    // kArrayDim
  static RangeBound constant(int64_t v) { return {Kind::kConstant, v, 0, 0}; }
  static RangeBound scalar(uint32_t p) { return {Kind::kScalarParam, 0, p, 0}; }
  static RangeBound array_dim(uint32_t p, uint32_t d) { return {Kind::kArrayDim, 0, p, d}; }
};

// The value of `b` for one launch: `scalar(p)` gives integer scalar parameter p and
// `extent(p, d)` dimension d of array parameter p, each an optional<int64_t> (nullopt: the
// launch does not say, and neither does the bound). The one evaluation of a bound: the
// runtime's launch plan and the session's graph rework use it.
template <typename Scalar, typename Extent>
std::optional<int64_t> evaluate(const RangeBound& b, Scalar&& scalar, Extent&& extent) {
  switch (b.kind) {
    case RangeBound::Kind::kConstant: return b.value;
    case RangeBound::Kind::kScalarParam: return scalar(b.param);
    case RangeBound::Kind::kArrayDim: return extent(b.param, b.dim);
  }
  return std::nullopt;
}

// A `print` or `assert` statement of a task (CompiledTask::print_sites): what its records in
// the launch's print area hold (abi/print_records.h).
struct PrintSite {
  std::string format;         // print: the format ("x = {}"); assert: its message
  std::vector<DType> values;  // each recorded value's dtype
  std::string stmt;           // the statement as the IR text prints it (what errors quote)
  uint32_t dims = 1;          // index words per record: the task's dimensions
  bool is_assert = false;
};

struct CompiledTask {
  std::string name;
  std::vector<uint32_t> spirv;
  uint32_t local_size = 64;
  RangeBound begin = RangeBound::constant(0);
  RangeBound end = RangeBound::constant(1);
  // A serial task runs its whole range in one invocation (one workgroup of one thread).
  bool serial = false;
  // An N-d task (up to 3 dimensions): per dimension, [begin, end) as size expressions of
  // constants, integer scalars and extents. The launch range is then [0, product of
  // max(end - begin, 0)) (begin / end above are unused) and the module computes each
  // iteration's indices from it; a launch refuses a negative begin or an end past 2^31 - 1.
  // Empty for a 1-d task.
  std::vector<adstack::SizeExpr> dim_begin, dim_end;
  // Adstacks in the order the module numbers them (adstack/adstack_layout.h has the storage
  // contract). Empty for kernels without reverse-mode stacks.
  std::vector<adstack::StackDesc> adstacks;
  // Upper bound of the loop passes one iteration of the range makes in the task's body (serial
  // loops, compare-and-swap loops; ir/loop_passes.h has the model), evaluated per launch
  // on devices that cap loop passes per invocation (lavapipe: runtime.h, launch). Loops whose
  // bounds depend on data count once. 0 for a hand-written module that states nothing.
  adstack::SizeExpr loop_passes = adstack::SizeExpr::constant(0);
  // The passes the body makes in the grid-stride loop's final pass, with no lane active.
  uint64_t loop_passes_idle = 0;
  // Launch specialization ("Launch specialization" below): byte offsets into the args buffer
  // of the 32-bit words this module can take as specialization constants instead of loading
  // them. Word i has a bool spec constant launch_spec_flag_id(i) (default false: load the
  // word) and a u32 launch_spec_value_id(i) (the value when the flag is true). Empty for a
  // module that declares none (hand-written ones, tasks without adstacks).
  std::vector<uint32_t> spec_words;
  // With the finite checks on (CompileOptions::check_finite): the IR text of each checked
  // statement (a float store or atomic add into an ndarray), by site number (kErrorNonFinite's
  // detail). Empty otherwise.
  std::vector<std::string> finite_sites;
  // With the bounds checks on (the default): the IR text of each ndarray access (load, store,
  // atomic), by site number (kErrorOutOfBounds's detail).
  std::vector<std::string> access_sites;
  // The task's print and assert statements, by site number (their records' site word, an
  // assert's kErrorAssert detail). Empty for a task with neither.
  std::vector<PrintSite> print_sites;
};

// Launch specialization: the words codegen marks in a task with adstacks are the adstack
// offset and capacity words and the 32-bit integer scalars and extents its `for` loops'
// bounds are computed from. A pipeline created with them fixed lets the driver see constant
// trip counts and constant private-array indices (it unrolls, and indexes the private tier's
// arrays statically); the runtime makes such variants per distinct value set
// (runtime.h: RuntimeOptions::adstack_specialize), and a module run without them (every flag
// false) computes the same results from the loaded words. A kernel compiled with
// CompileOptions::specialize_shapes (the graph rework's) also marks the extents of every array
// a task accesses, adstacks or not (spirv/launch_spec.h).
inline constexpr uint32_t kLaunchSpecIdBase = 16;  // above the adstack tier's ids
inline constexpr uint32_t kMaxSpecWords = 64;
constexpr uint32_t launch_spec_flag_id(uint32_t i) { return kLaunchSpecIdBase + 2 * i; }
constexpr uint32_t launch_spec_value_id(uint32_t i) { return kLaunchSpecIdBase + 2 * i + 1; }

struct CompiledKernel {
  std::string name;
  std::vector<KernelParam> params;
  std::vector<CompiledTask> tasks;

  // Byte layout of the args buffer (see the ABI above).
  uint32_t scalar_offset(uint32_t param) const;
  uint32_t shape_offset(uint32_t param) const;  // first shape word of an ndarray param
  uint32_t error_flag_offset(uint32_t task) const;
  // First of the task's adstack words (adstack::args_words of them), after all error words.
  uint32_t adstack_args_offset(uint32_t task) const;
  bool has_adstacks() const;
  // The print area (abi/print_records.h), after every task's adstack words, 16-aligned:
  // print_bytes of it, 0 when no task prints or asserts (CompileOptions::print_buffer_bytes).
  uint32_t print_offset() const;
  uint32_t print_bytes = 0;
  // Storage-buffer bindings: args, ndarrays, and the three adstack heaps when any task has
  // stacks (f32 at 1 + array_count(), f64 next, integers last).
  uint32_t binding_count() const;
  uint32_t args_bytes() const;
  uint32_t array_count() const;
  // Content hash of everything that defines the pipelines (SPIR-V, local sizes, parameter
  // layout). Two kernels with one name but different content hash differently.
  uint64_t content_hash() const;
};

// True when `a` and `b` define the same pipelines: everything content_hash() covers, compared in
// full (a hash match alone is not proof; the runtime's pipeline cache checks this on a hit).
bool same_pipelines(const CompiledKernel& a, const CompiledKernel& b);

// One scalar argument's value, as the host holds it: `f` for f32/f64, `i` for the integers and
// bool (the runtime's Arg carries the same two fields).
struct ScalarValue {
  double f = 0;
  int64_t i = 0;
};

// Writes a launch's args buffer (`dst`, args_bytes() bytes, every byte of it; padding is zero):
// every scalar parameter's value converted to its dtype, every ndarray parameter's shape, zeroed
// error words, and for each task with adstacks its `adstack_words` (adstack::write_args; empty
// for tasks without stacks). `scalars` and `shapes` are indexed by parameter (the entry of the
// other kind is ignored). Preconditions (checked by the runtime before): sizes match the
// kernel's parameters and ranks.
void encode_args(const CompiledKernel& kernel, const std::vector<ScalarValue>& scalars,
                 const std::vector<const std::vector<uint32_t>*>& shapes,
                 const std::vector<std::vector<uint32_t>>& adstack_words, std::byte* dst);

}  // namespace vkad::abi

// The ABI's types were the runtime's before the abi/ floor existed; the runtime and its users
// still name them runtime::.
namespace vkad::runtime {
using abi::CompiledKernel;
using abi::CompiledTask;
using abi::DType;
using abi::dtype_bytes;
using abi::dtype_name;
using abi::KernelParam;
using abi::kErrorAdstackOverflow;
using abi::kErrorNonFinite;
using abi::kErrorOutOfBounds;
using abi::kMaxKernelParams;
using abi::kMaxKernelTasks;
using abi::kMaxNdArrayRank;
using abi::kMaxTaskAdstacks;
using abi::ParamKind;
using abi::RangeBound;
using abi::valid_dtype;
}  // namespace vkad::runtime
