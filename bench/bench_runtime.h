// Timing helpers shared by the benchmarks that launch kernels.
#pragma once

#include <cstdio>
#include <vector>

#include "bench/bench_util.h"
#include "runtime/runtime.h"

namespace vkad::bench {

// Milliseconds per launch of `batch` launches recorded back to back and waited for once (the
// batch spreads the submit/wait round trip, tens of microseconds, over its launches). Errors
// are printed, not hidden.
inline double batch_ms(runtime::Runtime& rt, runtime::KernelHandle h,
                       const std::vector<runtime::Arg>& args, int batch) {
  (void)rt.synchronize();
  double t0 = now_us();
  for (int b = 0; b < batch; ++b) {
    Status s = rt.launch(h, args);
    if (!s.ok()) std::fprintf(stderr, "%s\n", s.to_string().c_str());
  }
  Status s = rt.synchronize();
  if (!s.ok()) std::fprintf(stderr, "%s\n", s.to_string().c_str());
  return (now_us() - t0) / 1000 / batch;
}

// A GPU raises its clocks only under sustained load (a cold H200 read a copy at half speed):
// runs `h` for about `ms` milliseconds before anything is timed. Returns the launches it made (a
// benchmark whose kernel accumulates into its output needs the count to check the result).
inline int warm_up(runtime::Runtime& rt, runtime::KernelHandle h,
                   const std::vector<runtime::Arg>& args, double ms) {
  int launches = 0;
  for (double t0 = now_us(); now_us() - t0 < ms * 1000; launches += 10) batch_ms(rt, h, args, 10);
  return launches;
}

// Reads `n` elements of `array` back; a failed download fails the benchmark loudly.
template <typename T>
std::vector<T> download_or_fail(runtime::Runtime& rt, runtime::NdArrayHandle array, size_t n,
                                const char* what) {
  std::vector<T> v(n);
  Status s = rt.download(array, v.data(), sizeof(T) * n);
  if (!s.ok()) check_failed(std::string(what) + ": " + s.to_string());
  return v;
}

}  // namespace vkad::bench
