#include "runtime/counted_launch.h"

#include <algorithm>
#include <vector>

namespace vkad::runtime {

Status launch_counted(Runtime& rt, KernelHandle counter, KernelHandle adjoint, uint32_t counted,
                      size_t forward_params, std::span<const Arg> args, LaunchId* id) {
  if (counted == 0) return rt.launch(adjoint, args, id);
  if (forward_params > args.size()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "launch_counted: " + std::to_string(args.size()) + " arguments, fewer than the forward's " +
                          std::to_string(forward_params) + " parameters");
  }
  // The adjoint takes one trips_ scalar per counted loop, and no kernel has more than
  // kMaxKernelParams parameters: a larger count is a caller's error, refused before
  // counted * kTripSlots (which wraps in 32 bits past 2^26) sizes anything.
  if (counted > kMaxKernelParams || args.size() + counted > kMaxKernelParams) {
    return make_error(ErrorCode::kInvalidArgument,
                      "launch_counted: " + std::to_string(counted) + " counted loops with " +
                          std::to_string(args.size()) + " arguments; an adjoint takes at most " +
                          std::to_string(kMaxKernelParams) + " parameters");
  }
  const uint32_t words = counted * kTripSlots;
  VKAD_ASSIGN_OR_RETURN(NdArrayHandle trips, rt.create_ndarray(DType::kI32, {words}, "trips"));
  std::vector<int32_t> host(words, 0);
  const uint64_t bytes = 4ull * words;
  Status st = rt.upload(trips, host.data(), bytes);
  if (st.ok()) {
    std::vector<Arg> cargs(args.begin(), args.begin() + static_cast<std::ptrdiff_t>(forward_params));
    cargs.push_back(Arg::ndarray(trips));
    st = rt.launch(counter, cargs);
  }
  if (st.ok()) st = rt.download(trips, host.data(), bytes);  // the blocking point
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

}  // namespace vkad::runtime
