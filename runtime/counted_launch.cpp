#include "runtime/counted_launch.h"

#include <algorithm>
#include <vector>

namespace vkad::runtime {

namespace {

// The adjoint takes one trips_ scalar per counted loop after its other arguments (at least the
// forward's `args`), and no kernel has more than kMaxKernelParams parameters: a larger count is
// a caller's error, refused before counted * kTripSlots (which wraps in 32 bits past 2^26)
// sizes anything.
Status check_count(const char* where, uint32_t counted, size_t args) {
  if (counted <= kMaxKernelParams && args + counted <= kMaxKernelParams) return {};
  return make_error(ErrorCode::kInvalidArgument,
                    std::string(where) + ": " + std::to_string(counted) + " counted loops with " +
                        std::to_string(args) + " arguments; an adjoint takes at most " +
                        std::to_string(kMaxKernelParams) + " parameters");
}

// A trips array for `counted` loops, zeroed by an upload ordered before the launches that
// follow: staged in the upload ring (no Vulkan object per call), and -- unlike a fill --
// refused while a graph capture is open, so that a call during a capture records nothing (a
// captured launch would keep this per-call array, which the call frees). Nothing is left
// behind on error.
Result<NdArrayHandle> zeroed_trips(Runtime& rt, uint32_t counted) {
  VKAD_ASSIGN_OR_RETURN(NdArrayHandle trips,
                        rt.create_ndarray(DType::kI32, {counted * kTripSlots}, "trips"));
  const std::vector<int32_t> zero(static_cast<size_t>(counted) * kTripSlots, 0);
  Status st = rt.upload(trips, zero.data(), 4ull * zero.size());
  if (!st.ok()) {
    (void)rt.free_ndarray(trips);
    return st;
  }
  return trips;
}

// Reads the maxima out of `trips` (the blocking point), frees it whatever happens, and launches
// `adjoint` with `args` and one trips_ scalar per counted loop.
Status launch_from_trips(Runtime& rt, KernelHandle adjoint, uint32_t counted, NdArrayHandle trips,
                         std::span<const Arg> args, LaunchId* id) {
  const uint32_t words = counted * kTripSlots;
  std::vector<int32_t> host(words, 0);
  Status st = rt.download(trips, host.data(), 4ull * words);
  Status freed = rt.free_ndarray(trips);
  VKAD_TRY(st);
  VKAD_TRY(freed);
  std::vector<Arg> aargs(args.begin(), args.end());
  for (uint32_t j = 0; j < counted; ++j) {
    int32_t t = 0;
    for (uint32_t s = 0; s < kTripSlots; ++s) t = std::max(t, host[j * kTripSlots + s]);
    aargs.push_back(Arg::i32(t));
  }
  return rt.launch(adjoint, aargs, id);
}

std::string loops(uint32_t n) {
  return std::to_string(n) + (n == 1 ? " counted loop" : " counted loops");
}

// Whether `trips` is a trips array for `counted` loops: a dead or foreign handle is the
// runtime's error; another array says what it is (and for how many loops, if a trips array).
Status check_trips(const Runtime& rt, uint32_t counted, NdArrayHandle trips) {
  const std::string where = "launch_counted_adjoint: trips: ";
  Result<DType> dtype = rt.dtype(trips);
  if (!dtype.ok()) {
    // dead_handle's message ("dtype: ndarray handle 1:5 was freed or never existed", or whose
    // runtime it is), named after this call rather than the query it made.
    std::string m = dtype.status().message();
    if (m.rfind("dtype: ", 0) == 0) m.erase(0, 7);
    return make_error(dtype.status().code(), where + m);
  }
  VKAD_ASSIGN_OR_RETURN(std::vector<uint32_t> shape, rt.shape(trips));
  const uint32_t words = counted * kTripSlots;
  if (counted > 0 && *dtype == DType::kI32 && shape.size() == 1 && shape[0] == words) return {};
  std::string what = std::string(dtype_name(*dtype)) + " array of shape (";
  for (size_t d = 0; d < shape.size(); ++d) what += (d ? ", " : "") + std::to_string(shape[d]);
  what += ")";
  if (*dtype == DType::kI32 && shape.size() == 1 && shape[0] % kTripSlots == 0) {
    what += ", a trips array for " + loops(shape[0] / kTripSlots);
  }
  const std::string want = counted == 0
                               ? "0 counted loops take the null handle {}"
                               : loops(counted) + (counted == 1 ? " needs" : " need") +
                                     " an i32 array of " + std::to_string(words) + " elements";
  return make_error(ErrorCode::kInvalidArgument,
                    where + (*dtype == DType::kU32 || *dtype == DType::kBool ? "a " : "an ") +
                        what + "; " + want + " (what launch_forward_counted gives for that count)");
}

}  // namespace

Status launch_counted(Runtime& rt, KernelHandle counter, KernelHandle adjoint, uint32_t counted,
                      size_t forward_params, std::span<const Arg> args, LaunchId* id) {
  if (counted == 0) return rt.launch(adjoint, args, id);
  if (forward_params > args.size()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "launch_counted: " + std::to_string(args.size()) +
                          " arguments, fewer than the forward's " + std::to_string(forward_params) +
                          " parameters");
  }
  VKAD_TRY(check_count("launch_counted", counted, args.size()));
  VKAD_ASSIGN_OR_RETURN(NdArrayHandle trips, zeroed_trips(rt, counted));
  std::vector<Arg> cargs(args.begin(), args.begin() + static_cast<std::ptrdiff_t>(forward_params));
  cargs.push_back(Arg::ndarray(trips));
  Status st = rt.launch(counter, cargs);
  if (!st.ok()) {
    (void)rt.free_ndarray(trips);
    return st;
  }
  return launch_from_trips(rt, adjoint, counted, trips, args, id);
}

Status launch_forward_counted(Runtime& rt, KernelHandle counting_forward, uint32_t counted,
                              std::span<const Arg> forward_args, NdArrayHandle* trips,
                              LaunchId* id) {
  if (trips == nullptr) {
    return make_error(ErrorCode::kInvalidArgument,
                      "launch_forward_counted: `trips` is null (it receives the trips array)");
  }
  if (counted == 0) {
    VKAD_TRY(rt.launch(counting_forward, forward_args, id));
    *trips = {};
    return {};
  }
  VKAD_TRY(check_count("launch_forward_counted", counted, forward_args.size()));
  VKAD_ASSIGN_OR_RETURN(NdArrayHandle made, zeroed_trips(rt, counted));
  std::vector<Arg> fargs(forward_args.begin(), forward_args.end());
  fargs.push_back(Arg::ndarray(made));
  Status st = rt.launch(counting_forward, fargs, id);
  if (!st.ok()) {
    (void)rt.free_ndarray(made);
    return st;
  }
  *trips = made;
  return {};
}

Status launch_counted_adjoint(Runtime& rt, KernelHandle adjoint, uint32_t counted,
                              NdArrayHandle trips, std::span<const Arg> args, LaunchId* id) {
  if (counted == 0 && trips.id == 0) return rt.launch(adjoint, args, id);
  Status st = check_count("launch_counted_adjoint", counted, args.size());
  if (st.ok()) st = check_trips(rt, counted, trips);
  if (!st.ok()) {
    (void)rt.free_ndarray(trips);  // an error of its own where `trips` is not rt's array
    return st;
  }
  return launch_from_trips(rt, adjoint, counted, trips, args, id);
}

}  // namespace vkad::runtime
