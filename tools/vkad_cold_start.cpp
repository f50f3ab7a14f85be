// vkad-cold-start: what a new process pays before its first gradient, with the on-disk caches
// cold, warm or off (docs/caches.md, "Caches on disk"). Differentiates the recurrence
// v <- 0.5 v + 0.25 sin(v) w over L steps (the adjoint has an adstack), then launches forward and
// adjoint once and waits. Run it twice with the same --cache-dir: the first run is cold (fills
// the directory), the second warm.
//
//   vkad-cold-start [--cache-dir DIR | --no-cache] [--steps L] [--nest D] [--n N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "autodiff/reverse_mode.h"
#include "runtime/runtime.h"
#include "vkad.h"

using namespace vkad;
using namespace vkad::codegen;

namespace {

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// `nest` = 1: the loop runs `steps` times. `nest` > 1: `nest` loops nested, the outermost
// `steps` times and each inner one twice (a deep nest's adjoint is where SPIR-V emission and
// validation cost most; docs/architecture.md, "Compile time against nesting").
Kernel recurrence(int nest) {
  KernelBuilder kb("recurrence");
  Scalar steps = kb.scalar("steps", DType::kI32);
  Array x = kb.ndarray("x", DType::kF32, 1, {.needs_grad = true});
  Array w = kb.ndarray("w", DType::kF32, 1, {.needs_grad = true});
  Array y = kb.ndarray("y", DType::kF32, 1, {.needs_grad = true});
  kb.parallel_for("main", 0, x.dim(0), [&](Value i) {
    Local v = kb.local(x(i));
    Value wi = w(i);
    std::function<void(int)> level = [&](int depth) {
      if (depth == nest) {
        v.store(v.load() * 0.5 + sin(v.load()) * wi * 0.25);
        return;
      }
      kb.for_range(kb.i32(0), depth == 0 ? Value(steps) : kb.i32(2),
                   [&](Value) { level(depth + 1); });
    };
    level(0);
    y.store({i}, v.load());
  });
  return kb.finish();
}

int report_failure(const char* what, const Status& s) {
  std::fprintf(stderr, "%s: %s\n", what, s.to_string().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const auto start = std::chrono::steady_clock::now();
  SessionOptions o;
  int steps = 256;
  int nest = 1;
  uint32_t n = 4096;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--cache-dir" && i + 1 < argc) {
      o.cache_dir = argv[++i];
    } else if (a == "--no-cache") {
      o.cache_dir = "";
    } else if (a == "--steps" && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
    } else if (a == "--nest" && i + 1 < argc) {
      nest = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--n" && i + 1 < argc) {
      n = static_cast<uint32_t>(std::atol(argv[++i]));
    } else {
      std::fprintf(stderr,
                   "usage: %s [--cache-dir DIR | --no-cache] [--steps L] [--nest D] [--n N]\n",
                   argv[0]);
      return a == "--help" ? 0 : 2;
    }
  }
  auto session = Session::create(o);
  if (!session.ok()) return report_failure("session", session.status());
  Session& s = **session;
  const double create_ms = ms_since(start);

  // Reverse mode alone (differentiate runs it again: it is not cached, its output is the key).
  const auto t_adj = std::chrono::steady_clock::now();
  if (auto adj = make_adjoint(recurrence(nest), s.target()); !adj.ok()) {
    return report_failure("make_adjoint", adj.status());
  }
  const double adjoint_ms = ms_since(t_adj);

  const auto t_diff = std::chrono::steady_clock::now();
  auto d = s.differentiate(recurrence(nest));
  if (!d.ok()) return report_failure("differentiate", d.status());
  const double differentiate_ms = ms_since(t_diff);

  const auto t_launch = std::chrono::steady_clock::now();
  std::vector<NdArrayHandle> arrays;
  for (const char* name : {"x", "w", "y", "x_grad", "w_grad", "y_grad"}) {
    auto h = s.ndarray(DType::kF32, {n}, name);
    if (!h.ok()) return report_failure("ndarray", h.status());
    arrays.push_back(*h);
  }
  for (size_t i = 0; i < 3; ++i) {
    if (Status st = s.fill(arrays[i], 0.5); !st.ok()) return report_failure("fill", st);
  }
  if (Status st = s.zero(std::span<const NdArrayHandle>(arrays.data() + 3, 2)); !st.ok()) {
    return report_failure("zero", st);
  }
  if (Status st = s.fill(arrays[5], 1.0); !st.ok()) return report_failure("fill", st);
  const Arg fargs[] = {Arg::i32(steps), Arg::ndarray(arrays[0]), Arg::ndarray(arrays[1]),
                       Arg::ndarray(arrays[2])};
  auto aargs = d->adjoint_args(fargs, std::span<const NdArrayHandle>(arrays.data() + 3, 3));
  if (!aargs.ok()) return report_failure("adjoint_args", aargs.status());
  if (Status st = s.launch(d->forward, fargs); !st.ok()) return report_failure("forward", st);
  if (Status st = s.launch(d->adjoint, *aargs); !st.ok()) return report_failure("adjoint", st);
  std::vector<float> grad(n);
  if (Status st = s.download(arrays[3], std::span<float>(grad)); !st.ok()) {
    return report_failure("download", st);
  }
  const double launch_ms = ms_since(t_launch);
  auto st = s.stats();
  if (!st.ok()) return report_failure("stats", st.status());
  std::printf(
      "device %s, cache %s, L = %d, nest %d, n = %u\n"
      "  session %.1f ms, differentiate %.1f ms (of which reverse mode %.1f ms; the rest compile + "
      "pipelines), first forward + adjoint %.1f ms; to the first gradient %.1f ms (reverse mode "
      "counted once)\n"
      "  kernels compiled %llu, disk cache hits %llu, misses %llu, rebuilt %llu, pipeline cache "
      "loaded %d; dL/dx[0] = %g\n",
      s.device_name().c_str(),
      s.runtime().cache_dir().empty() ? "off" : s.runtime().cache_dir().c_str(), steps, nest, n,
      create_ms, differentiate_ms, adjoint_ms, launch_ms, ms_since(start) - adjoint_ms,
      static_cast<unsigned long long>(st->kernels_compiled),
      static_cast<unsigned long long>(st->disk_cache_hits),
      static_cast<unsigned long long>(st->disk_cache_misses),
      static_cast<unsigned long long>(st->disk_cache_rebuilt), st->pipeline_cache_loaded ? 1 : 0,
      grad[0]);
  return 0;
}
