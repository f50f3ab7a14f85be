// The handles and launch arguments of the runtime's surface: plain values, no Vulkan, so the
// front door (api/session.h) and the C ABI can use them without the runtime's internals.
#pragma once

#include <cstdint>
#include <string>

#include "abi/kernel_abi.h"

namespace vkad::runtime {

// Handles name their owner: the high 32 bits are the id of the Runtime that issued them (a
// process-wide counter, never reused), the low 32 bits the object's serial within that runtime
// (never reused either). A handle of another runtime, a freed one or a made-up one is therefore
// an error naming the handle, never another object. 0 is never a valid handle.
struct KernelHandle {
  uint64_t id = 0;
};
struct NdArrayHandle {
  uint64_t id = 0;
};
// A captured launch sequence (Runtime::Graphs::begin_capture / end_capture / replay).
struct GraphHandle {
  uint64_t id = 0;
};
// "runtime:serial", as error messages print a handle.
std::string handle_string(uint64_t id);

// A launch argument: a scalar of a dtype, or an ndarray.
struct Arg {
  ParamKind kind = ParamKind::kScalar;
  DType dtype = DType::kF32;
  double f = 0;
  int64_t i = 0;
  NdArrayHandle array;
  static Arg f32(float v) { return {ParamKind::kScalar, DType::kF32, v, 0, {}}; }
  static Arg f64(double v) { return {ParamKind::kScalar, DType::kF64, v, 0, {}}; }
  static Arg i32(int32_t v) { return {ParamKind::kScalar, DType::kI32, 0, v, {}}; }
  static Arg u32(uint32_t v) { return {ParamKind::kScalar, DType::kU32, 0, v, {}}; }
  static Arg i64(int64_t v) { return {ParamKind::kScalar, DType::kI64, 0, v, {}}; }
  static Arg boolean(bool v) { return {ParamKind::kScalar, DType::kBool, 0, v ? 1 : 0, {}}; }
  static Arg ndarray(NdArrayHandle h) { return {ParamKind::kNdArray, DType::kF32, 0, 0, h}; }
};

// A scalar argument of a captured launch replaced at a replay (Runtime::Graphs::replay): launch
// index in capture order, parameter index, new value.
struct GraphUpdate {
  uint32_t launch = 0;
  uint32_t param = 0;
  Arg value;
};

// The sequence number of a recorded launch: 1 for a runtime's first, then +1 per launch that
// launch() recorded (a refused launch gets none). 0 is never a launch.
struct LaunchId {
  uint64_t value = 0;
  bool operator==(const LaunchId&) const = default;
  auto operator<=>(const LaunchId&) const = default;
};

}  // namespace vkad::runtime
