// vkad-example: runs a kernel asynchronously on the chosen device and shows the retirement
// queue at work. (The differentiable-simulation example replaces this once reverse mode lands.)
//
//   vkad-example [--device <index|name>] [--n N] [--steps S] [--depth D] [--validation]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/runtime.h"
#include "support/sample_kernels.h"

using namespace vkad;

int main(int argc, char** argv) {
  runtime::RuntimeOptions options;
  uint32_t n = 1 << 20;
  int steps = 200;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--device") options.device.device = next();
    else if (a == "--n") n = static_cast<uint32_t>(std::stoul(next()));
    else if (a == "--steps") steps = std::stoi(next());
    else if (a == "--depth") options.retirement_depth = std::stoul(next());
    else if (a == "--validation") options.device.enable_validation = true;
    else {
      std::printf("usage: vkad-example [--device D] [--n N] [--steps S] [--depth D] [--validation]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  auto rt_result = runtime::Runtime::create(options);
  if (!rt_result.ok()) {
    std::fprintf(stderr, "vkad-example: %s\n", rt_result.status().to_string().c_str());
    return 1;
  }
  runtime::Runtime& rt = **rt_result;
  std::printf("device: %s (%s)\n", rt.caps().device_name.c_str(),
              rhi::device_kind_name(rt.caps().kind));

  // y <- a * x + y, `steps` times, one flush per step and no readback in between.
  std::vector<float> x(n), y(n);
  for (uint32_t i = 0; i < n; ++i) {
    x[i] = std::abs(std::sin(0.001f * i));  // the sample kernel flags x < 0 as an error
    y[i] = 1.0f;
  }
  auto hx = rt.create_ndarray(runtime::DType::kF32, {n}, "x");
  auto hy = rt.create_ndarray(runtime::DType::kF32, {n}, "y");
  auto kernel = rt.register_kernel(testing::make_axpy_kernel("axpy"));
  if (!hx.ok() || !hy.ok() || !kernel.ok()) {
    std::fprintf(stderr, "vkad-example: setup failed\n");
    return 1;
  }
  Status s = rt.upload(*hx, x.data(), n * 4);
  if (s.ok()) s = rt.upload(*hy, y.data(), n * 4);
  const float a = 0.5f;
  runtime::Arg args[] = {runtime::Arg::f32(a), runtime::Arg::ndarray(*hx),
                         runtime::Arg::ndarray(*hy)};
  auto t0 = std::chrono::steady_clock::now();
  for (int step = 0; step < steps && s.ok(); ++step) {
    s = rt.launch(*kernel, args);
    if (s.ok()) s = rt.flush().status();
  }
  std::vector<float> out(n);
  if (s.ok()) s = rt.download(*hy, out.data(), n * 4);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!s.ok()) {
    std::fprintf(stderr, "vkad-example: %s\n", s.to_string().c_str());
    return 1;
  }
  // Check against the CPU: y_final = 1 + steps * a * x.
  double max_err = 0;
  for (uint32_t i = 0; i < n; ++i) {
    double expect = 1.0 + steps * a * static_cast<double>(x[i]);
    max_err = std::max(max_err, std::abs(out[i] - expect));
  }
  auto st = rt.stats();
  std::printf("ran %d launches of axpy over %u elements in %.3f s (%.1f launches/s)\n", steps, n,
              secs, steps / secs);
  std::printf("max |gpu - cpu| = %.3g\n", max_err);
  std::printf("retirement (depth %zu): pushed %llu, retired by polling %llu, forced waits %llu "
              "(%.1f ms blocked), drained at readback %llu, peak held %llu bytes in %llu entries\n",
              rt.retirement_depth(), (unsigned long long)st.retirement.pushed,
              (unsigned long long)st.retirement.retired_by_polling,
              (unsigned long long)st.retirement.forced_waits, st.retirement.forced_wait_us / 1000,
              (unsigned long long)st.retirement.retired_by_drain,
              (unsigned long long)st.retirement.high_water_bytes,
              (unsigned long long)st.retirement.high_water_entries);
  return max_err < 1e-2 * steps ? 0 : 1;
}
